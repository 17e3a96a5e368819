"""E2B backend: programs run in E2B cloud sandboxes through the real e2b-code-interpreter SDK.

One remote sandbox per calling thread, reused across programs, killed by close(). Each program goes as one
code cell: a bootstrap that starts a fresh interpreter (as user `nobody` when sudo allows it) running the
same runner as the local backend (_jail.py --once). The runner prints a per-run secret after the test code
returned; the cell's value (an execute_result, which a subprocess cannot inject) carries the tails and
whether that exact secret came back. Verdict rule and limits: sandboxes/README.md.
"""
from __future__ import annotations

import ast
import atexit
import base64
import json
import logging
import os
import secrets
import threading
import time
import weakref

from .base import OUTPUT_CAP_BYTES, ExecResult, SandboxUnavailable, tail_note
from .config import E2BSandboxConf, conf_with
from .verdict import parse_failure

log = logging.getLogger("sandboxes.e2b")
_live: "weakref.WeakSet[E2BSandbox]" = weakref.WeakSet()

_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jail.py")

# Runs inside the remote Jupyter kernel. Kept free of the secret's use: it only compares and reports.
BOOTSTRAP = r'''
def __fixlab_run(payload):
    import base64, json, os, selectors, shutil, signal, subprocess, sys, tempfile, time
    p = json.loads(base64.b64decode(payload))
    cap, limit = p["cap"], p["max_output"]
    d = tempfile.mkdtemp(prefix="fixlab-")
    runner, work = os.path.join(d, "runner.py"), os.path.join(d, "work")
    with open(runner, "w") as f:
        f.write(p["runner"])
    os.mkdir(work)
    cmd = [sys.executable, "-I", "-B", runner, "--once"]
    demote, kill_all = None, None
    if os.geteuid() == 0:
        def demote():
            os.setgroups([]); os.setgid(65534); os.setuid(65534)
        kill_all = lambda: subprocess.run(["kill", "-9", "-1"], preexec_fn=demote, capture_output=True)
    elif (shutil.which("sudo") is not None
          and subprocess.run(["sudo", "-n", "-u", "nobody", "true"], capture_output=True).returncode == 0):
        cmd = ["sudo", "-n", "-u", "nobody", "--"] + cmd
        kill_all = lambda: subprocess.run(["sudo", "-n", "-u", "nobody", "kill", "-9", "-1"], capture_output=True)
    drop = kill_all is not None
    if drop:  # as nobody the program cannot read this kernel's memory, history or files
        os.chmod(d, 0o755); os.chmod(runner, 0o644); os.chmod(work, 0o777)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work, "OPENBLAS_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=work, env=env, start_new_session=True, preexec_fn=demote)
    proc.stdin.write(json.dumps({"program": p["program"], "proof": p["proof"], "limits": p["limits"]}).encode())
    proc.stdin.close()
    bufs, totals = {"out": bytearray(), "err": bytearray()}, {"out": 0, "err": 0}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    open_, timed_out, flooded = 2, False, False
    deadline = start + p["timeout"]
    while open_:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            b = os.read(key.fd, 65536)
            if not b:
                sel.unregister(key.fileobj); open_ -= 1; continue
            t = key.data
            totals[t] += len(b); bufs[t] += b
            if len(bufs[t]) > 2 * cap + 4096:
                del bufs[t][: -(cap + 4096)]
        if totals["out"] + totals["err"] > limit:
            flooded = True
            break
    if kill_all is not None:
        kill_all()  # also what the program left behind
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    shutil.rmtree(d, ignore_errors=True)
    out = bytes(bufs["out"])
    tag = p["proof"].encode()
    proven = (not timed_out and not flooded and code == 0 and out.endswith(tag))
    out = out.replace(tag, b"")
    return json.dumps({"proof": p["proof"] if proven else None, "exit_code": code, "timed_out": timed_out,
                       "flooded": flooded, "dropped_to_nobody": drop, "duration_s": time.monotonic() - start,
                       "stdout": out[-cap:].decode("utf-8", "replace"), "stdout_total": totals["out"],
                       "stderr": bytes(bufs["err"][-cap:]).decode("utf-8", "replace"),
                       "stderr_total": totals["err"]})
__fixlab_run(%r)
'''


