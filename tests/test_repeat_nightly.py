"""Readings that repeat where users rely on them, with a real model (the SmolLM2 pack in float32 through fixlab's
engine, whose path repeats): two nightly runs of unchanged code flag nothing and differ in no answer."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, base_env, needs_data
from test_repeat_real import _cmd

pytestmark = [pytest.mark.slow, needs_data]


def test_two_nightly_runs_of_unchanged_code_flag_nothing(tmp_path, prefect_api):
    env = base_env(tmp_path)
    env["PREFECT_API_URL"] = prefect_api
    common = ("model=smollm2-135m", "dataset.limit=6", "max_new_tokens=96")  # answers that repeat, cut short
    reports = []
    for extra in ((), ("model.max_batch=2",)):  # the second at another batch limit: a neutral knob
        p = subprocess.run(_cmd(tmp_path, *common, *extra, module="flows.nightly", command=("run",)), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-2000:]
        reports.append(p.stdout)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("humanevalfix-nightly")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and runs[1].data.tags["fixlab.nightly.verdict"] == "ok"
    assert runs[1].data.params["serving.deterministic"] == "True"
    report = json.loads(Path(client.download_artifacts(runs[1].info.run_id, "nightly/regression_report.json",
                                                       str(tmp_path))).read_text())
    assert report["baseline"]["run_id"] == runs[0].info.run_id
    assert report["pass_to_fail"] == [] and report["fail_to_pass"] == [] and report["pass@1_delta"] == 0
    # not only the verdicts: every answer of every task
    states = sorted((tmp_path / "state").iterdir(), key=lambda d: d.stat().st_mtime)
    answers = []
    for d in states:
        trajs = [json.loads(f.read_text()) for f in d.glob("tasks/*.json")]
        answers.append({t["task_id"]: [a.get("code") for a in t["attempts"]] for t in trajs})
    assert len(answers) == 2 and answers[0] == answers[1] and len(answers[0]) == 6
