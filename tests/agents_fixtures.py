"""Shared helpers for the agent tests: real HumanEvalFix tasks and a warm local sandbox."""
from __future__ import annotations

import functools

from conftest import DATA, REPO  # noqa: F401  (REPO re-exported for tests)


@functools.lru_cache(maxsize=1)
def all_tasks():
    from agents.tasks import load_tasks

    from agents.tasks import DatasetConf

    return {t.task_id: t for t in load_tasks(DatasetConf(local_fallback=str(DATA)))}


def task(n: int):
    return all_tasks()[f"Python/{n}"]


@functools.lru_cache(maxsize=1)
def sandbox():
    from sandboxes import LocalSandboxConf, make_sandbox

    return make_sandbox(LocalSandboxConf())


# The plain agent the scripted tests were written for (a test that needs more sets it): the round's temperature
# (schedule auto), no rewrite when stuck, no redraws, react's cap at 12 turns.
PLAIN = {"temperature_schedule": "auto", "rewrite_when_stuck": False, "redraws": 0, "max_turns": 12}


def agent(strategy: str = "reflection", iters: int = 0, **kw):
    """An AgentConfig from flat keywords: the strategy's knobs go to its record (agents/config.py), the rest to the
    run. PLAIN fills the knobs a test does not set; budget 0 unless given."""
    import dataclasses

    from agents.config import STRATEGY_CONFS, AgentConfig

    record = STRATEGY_CONFS[strategy]
    names = {f.name for f in dataclasses.fields(record)}
    knobs = {k: v for k, v in {**PLAIN, **kw}.items() if k in names}
    return AgentConfig(strategy=record(**knobs), iters=iters, **{k: v for k, v in kw.items() if k not in names})


def tuned(cfg, **kw):
    """`cfg` with keywords applied: the strategy's knobs to its record, the rest to the run."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cfg.strategy)}
    strategy = dataclasses.replace(cfg.strategy, **{k: v for k, v in kw.items() if k in names})
    return dataclasses.replace(cfg, strategy=strategy, **{k: v for k, v in kw.items() if k not in names})


def fenced(code: str, prose: str = "Here is the fix:") -> str:
    return f"{prose}\n\n```python\n{code}```\n"
