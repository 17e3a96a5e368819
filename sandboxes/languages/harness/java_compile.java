// fixlab's Java compile step (trusted; built into compile.jar by java.py's prepare()): one JVM, javac in-process.
// It compiles the candidate's Solution.java alone into cand/, then puts the tests' classes into tests/: the ones
// fixlab compiled beforehand against the declaration's Solution (in CACHE, below) when the candidate's Solution has
// the very members the tests call, else Main.java compiled here against cand/Solution*.class alone, so no other
// class of the candidate's (an `Arrays` or `List` of its own in the default package) can stand in for a name the
// tests use. Nothing of the candidate's runs here: javac runs no annotation processor (-proc:none).
// usage: java -cp compile.jar fixlab.Compile CACHE   (cwd: the run's scratch dir with Solution.java and Main.java)
package fixlab;

import java.io.DataInputStream;
import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.TreeSet;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

final class Compile {
    private Compile() {}

    public static void main(String[] args) throws IOException {
        Path cache = Paths.get(args[0]);
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        for (String d : new String[] {"cand", "api", "tests"}) {
            Files.createDirectories(Paths.get(d));
        }
        // the candidate alone: its own classes are its whole class path and source path
        if (javac.run(null, null, null, "-proc:none", "-encoding", "UTF-8", "-d", "cand", "-cp", "cand",
                "-sourcepath", "cand", "Solution.java") != 0) {
            System.exit(1);
        }
        Path solution = Paths.get("cand", "Solution.class");
        if (!Files.isRegularFile(solution)) {
            System.err.println("Solution.java: error: no class Solution in the default package (the tests call it)");
            System.exit(1);
        }
        boolean same;
        try {
            same = sameApi(Shape.of(cache.resolve("Solution.class")), Shape.of(solution));
        } catch (IOException | RuntimeException unread) {
            same = false;  // a class file this reader does not know: the tests compiled here, the sure way
        }
        if (same) {
            copy(cache.resolve("tests"), Paths.get("tests"), "*.class");
            return;
        }
        copy(Paths.get("cand"), Paths.get("api"), "Solution{,$*}.class");
        System.exit(javac.run(null, null, null, "-proc:none", "-encoding", "UTF-8", "-d", "tests", "-cp", "api",
                "-sourcepath", "api", "Main.java"));
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
