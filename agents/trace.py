"""Execution-trace feedback, as in LDB ("Debug like a Human", Zhong et al., 2024): the values the candidate's
variables took, statement by statement, along the call a test failed on.

The sandbox forbids sys.settrace and frame access (sandboxes/_jail.py), so the candidate is rewritten instead: in
every function, after each assignment, at the top of each loop body and at each return, one call records the
names that statement bound. The test is rewritten too: just before the failing assertion, when its condition is
false (or raises), the failing call runs once more with recording on and the steps are printed. That is one more
sandbox run per failed attempt (milliseconds). The text is cut to a budget: the first steps and the last ones,
which is where a loop's wrong turn and the wrong return show.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass

from sandboxes import build_program
from sandboxes.base import Sandbox
from . import pyast

_TAG = "__FIXLAB_STEP__"
HEAD, TAIL = 12, 6  # steps kept from the start of the call and from its end
_STEP, _RV = "_fixlab_step", "_fixlab_rv"  # one leading underscore: a double one is mangled inside a class body

# Prepended to the rewritten candidate. Values are repr'd when recorded (a list changes later) through reprlib's
# limits, so a large value costs little; past HEAD steps only the last TAIL are kept, and recording stops after
# 20 000 steps (counted on), so a long loop costs bounded time.
_TRACER = f'''
import json as _fixlab_json, reprlib as _fixlab_reprlib
_fixlab_r = _fixlab_reprlib.Repr()
_fixlab_r.maxstring, _fixlab_r.maxother, _fixlab_r.maxlist, _fixlab_r.maxtuple = 40, 40, 8, 8
_fixlab_r.maxdict, _fixlab_r.maxset, _fixlab_r.maxlevel = 6, 8, 3
_fixlab_state = {{"on": False, "n": 0, "head": [], "tail": [], "done": False}}
def _fixlab_show(v):
    try:
        return _fixlab_r.repr(v)
    except BaseException as e:
        return "<repr raised " + type(e).__name__ + ">"
def {_STEP}(line, pairs):
    s = _fixlab_state
    if not s["on"]:
        return
    s["n"] += 1
    if s["n"] > 20000:
        return
    step = [s["n"], line, [[k, _fixlab_show(v)] for k, v in pairs]]
    if len(s["head"]) < {HEAD}:
        s["head"].append(step)
    else:
        s["tail"].append(step)
        if len(s["tail"]) > {TAIL}:
            del s["tail"][0]
def _fixlab_trace(thunk):
    s = _fixlab_state
    if s["done"]:
        return
    s["done"] = True
    s["on"] = True
    try:
        end = ["returned", _fixlab_show(thunk())]
    except BaseException as e:
        end = ["raised", type(e).__name__ + (": " + str(e)[:120] if str(e) else "")]
    s["on"] = False
    import sys
    for step in s["head"] + s["tail"]:
        sys.stdout.write({_TAG!r} + _fixlab_json.dumps(step) + "\\n")
    sys.stdout.write({_TAG!r} + _fixlab_json.dumps(["end", s["n"], end]) + "\\n")
    sys.stdout.flush()
'''


@dataclass
class Step:
    n: int  # 1-based index among all the call's steps
    line: int  # line of the candidate (as the agent wrote it)
    values: list[tuple[str, str]]  # (name, repr) of what the statement bound; ("return", repr) at a return


@dataclass
class Trace:
    call: str
    steps: list[Step]  # the first HEAD and the last TAIL
    total: int  # steps the call took
    outcome: str  # "returned" | "raised"
    value: str  # the value returned, or the exception


def _bound(target: ast.expr) -> list[str]:
    """Names a target writes (a[i] = ..., x.y = ...: the object written to)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _bound(t)]
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        base = target.value
        while isinstance(base, (ast.Subscript, ast.Attribute)):
            base = base.value
        return [base.id] if isinstance(base, ast.Name) else []
    return []


def _step(line: int, names: list[str]) -> ast.stmt:
    names = list(dict.fromkeys(names))
    pairs = ", ".join(f"({n!r}, {n})" for n in names)
    return pyast.parse(f"{_STEP}({line}, ({pairs}{',' if len(names) == 1 else ''}))").body[0]


