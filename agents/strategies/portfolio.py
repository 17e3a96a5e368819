"""portfolio: a fresh draft, then `revisions` rounds revising it from its feedback, then a fresh draft again.
single_shot's fresh samples keep finding new answers round after round; reflection's first revision is its best round
and its later ones mostly rework the same idea. A portfolio spends its rounds on both."""
from __future__ import annotations

from ..context import State
from ..types import Attempt
from .reflection import Reflection


REVISE_TEMPERATURE = 0.2  # a revision's temperature: reflection's round 1 under its rising schedule (never varied)


class Portfolio(Reflection):
    """Reflection whose conversation starts over from the opening prompt after every `revisions` revisions. A draft
    is round 0 (greedy), a fresh draft (RESAMPLE_TEMPERATURE, the round's seed) or a rewrite after a stuck answer
    (`rewrite_when_stuck`); a revision answers the previous round's feedback at REVISE_TEMPERATURE. What a round is
    depends only on the rounds before it, so budgets cut and continue as for every strategy."""

    def initial_state(self) -> State:
        state = super().initial_state()
        self.opening = list(state.messages)
        self.revised = 0  # revisions made of the current draft
        return state

    def revising(self, state: State) -> bool:
        """The next round answers feedback (the conversation holds more than its opening prompt)."""
        return len(state.messages) > state.prefix

    def produce(self, state: State, rnd: int) -> Attempt:
        self.revision = self.revising(state)
        return super().produce(state, rnd)

    def draw(self, messages: list[dict], rnd: int, stop: tuple) -> list:
        knobs = self.ctx.cfg.strategy
        temperature = REVISE_TEMPERATURE if self.revision else None  # None: the draft's round temperature
        return self.ctx.calls(messages, rnd, knobs.candidates, stop=stop, temperature=temperature)

    def absorb(self, state: State, attempt: Attempt) -> None:
        was_revision = self.revising(state)
        self.revised = self.revised + 1 if was_revision else 0
        if was_revision and self.revised >= self.ctx.cfg.strategy.revisions:
            super(Reflection, self).absorb(state, attempt)  # seen, feedback, done: the base bookkeeping only
            if not state.done and attempt.decision != "model_error":
                state.messages, state.prefix = list(self.opening), len(self.opening)  # a fresh draft next
            return
        super().absorb(state, attempt)  # a revision prompt next, or a rewrite (a draft) when it was stuck
        if self.ctx.cfg.strategy.revisions == 0 and self.revising(state):
            state.messages, state.prefix = list(self.opening), len(self.opening)
