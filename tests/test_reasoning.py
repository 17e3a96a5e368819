"""A reasoning model's think block is kept apart from its answer, in every strategy (issue #71): the code after
`</think>` is the answer, the thinking (with a wrong fix in it) is never run, its tokens are counted apart, and a
budget that ends inside the block is a `length` stop with no answer."""
from __future__ import annotations

import pytest

from agents.loop import run_agent
from agents.models.base import Generation
from agents.models.doubles import ScriptedModel
from agents.reasoning import split

from agents_fixtures import agent, fenced, sandbox, task

STRATEGIES = (("single_shot", {}), ("reflection", {}), ("portfolio", {}), ("react", {"max_turns": 4}))


def thinking(wrong: str) -> str:
    return f"<think>\nThe bug may be the loop. A first idea:\n```python\n{wrong}```\nNo, that cannot be it.\n</think>\n"


def test_split_reads_both_shapes_and_an_open_block():
    assert split("<think>a b</think>\nanswer") == ("a b", "answer", False)
    assert split("opened by the template</think>answer") == ("opened by the template", "answer", False)
    assert split("<think>still going") == ("still going", "", True)
    assert split("plain answer") == (None, "plain answer", False)


@pytest.mark.parametrize("strategy,knobs", STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_the_answer_after_the_think_block_is_judged_and_the_thinking_kept(strategy, knobs):
    t = task(0)
    react = strategy == "react"
    answer = ("Action: run_tests\n" if react else "") + fenced(t.fixed_code, prose="")
    model = ScriptedModel([thinking(t.buggy_code) + answer] * 4)
    traj = run_agent(t, model, sandbox(), agent(strategy=strategy, iters=1, **knobs))
    assert traj.passed, [(a.decision, a.result and a.result.status) for a in traj.attempts]
    call = traj.attempts[0].calls[0]
    assert "<think>" not in call.output and t.buggy_code not in call.output  # the wrong idea was never the answer
    assert call.reasoning.startswith("The bug may be the loop") and call.reasoning.endswith("cannot be it.")
    assert call.reasoning_tokens == len(call.reasoning.split()) > 0  # the scripted model's tokens are words
    assert traj.reasoning_tokens == sum(c.reasoning_tokens for a in traj.attempts for c in a.calls)


@pytest.mark.parametrize("strategy,knobs", STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_a_budget_that_ends_inside_the_think_block_is_a_length_stop_without_an_answer(strategy, knobs):
    t = task(0)
    cut = ("<think>\nLet me see. The loop compares each pair:\n```python\n" + t.fixed_code, "length")
    model = ScriptedModel([cut] * 4)
    traj = run_agent(t, model, sandbox(), agent(strategy=strategy, iters=0, **knobs))
    assert not traj.passed and traj.length_stops >= 1
    first = traj.attempts[0]
    assert first.decision in ("no_code", "out_of_turns") and first.calls[0].finish_reason == "length"
    assert first.calls[0].output == "" and first.calls[0].reasoning.startswith("Let me see.")


def test_a_servers_reasoning_field_and_count_are_kept():
    class Server(ScriptedModel):
        def generate(self, request):
            g = super().generate(request)
            return Generation(text=g.text, completion_tokens=40, reasoning="thought apart", reasoning_tokens=31)

    t = task(0)
    traj = run_agent(t, Server([fenced(t.fixed_code)]), sandbox(), agent(strategy="single_shot"))
    call = traj.attempts[0].calls[0]
    assert traj.passed and (call.reasoning, call.reasoning_tokens, call.completion_tokens) == ("thought apart", 31, 40)
