"""The strategies by name: a module each, all driven by the shared loop (agents/loop.py)."""
from __future__ import annotations

from ..config import STRATEGIES
from .base import Strategy
from .portfolio import Portfolio
from .react import ReactStrategy
from .reflection import Reflection
from .single_shot import SingleShot

REGISTRY: dict[str, type[Strategy]] = {"single_shot": SingleShot, "reflection": Reflection, "react": ReactStrategy,
                                       "portfolio": Portfolio}
assert tuple(REGISTRY) == STRATEGIES, "agents/config.py STRATEGIES and the registry must name the same strategies"
