"""Local backend: warm workers inside a bubblewrap jail fork one child per program.

Host side. The worker (sandboxes/_jail.py) runs in its own pid/net/ipc/uts namespaces with a read-only
root and a tmpfs scratch; it preloads the import helper and forks a child per program. This process
owns the per-run secret, the pipes and the clock. The pool and the host side of a worker (_WorkerPool, _Worker)
serve the Docker backend too (docker.py: the same worker in a container). Limits and defences: sandboxes/README.md.
"""
from __future__ import annotations

import atexit
import hmac
import json
import logging
import os
import queue
import re
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field

from .base import ExecResult, SandboxUnavailable, tail_note
from .config import LocalSandboxConf, PoolSandboxConf, conf_with
from .frames import parse_frames
from .procs import processes_of_uids

log = logging.getLogger("sandboxes.local")

_JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jail.py")
_HDR = struct.Struct("!I")
_PROGRAM = "program.py"
_NS_FLAGS = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
# The worker keeps these to switch each child to its own uid, kill what the child left and clean its dir.
_WORKER_CAPS = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"]

_probe_lock = threading.Lock()
_probe_cache: dict[str, str | None] = {}
_warned = False
_live: "weakref.WeakSet[_WorkerPool]" = weakref.WeakSet()


def probe_bwrap(bwrap: str = "bwrap") -> str | None:
    """None when bubblewrap can build our jail here, else the reason it cannot (cached per command)."""
    with _probe_lock:
        if bwrap in _probe_cache:
            return _probe_cache[bwrap]
        exe = shutil.which(bwrap)
        if exe is None:
            reason = f"{bwrap!r} not found on PATH (install the bubblewrap package)"
        else:
            cmd = [exe, *_NS_FLAGS, "--die-with-parent", "--ro-bind", "/", "/", "--tmpfs", "/proc"]
            if os.geteuid() == 0:
                for cap in _WORKER_CAPS:
                    cmd += ["--cap-add", cap]
            else:
                cmd.insert(1, "--unshare-user")
            try:
                r = subprocess.run(cmd + ["true"], capture_output=True, timeout=30)
                reason = None if r.returncode == 0 else (
                    "bwrap cannot create namespaces: " + r.stderr.decode(errors="replace").strip()[:200])
            except (OSError, subprocess.TimeoutExpired) as e:
                reason = f"bwrap failed to start: {e}"
        _probe_cache[bwrap] = reason
        return reason


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(:|$)")
_EXC_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Iteration", "Warning")


def parse_failure(stderr: str, program_path: str, program: str) -> tuple[str | None, str | None]:
    """(source line of the innermost program frame, exception type) from a Python traceback."""
    lines = program.splitlines()
    failing = None
    for f in parse_frames(stderr):
        if os.path.basename(f.file) == os.path.basename(program_path) and 1 <= f.line <= len(lines):
            failing = lines[f.line - 1].strip()
    error_type = None
    tail = stderr.strip().splitlines()
    for line in reversed(tail):
        m = _EXC_LINE.match(line)
        if m and (m.group(1).endswith(_EXC_SUFFIXES) or "Traceback (most recent call last):" in stderr):
            error_type = m.group(1).split(".")[-1]
            break
    return failing, error_type


def _send(sock: socket.socket, obj: dict, fds=()) -> None:
    data = json.dumps(obj).encode()
    msg = _HDR.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [msg[:_HDR.size]], list(fds))
        sock.sendall(msg[_HDR.size:])
    else:
        sock.sendall(msg)


class _Tail:
    """Keeps the last `cap` bytes of a stream and counts the whole."""

    def __init__(self, cap: int):
        self.cap, self.buf, self.total = cap, bytearray(), 0

    def add(self, b: bytes) -> None:
        self.total += len(b)
        self.buf += b
        if len(self.buf) > 2 * self.cap:
            del self.buf[: -self.cap]

    def result(self) -> tuple[str, bool]:
        return tail_note(bytes(self.buf[-self.cap:]).decode("utf-8", "replace"), self.total, self.cap)


_spawn_q: "queue.Queue" = queue.Queue()
_spawner: threading.Thread | None = None


def _spawner_loop() -> None:
    while True:
        fut, args, kwargs = _spawn_q.get()
        try:
            fut.set_result(subprocess.Popen(*args, **kwargs))
        except BaseException as e:
            fut.set_exception(e)


