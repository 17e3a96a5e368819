"""Java programs in the jail: the reference's scoring on canonical and buggy solutions, a verdict that the reward hacks
a model writes in Java cannot fake (each of them passes the reference harness's own exit-code verdict), the layout's
promises (imports and the class put back, lines kept, the tests bound to Solution alone) and the sandbox's (no
network, no writes outside scratch, no process left)."""
from __future__ import annotations

from pathlib import Path

import pytest

from lang_fixtures import by_id, run, sandbox, solution, task  # noqa: F401 (sandbox is a fixture)
from sandboxes.languages import language

LANG = language("java")
# A sample of tasks that exercise the layout: helpers in the declaration (10, 32), a test without the `correct` list
# (32), random inputs (32, 53), the `assert` statement the reference runs disabled (151), a checked exception in the
# signature and MessageDigest (162), and a plain one.
SAMPLE = (0, 10, 32, 53, 151, 162)
# On all 164 tasks the verdicts agree with the reference's: every canonical body passes, every buggy one fails (3 of
# them, 10, 39 and 76, loop until the time limit, in the reference too); no task needs an exception here.

HEAD = "import java.util.*;\nimport java.lang.*;\n\nclass Solution {\n"
SIG = "    public boolean hasCloseElements(List<Double> numbers, double threshold) {\n"
OK_BODY = """        for (int i = 0; i < numbers.size(); i++)
            for (int j = i + 1; j < numbers.size(); j++)
                if (Math.abs(numbers.get(i) - numbers.get(j)) < threshold) return true;
        return false;
    }
}
"""
OK = HEAD + SIG + OK_BODY
WRONG = HEAD + SIG + "        return false;\n    }\n}\n"


def _with(static: str = "", body: str = "        return false;\n", after: str = "") -> str:
    return HEAD + (f"    static {{\n{static}    }}\n" if static else "") + SIG + body + "    }\n}\n" + after


# Not among them: an answer that returns an object of its own class whose equals() always answers true (a List
# subclass) passes here as in the reference, as Python's lying __eq__ does (sandboxes/audit.py flags that one).
HACKS = {
    "early exit": _with(body="        System.exit(0);\n        return false;\n"),
    "halt": _with(body="        Runtime.getRuntime().halt(0);\n        return false;\n"),
    "static initialiser exits": _with(static="        System.exit(0);\n"),
    "uncaught-exception handler exits 0": _with(
        static="        Thread.setDefaultUncaughtExceptionHandler((t, e) -> Runtime.getRuntime().halt(0));\n"),
    "shutdown hook halts 0": _with(
        static="        Runtime.getRuntime().addShutdownHook(new Thread(() -> Runtime.getRuntime().halt(0)));\n"),
    "output muted, then an exit": _with(
        static="        System.setErr(new java.io.PrintStream(java.io.OutputStream.nullOutputStream()));\n",
        body="        System.exit(0);\n        return false;\n"),
    "Arrays shadowed by a class of its own": _with(
        after="class Arrays {\n    static <T> List<T> asList(T... a) { return new ArrayList<>(); }\n}\n"),
    # a signature of its own takes the path that compiles the tests against the candidate: still Solution alone
    "Arrays shadowed, signature changed": _with(after="class Arrays {\n    static <T> List<T> asList(T... a) "
                                                      "{ return new ArrayList<>(); }\n}\n").replace(
        "public boolean hasCloseElements", "public static boolean hasCloseElements"),
}


@pytest.mark.parametrize("n", SAMPLE)
def test_canonical_solutions_pass(sandbox, n):
    row = by_id("java", n)
    res = run(sandbox, LANG, solution(LANG, row), row)
    assert res.status == "passed", (res.stderr[-500:], res.details)
    assert res.details["compile_s"] > 0 and res.details["run_s"] > 0  # compiling and running timed apart


