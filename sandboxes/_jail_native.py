"""The steps of a compiled language's program inside the jail (sandboxes/_jail.py loads this file beside it and
hands each native program's supervisor here, already on the program's fds and uid): write its files, run its compile
steps with their output captured, then its run step, each a process of its own with its own limits and clock. The
supervisor reports each step on the proof fd (a JSON line) and exits with the run step's status. The run step's
harness writes the proof after the tests' last assertion; only the run step gets the secret's fd."""
import json
import os
import resource
import signal

_STATUS_FD = 3  # where _jail.py placed the proof channel ...
_SECRET_FD = 4  # ... and the run's secret
# A run step still going after this long gets the lowest CPU priority for the rest of its time limit: the limits are the
# reference's (go 20 s, cpp 60, rust 300), but no canonical solution of HumanEvalPack runs a second, so what runs on
# is nearly always a loop, and at full priority a 300 s loop held a core the model's decoding needed (a Rust job
# ran at half speed). The program keeps its whole wall-clock limit; it only yields the CPU to everything else.
_YIELD_AFTER_S = 10.0


def run(native, scratch, lim, allow_fork, service=None):
    """Every step in order, stopping at the first that fails; exit with the last one's status. `service`: the fd of
    a warm compile service (sandboxes/services.py) for the step that names one, closed before any later step."""
    for name, text in native["files"]:
        path = os.path.join(scratch, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    base_env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
    rc = 0
    for step in native["steps"]:
        rc = None
        if service is not None and step.get("service"):
            rc = _served(step, scratch, native["files"], service)
            os.close(service)
            service = None
        if rc is None:  # no service, or it went away before answering: the step itself, as it would run anyway
            rc = _step(step, scratch, lim, dict(base_env, **step["env"]), allow_fork)
        if rc != 0:
            break
    os._exit(rc if 0 <= rc < 256 else (128 + (-rc) if rc < 0 else 1))


def _step(step, scratch, lim, env, allow_fork):
    """Run one step to its end or its time limit; report it on the proof fd; its exit code (-signal when killed)."""
    import time
    compile_ = step["stage"] != "run"
    cap_r = cap_w = None
    if compile_:
        cap_r, cap_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _exec(step, env, lim, allow_fork, cap_w)
    out = bytearray()
    if cap_w is not None:
        os.close(cap_w)
    deadline = start + float(step["timeout_s"])
    yield_at = start + _YIELD_AFTER_S if not compile_ else None
    timed_out = False
    status = None
    while status is None:
        if yield_at is not None and time.monotonic() >= yield_at:
            _lowest_priority(pid)
            yield_at = time.monotonic() + 1.0  # again each second: a process started since keeps its parent's
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            status = os.waitpid(pid, 0)[1]
            break
        if cap_r is not None:
            cap_r = _read_some(cap_r, out, min(left, 0.05))
        else:
            time.sleep(0.002)
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
    if cap_r is not None:  # the compiler ended: what it left in the pipe (its own children may hold it: not waited on)
        _drain(cap_r, out)
    try:  # the step's process group: nothing it started outlives it
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    rc = os.waitstatus_to_exitcode(status)
    report = {"stage": step["stage"], "rc": rc, "s": round(time.monotonic() - start, 4), "timeout": timed_out}
    if compile_:
        report["output"] = bytes(out[-16384:]).decode("utf-8", "replace")
    os.write(_STATUS_FD, (json.dumps(report) + "\n").encode())
    if timed_out:
        return 124 if compile_ else -int(signal.SIGKILL)
    return rc


def _served(step, scratch, files, fd):
    """A compile step done by the warm service on `fd`: the step's files and args sent, its class files written
    into the scratch dir, reported as the step itself reports. None when the service ended without an answer
    before the step's limit (another program beside this one halted it, or it was not up): the caller runs the
    step itself, so the verdict never depends on what compiled beside it."""
    import socket
    import struct
    import time
    start = time.monotonic()
    limit = float(step["timeout_s"])
    sock = socket.socket(fileno=os.dup(fd))
    sock.settimeout(limit + 1.0)  # the service halts itself at the limit; this is the backstop

    def field(b):
        return struct.pack(">i", len(b)) + b

    def take(f, n):
        b = f.read(n)
        if len(b) != n:
            raise EOFError
        return b

    def take_field(f):
        (n,) = struct.unpack(">i", take(f, 4))
        if not 0 <= n <= 64 << 20:
            raise EOFError
        return take(f, n)

    args = step.get("service_args") or []
    request = struct.pack(">i", int(limit * 1000)) + field(args[0].encode() if args else b"")
    request += struct.pack(">i", len(files)) + b"".join(field(n.encode()) + field(t.encode()) for n, t in files)
    timed_out = False
    try:
        sock.sendall(request, socket.MSG_NOSIGNAL)  # a service gone: an error here, not SIGPIPE
        f = sock.makefile("rb")
        (rc,) = struct.unpack(">i", take(f, 4))
        output = take_field(f).decode("utf-8", "replace")
        (count,) = struct.unpack(">i", take(f, 4))
        made = [(take_field(f).decode(), take_field(f)) for _ in range(count)]
        if any(rel.startswith("/") or ".." in rel.split("/") for rel, _ in made):
            raise EOFError
    except (OSError, EOFError, struct.error, UnicodeDecodeError):
        if time.monotonic() - start < limit:
            sock.close()
            return None
        timed_out, rc, output = True, 124, ""
    else:  # the whole answer came: its files, as the compile step would have left them
        for rel, body in made:
            path = os.path.join(scratch, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as out:
                out.write(body)
    sock.close()
    report = {"stage": step["stage"], "rc": rc, "s": round(time.monotonic() - start, 4), "timeout": timed_out,
              "output": output[-16384:], "served": True}
    os.write(_STATUS_FD, (json.dumps(report) + "\n").encode())
    return rc


def _read_some(fd, out, wait_s):
    """What the compiler wrote within `wait_s`, into `out` (its last 64 KiB kept past 256 KiB); the fd, or None
    once the pipe is closed."""
    import select
    ready, _, _ = select.select([fd], [], [], wait_s)
    if not ready:
        return fd
    chunk = os.read(fd, 65536)
    if not chunk:
        os.close(fd)
        return None
    out += chunk
    if len(out) > 262144:
        del out[:-65536]
    return fd


def _drain(fd, out):
    """What is in the pipe now, without waiting, into `out`; the pipe closed."""
    os.set_blocking(fd, False)
    try:
        while (chunk := os.read(fd, 65536)):
            out += chunk
    except (BlockingIOError, OSError):
        pass
    os.close(fd)


def _exec(step, env, lim, allow_fork, cap_w):
    """The step's own process (a forked child of the supervisor): its limits, its fds, then its command; never
    returns (a command that cannot start exits 127 with one line saying why)."""
    compile_ = step["stage"] != "run"
    try:
        os.setpgid(0, 0)
        for res, val in ((resource.RLIMIT_FSIZE, lim["file_bytes"]), (resource.RLIMIT_NOFILE, lim["open_files"]),
                         (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(res, (val, val))
        if step["memory_mb"]:
            mem = step["memory_mb"] * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(step["timeout_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if compile_:
            os.dup2(cap_w, 1)
            os.dup2(cap_w, 2)
        elif step["secret"] == "fd":
            os.set_inheritable(_STATUS_FD, True)
            os.set_inheritable(_SECRET_FD, True)
        elif step["secret"] == "stdin":
            os.set_inheritable(_STATUS_FD, True)
            os.dup2(_SECRET_FD, 0)
        nproc = max(int(step["processes"]), 1) if not allow_fork else max(int(step["processes"]), lim["processes"])
        # counted per uid, this supervisor included: 1 leaves the step no new process or thread
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        os.execve(step["argv"][0], step["argv"], env)
    except BaseException as e:
        try:
            os.write(2, ("sandbox: cannot start %s: %s\n" % (step["argv"][0], e)).encode())
        finally:
            os._exit(127)


def _lowest_priority(pgid):
    """Niceness 19 for a step's processes; PRIO_PGRP reaches each of their threads (Linux keeps niceness per thread)."""
    try:
        os.setpriority(os.PRIO_PGRP, pgid, 19)
    except OSError:
        pass
