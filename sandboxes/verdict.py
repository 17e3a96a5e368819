"""What one program's run left and how to read it: the output tails (`_Tail`), the run's record (`_Run`: tails, proof
bytes, how it ended), and parse_failure (the failing program line and exception type from a traceback, which the E2B
backend uses too). Apart from worker.py, which drives the run and judges it from these.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .base import tail_note
from .frames import parse_frames

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
