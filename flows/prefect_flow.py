"""Prefect adapter: one Prefect task per (task, sample), mapped over a task runner (threads in this process, or
Dask worker processes), each trajectory handed to `on_result` as it completes.

The flow's inputs stay in this process, held by the flow function: Prefect stores a flow's parameters on
its server (512 KB limit; 164 tasks are more) and the callback holds the MLflow client, the task store and locks.
Prefect also pickles the flow object into every task's context for Dask workers, so they are held in a
`_ThisProcess` box that pickles empty (workers never run the flow body).
"""
from __future__ import annotations

import socket
from typing import Callable

from agents.types import Trajectory

from .config import ConfigError, JobSettings
from .core import Job, error_trajectory


class _ThisProcess:
    """Holds the flow's inputs; pickles as an empty box (see the module docstring)."""

    def __init__(self, **inputs):
        self.__dict__.update(inputs)

    def __getstate__(self) -> dict:
        return {}


def run_jobs(jobs: list[Job], settings: JobSettings, on_result: Callable[[Trajectory], None]) -> None:
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.futures import as_completed

    from .workers import repair_in_process  # by name, so Dask workers can import it

    repair = task(repair_in_process, name="repair", cache_policy=NO_CACHE, persist_result=False)

    box = _ThisProcess(jobs=jobs, settings=settings, on_result=on_result, repair=repair)

    @flow(name="humanevalfix-evaluate", persist_result=False, log_prints=False)
    def evaluate_flow() -> None:
        jobs, settings, on_result, repair = box.jobs, box.settings, box.on_result, box.repair
        futures = {repair.submit(t, s, settings): (t, s) for t, s in jobs}
        for fut in as_completed(list(futures)):
            t, s = futures[fut]
            try:
                traj = fut.result()
            except Exception as e:  # a worker process died under it
                traj = error_trajectory(t, s, settings.agent, e)
            on_result(traj)

    evaluate_flow.with_options(task_runner=task_runner(settings.runner))()


def task_runner(runner: dict):
    from prefect.task_runners import ThreadPoolTaskRunner

    name = runner.get("name", "threads")
    if name == "threads":
        return ThreadPoolTaskRunner(max_workers=runner["workers"])
    if name == "dask":
        import logging

        from prefect_dask import DaskTaskRunner

        logging.getLogger("distributed").setLevel(logging.WARNING)  # per-worker INFO lines drown the progress
        if runner.get("address"):
            return DaskTaskRunner(address=runner["address"])
        # A local cluster of worker processes; each loads the model once (flows/workers.py) for all its tasks.
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": runner["workers"], "threads_per_worker": runner.get("threads_per_worker", 4),
            "processes": True, "dashboard_address": None})
    raise ConfigError(f"runner {name!r} is unknown: use runner=threads or runner=dask")


def check_runner(runner: dict) -> None:
    """An unreachable Dask scheduler is one line before the run starts, not a flow failure 30 s later."""
    if runner.get("name") != "dask" or not runner.get("address"):
        return
    from urllib.parse import urlparse

    addr = str(runner["address"])
    u = urlparse(addr if "://" in addr else f"tcp://{addr}")
    try:
        with socket.create_connection((u.hostname, u.port or 8786), timeout=5):
            pass
    except (OSError, ValueError) as e:
        raise ConfigError(f"runner.address {addr}: no Dask scheduler answers there ({type(e).__name__}); "
                          f"start one with `dask scheduler` (flows/README.md)") from None