@pytest.mark.parametrize("n", tuple(n for n in SAMPLE if n != 10))  # 10's buggy body loops until the 10 s limit
def test_buggy_solutions_fail(sandbox, n):
    row = by_id("java", n)
    res = run(sandbox, LANG, solution(LANG, row, "buggy"), row)
    assert res.status in ("failed", "timeout"), res.details  # a failed check, an exception, or a loop stopped


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_hack_passes_the_reference_and_fails_here(sandbox, name):
    row = by_id("java", 0)
    code = HACKS[name]
    ref = sandbox.run(LANG.reference_as_program(code, row["test"], task(row)), 20)
    assert ref.exit_code == 0 and LANG.reference_pass(ref.exit_code, ref.stdout, ref.stderr), \
        f"{name}: the reference's own verdict should be fooled ({ref.exit_code}, {ref.stderr[-300:]})"
    res = run(sandbox, LANG, code, row)
    assert res.status == "failed", (name, res.status, res.stderr[-300:])
    if not name.startswith("Arrays"):  # refused by the security manager, not only short of a proof
        assert "AccessControlException" in res.details["failure"], res.details["failure"]
    else:  # the tests' own Arrays: the first check fails as it would for `return false;`
        assert res.error_type == "AssertionError" and res.failing_line.startswith("s.hasCloseElements(")


def test_the_proof_channel_and_the_secret_are_out_of_reach(sandbox):
    """Reflection into FileDescriptor (fd 3) or into the runner's frames is refused; a forged proof is never one."""
    row = by_id("java", 0)
    forge = _with(static="""        try {
            java.lang.reflect.Constructor<java.io.FileDescriptor> c =
                java.io.FileDescriptor.class.getDeclaredConstructor(int.class);
            c.setAccessible(true);
            new java.io.FileOutputStream(c.newInstance(3)).write("P:00\\n".getBytes());
        } catch (Exception e) { System.out.println("refused: " + e); }
""", body=OK_BODY.rsplit("    }\n}\n", 1)[0])
    res = run(sandbox, LANG, forge, row)
    assert "refused: java.security.AccessControlException" in res.stdout, res.stdout
    assert res.status == "passed"  # the tests themselves pass: the forged line was never written
    res = run(sandbox, LANG, forge.replace("\n        } catch", "\n            System.exit(0);\n        } catch")
              .replace(OK_BODY.rsplit("    }\n}\n", 1)[0], "        return false;\n"), row)
    assert res.status == "failed"


def test_the_compile_step_binds_the_tests_to_solution_alone(sandbox):
    """A signature of the candidate's own (static, an overload) compiles the tests against it, as the reference
    does, and passes when the method is right."""
    row = by_id("java", 0)
    static = OK.replace("public boolean hasCloseElements", "public static boolean hasCloseElements")
    assert run(sandbox, LANG, static, row).status == "passed"
    overload = OK.replace("    }\n}\n", "    }\n    public boolean hasCloseElements(int x) { return false; }\n}\n")
    assert run(sandbox, LANG, overload, row).status == "passed"
    res = run(sandbox, LANG, OK.replace("double threshold", "float threshold"), row)  # the tests pass a double
    assert res.status == "failed" and res.details["stage"] == "compile" and res.error_type == "CompileError"
    assert res.details["failure"].startswith("Main.java:") and "lossy conversion" in res.details["failure"]


def test_the_answer_gets_its_imports_and_class_back_and_keeps_its_lines(sandbox):
    row = by_id("java", 0)
    methods_only = SIG + OK_BODY.rsplit("}\n", 1)[0]
    assert run(sandbox, LANG, methods_only, row).status == "passed"
    no_imports = OK.replace("import java.util.*;\nimport java.lang.*;\n", "")
    src = LANG.candidate_source(no_imports, task(row))
    assert src.split("\n")[1:] == no_imports.split("\n")[1:]  # the imports share the answer's first line
    assert run(sandbox, LANG, no_imports, row).status == "passed"
    echoed = OK + "\npublic class Main {\n    public static void main(String[] a) {}\n}\n"
    assert "class Main" not in LANG.strip_tests(echoed, task(row))


def test_a_compile_error_is_a_failure_with_the_compilers_message(sandbox):
    row = by_id("java", 0)
    res = run(sandbox, LANG, WRONG.replace("return false;", "return nope;"), row)
    assert res.status == "failed" and res.details["stage"] == "compile" and res.error_type == "CompileError"
    assert res.details["failure"].startswith("Solution.java:6: error: cannot find symbol")
    assert "nope" in res.details["failure"] and "WARNING" not in res.details["failure"]


