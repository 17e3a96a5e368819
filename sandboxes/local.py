"""Local backend: each program in a fresh `python3` process with a timeout.

Limits enforced here:
- wall-clock timeout: the whole process group is killed (SIGKILL) when it runs out;
- stdin is /dev/null (a candidate calling input() gets EOFError, never hangs);
- the child's environment is scrubbed: only PATH, LANG and a private HOME/TMPDIR (no API keys);
- output is kept as the last OUTPUT_CAP_BYTES of each stream;
- verdict: `passed` only when the runner prints a per-run secret after the test code returned.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .base import ExecResult, cap_output

# Runs inside the child: executes the program, then proves completion on a private pipe.
RUNNER = r"""
import os, sys
status_fd = int(sys.argv[2])
secret = os.read(int(sys.argv[3]), 64)
os.close(int(sys.argv[3]))
path = sys.argv[1]
with open(path) as f:
    src = f.read()
code = compile(src, path, "exec")
g = {"__name__": "__main__", "__file__": path}
del src
exec(code, g)
os.write(status_fd, secret)
"""

_TB_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')


def parse_failure(stderr: str, program_path: str, program: str) -> tuple[str | None, str | None]:
    """(failing source line, exception type) from a Python traceback in stderr."""
    lines = program.splitlines()
    failing = None
    for line in stderr.splitlines():
        m = _TB_LINE.match(line)
        if m and m.group("file") == program_path:
            n = int(m.group("line"))
            if 1 <= n <= len(lines):
                failing = lines[n - 1].strip()
    error_type = None
    for line in reversed(stderr.strip().splitlines()):
        m = re.match(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)|AssertionError|StopIteration)\b", line)
        if m:
            error_type = m.group(1).split(".")[-1]
            break
    return failing, error_type


class SubprocessSandbox:
    """One new interpreter per program. Simple and slow (0.1-0.4 s each); see README for the fast path."""

    name = "local"

    def __init__(self, python: str | None = None, **_ignored):
        self.python = python or sys.executable

    def run(self, program: str, timeout_s: float) -> ExecResult:
        scratch = tempfile.mkdtemp(prefix="fixlab-sbx-")
        path = os.path.join(scratch, "program.py")
        with open(path, "w") as f:
            f.write(program)
        secret = secrets.token_hex(16).encode()
        status_r, status_w = os.pipe()
        secret_r, secret_w = os.pipe()
        os.write(secret_w, secret)
        os.close(secret_w)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch,
               "PYTHONDONTWRITEBYTECODE": "1"}
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [self.python, "-I", "-c", RUNNER, path, str(status_w), str(secret_r)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=scratch, env=env, start_new_session=True, pass_fds=(status_w, secret_r),
            )
        except OSError as e:
            for fd in (status_r, status_w, secret_r):
                os.close(fd)
            shutil.rmtree(scratch, ignore_errors=True)
            return ExecResult(status="error", stderr=f"could not start python: {e}", backend=self.name)
        os.close(status_w)
        os.close(secret_r)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        _kill_group(proc.pid)  # children left behind by a program that exited
        duration = time.monotonic() - start
        proof = _read_all(status_r)
        os.close(status_r)
        shutil.rmtree(scratch, ignore_errors=True)
        stdout, out_cut = cap_output(out)
        stderr, err_cut = cap_output(err)
        if timed_out:
            status = "timeout"
        elif proof == secret and proc.returncode == 0:
            status = "passed"
        else:
            status = "failed"
        failing, etype = (None, None) if status == "passed" else parse_failure(stderr, path, program)
        return ExecResult(status=status, exit_code=proc.returncode, stdout=stdout, stderr=stderr,
                          stdout_truncated=out_cut, stderr_truncated=err_cut, duration_s=round(duration, 4),
                          failing_line=failing, error_type=etype, backend=self.name)

    def close(self) -> None:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_all(fd: int) -> bytes:
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            b = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks)
