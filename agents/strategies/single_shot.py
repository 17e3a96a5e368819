"""single_shot: every round an independent fresh attempt (the resampling baseline feedback must beat)."""
from __future__ import annotations

from .base import Strategy


class SingleShot(Strategy):
    """Every round: the same fresh prompt at the round's own seed (and temperature). Feedback is never read."""
