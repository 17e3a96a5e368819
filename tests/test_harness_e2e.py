"""The whole path (Hydra -> Prefect -> agent -> sandbox -> MLflow) with the oracle test doubles.

canonical must score 164/164 and buggy 0/164: any harness bug (program layout, imports, verdicts) shows.
"""
from __future__ import annotations

import json
import subprocess
import sys

from mlflow.tracking import MlflowClient

from conftest import needs_data


@needs_data
def test_canonical_all_pass_and_buggy_all_fail_through_whole_path(evaluate):
    run = evaluate("model=canonical,buggy", "iters=0", "-m")
    assert run.rc == 0, run.stderr[-3000:]
    by_model = {s["model"]: s for s in run.summaries}
    assert set(by_model) == {"canonical", "buggy"}
    assert by_model["canonical"]["pass@1"] == 1.0
    assert (by_model["canonical"]["passed"], by_model["canonical"]["total"]) == (164, 164)
    assert by_model["buggy"]["pass@1"] == 0.0
    assert (by_model["buggy"]["passed"], by_model["buggy"]["total"]) == (0, 164)
    assert by_model["buggy"]["errors"] == 0

    client = MlflowClient(run.tracking_uri)
    for name, expected in (("canonical", 1.0), ("buggy", 0.0)):
        r = client.get_run(by_model[name]["run_id"])
        assert r.info.status == "FINISHED"
        assert r.data.metrics["pass_at_1"] == expected
        assert r.data.metrics["total"] == 164
        assert r.data.params["model.name"] == name
        assert r.data.tags["model"] == name
        results = client.download_artifacts(r.info.run_id, "results.jsonl", str(evaluate.tmp / name))
        rows = [json.loads(l) for l in open(results)]
        assert len(rows) == 164
        assert sum(row["passed"] for row in rows) == (164 if name == "canonical" else 0)
        assert {"task_id", "bug_type", "passed", "passed_round", "attempts", "seconds"} <= set(rows[0])
    # Looping buggy programs end at their timeout instead of hanging the run.
    rows = [json.loads(l) for l in open(evaluate.tmp / "buggy" / "results.jsonl")]
    statuses = {row["task_id"]: row["attempts"][0]["status"] for row in rows}
    assert statuses["Python/10"] == "timeout"

    # flows.compare puts the sweep's jobs side by side on their common tasks, labelled by what differs.
    parent = client.get_run(by_model["canonical"]["run_id"]).data.tags["mlflow.parentRunId"]
    out = evaluate.tmp / "compare.json"
    p = subprocess.run([sys.executable, "-m", "flows.compare", "--sweep", parent, "--tracking-uri", run.tracking_uri,
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    cmp = json.loads(out.read_text())
    assert cmp["tasks"] == 164
    by_label = {r["label"]: r for r in cmp["runs"]}
    assert by_label["model=canonical"]["pass@1_by_iter"] == [1.0]
    assert by_label["model=buggy"]["pass@1_by_iter"] == [0.0]
    assert by_label["model=buggy"]["decisions"] == {"tested": 164}
    assert "| Python/163 | 0 | - |" in p.stdout  # per-task table: canonical fixed it in round 0, buggy never
    p = subprocess.run([sys.executable, "-m", "flows.compare", "no-such-run", "--tracking-uri", run.tracking_uri],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1


@needs_data
def test_sweep_over_budgets_makes_one_mlflow_run_per_job_with_curve_steps(evaluate):
    run = evaluate("model=buggy", "iters=0,1", "dataset.limit=3", "-m")
    assert run.rc == 0, run.stderr[-3000:]
    summaries = run.summaries
    assert [s["iters"] for s in summaries] == [0, 1]
    assert [len(s["pass@1_by_iter"]) for s in summaries] == [1, 2]
    client = MlflowClient(run.tracking_uri)
    exp = client.get_experiment_by_name("humanevalfix")
    runs = client.search_runs([exp.experiment_id], "tags.`fixlab.kind` = 'job'")
    assert sorted(r.info.run_id for r in runs) == sorted(s["run_id"] for s in summaries)
    # ... all children of the sweep's parent run (flows/sweep.py), which hands each the sweep's largest budget
    assert len({r.data.tags["mlflow.parentRunId"] for r in runs}) == 1
    assert {r.data.params["sweep_ahead_to"] for r in runs} == {"1"}
    steps = client.get_metric_history(summaries[1]["run_id"], "pass_at_1_by_iter")
    assert [m.step for m in steps] == [0, 1]
    arts = {a.path for a in client.list_artifacts(summaries[1]["run_id"], "tasks")}
    assert arts == {"tasks/Python_0.json", "tasks/Python_1.json", "tasks/Python_2.json"}
