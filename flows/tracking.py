"""MLflow records of a job: params, pass@1 and its curve over rounds, per-task trajectories.

Store: sqlite database mlruns/mlflow.db and artifact folder mlruns/artifacts (both git-ignored), so the
UI (`make ui`) and MlflowClient read the same runs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
MLRUNS = REPO_ROOT / "mlruns"


def tracking_uri(tracking: dict) -> str:
    return tracking.get("uri") or f"sqlite:///{MLRUNS / 'mlflow.db'}"


def artifact_root(tracking: dict) -> str:
    return Path(tracking.get("artifacts") or MLRUNS / "artifacts").resolve().as_uri()


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def safe_name(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)


def git_state() -> dict[str, str]:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower()}


class RunTracker:
    """One MLflow run per Hydra job. Thread-safe enough for per-task logging (one file per task)."""

    def __init__(self, tracking: dict):
        import mlflow
        from mlflow.tracking import MlflowClient

        self.mlflow = mlflow
        self.enabled = bool(tracking.get("enabled", True))
        self.uri = tracking_uri(tracking)
        if self.uri.startswith("sqlite:///"):
            Path(self.uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        name = tracking.get("experiment", "humanevalfix")
        exp = self.client.get_experiment_by_name(name)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(
            name, artifact_location=artifact_root(tracking))
        self.run_id: str | None = None
        # Local per-task state (resume) lives beside the artifacts: mlruns/state by default.
        self.store_dir = Path(tracking.get("artifacts") or MLRUNS / "artifacts").resolve().parent

    def start(self, run_name: str, params: dict, tags: dict, resume_run_id: str | None = None) -> str:
        if resume_run_id:
            run = self.client.get_run(resume_run_id)
            self.client.update_run(resume_run_id, status="RUNNING")
            self.run_id = run.info.run_id
            return self.run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={**git_state(), **tags})
        self.run_id = run.info.run_id
        flat = flatten(params)
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        return self.run_id

    def last_run_id(self) -> str | None:
        runs = self.client.search_runs([self.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None

    def log_task(self, traj: dict) -> None:
        self.log_json(traj, f"tasks/{safe_name(traj['task_id'])}.json")

    def log_json(self, obj, artifact_path: str) -> None:
        folder, name = os.path.split(artifact_path)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / name
            p.write_text(json.dumps(obj, indent=1, default=str))
            self.client.log_artifact(self.run_id, str(p), folder or None)

    def log_lines(self, rows: Iterable[dict], artifact_path: str) -> None:
        folder, name = os.path.split(artifact_path)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / name
            p.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
            self.client.log_artifact(self.run_id, str(p), folder or None)

    def finish(self, summary: dict, status: str = "FINISHED") -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        metrics = [Metric("pass_at_1", summary["pass@1"], now, 0)]
        for r, v in enumerate(summary["pass@1_by_iter"]):
            metrics.append(Metric("pass_at_1_by_iter", v, now, r))
        for key in ("passed", "total", "errors", "prompt_tokens", "completion_tokens", "wall_s"):
            metrics.append(Metric(key, float(summary[key]), now, 0))
        for k, v in summary.get("pass@k", {}).items():
            metrics.append(Metric(f"pass_at_{k}", v, now, 0))
        for bug_type, v in summary.get("pass@1_by_bug_type", {}).items():
            metrics.append(Metric("pass_at_1_" + re.sub(r"\W+", "_", bug_type), v, now, 0))
        self.client.log_batch(self.run_id, metrics=metrics)
        self.log_json(summary, "summary.json")
        self.client.set_terminated(self.run_id, status=status)
