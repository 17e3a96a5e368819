"""Answers as edits (strategy.answer_format=patch): a SEARCH/REPLACE block is applied strictly to the code the agent
was shown, a malformed one is named in one line and costs the round, and the round's prompt asks for the edit."""
from __future__ import annotations

import pytest

from agents import lines
from agents.config import AgentConfig, ReflectionConf, SingleShotConf, check_config
from agents.loop import run_agent
from agents.models.doubles import ScriptedModel
from agents.lines import fixable_lines, rank_lines, replace_line
from agents.patch import CLOSE, apply_patch, closed
from agents_fixtures import agent, sandbox, task
from conftest import needs_data

CODE = "def f(xs):\n    total = 0\n    for x in xs:\n        total -= x\n    return total\n"


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}{CLOSE}\n"


def test_a_block_replaces_exactly_its_lines():
    p = apply_patch("Here:\n" + block("        total -= x\n", "        total += x\n"), CODE)
    assert p.problem is None and p.code == CODE.replace("-=", "+=")


def test_a_block_copied_without_its_indentation_is_found_and_put_back_at_it():
    p = apply_patch(block("total -= x\n", "total += x\n"), CODE)
    assert p.code == CODE.replace("-=", "+=")


def test_a_stop_string_cut_marker_is_put_back_and_a_deletion_works():
    cut = closed("<<<<<<< SEARCH\n    total = 0\n=======\n    total = 10\n")
    assert apply_patch(cut, CODE).code == CODE.replace("total = 0", "total = 10")
    assert apply_patch(block("    return total\n", ""), CODE).code == CODE.replace("    return total\n", "")


@pytest.mark.parametrize("answer, why", [
    ("```python\n" + CODE + "```", "no <<<<<<< SEARCH"),
    (block("    total *= x\n", "    total += x\n"), "is not in the code"),
    (block("\n", "    pass\n"), "SEARCH part is empty"),
])
def test_a_malformed_patch_is_one_line_naming_what_is_wrong(answer, why):
    p = apply_patch(answer, CODE)
    assert p.code is None and why in p.problem and "\n" not in p.problem


def test_an_ambiguous_block_is_malformed():
    code = "def g(a):\n    a += 1\n    a += 1\n    return a\n"
    assert "occurs 2 times" in apply_patch(block("    a += 1\n", "    a -= 1\n"), code).problem


@needs_data
def test_single_shot_with_patches_asks_for_an_edit_and_runs_the_patched_function():
    t = task(2)  # truncate_number: `return number % 1.0 + 1.0`
    wrong = block("    return number % 1.0 + 1.0\n", "    return number % 1.0 + 2.0\n")
    missing = block("    return number\n", "    return 0\n")
    fix = block("return number % 1.0 + 1.0\n", "return number % 1.0\n").replace(CLOSE + "\n", "")  # cut at the stop
    model = ScriptedModel([wrong, missing, fix])
    traj = run_agent(t, model, sandbox(), agent("single_shot", iters=2, answer_format="patch"))
    assert traj.error is None and traj.passed and traj.passed_round == 2
    assert [a.decision for a in traj.attempts] == ["tested", "no_code", "tested"]
    assert traj.attempts[1].feedback.startswith("malformed patch: the SEARCH text is not in the code")
    req = model.requests[0]
    assert CLOSE in req.stop and "SEARCH/REPLACE" in req.messages[0]["content"]
    assert "copied exactly" in req.messages[-1]["content"] and "return number % 1.0 + 1.0" in req.messages[-1]["content"]


@needs_data
def test_an_answer_with_the_whole_function_instead_of_an_edit_is_read_as_one():
    t = task(2)
    model = ScriptedModel(["```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"])
    traj = run_agent(t, model, sandbox(), agent("single_shot", iters=0, answer_format="patch"))
    assert traj.passed


def test_patch_answers_are_for_single_shot_only_and_the_format_is_checked():
    with pytest.raises(ValueError, match="answer_format=patch is for single_shot"):
        check_config(AgentConfig(strategy=ReflectionConf(answer_format="patch")))
    with pytest.raises(ValueError, match="unknown answer_format 'diff'"):
        check_config(AgentConfig(strategy=SingleShotConf(answer_format="diff")))
    with pytest.raises(ValueError, match="answer_format=line is for single_shot"):
        check_config(AgentConfig(strategy=ReflectionConf(answer_format="line")))


