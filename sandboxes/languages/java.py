"""Java (HumanEvalPack `java`): OpenJDK 17's javac and java. The reference (bigcode-evaluation-harness) writes one
Main.java: the candidate (its imports and class Solution) + the test's `public class Main`; `javac Main.java`, then
`java -cp . Main`, passed iff the exit code is 0.

fixlab keeps the candidate and the tests apart. The compile step (harness/java_compile.java, one JVM running javac
in-process) compiles the candidate's Solution.java alone, then takes the tests' classes that fixlab compiled once per
task against the declaration's Solution when the candidate's Solution offers the tests the very same members, else
compiles Main.java against cand/Solution*.class alone: no other class of the candidate's (an `Arrays` of its own in
the default package) can stand in for a name the tests use, as it does in the reference's one file. The run step
(harness/java_runner.java) runs under the standard security manager with a policy that grants its own jar alone, and
loads the tests and the candidate with a class loader of their own (the class path's would grant them exitVM): no
System.exit, Runtime.halt, System.setOut/setErr, shutdown hook, uncaught-exception handler, reflection into private
members, file, socket or process for them. It reads the run's secret from stdin before any task class is loaded,
runs Main.main and writes the proof on fd 3 only when it returned. Both JVMs start from CDS archives of their own.
In the local jail a warm `fixlab.Compile --serve` (sandboxes/services.py) does the compile step in place of a fresh
JVM per program, with the same class files and messages.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from pathlib import Path

from .base import Failure, Language, Program, Step, Toolchain, cut_block, tail

_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
JDK = f"/usr/lib/jvm/java-17-openjdk-{_ARCH}"  # JDK 17 itself: /usr/bin/java may be another JDK's alternative
JAVAC, JAVA = f"{JDK}/bin/javac", f"{JDK}/bin/java"
# Every JVM here: C1 only (short programs), the serial collector, no hsperfdata file, no attach listener.
VM = ("-Xshare:auto", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-XX:+DisableAttachMechanism")
# The jail's /proc is empty, so the launcher's $ORIGIN runpath finds no libjli.so: the loader is told where it is.
ENV = (("LD_LIBRARY_PATH", f"{JDK}/lib"),)
REFERENCE_CUT = "public class Main {\n    }"  # what the reference removes from a candidate
# The two lines the JVM prints on stderr when the command line enables the security manager (JDK 17 cannot mute
# them); failure() leaves them out.
SM_BANNER = ("WARNING: A command line option has enabled the Security Manager",
             "WARNING: The Security Manager is deprecated and will be removed in a future release")
POLICY = """// fixlab's run policy: the runner's jar may do anything; every other class only reads these properties.
grant codeBase "file:${fixlab.runner}" {
    permission java.security.AllPermission;
};
grant {
%s
};
""" % "\n".join(f'    permission java.util.PropertyPermission "{p}", "read";' for p in (
    "java.version", "java.vendor", "java.vendor.url", "java.class.version", "os.name", "os.version", "os.arch",
    "file.separator", "path.separator", "line.separator", "java.specification.version", "java.specification.vendor",
    "java.specification.name", "java.vm.specification.version", "java.vm.specification.vendor",
    "java.vm.specification.name", "java.vm.version", "java.vm.vendor", "java.vm.name"))
# A sample the CDS archives are recorded on (trusted): the JDK classes typical solutions and tests load.
SAMPLE_SOLUTION = """import java.util.*;
import java.util.stream.*;
class Solution {
    public List<Integer> sample(List<Integer> xs, String s) {
        Map<String, Integer> m = new HashMap<>();
        for (String w : s.split("\\\\s+")) m.put(w.toLowerCase(), m.getOrDefault(w, 0) + 1);
        StringBuilder sb = new StringBuilder(String.format("%d", m.size())).reverse();
        Optional<Integer> top = xs.stream().filter(x -> x > 0).max(Comparator.naturalOrder());
        List<Integer> out = xs.stream().map(x -> x * 2).sorted().collect(Collectors.toList());
        out.add(top.orElse(0) + sb.length() + String.join(",", m.keySet()).length() + (int) Math.sqrt(9.0));
        Collections.sort(out);
        return out.stream().filter(x -> Character.isDigit(Integer.toString(x).charAt(0))).collect(Collectors.toList());
    }
}
"""
SAMPLE_DECLARATION = SAMPLE_SOLUTION[:SAMPLE_SOLUTION.index("{", SAMPLE_SOLUTION.index("sample(")) + 1] + "\n"
SAMPLE_TEST = """public class Main {
    public static void main(String[] args) {
        Solution s = new Solution();
        List<Boolean> correct = Arrays.asList(
                s.sample(new ArrayList<>(Arrays.asList(3, 1, 2)), "a b A").size() == 4,
                Objects.equals(s.sample(List.of(), "x"), Arrays.asList(5))
        );
        if (correct.contains(false)) {
            throw new AssertionError();
        }
    }
}
"""
_IMPORT = re.compile(r"^\s*import\s+(?:static\s+)?[\w.]+(?:\.\*)?\s*;[ \t]*$", re.M)
_SOLUTION = re.compile(r"\bclass\s+Solution\b")
_METHOD = re.compile(r"(\w+)\s*\([^;{}()]*\)\s*(?:throws\s+[\w.,\s]+)?\{")  # a method's header, up to its "{"
_MAIN_CLASS = re.compile(r"^[ \t]*(?:public\s+)?(?:final\s+)?class\s+Main\b", re.M)
_CORRECT = re.compile(r"(if\s*\(\s*correct\.contains\(false\)\s*\)\s*\{\s*throw\s+new\s+AssertionError\()\)")
_FAILED_CHECK = "correct.get({}) is false"
_JAVA_ERROR = re.compile(r"^(\S+\.java):(\d+): error: ")
_EXC = re.compile(r'^Exception in thread "main" ([\w.$]+)(?::\s?(.*))?$')
_CAUSE = re.compile(r"^Caused by: ([\w.$]+)(?::\s?(.*))?$")
_FRAME = re.compile(r"^\s+at (?:[\w.]+/)?([\w.$]+)\.([\w$<>]+)\((\w+\.java):(\d+)\)")


def _stub(decl: str) -> str:
    """A declaration's class Solution with a body for its open method: what the tests are compiled against."""
    return decl.rstrip() + "\n        throw new UnsupportedOperationException();\n    }\n}\n"


