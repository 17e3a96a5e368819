"""One test per attack, on each backend with warm workers (local jail, Docker): the verdict is never `passed` and
the side effect is absent.

Every attack program carries a wrong solution (add returns a - b), so only a faked verdict could pass.
"""
from __future__ import annotations

import os
import socket
import textwrap
import time
import uuid

import pytest
from docker_fixtures import docker_unavailable

from sandboxes import build_program
from sandboxes.docker import DockerSandbox
from sandboxes.local import LocalSandbox, probe_bwrap
from sandboxes.procs import processes_of_uids, sandbox_uids

WRONG = "def add(a, b):\n    return a - b\n"
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n\ncheck(add)\n"
T = 3.0  # seconds; attacks that must be stopped by the clock use this
jailed = pytest.mark.skipif(probe_bwrap() is not None, reason=f"bubblewrap jail unavailable: {probe_bwrap()}")


def attack(code: str, candidate: str = WRONG, test: str = TEST) -> str:
    return build_program(candidate + "\n" + textwrap.dedent(code), test)


@pytest.fixture(scope="module", params=["local", "docker"])
def backend(request):
    why = probe_bwrap() if request.param == "local" else docker_unavailable()
    if why is not None:
        pytest.skip(f"bubblewrap jail unavailable: {why}" if request.param == "local" else why)
    return request.param


def make(backend: str, **kw):
    """A sandbox of that backend; the Docker one's uids lie apart (RLIMIT_NPROC counts per uid machine-wide)."""
    if backend == "docker":
        if "uid_base" in kw:
            kw["uid_base"] += 1000
        return DockerSandbox(**kw)
    return LocalSandbox(**kw)


@pytest.fixture(scope="module")
def sbx(backend):
    s = make(backend, workers=2)
    yield s
    s.close()


@pytest.fixture(scope="module")
def forking(backend):
    """fork allowed: tests the kernel layers (pid namespace, RLIMIT_NPROC) without the audit hook's help."""
    s = make(backend, workers=1, allow_fork=True, max_processes=16, uid_base=62100)
    yield s
    s.close()


def no_leftovers(s, wait_s: float = 10.0) -> list:
    end = time.monotonic() + wait_s
    while True:
        left = [p for p in processes_of_uids(sandbox_uids(s))]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def still_works(s) -> None:
    ok = s.run(build_program("def add(a, b):\n    return a + b\n", TEST), 10)
    assert ok.status == "passed", ok


def test_control_wrong_solution_fails_and_right_one_passes(sbx):
    r = sbx.run(attack(""), 10)
    assert r.status == "failed" and r.error_type == "AssertionError"
    assert r.failing_line == "assert candidate(2, 3) == 5"
    still_works(sbx)


# --- fake-pass attempts -------------------------------------------------------------------------------


@pytest.mark.parametrize("code,exit_code", [
    ("import sys\nsys.exit(0)\n", 0),
    ("import os\nos._exit(0)\n", 0),
    ("raise SystemExit\n", 0),
    # atexit handlers never run: the child ends with os._exit once the program is over
    ("import atexit, os\natexit.register(lambda: os._exit(0))\nraise AssertionError\n", 1),
], ids=["sys.exit", "os._exit", "SystemExit", "atexit"])
def test_exit_code_zero_is_not_a_pass(sbx, code, exit_code):
    r = sbx.run(attack(code), 10)
    assert r.status == "failed", r
    assert r.exit_code == exit_code  # exit code 0 alone never makes a pass


