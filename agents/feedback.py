"""Test feedback shaped for small models: what failed, with what input, expected versus actual.

A raw traceback buys a small model nothing; the failing assertion (the whole statement, even when it spans
several lines), the call, the value it should return and the value it did return (computed by re-running the
test up to that assertion and evaluating the call in the failing frame), the exception with the line of the
candidate that raised it, and timeouts named as such are what it can act on. Everything is cut to a budget.
"""
from __future__ import annotations

import ast
import re
import textwrap

from sandboxes import build_program
from sandboxes.base import ExecResult, Sandbox
from sandboxes.frames import Frame, parse_frames
from . import pyast
from .trace import before_assertion, format_trace, trace_call

_ACTUAL_TAG = "__FIXLAB_VALUE__"
STYLES = ("shaped", "raw", "verdict")
# The feedback an agent gets, fixed since no full-size run varied them: shaped (raw, the traceback tail, and
# verdict, pass/fail only, stay as the baselines an ablation would set here) ...
FEEDBACK_STYLE = "shaped"
FEEDBACK_CHARS = 1200  # ... within about 300 tokens ...
# ... and without the execution trace (LDB, agents/trace.py), which costs a sandbox run and prompt tokens per failure
# and was never measured to pay at full size: this many characters of it, 0 = off
TRACE_CHARS = 0


def program_frames(frames: list[Frame], program: str) -> list[Frame]:
    """The frames that point into `program` (not the runner, not libraries)."""
    lines = program.splitlines()
    out = []
    for f in frames:
        if f.file.startswith("<") and f.file != "<unknown>" or "site-packages" in f.file or "/lib/python" in f.file:
            continue
        if not 1 <= f.line <= len(lines):
            continue
        if f.source is not None and lines[f.line - 1].strip() != f.source:
            continue
        out.append(f)
    return out


