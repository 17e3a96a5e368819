"""ReAct driven by scripted models: text actions, native <tool_call>s (parsed by us or by the backend),
submit, repeats, a model that never submits, round and turn budgets, and the budget invariant."""
from __future__ import annotations

import json

from agents.loop import run_agent, truncate
from agents.models.base import Generation
from agents.models.doubles import ScriptedModel
from agents.strategies import react
from agents.strategies.react import parse_action, supports_tools
from agents.types import ModelCall
from agents_fixtures import agent, sandbox, task
from conftest import needs_data
from test_agents_loop import BUGGY, FIX, SIG, WRONG_A, WRONG_B, requests, view

pytestmark = needs_data


def act(name: str, code: str, thought: str = "Thought: the modulo result is shifted.") -> str:
    return f"{thought}\nAction: {name}\n```python\n{code}```\n"


def tool(name: str, code: str, thought: str = "The + 1.0 is wrong.") -> str:
    # Qwen-style tool call; raw newlines inside the JSON string, as small models write them
    return thought + '\n<tool_call>\n{"name": "%s", "arguments": {"code": "%s"}}\n</tool_call>' % (
        name, code.replace('"', '\\"'))


def run(outputs, model=None, **kw):
    model = model or ScriptedModel(list(outputs))
    cfg = agent(strategy="react", **{"tool_format": "text", **kw})
    traj = run_agent(task(2), model, sandbox(), cfg)
    assert traj.error is None, traj.error
    return traj, model


def steps(traj):
    return [(s["action"], s["decision"]) for a in traj.attempts for s in a.steps]


def test_text_actions_test_then_submit():
    traj, model = run([act("run_tests", WRONG_A), act("submit", FIX)], iters=3)
    assert [a.decision for a in traj.attempts] == ["tested", "submitted"]
    assert traj.passed_round == 1 and traj.stop_reason == "submitted"
    obs = model.requests[1].messages[-1]
    assert obs["role"] == "user" and obs["content"].startswith("Observation:\nThe tests failed.")
    assert "returned 0.5 - 1.0" not in obs["content"] and "`truncate_number(3.5)` returned -0.5" in obs["content"]
    # the model never writes the observation itself, and its answer ends at the closing fence
    assert model.requests[0].stop == ("\nObservation:", "\n```\n") and model.requests[0].tools is None
    assert "Action: run_tests" in model.requests[0].messages[0]["content"]


def test_a_visible_pass_ends_the_task():
    traj, model = run([act("run_tests", FIX), act("submit", FIX)], iters=3)
    assert [a.decision for a in traj.attempts] == ["tested"] and traj.stop_reason == "solved"
    assert len(model.requests) == 1 and traj.passed_round == 0


def test_thoughts_bad_code_and_repeats_cost_turns_not_rounds(monkeypatch):
    outputs = ["Thought: let me think about the modulo first.",  # no action
               act("run_tests", SIG + "    return number %% 1.0 +\n"),  # syntax error
               act("run_tests", WRONG_A),  # round 0
               act("run_tests", "# again\n" + WRONG_A),  # repeat
               act("run_tests", FIX)]  # round 1
    monkeypatch.setattr(react, "REPEAT_REDRAW", False)
    traj, model = run(outputs, iters=3)
    assert steps(traj) == [(None, "no_action"), ("run_tests", "syntax_error"), ("run_tests", "tested"),
                           ("run_tests", "repeat"), ("run_tests", "tested")]
    assert [a.round for a in traj.attempts] == [0, 1] and traj.passed_round == 1
    assert "No action found" in model.requests[1].messages[-1]["content"]
    assert "SyntaxError" in model.requests[2].messages[-1]["content"]
    assert "already ran this same code" in model.requests[4].messages[-1]["content"]
    seeds = [r.seed for r in model.requests]
    assert len(set(seeds)) == len(seeds)  # every turn samples with its own seed


