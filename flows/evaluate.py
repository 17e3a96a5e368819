"""`python -m flows.evaluate [overrides] [-m]`: one Hydra job = one Prefect flow run = one MLflow run.

Config -> typed settings (flows/config.py) -> this process's model and sandbox (flows/workers.py) -> the core
(flows/core.py: what runs, one repair per task, the summary) mapped by the Prefect adapter (flows/prefect_flow.py)
-> MLflow (flows/tracking.py) -> one JSON summary line on stdout. Read `run_job`, then `main`.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from agents.models import ModelUnavailable
from agents.tasks import DatasetError, load_tasks
from agents.types import Trajectory
from sandboxes import SandboxUnavailable

from . import core
from .config import ConfigError, settings_from
from .prefect_api import ensure_prefect_api, stop_prefect_api
from .prefect_flow import check_runner, run_jobs
from .tracking import RunTracker
from .workers import close_all, model_and_sandbox

REPO_ROOT = Path(__file__).resolve().parent.parent
USER_ERRORS = (ConfigError, DatasetError, ModelUnavailable, SandboxUnavailable)


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
    """One job: settings, model and sandbox up front, the MLflow run, the core over the pending tasks, the summary."""
    t0 = time.perf_counter()
    settings = settings_from(cfg)
    apply_offline(settings.offline)
    tasks = load_tasks(settings.dataset)
    # Build model and sandbox before any task starts, so a missing key or model is one error up front
    # (not for dask: the model lives in the worker processes, possibly on other machines).
    if settings.runner.get("name", "threads") != "dask":
        model_and_sandbox(settings)
    check_runner(settings.runner)
    tracker = RunTracker(settings.tracking)
    run_id, resume = open_run(tracker, settings)
    store = core.TaskStore(tracker.store_dir, run_id)
    jobs, done = core.pending(tasks, settings.samples, store, bool(resume))
    print(f"fixlab: {len(tasks)} tasks x {settings.samples} sample(s), {len(jobs)} to run, model={settings.model['name']} "
          f"strategy={settings.agent.strategy} iters={settings.agent.iters} run_id={run_id}", file=sys.stderr, flush=True)
    progress = Progress(len(tasks) * settings.samples, len(done), sum(t.passed for t in done.values()))

    def on_done(traj: Trajectory) -> None:
        progress(traj)
        try:
            tracker.log_task(traj.to_dict())
        except Exception as e:  # the local state file already holds it; the final upload retries
            print(f"fixlab: could not log {traj.task_id} to MLflow now ({e}); it is kept for the final upload",
                  file=sys.stderr)

    status = "FAILED"
    _Stop.mark_killed = lambda: tracker.client.set_terminated(run_id, status="KILLED")
    try:
        if jobs:
            ensure_prefect_api()  # a temporary server that dies with the job, unless PREFECT_API_URL is set
            run_jobs(jobs, settings, lambda traj: core.keep(store, traj, on_done))
        trajs = store.load_all()
        summary = core.summarize(trajs, tasks, settings.samples, settings.agent.iters)
        summary.update(run_id=run_id, wall_s=round(time.perf_counter() - t0, 2), model=settings.model["name"],
                       strategy=settings.agent.strategy, protocol=settings.agent.protocol, iters=settings.agent.iters,
                       samples=settings.samples)
        tracker.log_lines(_result_rows(trajs), "results.jsonl")
        # A resumed run (or a failed upload) may lack some tasks' trajectory files and traces: add them.
        tracker.complete_tasks([t.to_dict() for t in trajs])
        tracker.log_results_table([t.to_dict() for t in trajs])
        if settings.stream_applies:  # cut from single_shot's answer stream (flows/stream.py)
            summary["stream"] = {"candidates": settings.stream[0], "answers": settings.stream[1]}
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
        _Stop.mark_killed = None
        if status != "FINISHED":
            try:
                tracker.client.set_terminated(run_id, status=status)
            except Exception:
                pass


def open_run(tracker: RunTracker, settings) -> tuple[str, str | None]:
    """(run id, the run id resumed or None): a new MLflow run, or the one `resume` names (last: the newest
    unfinished one), refused in one line when its config differs in anything that changes answers."""
    resume = settings.resume
    if resume == "last":
        resume = tracker.last_run_id()
        if resume is None:
            raise ConfigError("resume=last: no earlier run in this experiment to resume")
    tags = {"model": settings.model["name"], "strategy": settings.agent.strategy,
            "protocol": settings.agent.protocol, "iters": str(settings.agent.iters)}
    if settings.stream_applies:  # its trajectories are cut from a stream of K answers a round, N in all
        tags["fixlab.stream"] = f"candidates={settings.stream[0]} answers={settings.stream[1]}"
    try:
        return tracker.start(settings.run_name, settings.raw, tags, resume_run_id=resume), resume
    except ConfigError:
        raise
    except Exception as e:
        if resume:
            raise ConfigError(f"resume={resume}: no such MLflow run ({type(e).__name__})") from None
        raise


def _result_rows(trajs: list[Trajectory]):
    for t in sorted(trajs, key=lambda t: (core.task_order(t.task_id), t.sample)):
        yield {
            "task_id": t.task_id, "sample": t.sample, "bug_type": t.bug_type, "passed": t.passed,
            "first_pass_round": t.first_pass_round, "error": t.error, "seconds": t.seconds,
            "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
            "derived_from": t.derived_from,
            # what each round cost: a run's rows give every smaller budget's cost too (flows/frontier.py)
            "attempts": [{"round": a.round, "decision": a.decision, "code": a.code,
                          "status": a.result.status if a.result else None,
                          "test_output": (a.result.stderr[-2000:] if a.result else None),
                          "feedback": a.feedback, "seconds": a.seconds,
                          "prompt_tokens": sum(c.prompt_tokens for c in a.calls),
                          "completion_tokens": sum(c.completion_tokens for c in a.calls),
                          "model_calls": len(a.calls), "sandbox_runs": a.sandbox_runs} for a in t.attempts],
        }


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> float:
    try:
        summary = run_job(OmegaConf.to_container(cfg, resolve=True))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        close_all()
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


class _Stop:
    """How to mark the active run KILLED when a stop cannot wait for the job to unwind (set by run_job)."""

    mark_killed = None
    GRACE_S = 3.0  # tasks in flight (a model call can take minutes) are dropped after this; resume reruns them


def stop_on_signals() -> None:
    """SIGTERM and Ctrl-C stop a job within seconds. The handler raises KeyboardInterrupt, which unwinds the job
    (the run is marked KILLED; `resume=last` continues it). Python runs that handler only when the main thread
    gets back to bytecode, and Prefect can hold it for as long as a task in flight takes (measured: 8 s with
    8 s answers), so the signal also wakes a watcher thread through signal.set_wakeup_fd (written by the C-level
    handler at once): after GRACE_S it marks the run KILLED and leaves. Finished tasks are already on disk."""
    import signal

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    threading.Thread(target=_leave_after_grace, args=(r,), name="fixlab-stop", daemon=True).start()


def _leave_after_grace(fd: int) -> None:
    import signal

    while os.read(fd, 1)[0] not in (signal.SIGTERM, signal.SIGINT):
        pass
    time.sleep(_Stop.GRACE_S)
    try:
        if _Stop.mark_killed is not None:
            _Stop.mark_killed()
        from .sweep import SweepParentRun

        SweepParentRun.mark_stopped()
    except Exception:
        pass
    print("fixlab: stopped; the run is marked KILLED and `resume=last` continues it", file=sys.stderr)
    stop_now(130)


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
    stop_on_signals()
    try:
        main()
    except KeyboardInterrupt:
        print("fixlab: stopped; the run is marked KILLED and `resume=last` continues it", file=sys.stderr)
        stop_now(130)
    finally:
        close_all()
        stop_prefect_api()
