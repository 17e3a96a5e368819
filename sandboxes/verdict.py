"""What one program's run left and how to read it: the output tails (`_Tail`), the run's record (`_Run`: tails, proof
bytes, how it ended), and parse_failure (the failing program line and exception type from a traceback, which the E2B
backend uses too). Apart from worker.py, which drives the run and judges it from these.
"""
from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, field

from .base import ExecResult, tail_note
from .frames import parse_frames
from .languages.base import PROOF_TAG, Program

# What the proof channel keeps: the secret (Python), or a compiled program's step reports and its proof line.
PROOF_CAP = 1 << 18

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


def read_proof_channel(raw: bytes) -> tuple[list[dict], list[str]]:
    """A compiled program's proof channel: the jail's step reports (JSON lines) and the proof lines."""
    import json

    frames, proofs = [], []
    for line in bytes(raw).split(b"\n"):
        text = line.decode("utf-8", "replace").strip()
        if text.startswith("{"):
            try:
                frame = json.loads(text)
            except ValueError:
                continue
            if isinstance(frame, dict) and frame.get("stage") in ("compile", "run"):
                frames.append(frame)
        elif text.startswith(PROOF_TAG):
            proofs.append(text[len(PROOF_TAG):])
    return frames, proofs


def native_verdict(run: "_Run", program: Program, secret: bytes, duration: float, sbx, details: dict) -> ExecResult:
    """The verdict on a compiled language's run. `passed` needs the jail's exit 0 (the run step's own), exactly one
    proof line carrying this run's secret (written by the language's harness after the last assertion), and the
    reference harness's own rule on the output (sandboxes/languages/<lang>.py reference_pass)."""
    import hmac

    from .languages import language

    lang = language(program.language)
    stdout, out_cut = run.out.result()
    stderr, err_cut = run.err.result()
    exit_code = os.waitstatus_to_exitcode(run.wait_status) if run.wait_status is not None else None
    frames, proofs = read_proof_channel(run.proof)
    compiles = [f for f in frames if f["stage"] == "compile"]
    runs = [f for f in frames if f["stage"] == "run"]
    details = dict(details, isolated=sbx.isolated, compile_s=round(sum(float(f.get("s", 0)) for f in compiles), 4))
    if runs:
        details["run_s"] = runs[-1].get("s")
    if any(f.get("served") for f in compiles):  # by the warm compile service (sandboxes/services.py)
        details["compile_served"] = True
    stage = "run"
    failed_compile = next((f for f in compiles if f.get("rc") != 0), None)
    if failed_compile is not None:
        stage = "compile"
        stderr = str(failed_compile.get("output", "")) or stderr
        details["compile_timeout"] = bool(failed_compile.get("timeout"))
    elif compiles and compiles[-1].get("output", "").strip():
        details["compile_output"] = str(compiles[-1]["output"])[-2000:]
    details["stage"] = stage
    if run.timed_out:
        status = "timeout"
        details["timeout_s"] = program.timeout_s
    elif run.flooded:
        status = "failed"
        details["output_limit_bytes"] = sbx.max_output_bytes
        stderr += f"\n[sandbox: killed after more than {sbx.max_output_bytes} bytes of output]"
    elif run.wait_status is None:
        status = "error"
        stderr += "\n[sandbox: the worker died before reporting the program's end]"
    elif stage == "run" and runs and runs[-1].get("timeout"):
        status = "timeout"
        details["timeout_s"] = next(s.timeout_s for s in program.steps if s.stage == "run")
    elif (exit_code == 0 and len(proofs) == 1 and hmac.compare_digest(proofs[0].encode(), secret.hex().encode())
          and lang.reference_pass(0, stdout, stderr)):
        status = "passed"
    else:
        status = "failed"
        if exit_code is not None and exit_code > 128 and exit_code - 128 in signal.Signals._value2member_map_:
            details["signal"] = signal.Signals(exit_code - 128).name
    failure = lang.failure(stdout, stderr, program, stage) if status != "passed" else None
    if failure is not None:
        details["failure"] = failure.message[-1500:]
        details.update(failure.extra)
    return ExecResult(status=status, exit_code=exit_code, stdout=stdout, stderr=stderr, stdout_truncated=out_cut,
                      stderr_truncated=err_cut, duration_s=round(duration, 4),
                      failing_line=failure.line if failure else None, error_type=failure.kind if failure else None,
                      backend=sbx.name, details=details)
