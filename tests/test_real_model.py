"""A real model through the whole path: the smollm2-135m registry pack (installed and converted once,
then cached), strategy=reflection with one feedback round on 2 tasks."""
from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from conftest import needs_data


@pytest.mark.slow
@needs_data
def test_smollm2_pack_reflection_on_two_tasks(evaluate):
    run = evaluate("model=smollm2-135m", "strategy=reflection", "iters=1", "dataset.limit=2",
                   "max_new_tokens=160", timeout=1500)
    assert run.rc == 0, run.stderr[-3000:]
    s = run.summary
    assert s["total"] == 2 and s["model"] == "smollm2-135m"
    assert len(s["pass@1_by_iter"]) == 2
    assert s["completion_tokens"] > 0 and s["errors"] == 0
    client = MlflowClient(run.tracking_uri)
    r = client.get_run(s["run_id"])
    assert r.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(s["run_id"], "pass_at_1_by_iter")] == [0, 1]
    path = client.download_artifacts(s["run_id"], "results.jsonl", str(evaluate.tmp))
    rows = [json.loads(l) for l in open(path)]
    assert [row["task_id"] for row in rows] == ["Python/0", "Python/1"]
    # Every attempt kept the model's answer, and each task spent real tokens.
    assert all(row["completion_tokens"] > 0 for row in rows)
    assert all(a["decision"] for row in rows for a in row["attempts"])
