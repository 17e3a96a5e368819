"""The strategies by name: a module each, all driven by the shared loop (agents/loop.py)."""
from __future__ import annotations

from ..config import STRATEGIES
from .base import Strategy
from .portfolio import Portfolio
from .react import ReactStrategy
from .reflection import Reflection
from .single_shot import SingleShot

# agents/strategies/<name>.py runs the strategy whose record (agents/config.py STRATEGY_CONFS) is named <name>: the
# names are the records' alone, and a record without its module is a KeyError on import.
_BY_MODULE = {c.__module__.rpartition(".")[2]: c for c in (SingleShot, Reflection, ReactStrategy, Portfolio)}
REGISTRY: dict[str, type[Strategy]] = {name: _BY_MODULE[name] for name in STRATEGIES}
