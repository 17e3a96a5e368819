"""The sandbox interface: what every backend takes and returns.

A backend runs one complete Python program (see `sandboxes.program.build_program`) under a timeout and
returns an `ExecResult`. Backends must be safe to call from many threads at once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Protocol

Status = Literal["passed", "failed", "timeout", "error"]

# Output kept per stream. Tests rarely print; a candidate that floods stdout must not flood our logs.
OUTPUT_CAP_BYTES = 64 * 1024


def tail_note(text: str, total: int, cap: int) -> tuple[str, bool]:
    """The kept tail of a stream, headed by a note when `total` bytes were more than `cap`; and whether it was cut."""
    if total <= cap:
        return text, False
    return "[... output cut: %d bytes in all, the last %d kept ...]\n" % (total, cap) + text, True


@dataclass(frozen=True)
class ExecResult:
    """Verdict of one program run.

    status: passed  - the test code ran to its end (proved by the backend's per-run secret);
            failed  - the program ended without that proof (assertion, exception, exit, crash);
            timeout - killed at the time limit;
            error   - the sandbox itself could not run the program (not the candidate's fault).
    """

    status: Status
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    # The source line of the assertion (or raise) that failed, e.g. "assert add(2, 3) == 5".
    failing_line: str | None = None
    # Exception type name when the program died of one, e.g. "AssertionError", "NameError".
    error_type: str | None = None
    backend: str = ""
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ExecResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Sandbox(Protocol):
    """One documented interface, several backends (local, docker, e2b)."""

    name: str

    def run(self, program: str, timeout_s: float) -> ExecResult:
        """Run `program` (complete Python source) and return its verdict. Thread-safe."""
        ...

    def close(self) -> None:
        """Release workers, remote sandboxes, temporary directories."""
        ...


class SandboxUnavailable(RuntimeError):
    """The backend cannot start here (missing isolation, missing API key...). Message is one line."""
