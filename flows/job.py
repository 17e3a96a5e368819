"""One evaluation job as a library function: `run_job(settings, runner)` -> the summary dict.

Settings (flows/config.py) -> this process's model and sandbox (flows/workers.py) -> the MLflow run
(flows/tracking.py) -> the core (flows/core.py: what runs, one repair per task, the summary) mapped by a runner
-> the summary. The runner is flows/prefect_flow.py's by default (Prefect threads or Dask workers); any callable
`runner(jobs, settings, done)` that calls `done(job, outcome)` once per job, as each finishes, will do: the outcome
is the job's Trajectory or the exception it raised, which becomes an error trajectory here and only here.
flows/evaluate.py is the command line around it (Hydra, signals).
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from agents.loop import cost_usd
from agents.tasks import load_tasks
from agents.types import Trajectory

from . import core
from .config import ConfigError, JobSettings, model_prices
from .core import Job
from .mark_killed import OpenRun
from .tracking import RunTracker
from .usage import Usage
from .workers import model_and_sandbox

Outcome = Trajectory | BaseException
# Set by the stop handler (flows/evaluate.py) the moment SIGTERM or Ctrl-C arrives. Whatever ends the job after that
# is the stop's: a task cut short can come back as an error, not an exception, and must not make the run FAILED.
STOPPING = threading.Event()
Runner = Callable[[list[Job], JobSettings, Callable[[Job, Outcome], None]], None]


def run_job(settings: JobSettings, runner: Runner | None = None,
            on_open: Callable[[OpenRun | None], None] | None = None) -> dict:
    """One job: model and sandbox up front, the MLflow run, the runner over the pending tasks, the summary.

    on_open(run) is called once the MLflow run exists, with what a stop that cannot wait for the job to unwind marks
    KILLED (flows/evaluate.py, flows/mark_killed.py), and with None when the job is over."""
    from .prefect_flow import check_runner, run_jobs

    usage = Usage()  # where the job's time went (flows/usage.py); its start is the job's, for wall_s too
    apply_offline(settings.offline)
    tasks, model = _tasks_and_model(settings, prefect_too=runner is None)
    usage.model_ready()
    runner = runner or run_jobs
    check_runner(settings.runner)
    tracker = RunTracker(settings.tracking)
    run_id, resume = open_run(tracker, settings)
    _tag_path(tracker, run_id, model)
    store = core.TaskStore(tracker.store_dir, run_id)
    jobs, done = core.pending(tasks, settings.samples, store, bool(resume))
    print(f"fixlab: {len(tasks)} tasks x {settings.samples} sample(s), {len(jobs)} to run, model={settings.model.name} "
          f"strategy={settings.agent.strategy.name} iters={settings.agent.iters} run_id={run_id}", file=sys.stderr)
    progress = Progress(len(tasks) * settings.samples, len(done), sum(t.passed for t in done.values()),
                        activity=getattr(model, "activity", None))

    def finished(job: Job, outcome: Outcome) -> None:
        task, sample = job
        traj = outcome if isinstance(outcome, Trajectory) else core.error_trajectory(task, sample, settings.agent,
                                                                                     outcome)
        core.keep(store, traj, on_done=lambda t: _report(t, progress, tracker))

    status = "FAILED"
    if on_open:
        on_open(OpenRun(tracker.uri, run_id, tracker.client, tracker.claim_path(run_id)))
    try:
        if jobs:
            runner(jobs, settings, finished)
        if STOPPING.is_set():  # the runner returned with the tasks the stop cut short as errors
            raise KeyboardInterrupt
        trajs = store.load_all()  # read once: the summary, the rows, the MLflow files and the results file share them
        rows, dicts = list(_result_rows(trajs)), [t.to_dict() for t in trajs]
        summary = _summary(tracker, trajs, rows, dicts, tasks, settings, run_id, usage.t0)
        summary.update(_run_extras(settings, summary, bool(resume), usage, model))
        print(f"fixlab: {Usage.line(summary['usage'])}", file=sys.stderr, flush=True)
        status = _status(summary, trajs)
        summary["results_file"] = str(_write_results(tracker, settings, run_id, rows, dicts, summary, status))
        tracker.finish(summary, status)
        return summary
    except BaseException as e:
        # A stop (SIGTERM, Ctrl-C) is KILLED (resume=last continues it); anything else is FAILED.
        status = "KILLED" if stopped(e) else "FAILED"
        raise
    finally:
        progress.close()
        if on_open:
            on_open(None)
        if status != "FINISHED":
            try:
                tracker.client.set_terminated(run_id, status=status)
            except Exception:
                pass


def stopped(e: BaseException) -> bool:
    """Whether `e` is a stop or came out of one: KeyboardInterrupt (flows/evaluate.py's handler raises it for SIGTERM
    too), SystemExit, or Prefect's TerminationSignal (its own SIGTERM handler inside a flow), itself or anywhere in
    what it was raised from or during. An error raised while a stop unwinds (a store or API call cut short: Prefect
    records the crash on its server first) must not make a stopped run FAILED; nor may anything once STOPPING is set."""
    prefect = sys.modules.get("prefect.exceptions")  # not loaded: no TerminationSignal can have been raised
    stops = (KeyboardInterrupt, SystemExit) + ((prefect.TerminationSignal,) if prefect else ())
    if STOPPING.is_set():
        return True
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, stops):
            return True
        e = e.__cause__ or e.__context__
    return False


def _model_up_front(settings: JobSettings, beside=None):
    """Build model and sandbox before any task starts, so a missing key or model is one error up front; None for
    dask (the model lives in the worker processes, possibly on other machines). `beside`: model_and_sandbox."""
    if settings.runner.name == "dask":
        if beside:
            beside()
        return None
    model, _ = model_and_sandbox(settings, beside)
    choice = getattr(model, "choice", None)  # a local model's measured path (serving/paths.py)
    if choice is not None:
        # a recorded parameter: runs that took different paths (different answers) are not one configuration
        settings.raw["serving"] = choice.record()
    else:
        # a server (hosted, OpenAI-compatible) promises no repeat across batches; the doubles and recorded answers have no numerics
        settings.raw["serving"] = {"deterministic": settings.model.backend in ("oracle", "answers")}
    return model


def _tag_path(tracker: RunTracker, run_id: str, model) -> None:
    """Why a local model took its path: the measured figures, as the run's fixlab.path tag."""
    if model is not None and getattr(model, "choice", None) is not None:
        try:
            tracker.client.set_tag(run_id, "fixlab.path", f"{model.choice.label()}: {model.choice.reason}"[:5000])
        except Exception:
            pass


