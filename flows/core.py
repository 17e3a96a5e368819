"""The evaluation core, read top to bottom: which (task, sample) pairs still have to run, how one is repaired,
how the trajectories are kept, and what they add up to. No Prefect, Hydra or MLflow here: those are adapters
(flows/prefect_flow.py maps `repair` over the workers, flows/tracking.py logs, flows/job.py puts it together,
flows/evaluate.py is the CLI).

    jobs, done = pending(tasks, samples, store, resume)
    runner(jobs, settings, done)    # Prefect threads or Dask workers; done(job, trajectory or the exception it raised)
    summary = summarize(store.load_all(), tasks, samples, iters)
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from pathlib import Path
from typing import Callable

from agents import loop as agent_loop
from agents.config import AgentConfig
from agents.types import Task, Trajectory

from .stats import PASS_AT_K_CI, interval, pass_at_k_table

Job = tuple[Task, int]  # a task and the index of its independent sample


# ---------------------------------------------------------------- one task
def repair(task: Task, sample: int, agent: AgentConfig, model, sandbox, cache=None, run_ahead: int = 0,
           stream: tuple | None = None) -> Trajectory:
    """One trajectory: cut from a cached longer one, continued from a cached shorter one, or run afresh. A crash
    outside the agent loop (which keeps its own as the trajectory's error) raises: the runner hands it to run_job
    (flows/job.py), which records it as an error trajectory, and resume runs that task again.

    run_ahead > iters (a sweep's largest budget, with a cache): run the task to that budget now and cut this
    budget's rounds from it. A sweep `iters=0,1,2,3 -m` then decodes each task once, as one conversation (the
    engine's prefix reuse sees every round), and the later jobs only read the cache; without it each job would
    re-prefill the rounds the previous job ended on.

    stream = ((K, N), cache): single_shot's point cut from the task's answer stream of N answers, K a round
    (flows/stream.py), run first when the cache does not hold it."""
    cfg = dataclasses.replace(agent, sample=sample)
    if stream is not None:
        from .stream import repair_from_stream

        plan, stream_cache = stream
        return repair_from_stream(task, cfg, model, sandbox, stream_cache, plan)
    prior = cache.get(task, sample) if cache else None
    if prior is not None and prior.budget >= cfg.iters:
        return agent_loop.truncate(prior, cfg.iters)  # a longer cached run holds this budget's rounds
    ahead = cache is not None and run_ahead > cfg.iters
    traj = agent_loop.run_agent(task, model, sandbox, dataclasses.replace(cfg, iters=run_ahead) if ahead else cfg,
                                prior=prior)
    if cache:
        cache.put(traj, task)
    return agent_loop.truncate(traj, cfg.iters) if ahead else traj


def error_trajectory(task: Task, sample: int, agent: AgentConfig, e: BaseException) -> Trajectory:
    """What a job that raised leaves: no attempts, the error (built here only: run_job calls it)."""
    return Trajectory(task_id=task.task_id, bug_type=task.bug_type, strategy=agent.strategy.name, budget=agent.iters,
                      sample=sample, error=f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- what runs, and what is kept
class TaskStore:
    """One JSON file per finished trajectory under <base>/state/<run id>/tasks/, written atomically
    (temp file + rename), so a kill -9 leaves either the whole trajectory or none of it."""

    def __init__(self, base: Path, run_id: str):
        self.dir = Path(base) / "state" / run_id / "tasks"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, task_id: str, sample: int) -> Path:
        return self.dir / f"{safe_name(task_id)}__s{sample}.json"

    def save(self, traj: Trajectory) -> None:
        p = self.path(traj.task_id, traj.sample)
        tmp = p.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(traj.to_dict(), default=str))
        os.replace(tmp, p)

    def load_all(self) -> list[Trajectory]:
        out = []
        for p in self.dir.glob("*.json"):
            try:
                out.append(Trajectory.from_dict(json.loads(p.read_text())))
            except (ValueError, TypeError, KeyError):
                continue  # a torn or foreign file: that task simply runs again
        return out

    def load(self) -> dict[tuple[str, int], Trajectory]:
        """Finished trajectories; ones whose task crashed run again on resume."""
        return {(t.task_id, t.sample): t for t in self.load_all() if t.error is None}


def pending(tasks: list[Task], samples: int, store: TaskStore, resume: bool) -> tuple[list[Job], dict]:
    """The jobs still to run, and the finished trajectories a resumed run already has."""
    done = store.load() if resume else {}
    return [(t, s) for t in tasks for s in range(samples) if (t.task_id, s) not in done], done


def keep(store: TaskStore, traj: Trajectory, on_done: Callable[[Trajectory], None] | None = None) -> None:
    """On disk first (resume relies on it), then whoever reports progress or logs it."""
    store.save(traj)
    if on_done:
        on_done(traj)


# ---------------------------------------------------------------- metrics
def summarize(trajs: list[Trajectory], tasks: list[Task], samples: int, iters: int) -> dict:
    """pass@1 overall and after each round (with 95% intervals), pass@k, by bug type, and what it cost."""
    n, total = samples, len(tasks)
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t)

    def per_task(pred) -> list[float]:
        return [sum(pred(t) for t in by_task.get(task.task_id, [])) / n for task in tasks]

    def mean(xs: list[float]) -> float:
        return sum(xs) / total if total else 0.0

    curve = [round(mean(per_task(lambda t, r=r: t.passed_by_round(r))), 6) for r in range(iters + 1)]
    calls = [c for t in trajs for a in t.attempts for c in a.calls]
    summary = {
        "pass@1": curve[-1],
        "passed": sum(1 for task in tasks if any(t.passed for t in by_task.get(task.task_id, [])))
        if n == 1 else round(curve[-1] * total, 3),
        "total": total,
        "pass@1_by_iter": curve,
        "errors": sum(1 for t in trajs if t.error),
        "prompt_tokens": sum(t.prompt_tokens for t in trajs),
        "prefill_tokens": sum(t.prefill_tokens for t in trajs),
        "completion_tokens": sum(t.completion_tokens for t in trajs),
        "reasoning_tokens": sum(t.reasoning_tokens for t in trajs),  # part of completion_tokens: think blocks
        "model_calls": sum(t.model_calls for t in trajs),
        "sandbox_runs": sum(a.sandbox_runs for t in trajs for a in t.attempts),
        "length_stops": sum(t.length_stops for t in trajs),
        "suspicious": sum(1 for t in trajs if t.passed and t.suspicious),
        "draft_tokens": sum(c.draft_tokens for c in calls),
        "draft_accepted": sum(c.draft_accepted for c in calls),
    }
    (low, high), summary["ci_method"] = interval(per_task(lambda t: t.passed))
    summary["pass@1_ci95"] = [round(low, 4), round(high, 4)]
    summary["pass@1_ci95_by_iter"] = [[round(x, 4) for x in interval(per_task(lambda t, r=r: t.passed_by_round(r)))[0]]
                                      for r in range(iters + 1)]
    if n > 1:
        passes = [sum(t.passed for t in by_task.get(task.task_id, [])) for task in tasks]
        table = pass_at_k_table(passes, n)
        summary["pass@k"] = {k: row["value"] for k, row in table.items()}
        summary["pass@k_ci95"] = {k: row["ci95"] for k, row in table.items()}
        summary["pass@k_ci_method"] = PASS_AT_K_CI
    passed = dict(zip((task.task_id for task in tasks), per_task(lambda t: t.passed)))
    summary["pass@1_by_bug_type"] = {
        b: round(sum(passed[t.task_id] for t in tasks if t.bug_type == b) / sum(t.bug_type == b for t in tasks), 6)
        for b in sorted({t.bug_type for t in tasks})}
    return summary


# ---------------------------------------------------------------- names and order of tasks
def task_order(task_id: str) -> tuple:
    """Sort key: Python/2 before Python/10 (numeric tails in order, others after them)."""
    tail = task_id.rsplit("/", 1)[-1]
    return (task_id.rsplit("/", 1)[0], 0, int(tail), "") if tail.isdigit() else (task_id.rsplit("/", 1)[0], 1, 0, tail)


def safe_name(task_id: str) -> str:
    """A task id as a file name (Python/3 -> Python_3)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)
