"""MLflow records of a job: params, pass@1 and its curve over rounds, per-task trajectories and traces.

Store: sqlite database mlruns/mlflow.db and artifact folder mlruns/artifacts (both git-ignored), so the
UI (`make ui`) and MlflowClient read the same runs. Per run: tags (model, strategy, protocol, git commit,
dirty tree), params (the whole resolved config), metrics (pass@1, its curve over rounds, pass@1 per bug
type, tokens, wall time), artifacts (summary.json, results.jsonl, results_table.json, tasks/<id>.json)
and one MLflow trace per task (Traces tab: each model call and each sandbox run as a span).

The store itself (URIs, drivers, probe, the cross-process lock many jobs share) is flows/tracking_store.py; the traces
are built in flows/traces.py. Both are re-exported here, where the rest of fixlab imports them from. Traces are
exported synchronously and read back (run link, span count), so a failed write is retried, never left half-logged.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from .config import ConfigError
from .core import safe_name, task_order
from .result_neutral import config_diff
from .schema import TrackingConf
from .traces import flush_traces, log_trace, logged_trace_keys, verdict
from .tracking_store import (DRIVERS, MLRUNS, STORE_LOCK_POLL_S, STORE_LOCK_WAIT_S, artifact_root, brief_store_waits,
                             get_or_create_experiment, open_client, probe, sqlite_path, store_lock, tracking_uri)

__all__ = ["DRIVERS", "MLRUNS", "PARENT_ENV", "REPO_ROOT", "STORE_LOCK_POLL_S", "STORE_LOCK_WAIT_S", "RunTracker",
           "artifact_root", "brief_store_waits", "flatten", "flush_traces", "get_or_create_experiment", "git_state",
           "log_trace", "logged_trace_keys", "machine_name", "open_client", "probe", "sqlite_path", "store_lock",
           "tracking_uri", "verdict"]

REPO_ROOT = Path(__file__).resolve().parent.parent
# Set by the sweep callback (flows/sweep.py): every job of a Hydra multirun becomes a child of this run.
PARENT_ENV = "FIXLAB_PARENT_RUN_ID"


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def git_state() -> dict[str, str]:
    from .results import git_commit

    commit, dirty = git_commit(REPO_ROOT)
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower()}


def machine_name() -> str:
    """The kind of machine a run ran on, e.g. "AMD EPYC, 2 cores" (+ the GPU where one is visible): wall times
    compare only between runs on the same kind (flows/frontier.py)."""
    import shutil

    from serving import cpu_info, isa_family

    c = cpu_info()
    name = f"{c['model']}, {c['cores']} cores, {isa_family(c)}"
    if shutil.which("nvidia-smi"):
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=10).stdout.split("\n")
            gpus = [g.strip() for g in gpus if g.strip()]
            if gpus:
                name += f", {len(gpus)}x {gpus[0]}"
        except (OSError, subprocess.SubprocessError):
            pass
    return name


class RunTracker:
    """One MLflow run per Hydra job. Thread-safe enough for per-task logging (one file per task)."""

    def __init__(self, tracking: TrackingConf):
        import mlflow

        self.mlflow = mlflow
        self.uri = tracking_uri(tracking)
        self.client = open_client(self.uri)
        mlflow.set_tracking_uri(self.uri)
        db = sqlite_path(self.uri)
        self.experiment_id = get_or_create_experiment(self.client, tracking.experiment,
                                                      artifact_root(tracking), store_lock(db) if db else None)
        self.run_id: str | None = None
        # Local per-task state (resume) lives beside the artifacts: mlruns/state by default.
        self.store_dir = Path(tracking.artifacts or MLRUNS / "artifacts").resolve().parent
        self._claim = None

    def start(self, run_name: str, params: dict, tags: dict, resume_run_id: str | None = None) -> str:
        if resume_run_id:
            return self._resume(resume_run_id, params)
        tags = {**git_state(), "fixlab.kind": "job", "fixlab.machine": machine_name(), **tags}
        if os.environ.get(PARENT_ENV):
            tags["mlflow.parentRunId"] = os.environ[PARENT_ENV]
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        self._claim_run(self.run_id)
        flat = flatten(params)
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        return self.run_id

    def _resume(self, run_id: str, params: dict) -> str:
        """Continue an earlier run: same MLflow run, only if its config matches (else results would mix)."""
        run = self.client.get_run(run_id)
        if run.info.experiment_id != self.experiment_id:
            raise ConfigError(f"resume={run_id}: that run belongs to another experiment")
        if run.data.tags.get("fixlab.kind", "job") != "job":
            raise ConfigError(f"resume={run_id}: that is a {run.data.tags['fixlab.kind']} run, not an evaluation job")
        old, new = dict(run.data.params), {k[:250]: v[:6000] for k, v in flatten(params).items()}
        diff = config_diff(old, new)
        if diff:
            k = diff[0]
            raise ConfigError(f"resume={run_id}: config differs from that run's at {k} "
                              f"({old.get(k)!r} there, {new.get(k)!r} now); resume with the same settings")
        if not self._claim_run(run_id):
            raise ConfigError(f"resume={run_id}: that run is still going in another job; wait for it to end "
                              f"(or stop it) and resume then")
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "fixlab.resumed", str(int(run.data.tags.get("fixlab.resumed", "0")) + 1))
        self.run_id = run_id
        return run_id

    def last_run_id(self) -> str | None:
        """The newest evaluation job of this experiment that did not finish and that no live job is still working
        on (what resume=last continues)."""
        runs = self.client.search_runs([self.experiment_id], "attributes.status != 'FINISHED'",
                                       order_by=["attributes.start_time DESC"], max_results=50)
        runs = [r for r in runs if r.data.tags.get("fixlab.kind", "job") == "job" and not self.run_is_live(r.info.run_id)]
        return runs[0].info.run_id if runs else None

    # A job holds its run's lock, state/<run id>/job.lock, while it works on the run (the kernel drops it when the
    # process ends, however it ends): two jobs on one run would run and log every task twice.
    def claim_path(self, run_id: str) -> str:
        return str(self.store_dir / "state" / run_id / "job.lock")

    def _run_lock(self, run_id: str):
        from filelock import FileLock

        return FileLock(self.claim_path(run_id), thread_local=False)

    def _claim_run(self, run_id: str, wait_s: float = 2.0) -> bool:
        from filelock import Timeout

        (self.store_dir / "state" / run_id).mkdir(parents=True, exist_ok=True)
        lock = self._run_lock(run_id)
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            return False
        self.release_run()
        self._claim = lock
        return True

    def run_is_live(self, run_id: str) -> bool:
        """Whether some job holds this run now."""
        from filelock import Timeout

        if self._claim is not None and self.run_id == run_id:
            return True
        if not (self.store_dir / "state" / run_id).is_dir():
            return False
        lock = self._run_lock(run_id)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return True
        lock.release()
        return False

    def release_run(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def log_task(self, traj: dict) -> None:
        self.log_json(traj, f"tasks/{safe_name(traj['task_id'])}.json")
        self.log_trace(traj)

    TRACE_TRIES = 4

    def log_trace(self, traj: dict) -> str:
        """Log the task's trace and read it back: linked to this run, every span there. A trace that is not (a write
        that failed under load) is deleted and logged again, so none is left half-written or without its run."""
        for attempt in range(self.TRACE_TRIES):
            tid, spans = log_trace(self.client, self.experiment_id, self.run_id, traj)
            flush_traces()
            problem = self._trace_problem(tid, spans)
            if problem is None:
                return tid
            try:
                self.client.delete_traces(self.experiment_id, trace_ids=[tid])
            except Exception:
                pass  # not there at all
            if attempt + 1 < self.TRACE_TRIES:
                time.sleep(0.5 * 2 ** attempt)
        raise RuntimeError(f"the trace of {traj['task_id']} did not reach MLflow intact after "
                           f"{self.TRACE_TRIES} tries ({problem})")

    def _trace_problem(self, tid: str, spans: int) -> str | None:
        try:
            trace = self.client.get_trace(tid, display=False)
        except Exception as e:
            return f"not found: {type(e).__name__}"
        if trace.info.trace_metadata.get("mlflow.sourceRun") != self.run_id:
            return "not linked to its run"
        if len(trace.data.spans) != spans:
            return f"{len(trace.data.spans)} of {spans} spans"
        return None

    def complete_tasks(self, trajs: list[dict]) -> int:
        """Log the trajectories and traces that are not in MLflow yet (a kill between a task's state file
        and its upload, or an upload that failed). Returns how many were added."""
        have_files = {a.path for a in self.client.list_artifacts(self.run_id, "tasks")}
        have_traces = logged_trace_keys(self.experiment_id, self.run_id)
        added = 0
        for t in trajs:
            if f"tasks/{safe_name(t['task_id'])}.json" not in have_files:
                self.log_json(t, f"tasks/{safe_name(t['task_id'])}.json")
            if (t["task_id"], str(t.get("sample", 0))) not in have_traces:
                self.log_trace(t)
                added += 1
        return added

    def log_results_table(self, trajs: list[dict]) -> None:
        """One row per task (and sample): what a person sorts and filters in the run's Artifacts view."""
        rows = sorted(trajs, key=lambda t: (task_order(t["task_id"]), t.get("sample", 0)))
        cols = {"task_id": [], "sample": [], "bug_type": [], "verdict": [], "passed_round": [],
                "rounds": [], "prompt_tokens": [], "completion_tokens": [], "seconds": []}
        for t in rows:
            cols["task_id"].append(t["task_id"])
            cols["sample"].append(t.get("sample", 0))
            cols["bug_type"].append(t["bug_type"])
            cols["verdict"].append(verdict(t))
            # -1 = never passed (the table viewer shows None as an empty cell that sorts badly)
            cols["passed_round"].append(-1 if t.get("passed_round") is None else t["passed_round"])
            cols["rounds"].append(len(t.get("attempts", [])))
            cols["prompt_tokens"].append(t.get("prompt_tokens", 0))
            cols["completion_tokens"].append(t.get("completion_tokens", 0))
            cols["seconds"].append(round(float(t.get("seconds", 0.0)), 3))
        self.client.log_table(self.run_id, data=cols, artifact_file="results_table.json")

    def log_json(self, obj, artifact_path: str) -> None:
        # log_text, not log_dict: trajectories hold values json.dumps needs default=str for
        self.client.log_text(self.run_id, json.dumps(obj, indent=1, default=str), artifact_path)

    def log_lines(self, rows: Iterable[dict], artifact_path: str) -> None:
        self.client.log_text(self.run_id, "".join(json.dumps(r, default=str) + "\n" for r in rows), artifact_path)

    def finish(self, summary: dict, status: str = "FINISHED") -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        metrics = [Metric("pass_at_1", summary["pass@1"], now, 0)]
        for r, v in enumerate(summary["pass@1_by_iter"]):
            metrics.append(Metric("pass_at_1_by_iter", v, now, r))
        for key in ("passed", "total", "errors", "prompt_tokens", "prefill_tokens", "completion_tokens", "reasoning_tokens", "model_calls",
                    "sandbox_runs", "length_stops", "draft_tokens", "draft_accepted", "suspicious", "wall_s", "cost_usd"):
            if summary.get(key) is not None:  # cost_usd is None for a model without prices: no metric, not $0
                metrics.append(Metric(key, float(summary[key]), now, 0))
        if "pass@1_ci95" in summary:
            metrics += [Metric("pass_at_1_ci_low", summary["pass@1_ci95"][0], now, 0),
                        Metric("pass_at_1_ci_high", summary["pass@1_ci95"][1], now, 0)]
        for r, (lo, hi) in enumerate(summary.get("pass@1_ci95_by_iter", [])):
            metrics += [Metric("pass_at_1_by_iter_ci_low", lo, now, r), Metric("pass_at_1_by_iter_ci_high", hi, now, r)]
        for k, v in summary.get("pass@k", {}).items():
            metrics.append(Metric(f"pass_at_{k}", v, now, 0))
            if k in summary.get("pass@k_ci95", {}):  # its bootstrap interval over tasks (flows/stats.py)
                lo, hi = summary["pass@k_ci95"][k]
                metrics += [Metric(f"pass_at_{k}_ci_low", lo, now, 0), Metric(f"pass_at_{k}_ci_high", hi, now, 0)]
        for bug_type, v in summary.get("pass@1_by_bug_type", {}).items():
            metrics.append(Metric("pass_at_1_" + re.sub(r"\W+", "_", bug_type), v, now, 0))
        self.client.log_batch(self.run_id, metrics=metrics)
        self.log_json(summary, "summary.json")
        flush_traces()
        self.client.set_terminated(self.run_id, status=status)
        self.release_run()


if __name__ == "__main__":
    # `python -m flows.tracking init-store [URI]` (`make ui` runs it first): create the store under the store lock,
    # so a server opening a fresh store cannot run its migrations at the same moment as a job starting beside it.
    if len(sys.argv) < 2 or sys.argv[1] != "init-store":
        sys.exit("usage: python -m flows.tracking init-store [TRACKING_URI]")
    open_client(sys.argv[2] if len(sys.argv) > 2 else tracking_uri(TrackingConf()))
