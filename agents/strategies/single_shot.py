"""single_shot: every round an independent fresh attempt (the resampling baseline feedback must beat)."""
from __future__ import annotations

from .base import Strategy


class SingleShot(Strategy):
    """Every round: the same fresh prompt. Feedback is never read. Its answers form one stream per task (answer p =
    round * candidates + candidate, with round p's seed and temperature), so every (candidates, iters) point is a
    prefix of one stream, judged `candidates` at a time (flows/stream.py cuts them from one run)."""

    def draw(self, messages: list[dict], rnd: int, stop: tuple) -> list:
        k = self.ctx.cfg.strategy.candidates
        return self.ctx.answers(messages, range(rnd * k, rnd * k + k), stop=stop)