def _spawn(*args, **kwargs) -> subprocess.Popen:
    """Popen from one long-lived thread: bwrap's --die-with-parent fires when the *thread* that started
    it ends, and run() is called from short-lived threads (agents, HTTP handlers)."""
    global _spawner
    with _probe_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawner_loop, name="sandbox-spawner", daemon=True)
            _spawner.start()
    fut: Future = Future()
    _spawn_q.put((fut, args, kwargs))
    return fut.result()


class _Worker:
    """One warm interpreter in its own jail (a container: docker.py subclasses `_start`, `wait_ready`,
    `_terminate`). Used by one run at a time; discarded when in doubt."""

    def __init__(self, sbx: "_WorkerPool", slot: int):
        self.sbx, self.slot = sbx, slot
        self.uid = sbx.uid_base + slot if sbx.switch_uid else None
        self.ready = False
        self.last_words = ""
        self.runs = 0
        self._rbuf = bytearray()
        self._start()

    def _config(self, scratch_root: str) -> dict:
        """What _jail.py's main() is told: the child's uid, its limits, where scratch dirs go."""
        sbx = self.sbx
        return {"uid": self.uid, "pidns": sbx.isolated, "allow_fork": sbx.allow_fork, "limits": sbx.limits,
                "scratch_root": scratch_root}

    def _start(self) -> None:
        """Start the jailed worker with its end of the control socket (sets self.sock, self.proc)."""
        sbx = self.sbx
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cfg = self._config("/tmp/fixlab" if sbx.isolated else tempfile.mkdtemp(prefix="fixlab-sbx-"))
        self.scratch_root = None if sbx.isolated else cfg["scratch_root"]
        cmd = [sbx.python, "-I", "-B", _JAIL, str(child.fileno()), json.dumps(cfg)]
        if sbx.isolated:
            cmd = sbx.jail_prefix() + cmd
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.proc = _spawn(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
        child.close()

    # -- control channel -------------------------------------------------------------------------
    def _take_msg(self):
        if len(self._rbuf) < _HDR.size:
            return None
        n = _HDR.unpack(self._rbuf[: _HDR.size])[0]
        if len(self._rbuf) < _HDR.size + n:
            return None
        body = bytes(self._rbuf[_HDR.size: _HDR.size + n])
        del self._rbuf[: _HDR.size + n]
        return json.loads(body)

    def wait_ready(self, timeout: float) -> str | None:
        """None when the worker said it is ready, else why not."""
        if self.ready:
            return None
        deadline = time.monotonic() + timeout
        self.sock.settimeout(1.0)
        while True:
            msg = self._take_msg()
            if msg is not None:
                self.ready = bool(msg.get("ready"))
                return None if self.ready else f"unexpected worker message {msg!r}"
            if time.monotonic() > deadline:
                return f"worker not ready after {timeout:.0f} s"
            try:
                b = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                b = b""
                if not isinstance(e, ConnectionResetError):
                    return f"worker control socket: {e}"
            if not b:
                return "worker exited at start: " + self._stderr_tail()
            self._rbuf += b

    def _stderr_tail(self) -> str:
        try:
            self.proc.wait(timeout=5)
            err = self.proc.stderr.read() if self.proc.stderr else b""
        except Exception:
            err = b""
        lines = err.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit code {self.proc.returncode}"

    def _terminate(self) -> None:
        """Kill everything in the jail at once (its pid namespace dies with bwrap)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        self._terminate()
        try:
            if self.sock is not None:
                self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.uid is not None:  # the namespace dies asynchronously: return once its processes are gone
            end = time.monotonic() + 2.0
            while processes_of_uids(range(self.uid, self.uid + 1)) and time.monotonic() < end:
                time.sleep(0.01)
        if self.proc.stderr:
            try:
                os.set_blocking(self.proc.stderr.fileno(), False)
                tail = (self.proc.stderr.read() or b"")[-2000:].decode(errors="replace").strip()
            except (OSError, ValueError):
                tail = ""
            self.last_words = tail or f"exit status {self.proc.returncode}"
            self.proc.stderr.close()
        if self.scratch_root:
            shutil.rmtree(self.scratch_root, ignore_errors=True)

    # -- one program -------------------------------------------------------------------------------
    # A run: send the program with four fresh pipes (stdout, stderr, the proof channel, the secret), watch the
    # pipes and the control socket until the child's end is reported and its pipes close (or the deadline, the
    # output cap, or the worker's death), then judge. `passed` needs exit 0 AND the run's secret on the proof fd.
    def execute(self, program: str, timeout_s: float) -> tuple[ExecResult, bool]:
        """Run one program; returns (result, worker still healthy)."""
        start = time.monotonic()
        secret = secrets.token_bytes(32)  # new for every run, never leaves this process but through its pipe
        pipes = self._send(program, secret)
        if isinstance(pipes, ExecResult):
            return pipes, False
        run = self._collect(pipes, start + timeout_s)
        healthy = run.wait_status is not None and not run.timed_out and not run.flooded and not run.worker_gone
        if healthy and not os.WIFEXITED(run.wait_status):
            healthy = False  # killed by a signal (rlimit, segfault): start a fresh worker
        if not healthy:
            self._stop_and_drain(run, pipes)
        for fd in pipes:
            os.close(fd)
        self.runs += 1
        return self._verdict(run, program, secret, timeout_s, time.monotonic() - start), healthy

    def _send(self, program: str, secret: bytes) -> tuple[int, int, int] | ExecResult:
        """The program and the child's ends of fresh pipes to the worker; our read ends, or the error."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        sec_r, sec_w = os.pipe()
        os.write(sec_w, secret)
        os.close(sec_w)
        try:
            _send(self.sock, {"program": program}, fds=(out_w, err_w, st_w, sec_r))
            sent = True
        except OSError as e:
            sent, send_err = False, e
        for fd in (out_w, err_w, st_w, sec_r):
            os.close(fd)
        if not sent:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
            return ExecResult(status="error", stderr=f"sandbox worker unreachable: {send_err}", backend=self.sbx.name)
        return out_r, err_r, st_r

    def _collect(self, pipes: tuple[int, int, int], deadline: float) -> "_Run":
        """Read the pipes and the worker's reports until the child is done (or the deadline, the output cap,
        or the worker's death, each with a short grace for what is still in the pipes)."""
        sbx, run = self.sbx, _Run(_Tail(self.sbx.output_cap_bytes), _Tail(self.sbx.output_cap_bytes))
        sel = selectors.DefaultSelector()
        for fd, tag in zip(pipes, ("out", "err", "st")):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, tag)
        self.sock.setblocking(False)
        sel.register(self.sock, selectors.EVENT_READ, "ctl")
        open_pipes, grace_end = 3, None
        while True:
            now = time.monotonic()
            if run.wait_status is not None and open_pipes == 0:
                break
            if run.wait_status is None and now >= deadline:
                run.timed_out = True
                break
            if grace_end is not None and now >= grace_end:
                break
            limit = deadline if grace_end is None else grace_end
            for key, _ in sel.select(timeout=max(0.0, limit - now)):
                if key.data == "ctl":
                    grace_end = self._control(sel, run) or grace_end
                    continue
                try:
                    b = os.read(key.fd, 1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                if not b:
                    sel.unregister(key.fd)
                    open_pipes -= 1
                    continue
                if key.data == "st":
                    if len(run.proof) < 4096:
                        run.proof += b
                else:
                    (run.out if key.data == "out" else run.err).add(b)
                    if run.out.total + run.err.total > sbx.max_output_bytes:
                        run.flooded = True
                        break
            if run.flooded or (run.worker_gone and run.wait_status is None and grace_end
                               and time.monotonic() >= grace_end):
                break
        sel.close()
        self.sock.setblocking(True)
        return run

    def _control(self, sel, run: "_Run") -> float | None:
        """The worker's reports (child started, child's wait status); a grace deadline when one ends the run."""
        try:
            b = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            b = b""
        if not b:
            run.worker_gone = True
            sel.unregister(self.sock)
            return time.monotonic() + 1.0
        self._rbuf += b
        grace = None
        while (msg := self._take_msg()) is not None:
            if "started" in msg:
                run.child_pid = msg["started"]
            elif "wait_status" in msg:
                run.wait_status = msg["wait_status"]
                grace = time.monotonic() + 2.0  # pipes close once the leftovers are killed
        return grace

    def _stop_and_drain(self, run: "_Run", pipes: tuple[int, int, int]) -> None:
        """Kill the child's group and the worker, then keep what was written before the kill."""
        if run.child_pid is not None and not self.sbx.isolated:
            try:
                os.killpg(run.child_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.kill()
        for fd, t in zip(pipes, (run.out, run.err, None)):
            try:
                while (b := os.read(fd, 1 << 16)):
                    if t is None:
                        run.proof += b[: max(0, 4096 - len(run.proof))]
                    else:
                        t.add(b)
                        if t.total > self.sbx.max_output_bytes:
                            break
            except (BlockingIOError, OSError):
                pass

    def _verdict(self, run: "_Run", program: str, secret: bytes, timeout_s: float, duration: float) -> ExecResult:
        sbx = self.sbx
        stdout, out_cut = run.out.result()
        stderr, err_cut = run.err.result()
        exit_code = os.waitstatus_to_exitcode(run.wait_status) if run.wait_status is not None else None
        details: dict = {"isolated": sbx.isolated, "worker_runs": self.runs - 1}
        if run.timed_out:
            status = "timeout"
            details["timeout_s"] = timeout_s
        elif run.flooded:
            status = "failed"
            details["output_limit_bytes"] = sbx.max_output_bytes
            stderr += f"\n[sandbox: killed after more than {sbx.max_output_bytes} bytes of output]"
        elif run.wait_status is None:
            status = "error"
            stderr += "\n[sandbox: the worker died before reporting the program's end: %s]" % self.last_words
        elif exit_code == 0 and hmac.compare_digest(bytes(run.proof), secret):
            status = "passed"
        else:
            status = "failed"
            if exit_code is not None and exit_code < 0:
                details["signal"] = signal.Signals(-exit_code).name if -exit_code in signal.Signals._value2member_map_ else -exit_code
        failing, etype = (None, None) if status == "passed" else parse_failure(stderr, _PROGRAM, program)
        return ExecResult(status=status, exit_code=exit_code, stdout=stdout, stderr=stderr,
                          stdout_truncated=out_cut, stderr_truncated=err_cut, duration_s=round(duration, 4),
                          failing_line=failing, error_type=etype, backend=sbx.name, details=details)


@dataclass
class _Run:
    """What one program's run left: its output tails, the proof bytes, and how it ended."""

    out: _Tail
    err: _Tail
    proof: bytearray = field(default_factory=bytearray)
    wait_status: int | None = None
    child_pid: int | None = None
    worker_gone: bool = False
    timed_out: bool = False
    flooded: bool = False


class _WorkerPool:
    """Warm workers (one per slot, each a `_Worker`), checked out by one run at a time and replaced when in doubt.
    The backends differ only in how a worker is started: LocalSandbox in a bubblewrap jail, DockerSandbox
    (sandboxes/docker.py) in a container. mode=fresh: a worker runs one program and is discarded."""

    name = ""
    worker_class: type = _Worker
    isolated = False
    switch_uid = False

    def _init_pool(self, c: PoolSandboxConf, default_uid_base: int) -> None:
        """Check and keep the options every backend with a worker pool shares (each error one line)."""
        mode, workers, uid_base = c.mode, c.workers, c.uid_base
        if mode not in ("fork", "fresh"):
            raise SandboxUnavailable(f"sandbox mode must be 'fork' or 'fresh', got {mode!r}")
        n = workers if workers is not None else (os.cpu_count() or 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SandboxUnavailable(f"sandbox workers must be a positive integer, got {workers!r}")
        for k in ("memory_mb", "cpu_s", "max_processes", "max_file_mb", "max_open_files", "max_output_mb",
                  "scratch_mb", "output_cap_bytes"):
            v = getattr(c, k)
            if not isinstance(v, (int, float)) or v <= 0:
                raise SandboxUnavailable(f"sandbox option {k} must be a positive number, got {v!r}")
        self.mode, self.workers, self.allow_fork = mode, n, bool(c.allow_fork)
        if uid_base is None:  # per process, so that sandboxes of parallel processes do not share uids
            uid_base = default_uid_base + (os.getpid() % 10000) * 64
        self.scratch_mb, self.uid_base = int(c.scratch_mb), int(uid_base)
        self.ready_timeout_s = float(c.ready_timeout_s)
        self.max_output_bytes = int(c.max_output_mb * 1024 * 1024)
        self.output_cap_bytes = int(c.output_cap_bytes)
        self.limits = {"memory_bytes": int(c.memory_mb * 1024 * 1024), "cpu_s": int(c.cpu_s),
                       "processes": int(c.max_processes), "file_bytes": int(c.max_file_mb * 1024 * 1024),
                       "open_files": int(c.max_open_files)}
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(n)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._free_slots = list(range(n))
        self._closed = False

    def _checkout(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("sandbox is closed")
            w = self._idle.pop() if self._idle else self.worker_class(self, self._free_slots.pop())
            self._busy.add(w)
            return w

    def _checkin(self, w: _Worker, healthy: bool) -> None:
        replace = None
        with self._lock:
            self._busy.discard(w)
            if healthy and self.mode == "fork" and not self._closed:
                self._idle.append(w)
                return
        w.kill()
        with self._lock:
            if self.mode == "fork" and not self._closed:
                replace = self.worker_class(self, w.slot)  # starts warming now, in the background
                self._idle.append(replace)
            else:
                self._free_slots.append(w.slot)

    def warm_up(self) -> None:
        """Start every worker now and wait until each has imported the helper (optional)."""
        with self._lock:
            while self._free_slots and self.mode == "fork":
                self._idle.append(self.worker_class(self, self._free_slots.pop()))
            idle = list(self._idle)
        for w in idle:
            why = w.wait_ready(self.ready_timeout_s)
            if why:
                raise SandboxUnavailable(f"sandbox worker failed to start: {why}")

    def run(self, program: str, timeout_s: float) -> ExecResult:
        if not isinstance(program, str):
            raise TypeError(f"program must be a str, got {type(program).__name__}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        with self._sem:
            w = self._checkout()
            healthy = False
            try:
                why = w.wait_ready(self.ready_timeout_s)
                if why:
                    return ExecResult(status="error", stderr=f"sandbox worker failed to start: {why}",
                                      backend=self.name, details={"isolated": self.isolated})
                result, healthy = w.execute(program, float(timeout_s))
                return result
            finally:
                self._checkin(w, healthy)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = self._idle + list(self._busy)
            self._idle = []
        for w in workers:
            w.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalSandbox(_WorkerPool):
    """Local backend. mode=fork (default): warm workers fork a child per program; mode=fresh: a new
    jailed interpreter per program (the slow reference, same isolation and verdict rule)."""

    name = "local"

    def __init__(self, conf: LocalSandboxConf | None = None, **options):
        """`conf` (sandboxes/config.py: the defaults), or its defaults, with keyword `options` applied."""
        c = conf_with(LocalSandboxConf, conf, options)
        self._init_pool(c, 100000)
        python, bwrap, require_isolation = c.python, c.bwrap, c.require_isolation
        self.python = python or sys.executable
        self.bwrap = bwrap
        reason = probe_bwrap(bwrap)
        if reason is not None and require_isolation:
            raise SandboxUnavailable(f"sandbox isolation required but unavailable: {reason}")
        if reason is not None:
            global _warned
            if not _warned:
                _warned = True
                log.warning("sandbox: no bubblewrap isolation (%s); running with rlimits only", reason)
        self.isolated = reason is None
        self.isolation_reason = reason
        self.switch_uid = os.geteuid() == 0
        _live.add(self)

    def _visible_mounts(self) -> list[str]:
        """Hide the home directory, and keep the interpreter readable for the child's uid when it lives
        under a directory others cannot enter (e.g. pyenv under /root, mode 700)."""
        exe = os.path.realpath(self.python)
        needed = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(exe)), os.path.dirname(_JAIL)}
        hidden = []
        home = os.path.expanduser("~")
        if home not in ("/", "") and os.path.isdir(home):
            hidden.append(home)
        for path in sorted(needed):
            parts = path.split("/")
            for i in range(2, len(parts)):
                anc = "/".join(parts[:i])
                if not os.stat(anc).st_mode & 0o001 and anc not in hidden:
                    hidden.append(anc)
                    break
        args = []
        for h in hidden:
            args += ["--tmpfs", h]
        # /tmp and /dev/shm are fresh tmpfs mounts (made before these): a checkout or venv under them
        # (CI clones often live in /tmp) must be bound back in, or the worker cannot even start.
        hidden += ["/tmp", "/dev/shm"]
        for path in sorted(needed):
            under = [h for h in hidden if path.startswith(h + "/")]
            if under:
                parts = path[len(under[0]) + 1:].split("/")
                for i in range(1, len(parts)):  # bwrap would create these 0700: the child could not enter
                    args += ["--perms", "0755", "--dir", under[0] + "/" + "/".join(parts[:i])]
                args += ["--ro-bind", path, path]
        return args

    def jail_prefix(self) -> list[str]:
        cmd = [self.bwrap, *_NS_FLAGS, "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
               "--tmpfs", "/proc", "--dev", "/dev", "--size", str(self.scratch_mb * 1024 * 1024),
               "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", *self._visible_mounts(), "--clearenv",
               "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
               "--setenv", "OPENBLAS_NUM_THREADS", "1", "--setenv", "OMP_NUM_THREADS", "1", "--chdir", "/tmp"]
        if self.switch_uid:
            for cap in _WORKER_CAPS:
                cmd += ["--cap-add", cap]
        else:
            cmd.insert(1, "--unshare-user")
        return cmd


@atexit.register
def _close_all() -> None:
    for sbx in list(_live):
        try:
            sbx.close()
        except Exception:
            pass