def test_print_passed_and_fake_assertion_error(sbx):
    code = """
    import builtins
    print("passed"); print("OK: all tests passed")
    class Quiet(Exception):
        pass
    builtins.AssertionError = Quiet
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "passed" in r.stdout


def test_patching_builtins_used_by_the_test(sbx):
    test = "def check(candidate):\n    assert abs(candidate(2, 3) - 5) < 1e-9\n\ncheck(add)\n"
    right_test_passes = sbx.run(build_program("def add(a, b):\n    return a + b\n", test), 10)
    assert right_test_passes.status == "passed"
    patched = sbx.run(attack("import builtins\nbuiltins.abs = lambda x: 0\n", test=test), 10)
    assert patched.status == "failed" and patched.error_type == "TamperError"
    shadowed = sbx.run(attack("def abs(x):\n    return 0\n", test=test), 10)
    assert shadowed.status == "failed" and "shadowed" in shadowed.stderr
    mod = sbx.run(attack("import math\nmath.isclose = lambda *a, **k: True\n",
                         test="import math\ndef check(c):\n    assert math.isclose(c(2, 3), 5)\ncheck(add)\n"), 10)
    assert mod.status == "failed" and "math.isclose was replaced" in mod.stderr


def test_frame_walk_with_sys_getframe(sbx):
    code = """
    import sys, os
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            if isinstance(v, bytes) and len(v) == 32:
                os.write(3, v); os._exit(0)
        f = f.f_back
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "sys._getframe is disabled" in r.stderr


def test_frame_walk_through_traceback_and_generators(sbx):
    code = """
    import os
    def steal(f):
        while f is not None:
            for v in list(f.f_locals.values()):
                if isinstance(v, bytes) and len(v) == 32:
                    os.write(3, v); os._exit(0)
            f = f.f_back
    try:
        1 / 0
    except ZeroDivisionError as e:
        try:
            steal(e.__traceback__.tb_frame)
        except PermissionError:
            pass
    def gen():
        yield g.gi_frame
    g = gen()
    steal(next(g))
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "frame access is disabled" in r.stderr


def test_gc_introspection(sbx):
    code = """
    import gc, os
    for o in gc.get_objects():
        if isinstance(o, bytes) and len(o) == 32:
            os.write(3, o)
    os._exit(0)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "gc.get_objects is disabled" in r.stderr
    r2 = sbx.run(attack("import gc, sys\ngc.get_referrers(sys.modules)\n"), 10)
    assert r2.status == "failed" and "gc.get_referrers is disabled" in r2.stderr


def test_proc_self_mem_and_fd_reading(sbx):
    code = """
    import os
    stolen = b""
    for fd in range(0, 256):
        try:
            os.set_blocking(fd, False)
            stolen += os.read(fd, 4096)
        except OSError:
            pass
    for fd in range(3, 256):
        try:
            os.write(fd, stolen[-32:] or b"x" * 32)
        except OSError:
            pass
    try:
        open("/proc/self/mem", "rb")
    except OSError as e:
        print("mem:", type(e).__name__)
    # the same files by paths without "proc" in them (/dev/fd links to /proc/self/fd): own memory, the worker's
    # and init's environment and memory
    for p in ("/dev/fd/../mem", "/dev/fd/../../1/environ", "/dev/fd/../../2/environ", "/dev/fd/../../2/mem",
              "/dev/fd/../../7/mem"):
        try:
            open(p, "rb").read(1)
            print("opened", p)
        except OSError as e:
            print("refused:", type(e).__name__)
    os._exit(0)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed"
    assert "mem:" in r.stdout  # /proc/self/mem could not be opened
    assert "opened" not in r.stdout and r.stdout.count("refused:") == 5


def test_ctypes_memory_access(sbx):
    code = """
    import ctypes, os
    buf = ctypes.string_at(id(os), 64)
    os.write(3, buf[:32]); os._exit(0)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "ctypes." in r.stderr and "disabled" in r.stderr


def test_cpython_test_modules(sbx):
    code = """
    for name in ("_testcapi", "_testinternalcapi", "_xxsubinterpreters"):
        try:
            __import__(name)
            print("imported", name)
        except ImportError:  # Denied is a PermissionError, not an ImportError: it ends the program
            print("missing", name)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "imported" not in r.stdout
    assert "importing _testcapi is disabled" in r.stderr


def test_signal_handler_frame_and_tracing(sbx):
    code = """
    import signal, sys
    try:
        signal.signal(signal.SIGALRM, lambda s, f: None)
    except ValueError as e:
        print("signal:", e)
    try:
        sys.settrace(lambda *a: None)
    except PermissionError as e:
        print("settrace:", e)
    try:
        sys.addaudithook(lambda *a: None)
        print("hook added")
    except Exception as e:
        print("hook:", e)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed"
    assert "signal:" in r.stdout and "settrace:" in r.stdout


