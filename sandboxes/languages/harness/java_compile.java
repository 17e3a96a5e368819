// fixlab's Java compile step (trusted; built into compile.jar by java.py's prepare()): one JVM, javac in-process.
// It compiles the candidate's Solution.java alone into cand/, then puts the tests' classes into tests/: the ones
// fixlab compiled beforehand against the declaration's Solution (in CACHE, below) when the candidate's Solution has
// the very members the tests call, else Main.java compiled here against cand/Solution*.class alone, so no other
// class of the candidate's (an `Arrays` or `List` of its own in the default package) can stand in for a name the
// tests use. Nothing of the candidate's runs here: javac runs no annotation processor (-proc:none).
// usage: java -cp compile.jar fixlab.Compile CACHE   (cwd: the run's scratch dir with Solution.java and Main.java)
//        java -cp compile.jar fixlab.Compile --serve SOCKET   (the same, warm: the service below)
package fixlab;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.PrintStream;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

final class Compile {
    private Compile() {}

    public static void main(String[] args) throws IOException {
        if (args.length == 2 && args[0].equals("--serve")) {
            serve(Paths.get(args[1]));
            return;
        }
        int rc = compile(Paths.get(args[0]), Paths.get(""), null);
        if (rc != 0) {
            System.exit(rc);
        }
    }

    /** The compile in the folder `work` (Solution.java and Main.java in it), the tests' classes from `cache`;
     *  the compiler's messages go to `log` (null: this JVM's stderr). 0 when both compiled. */
    static int compile(Path cache, Path work, PrintStream log) throws IOException {
        PrintStream err = log == null ? System.err : log;
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        String cand = work.resolve("cand").toString(), api = work.resolve("api").toString();
        String tests = work.resolve("tests").toString();
        for (String d : new String[] {cand, api, tests}) {
            Files.createDirectories(Paths.get(d));
        }
        // the candidate alone: its own classes are its whole class path and source path
        if (javac.run(null, log, log, "-proc:none", "-encoding", "UTF-8", "-d", cand, "-cp", cand,
                "-sourcepath", cand, work.resolve("Solution.java").toString()) != 0) {
            return 1;
        }
        Path solution = Paths.get(cand, "Solution.class");
        if (!Files.isRegularFile(solution)) {
            err.println("Solution.java: error: no class Solution in the default package (the tests call it)");
            return 1;
        }
        boolean same;
        try {
            same = sameApi(Shape.of(cache.resolve("Solution.class")), Shape.of(solution));
        } catch (IOException | RuntimeException unread) {
            same = false;  // a class file this reader does not know: the tests compiled here, the sure way
        }
        if (same) {
            copy(cache.resolve("tests"), Paths.get(tests), "*.class");
            return 0;
        }
        copy(Paths.get(cand), Paths.get(api), "Solution{,$*}.class");
        return javac.run(null, log, log, "-proc:none", "-encoding", "UTF-8", "-d", tests, "-cp", api,
                "-sourcepath", api, work.resolve("Main.java").toString());
    }

    // ------------------------------------------------------------------------------------------------ the service
    // `--serve SOCKET`: the same compile, warm, for one program after another (sandboxes/services.py starts it in a
    // jail of its own: no network, nothing writable but its /tmp). One connection is one program: its time limit,
    // the args (the tests' cache), its files; back come the exit code, the compiler's messages with the work
    // folder's name taken out (they read as the one-shot compile's, run in the program's own folder) and every class
    // file made. A compile past its limit halts the whole service: programs compiling beside it see it go and
    // compile the one-shot way (sandboxes/_jail_native.py), so no verdict depends on what ran beside it.

    private static final int MAX_BYTES = 64 << 20;