def _block(stmts: list[ast.stmt], in_func: bool) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for st in stmts:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            st.body = _block(st.body, True)
            out.append(st)
            continue
        if isinstance(st, ast.ClassDef):
            st.body = _block(st.body, False)
            out.append(st)
            continue
        if in_func and isinstance(st, ast.Return) and st.value is not None:
            assign = ast.Assign(targets=[ast.Name(_RV, ast.Store())], value=st.value, lineno=st.lineno)
            record = pyast.parse(f"{_STEP}({st.lineno}, (('return', {_RV}),))").body[0]
            out += [assign, record, ast.Return(value=ast.Name(_RV, ast.Load()))]
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(st, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(st, field, _block(inner, in_func))
        for h in getattr(st, "handlers", []) or []:
            h.body = _block(h.body, in_func)
        for case in getattr(st, "cases", []) or []:
            case.body = _block(case.body, in_func)
        if in_func and isinstance(st, (ast.For, ast.AsyncFor)) and _bound(st.target):
            st.body = [_step(st.lineno, _bound(st.target))] + st.body
        out.append(st)
        if in_func:
            if isinstance(st, ast.Assign):
                names = [n for t in st.targets for n in _bound(t)]
            elif isinstance(st, (ast.AugAssign, ast.AnnAssign)) and st.value is not None:
                names = _bound(st.target)
            else:
                names = []
            if names:
                out.append(_step(st.lineno, names))
    return out


def instrument(candidate: str) -> str | None:
    """The candidate with a recording call after every assignment, loop step and return of its functions (None
    when it does not parse)."""
    try:
        tree = pyast.parse(candidate)
    except SyntaxError:
        return None
    tree.body = _block(tree.body, False)
    return _TRACER + ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def before_assertion(test: str, test_line: int, guard) -> str | None:
    """`test` with lines inserted just before the assertion at `test_line` (1-based): guard(condition source) gives
    them, unindented; None when the test does not parse or holds no assertion there. Shared with feedback.py's
    actual-value probe."""
    try:
        tree = pyast.parse(test)
    except SyntaxError:
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.lineno <= test_line <= n.end_lineno),
                None)
    if node is None:
        return None
    lines = test.splitlines()
    pad = " " * node.col_offset
    inserted = [pad + line for line in guard(ast.unparse(node.test))]
    return "\n".join(lines[: node.lineno - 1] + inserted + lines[node.lineno - 1:]) + "\n"


def _guarded_test(test: str, test_line: int, call: str) -> str | None:
    """The test with the failing call traced once, just before the assertion at `test_line` fails (or raises)."""
    return before_assertion(test, test_line, lambda cond: [
        "try:", f"    _fixlab_ok = bool({cond})", "except BaseException:", "    _fixlab_ok = False",
        "if not _fixlab_ok:", f"    _fixlab_trace(lambda: ({call}))"])


def trace_call(sandbox: Sandbox, candidate: str, test: str, test_line: int, call: str,
               timeout_s: float) -> Trace | None:
    """The steps of `call` in `candidate`, run where the assertion at `test_line` of `test` fails (None when it
    could not be traced: the code does not parse, or the run never reached the assertion)."""
    code, probe = instrument(candidate), _guarded_test(test, test_line, call)
    if code is None or probe is None:
        return None
    res = sandbox.run(build_program(code, probe), timeout_s)
    steps, end = [], None
    for line in res.stdout.splitlines():
        if not line.startswith(_TAG):
            continue
        try:
            rec = json.loads(line[len(_TAG):])
            if rec[0] == "end":
                end = (int(rec[1]), str(rec[2][0]), str(rec[2][1]))
            else:
                steps.append(Step(int(rec[0]), int(rec[1]), [(str(k), str(v)) for k, v in rec[2]]))
        except (ValueError, TypeError, IndexError):
            continue
    if end is None:  # a timeout inside the traced call, or the candidate wrote our tag itself
        return None
    return Trace(call=call, steps=steps, total=end[0], outcome=end[1], value=end[2])


def format_trace(trace: Trace, candidate: str, max_chars: int, show=lambda s: s) -> str:
    """The trace as the prompt shows it: each step's line of code with the values it set as a comment, and the
    call's outcome, within `max_chars`. Over budget, steps go from the middle (the end of the first ones first):
    the start and the last steps before the outcome stay."""
    src = candidate.splitlines()
    lines = [src[st.line - 1] for st in trace.steps if 1 <= st.line <= len(src)]
    margin = min((len(l) - len(l.lstrip()) for l in lines), default=0)  # keep the loops' indentation

    def row(st: Step) -> str:
        code = src[st.line - 1][margin:].rstrip() if 1 <= st.line <= len(src) else "?"
        code = code if len(code) <= 48 else code[:45] + "..."
        vals = ", ".join(f"returns {v}" if k == "return" else f"{k} = {v}" for k, v in st.values)
        return f"    {code:<30} # {vals}"

    def render(steps: list[Step]) -> list[str]:
        out, last = [], 0
        for st in steps:
            if st.n > last + 1:
                out.append(f"    # ... {st.n - last - 1} steps left out")
            out.append(row(st))
            last = st.n
        if trace.total > last:  # past the 20 000 recorded steps
            out.append(f"    # ... {trace.total - last} more steps")
        return out

    head = (f"How `{show(trace.call)}` ran in your code ({trace.total} step{'s' if trace.total != 1 else ''}; "
            f"each line with the values it set):")
    end = f"It returned {trace.value}." if trace.outcome == "returned" else f"It raised {trace.value}."
    first = [st for st in trace.steps if st.n <= HEAD]
    rest = [st for st in trace.steps if st.n > HEAD]
    while True:
        text = "\n".join([head, *render(first + rest), end])
        if len(text) <= max_chars or not (first or rest):
            return text if len(text) <= max_chars else text[: max(0, max_chars - 12)] + " ...<cut>"
        if len(first) > 2 or not rest:
            first.pop()
        else:
            rest.pop(0)
