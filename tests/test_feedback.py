"""Shaped feedback: the whole failing statement, expected vs actual, exceptions with the candidate's line,
timeouts named, a budget."""
from __future__ import annotations

from agents import feedback
from agents.feedback import raw_feedback, split_assertion, statement_at
from agents.feedback import shape_feedback as shape
from agents_fixtures import sandbox, task
from conftest import needs_data
from sandboxes import build_program
from sandboxes.config import SandboxConf


def shape_feedback(res, code, test, sb, **kw):
    """shape_feedback with the knobs a strategy passes by default (its record's), unless a test sets one."""
    return shape(res, code, test, sb, **{"timeout_s": SandboxConf.timeout_s, "max_chars": feedback.FEEDBACK_CHARS,
                                         "compute_actual": True, **kw})


def _fail(code: str, test: str, timeout: float = 10.0):
    sb = sandbox()
    res = sb.run(build_program(code, test), timeout)
    assert not res.passed
    return res, sb


def test_statement_at_returns_the_whole_multiline_statement():
    src = "def check(f):\n    x = 1\n    assert f(1,\n             2) == [\n        3]\n"
    assert statement_at(src, 3) == "assert f(1,\n         2) == [\n    3]"
    assert statement_at(src, 4) == statement_at(src, 3)
    assert statement_at("for i in range(3):\n    pass\n", 1) == "for i in range(3):"


def test_split_assertion_shapes():
    assert split_assertion("assert f(1) == [2]") == {"call": "f(1)", "expected": "[2]", "kind": "eq"}
    assert split_assertion("assert 3 == f(1)")["call"] == "f(1)"
    assert split_assertion("assert f(2)")["kind"] == "true"
    assert split_assertion("assert not f(2)")["kind"] == "false"
    assert split_assertion("assert abs(f(2) - 1.5) < 1e-6") == {"call": "f(2)", "expected": None, "kind": "other"}
    assert split_assertion("x = 1") is None


def test_multiline_assertion_is_shown_whole_with_expected_and_actual():
    code = "def f(a, b):\n    return [a - b]\n"
    test = "def check(f):\n    assert f(1, 2) == [-1]\n    assert f(2,\n             3) == [\n        5]\n\ncheck(f)\n"
    res, sb = _fail(code, test)
    assert res.failing_line.startswith("assert f(2,")  # the sandbox only knows the first line
    text = shape_feedback(res, code, test, sb, entry_point="f")
    assert "This test failed:\n    assert f(2,\n             3) == [\n        5]\n" in text
    assert "`f(2, 3)` returned [-1], but the expected value is [5]." in text


@needs_data
def test_actual_value_uses_the_failing_frame_locals():
    t = task(38)  # the failing assert uses the loop's local variables
    res, sb = _fail(t.buggy_code, t.test)
    text = shape_feedback(res, t.buggy_code, t.test, sb, entry_point=t.entry_point)
    assert "assert decode_cyclic(encoded_str) == str" in text
    assert "`decode_cyclic(encoded_str)` returned '" in text and "but the expected value is '" in text


def test_exception_names_type_test_and_candidate_line():
    code = "def f(xs):\n    total = 0\n    return xs[len(xs)]\n"
    test = "def check(f):\n    assert f([1, 2]) == 2\n\ncheck(f)\n"
    res, sb = _fail(code, test)
    text = shape_feedback(res, code, test, sb)
    assert "IndexError" in text and "assert f([1, 2]) == 2" in text
    assert "It happened at this line of your code (in `f`):\n    return xs[len(xs)]" in text


def test_timeout_is_named_and_raw_style_is_the_traceback():
    code = "def f(x):\n    while True:\n        pass\n"
    test = "def check(f):\n    assert f(1) == 1\n\ncheck(f)\n"
    res, sb = _fail(code, test, timeout=1.0)
    assert res.status == "timeout"
    assert "timeout" in shape_feedback(res, code, test, sb, timeout_s=1.0)
    res2, _ = _fail("def f(x):\n    return 1 / 0\n", test)
    raw = raw_feedback(res2, 10.0, 2000)
    assert "Traceback" in raw and "ZeroDivisionError" in raw


def test_budget():
    code = "def f(xs):\n    return len(xs) - 1\n"
    test = "def check(f):\n    assert f([]) == 0\n\ncheck(f)\n"
    res, sb = _fail(code, test)
    short = shape_feedback(res, code, test, sb, max_chars=60)
    assert len(short) <= 60 and short.endswith("<cut>")


def test_compute_actual_off_runs_no_probe():
    code = "def f(x):\n    return x\n"
    test = "def check(f):\n    assert f(1) == 2\n\ncheck(f)\n"
    res, sb = _fail(code, test)
    text = shape_feedback(res, code, test, sb, compute_actual=False)
    assert "assert f(1) == 2" in text and "returned" not in text


@needs_data
def test_show_failure_puts_how_the_buggy_code_fails_into_the_fix_prompt_and_off_leaves_it_as_before():
    from agents.loop import run_agent
    from agents.models.doubles import ScriptedModel
    from agents_fixtures import agent

    t = task(3)  # below_zero: the buggy code returns True where the test expects False
    fix = "```python\ndef below_zero(operations):\n    b = 0\n    for op in operations:\n        b += op\n" \
          "        if b < 0:\n            return True\n    return False\n```"
    seen = {}
    for on in (True, False):
        model = ScriptedModel([fix])
        traj = run_agent(t, model, sandbox(), agent("single_shot", iters=0, show_failure=on))
        assert traj.passed and traj.attempts[0].sandbox_runs == 1 + on  # the buggy code's run counts
        seen[on] = model.requests[0].messages[-1]["content"]
    assert "The buggy function fails them like this:" in seen[True]
    assert "`below_zero([1, 2, -3, 1, 2, -3])` returned True, but the expected value is False." in seen[True]
    assert "fails them" not in seen[False] and seen[True].startswith(seen[False].split("Reply with")[0])
