"""The host side of one warm worker (sandboxes/_jail.py) for the local and Docker backends: start it, send it one
program with four fresh pipes and the run's secret, read the pipes and its reports against the clock, kill it when in
doubt, and judge the run (`passed` needs exit 0 and the secret on the proof pipe). Apart from pool.py (which workers
exist and who uses one) and local.py (the jail a local worker starts in).
"""
from __future__ import annotations

import hmac
import json
import os
import queue
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future

from .base import ExecResult
from .procs import processes_of_uids, yield_cpu_below
from .languages.base import Program
from .verdict import PROOF_CAP, _Run, _Tail, native_verdict, parse_failure

_JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jail.py")
_HDR = struct.Struct("!I")
_PROGRAM = "program.py"
NATIVE_MARGIN_S = 5.0  # a compiled program's backstop beyond its steps' own limits (the jail reports those)
# Past this a program is nearly always a loop (no canonical solution of HumanEvalPack runs a second): it yields the
# CPU for the rest of its limit, here and in the jail (_jail_native.py _YIELD_AFTER_S, the same figure)
YIELD_AFTER_S = 10.0

# Guards the spawner thread's start here and probe_bwrap's cache in local.py (one lock for both).
_probe_lock = threading.Lock()


def _send(sock: socket.socket, obj: dict, fds=()) -> None:
    data = json.dumps(obj).encode()
    msg = _HDR.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [msg[:_HDR.size]], list(fds))
        sock.sendall(msg[_HDR.size:])
    else:
        sock.sendall(msg)


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
    `_terminate`). Used by one run at a time; discarded when in doubt. `sbx` is its pool (pool.py `_WorkerPool`,
    not imported here: the pool imports this module)."""

    def __init__(self, sbx, slot: int):
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
    def execute(self, program: "str | Program", timeout_s: float) -> tuple[ExecResult, bool]:
        """Run one program (Python source, or a compiled language's Program whose steps carry their own limits);
        returns (result, worker still healthy)."""
        start = time.monotonic()
        secret = secrets.token_bytes(32)  # new for every run, never leaves this process but through its pipe
        pipes = self._send(program, secret)
        if isinstance(pipes, ExecResult):
            return pipes, False
        if isinstance(program, Program):  # the steps' own clocks rule; this one is the backstop
            timeout_s = program.timeout_s + NATIVE_MARGIN_S
        # a program still running after YIELD_AFTER_S keeps its time limit but yields the CPU (procs.py says why)
        proc = getattr(self, "proc", None)
        lower = threading.Timer(YIELD_AFTER_S, yield_cpu_below, args=(proc.pid,)) if proc else None
        if lower:
            lower.daemon = True
            lower.start()
        try:
            run = self._collect(pipes, start + timeout_s)
        finally:
            if lower:
                lower.cancel()
        healthy = run.wait_status is not None and not run.timed_out and not run.flooded and not run.worker_gone
        if healthy and not os.WIFEXITED(run.wait_status):
            healthy = False  # killed by a signal (rlimit, segfault): start a fresh worker
        if not healthy:
            self._stop_and_drain(run, pipes)
        for fd in pipes:
            os.close(fd)
        self.runs += 1
        return self._verdict(run, program, secret, timeout_s, time.monotonic() - start), healthy

    def _send(self, program: "str | Program", secret: bytes) -> tuple[int, int, int] | ExecResult:
        """The program and the child's ends of fresh pipes to the worker; our read ends, or the error."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        sec_r, sec_w = os.pipe()
        os.write(sec_w, secret)
        os.close(sec_w)
        theirs = [out_w, err_w, st_w, sec_r]
        service = self.sbx.service_fd(program) if isinstance(program, Program) else None
        if service is not None:  # a warm compile service's connection (services.py), the program's fifth fd
            theirs.append(service)
        try:
            msg = {"native": program.wire()} if isinstance(program, Program) else {"program": program}
            _send(self.sock, msg, fds=theirs)
            sent = True
        except OSError as e:
            sent, send_err = False, e
        for fd in theirs:
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
                    if len(run.proof) < PROOF_CAP:
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
                        run.proof += b[: max(0, PROOF_CAP - len(run.proof))]
                    else:
                        t.add(b)
                        if t.total > self.sbx.max_output_bytes:
                            break
            except (BlockingIOError, OSError):
                pass

    def _verdict(self, run: "_Run", program: "str | Program", secret: bytes, timeout_s: float,
                 duration: float) -> ExecResult:
        if isinstance(program, Program):
            return native_verdict(run, program, secret, duration, self.sbx, {"worker_runs": self.runs - 1})
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
