"""Warm worker that runs inside the jail or container (started by local.py / docker.py; stdlib + numpy only).

It imports the harness's import helper once, then forks one child per program. The child drops to its
own uid, applies rlimits, runs the program in a second thread and reports completion with the run's
secret on a private fd. See README.md for what each step defends against.
"""
import os
import sys

# The import helper (program.IMPORT_HELPER) preloaded once: forks inherit it, so programs start warm.
import math, re, copy, datetime, itertools, collections, heapq, statistics, functools, hashlib, string  # noqa
import typing  # noqa
import numpy  # noqa

import builtins
import fcntl
import json
import mmap
import resource
import shutil
import signal
import socket
import struct
import _thread

try:
    import ctypes
except ImportError:  # the jail works without it: only the non-root fallback uses prctl
    ctypes = None

_HDR = struct.Struct("!I")
_SECRET_LEN = 32
_STATUS_FD = 3
_SECRET_FD = 4
_SERVICE_FD = 5  # a compiled program's compile service, when the host sent one
_PROGRAM = "program.py"
# Module dicts whose entries a candidate must not rebind (tests call abs, len, math.isclose, np.allclose...).
_GUARDED = (builtins, math, re, copy, datetime, itertools, collections, heapq, statistics, functools,
            hashlib, string, typing, numpy)


_NATIVE = [None]  # the compiled languages' step runner (_jail_native.py), loaded by main()


def _load_beside(name):
    """A module from the file beside this one. The worker runs under -I (no script dir on sys.path), and Docker
    bind-mounts both files into one folder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                          name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _send(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    msg = _HDR.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [msg], list(fds))
    else:
        sock.sendall(msg)


def _recv_exact(sock, n, fds):
    buf = bytearray()
    while len(buf) < n:
        chunk, got, _flags, _addr = socket.recv_fds(sock, n - len(buf), 8)
        fds.extend(got)
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock):
    fds = []
    hdr = _recv_exact(sock, _HDR.size, fds)
    if hdr is None:
        return None, fds
    body = _recv_exact(sock, _HDR.unpack(hdr)[0], fds)
    if body is None:
        return None, fds
    return json.loads(body), fds


def main():
    if sys.argv[1].startswith("/"):  # in a container: the host's socket, bind-mounted in (sandboxes/docker.py)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(sys.argv[1])
    else:  # in the bubblewrap jail: an inherited fd
        sock = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(sys.argv[2])
    _NATIVE[0] = _load_beside("_jail_native.py")  # before the first fork: every child has it already
    if cfg.get("nice", 0) > os.getpriority(os.PRIO_PROCESS, 0):  # a container starts at 0: the caller's niceness
        os.setpriority(os.PRIO_PROCESS, 0, cfg["nice"])
    root = cfg["scratch_root"]
    os.makedirs(root, exist_ok=True)
    # kill(-1) is only safe when our parent is pid 1 of our own pid namespace (bwrap, or the container's
    # init): outside one it would signal every process of the machine we may signal.
    own_pidns = bool(cfg["pidns"]) and (os.getpid() == 2 or os.getppid() == 1)
    _send(sock, {"ready": True, "pid": os.getpid(), "own_pidns": own_pidns})
    n = 0
    while True:
        msg, fds = _recv(sock)
        if msg is None:
            return
        n += 1
        scratch = os.path.join(root, "r%d" % n)
        os.mkdir(scratch, 0o700)
        if cfg["uid"] is not None:
            os.chown(scratch, cfg["uid"], cfg["uid"])
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                (_native if "native" in msg else _child)(msg, fds, scratch, cfg)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        _send(sock, {"started": pid})
        _, status = os.waitpid(pid, 0)
        # Nothing the program started may outlive it (daemons, setsid, double forks).
        if own_pidns:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(scratch, ignore_errors=True)
        _send(sock, {"wait_status": status})


def _read_secret(fd, page):
    """Straight from the pipe into the sealed page: no bytes object (and no freed copy) on the heap."""
    got = 0
    view = memoryview(page)
    while got < _SECRET_LEN:
        n = os.readv(fd, [view[got:_SECRET_LEN]])
        if not n:
            break
        got += n
    view.release()
    os.close(fd)
    return got


def _seal(fill):
    """The secret in a page of its own, made unreadable (PROT_NONE, 0) while the program runs: a raw memory
    read (e.g. numpy's __array_interface__ with a pointer) of it crashes instead of leaking it.
    Returns (page, length, unprotect or None when sealing is not possible here)."""
    page = mmap.mmap(-1, mmap.PAGESIZE)
    n = fill(page)
    if ctypes is None:
        return page, n, None
    try:
        buf = (ctypes.c_char * mmap.PAGESIZE).from_buffer(page)
        mprotect = ctypes.CDLL(None, use_errno=True).mprotect
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        addr = ctypes.addressof(buf)
        if mprotect(addr, mmap.PAGESIZE, 0) != 0:
            return page, n, None
    except (OSError, AttributeError, ValueError):
        return page, n, None

    def unprotect(_buf=buf):
        return mprotect(addr, mmap.PAGESIZE, 1) == 0  # PROT_READ
    return page, n, unprotect


def _enter(fds, scratch):
    """A program's process before anything of it runs: a session of its own, default signals, stdin /dev/null, its
    stdout and stderr, the proof fd 3 and the secret's fd 4, nothing else open, the scratch dir as its cwd."""
    # Park the received fds high first, so that placing them on 0-5 cannot clobber one another.
    parked = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds]
    out_w, err_w, status_w, secret_r = parked[:4]
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)  # input() gets EOF, never waits
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(status_w, _STATUS_FD, inheritable=False)
    os.dup2(secret_r, _SECRET_FD, inheritable=False)  # read (and closed) before the program starts
    if len(parked) > 4:  # a compile service's connection (sandboxes/services.py), closed before the run step
        os.dup2(parked[4], _SERVICE_FD, inheritable=False)
    os.closerange(_SECRET_FD + 1 + (len(parked) > 4), 1 << 16)  # control socket, the parked copies, the rest
    os.chdir(scratch)


