"""Every strategy and protocol in every language, driven by a scripted model (a test double that replays answers):
the prompt names the language and its fence, a wrong answer is run and its failure comes back as feedback, the fix
passes, and an answer in the wrong shape takes the short path. Then the whole job, through flows.evaluate, in one
language with the oracle doubles, and a sweep over languages under one parent run."""
from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from agents.loop import run_agent
from agents.models.doubles import ScriptedModel
from agents_fixtures import agent
from conftest import REPO, base_env
from lang_fixtures import DATA_DIR

LANGS = ("js", "java", "go", "cpp", "rust")
STRATEGIES = (("single_shot", {"iters": 1}), ("single_shot", {"iters": 1, "answer_format": "line"}),
              ("reflection", {"iters": 1}), ("portfolio", {"iters": 1}), ("react", {"iters": 1, "max_turns": 4}))


@functools.lru_cache(maxsize=None)
def first_task(lang: str):
    from agents.tasks import DatasetConf, load_tasks

    if not (DATA_DIR / f"humanevalfix_{lang}.jsonl").exists():
        pytest.skip(f"no HumanEvalFix data for {lang}")
    return load_tasks(DatasetConf(language=lang, task_ids=["0"]))[0]


@pytest.fixture(scope="module")
def sbx():
    from sandboxes.local import LocalSandbox

    s = LocalSandbox(workers=2)
    yield s
    s.close()


def answer(task, code: str, react: bool = False) -> str:
    block = f"```{task.lang.fence}\n{code.rstrip()}\n```"
    return ("Action: run_tests\n" + block) if react else f"Here is the fix:\n\n{block}\n"


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("strategy,knobs", STRATEGIES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items()))
def test_each_strategy_fixes_a_task_in_each_language(sbx, lang, strategy, knobs):
    task = first_task(lang)
    react = strategy == "react"
    # single_shot's line answers: answer 0 is a whole function; the next is a line answer, which may hold the whole
    # function (read as one)
    outputs = [answer(task, task.buggy_code, react), answer(task, task.fixed_code, react)]
    model = ScriptedModel(outputs + outputs[-1:] * 3)
    traj = run_agent(task, model, sbx, agent(strategy=strategy, **knobs))
    assert traj.error is None, traj.error
    first = model.requests[0].messages
    shown = "\n".join(m["content"] for m in first)
    assert f"```{task.lang.fence}" in shown and task.lang.title in shown
    assert "```python" not in shown and "Python" not in shown
    tested = [a for a in traj.attempts if a.result is not None]
    assert tested[0].result.status in ("failed", "timeout") and tested[0].feedback
    assert traj.passed, [(a.decision, a.result and a.result.status, a.feedback) for a in traj.attempts]


@pytest.mark.parametrize("lang", ("js", "java", "go", "cpp"))
@pytest.mark.parametrize("protocol", ("hidden", "docs"))
def test_the_protocols_show_what_they_say_in_each_language(sbx, lang, protocol):
    task = first_task(lang)
    model = ScriptedModel([answer(task, task.fixed_code)])
    traj = run_agent(task, model, sbx, agent(strategy="single_shot", iters=0, protocol=protocol))
    assert traj.error is None and traj.passed
    shown = model.requests[0].messages[-1]["content"]
    assert task.test.strip() not in shown  # the verdict's test is never shown
    if protocol == "hidden" and task.example_test.strip():
        assert task.example_test.strip() in shown
    a = traj.attempts[0]
    assert a.visible_result is not a.result  # the visible run and the verdict are apart


def test_rust_has_no_visible_test_under_hidden(sbx):
    task = first_task("rust")
    assert task.example_test.strip() == "None"  # all 164 rows: the agent sees no test, its visible run passes at once
    model = ScriptedModel([answer(task, task.buggy_code)])
    traj = run_agent(task, model, sbx, agent(strategy="single_shot", iters=0, protocol="hidden"))
    a = traj.attempts[0]
    assert a.visible_result.passed and a.visible_result.details.get("empty_test")
    assert a.result.status in ("failed", "timeout") and not traj.passed


@pytest.mark.parametrize("lang", LANGS)
def test_an_answer_without_the_entry_point_takes_the_short_path(sbx, lang):
    task = first_task(lang)
    model = ScriptedModel(["I think the comparison is wrong.", answer(task, "int unrelated = 1;\n"),
                           answer(task, task.fixed_code)])
    traj = run_agent(task, model, sbx, agent(strategy="reflection", iters=2))
    assert [a.decision for a in traj.attempts] == ["no_code", "syntax_error", "tested"]
    assert traj.passed


def _job(evaluate, *overrides):
    """A real `python -m flows.evaluate` on the session's Prefect server (conftest's `evaluate`)."""
    flags = [o for o in overrides if o.startswith("-")]  # after the overrides: Hydra's parser wants them last
    return evaluate(*(o for o in overrides if o not in flags), f"tracking.results={evaluate.tmp}/results", *flags,
                    timeout=900)


def test_a_sweep_over_languages_runs_one_job_each_under_a_parent(evaluate):
    first_task("cpp"), first_task("js")
    r = _job(evaluate, "model=canonical", "dataset.language=cpp,js", "dataset.limit=3", "iters=0", "-m")
    assert r.rc == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert sorted((x["passed"], x["total"]) for x in lines) == [(3, 3), (3, 3)]
    import mlflow

    client = mlflow.MlflowClient(evaluate.uri)
    runs = client.search_runs([client.get_experiment_by_name("humanevalfix").experiment_id])
    parents = [x for x in runs if x.data.tags.get("fixlab.kind") == "sweep"]
    jobs = [x for x in runs if x.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and sorted(x.data.params["dataset.language"] for x in jobs) == ["cpp", "js"]
    assert all(x.info.run_name.endswith(("-cpp", "-js")) for x in jobs)


def test_the_buggy_double_passes_nothing_in_a_language_job(evaluate):
    first_task("go")
    r = _job(evaluate, "model=buggy", "dataset.language=go", "dataset.limit=3", "iters=0")
    assert r.rc == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["passed"] == 0 and summary["total"] == 3 and summary["errors"] == 0
