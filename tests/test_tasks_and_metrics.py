"""Dataset loading and selection, the pass@k estimator, and the trajectory cache's bookkeeping."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from agents.tasks import DatasetConf, DatasetError, load_tasks
from agents.types import Attempt, Trajectory
from conftest import DATA, needs_data
from flows.stats import pass_at_k, pass_at_k_table


@needs_data
def test_selection_by_limit_and_task_ids():
    assert len(load_tasks(DatasetConf(path=str(DATA)))) == 164
    assert [t.task_id for t in load_tasks(DatasetConf(path=str(DATA), limit=3))] == ["Python/0", "Python/1", "Python/2"]
    got = load_tasks(DatasetConf(path=str(DATA), task_ids=["Python/38", 5]))
    assert [t.task_id for t in got] == ["Python/38", "Python/5"]
    assert "encode_cyclic" in got[0].declaration  # helpers stay with the task
    with pytest.raises(DatasetError, match="Python/999"):
        load_tasks(DatasetConf(path=str(DATA), task_ids=["Python/999"]))
    with pytest.raises(DatasetError, match=r"task_ids=\[\] selects no task"):  # not silently all 164
        load_tasks(DatasetConf(path=str(DATA), task_ids=[]))


@needs_data
def test_parquet_with_hub_schema_loads_like_jsonl(tmp_path):
    rows = [json.loads(l) for l in open(DATA)][:4]
    pd.DataFrame(rows).to_parquet(tmp_path / "hef.parquet")
    got = load_tasks(DatasetConf(path=str(tmp_path / "hef.parquet")))
    assert [t.task_id for t in got] == [r["task_id"] for r in rows]
    assert got[2].buggy_code == rows[2]["declaration"] + rows[2]["buggy_solution"]


def test_offline_without_file_says_how_to_fix(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetError, match="dataset.path"):
        load_tasks(DatasetConf(hub_id="bigcode/humanevalpack", language="python", local_fallback="no/such/file"))


def test_unbiased_pass_at_k_matches_closed_forms():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # 1 - C(n-c, k) / C(n, k) with n=5, c=2, k=2: 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)


def test_pass_at_k_is_the_share_of_k_answer_draws_with_a_pass_and_its_interval_repeats():
    """Direct count: every k-subset of a task's n answers, the share holding a pass, averaged over tasks."""
    from itertools import combinations

    n = 5
    answers = [[True, False, False, True, False], [False] * 5, [True] * 5, [False, False, False, False, True]]
    table = pass_at_k_table([sum(a) for a in answers], n)
    assert sorted(table) == [1, 2, 5]  # only k <= n
    for k, row in table.items():
        direct = sum(sum(any(d) for d in combinations(a, k)) / math.comb(n, k) for a in answers) / len(answers)
        assert row["value"] == pytest.approx(direct)
        lo, hi = row["ci95"]
        assert lo <= row["value"] <= hi and (lo, hi) != (row["value"], row["value"])
    assert pass_at_k_table([sum(a) for a in answers], n) == table  # seeded: the same figures every time


def test_trajectory_round_trips_through_json():
    t = Trajectory(task_id="Python/1", bug_type="value misuse", strategy="reflection", budget=2,
                   attempts=[Attempt(round=0, decision="syntax_error", code="def f(:"), Attempt(round=1, decision="tested")],
                   passed_round=1)
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t
    assert [back.passed_by_round(r) for r in range(3)] == [False, True, True]