def _drop_privileges(cfg):
    """The program's own uid: no capability left, and non-dumpable, so nothing of its uid can trace this process."""
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # drops every capability; the process also becomes non-dumpable
    elif ctypes is not None:
        try:  # PR_SET_DUMPABLE 0: no other process of our uid may read our memory
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
        except Exception:
            pass


def _child(msg, fds, scratch, cfg):
    _enter(fds, scratch)
    fill = lambda page: _read_secret(_SECRET_FD, page)  # noqa: E731
    lim = cfg["limits"]
    for res, val in ((resource.RLIMIT_AS, lim["memory_bytes"]), (resource.RLIMIT_FSIZE, lim["file_bytes"]),
                     (resource.RLIMIT_NOFILE, lim["open_files"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (val, val))
    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # soft: SIGXCPU, hard: SIGKILL
    _drop_privileges(cfg)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
                       "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    for stream in (sys.stdout, sys.stderr):  # line-buffered: prints survive an os._exit, as in a terminal
        stream.reconfigure(line_buffering=True)
    sys.argv[:] = [_PROGRAM]
    sys.path[0] = scratch
    program = msg["program"]
    with open(_PROGRAM, "w") as f:  # for the source lines in tracebacks
        f.write(program)
    _run(program, fill, lim["processes"] if cfg["allow_fork"] else 1, cfg["allow_fork"])


def _native(msg, fds, scratch, cfg):
    """A compiled language's program (sandboxes/languages): this process becomes its steps' supervisor, with the
    program's fds and uid, and _jail_native.py runs the steps (a file beside this one, loaded when the worker starts)."""
    service = _SERVICE_FD if len(fds) > 4 else None
    _enter(fds, scratch)
    _drop_privileges(cfg)
    _NATIVE[0].run(msg["native"], scratch, cfg["limits"], cfg["allow_fork"], service)


class TamperError(Exception):
    """The program rebound a builtin or an import-helper name the test code relies on."""


def _run(program, fill, nproc, allow_fork):
    # Long on purpose (about 100 lines): the secret, its unsealer and every name used after the program ran are
    # locals of this one frame, which the program's thread cannot reach. Split into helpers, they would live in
    # module globals or in frames the program could inspect or rebind; it reads top to bottom as the run goes.
    # Everything used after the program ran is bound here: the program can rebind module globals.
    write, exit_, display, status_fd = os.write, os._exit, sys.__excepthook__, _STATUS_FD
    bi, tamper = builtins, TamperError
    base_exc, list_, type_, str_ = BaseException, list, type, str
    out, err = sys.stdout, sys.stderr
    OK = object()
    state = [None]
    mv, get_ident = memoryview, _thread.get_ident
    secret, secret_len, unprotect = _seal(fill)
    fill = None
    allow_ctypes = [False]  # only this thread, only once the program is over (see the hook)
    go = _thread.allocate_lock()
    done = _thread.allocate_lock()
    go.acquire()
    done.acquire()
    try:
        code = compile(program, _PROGRAM, "exec")
    except BaseException as e:  # SyntaxError: the candidate's fault, reported like a traceback
        secret = unprotect = allow_ctypes = None
        display(type(e), e, e.__traceback__)
        out.flush()
        exit_(1)
    g = {"__name__": "__main__", "__file__": _PROGRAM, "__builtins__": bi}
    snapshot = [(m.__name__, m.__dict__, dict(m.__dict__)) for m in _GUARDED]
    builtin_names = snapshot[0][2]

    # The program runs in this second thread. The sealed secret and its unsealer are locals of _run's frame
    # (main thread), which no frame of this thread reaches; signal handlers (which get the main thread's
    # frame) can only be installed from the main thread.
    def target():
        # Names resolved here are closure cells, never module globals the program could rebind.
        ok = False
        go.acquire()
        try:
            try:
                exec(code, g)
            except base_exc as e:
                state[0] = e
            else:
                problem = None
                for name, live, saved in snapshot:
                    for k, v in saved.items():
                        if live.get(k, tamper) is not v:
                            problem = "%s.%s was replaced" % (name, k)
                            break
                    if problem is not None:
                        break
                if problem is None and g.get("__builtins__") is not bi:
                    problem = "__builtins__ was replaced"
                if problem is None:
                    for k, v in list_(g.items()):
                        if type_(k) is str_ and k in builtin_names and v is not builtin_names[k] \
                                and k != "__name__" and k != "__doc__":
                            problem = "builtin %r was shadowed by a global" % k
                            break
                if problem is None:
                    ok = True
                else:
                    state[0] = tamper(problem)
            try:
                out.flush()
                err.flush()
            except base_exc:
                pass
        except base_exc:  # the program's objects broke the checks: never a pass
            ok = False
            state[0] = tamper("the end-of-run checks failed")
        finally:
            if ok:
                state[0] = OK
            done.release()

    _thread.stack_size(64 * 1024 * 1024)
    _thread.start_new_thread(target, ())
    # Counted per uid: with 1, neither fork nor a new thread is possible from here on (kernel-enforced).
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    _install_hook(allow_fork, allow_ctypes, get_ident())
    go.release()
    try:
        done.acquire()
        result = state[0]
    except BaseException as e:
        result = e
    if result is OK:
        allow_ctypes[0] = True
        if unprotect is None or unprotect():
            write(status_fd, mv(secret)[:secret_len])
        exit_(0)
    # Before any candidate code runs in this thread (an exception's __str__ while the traceback is printed,
    # which may set a signal handler and reach this frame): drop the secret page, the function that unseals
    # it and the flag that lets this thread call ctypes. The hook keeps its own reference to the flag.
    secret = unprotect = allow_ctypes = None
    rc = 1
    try:
        if isinstance(result, SystemExit):
            c = result.code
            rc = c if isinstance(c, int) and not isinstance(c, bool) else (0 if c is None else 1)
        display(type(result), result, result.__traceback__)
    except BaseException:
        pass
    try:
        out.flush()
    except BaseException:
        pass
    exit_(rc & 0xFF)


class Denied(PermissionError, ValueError):
    """Raised by the audit hook. A ValueError too: stdlib callers of sys._getframe (namedtuple,
    typing) treat ValueError as 'no frame' and fall back."""


class _RejectHook(RuntimeError):
    pass


def _install_hook(allow_fork, allow_ctypes, main_ident):
    """Audit hook (cannot be removed): closes the introspection routes to other frames and memory."""
    frame_attrs = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
    blocked = frozenset(("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                         "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
                         "os.symlink", "os.link", "cpython.PyInterpreterState_Clear",
                         "cpython._PySys_ClearAuditHooks"))
    spawn = frozenset(("os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                       "subprocess.Popen"))
    denied, reject, getcwd, isstr, decode = Denied, _RejectHook, os.getcwd, str, bytes.decode
    get_ident = _thread.get_ident

    def hook(event, args):
        if event == "object.__getattr__":
            if args[1] in frame_attrs:
                raise denied("sandbox: frame access is disabled")
            return
        if event == "object.__setattr__":
            if args[1] == "__code__":
                raise denied("sandbox: replacing __code__ is disabled")
            return
        if event.startswith("ctypes."):
            if allow_ctypes[0] and get_ident() == main_ident:  # the runner unsealing the secret
                return
            raise denied("sandbox: %s is disabled" % event)
        if event in blocked:
            raise denied("sandbox: %s is disabled" % event)
        if event == "sys.addaudithook":
            raise reject("sandbox: no further audit hooks")
        if event in spawn and not allow_fork:
            raise denied("sandbox: starting processes is disabled")
        if event == "import":  # CPython's test helpers expose raw memory and interpreter internals
            name = args[0]
            if name.__class__ is isstr and (name[:5] == "_test" or name[:3] == "_xx" or name == "_ctypes_test"):
                raise denied("sandbox: importing %s is disabled" % name)
            return
        if event == "open":
            p = args[0]
            if p.__class__ is bytes:
                p = decode(p, "utf-8", "replace")
            if p.__class__ is isstr:
                if p[:1] != "/":
                    p = getcwd() + "/" + p
                if "proc" in p.split("/"):
                    raise denied("sandbox: /proc is disabled")

    sys.addaudithook(hook)


def once():
    """Remote entry (E2B): one program, request as JSON on stdin. There is no private fd to the host
    there, so the proof (the secret) follows the program's own output on stdout."""
    req = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(1, _STATUS_FD, inheritable=False)
    os.closerange(_STATUS_FD + 1, 1 << 16)
    lim = req["limits"]
    for res, val in ((resource.RLIMIT_AS, lim["memory_bytes"]), (resource.RLIMIT_FSIZE, lim["file_bytes"]),
                     (resource.RLIMIT_NOFILE, lim["open_files"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (val, val))
    resource.setrlimit(resource.RLIMIT_CPU, (int(lim["cpu_s"]), int(lim["cpu_s"]) + 1))
    if ctypes is not None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    sys.argv[:] = [_PROGRAM]
    sys.path[0] = os.getcwd()
    program = req["program"]
    with open(_PROGRAM, "w") as f:
        f.write(program)
    box = [req.pop("proof").encode()]
    _run(program, lambda page: page.write(box.pop()), 1, False)


if __name__ == "__main__":
    if sys.argv[1:] == ["--once"]:
        once()
    else:
        main()
