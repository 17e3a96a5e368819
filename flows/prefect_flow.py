"""Prefect adapter, the default runner of run_job (flows/job.py): one Prefect task per (task, sample), mapped over a
task runner (threads in this process, or Dask worker processes), each outcome (the trajectory, or the exception the
task raised) handed to `done` as it completes.

The flow's inputs stay in this process, held by the flow function: Prefect stores a flow's parameters on
its server (512 KB limit; 164 tasks are more) and the callback holds the MLflow client, the task store and locks.
Prefect also pickles the flow object into every task's context for Dask workers, so they are held in a
`_ThisProcess` box that pickles empty (workers never run the flow body).
"""
from __future__ import annotations

import socket
from typing import Callable

from agents.extras import require
from agents.types import Trajectory

from .config import ConfigError, JobSettings
from .core import Job
from .schema import DaskRunnerConf, RunnerConf, ThreadsRunnerConf


class _ThisProcess:
    """Holds the flow's inputs; pickles as an empty box (see the module docstring)."""

    def __init__(self, **inputs):
        self.__dict__.update(inputs)

    def __getstate__(self) -> dict:
        return {}


def run_jobs(jobs: list[Job], settings: JobSettings, done: Callable[[Job, Trajectory | BaseException], None]) -> None:
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.futures import as_completed

    from .prefect_api import ensure_prefect_api
    from .workers import repair_in_process  # by name, so Dask workers can import it

    ensure_prefect_api()  # a temporary server that dies with the job, unless PREFECT_API_URL is set
    repair = task(repair_in_process, name="repair", cache_policy=NO_CACHE, persist_result=False)

    box = _ThisProcess(jobs=jobs, settings=settings, done=done, repair=repair)

    @flow(name="humanevalfix-evaluate", persist_result=False, log_prints=False)
    def evaluate_flow() -> None:
        jobs, settings, done, repair = box.jobs, box.settings, box.done, box.repair
        futures = {repair.submit(t, s, settings): (t, s) for t, s in jobs}
        for fut in as_completed(list(futures)):
            try:
                outcome = fut.result()
            except Exception as e:  # a worker process died under it
                outcome = e
            done(futures[fut], outcome)

    evaluate_flow.with_options(task_runner=task_runner(settings.runner))()


def task_runner(runner: RunnerConf):
    from prefect.task_runners import ThreadPoolTaskRunner

    if isinstance(runner, ThreadsRunnerConf):
        return ThreadPoolTaskRunner(max_workers=runner.workers)
    if isinstance(runner, DaskRunnerConf):
        import logging

        from prefect_dask import DaskTaskRunner

        logging.getLogger("distributed").setLevel(logging.WARNING)  # per-worker INFO lines drown the progress
        if runner.address:
            return DaskTaskRunner(address=runner.address)
        # A local cluster of worker processes; each loads the model once (flows/workers.py) for all its tasks.
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": runner.workers, "threads_per_worker": runner.threads_per_worker,
            "processes": True, "dashboard_address": None})
    raise ConfigError(f"runner {runner.name!r} is unknown: use runner=threads or runner=dask")


def check_runner(runner: RunnerConf) -> None:
    """A missing [dask] extra or an unreachable Dask scheduler is one line before the run starts, not a flow failure
    at Dask's 30 s connect timeout."""
    if not isinstance(runner, DaskRunnerConf):
        return
    require("dask", "runner=dask", ConfigError)
    if not runner.address:
        return
    from urllib.parse import urlparse

    addr = str(runner.address)
    u = urlparse(addr if "://" in addr else f"tcp://{addr}")
    try:
        with socket.create_connection((u.hostname, u.port or 8786), timeout=5):
            pass
    except (OSError, ValueError) as e:
        raise ConfigError(f"runner.address {addr}: no Dask scheduler answers there ({type(e).__name__}); "
                          f"start one with `dask scheduler` (flows/README.md)") from None