def _tests(test: str, decl: str) -> str:
    imports = " ".join(" ".join(m.group(0).split()) for m in _IMPORT.finditer(decl))
    test = _CORRECT.sub(lambda m: m.group(1) + '"' + _FAILED_CHECK.format('" + correct.indexOf(false) + "') + '")', test)
    return imports + " " + test


def _code_only(code: str) -> str:
    """The code with comments and the insides of literals blanked (same length): where declarations are found."""
    out, i, n = list(code), 0, len(code)
    while i < n:
        if code.startswith("//", i) or code.startswith("/*", i):
            end = code.find("\n" if code[i + 1] == "/" else "*/", i + 2)
            end = n if end < 0 else end + (0 if code[i + 1] == "/" else 2)
            out[i:end] = [c if c == "\n" else " " for c in code[i:end]]
            i = end
        elif code[i] in "\"'":
            quote = '"""' if code.startswith('"""', i) else code[i]  # a text block spans lines
            j = i + len(quote)
            while j < n and not code.startswith(quote, j) and (len(quote) == 3 or code[j] != "\n"):
                j += 2 if code[j] == "\\" else 1
            out[i + len(quote):j] = [c if c == "\n" else " " for c in code[i + len(quote):j]]
            i = j + len(quote)
        else:
            i += 1
    return "".join(out)[:n]


