"""Self-check: when the tests the agent sees are a few examples (protocols docs and hidden), several answers that
pass them can still disagree on other inputs. The round's passing candidates are run on probe inputs, grouped by
what they return, and the largest group's first answer is kept (agreement between independent answers, as in
CodeT / MBR-exec). The agent is satisfied only when at least `self_check` answers agree; else it hands the answer in
unsure (stop reason "unsure"), and the overfit gap counts only what it was satisfied with.

Probes come from the visible tests alone: the arguments of every call of the entry point in them, and each
literal argument mutated by its type (numbers moved, strings and lists cut, grown and reversed). The verdict never
depends on a probe: a probe run only groups answers, and a candidate that games it only changes which of the
round's passing answers is kept.

With `self_tests` the model also writes assertions of its own (once a task, from what the agent sees: the buggy
code and the visible examples). They run beside the probes; a group's score is its size times one plus the
assertions its answer passes (CodeT's dual agreement: answers that agree and tests that answers pass vouch for each
other), and the agent is satisfied only when the kept answer passes more than SELF_TESTS_PASS of them (at
least one: the model's assertions are often wrong themselves).

With `self_inputs` the model writes inputs of its own (calls of the function, once a task, from what the agent
sees; no expected values: CodeT's input side). They join the probes after the examples' own calls: the probes next
to the examples often miss the inputs where the bug shows, so two different corrections can agree on all of them.
"""
from __future__ import annotations

import ast
import itertools

PROBES = 16  # probe calls per task, the examples' own first
PROBE_RUN_S = 3.0  # one answer's probe run: every probe together (the examples' own calls take milliseconds)
MARKER = "__fixlab_probe__"
# The kept answer must pass more than this share of its own assertions to be labelled satisfied (0: at least one).
# Only the label depends on it, never an answer; 0 because a small model's own assertions are often wrong themselves.
SELF_TESTS_PASS = 0.0


def _mutants(value) -> list:
    """Same-typed neighbours of one literal argument that keep its sign and stay non-empty: two correct answers
    may well differ outside the task's domain (a negative number, an empty list), and that would split them."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [v for v in (value + 1, value + 2, value - 1, value * 2 + 1) if (v >= 0) == (value >= 0)]
    if isinstance(value, float):
        return [value * 1.5, value / 2, value + 1.0 if value > 0 else value - 1.0]
    if isinstance(value, (str, list, tuple)) and len(value) >= 2:
        grown = value + value[-1:]
        return [value[:-1], value[1:], value[::-1], grown]
    return []


def _src(args: list[ast.expr]) -> tuple[str, list | None]:
    """A call's argument tuple as source (canonical when every argument is a literal) and its values."""
    try:
        values = [ast.literal_eval(a) for a in args]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return "(" + "".join(ast.unparse(a) + ", " for a in args) + ")", None
    return repr(tuple(values)), values


def _entry_calls(tree: ast.AST, entry_point: str) -> list[tuple[str, list | None]]:
    """Every plain call of the entry point in a tree (no keywords, no *args), as _src gives it."""
    return [_src(node.args) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point
            and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)]


def probe_calls(test: str, entry_point: str, limit: int = PROBES, own: list[str] = ()) -> list[str]:
    """Argument tuples (as source) to call the entry point with: the visible tests' own calls, then `own` (the
    model's inputs, self_inputs; not counted in `limit`), then one literal argument at a time mutated, the
    examples in turn; at most `limit` besides `own`."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return []
    calls, examples, seen = [], [], set()
    for src, values in _entry_calls(tree, entry_point):
        if src not in seen:
            seen.add(src)
            calls.append(src)
            if values is not None:
                examples.append(values)
    theirs = [c for c in dict.fromkeys(own) if c not in seen]
    seen.update(theirs)
    per_example = []
    for values in examples:
        mine = []
        for i, v in enumerate(values):
            for m in _mutants(v):
                src = repr(tuple(values[:i] + [m] + values[i + 1:]))
                if src not in seen:
                    seen.add(src)
                    mine.append(src)
        per_example.append(mine)
    mutated = [m for row in itertools.zip_longest(*per_example) for m in row if m is not None]
    return calls[:limit] + theirs + (calls + mutated)[len(calls[:limit]):limit]


def probe_program(entry_point: str, calls: list[str], checks: list[str] = ()) -> str:
    """Test code that calls the entry point on every probe in turn and prints, one line each as it goes, what it
    returned (repr) or raised (exception type), then evaluates each check (an assertion's condition) and prints
    pass, fail or what it raised. Arguments are rebuilt per call, so an answer that mutates them changes nothing
    for the next probe. The sandbox runs it in a thread (no alarms): a probe that hangs is cut by the run's timeout
    (PROBE_RUN_S), and what was printed before says where."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry point {entry_point!r} is not a Python name")
    probes = "[" + ", ".join(f"lambda: {c}" for c in calls) + "]"
    conditions = "[" + ", ".join(f"lambda: ({c})" for c in checks) + "]"
    return f'''
def __fixlab_probe(fn, probes, checks, _print=print, _repr=repr, _type=type, _exc=Exception):
    for i, make in enumerate(probes):
        try:
            value = _repr(fn(*make()))[:300]
        except _exc as e:
            value = "!" + _type(e).__name__
        _print("{MARKER}" + _repr([i, value]), flush=True)
    for j, check in enumerate(checks):
        try:
            value = "pass" if check() else "fail"
        except _exc as e:
            value = "!" + _type(e).__name__
        _print("{MARKER}" + _repr([len(probes) + j, value]), flush=True)


__fixlab_probe({entry_point}, {probes}, {conditions})
'''


