"""reflection: every round revises the previous answer from its test feedback; a model that hands the bug back
(or repeats itself) starts over from the signature and the tests when `rewrite_when_stuck` is on."""
from __future__ import annotations

from ..context import State, render
from ..types import Attempt
from .base import Strategy, header, without_unchanged_note


class Reflection(Strategy):
    """Every round revises the previous answer: the prompt plus the last `history_rounds` (answer, feedback)."""

    def messages(self, state: State) -> list[dict]:
        keep = 2 * max(1, self.ctx.cfg.strategy.history_rounds)
        return state.messages[:state.prefix] + state.messages[state.prefix:][-keep:]

    def absorb(self, state: State, attempt: Attempt) -> None:
        super().absorb(state, attempt)
        if state.done or attempt.decision == "model_error":
            return
        task = self.ctx.task
        stuck = attempt.decision == "repeat" or (attempt.decision == "tested" and attempt.unchanged)
        if stuck and self.ctx.cfg.strategy.rewrite_when_stuck:
            # A small model that hands the bug back keeps copying what it is shown: start a new conversation
            # without the buggy body, from the signature, the visible tests and how the old code failed.
            seen_fb = attempt.feedback if attempt.decision == "tested" else state.feedback.get(attempt.same_as_round)
            state.messages = [{"role": "system", "content": render("system.txt", task=task)},
                              {"role": "user", "content": render("rewrite.txt", react=False, task=task,
                                                                 header=header(self.ctx), tests=self.ctx.view.tests,
                                                                 feedback=without_unchanged_note(seen_fb))}]
            state.prefix = len(state.messages)
            return
        if attempt.decision in ("no_code", "syntax_error"):
            reply = render("invalid.txt", task=task, problem=attempt.problem or "no usable code")
        elif attempt.decision == "repeat":
            # The same code fails the same way: restate what its run showed (the answer alone taught nothing).
            same = attempt.same_as_round
            reply = render("repeat.txt", task=task, unchanged=attempt.unchanged, same_round=same,
                           feedback=without_unchanged_note(state.feedback.get(same)))
        else:
            reply = render("revise.txt", task=task, code=(attempt.code or "").strip("\n"),
                           feedback=attempt.feedback or "The tests failed.")
        state.messages += [{"role": "assistant", "content": attempt.calls[-1].output},
                           {"role": "user", "content": reply}]