def _methods(decl: str) -> list[tuple[str, str]]:
    """(name, whole text) of each method the declaration's class Solution defines (the last one is left open)."""
    bare = _code_only(decl)
    m = _SOLUTION.search(bare)
    if m is None:
        return []
    body_start = bare.find("{", m.end()) + 1
    out, i = [], body_start
    for h in _METHOD.finditer(bare, body_start):
        if h.start() < i:
            continue
        end = cut_block(bare, h.start())
        out.append((h.group(1), decl[bare.rfind("\n", 0, h.start()) + 1:end]))
        i = end
    return out


def _defines(code: str, name: str) -> bool:
    return any(m.group(1) == name for m in _METHOD.finditer(_code_only(code)))


def _call_args(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose "(" is at `start`, each on one line."""
    bare, spans, depth, begin = _code_only(text), [], 0, start + 1
    for i in range(start, len(bare)):
        c = bare[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                spans.append((begin, i))
                break
        elif c == "," and depth == 1:
            spans.append((begin, i))
            begin = i + 1
    return [" ".join(text[b:e].split()) for b, e in spans]


class Java(Language):
    name, title, task_prefix = "java", "Java", "Java"
    fences = ("java", "")
    run_timeout_s = 10.0  # the reference's `java` limit
    compile_timeout_s = 25.0  # the reference's javac: 5 s, tried up to 5 times
    toolchain = Toolchain(commands=(JAVAC, JAVA), packages=("openjdk-17-jdk-headless",))
    entry_pattern = r"\b{name}\s*\("

    def __init__(self):
        self._lock = threading.RLock()

    harness_files = ("java_compile.java", "java_runner.java")

    def service_argv(self, prep: Path, socket_path: str) -> list[str]:
        """The compile step's own program, warm: `fixlab.Compile --serve` (harness/java_compile.java) answers one
        program after another, warm, where a fresh JVM's javac spends most of a verdict starting. Full tiered compilation
        and a larger heap: it lives for the whole job, and compiles programs side by side."""
        return ["/usr/bin/env", *(f"{k}={v}" for k, v in ENV), JAVA, *VM[:1], *VM[2:], f"-XX:SharedArchiveFile={self._archive('compile', prep)}", "-Xmx768m",
                "-XX:+ExitOnOutOfMemoryError", "-cp", str(prep / "compile.jar"), "fixlab.Compile", "--serve",
                socket_path]

    def version_commands(self):
        return [[JAVA, "-version"]]

    def prepare(self, into: Path) -> None:
        from ..toolchains import HARNESS, run

        for name in ("runner", "compile"):
            classes = into / f"{name}-classes"
            run([JAVAC, "-Xlint:-removal", "-d", classes, HARNESS / f"java_{name}.java"])
            # sealed: no class of the candidate's can join the harness's package
            with zipfile.ZipFile(into / f"{name}.jar", "w") as jar:
                jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nSealed: true\n\n")
                for f in sorted(classes.rglob("*.class")):
                    jar.write(f, f.relative_to(classes).as_posix())
            shutil.rmtree(classes)
        (into / "fixlab.policy").write_text(POLICY)
        (into / "tests").mkdir()
        (into / "cds").mkdir()

    def _prepared(self) -> Path:
        from ..toolchains import prepared

        return prepared(self)

    # -- the program's files -------------------------------------------------------------------------------------

    def candidate_source(self, candidate: str, task) -> str:
        """Solution.java: the answer with the declaration's imports it leaves out in front of its first line and the
        declaration's helper methods it leaves out at the end of its class; an answer of methods alone goes into the
        declaration's `class Solution {`. Its own lines keep their numbers."""
        decl = self.context(task)
        code = candidate.replace(REFERENCE_CUT, "")
        have = {" ".join(m.group(0).split()) for m in _IMPORT.finditer(code)}
        imports = [" ".join(m.group(0).split()) for m in _IMPORT.finditer(decl)]
        prefix = " ".join(i for i in imports if i not in have)
        helpers = "".join("\n" + text for name, text in _methods(decl)[:-1] if not _defines(code, name))
        lines = code.split("\n")
        bare = _code_only(code)
        m = _SOLUTION.search(bare)
        if m is None:  # methods alone: the class opens on the first line that is not an import, blank or comment
            bare_lines = bare.split("\n")
            k = next((j for j, ln in enumerate(bare_lines) if ln.strip() and not _IMPORT.match(ln)), len(lines) - 1)
            lines[k] = "class Solution { " + lines[k]
            code = "\n".join(lines).rstrip() + helpers + "\n}\n"
        elif helpers:
            end = cut_block(bare, m.end())
            if bare[end - 1:end] == "}":  # the class closes: its helpers go in before its last brace
                code = code[:end - 1].rstrip() + helpers + "\n" + code[end - 1:]
        return (prefix + " " if prefix else "") + code

    def tests_source(self, test: str, task) -> str:
        """Main.java: the declaration's imports on the test's first line (its lines keep their numbers), and the
        AssertionError of the `correct` list naming which check failed (failure() reads it)."""
        return _tests(test, self.context(task))

    def _stub(self, task) -> str:
        return _stub(self.context(task))

    def _compiled_tests(self, stub: str, tests: str, prep: Path) -> Path:
        """The tests compiled once per test text against the stub (trusted input: the dataset's), outside any run:
        <dir>/Solution.class (the stub's, whose members the candidate's must match) and <dir>/tests/Main*.class."""
        key = hashlib.sha256((stub + "\0" + tests).encode()).hexdigest()[:20]
        final = prep / "tests" / key
        if (final / "tests").is_dir():
            return final
        with self._lock:
            if (final / "tests").is_dir():
                return final
            work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=prep / "tests"))
            try:
                (work / "Solution.java").write_text(stub)
                (work / "Main.java").write_text(tests)
                r = subprocess.run([JAVAC, *(f"-J{f}" for f in VM[1:4]), "-proc:none", "-encoding", "UTF-8",
                                    "-d", "out", "Solution.java", "Main.java"], capture_output=True, text=True, cwd=work)
                if r.returncode != 0:
                    raise ValueError(f"the task's test does not compile: {r.stderr.strip()[-300:]}")
                (work / "tests").mkdir()
                for f in (work / "out").iterdir():
                    if f.name != "Solution.class" and not f.name.startswith("Solution$"):
                        f.rename(work / "tests" / f.name)
                (work / "out" / "Solution.class").rename(work / "Solution.class")
                shutil.rmtree(work / "out")
                for f in ("Solution.java", "Main.java"):
                    (work / f).unlink()
                for p in [work, *work.rglob("*")]:
                    p.chmod(0o755 if p.is_dir() else 0o644)
                os.replace(work, final)
            except OSError:
                if not (final / "tests").is_dir():
                    raise
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return final

    def _archive(self, name: str, prep: Path) -> Path:
        """The CDS archive of the compile or the run JVM, recorded once on the sample (trusted) with the prepared jars
        where the runs find them (an archive names its class path)."""
        jsa = prep / "cds" / f"{name}.jsa"
        if jsa.exists():
            return jsa
        with self._lock:
            if jsa.exists():
                return jsa
            tests = _tests(SAMPLE_TEST, SAMPLE_DECLARATION)
            compile_, run = self._steps(prep, self._compiled_tests(_stub(SAMPLE_DECLARATION), tests, prep), 60.0,
                                        archive=False)
            with tempfile.TemporaryDirectory(dir=prep / "cds") as work:
                recorded = Path(work) / "recorded.jsa"
                (Path(work) / "Main.java").write_text(tests)
                # for the compile JVM, a Solution with one method more: javac runs twice, as it does for a fallback
                more = SAMPLE_SOLUTION.rstrip()[:-1] + "    public int sample(int x) { return x; }\n}\n"
                (Path(work) / "Solution.java").write_text(SAMPLE_SOLUTION if name == "run" else more)
                if name == "run":
                    subprocess.run(compile_.argv, cwd=work, capture_output=True, timeout=120)
                # the classes one program loads, then a static archive of them (the runner halts, which would
                # record no dynamic archive)
                argv = list((compile_ if name == "compile" else run).argv)
                argv[1:1] = [f"-XX:DumpLoadedClassList={work}/classes.lst"]
                r = subprocess.run(["/bin/sh", "-c", 'exec "$@" 3>/dev/null', "sh", *argv], cwd=work,
                                   input=os.urandom(32), capture_output=True, timeout=120)
                if r.returncode == 0:
                    r = subprocess.run([JAVA, "-Xshare:dump", f"-XX:SharedClassListFile={work}/classes.lst",
                                        f"-XX:SharedArchiveFile={recorded}", "-cp", argv[argv.index("-cp") + 1]],
                                       cwd=work, capture_output=True, timeout=120)
                if r.returncode != 0 or not recorded.exists():
                    raise ValueError(f"recording the {name} JVM's CDS archive failed: {r.stderr[-300:]!r}")
                recorded.chmod(0o644)
                os.replace(recorded, jsa)
        return jsa

    def _steps(self, prep: Path, tests: Path, run_timeout_s: float, archive=True) -> tuple[Step, ...]:
        cds = (lambda n: (f"-XX:SharedArchiveFile={self._archive(n, prep)}",)) if archive else (lambda n: ())
        runner = prep / "runner.jar"
        compile_ = (JAVA, *VM, *cds("compile"), "-Xmx512m", "-cp", str(prep / "compile.jar"), "fixlab.Compile",
                    str(tests))
        run = (JAVA, *VM, *cds("run"), "-Xmx256m", "-Djava.security.manager",
               f"-Djava.security.policy=={prep / 'fixlab.policy'}", f"-Dfixlab.runner={runner}",
               "--add-opens", "java.base/java.io=ALL-UNNAMED", "-cp", str(runner), "fixlab.Runner")
        # processes: a JVM starts about 13 threads of its own (fewer and it cannot start), the run's few more are the
        # candidate's; memory is bounded by -Xmx (a JVM reserves far more address space than it uses)
        return (Step("compile", compile_, self.compile_timeout_s, processes=32, memory_mb=None, env=ENV,
                     service=self.name, service_args=(str(tests),)),
                Step("run", run, run_timeout_s, processes=24, memory_mb=None, env=ENV, secret="stdin"))

    def program(self, candidate: str, test: str, task, run_timeout_s: float | None = None) -> Program:
        prep = self._prepared()
        tests = self.tests_source(test, task)
        compiled = self._compiled_tests(self._stub(task), tests, prep)
        steps = self._steps(prep, compiled, max(run_timeout_s or 0, self.run_timeout_s))
        files = (("Solution.java", self.candidate_source(candidate, task)), ("Main.java", tests))
        return Program(self.name, files, steps, shown_file="Main.java")

    def reference_program(self, candidate: str, test: str, task):
        program = candidate.replace(REFERENCE_CUT, "") + "\n" + test
        return {"Main.java": program}, [[JAVAC, "Main.java"], [JAVA, "-cp", ".", "Main"]]

    def reference_as_program(self, candidate: str, test: str, task) -> Program:
        prog = super().reference_as_program(candidate, test, task)
        return Program(prog.language, prog.files, tuple(Step(**{**s.__dict__, "env": ENV}) for s in prog.steps),
                       prog.shown_file)

    def strip_tests(self, code: str, task) -> str:
        """The answer without a `class Main` it echoes (the harness brings the real tests)."""
        while (m := _MAIN_CLASS.search(_code_only(code))) is not None:
            code = code[:m.start()] + code[cut_block(_code_only(code), m.end()):]
        return code

    # -- reading a failure ---------------------------------------------------------------------------------------

    def failure(self, stdout: str, stderr: str, program, stage: str) -> Failure:
        err = "\n".join(ln for ln in stderr.splitlines() if ln not in SM_BANNER).strip()
        if stage == "compile":
            lines = err.splitlines()
            first = next((i for i, ln in enumerate(lines) if _JAVA_ERROR.match(ln) or ": error: " in ln), None)
            if first is None:
                return Failure(kind="CompileError" if err else None, message=tail(err or stdout.strip(), 1500))
            shown = [ln for ln in lines[first:] if not ln.startswith("Note: ")]
            return Failure(kind="CompileError", message="\n".join(shown)[:1500])
        lines = err.splitlines()
        head = next((i for i, ln in enumerate(lines) if _EXC.match(ln)), None)
        if head is None:
            return Failure(kind="Crash" if err or stdout.strip() else None, message=tail(err or stdout.strip(), 1500))
        chain, frames = [], []  # the exception and its causes: (type, detail); each one's frames
        for ln in lines[head:]:
            m = _EXC.match(ln) or _CAUSE.match(ln)
            if m:
                chain.append((m.group(1).split(".")[-1].split("$")[-1], (m.group(2) or "").strip()))
                frames.append([])
            elif (f := _FRAME.match(ln)) and frames:
                frames[-1].append(f)
        sources = dict(program.files) if isinstance(program, Program) else {}

        def source_line(f):
            text = sources.get(f.group(3), "").split("\n")
            n = int(f.group(4))
            return text[n - 1].strip() if 1 <= n <= len(text) else None

        kind, detail = chain[0]
        test_frame = next((f for f in frames[0] if f.group(3) == "Main.java"), None)
        # the candidate's innermost line: in the deepest cause that passed through it
        cand_frame = next((f for fs in reversed(frames) for f in fs if f.group(3) == "Solution.java"), None)
        line, extra = None, {}
        check = re.fullmatch(re.escape(_FAILED_CHECK).replace(r"\{\}", r"(\d+)"), detail)
        if kind == "AssertionError" and test_frame is not None and cand_frame is None:
            n = int(test_frame.group(4))
            extra["failing_lineno"] = n
            line = self._failed_check(sources.get("Main.java", ""), n, int(check.group(1)) if check else None)
        elif cand_frame is not None:
            line = source_line(cand_frame)
        elif test_frame is not None:
            line = source_line(test_frame)
        parts = [f"{kind}: {detail}" if detail else kind]
        parts += [f"caused by {k}: {d}" if d else f"caused by {k}" for k, d in chain[1:]]
        if any(k == "AccessControlException" for k, _ in chain):
            parts.append("(the sandbox refuses this: no exit or halt, System.setOut/setErr, shutdown hooks, "
                         "uncaught-exception handlers, reflection into private members, files, sockets or processes)")
        if cand_frame is not None:
            parts.append(f"at Solution.java:{cand_frame.group(4)}: {source_line(cand_frame)}")
        if test_frame is not None and not (kind == "AssertionError" and cand_frame is None):
            parts.append(f"called by the test at Main.java:{test_frame.group(4)}: {source_line(test_frame)}")
        message = "\n".join(parts) + "\n\n" + "\n".join(lines[head:head + 25])
        return Failure(line=line, kind=kind, message=message[:1500], extra=extra)

    @staticmethod
    def _failed_check(test: str, lineno: int, index: int | None) -> str | None:
        """The failed check: the `index`th expression of the `correct` list before line `lineno`, else the
        condition of the `if` that threw there."""
        lines = test.split("\n")
        before = "\n".join(lines[:lineno])
        if index is not None:
            at = test.rfind("correct = Arrays.asList(", 0, len(before))
            if at >= 0:
                args = _call_args(test, at + len("correct = Arrays.asList"))
                if 0 <= index < len(args):
                    return args[index]
        for k in range(min(lineno, len(lines)) - 1, max(lineno - 4, 0) - 1, -1):
            m = re.search(r"\bif\s*\((.*)\)\s*\{?\s*$", lines[k])
            if m:
                return m.group(1).strip()
        return lines[lineno - 1].strip() if 1 <= lineno <= len(lines) else None


LANGUAGE = Java()
