"""ReAct: the model works in a loop of thought -> tool call -> observation.

Tools: run_tests(code) runs the visible tests in the sandbox and returns the (shaped) feedback; submit(code)
hands in a final answer and ends the task. With a chat template that knows tools (Qwen2.5) the request
carries JSON-schema tools and the model answers with <tool_call>{...}</tool_call>; otherwise a plain-text
format ("Action: run_tests" + a python block). A bare code block counts as run_tests: small models often
skip the action line.

Budgets: a round is one sandbox execution (a new candidate tested or submitted), so `iters` compares with
the other strategies; thoughts, unusable calls and repeats cost model turns (`max_turns` per task), not rounds.
A repeated run_tests leaves no trace in the conversation (the model would copy it again) and the next turn is
drawn at CANDIDATE_TEMPERATURE. With `rewrite_when_stuck` (as in reflection) the bug handed
back unchanged or a repeat starts a new conversation instead, without the buggy body: write it from scratch.
A visible pass ends the task as in the other strategies (the agent's answer is the passing code).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..config import CANDIDATE_TEMPERATURE, round_temperature
from ..context import CODE_STOP, Context, State, render
from ..toolcalls import TOOL_CALL_TEXT, from_tool_json, tool_args
from ..types import Attempt, ModelCall
from .base import Strategy, header, without_unchanged_note

_ACTION = re.compile(r"^[\s*#>]*Action\s*\**\s*:\s*\**\s*`?(run_tests|submit)\b", re.I | re.M)
TOOLS = ("run_tests", "submit")
# A run_tests of code already known to fail is dropped and the next turn drawn hotter: kept in, a small model copies
# its own answer turn after turn (always on: never varied; where rewrite_when_stuck is on, a restart comes first)
REPEAT_REDRAW = True
TEXT_STOP = ("\nObservation:",)  # the model must not write the observation itself


@dataclass
class Action:
    name: str | None  # run_tests | submit | None (no action found)
    code: str | None  # text the candidate is extracted from (None: submit the last tested code)
    source: str  # native (a tool call) | text (an Action line) | implicit (a bare code block) | none


def parse_action(call: ModelCall) -> Action:
    for tc in call.tool_calls:  # parsed by the backend
        fn = tc.get("function", tc)
        name = fn.get("name")
        if name in TOOLS:
            args = tool_args(fn.get("arguments")) or {}
            code = args.get("code")
            if code is None and isinstance(fn.get("arguments"), str):  # arguments that are not valid JSON
                code = from_tool_json('{"name": "%s", "arguments": %s}' % (name, fn["arguments"]))[1]
            return Action(name, code if isinstance(code, str) else None, "native")
    for m in TOOL_CALL_TEXT.finditer(call.output):  # the backend did not parse it (or could not)
        name, code = from_tool_json(m.group(1))
        if name in TOOLS:
            return Action(name, code, "native")
    text = call.output
    m = _ACTION.search(text)
    if m:
        nxt = _ACTION.search(text, m.end())
        segment = text[m.end(): nxt.start() if nxt else len(text)]
        has_code = "```" in segment or re.search(r"^(def |from |import )", segment, re.M)
        return Action(m.group(1).lower(), segment if has_code else None, "text")
    if "```" in text or re.search(r"^def ", text, re.M):
        return Action("run_tests", text, "implicit")
    return Action(None, None, "none")


def supports_tools(model) -> bool:
    """Whether the model's chat template has a tool-calling format (Qwen2.5's does, SmolLM2's not)."""
    flag = getattr(model, "supports_tools", None)
    if flag is not None:
        return bool(flag)
    template = getattr(getattr(model, "tokenizer", None), "chat_template", None)
    return isinstance(template, str) and "tools" in template


