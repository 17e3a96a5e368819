"""Test feedback shaped for small models: what failed, with what input, expected versus actual.

A raw traceback buys a small model nothing; the failing call, the value it should return and the value it
did return (computed by re-running that call in the sandbox) are what it can act on.
"""
from __future__ import annotations

import ast
import re

from sandboxes import build_program
from sandboxes.base import ExecResult, Sandbox

_ACTUAL_TAG = "__FIXLAB_ACTUAL__"


def split_assertion(line: str) -> tuple[str, str] | None:
    """`assert f(x) == y` -> ("f(x)", "y"); None for other shapes."""
    try:
        node = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare):
        return None
    cmp = node.test
    if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], (ast.Eq, ast.Is)):
        return None
    return ast.unparse(cmp.left), ast.unparse(cmp.comparators[0])


def actual_value(sandbox: Sandbox, candidate: str, expr: str, timeout_s: float) -> str | None:
    """repr() of `expr` evaluated after the candidate's definitions, or None when it cannot be computed."""
    probe = f"__v = repr({expr})\nprint({_ACTUAL_TAG!r} + __v[:400])\n"
    res = sandbox.run(build_program(candidate, probe), timeout_s)
    for line in res.stdout.splitlines():
        if line.startswith(_ACTUAL_TAG):
            return line[len(_ACTUAL_TAG):]
    if res.status == "timeout":
        return "<did not return: timed out>"
    if res.error_type:
        return f"<raised {res.error_type}>"
    return None


def shape_feedback(result: ExecResult, candidate: str, sandbox: Sandbox | None = None,
                   timeout_s: float = 10.0, max_chars: int = 1200, compute_actual: bool = True) -> str:
    """Short feedback text for a failed run."""
    if result.status == "timeout":
        return (f"The tests did not finish within {timeout_s:g} seconds: the code loops forever or is far too "
                f"slow on some input.")
    if result.status == "error":
        return "The sandbox could not run the code: " + (result.stderr.strip().splitlines() or ["unknown error"])[-1]
    parts = []
    line = result.failing_line
    etype = result.error_type or "an error"
    if etype == "AssertionError" and line and line.startswith("assert"):
        parts.append(f"This test failed:\n    {line}")
        pair = split_assertion(line)
        if pair and sandbox is not None and compute_actual:
            call, expected = pair
            actual = actual_value(sandbox, candidate, call, timeout_s)
            if actual is not None:
                parts.append(f"`{call}` returned {actual}, but the expected value is {expected}.")
    else:
        last = _last_error_line(result.stderr)
        parts.append(f"Running the tests raised {etype}" + (f": {last}" if last else "."))
        frame = _candidate_frame(result.stderr)
        if frame:
            parts.append(f"It happened at this line of your code:\n    {frame}")
        elif line:
            parts.append(f"At this line:\n    {line}")
    text = "\n".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n[... cut ...]"


def _last_error_line(stderr: str) -> str:
    lines = [l for l in stderr.strip().splitlines() if l.strip()]
    if not lines:
        return ""
    last = lines[-1]
    m = re.match(r"^[\w.]+(?:Error|Exception|Exit)?:\s*(.*)$", last)
    return (m.group(1) if m else last)[:300]


def _candidate_frame(stderr: str) -> str | None:
    """Source text of the deepest traceback frame that is not the test's check()."""
    frames = re.findall(r'File "[^"]+", line \d+, in (\S+)\n\s+(.+)', stderr)
    for func, src in reversed(frames):
        if func not in ("<module>", "check"):
            return src.strip()
    return None