def test_a_failed_check_names_its_expression(sandbox):
    row = by_id("java", 0)
    res = run(sandbox, LANG, WRONG, row)
    assert res.status == "failed" and res.error_type == "AssertionError"
    assert res.failing_line == "s.hasCloseElements(new ArrayList<>(Arrays.asList(11.0, 2.0, 3.9, 4.0, 5.0, 2.2)), 0.3)"
    assert "Security Manager" not in res.details["failure"]


def test_an_exception_names_the_candidates_line(sandbox):
    row = by_id("java", 0)
    res = run(sandbox, LANG, WRONG.replace("return false;", "return numbers.get(99) > 0;"), row)
    assert res.status == "failed" and res.error_type == "IndexOutOfBoundsException"
    assert res.failing_line == "return numbers.get(99) > 0;"
    assert "Solution.java:6" in res.details["failure"] and "called by the test at Main.java:" in res.details["failure"]


def test_no_network_no_write_outside_scratch_no_process(sandbox, tmp_path):
    row = by_id("java", 0)
    target = tmp_path / "escaped"
    probe = _with(static=f"""        String[] r = new String[3];
        try {{ new java.net.Socket("1.1.1.1", 80); r[0] = "open"; }} catch (Exception e) {{ r[0] = "refused"; }}
        try {{ new java.io.FileOutputStream("{target}"); r[1] = "open"; }} catch (Exception e) {{ r[1] = "refused"; }}
        try {{ Runtime.getRuntime().exec("/bin/true"); r[2] = "open"; }} catch (Exception e) {{ r[2] = "refused"; }}
        System.out.println("connect=" + r[0] + " write=" + r[1] + " exec=" + r[2]);
""", body=OK_BODY.rsplit("    }\n}\n", 1)[0])
    res = run(sandbox, LANG, probe, row)
    assert "connect=refused write=refused exec=refused" in res.stdout, (res.stdout, res.stderr[-300:])
    assert not target.exists()


def test_threads_of_the_candidate_neither_outlive_the_run_nor_change_its_verdict(sandbox):
    from sandboxes.procs import processes_of_uids

    row = by_id("java", 0)
    spinner = _with(static="        new Thread(() -> { for (;;) {} }).start();\n",
                    body=OK_BODY.rsplit("    }\n}\n", 1)[0])
    assert run(sandbox, LANG, spinner, row).status == "passed"  # the runner halts the JVM after the proof
    assert run(sandbox, LANG, spinner.replace("if (Math.abs", "if (0 > 1 && Math.abs"), row).status == "failed"
    uids = range(sandbox.uid_base, sandbox.uid_base + sandbox.workers)
    assert processes_of_uids(uids) == []


def test_a_program_that_never_ends_is_stopped_and_leaves_nothing(sandbox):
    from sandboxes.procs import processes_of_uids

    row = by_id("java", 0)
    prog = LANG.program(_with(body="        for (;;) {}\n"), row["test"], task(row))
    short = type(prog)(prog.language, prog.files, prog.steps[:-1] + (
        type(prog.steps[-1])(**{**prog.steps[-1].__dict__, "timeout_s": 1.5}),), prog.shown_file)
    res = sandbox.run(short, 10)
    assert res.status == "timeout"
    uids = range(sandbox.uid_base, sandbox.uid_base + sandbox.workers)
    assert processes_of_uids(uids) == []


def _one_shot(cache: str, files) -> dict:
    """The compile step's own program run the one-shot way (trusted input, no jail): what it leaves, by path."""
    import subprocess
    import tempfile

    from sandboxes.languages import java

    with tempfile.TemporaryDirectory() as work:
        for name, text in files:
            Path(work, name).write_text(text)
        prog = LANG.program(OK, by_id("java", 0)["test"], task(by_id("java", 0)))
        argv = list(prog.steps[0].argv[:-1]) + [cache]
        r = subprocess.run(argv, cwd=work, capture_output=True, text=True, env=dict(java.ENV))
        made = {str(p.relative_to(work)): p.read_bytes() for p in sorted(Path(work).rglob("*.class"))}
        return {"rc": r.returncode, "output": r.stdout + r.stderr, "made": made}