    static void serve(Path socket) throws IOException {
        ServerSocketChannel server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        server.bind(UnixDomainSocketAddress.of(socket));
        ScheduledExecutorService clock = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "limits");
            t.setDaemon(true);
            return t;
        });
        while (true) {
            SocketChannel ch = server.accept();
            Thread t = new Thread(() -> answer(ch, clock), "program");
            t.setDaemon(true);
            t.start();
        }
    }

    private static void answer(SocketChannel ch, ScheduledExecutorService clock) {
        Path work = null;
        try (ch) {
            DataInputStream in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(ch)));
            DataOutputStream out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(ch)));
            int limitMs = in.readInt();
            ScheduledFuture<?> halt = clock.schedule(() -> Runtime.getRuntime().halt(3), limitMs, TimeUnit.MILLISECONDS);
            Path cache = Paths.get(new String(bytes(in), StandardCharsets.UTF_8));
            work = Files.createTempDirectory("program");
            for (int n = in.readInt(); n > 0; n--) {
                String name = new String(bytes(in), StandardCharsets.UTF_8);
                if (!name.matches("[A-Za-z0-9_]+\\.java")) {
                    throw new IOException("not a source file name: " + name);
                }
                Files.write(work.resolve(name), bytes(in));
            }
            ByteArrayOutputStream text = new ByteArrayOutputStream();
            PrintStream log = new PrintStream(text, true, StandardCharsets.UTF_8);
            int rc = compile(cache, work, log);
            log.flush();
            String messages = text.toString(StandardCharsets.UTF_8).replace(work + File.separator, "");
            ArrayList<Path> made = new ArrayList<>();
            for (String d : new String[] {"api", "cand", "tests"}) {
                try (Stream<Path> files = Files.walk(work.resolve(d))) {
                    files.filter(Files::isRegularFile).sorted().forEach(made::add);
                }
            }
            out.writeInt(rc);
            send(out, messages.getBytes(StandardCharsets.UTF_8));
            out.writeInt(made.size());
            for (Path f : made) {
                send(out, work.relativize(f).toString().getBytes(StandardCharsets.UTF_8));
                send(out, Files.readAllBytes(f));
            }
            out.flush();
            halt.cancel(false);
        } catch (IOException | RuntimeException broken) {
            // the program's side sees the connection end without an answer and compiles the one-shot way
            System.err.println("fixlab.Compile: a program not answered: " + broken);
        } finally {
            if (work != null) {
                try (Stream<Path> files = Files.walk(work)) {
                    files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
                } catch (IOException | RuntimeException gone) {
                    // its /tmp is the service's own, gone with it
                }
            }
        }
    }

    private static byte[] bytes(DataInputStream in) throws IOException {
        int n = in.readInt();
        if (n < 0 || n > MAX_BYTES) {
            throw new IOException("a field of " + n + " bytes");
        }
        return in.readNBytes(n);
    }

    private static void send(DataOutputStream out, byte[] b) throws IOException {
        out.writeInt(b.length);
        out.write(b);
    }

    private static void copy(Path from, Path to, String glob) throws IOException {
        try (DirectoryStream<Path> files = Files.newDirectoryStream(from, glob)) {
            for (Path f : files) {
                Files.copy(f, to.resolve(f.getFileName()), StandardCopyOption.REPLACE_EXISTING);
            }
        }
    }

    /** The tests compiled against the declaration bind to the candidate exactly as javac would bind them to it:
     *  a plain class with the no-argument constructor and, for each name the declaration declares, the same
     *  methods (descriptor, generic signature, checked exceptions, access, static, varargs), and no others. */
    private static boolean sameApi(Shape decl, Shape cand) {
        int kind = 0x0200 | 0x0400 | 0x2000 | 0x4000;  // interface, abstract, annotation, enum
        if ((cand.flags & kind) != 0 || !"java/lang/Object".equals(cand.superName) || !cand.interfaces.isEmpty()
                || cand.signature != null) {
            return false;
        }
        boolean constructible = false;  // `new Solution()`: a no-argument constructor that is not private
        for (String m : cand.methods.getOrDefault("<init>", new TreeSet<>())) {
            String[] part = m.split("\\|", -1);
            constructible |= part[1].equals("()V") && (Integer.parseInt(part[0]) & 0x0002) == 0;
        }
        if (!constructible) {
            return false;
        }
        for (Map.Entry<String, TreeSet<String>> m : decl.methods.entrySet()) {
            if (!m.getKey().startsWith("<") && !Objects.equals(m.getValue(), cand.methods.get(m.getKey()))) {
                return false;
            }
        }
        return true;
    }

    /** What a class file says of the class and its methods (the constant pool read just far enough). */
    static final class Shape {
        int flags;
        String superName;
        String signature;
        final ArrayList<String> interfaces = new ArrayList<>();
        final TreeMap<String, TreeSet<String>> methods = new TreeMap<>();

        static Shape of(Path file) throws IOException {
            Shape s = new Shape();
            try (DataInputStream in = new DataInputStream(Files.newInputStream(file))) {
                in.readInt();
                in.readInt();
                int n = in.readUnsignedShort();
                String[] utf = new String[n];
                int[] ref = new int[n];
                for (int i = 1; i < n; i++) {
                    int tag = in.readUnsignedByte();
                    switch (tag) {
                        case 1: utf[i] = in.readUTF(); break;
                        case 7: case 8: case 16: case 19: case 20: ref[i] = in.readUnsignedShort(); break;
                        case 15: in.skipBytes(3); break;
                        case 3: case 4: case 9: case 10: case 11: case 12: case 17: case 18: in.skipBytes(4); break;
                        case 5: case 6: in.skipBytes(8); i++; break;
                        default: throw new IOException(file + ": constant pool tag " + tag);
                    }
                }
                s.flags = in.readUnsignedShort();
                in.readUnsignedShort();
                int sup = in.readUnsignedShort();
                s.superName = sup == 0 ? null : utf[ref[sup]];
                for (int i = in.readUnsignedShort(); i > 0; i--) {
                    s.interfaces.add(utf[ref[in.readUnsignedShort()]]);
                }
                for (int i = in.readUnsignedShort(); i > 0; i--) {  // fields
                    in.skipBytes(6);
                    skipAttributes(in);
                }
                for (int i = in.readUnsignedShort(); i > 0; i--) {
                    int flags = in.readUnsignedShort() & (0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0040 | 0x0080
                            | 0x1000);  // public private protected static bridge varargs synthetic
                    String name = utf[in.readUnsignedShort()];
                    String desc = utf[in.readUnsignedShort()];
                    String sig = "";
                    TreeSet<String> throwz = new TreeSet<>();
                    for (int a = in.readUnsignedShort(); a > 0; a--) {
                        String attr = utf[in.readUnsignedShort()];
                        int len = in.readInt();
                        if (attr.equals("Signature")) {
                            sig = utf[in.readUnsignedShort()];
                        } else if (attr.equals("Exceptions")) {
                            for (int k = in.readUnsignedShort(); k > 0; k--) {
                                throwz.add(utf[ref[in.readUnsignedShort()]]);
                            }
                        } else {
                            in.skipNBytes(len);
                        }
                    }
                    s.methods.computeIfAbsent(name, k -> new TreeSet<>())
                            .add(flags + "|" + desc + "|" + sig + "|" + throwz);
                }
                for (int a = in.readUnsignedShort(); a > 0; a--) {
                    String attr = utf[in.readUnsignedShort()];
                    int len = in.readInt();
                    if (attr.equals("Signature")) {
                        s.signature = utf[in.readUnsignedShort()];
                    } else {
                        in.skipNBytes(len);
                    }
                }
            }
            return s;
        }

        private static void skipAttributes(DataInputStream in) throws IOException {
            for (int a = in.readUnsignedShort(); a > 0; a--) {
                in.readUnsignedShort();
                in.skipNBytes(in.readInt());
            }
        }
    }
}