def statement_at(source: str, lineno: int) -> str | None:
    """The whole innermost statement that covers `lineno` (a compound statement: only its header)."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
            if best is None or (node.end_lineno - node.lineno) <= (best.end_lineno - best.lineno):
                best = node
    if best is None:
        return None
    lines = source.splitlines()
    end = best.end_lineno
    body = getattr(best, "body", None)
    if isinstance(body, list) and body and body[0].lineno > best.lineno:
        end = body[0].lineno - 1
    text = "\n".join(lines[best.lineno - 1: end])
    return textwrap.dedent(text).strip()


def split_assertion(stmt: str) -> dict | None:
    """What an assert checks: {"call": expr, "expected": expr | None, "kind": "eq" | "true" | "false" | "other"}."""
    try:
        node = pyast.parse(stmt.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.Assert):
        return None
    t = node.test
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.Is)):
        left, right = t.left, t.comparators[0]
        if _has_call(right) and not _has_call(left):  # `assert expected == f(x)`
            left, right = right, left
        return {"call": ast.unparse(left), "expected": ast.unparse(right), "kind": "eq"}
    if isinstance(t, ast.Call):
        return {"call": ast.unparse(t), "expected": None, "kind": "true"}
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and isinstance(t.operand, ast.Call):
        return {"call": ast.unparse(t.operand), "expected": None, "kind": "false"}
    calls = [n for n in ast.walk(t) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id not in ("abs", "len", "round", "all", "any", "sorted", "set", "list", "tuple", "isinstance",
                                   "float", "int", "str", "sum", "min", "max", "type")]
    if calls:
        return {"call": ast.unparse(calls[0]), "expected": None, "kind": "other"}
    return None


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def probe_values(sandbox: Sandbox, candidate: str, test: str, test_line: int, exprs: list[str],
                 timeout_s: float) -> list[str | None]:
    """repr() of each expression, evaluated where the assertion at `test_line` (1-based, in `test`) fails,
    with its locals (loop variables, check's parameter). None where nothing could be computed.

    The sandbox forbids frame inspection, so the test itself is rewritten: just before the failing assert
    the same condition is checked and, when it is false, the expressions are evaluated in place."""
    probe_test = _instrument(test, test_line, exprs)
    if probe_test is None:
        return [None] * len(exprs)
    res = sandbox.run(build_program(candidate, probe_test), timeout_s)
    values: list[str | None] = [None] * len(exprs)
    for line in res.stdout.splitlines():
        if line.startswith(_ACTUAL_TAG):
            i, _, v = line[len(_ACTUAL_TAG):].partition(":")
            if i.isdigit() and int(i) < len(values) and values[int(i)] is None:
                values[int(i)] = v
    if res.status == "timeout":
        values = [v if v is not None else f"<did not return within {timeout_s:g} s>" for v in values]
    return values


_REPORTER = """
def __fixlab_report(*thunks):
    import sys
    for i, thunk in enumerate(thunks):
        try:
            v = repr(thunk())
        except BaseException as e:
            v = "<raised " + type(e).__name__ + (": " + str(e)[:150] if str(e) else "") + ">"
        if len(v) > 300:
            v = v[:300] + "...<cut>"
        sys.stdout.write(%r + str(i) + ":" + v.replace("\\n", "\\\\n") + "\\n")
    sys.stdout.flush()

""" % _ACTUAL_TAG


def _instrument(test: str, test_line: int, exprs: list[str]) -> str | None:
    thunks = ", ".join(f"lambda: ({e})" for e in exprs)
    probe = before_assertion(test, test_line, lambda cond: [f"if not ({cond}):", f"    __fixlab_report({thunks})"])
    return None if probe is None else _REPORTER + probe


def _last_error_line(stderr: str) -> str:
    lines = [l for l in stderr.strip().splitlines() if l.strip()]
    if not lines:
        return ""
    last = lines[-1]
    m = re.match(r"^[\w.]+(?:Error|Exception|Exit|Interrupt|Iteration)?:\s*(.*)$", last)
    return (m.group(1) if m else last)[:300]


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: max(0, n - 12)] + " ...<cut>"


def raw_feedback(result: ExecResult, timeout_s: float, max_chars: int) -> str:
    """The baseline researchers compare shaped feedback with: the tail of the traceback, as is."""
    if result.status == "timeout":
        return f"Timed out after {timeout_s:g} seconds."
    tail = result.stderr.strip() or f"The tests failed (exit code {result.exit_code})."
    return tail[-max_chars:]


def _not_run_feedback(result: ExecResult, timeout_s: float, max_chars: int) -> str:
    """A run that timed out or that the sandbox could not start: no test line to show."""
    if result.status == "timeout":
        return _cut(f"The tests did not finish within {timeout_s:g} seconds (timeout): the code loops forever or is "
                    "far too slow on some input.", max_chars)
    return "The sandbox could not run the code: " + (result.stderr.strip().splitlines() or ["unknown error"])[-1]


def shape_feedback(result: ExecResult, candidate: str, test: str, sandbox: Sandbox | None, *, timeout_s: float,
                   max_chars: int, compute_actual: bool, entry_point: str | None = None, trace_chars: int = 0) -> str:
    """Short feedback text for a failed run of `candidate` against `test` (the program build_program makes). The
    budgets are this module's FEEDBACK_CHARS and TRACE_CHARS and the sandbox's timeout_s, passed in, not defaulted here. trace_chars > 0 adds the failing call's execution trace
    (agents/trace.py) within that many characters of its own, after the rest."""
    if result.status in ("timeout", "error"):
        return _not_run_feedback(result, timeout_s, max_chars)
    program = build_program(candidate, test)
    cand_lo, cand_hi = _line_span(program, candidate)
    test_lo, test_hi = _line_span(program, test, last=True)
    frames = program_frames([f for f in parse_frames(result.stderr) if f.func], program)
    test_frame = next((f for f in reversed(frames) if test_lo <= f.line <= test_hi), None)
    cand_frame = next((f for f in reversed(frames) if cand_lo <= f.line <= cand_hi), None)
    stmt = statement_at(program, test_frame.line) if test_frame else None
    stmt = stmt or result.failing_line
    show = (lambda s: _rename_candidate(s, entry_point)) if entry_point else (lambda s: s)
    etype = result.error_type or "an error"
    message = _last_error_line(result.stderr)
    parts = []
    traced = None  # the failing call, when the failing statement is an assertion over one
    assertion_failed = (etype == "AssertionError" and stmt and stmt.startswith("assert")
                        and (cand_frame is None or frames.index(cand_frame) < frames.index(test_frame)))
    if assertion_failed:
        parts.append("This test failed:\n" + textwrap.indent(_cut(show(stmt), 500), "    "))
        shape = split_assertion(stmt)
        if shape:
            call = traced = shape["call"]
            exprs = [call] + ([shape["expected"]] if shape["kind"] == "eq" else [])
            values = (probe_values(sandbox, candidate, test, test_frame.line - test_lo + 1, exprs, timeout_s)
                      if sandbox is not None and compute_actual and test_frame else [None] * len(exprs))
            actual = values[0]
            expected = shape["expected"]
            if expected is not None and not _is_literal(expected) and len(values) > 1 and values[1] is not None:
                expected = values[1]  # a variable or expression: show its value
            if actual is not None:
                parts.append(_returned(shape["kind"], _cut(show(call), 300), actual, expected))
        elif message:
            parts.append(f"AssertionError: {message}")
    else:
        head = f"Running the tests raised {etype}" + (f": {_cut(message, 300)}" if message else "")
        parts.append(head + ("\nin this test:\n" + textwrap.indent(_cut(show(stmt), 400), "    ")
                             if stmt and test_frame else "."))
        if cand_frame:
            shape = split_assertion(stmt) if stmt and test_frame else None
            traced = shape["call"] if shape else None
            where = statement_at(program, cand_frame.line) or cand_frame.source or ""
            if where:
                fn = f" (in `{cand_frame.func}`)" if cand_frame.func != "<module>" else ""
                parts.append(f"It happened at this line of your code{fn}:\n" + textwrap.indent(_cut(where, 300), "    "))
        elif not test_frame and result.failing_line:
            parts.append(f"At this line:\n    {_cut(result.failing_line, 300)}")
    text = _cut("\n".join(parts), max_chars)
    if trace_chars > 0 and traced and sandbox is not None and test_frame:
        trace = trace_call(sandbox, candidate, test, test_frame.line - test_lo + 1, traced, timeout_s)
        if trace is not None:
            text += "\n" + format_trace(trace, candidate, trace_chars, show)
    return text


def _returned(kind: str, call: str, actual: str, expected: str | None) -> str:
    """What the failing call returned, against what the assertion wanted."""
    if kind == "eq":
        return f"`{call}` returned {actual}, but the expected value is {_cut(expected, 300)}."
    if kind in ("true", "false"):
        return f"`{call}` returned {actual}; the test expects a {kind} value."
    return f"`{call}` returned {actual}."


def _is_literal(expr: str) -> bool:
    try:
        pyast.literal_eval(expr)
        return True
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _rename_candidate(text: str, entry_point: str) -> str:
    """Tests written as check(candidate) read better with the function's real name."""
    return re.sub(r"\bcandidate\b", entry_point, text)


def _line_span(program: str, part: str, last: bool = False) -> tuple[int, int]:
    """1-based line range of `part` inside `program` (empty range when it is not there)."""
    if not part.strip():
        return (0, -1)
    pos = program.rfind(part) if last else program.find(part)
    if pos < 0:
        return (0, -1)
    first = program.count("\n", 0, pos) + 1
    return first, first + part.count("\n")
