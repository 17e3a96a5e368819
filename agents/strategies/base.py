"""Strategy: how a round is produced from the loop state (`produce`) and folded back into it (`absorb`).
The default opening prompt is the system prompt, optional worked examples and the fix prompt."""
from __future__ import annotations

from ..context import CODE_STOP, Context, State, few_shot_messages, render
from ..extract import normalise
from ..types import Attempt


class Strategy:
    def __init__(self, ctx: Context):
        self.ctx = ctx

    def first_messages(self) -> list[dict]:
        ctx = self.ctx
        return ([{"role": "system", "content": render("system.txt")}] + few_shot_messages(ctx.cfg.few_shot)
                + [{"role": "user", "content": render("fix.txt", task=ctx.task, code=ctx.view.code.strip("\n"),
                                                      tests=ctx.view.tests)}])

    def initial_state(self) -> State:
        first = self.first_messages()
        return State(messages=first, prefix=len(first))

    def produce(self, state: State, rnd: int) -> Attempt:
        call = self.ctx.call(self.messages(state), rnd, stop=CODE_STOP if self.ctx.cfg.stop_after_code else ())
        attempt = Attempt(round=rnd, decision="tested", calls=[call])
        if call.error:
            attempt.decision = "model_error"
            return attempt
        self.ctx.judge(attempt, call.output, state)
        return attempt

    def messages(self, state: State) -> list[dict]:
        return state.messages

    def absorb(self, state: State, attempt: Attempt) -> None:
        if attempt.decision == "tested" and attempt.code is not None:
            state.seen[normalise(attempt.code)] = attempt.round
            state.feedback[attempt.round] = attempt.feedback
            visible = attempt.visible_result or attempt.result
            if visible is not None and visible.passed:
                state.done = "solved"  # the agent believes it is done; under "hidden" the verdict may differ