def test_a_repeat_is_dropped_and_the_next_turn_drawn_hotter():
    outputs = [act("run_tests", WRONG_A), act("run_tests", "# again\n" + WRONG_A),
               act("run_tests", "# and again\n" + WRONG_A), act("run_tests", FIX)]
    traj, model = run(outputs, iters=3, temperature_schedule="rising")  # REPEAT_REDRAW is on
    assert steps(traj) == [("run_tests", "tested"), ("run_tests", "repeat"), ("run_tests", "repeat"),
                           ("run_tests", "tested")]
    assert traj.passed_round == 1 and traj.attempts[1].steps[0]["dropped"]
    # the repeats leave no trace: turns 2 and 3 see exactly the conversation turn 1 saw
    assert model.requests[2].messages == model.requests[1].messages == model.requests[3].messages
    assert not any("already ran" in m["content"] for m in model.requests[3].messages)
    # rising schedule: round 1 is 0.2; after a repeat the turn draws at CANDIDATE_TEMPERATURE
    assert [r.temperature for r in model.requests] == [0.0, 0.2, 0.8, 0.8]
    assert len({r.seed for r in model.requests}) == 4
    # the next round's conversation holds the tested answer and its observation, not the repeats
    traj2, model2 = run(outputs[:3] + [act("run_tests", WRONG_B), act("run_tests", FIX)], iters=3)
    assert sum(m["role"] == "assistant" for m in model2.requests[-1].messages) == 2


def test_rewrite_when_stuck_restarts_the_conversation_without_the_buggy_body():
    # The bug handed back and run, then a repeat: each starts a new conversation (system + a from-scratch request
    # with the header, the tests and how the old code failed), and the turn after a repeat draws hot.
    outputs = [act("run_tests", BUGGY), act("run_tests", WRONG_A), act("run_tests", "# again\n" + WRONG_A),
               act("run_tests", FIX)]
    traj, model = run(outputs, iters=3, temperature_schedule="rising", rewrite_when_stuck=True)
    assert steps(traj) == [("run_tests", "tested"), ("run_tests", "tested"), ("run_tests", "repeat"),
                           ("run_tests", "tested")]
    assert [a.round for a in traj.attempts] == [0, 1, 2] and traj.passed_round == 2
    for req, failed in ((model.requests[1], "returned 1.5"), (model.requests[3], "returned -0.5")):
        assert [m["role"] for m in req.messages] == ["system", "user"]
        fresh = req.messages[1]["content"]
        assert "from scratch" in fresh and SIG.strip() in fresh and "call run_tests" in fresh
        assert "number % 1.0 + 1.0" not in fresh  # the buggy body is not shown again
        assert f"`truncate_number(3.5)` {failed}, but the expected value is 0.5." in fresh
    assert "Action: run_tests" in model.requests[3].messages[0]["content"]  # the same tools
    # round 1's answer is revised in the new conversation as usual
    assert [m["role"] for m in model.requests[2].messages] == ["system", "user", "assistant", "user"]
    assert "returned -0.5" in model.requests[2].messages[-1]["content"]
    assert [r.temperature for r in model.requests] == [0.0, 0.2, 0.4, 0.8]
    # off, the same answers keep one conversation
    _, plain = run(outputs, iters=3, temperature_schedule="rising")
    assert len(plain.requests[1].messages) == 4


def test_a_model_that_never_submits_runs_out_of_turns():
    traj, model = run(["I am not sure what to do."] * 10, iters=3, max_turns=4)
    assert len(model.requests) == 4
    assert [a.decision for a in traj.attempts] == ["out_of_turns"] and traj.stop_reason == "out_of_turns"
    assert not traj.passed


def test_round_budget_counts_sandbox_runs():
    traj, model = run([act("run_tests", WRONG_A), act("run_tests", WRONG_B), act("run_tests", FIX)], iters=1)
    assert [a.decision for a in traj.attempts] == ["tested", "tested"] and traj.stop_reason == "budget"
    assert len(model.requests) == 2 and traj.passed_round is None