def test_threads_and_fork_are_refused(sbx):
    code = """
    import threading, os, _posixsubprocess
    try:
        threading.Thread(target=lambda: None).start()
    except RuntimeError as e:
        print("thread:", e)
    try:
        os.fork()
    except OSError as e:
        print("fork:", e)
    try:
        os.posix_spawn("/bin/true", ["/bin/true"], {})
    except OSError as e:
        print("spawn:", e)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed"
    assert "thread:" in r.stdout and "fork:" in r.stdout and "spawn:" in r.stdout


def test_killing_the_parent(sbx):
    code = """
    import os, signal
    for pid in (os.getppid(), 1):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as e:
            print("kill", pid, type(e).__name__)
    os._exit(0)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed"
    assert r.stdout.count("PermissionError") == 2
    still_works(sbx)


def test_closing_stdout_and_status_fds(sbx):
    code = "import os\nfor fd in (1, 2, 3):\n    os.close(fd)\n"
    r = sbx.run(attack(code), 10)
    assert r.status == "failed"
    still_works(sbx)


# --- escapes and resource attacks ----------------------------------------------------------------------


def test_network_to_a_local_server(sbx):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    code = f"""
    import socket
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"leak")
        print("connected")
    except OSError as e:
        print("net:", type(e).__name__)
    """
    r = sbx.run(attack(code), 10)
    try:
        conn, _ = srv.accept()
        conn.close()
        accepted = True
    except socket.timeout:
        accepted = False
    finally:
        srv.close()
    assert r.status == "failed" and "net:" in r.stdout
    assert not accepted


def test_writing_home_and_project(sbx, tmp_path):
    name = f"fixlab-attack-{uuid.uuid4().hex}"
    home, project = os.path.expanduser("~"), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    targets = [os.path.join(home, name), os.path.join(project, name), os.path.join(str(tmp_path), name)]
    code = f"""
    for p in {targets!r}:
        try:
            open(p, "w").write("x")
            print("wrote", p)
        except OSError as e:
            print("write:", type(e).__name__)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "wrote" not in r.stdout and r.stdout.count("write:") == 3
    assert not any(os.path.exists(p) for p in targets)


def test_no_writable_place_but_the_programs_scratch(sbx):
    code = """
    import os
    scratch = os.getcwd()
    for d in ("/", "/tmp", "/tmp/fixlab", "/var/tmp", "/dev", "/dev/shm", "/dev/mqueue", "/run", "/run/lock",
              "/scratch", "/opt", "/home", "/root", "/etc", "/usr/lib", os.path.dirname(scratch)):
        try:
            with open(os.path.join(d, "fixlab-attack-probe"), "w") as f:
                f.write("x")
            print("wrote", d)
        except OSError as e:
            print("refused:", type(e).__name__)
    open(os.path.join(scratch, "ok.txt"), "w").write("x")
    print("scratch ok", os.environ["HOME"] == os.environ["TMPDIR"] == scratch)
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and "wrote" not in r.stdout and r.stdout.count("refused:") == 16, r.stdout
    assert "scratch ok True" in r.stdout


def test_secret_environment_variable(backend, tmp_path, monkeypatch):
    value = "sk-" + uuid.uuid4().hex
    monkeypatch.setenv("FIXLAB_FAKE_API_KEY", value)
    s = make(backend, workers=1, uid_base=62200)
    try:
        r = s.run(attack("import os\nprint(dict(os.environ))\n"), 10)
    finally:
        s.close()
    assert r.status == "failed"
    assert value not in r.stdout and "FIXLAB_FAKE_API_KEY" not in r.stdout
    assert "HOME" in r.stdout  # the program did print its (scrubbed) environment