class ReactStrategy(Strategy):
    def __init__(self, ctx: Context):
        super().__init__(ctx)
        fmt = ctx.cfg.strategy.tool_format
        self.native = supports_tools(ctx.model) if fmt == "auto" else fmt == "native"
        self.tools = tuple(json.loads(render("react_tools.json.j2", task=ctx.task,
                                             visible_only=ctx.cfg.protocol != "tests"))) if self.native else None

    def first_messages(self) -> list[dict]:
        ctx = self.ctx
        return [{"role": "system", "content": render("react_system.txt", task=ctx.task, native=self.native,
                                                     max_turns=ctx.cfg.strategy.max_turns)},
                {"role": "user", "content": render("react_task.txt", task=ctx.task, code=ctx.view.code.strip("\n"),
                                                   tests=ctx.view.tests)}]

    # -- one round: model turns until one sandbox execution (or the turns run out) --------------------------
    def produce(self, state: State, rnd: int) -> Attempt:
        ctx, knobs = self.ctx, self.ctx.cfg.strategy
        attempt = Attempt(round=rnd, decision="out_of_turns")
        steps: list[dict] = []
        turn_msgs: list[dict] = []
        redraw = False  # the last turn repeated known-failing code: draw this one hotter, from the same conversation
        base = state.messages
        stop = (() if self.native else TEXT_STOP) + CODE_STOP
        while state.turns + len(attempt.calls) < knobs.max_turns:
            turn = state.turns + len(attempt.calls)
            hot = max(CANDIDATE_TEMPERATURE, round_temperature(ctx.cfg, rnd)) if redraw else None
            call = ctx.call(base + turn_msgs, rnd, turn, tools=self.tools, stop=stop, temperature=hot)
            attempt.calls.append(call)
            if call.error:
                attempt.decision = "model_error"
                steps.append({"turn": turn, "action": None, "decision": "model_error"})
                break
            action = parse_action(call)
            step = {"turn": turn, "action": action.name, "format": action.source}
            steps.append(step)
            if self.act(action, step, attempt, state, rnd):
                break
            redraw = bool(step.get("restart") or step.get("dropped"))
            if step.get("restart"):  # start over; the hot draw keeps a greedy round from looping
                base, turn_msgs = self.restart_messages(state.feedback.get(step["same_as_round"])), []
            else:
                turn_msgs += self.turn_messages(call, step, attempt)
        attempt.steps = steps
        return attempt

    def act(self, action: Action, step: dict, attempt: Attempt, state: State, rnd: int) -> bool:
        """Carry out one turn's action: record its decision (and observation) in `step`; True when the round is over
        (a sandbox run, or a submit). A repeated run_tests marks the step `restart` (rewrite_when_stuck) or
        `dropped` (repeat_redraw)."""
        ctx, knobs = self.ctx, self.ctx.cfg.strategy
        if action.name is None:
            step.update(decision="no_action", observation=render("react_observation.txt", kind="no_action",
                                                                 task=ctx.task))
            return False
        if action.code is None and action.name == "submit":
            if state.last_tested is None:
                step.update(decision="submit_untested",
                            observation=render("react_observation.txt", kind="submit_untested", task=ctx.task))
                return False
            code, same = state.last_tested  # hands in the latest tested candidate, which failed (a pass ends the task)
            attempt.decision, attempt.code = "submitted", code
            attempt.same_as_round = same
            step.update(decision="submitted")
            return True
        trial = Attempt(round=rnd, decision="tested")
        verdict = ctx.judge(trial, action.code or "", state, run=False)
        step["code"] = trial.code
        if verdict in ("no_code", "syntax_error"):
            step.update(decision=verdict, observation=render("react_observation.txt", kind="invalid",
                                                             problem=trial.problem or "", task=ctx.task))
            return False
        if verdict == "repeat" and action.name == "run_tests":
            step.update(decision="repeat", same_as_round=trial.same_as_round,
                        observation=render("react_observation.txt", kind="repeat", unchanged=trial.unchanged,
                                           task=ctx.task))
            if knobs.rewrite_when_stuck:
                step["restart"] = True
            elif REPEAT_REDRAW:
                step["dropped"] = True
            return False
        if verdict == "repeat":  # submitting code already known to fail: no new run, the task ends
            attempt.decision, attempt.code = "submitted", trial.code
            attempt.same_as_round = trial.same_as_round
            step.update(decision="submitted")
            return True
        attempt.code = trial.code
        attempt.problem, attempt.unchanged = trial.problem, trial.unchanged
        attempt.decision = "tested" if action.name == "run_tests" else "submitted"
        ctx.execute(attempt)
        step.update(decision=attempt.decision)
        return True

    def restart_messages(self, feedback: str | None) -> list[dict]:
        """A new conversation without the buggy body: the header, the visible tests and how the old code failed."""
        ctx = self.ctx
        return [self.first_messages()[0],
                {"role": "user", "content": render("rewrite.txt", react=True, task=ctx.task, header=header(ctx),
                                                   tests=ctx.view.tests, feedback=without_unchanged_note(feedback))}]

    def turn_messages(self, call: ModelCall, step: dict, attempt: Attempt) -> list[dict]:
        """The conversation messages one turn adds: the model's answer and what it observed."""
        if step.get("decision") == "model_error" or step.get("dropped") or step.get("restart"):
            return []  # the next turn asks again from the same conversation (a restart: from the new one)
        content = call.output
        if call.tool_calls and "<tool_call>" not in content:  # show the template the call it parsed away
            for tc in call.tool_calls:
                fn = tc.get("function", tc)
                args = tool_args(fn.get("arguments")) or {}
                content += "\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"
        msgs = [{"role": "assistant", "content": content}]
        obs = step.get("observation")
        if obs is None and step.get("decision") == "tested":
            passed = attempt.visible is not None and attempt.visible.passed
            obs = render("react_observation.txt", kind="passed" if passed else "failed",
                         feedback=attempt.feedback or "", task=self.ctx.task)
        if obs is None:
            return msgs
        if step.get("format") == "native" and self.native:
            msgs.append({"role": "tool", "name": step.get("action") or "", "content": obs})
        else:
            msgs.append({"role": "user", "content": "Observation:\n" + obs})
        return msgs

    def absorb(self, state: State, attempt: Attempt) -> None:
        for call, step in zip(attempt.calls, attempt.steps):
            if step.get("restart"):
                state.messages = self.restart_messages(state.feedback.get(step.get("same_as_round")))
            else:
                state.messages = state.messages + self.turn_messages(call, step, attempt)
        state.turns += len(attempt.calls)
        super().absorb(state, attempt)  # seen candidates; a visible pass ends the task
        if (self.ctx.cfg.strategy.rewrite_when_stuck and attempt.decision == "tested" and attempt.unchanged
                and not state.done):  # the bug handed back and run: start over from scratch
            state.messages = self.restart_messages(attempt.feedback)
        if attempt.decision == "tested" and attempt.code is not None:
            state.last_tested = (attempt.code, attempt.round)
        if attempt.decision == "submitted":
            state.done = "submitted"
        elif attempt.decision == "out_of_turns" or (state.turns >= self.ctx.cfg.strategy.max_turns and not state.done):
            state.done = state.done or "out_of_turns"
