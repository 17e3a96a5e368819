"""From a Hydra config to checked, typed settings. Bad values fail here with one clear line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.config import PROTOCOLS, STRATEGIES, AgentConfig, check_config


class ConfigError(ValueError):
    """A bad config value. The message names the key, the value and what is allowed."""


@dataclass
class JobSettings:
    agent: AgentConfig
    model: dict
    sandbox: dict
    dataset: dict
    runner: dict
    tracking: dict
    samples: int
    offline: Any
    resume: str | None
    raw: dict
    cache: bool = True
    cache_dir: str | None = None
    run_ahead: int = 0  # a budget sweep's largest budget: each task runs to it once and the cache holds it (flows/core.py)
    stream: tuple[int, int] | None = None  # a candidates x budgets sweep's stream (K a round, N answers): flows/stream.py

    @property
    def stream_applies(self) -> bool:
        from .stream import applies

        return applies(self.agent, self.stream)

    @property
    def run_name(self) -> str:
        k = f"-k{self.agent.candidates}" if self.agent.candidates > 1 else ""  # several answers per round
        k += f"-rd{self.agent.redraws}" if self.agent.redraws else ""  # known failures drawn again
        return self.tracking.get("run_name") or f"{self.model['name']}-{self.agent.strategy}{k}-iters{self.agent.iters}"


def _int(cfg: dict, key: str, lo: int, label: str | None = None) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{label or key} must be an integer >= {lo}, got {v!r}")
    return v


def _num(cfg: dict, key: str, lo: float, label: str | None = None, hi: float | None = None) -> float:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ConfigError(f"{label or key} must be a number {rng}, got {v!r}")
    return float(v)


def _bool(cfg: dict, key: str) -> bool:
    v = cfg.get(key)
    if not isinstance(v, bool):
        raise ConfigError(f"{key} must be true or false, got {v!r}")
    return v


def _strategy_knobs(strategy: dict) -> dict:
    """The strategy's knobs that AgentConfig has, each checked against the type of its default, so that
    strategy.temperature_step=abc is one line here and not a TypeError from the agent loop per task."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(AgentConfig)}
    out = {}
    for k, v in strategy.items():
        if k not in fields or k == "strategy":
            continue
        f = fields[k]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, bool):
            ok, want = isinstance(v, bool), "true or false"
        elif isinstance(default, int):
            ok, want = isinstance(v, int) and not isinstance(v, bool), "an integer"
        elif isinstance(default, float):
            ok, want = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
        elif isinstance(default, str):
            ok, want = isinstance(v, str), "a string"
        elif isinstance(default, (tuple, list)):
            ok, want = isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          for x in v), "a list of numbers"
        else:
            ok, want = True, ""
        if not ok:
            raise ConfigError(f"strategy.{k} must be {want}, got {v!r}")
        out[k] = tuple(v) if isinstance(default, tuple) else v
    return out


def settings_from(cfg: dict) -> JobSettings:
    """`cfg` is the resolved Hydra config as a plain dict."""
    strategy = dict(cfg.get("strategy") or {})
    name = strategy.get("name")
    if name not in STRATEGIES:
        raise ConfigError(f"strategy {name!r} is unknown: use strategy={' | strategy='.join(STRATEGIES)}")
    protocol = cfg.get("protocol")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"protocol={protocol!r} is unknown: use one of {', '.join(PROTOCOLS)}")
    sandbox = dict(cfg.get("sandbox") or {})
    runner = dict(cfg.get("runner") or {})
    _int(runner, "workers", 1, "runner.workers")
    model = dict(cfg.get("model") or {})
    if not model.get("name") or not model.get("backend"):
        raise ConfigError("model config needs `name` and `backend` (see conf/model/*.yaml)")
    offline = cfg.get("offline")
    if offline not in ("auto", True, False):
        raise ConfigError(f"offline must be auto, true or false, got {offline!r}")
    knobs = _strategy_knobs(strategy)
    iters = _int(cfg, "iters", 0)
    if cfg.get("answers") is not None:  # answers per task, candidates a round: the budget follows
        from .stream import iters_for_answers

        try:
            iters = iters_for_answers(_int(cfg, "answers", 1), knobs.get("candidates", 1))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        cfg = {**cfg, "iters": iters}  # what the run logs is the budget that ran
    agent = AgentConfig(
        strategy=name,
        iters=iters,
        protocol=protocol,
        temperature=_num(cfg, "temperature", 0.0, hi=5.0),
        max_new_tokens=_int(cfg, "max_new_tokens", 1),
        seed=_int(cfg, "seed", 0),
        timeout_s=_num(sandbox, "timeout_s", 0.001, "sandbox.timeout_s"),
        audit_passes=_bool({"sandbox.audit": sandbox.get("audit", True)}, "sandbox.audit"),
        strict=_bool({"sandbox.strict": sandbox.get("strict", False)}, "sandbox.strict"),
        **knobs,
    )
    try:
        check_config(agent)  # schedules, feedback styles, tool formats: one line here, not one error per task
    except ValueError as e:
        raise ConfigError(f"strategy: {e}") from None
    if agent.strategy == "single_shot":
        _num(strategy, "resample_temperature", 0.0, "strategy.resample_temperature", 5.0)
    return JobSettings(
        agent=agent, model=model, sandbox=sandbox, dataset=dict(cfg.get("dataset") or {}), runner=runner,
        tracking=dict(cfg.get("tracking") or {}), samples=_int(cfg, "samples", 1), offline=offline,
        resume=cfg.get("resume"), raw=cfg, cache=_bool(cfg, "cache"), cache_dir=cfg.get("cache_dir"),
        run_ahead=sweep_budget() if cfg.get("sweep_ahead", True) is not False else 0,
        stream=sweep_stream() if cfg.get("sweep_ahead", True) is not False else None,
    )


SWEEP_ITERS_ENV = "FIXLAB_SWEEP_MAX_ITERS"  # set by flows/sweep.py for the jobs of a `-m` sweep over iters


def sweep_budget() -> int:
    """The largest budget of the `-m` sweep this job belongs to (0 outside a sweep over iters)."""
    import os

    v = os.environ.get(SWEEP_ITERS_ENV, "")
    return int(v) if v.isdigit() else 0


def sweep_stream() -> tuple[int, int] | None:
    """(K, N): the answer stream a `-m` sweep over candidates and budgets cuts its single_shot points from."""
    import os

    from .stream import STREAM_ENV, parse_plan

    return parse_plan(os.environ.get(STREAM_ENV))
