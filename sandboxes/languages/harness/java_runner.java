// fixlab's Java run harness (the run step's main class, trusted; built into runner.jar by java.py's prepare()).
// The JVM runs under the standard security manager, whose policy grants this jar alone: the tests' and the
// candidate's classes get no permission to exit, halt, swap System.out/err, reflect into private members, open
// files or descriptors, or start processes. It takes the run's secret and the proof channel before any task class
// is loaded, runs the tests' Main.main, and writes the proof only when it returned normally. The secret lives in
// this frame's locals alone.
package fixlab;

import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Constructor;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;

final class Runner {
    private Runner() {}

    public static void main(String[] args) {
        Runtime rt = Runtime.getRuntime();
        try {
            if (System.getSecurityManager() == null) {  // the command line's -Djava.security.manager
                System.err.println("fixlab: the run needs its security manager");
                rt.halt(70);
            }
            byte[] secret = new byte[32];
            FileInputStream in = new FileInputStream(FileDescriptor.in);  // unbuffered: no copy left in a buffer
            for (int got = 0; got < secret.length; ) {
                int n = in.read(secret, got, secret.length - got);
                if (n < 0) {
                    System.err.println("fixlab: the run's secret is missing");
                    rt.halt(70);
                }
                got += n;
            }
            // fd 3 has no FileDescriptor of its own: its private constructor (java.base/java.io is opened to the
            // class path by the command line; the security manager refuses the candidate's setAccessible)
            Constructor<FileDescriptor> fdOf = FileDescriptor.class.getDeclaredConstructor(int.class);
            fdOf.setAccessible(true);
            FileOutputStream proof = new FileOutputStream(fdOf.newInstance(3));
            // The tests and the candidate come from a loader of their own: the class path's loader would grant its
            // classes exitVM; this one grants them nothing, and they do not see this runner's classes.
            URLClassLoader task = new URLClassLoader(new URL[] {Paths.get("tests").toUri().toURL(),
                Paths.get("cand").toUri().toURL()}, ClassLoader.getPlatformClassLoader());
            MethodHandle tests = MethodHandles.publicLookup().findStatic(Class.forName("Main", false, task), "main",
                    MethodType.methodType(void.class, String[].class));
            Throwable failure = null;
            try {
                tests.invokeExact(new String[0]);
            } catch (Throwable t) {
                failure = t;
            }
            if (failure == null) {
                System.out.flush();
                System.err.flush();
                char[] line = new char[2 + 2 * secret.length + 1];
                line[0] = 'P';
                line[1] = ':';
                for (int i = 0; i < secret.length; i++) {
                    line[2 + 2 * i] = Character.forDigit((secret[i] >> 4) & 15, 16);
                    line[3 + 2 * i] = Character.forDigit(secret[i] & 15, 16);
                }
                line[line.length - 1] = '\n';
                proof.write(new String(line).getBytes(StandardCharsets.US_ASCII));
                rt.halt(0);
            }
            secret = null;  // before anything of the candidate's (an exception's toString) runs again
            report(failure);
        } catch (Throwable t) {
            try {
                report(t);
            } catch (Throwable ignored) {
                // out of memory or a broken stream: the exit code says it
            }
        } finally {
            rt.halt(1);
        }
    }

    /** The exception as java's launcher prints it, the frames below the tests' main (this runner's) left out. */
    private static void report(Throwable t) {
        StringBuilder out = new StringBuilder("Exception in thread \"main\" ");
        for (int depth = 0; t != null && depth < 4; depth++, t = t.getCause()) {
            if (depth > 0) {
                out.append("Caused by: ");
            }
            out.append(t).append('\n');
            StackTraceElement[] frames = t.getStackTrace();
            int shown = 0;
            for (StackTraceElement f : frames) {
                if (f.getClassName().startsWith("fixlab.")) {
                    break;
                }
                if (++shown > 40) {
                    out.append("\t... ").append(frames.length - 40).append(" more\n");
                    break;
                }
                out.append("\tat ").append(f).append('\n');
            }
        }
        System.err.print(out);
        System.err.flush();
    }
}