def _report(traj: Trajectory, progress: "Progress", tracker: RunTracker) -> None:
    progress(traj)
    try:
        tracker.log_task(traj.to_dict())
    except Exception as e:  # the local state file already holds it; the final upload retries
        print(f"fixlab: could not log {traj.task_id} to MLflow now ({e}); it is kept for the final upload",
              file=sys.stderr)


def _summary(tracker: RunTracker, trajs: list[Trajectory], rows: list[dict], dicts: list[dict], tasks: list,
             settings: JobSettings, run_id: str, t0: float) -> dict:
    """The job's figures from every kept trajectory (`rows` and `dicts`: their results rows and dicts), and its
    results files logged."""
    summary = core.summarize(trajs, tasks, settings.samples, settings.agent.iters)
    summary.update(run_id=run_id, wall_s=round(time.perf_counter() - t0, 2), model=settings.model.name, strategy=settings.agent.strategy.name, protocol=settings.agent.protocol,
                   iters=settings.agent.iters, samples=settings.samples)
    tracker.log_lines(rows, "results.jsonl")
    # A resumed run (or a failed upload) may lack some tasks' trajectory files and traces: add them.
    tracker.complete_tasks(dicts)
    tracker.log_results_table(dicts)
    return summary


def _write_results(tracker: RunTracker, settings: JobSettings, run_id: str, rows: list[dict], dicts: list[dict],
                   summary: dict, status: str):
    """The job's own results file (flows/analysis/run_record.py's figures, self-describing: flows/results.py), in
    tracking.results, and as the MLflow run's artifact: what flows.frontier and flows.report read, with no read-back
    of the store. Returns its path."""
    import re

    from .analysis.run_record import TEXT, TITLE, run_record
    from .results import git_commit, stamp, write
    from .tracking import machine_name

    params = tracker.client.get_run(run_id).data.params
    commit, dirty = git_commit()
    rec = run_record(run_id, status, params, rows, summary, machine=machine_name(), machine_source="job",
                     git_commit=commit or None, git_dirty=str(dirty) if commit else None, trajectories=dicts,
                     usage=summary.get("usage"))
    folder = Path(settings.tracking.results) if settings.tracking.results else tracker.store_dir / "results"
    name = re.sub(r"[^\w.+-]+", "-", settings.run_name)
    path = write("fullsize", {"command": shlex.join(["python", "-m", "flows.evaluate", *sys.argv[1:]]), "runs": [rec]},
                 title=f"{settings.run_name}: {TITLE}", text=TEXT, out=folder / f"fullsize-{name}-{stamp()}.json",
                 config=params, sweeps=[{"select": {}, "label": settings.run_name}])
    try:
        tracker.client.log_artifact(run_id, str(path))
    except Exception as e:  # the file is written; the store may be busy or gone
        print(f"fixlab: could not attach {path.name} to the MLflow run ({e})", file=sys.stderr)
    print(f"fixlab: results file {path}", file=sys.stderr, flush=True)
    return path