def test_submit_without_code_or_before_any_test():
    traj, model = run(["Action: submit", act("run_tests", WRONG_A), "Action: submit"], iters=3)
    assert steps(traj) == [("submit", "submit_untested"), ("run_tests", "tested"), ("submit", "submitted")]
    last = traj.attempts[-1]
    assert last.decision == "submitted" and last.same_as_round == 0 and last.result is None
    assert traj.stop_reason == "submitted" and not traj.passed
    assert "nothing to submit yet" in model.requests[1].messages[-1]["content"]


def test_native_tool_calls_parsed_from_text():
    traj, model = run([tool("run_tests", WRONG_A), tool("submit", FIX)], tool_format="native", iters=2)
    assert [a.decision for a in traj.attempts] == ["tested", "submitted"] and traj.passed_round == 1
    req = model.requests[1]
    assert [t["function"]["name"] for t in req.tools] == ["run_tests", "submit"]
    assert req.messages[-1]["role"] == "tool" and "The tests failed." in req.messages[-1]["content"]
    assert req.messages[-2] == {"role": "assistant", "content": model.outputs[0]}


class ToolParsingModel(ScriptedModel):
    """Like the transformers backend: tool calls come back parsed in Generation.tool_calls."""

    def generate(self, request):
        from serving.hf import parse_tool_calls

        gen = super().generate(request)
        calls = parse_tool_calls(gen.text) if request.tools else []
        text = gen.text.split("<tool_call>")[0] if calls else gen.text
        return Generation(text=text, prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens,
                          tool_calls=calls)


def test_native_tool_calls_parsed_by_the_backend():
    fix_json = json.dumps({"name": "submit", "arguments": {"code": FIX}})
    traj, model = run([], model=ToolParsingModel([tool("run_tests", WRONG_A.replace("\n", "\\n")),
                                              f"Done.\n<tool_call>\n{fix_json}\n</tool_call>"]),
                      tool_format="native", iters=2)
    assert [a.decision for a in traj.attempts] == ["tested", "submitted"] and traj.passed
    assert traj.attempts[0].calls[0].tool_calls[0]["function"]["name"] == "run_tests"
    # the assistant turn shows the call the backend parsed away, so the chat template can render it
    assistant = model.requests[1].messages[-2]["content"]
    assert "<tool_call>" in assistant and '"run_tests"' in assistant


def test_parse_action_fallbacks():
    def call(text, tool_calls=()):
        return ModelCall(messages=[], output=text, tool_calls=list(tool_calls))

    assert parse_action(call("```python\n" + FIX + "```")).source == "implicit"
    assert parse_action(call("**Action:** `submit`\n```python\n" + FIX + "```")).name == "submit"
    broken = '<tool_call>\n{"name": "run_tests", "arguments": {"code": "def f(x):\\n    return x"}\n'  # unclosed
    a = parse_action(call(broken))
    assert (a.name, a.code) == ("run_tests", "def f(x):\n    return x")
    assert parse_action(call("nothing here")).name is None
    assert not supports_tools(ScriptedModel([]))


def test_react_budget_invariant_and_continuation():
    script = ["Thought: hmm.", act("run_tests", WRONG_A), act("run_tests", WRONG_B),
              act("run_tests", SIG + "    return number % 2.0\n"), act("submit", FIX)]
    long, m3 = run(script, iters=3)
    short, m1 = run(script, iters=1)
    assert long.passed_round == 3 and [a.decision for a in long.attempts] == ["tested"] * 3 + ["submitted"]
    assert requests(m1) == requests(m3)[:3] and view(short) == view(long)[:2]
    assert view(truncate(long, 1)) == view(short)
    more = ScriptedModel(script[3:])
    cont = run_agent(task(2), more, sandbox(), agent(strategy="react", tool_format="text", iters=3), prior=short)
    assert requests(more) == requests(m3)[3:] and view(cont) == view(long)
