"""`python -m flows.evaluate [overrides] [-m]`: one Hydra job = one Prefect flow run = one MLflow run.

The flow maps one Prefect task per HumanEvalFix problem over the configured task runner; each task runs
the agent (agents/loop.py) with the process's shared model and sandbox, writes its trajectory as soon as it
finishes (resume reads those back), and the job ends by printing one JSON summary line on stdout.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from agents import loop as agent_loop
from agents.models import ModelUnavailable, build_model
from agents.tasks import DatasetError, load_tasks
from agents.types import Task, Trajectory
from sandboxes import SandboxUnavailable, make_sandbox

from .cache import TrajectoryCache, default_cache_dir
from .config import ConfigError, JobSettings, settings_from
from .prefect_api import ensure_prefect_api, stop_prefect_api
from .stats import interval
from .tracking import FLOW_INPUTS, MLRUNS, RunTracker, safe_name

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_ERRORS = (ConfigError, DatasetError, ModelUnavailable, SandboxUnavailable)


# ---------------------------------------------------------------- process-level model and sandbox
_contexts: dict[str, tuple] = {}
_contexts_lock = threading.Lock()


def worker_context(model_cfg: dict, sandbox_cfg: dict, tasks: list[Task]):
    """The model and sandbox of this process, built once and shared by every task (and every job of a
    sweep) that asks for the same configs."""
    key = json.dumps([model_cfg, sandbox_cfg], sort_keys=True, default=str)
    with _contexts_lock:
        if key not in _contexts:
            sandbox = make_sandbox(sandbox_cfg)
            model = build_model(model_cfg, tasks)
            _contexts[key] = (model, sandbox)
            print(f"fixlab: process {os.getpid()} loaded model {model_cfg.get('name')}", file=sys.stderr, flush=True)
        return _contexts[key]


def close_contexts() -> None:
    with _contexts_lock:
        for model, sandbox in _contexts.values():
            for thing in (model, sandbox):
                try:
                    thing.close()
                except Exception:
                    pass
        _contexts.clear()


_caches: dict[str, TrajectoryCache] = {}


def trajectory_cache(settings: JobSettings) -> TrajectoryCache | None:
    if not settings.cache or not TrajectoryCache.applies(settings.model):
        return None
    key = json.dumps([settings.cache_dir, settings.model, settings.sandbox, repr(settings.agent)], sort_keys=True, default=str)
    with _contexts_lock:
        if key not in _caches:
            _caches[key] = TrajectoryCache(Path(settings.cache_dir) if settings.cache_dir else default_cache_dir(),
                                           settings.model, settings.agent, settings.sandbox)
        return _caches[key]


# ---------------------------------------------------------------- per-task state (atomic, resumable)
class TaskStore:
    """One JSON file per finished trajectory under <store>/state/<run id>/tasks/, written atomically
    (temp file + rename), so a kill -9 leaves either the whole trajectory or none of it."""

    def __init__(self, base: Path, run_id: str):
        self.dir = base / "state" / run_id / "tasks"
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


# ---------------------------------------------------------------- Prefect flow
def _repair_one(task: Task, sample: int, settings: JobSettings, tasks: list[Task]) -> Trajectory:
    import dataclasses

    try:
        model, sandbox = worker_context(settings.model, settings.sandbox, tasks)
        cfg = dataclasses.replace(settings.agent, sample=sample)
        cache = trajectory_cache(settings)
        prior = cache.get(task, sample) if cache else None
        if prior is not None and prior.budget >= cfg.iters:
            return agent_loop.truncate(prior, cfg.iters)  # a longer cached run holds this budget's rounds
        traj = agent_loop.run_agent(task, model, sandbox, cfg, prior=prior) if prior else agent_loop.run_agent(task, model, sandbox, cfg)
        if cache:
            cache.put(traj, task)
        return traj
    except Exception as e:  # never let one task kill the run
        return Trajectory(task_id=task.task_id, bug_type=task.bug_type, strategy=settings.agent.strategy,
                          budget=settings.agent.iters, sample=sample, error=f"{type(e).__name__}: {e}")


def _repair_with_test_delay(task: Task, sample: int, settings: JobSettings, tasks: list[Task]) -> Trajectory:
    # Test hook, named for what it is: tests/test_resume.py slows tasks down so it can kill -9 a run mid-way.
    delay = float(os.environ.get("FIXLAB_TEST_TASK_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)
    return _repair_one(task, sample, settings, tasks)


def make_flow(portable: bool = False):
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    fn = _repair_with_test_delay
    if portable and fn.__module__ == "__main__":
        # Dask pickles the task function by reference; under `python -m flows.evaluate` it lives in __main__,
        # which worker processes cannot import (and pickling it by value drags in this module's locks).
        import importlib

        fn = importlib.import_module("flows.evaluate")._repair_with_test_delay
    repair = task(fn, name="repair", cache_policy=NO_CACHE, persist_result=False)

    @flow(name="humanevalfix-evaluate", persist_result=False, log_prints=False)
    def evaluate_flow(mlflow_run_id: str):
        from prefect.futures import as_completed

        # The inputs stay in the flow process, found by key: Prefect stores the flow's parameters on the server
        # (512 KB limit; 164 tasks are more) and ships them to every task (dask: pickled), and on_done holds
        # the MLflow client, TaskStore and locks.
        from flows.tracking import FLOW_INPUTS

        jobs, settings, tasks, on_done = FLOW_INPUTS[mlflow_run_id]
        futures = {repair.submit(t, s, settings, tasks): (t, s) for t, s in jobs}
        out = []
        for fut in as_completed(list(futures)):
            t, s = futures[fut]
            try:
                traj = fut.result()
            except Exception as e:
                traj = Trajectory(task_id=t.task_id, bug_type=t.bug_type, strategy=settings.agent.strategy,
                                  budget=settings.agent.iters, sample=s, error=f"{type(e).__name__}: {e}")
            if on_done:
                on_done(traj)
            out.append(traj)
        return out

    return evaluate_flow


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
        # A local cluster of worker processes; each loads the model once (worker_context) for all its tasks.
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


# ---------------------------------------------------------------- metrics
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021) for n samples of which c passed."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def summarize(trajs: list[Trajectory], tasks: list[Task], settings: JobSettings) -> dict:
    n = settings.samples
    iters = settings.agent.iters
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t)
    total = len(tasks)

    def mean_pass(pred) -> float:
        return sum(sum(pred(t) for t in by_task.get(task.task_id, [])) / n for task in tasks) / total if total else 0.0

    curve = [round(mean_pass(lambda t, r=r: t.passed_by_round(r)), 6) for r in range(iters + 1)]
    passed_tasks = sum(1 for task in tasks if any(t.passed for t in by_task.get(task.task_id, [])))
    summary = {
        "pass@1": curve[-1],
        "passed": passed_tasks if n == 1 else round(curve[-1] * total, 3),
        "total": total,
        "pass@1_by_iter": curve,
        "errors": sum(1 for t in trajs if t.error),
        "prompt_tokens": sum(t.prompt_tokens for t in trajs),
        "prefill_tokens": sum(t.prefill_tokens for t in trajs),
        "completion_tokens": sum(t.completion_tokens for t in trajs),
        "model_calls": sum(t.model_calls for t in trajs),
        "sandbox_runs": sum(a.decision in ("tested", "submitted") and a.result is not None for t in trajs
                            for a in t.attempts),
        "length_stops": sum(t.length_stops for t in trajs),
        "suspicious": sum(1 for t in trajs if t.passed and t.suspicious),
        "draft_tokens": sum(c.draft_tokens for t in trajs for a in t.attempts for c in a.calls),
        "draft_accepted": sum(c.draft_accepted for t in trajs for a in t.attempts for c in a.calls),
    }
    per_task = [sum(t.passed for t in by_task.get(task.task_id, [])) / n for task in tasks]
    (low, high), method = interval(per_task)
    summary["pass@1_ci95"] = [round(low, 4), round(high, 4)]
    summary["ci_method"] = method
    summary["pass@1_ci95_by_iter"] = [
        [round(x, 4) for x in interval([sum(t.passed_by_round(r) for t in by_task.get(task.task_id, [])) / n
                                        for task in tasks])[0]] for r in range(iters + 1)]
    if n > 1:
        summary["pass@k"] = {k: round(sum(pass_at_k(n, sum(t.passed for t in by_task.get(task.task_id, [])), k)
                                          for task in tasks) / total, 6) for k in (1, 2, 5, 10, 100) if k <= n}
    bug_types = sorted({task.bug_type for task in tasks})
    summary["pass@1_by_bug_type"] = {
        b: round(sum(sum(t.passed for t in by_task.get(task.task_id, [])) / n for task in tasks if task.bug_type == b)
                 / sum(1 for task in tasks if task.bug_type == b), 6) for b in bug_types}
    return summary


# ---------------------------------------------------------------- the job
def apply_offline(offline) -> bool:
    """Go offline at once when the hub cannot be resolved (here DNS fails at once); else 20-50 s retries."""
    if offline == "auto":
        result = []
        th = threading.Thread(target=lambda: result.append(_resolves("huggingface.co")), daemon=True)
        th.start()
        th.join(3.0)
        offline = not (result and result[0])
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        if "huggingface_hub.constants" in sys.modules:
            sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = True
    return bool(offline)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


class Progress:
    def __init__(self, total: int, already: int = 0, passed: int = 0):
        self.total, self.done, self.passed = total, already, passed
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()

    def __call__(self, traj: Trajectory) -> None:
        with self.lock:
            self.done += 1
            self.passed += traj.passed
            verdict = "ERROR" if traj.error else (f"passed@{traj.first_pass_round}" if traj.passed else "failed")
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            print(f"[{self.done:>4}/{self.total}] {traj.task_id:<12} {verdict:<9} passes so far {self.passed}"
                  f"  ({rate * 60:.1f} tasks/min)" + (f"  {traj.error}" if traj.error else ""), file=sys.stderr, flush=True)


def run_job(cfg: dict) -> dict:
    t0 = time.perf_counter()
    settings = settings_from(cfg)
    apply_offline(settings.offline)
    tasks = load_tasks(settings.dataset)
    tracker = RunTracker(settings.tracking)
    resume = settings.resume
    if resume == "last":
        resume = tracker.last_run_id()
        if resume is None:
            raise ConfigError("resume=last: no earlier run in this experiment to resume")
    # Build model and sandbox before any task starts, so a missing key or model is one error up front
    # (not for dask: the model lives in the worker processes, possibly on other machines).
    if settings.runner.get("name", "threads") != "dask":
        worker_context(settings.model, settings.sandbox, tasks)
    check_runner(settings.runner)
    tags = {"model": settings.model["name"], "strategy": settings.agent.strategy,
            "protocol": settings.agent.protocol, "iters": str(settings.agent.iters)}
    try:
        run_id = tracker.start(settings.run_name, settings.raw, tags, resume_run_id=resume)
    except ConfigError:
        raise
    except Exception as e:
        if resume:
            raise ConfigError(f"resume={resume}: no such MLflow run ({type(e).__name__})") from None
        raise
    store = TaskStore(tracker.store_dir, run_id)
    done = store.load() if resume else {}
    jobs = [(t, s) for t in tasks for s in range(settings.samples) if (t.task_id, s) not in done]
    print(f"fixlab: {len(tasks)} tasks x {settings.samples} sample(s), {len(jobs)} to run, model={settings.model['name']} "
          f"strategy={settings.agent.strategy} iters={settings.agent.iters} run_id={run_id}", file=sys.stderr, flush=True)
    progress = Progress(len(tasks) * settings.samples, len(done), sum(t.passed for t in done.values()))

    def on_done(traj: Trajectory) -> None:
        store.save(traj)
        progress(traj)
        try:
            tracker.log_task(traj.to_dict())
        except Exception as e:  # the local state file already holds it; the final upload retries
            print(f"fixlab: could not log {traj.task_id} to MLflow now ({e}); it is kept for the final upload",
                  file=sys.stderr)

    status = "FAILED"
    try:
        if jobs:
            ensure_prefect_api()  # a temporary server that dies with the job, unless PREFECT_API_URL is set
            flow = make_flow(portable=settings.runner.get("name") == "dask").with_options(
                task_runner=task_runner(settings.runner))
            FLOW_INPUTS[run_id] = (jobs, settings, tasks, on_done)
            try:
                flow(run_id)
            finally:
                FLOW_INPUTS.pop(run_id, None)
        trajs = store.load_all()
        summary = summarize(trajs, tasks, settings)
        summary.update(run_id=run_id, wall_s=round(time.perf_counter() - t0, 2), model=settings.model["name"],
                       strategy=settings.agent.strategy, protocol=settings.agent.protocol, iters=settings.agent.iters,
                       samples=settings.samples)
        tracker.log_lines(_result_rows(trajs), "results.jsonl")
        # A resumed run (or a failed upload) may lack some tasks' trajectory files and traces: add them.
        tracker.complete_tasks([t.to_dict() for t in trajs])
        tracker.log_results_table([t.to_dict() for t in trajs])
        if resume:
            summary["resumed"] = True
        status = "FINISHED"
        tracker.finish(summary, status)
        return summary
    except BaseException as e:
        # Ctrl-C is KILLED (resume=last continues it); anything else is FAILED.
        status = "KILLED" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "FAILED"
        raise
    finally:
        if status != "FINISHED":
            try:
                tracker.client.set_terminated(run_id, status=status)
            except Exception:
                pass


def _result_rows(trajs: list[Trajectory]):
    for t in sorted(trajs, key=lambda t: (_task_num(t.task_id), t.sample)):
        yield {
            "task_id": t.task_id, "sample": t.sample, "bug_type": t.bug_type, "passed": t.passed,
            "first_pass_round": t.first_pass_round, "error": t.error, "seconds": t.seconds,
            "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
            "attempts": [{"round": a.round, "decision": a.decision, "code": a.code,
                          "status": a.result.status if a.result else None,
                          "test_output": (a.result.stderr[-2000:] if a.result else None),
                          "feedback": a.feedback} for a in t.attempts],
        }


def _task_num(task_id: str):
    tail = task_id.rsplit("/", 1)[-1]
    return (0, int(tail)) if tail.isdigit() else (1, tail)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> float:
    try:
        summary = run_job(OmegaConf.to_container(cfg, resolve=True))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        close_contexts()
        sys.exit(2)
    print(json.dumps(summary), flush=True)
    return summary["pass@1"]


def check_overrides(argv: list[str]) -> str | None:
    """Compose the config once per command line (first value of each sweep) before Hydra runs, so an
    unknown key or option is one line instead of Hydra's multi-line report. Returns the error or None."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
        simple = []
        for o in parsed:
            if o.is_sweep_override():
                first = next(iter(o.sweep_string_iterator()), None)
                simple.append(f"{o.get_key_element()}={first}")
            else:
                simple.append(o.input_line)
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
            compose(config_name="config", overrides=[a for a in simple if not a.startswith("hydra.")])
    except Exception as e:
        text = str(e).split("Config search path")[0]
        if "is not in struct" in str(e) + str(e.__cause__) and text.startswith("Could not override"):
            key = text.split("'")[1]
            return (f"unknown setting {key!r}: check the spelling (`python -m flows.evaluate --cfg job` "
                    f"prints every setting)")
        text = " ".join(text.replace("In 'config': ", "").split())
        return text[:400] + (" (see conf/ for the settings and options)" if "conf/" not in text else "")
    return None


def stop_on_sigterm() -> None:
    """SIGTERM stops a job as Ctrl-C does: the run is marked KILLED and `resume=last` continues it."""
    import signal

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def stop_now(code: int) -> None:
    """Leave at once: worker threads still inside a task would hold a normal exit until their task ends (minutes
    for a model call). Every finished task is already on disk and the run is already marked, so nothing is lost."""
    stop_prefect_api()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    problem = check_overrides(sys.argv[1:]) if not any(a in ("-h", "--help", "--cfg", "-c", "--info") for a in sys.argv) else None
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    stop_on_sigterm()
    try:
        main()
    except KeyboardInterrupt:
        print("fixlab: stopped; the run is marked KILLED and `resume=last` continues it", file=sys.stderr)
        stop_now(130)
    finally:
        close_contexts()
        stop_prefect_api()