def test_fork_bomb_blocked_by_hook(sbx):
    r = sbx.run(attack("import os\nwhile True:\n    os.fork()\n"), T)
    assert r.status == "failed" and r.error_type == "Denied"
    assert no_leftovers(sbx) == []


def test_fork_bomb_stopped_by_kernel(forking):
    code = """
    import os
    n = 0
    while True:
        try:
            os.fork(); n += 1
        except OSError:
            break
    import time; time.sleep(30)
    """
    r = forking.run(attack(code), T)
    assert r.status == "timeout"
    assert no_leftovers(forking) == []
    still_works(forking)


def test_daemon_outliving_the_program(forking, tmp_path):
    code = """
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    time.sleep(0.3)
    """
    r = forking.run(attack(code), 10)
    assert r.status == "failed"
    assert no_leftovers(forking) == []


def test_setsid_daemon_killed_at_timeout(forking):
    code = """
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                pass
        os._exit(0)
    while True:
        time.sleep(1)
    """
    r = forking.run(attack(code), T)
    assert r.status == "timeout"
    assert no_leftovers(forking) == []


def test_memory_bomb(sbx):
    r = sbx.run(attack("x = bytearray(8 * 1024 ** 3)\n"), 10)
    assert r.status == "failed" and r.error_type == "MemoryError", r
    # filling 2 GiB page by page takes seconds on a loaded machine: a generous clock, the limit must end it first
    r = sbx.run(attack("x = []\nwhile True:\n    x.append(' ' * 10 ** 7)\n"), 30)
    assert r.status == "failed" and r.error_type == "MemoryError", r
    still_works(sbx)


def test_infinite_loop(sbx):
    r = sbx.run(attack("while True:\n    pass\n"), T)
    assert r.status == "timeout"
    assert no_leftovers(sbx) == []


def test_busy_loop_ignoring_signals(sbx):
    code = """
    import signal
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGALRM):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:
            pass
    x = 0
    while True:
        try:
            x += 1
        except BaseException:
            pass
    """
    r = sbx.run(attack(code), T)
    assert r.status == "timeout"
    assert no_leftovers(sbx) == []
    still_works(sbx)


def test_output_flood_of_1gb(sbx):
    code = """
    import os
    block = b"A" * (1 << 20)
    for _ in range(1024):
        os.write(1, block)
    """
    r = sbx.run(attack(code), 30)
    assert r.status == "failed" and r.stdout_truncated
    assert len(r.stdout) < 70 * 1024 and "output cut" in r.stdout
    assert "output_limit_bytes" in r.details
    still_works(sbx)


def test_recursion_overflow(sbx):
    # through map() every level also takes C stack: ends in RecursionError or a segfault, never a pass
    code = """
    import sys
    sys.setrecursionlimit(10 ** 7)
    def f(n):
        return list(map(f, [n + 1]))
    f(0)
    """
    r = sbx.run(attack(code), T)
    assert r.status in ("failed", "timeout") and r.status != "passed"
    assert r.error_type == "RecursionError" or r.details.get("signal") == "SIGSEGV" or r.status == "timeout"
    still_works(sbx)


def test_input_waits_on_stdin(sbx):
    r = sbx.run(attack("name = input()\n"), 10)
    assert r.status == "failed" and r.error_type == "EOFError"


def test_state_does_not_leak_between_programs(backend):
    s = make(backend, workers=1, uid_base=62300)
    try:
        first = s.run(attack("import math, os\nmath.pi = 3\nopen('leak.txt', 'w').write('x')\n"
                             "open(os.environ['HOME'] + '/leak2.txt', 'w').write('x')\n"), 10)
        second = s.run(build_program(
            "import glob, math, os\ndef add(a, b):\n    return a + b\n"
            "assert math.pi != 3\nassert not os.path.exists('leak.txt')\n"
            "assert not glob.glob('/tmp/*/*/leak*.txt') and not glob.glob('/tmp/*/leak*.txt')\n"
            "assert not glob.glob('/scratch/*/leak*.txt')\n", TEST), 10)
    finally:
        s.close()
    assert first.status == "failed"
    assert second.status == "passed", second.stderr