def own_assertions(text: str, entry_point: str, visible_test: str, limit: int) -> list[str]:
    """The conditions of the assertions the model wrote (one per line inside its code blocks, or bare lines) that
    call the entry point and are not already among the visible tests; at most `limit`, duplicates dropped."""
    def shown(src: str) -> set[str]:
        try:
            return {ast.unparse(n.test) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Assert)}
        except SyntaxError:
            return set()

    seen = shown(visible_test or "")
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith("assert"):
            continue
        try:
            node = ast.parse(line).body[0]
        except (SyntaxError, IndexError, ValueError, MemoryError, RecursionError):
            continue
        if not isinstance(node, ast.Assert) or not any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == entry_point
                for n in ast.walk(node.test)):
            continue
        cond = ast.unparse(node.test)
        if cond not in seen:
            seen.add(cond)
            out.append(cond)
    return out[:limit]


def own_inputs(text: str, entry_point: str, visible_test: str, limit: int) -> list[str]:
    """The argument tuples (canonical source) of the calls of the entry point the model wrote (one a line, inside its
    code blocks or bare; an assertion's call counts, its expected value is ignored) whose arguments are all
    literals and that the visible tests do not already make; at most `limit`, duplicates dropped. Literals only: an
    argument the model computes could hang or differ between runs, and a probe has to mean the same for every
    answer."""
    try:
        shown = {src for src, _ in _entry_calls(ast.parse(visible_test or ""), entry_point)}
    except SyntaxError:
        shown = set()
    out: list[str] = []
    for line in (text or "").splitlines():
        try:
            tree = ast.parse(line.strip())
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        for src, values in _entry_calls(tree, entry_point):
            if values is not None and src not in shown and src not in out:
                out.append(src)
    return out[:limit]


def behaviour(stdout: str, n: int) -> tuple | None:
    """What a probe run printed, as a tuple to group answers by: a probe that never reported is where the run hung
    or died ("!stopped"), and the ones after it were never run ("!skipped"). None when nothing was reported."""
    seen: dict[int, str] = {}
    for line in (stdout or "").splitlines():
        if line.startswith(MARKER):
            try:
                i, value = ast.literal_eval(line[len(MARKER):])
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(i, int) and isinstance(value, str) and i == len(seen):
                seen[i] = value
    if not seen:
        return None
    out = [seen[i] for i in range(len(seen))]
    if len(out) < n:
        out += ["!stopped"] + ["!skipped"] * (n - len(out) - 1)
    return tuple(out)


def groups(behaviours: list[tuple | None]) -> list[list[int]]:
    """Indexes grouped by equal behaviour, largest group first (ties: the earliest member first). An answer whose
    probe run did not report is a group of its own."""
    by: dict = {}
    out: list[list[int]] = []
    for i, b in enumerate(behaviours):
        if b is None:
            out.append([i])
        elif b in by:
            by[b].append(i)
        else:
            by[b] = [i]
            out.append(by[b])
    return sorted(out, key=lambda g: (-len(g), g[0]))


def satisfied(group: int, need: int, own_passed: int = 0, own_tests: int = 0, share: float = 0.0) -> bool:
    """The agent's label for a kept answer: at least `need` answers agree (its group's size) and, when the model's own
    assertions ran, it passes more than `share` of them. The read-back of a recorded run (flows/analysis/run_record.py)
    calls this same rule."""
    return group >= need and (not own_tests or own_passed > share * own_tests)