class E2BSandbox:
    """Remote backend. Needs E2B_API_KEY (or E2B_DEBUG=true for a local code-interpreter on :49999)."""

    name = "e2b"

    def __init__(self, conf: E2BSandboxConf | None = None, api_key: str | None = None, **options):
        """`conf` (sandboxes/config.py: the defaults), or its defaults, with keyword `options` applied. The API key is
        an argument, not a config key (a config is logged with the run), and defaults to $E2B_API_KEY."""
        c = conf_with(E2BSandboxConf, conf, options)
        self.debug = os.environ.get("E2B_DEBUG", "false").lower() == "true"
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        try:  # the [e2b] extra, before the key: one line that says what to install
            from e2b_code_interpreter import Sandbox  # noqa: F401
        except ImportError as e:
            raise SandboxUnavailable(f"sandbox=e2b needs fixlab's [e2b] extra ({e}): "
                                     "pip install 'fixlab[e2b]'") from None
        if not self.api_key and not self.debug:
            raise SandboxUnavailable("E2B_API_KEY is not set: export E2B_API_KEY=<key from "
                                     "https://e2b.dev/dashboard?tab=keys>, or use sandbox=local")
        self.template = c.template
        self.sandbox_timeout_s, self.request_timeout_s = int(c.sandbox_timeout_s), float(c.request_timeout_s)
        self.timeout_margin_s = float(c.timeout_margin_s)
        self.max_output_bytes = int(c.max_output_mb * 1024 * 1024)
        self.limits = {"memory_bytes": int(c.memory_mb * 1024 * 1024), "cpu_s": int(c.cpu_s),
                       "file_bytes": int(c.max_file_mb * 1024 * 1024), "open_files": int(c.max_open_files)}
        with open(_RUNNER, encoding="utf-8") as f:
            self._runner_src = f.read()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list = []
        self._closed = False
        _live.add(self)

    def _sandbox(self):
        sbx = getattr(self._local, "sbx", None)
        if sbx is None:
            from e2b_code_interpreter import Sandbox

            kwargs = {"timeout": self.sandbox_timeout_s, "request_timeout": self.request_timeout_s}
            if self.api_key:
                kwargs["api_key"] = self.api_key
            if self.template:
                kwargs["template"] = self.template
            sbx = Sandbox.create(**kwargs)
            with self._lock:
                if self._closed:
                    sbx.kill()
                    raise SandboxUnavailable("sandbox is closed")
                self._all.append(sbx)
            self._local.sbx = sbx
        return sbx

    def _drop(self, sbx) -> None:
        """Never reuse a remote sandbox whose kernel may still be busy with a timed-out cell."""
        self._local.sbx = None
        with self._lock:
            if sbx in self._all:
                self._all.remove(sbx)
        try:
            sbx.kill()
        except Exception as e:  # already gone: nothing left to release
            log.debug("e2b: kill failed: %s", e)

    def cell(self, program: str, timeout_s: float, proof: str) -> str:
        payload = {"program": program, "proof": proof, "timeout": float(timeout_s), "limits": self.limits,
                   "runner": self._runner_src, "cap": OUTPUT_CAP_BYTES, "max_output": self.max_output_bytes}
        return BOOTSTRAP % base64.b64encode(json.dumps(payload).encode()).decode()

    def run(self, program: str, timeout_s: float) -> ExecResult:
        if not isinstance(program, str):  # a compiled language's Program: the template has no toolchain for it
            lang = getattr(program, "language", type(program).__name__)
            raise SandboxUnavailable(f"sandbox=e2b runs Python programs only (its template has no {lang} "
                                     "toolchain); use sandbox=local or sandbox=docker")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        from e2b.exceptions import TimeoutException

        # The marker is new for every run and only checked here; the program never sees it in its memory
        # while it runs (the runner's audit hook and thread layout, as locally).
        proof = "\n@@fixlab-proof:" + secrets.token_hex(32) + "\n"
        start = time.monotonic()
        try:
            sbx = self._sandbox()
        except SandboxUnavailable:
            raise
        except Exception as e:
            return ExecResult(status="error", stderr=f"e2b: cannot create a sandbox: {type(e).__name__}: {e}",
                              backend=self.name, duration_s=round(time.monotonic() - start, 4))
        try:
            execution = sbx.run_code(self.cell(program, timeout_s, proof),
                                     timeout=float(timeout_s) + self.timeout_margin_s,
                                     request_timeout=self.request_timeout_s)
        except TimeoutException as e:
            self._drop(sbx)
            return ExecResult(status="timeout", stderr=f"e2b: {e}", backend=self.name,
                              duration_s=round(time.monotonic() - start, 4), details={"timeout_s": timeout_s})
        except Exception as e:
            self._drop(sbx)
            return ExecResult(status="error", stderr=f"e2b: {type(e).__name__}: {e}", backend=self.name,
                              duration_s=round(time.monotonic() - start, 4))
        duration = round(time.monotonic() - start, 4)
        if execution.error is not None or not execution.results:
            why = (f"{execution.error.name}: {execution.error.value}\n{execution.error.traceback}"
                   if execution.error is not None else "no result from the runner cell")
            return ExecResult(status="error", stderr=f"e2b: runner cell failed: {why}", backend=self.name,
                              duration_s=duration)
        try:
            rep = json.loads(ast.literal_eval(execution.results[-1].text))
        except (ValueError, SyntaxError, TypeError) as e:
            return ExecResult(status="error", stderr=f"e2b: unreadable runner result: {e}", backend=self.name,
                              duration_s=duration)
        stdout, out_cut = tail_note(rep["stdout"], rep["stdout_total"], OUTPUT_CAP_BYTES)
        stderr, err_cut = tail_note(rep["stderr"], rep["stderr_total"], OUTPUT_CAP_BYTES)
        details = {"remote_duration_s": rep["duration_s"], "dropped_to_nobody": rep["dropped_to_nobody"],
                   "sandbox_id": getattr(sbx, "sandbox_id", None)}
        if rep["timed_out"]:
            status = "timeout"
            details["timeout_s"] = timeout_s
        elif rep["proof"] is not None and secrets.compare_digest(rep["proof"], proof) and rep["exit_code"] == 0:
            status = "passed"
        else:
            status = "failed"
            if rep["flooded"]:
                details["output_limit_bytes"] = self.max_output_bytes
        failing, etype = (None, None) if status == "passed" else parse_failure(stderr, "program.py", program)
        return ExecResult(status=status, exit_code=rep["exit_code"], stdout=stdout, stderr=stderr,
                          stdout_truncated=out_cut, stderr_truncated=err_cut, duration_s=duration,
                          failing_line=failing, error_type=etype, backend=self.name, details=details)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            boxes, self._all = self._all, []
        for sbx in boxes:
            try:
                sbx.kill()
            except Exception as e:
                log.debug("e2b: kill failed: %s", e)


@atexit.register
def _close_all() -> None:  # remote sandboxes cost money until their timeout: kill them at exit
    for sbx in list(_live):
        try:
            sbx.close()
        except Exception:
            pass