# answer_format=line: a localisation call ranks the lines, each answer corrects one (agents/lines.py)
BUGGY = "def g(xs):\n    n = 0\n    for x in xs:\n        n -= x\n    return n\n"


def test_the_quoted_lines_come_first_in_their_order_then_the_rest_in_source_order():
    fixable = fixable_lines(BUGGY, BUGGY)
    assert fixable == [1, 2, 3, 4]  # the def line is not an answer's to replace
    assert rank_lines(BUGGY, fixable, "```python\nn -= x\nnot in the code\nreturn n\n```") == [3, 4, 1, 2]
    assert rank_lines(BUGGY, fixable, "no block at all") == [1, 2, 3, 4]


def test_a_corrected_line_takes_the_replaced_lines_indentation_and_an_insertion_keeps_its_own():
    assert replace_line(BUGGY, 3, "```python\nn += x\n```", "g")[0] == BUGGY.replace("-=", "+=")
    two = replace_line(BUGGY, 3, "```python\nif x:\n    n += x\n```", "g")[0]
    assert "        if x:\n            n += x\n" in two and compile(two, "g", "exec")
    whole = "def g(xs):\n    return sum(xs)"
    assert replace_line(BUGGY, 3, f"```python\n{whole}\n```", "g")[0] == whole + "\n"
    assert replace_line(BUGGY, 3, "n += x", "g") == (None, "no ```python block with the corrected line in the answer")


@needs_data
def test_single_shot_with_line_answers_locates_first_then_fixes_the_ranked_lines_greedily(monkeypatch):
    monkeypatch.setattr(lines, "FUNCTION_EVERY", 0)  # line answers only
    t = task(3)  # below_zero: `if balance == 0:` should be `if balance < 0:`
    model = ScriptedModel(["```python\nbalance += op\nif balance == 0:\n```",  # the localisation call
                           "```python\nbalance -= op\n```", "```python\n    if balance < 0:\n```"])
    traj = run_agent(t, model, sandbox(), agent("single_shot", iters=3, answer_format="line"))
    assert traj.error is None and traj.passed and traj.passed_round == 1
    assert [len(a.calls) for a in traj.attempts] == [2, 1]  # round 0 holds the localisation call: its tokens count
    asked = [r.messages[-1]["content"].split("```python\n")[-1].split("\n")[0] for r in model.requests[1:]]
    assert asked == ["balance += op", "if balance == 0:"] and all(r.temperature == 0 for r in model.requests)
    assert "Which lines of `below_zero` are wrong?" in model.requests[0].messages[-1]["content"]


@needs_data
def test_whole_function_answers_come_first_and_the_lines_they_changed_lead_the_ranking():
    t = task(3)
    wrong = "```python\ndef below_zero(operations):\n    balance = 0\n    for op in operations:\n        balance += op\n" \
            "        if balance <= 0:\n            return True\n    return False\n```"
    model = ScriptedModel([wrong, "```python\nbalance += op\n```", "```python\nif balance < 0:\n```"])
    traj = run_agent(t, model, sandbox(), agent("single_shot", iters=3, answer_format="line"))  # FUNCTION_EVERY 4
    assert traj.passed and traj.passed_round == 1 and [a.line for a in traj.attempts] == [None, 9]
    code = t.buggy_code.strip("\n").split("\n")
    assert code[traj.attempts[1].located[0] - 1].strip() == "if balance == 0:"  # what answer 0 changed, first
    assert code[traj.attempts[1].located[1] - 1].strip() == "balance += op"  # then what the localisation quoted
    assert "```python\nif balance == 0:\n```" in model.requests[2].messages[-1]["content"]
    again = run_agent(t, ScriptedModel([]), sandbox(), agent("single_shot", iters=3, answer_format="line"), prior=traj)
    assert again.passed and again.attempts[1].located == traj.attempts[1].located  # a resumed run keeps its ranking
