"""What each process holds for the tasks it runs: one model, one sandbox and one trajectory cache per config,
built on first use and shared by every task (and every job of a sweep) in that process.

The main process builds them before a run starts (so a missing key is one line up front) and passes them to
the core; Dask worker processes, which receive only a job's settings, build their own here the first time a
task reaches them. `repair_in_process` is that Prefect task's body: importable by name, so Dask can ship it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from pathlib import Path

import serving
from agents.models import build_model
from agents.types import Task, Trajectory
from sandboxes import make_sandbox

from .cache import TrajectoryCache, default_cache_dir
from .config import JobSettings
from .core import repair

_lock = threading.Lock()
_held: dict[str, object] = {}


def _once(key: list, make):
    k = json.dumps(key, sort_keys=True, default=str)
    with _lock:
        if k not in _held:
            _held[k] = make()
        return _held[k]


def model_and_sandbox(settings: JobSettings, beside=None) -> tuple:
    """This process's model and sandbox for the settings, built once; `beside` (the job's Prefect server) is started
    beside the build, as serving.build orders it, or at once where they are built already or built elsewhere."""
    started = []

    def start_beside():
        started.append(beside())

    def make():
        sandbox = make_sandbox(settings.sandbox)
        # a model that runs here is the serving stack's to build; the others (an API, a test double) agents.models'
        if serving.serves(settings.model):
            model = serving.build(settings.model, beside=start_beside if beside else None)
        else:
            if beside:
                start_beside()
            model = build_model(settings.model, dataset=settings.dataset)
        print(f"fixlab: process {os.getpid()} loaded model {settings.model.name}", file=sys.stderr, flush=True)
        return model, sandbox
    held = _once(["context", _record(settings.model), _record(settings.sandbox), _record(settings.dataset)], make)
    if beside and not started:
        beside()
    return held


def trajectory_cache(settings: JobSettings) -> TrajectoryCache | None:
    return _cache(settings, "cache", settings.agent)


def stream_cache(settings: JobSettings) -> TrajectoryCache | None:
    """The cache of single_shot's answer streams (flows/stream.py): keyed without `candidates`, which only groups
    the stream's answers into rounds."""
    agent = dataclasses.replace(settings.agent, strategy=dataclasses.replace(settings.agent.strategy, candidates=1))
    return _cache(settings, "stream-cache", agent)


def _cache(settings: JobSettings, kind: str, agent) -> TrajectoryCache | None:
    """This process's TrajectoryCache of `kind` for `agent` under settings' model and sandbox, or None where caching
    is off or does not apply to the model."""
    if not settings.cache or not TrajectoryCache.applies(settings.model):
        return None
    key = [kind, settings.cache_dir, _record(settings.model), _record(settings.sandbox), repr(agent)]
    return _once(key,
                 lambda: TrajectoryCache(Path(settings.cache_dir) if settings.cache_dir else default_cache_dir(),
                                         settings.model, agent, settings.sandbox))


def _record(conf) -> dict:
    return {"record": type(conf).__name__, **dataclasses.asdict(conf)}


def repair_in_process(task: Task, sample: int, settings: JobSettings) -> Trajectory | Exception:
    """One task with this process's model, sandbox and cache. A crash (a model that cannot be built in a worker
    included) is returned, not raised: Prefect would log a traceback per task, and run_job (flows/job.py) makes the
    error trajectory of it."""
    try:
        model, sandbox = model_and_sandbox(settings)
        scache = stream_cache(settings) if settings.stream_applies else None
        return repair(task, sample, settings.agent, model, sandbox, trajectory_cache(settings),
                      run_ahead=settings.run_ahead, stream=(settings.stream, scache) if scache is not None else None)
    except Exception as e:
        return e


def close_all() -> None:
    with _lock:
        held = list(_held.values())
        _held.clear()
    for thing in held:
        for part in (thing if isinstance(thing, tuple) else ()):
            try:
                part.close()
            except Exception:
                pass
