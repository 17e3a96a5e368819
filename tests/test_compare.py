"""flows.compare on a real MLflow store: a finished run (results.jsonl) beside one stopped half-way (only the
per-task trajectories it logged as each task ended)."""
from __future__ import annotations

import json

import mlflow
import pytest

from flows.compare import compare, load_runs, table


def row(task: str, first: int | None, decisions: list[str]) -> dict:
    return {"task_id": task, "sample": 0, "passed": first is not None, "passed_round": first, "error": None,
            "passed_by_budget": [first is not None and r >= first for r in range(max(len(decisions), 1 + (first or 0)))],
            "prompt_tokens": 100, "completion_tokens": 10,
            "attempts": [{"round": r, "decision": d} for r, d in enumerate(decisions)]}


def test_compare_a_finished_run_with_a_stopped_one(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("cmp", artifact_location=(tmp_path / "artifacts").as_uri())
    done = client.create_run(exp)
    for k, v in {"strategy.name": "reflection", "iters": "2", "strategy.history_rounds": "1", "runner.workers": "8"}.items():
        client.log_param(done.info.run_id, k, v)
    rows = [row("Python/0", 0, ["tested"]), row("Python/1", 2, ["tested", "repeat", "tested"]),
            row("Python/2", None, ["tested", "tested", "tested"])]
    client.log_text(done.info.run_id, "\n".join(json.dumps(r) for r in rows) + "\n", "results.jsonl")
    client.log_metric(done.info.run_id, "wall_s", 12.5)
    client.set_terminated(done.info.run_id, "FINISHED")
    stopped = client.create_run(exp)
    for k, v in {"strategy.name": "react", "iters": "2", "strategy.max_turns": "12", "runner.workers": "8"}.items():
        client.log_param(stopped.info.run_id, k, v)
    for r in (row("Python/0", 1, ["tested", "tested"]), row("Python/2", None, ["tested", "tested", "tested"])):
        client.log_dict(stopped.info.run_id, r, f"tasks/{r['task_id'].replace('/', '_')}.json")
    client.set_terminated(stopped.info.run_id, "KILLED")

    result = compare(load_runs(client, [done.info.run_id, stopped.info.run_id]))
    assert result["tasks"] == 2
    finished, unfinished = result["runs"]
    # labelled as the sweep plot labels jobs: the strategy's name speaks for its other knobs
    assert finished["label"] == "strategy=reflection" and unfinished["label"] == "strategy=react (unfinished)"
    assert finished["pass@1_by_iter"] == [0.5, 0.5, 0.5]  # Python/1 is not shared, so it does not count
    assert unfinished["pass@1_by_iter"] == [0.0, 0.5, 0.5] and unfinished["wall_s"] is None
    assert finished["decisions"] == {"tested": 4} and finished["wall_s"] == 12.5
    text = table(result)
    assert "| Python/0 | 0 | 1 |" in text and "Python/2 |" not in text  # only tasks some run fixed

    # A knob that differs between two runs of the same strategy labels them apart.
    again = client.create_run(exp)
    for k, v in {"strategy.name": "reflection", "iters": "2", "strategy.history_rounds": "2", "runner.workers": "8"}.items():
        client.log_param(again.info.run_id, k, v)
    client.log_text(again.info.run_id, json.dumps(row("Python/0", 0, ["tested"])) + "\n", "results.jsonl")
    client.set_terminated(again.info.run_id, "FINISHED")
    labels = [r["label"] for r in compare(load_runs(client, [done.info.run_id, again.info.run_id,
                                                              stopped.info.run_id]))["runs"]]
    assert labels == ["strategy=reflection strategy.history_rounds=1",
                      "strategy=reflection strategy.history_rounds=2", "strategy=react (unfinished)"]


def test_a_run_pairs_against_one_recorded_in_an_earlier_results_file(tmp_path):
    """A results file keeps each task's verdicts, so a later session (whose MLflow store is gone) can still pair a new
    run against the recorded one: only the tasks both have count."""
    from flows import compare as pairing
    from flows.analysis import run_record as fullsize

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("fs", artifact_location=(tmp_path / "artifacts").as_uri())
    ids = []
    for outcomes in ([0, None, None, None], [0, 1, 0, None, 1]):  # the second run has one task more
        run = client.create_run(exp)
        for k, v in {"strategy.name": "single_shot", "iters": "1"}.items():
            client.log_param(run.info.run_id, k, v)
        rows = [row(f"Python/{i}", f, ["tested"]) for i, f in enumerate(outcomes)]
        client.log_text(run.info.run_id, "\n".join(json.dumps(r) for r in rows) + "\n", "results.jsonl")
        client.set_terminated(run.info.run_id, "FINISHED")
        ids.append(run.info.run_id)
    old = tmp_path / "old.json"
    from flows.results import write

    write("fullsize", {"runs": [fullsize.from_mlflow(r) for r in load_runs(client, ids[:1])]}, title="t", out=old)
    assert fullsize.from_mlflow(load_runs(client, ids[:1])[0])["verdicts"] == {
        "Python/0#0": [True], "Python/1#0": [False], "Python/2#0": [False], "Python/3#0": [False]}

    base = pairing.from_file(f"{old}:{ids[0][:8]}")
    new = fullsize.from_mlflow(load_runs(client, ids[1:])[0])
    verdict = pairing.pair_with_earlier(base, new)
    assert (verdict["only_a"], verdict["only_b"], verdict["diff"]) == (2, 0, 0.5)  # Python/4 is not shared
    assert [r["only_a"] for r in verdict["by_round"]] == [1, 2]
    with pytest.raises(pairing.RecordError, match="no single run"):
        pairing.from_file(f"{old}:ffffffff")


def test_runs_of_n_answers_a_task_pair_their_pass_at_k_over_the_shared_tasks(tmp_path):
    """samples=n runs: each run's pass@k with its interval, and each k both runs reach paired task by task."""
    from flows.stats import pass_at_k

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("k", artifact_location=(tmp_path / "artifacts").as_uri())
    passes = {"A": [5, 2, 1, 0], "B": [3, 0, 0, 0]}  # of 5 answers, per task
    ids = []
    for name, counts in passes.items():
        run = client.create_run(exp)
        for k, v in {"strategy.name": "single_shot", "iters": "0", "samples": "5", "temperature": name}.items():
            client.log_param(run.info.run_id, k, v)
        rows = [dict(row(f"Python/{t}", 0 if s < c else None, ["tested"]), sample=s)
                for t, c in enumerate(counts) for s in range(5)]
        client.log_text(run.info.run_id, "\n".join(json.dumps(r) for r in rows) + "\n", "results.jsonl")
        client.set_terminated(run.info.run_id, "FINISHED")
        ids.append(run.info.run_id)
    result = compare(load_runs(client, ids))
    a, b = result["runs"]
    assert a["samples"] == 5 and a["pass@k"][2]["value"] == pytest.approx(sum(pass_at_k(5, c, 2) for c in passes["A"]) / 4)
    lo, hi = a["pass@k"][5]["ci95"]
    assert lo <= a["pass@k"][5]["value"] <= hi
    (pair,) = result["paired"]  # B against A, the first
    by_k = {x["k"]: x for x in pair["pass@k"]}
    assert sorted(by_k) == [2, 5]
    direct = sum(pass_at_k(5, y, 5) - pass_at_k(5, x, 5) for x, y in zip(passes["A"], passes["B"])) / 4
    assert by_k[5]["diff"] == pytest.approx(direct, abs=1e-4) and by_k[5]["ci95"][0] <= direct <= by_k[5]["ci95"][1]
    assert "pass@5: -50.0 points" in table(result)