def _tasks_and_model(settings: JobSettings, prefect_too: bool):
    """The tasks and the model, built before the MLflow run opens; with `prefect_too`, Prefect's temporary server
    (flows/prefect_api.py) started beside the model's build (serving.build starts it after a build that first times
    this machine's paths: its start-up on 2 cores would skew those timings)."""
    from .prefect_api import start_prefect_api

    tasks = load_tasks(settings.dataset)
    return tasks, _model_up_front(settings, beside=start_prefect_api if prefect_too else None)


def _status(summary: dict, trajs: list[Trajectory]) -> str:
    """FINISHED, or FAILED (said in one line) where tasks ended in an error (a server that died, a worker lost), not
    an answer: the run stays open, so `resume=last` runs only those again."""
    if not summary.get("errors"):
        return "FINISHED"
    first = next(t for t in trajs if t.error)
    print(f"fixlab: {summary['errors']} of {summary['total']} tasks ended in an error, not an answer (first: "
          f"{first.task_id}: {first.error[:160]}); `resume=last` runs only those again", file=sys.stderr, flush=True)
    return "FAILED"


def _run_extras(settings: JobSettings, summary: dict, resumed: bool, usage: Usage, model) -> dict:
    """What a run's summary says beyond its tasks: the cost at list prices (a local model has none: never $0), the
    answer stream it was cut from, whether it was resumed, and where the job's time went."""
    prices = model_prices(settings.model)
    out = {"cost_usd": None if prices is None else round(
        cost_usd(summary["prompt_tokens"], summary["completion_tokens"], prices), 6)}
    if settings.stream_applies:  # cut from single_shot's answer stream (flows/stream.py)
        out["stream"] = {"candidates": settings.stream[0], "answers": settings.stream[1]}
    if resumed:
        out["resumed"] = True
    out["usage"] = usage.finish(model)
    return out