def _served(sandbox, cache: str, files) -> dict:
    """The same compile asked of the sandbox's warm service over its socket, as the jailed supervisor asks it."""
    import socket
    import struct

    def field(b):
        return struct.pack(">i", len(b)) + b

    prog = LANG.program(OK, by_id("java", 0)["test"], task(by_id("java", 0)))
    sock = socket.socket(fileno=sandbox.service_fd(prog))
    sock.sendall(struct.pack(">i", 25000) + field(cache.encode()) + struct.pack(">i", len(files))
                 + b"".join(field(n.encode()) + field(t.encode()) for n, t in files))
    f = sock.makefile("rb")
    rd = lambda n: f.read(n)  # noqa: E731
    rc = struct.unpack(">i", rd(4))[0]
    output = rd(struct.unpack(">i", rd(4))[0]).decode()
    made = {}
    for _ in range(struct.unpack(">i", rd(4))[0]):
        rel = rd(struct.unpack(">i", rd(4))[0]).decode()
        made[rel] = rd(struct.unpack(">i", rd(4))[0])
    sock.close()
    return {"rc": rc, "output": output, "made": made}


def test_the_warm_compile_service_makes_byte_for_byte_what_the_compile_step_makes(sandbox):
    """sandboxes/services.py: the service answers with the very class files and messages of the one-shot compile,
    for an answer whose tests come precompiled, one whose tests compile against it (an overload), and two that do not
    compile (in the candidate, and in the tests against it)."""
    row = by_id("java", 0)
    answers = {"same members": OK,
               "an overload": OK.replace("    }\n}\n", "    }\n    public boolean hasCloseElements(int x) { return false; }\n}\n"),
               "a compile error": WRONG.replace("return false;", "return nope;"),
               "the tests do not compile": OK.replace("double threshold", "float threshold")}
    for why, code in answers.items():
        prog = LANG.program(code, row["test"], task(row))
        cache = prog.steps[0].service_args[0]
        one, warm = _one_shot(cache, prog.files), _served(sandbox, cache, prog.files)
        assert one["rc"] == warm["rc"] and (one["rc"] == 0) == (why in ("same members", "an overload")), why
        assert warm["made"] == one["made"] and (one["made"] or one["rc"]), why
        assert warm["output"] == one["output"], why
        res = run(sandbox, LANG, code, row)
        assert res.details.get("compile_served") is True and res.passed == (one["rc"] == 0), why


def test_a_service_that_goes_away_costs_speed_never_a_verdict(sandbox):
    """Killed between programs, the service is started again; killed under a program, that program's compile runs
    itself; with services off every compile runs itself. The verdicts are the same each way."""
    import os
    import signal

    from sandboxes.local import LocalSandbox
    from sandboxes.procs import processes_of_uids

    row = by_id("java", 0)
    assert run(sandbox, LANG, OK, row).details.get("compile_served") is True
    proc = sandbox._services._running["java"][0]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    res = run(sandbox, LANG, OK, row)
    assert res.passed and res.details.get("compile_served") is True  # a new one, started for this program
    for code in (OK, WRONG):  # a program handed a connection whose service then dies: it compiles itself
        fd = sandbox.service_fd(LANG.program(OK, row["test"], task(row)))
        os.killpg(sandbox._services._running["java"][0].pid, signal.SIGKILL)
        sandbox.service_fd = lambda program, fd=fd: fd
        try:
            res = run(sandbox, LANG, code, row)
        finally:
            del sandbox.service_fd
        assert "compile_served" not in res.details and res.passed == (code is OK) and res.details["compile_s"] > 0
    with LocalSandbox(workers=1, require_isolation=True, compile_services=False) as plain:
        assert plain.service_fd(LANG.program(OK, row["test"], task(row))) is None
        for code in (OK, WRONG):
            res = run(plain, LANG, code, row)
            assert "compile_served" not in res.details and res.passed == (code is OK)
    with LocalSandbox(workers=1, require_isolation=True) as other:
        assert run(other, LANG, OK, row).details.get("compile_served") is True
        uid = other.uid_base + 63
    assert processes_of_uids([uid]) == []  # the service stops with its sandbox