def test_signal_handler_installed_while_the_traceback_is_printed(sbx):
    # The exception's __str__ runs in the main thread (where handlers can be set) while the failure is
    # printed. From there the handler reaches the runner's frame: the secret, the unsealing function and
    # the flag that lets it call ctypes must all be gone by then.
    code = """
    import os, signal
    def grab(signum, frame):
        while frame is not None:
            loc = frame.f_locals
            if loc.get("allow_ctypes") is not None:
                loc["allow_ctypes"][0] = True
            if loc.get("unprotect") is not None:
                loc["unprotect"]()
                os.write(3, bytes(loc["unprotect"].__defaults__[0])[:32])
                os._exit(0)
            if loc.get("secret") is not None:
                os.write(3, bytes(memoryview(loc["secret"])[:loc["secret_len"]]))
                os._exit(0)
            frame = frame.f_back
        print("handler ran, nothing found")
    class Loud(Exception):
        def __str__(self):
            signal.signal(signal.SIGUSR1, grab)
            os.kill(os.getpid(), signal.SIGUSR1)
            return "loud"
    raise Loud()
    """
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and r.error_type == "Loud"
    assert "handler ran, nothing found" in r.stdout  # the handler did run, in the main thread


def test_rebinding_the_runner_module_globals(sbx):
    # Rebind the runner's module globals, then make the end-of-run check itself raise (a key whose
    # __eq__ raises once armed, probed before 'abs'): the checks must still refuse the pass.
    code = """
    import __main__, builtins
    for name in ("BaseException", "Exception", "list", "type", "str", "exec", "OK", "TamperError"):
        setattr(__main__, name, KeyError)
    armed = [False]
    class Evil(str):
        def __hash__(self):
            return hash("abs")
        def __eq__(self, other):
            if armed[0]:
                raise KeyError("boom")
            return False
    f = builtins.abs
    del builtins.__dict__["abs"]
    builtins.__dict__[Evil("x")] = 1
    builtins.abs = f
    armed[0] = True  # only now: under load the dict lookups above compared with Evil more than once
    """
    right = "def add(a, b):\n    return a + b\n"
    r = sbx.run(attack(code, candidate=right), 10)
    assert r.status == "failed" and r.error_type == "TamperError" and "end-of-run checks" in r.stderr
    r = sbx.run(attack(code), 10)
    assert r.status == "failed" and r.error_type == "AssertionError"


SEAL_PROBE = """
import ctypes, sys
sys.path.insert(0, sys.argv[2])
import numpy as np
import _jail
page, n, unprotect = _jail._seal(lambda p: p.write(b"S" * 32))
assert n == 32 and unprotect is not None
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))

class Raw:  # numpy's documented raw-pointer interface: reads any address, no audit event
    __array_interface__ = {"data": (addr, True), "shape": (32,), "typestr": "|u1", "version": 3}

if sys.argv[1] == "unseal":
    unprotect()
print(bytes(np.asarray(Raw())), flush=True)
"""


@jailed
@pytest.mark.parametrize("mode", ["sealed", "unseal"])
def test_secret_page_is_unreadable_by_raw_memory_reads(mode):
    import subprocess
    import sys
    d = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandboxes")
    r = subprocess.run([sys.executable, "-c", SEAL_PROBE, mode, d], capture_output=True, text=True, timeout=60)
    if mode == "sealed":
        assert r.returncode == -11 and "SSS" not in r.stdout  # SIGSEGV instead of the secret
    else:
        assert r.returncode == 0 and "S" * 32 in r.stdout  # the probe itself reads memory fine
