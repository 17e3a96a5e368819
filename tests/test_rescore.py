"""flows.rescore: answers judged again by today's sandbox, with no model asked (issue #71).

Answer files in the three formats (bigcode-evaluation-harness's generations, EvalPlus samples, fixlab's results.jsonl)
each carry every task's canonical fix as answer 0 and its buggy code as answer 1: all 164 must pass and none fail the
other way. A recorded run is judged again attempt by attempt, and a verdict the store got wrong shows up as one."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agents.tasks import DatasetConf, load_tasks

from conftest import REPO, base_env, needs_data

pytestmark = needs_data


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(DatasetConf(language="python"))


@pytest.fixture
def rescore(tmp_path):
    """flows.rescore in this process against a throwaway store; its sandboxes closed afterwards."""
    from flows import rescore as module
    from flows.workers import close_all

    store = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifacts={tmp_path}/artifacts"]

    def run(*args: str) -> dict:
        return module.rescore([*args, *store])

    yield run
    close_all()


def verdicts(summary: dict, tmp_path) -> dict[int, int]:
    """Passes per answer index (sample), read back from the new run's task store."""
    from flows.core import TaskStore

    out: dict[int, int] = {}
    for t in TaskStore(tmp_path, summary["run_id"]).load_all():
        out[t.sample] = out.get(t.sample, 0) + t.passed
    return out


def test_canonical_and_buggy_answers_score_164_and_0_in_each_format(tasks, rescore, tmp_path):
    from flows.core import TaskStore
    from flows.job import _result_rows

    bigcode = tmp_path / "generations.json"
    bigcode.write_text(json.dumps([[t.fixed_code, t.buggy_code] for t in tasks]))
    evalplus = tmp_path / "samples.jsonl"  # the fix as a whole function, the bug as a body after the declaration
    evalplus.write_text("".join(json.dumps({"task_id": t.task_id, "solution": t.fixed_code}) + "\n"
                                + json.dumps({"task_id": t.task_id, "completion": t.buggy_solution}) + "\n"
                                for t in tasks))
    fixlab = tmp_path / "results.jsonl"  # the rows a job writes (flows/job.py), as its MLflow artifact holds them

    for path in (bigcode, evalplus, fixlab):
        summary = rescore("--answers", str(path))
        if path is bigcode:  # its trajectories, as a job's results.jsonl keeps them, are the fixlab file
            trajs = TaskStore(tmp_path, summary["run_id"]).load_all()
            fixlab.write_text("".join(json.dumps(r) + "\n" for r in _result_rows(trajs)))
        assert summary["total"] == 164 and summary["errors"] == 0, path.name
        assert verdicts(summary, tmp_path) == {0: 164, 1: 0}, path.name
        assert summary["pass@1"] == 0.5 and summary["pass@k"] == {1: 0.5, 2: 1.0}, path.name
        assert summary["pass@k_ci95"][2] == [1.0, 1.0]
    # the results.jsonl's recorded verdicts (a buggy loop's timeout too) agree with today's on every attempt
    assert summary["agreement"]["attempts"] == 328 and summary["agreement"]["attempts_differ"] == []


def test_a_recorded_run_is_judged_again_and_a_wrong_stored_verdict_shows(evaluate, rescore, tmp_path):
    run = evaluate("model=buggy", "iters=1", "dataset.limit=3")
    assert run.rc == 0, run.stderr[-2000:]
    old = run.summary["run_id"]
    summary = rescore(old)  # the fixtures share one store
    agreement = summary["agreement"]
    assert agreement["tasks"] == 3 and agreement["attempts"] == 3 and agreement["attempts_differ"] == []
    assert summary["iters"] == 1 and summary["pass@1_by_iter"] == [0.0, 0.0]
    assert summary["model"] == "rescored-buggy"

    # A store that recorded a pass the program never earned: the rescore names the attempt and the task.
    store = evaluate.tmp / "state" / old / "tasks"
    path = sorted(store.glob("*.json"))[0]
    traj = json.loads(path.read_text())
    traj["attempts"][0]["result"]["status"] = "passed"
    traj["passed_round"] = 0
    path.write_text(json.dumps(traj))
    again = rescore(old)["agreement"]
    assert again["attempts_differ"] == [f"{traj['task_id']}#0 round 0: passed -> failed"]
    assert (again["old_passed"], again["new_passed"], again["paired"]["old_only"]) == (1, 0, 1)


def test_bad_answers_are_one_line_naming_the_row_and_the_fix(tasks, rescore, tmp_path):
    from flows.rescore import RescoreError

    cases = {
        "torn.jsonl": ('{"task_id": "Python/0", "solution": "x"}\n{"task_id": \n', "line 2 is not JSON"),
        "unknown.jsonl": ('{"task_id": "Python/999", "solution": "x"}\n', "task Python/999 is not a task of"),
        "neither.jsonl": ('{"task_id": "Python/0", "answer": "x"}\n', "line 1 is neither an EvalPlus sample"),
        "short.json": (json.dumps([["x"]] * 10), "10 task lists for a dataset of 164 tasks"),
        "ragged.json": (json.dumps([["x"]] * 163 + [[]]), "task Python/163 has 0 answer(s) where others have 1"),
        "nested.json": (json.dumps([["x"], "y"]), "entry 1 is not a list of strings"),
    }
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(RescoreError, match=said.replace("(", r"\(").replace(")", r"\)")) as e:
            rescore("--answers", str(tmp_path / name))
        assert "\n" not in str(e.value)
    # the command line: exit 2 and one line; and a job may not ask the answers' stand-in model
    for cmd in (["flows.rescore", "--answers", str(tmp_path / "unknown.jsonl")], ["flows.rescore"],
                ["flows.evaluate", "model=answers"]):
        p = subprocess.run([sys.executable, "-m", *cmd], cwd=REPO, env=base_env(tmp_path), capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and p.stderr.startswith("error: "), p.stderr
