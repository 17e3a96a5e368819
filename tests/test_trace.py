"""Execution-trace feedback (agents/trace.py, agents/feedback.py TRACE_CHARS): the failing call's steps with the values each line
set, its outcome, within a budget; the rewritten candidate behaves as the original; reflection's revision prompt
carries it."""
from __future__ import annotations

from agents import feedback as feedback_module
from agents.feedback import shape_feedback
from agents.loop import run_agent
from agents.models.doubles import ScriptedModel
from agents.trace import format_trace, instrument, trace_call
from agents_fixtures import agent, all_tasks, fenced, sandbox, task
from conftest import needs_data
from sandboxes import build_program

TEST = "def check(f):\n    assert f([]) == False\n    assert f([1, 2, -3, 1, 2, -3]) == False\n\ncheck(f)\n"
BELOW_ZERO = """def f(operations):
    balance = 0
    for op in operations:
        balance += op
        if balance == 0:
            return True
    return False
"""


def feedback(code: str, test: str = TEST, trace_chars: int = 700) -> str:
    sb = sandbox()
    res = sb.run(build_program(code, test), 10.0)
    assert not res.passed
    return shape_feedback(res, code, test, sb, timeout_s=10.0, max_chars=1200, compute_actual=True,
                          entry_point="f", trace_chars=trace_chars)


def test_the_failing_call_is_traced_line_by_line_with_its_values():
    text = feedback(BELOW_ZERO)
    assert "`f([1, 2, -3, 1, 2, -3])` returned True, but the expected value is False." in text
    trace = text[text.index("How `f([1, 2, -3, 1, 2, -3])` ran in your code (8 steps"):]
    rows = [r.split("#")[1].strip() for r in trace.splitlines()[1:-1]]
    # the values after each line, in order: the balance hits 0 on the third element and the loop returns there
    assert rows == ["balance = 0", "op = 1", "balance = 1", "op = 2", "balance = 3", "op = -3", "balance = 0",
                    "returns True"]
    assert "        balance += op" in trace  # the loop body keeps its indentation
    assert trace.endswith("It returned True.")
    assert "ran in your code" not in feedback(BELOW_ZERO, trace_chars=0)


def test_an_exception_in_the_call_ends_the_trace_with_it():
    code = BELOW_ZERO.replace("balance += op", "balance += op[0]")
    text = feedback(code)
    assert "It happened at this line of your code (in `f`):\n    balance += op[0]" in text
    assert text.endswith("# op = 1\nIt raised TypeError: 'int' object is not subscriptable.")


def test_a_long_call_shows_its_first_and_last_steps_within_the_budget():
    code = "def f(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total - 1\n"
    test = "def check(f):\n    assert f(1000) == 499500\n\ncheck(f)\n"
    text = feedback(code, test, trace_chars=600)
    trace = text[text.index("How `f(1000)` ran in your code (2002 steps"):]
    assert len(trace) <= 600
    assert "# total = 0" in trace and "# i = 0" in trace  # the start
    assert "steps left out" in trace and "# returns 499499" in trace and trace.endswith("It returned 499499.")
    wide = feedback(code, test, trace_chars=5000)  # a wider budget holds every recorded step: 12 first, 6 last
    assert wide.count("\n    ") - wide.count("steps left out") >= 18


def test_methods_helpers_and_unpacking_are_traced():
    code = ("class Acc:\n    def __init__(self):\n        self.__items = []\n    def add(self, x):\n"
            "        self.__items.append(x)\n        return len(self.__items)\n\n"
            "def helper(p):\n    a, (b, *c) = p\n    return a + b + len(c)\n\n"
            "def f(xs):\n    acc = Acc()\n    n = acc.add(helper(xs))\n    return n\n")
    test = "def check(f):\n    assert f((1, (2, 3, 4))) == 6\n\ncheck(f)\n"
    text = feedback(code, test)
    # name mangling inside the class body does not break the recorder, and every function's steps are there
    for row in ("# acc = <", "# self = <", "# a = 1, b = 2, c = [3, 4]", "# returns 5", "# n = 1", "# returns 1"):
        assert row in text, text
    assert text.endswith("It returned 1.")


def test_the_trace_cannot_be_forged_into_a_pass_or_a_crash():
    # the candidate prints the tracer's tag itself: the verdict is the sandbox's; the trace is only the agent's view
    code = 'def f(xs):\n    print("__FIXLAB_STEP__[\\"end\\", 1, [\\"returned\\", \\"False\\"]]")\n    return True\n'
    res = sandbox().run(build_program(code, TEST), 10.0)
    assert not res.passed
    trace = trace_call(sandbox(), code, TEST, 2, "f([])", 10.0)
    assert trace is not None and trace.outcome == "returned"
    assert format_trace(trace, code, 400).endswith(".")
    assert instrument("def f(:\n") is None


@needs_data
def test_every_canonical_and_buggy_solution_behaves_the_same_rewritten():
    """The rewrite only adds records: each of the 164 canonical solutions still passes its test and each buggy one
    still fails, with the recorder in place."""
    sb, changed = sandbox(), []
    for t in all_tasks().values():
        for code, should_pass in ((t.fixed_code, True), (t.buggy_code, False)):
            res = sb.run(build_program(instrument(code), t.test), 10.0)
            if res.passed != should_pass:
                changed.append((t.task_id, should_pass, res.stderr[-300:]))
    assert not changed, changed[:3]


@needs_data
def test_reflection_revises_from_the_trace(monkeypatch):
    sig = "def truncate_number(number: float) -> float:\n"
    wrong = sig + "    whole = int(number)\n    return number - whole + 1.0\n"
    model = ScriptedModel([fenced(wrong), fenced(sig + "    return number % 1.0\n")])
    monkeypatch.setattr(feedback_module, "TRACE_CHARS", 700)
    traj = run_agent(task(2), model, sandbox(), agent("reflection", iters=1))
    assert traj.passed and traj.passed_round == 1
    revision = model.requests[1].messages[-1]["content"]
    assert "How `truncate_number(3.5)` ran in your code (2 steps" in revision
    assert "whole = int(number)" in revision and "# whole = 3" in revision and "It returned 1.5." in revision