def open_run(tracker: RunTracker, settings: JobSettings) -> tuple[str, str | None]:
    """(run id, the run id resumed or None): a new MLflow run, or the one `resume` names (last: the newest
    unfinished one), refused in one line when its config differs in anything that changes answers."""
    resume = settings.resume
    if resume == "last":
        resume = tracker.last_run_id()
        if resume is None:
            raise ConfigError("resume=last: no earlier run in this experiment to resume")
    tags = {"model": settings.model.name, "strategy": settings.agent.strategy.name,
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
            "passed_round": t.passed_round, "error": t.error, "seconds": t.seconds,
            # the verdict at each budget: what every reader cuts and scores (passed_round derives from it)
            "passed_by_budget": t.passed_by_budget,
            **({"handed_in": t.handed_in} if t.held_at_end != "hold" else {}),
            "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
            "derived_from": t.derived_from,
            # what each round cost: a run's rows give every smaller budget's cost too (flows/frontier.py)
            "attempts": [{"round": a.round, "decision": a.decision, "code": a.code,
                          "status": a.result.status if a.result else None,
                          "test_output": (a.result.stderr[-2000:] if a.result else None),
                          "feedback": a.feedback, "seconds": a.seconds,
                          "prompt_tokens": sum(c.prompt_tokens for c in a.calls),
                          "completion_tokens": sum(c.completion_tokens for c in a.calls),
                          "reasoning_tokens": sum(c.reasoning_tokens or 0 for c in a.calls),
                          "model_calls": len(a.calls), "sandbox_runs": a.sandbox_runs} for a in t.attempts],
        }


class Progress:
    """One stderr line per finished task: tasks done / total, passes so far, the rate. A job is never silent: while no
    task has ended for `every` seconds, one heartbeat line every `every` seconds (rows in flight, tokens/s over the
    interval, tasks done), from the model's activity() where it has one (serving/engine.py)."""

    def __init__(self, total: int, already: int = 0, passed: int = 0, activity: Callable[[], dict | None] | None = None,
                 every: float = 30.0):
        self.total, self.done, self.passed = total, already, passed
        self.lock = threading.Lock()
        self.t0 = self.last = time.perf_counter()
        self.activity, self.every = activity, every
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="fixlab-heartbeat", daemon=True)
        self._beat.start()

    def close(self) -> None:
        self._stop.set()

    def _probe(self) -> dict | None:
        try:
            return self.activity() if self.activity else None
        except Exception:  # a heartbeat never breaks a job
            return None

    def _heartbeat(self) -> None:
        seen = self._probe()
        while not self._stop.wait(self.every):
            now = self._probe()
            with self.lock:
                quiet = time.perf_counter() - self.last
                done, total = self.done, self.total
            if quiet < self.every:
                seen = now
                continue
            line = f"[{done:>4}/{total}] still working, no task ended for {quiet:.0f} s"
            if now:
                was = seen or now
                rate = (now["tokens"] - was["tokens"]) / self.every
                line += (f": {now['rows']} rows in flight, {now['waiting']} waiting, {rate:.1f} tokens/s decoded over "
                         f"the last {self.every:.0f} s")
                if "prefilled" in now:
                    line += f" ({(now['prefilled'] - was.get('prefilled', now['prefilled'])) / self.every:.0f} prefilled)"
            print(line + f", {done} tasks done", file=sys.stderr, flush=True)
            seen = now

    def __call__(self, traj: Trajectory) -> None:
        with self.lock:
            self.last = time.perf_counter()
            self.done += 1
            self.passed += traj.passed
            verdict = "ERROR" if traj.error else (f"passed@{traj.passed_round}" if traj.passed else "failed") \
                + (" (held answer handed in)" if traj.handed_in else "")
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            print(f"[{self.done:>4}/{self.total}] {traj.task_id:<12} {verdict:<9} passes so far {self.passed}"
                  f"  ({rate * 60:.1f} tasks/min)" + (f"  {traj.error}" if traj.error else ""), file=sys.stderr, flush=True)


def apply_offline(offline) -> bool:
    """Go offline at once when the hub cannot be resolved (here DNS fails at once); else long retries first."""
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
