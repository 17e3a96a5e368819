"""Python traceback frames read back from a program's stderr: one parser for the sandboxes' verdicts (the failing
line, the exception type) and the agents' feedback (which frame of the candidate raised)."""
from __future__ import annotations

import re
from dataclasses import dataclass

# `File "...", line N, in func`; a SyntaxError's frame has no `in func`.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?\s*$')


@dataclass
class Frame:
    file: str
    line: int
    func: str | None  # None: a SyntaxError's location, not a call frame
    source: str | None  # the source line the traceback printed under the frame, if any


def parse_frames(stderr: str) -> list[Frame]:
    """Traceback frames, outermost first, with the source line the traceback printed (if any)."""
    lines = stderr.splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        src = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if not src or _FRAME.match(lines[i + 1]) or set(src) <= set("^~ "):
            src = None
        frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func"), src))
    return frames
