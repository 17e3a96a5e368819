"""A budget sweep reuses work: every job of `iters=0,1,2 -m` equals the prefix of one `iters=2` run.

Real model (smollm2-135m pack), real cache on disk: job k continues job k-1's cached trajectories, and a
later single run with a smaller budget cuts the cached longer ones.
"""
from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from conftest import needs_data

# float32: the single run and the sweep batch their 2 tasks' requests differently, and only float32 makes a row's
# answer independent of its batch (dtype auto may pick bf16 on CPUs with bf16 instructions).
COMMON = ("model=smollm2-135m", "model.dtype=float32", "strategy=reflection", "dataset.limit=2", "max_new_tokens=48")


def _rows(run, run_id, dest):
    path = MlflowClient(run.tracking_uri).download_artifacts(run_id, "results.jsonl", str(dest))
    return {r["task_id"]: [(a["round"], a["decision"], a["code"], a["status"]) for a in r["attempts"]]
            for r in map(json.loads, open(path))}


@pytest.mark.slow
@needs_data
@pytest.mark.timeout(1800)
def test_sweep_equals_single_run_and_reuses_cached_rounds(evaluate, tmp_path):
    single = evaluate(*COMMON, "iters=2", "cache=false", timeout=1500)
    assert single.rc == 0, single.stderr[-3000:]
    curve = single.summary["pass@1_by_iter"]
    ref = _rows(single, single.summary["run_id"], tmp_path / "single")

    sweep = evaluate(*COMMON, "iters=0,1,2", "-m", timeout=1500)
    assert sweep.rc == 0, sweep.stderr[-3000:]
    jobs = sweep.summaries
    assert [j["iters"] for j in jobs] == [0, 1, 2]
    for j in jobs:
        assert j["pass@1_by_iter"] == curve[: j["iters"] + 1]
        got = _rows(sweep, j["run_id"], tmp_path / f"sweep{j['iters']}")
        # Same rounds, same code, same verdicts as the single run, cut to this budget.
        assert got == {t: [a for a in atts if a[0] <= j["iters"]] for t, atts in ref.items()}
    cache_dirs = [p for p in (evaluate.tmp / "trajectories").iterdir() if p.is_dir()]
    assert len(cache_dirs) == 1, "one cache key for all budgets of one sweep"
    assert len(list(cache_dirs[0].glob("*__s0.json"))) == 2

    # A smaller budget afterwards is cut from the cache: same figures as job 0, no model call needed.
    again = evaluate(*COMMON, "iters=0", timeout=600)
    assert again.rc == 0, again.stderr[-3000:]
    assert again.summary["pass@1_by_iter"] == curve[:1]
    assert _rows(again, again.summary["run_id"], tmp_path / "again") == \
        {t: [a for a in atts if a[0] == 0] for t, atts in ref.items()}
