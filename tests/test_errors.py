"""Bad input gets one clear line on stderr and a non-zero exit, never a traceback wall."""
from __future__ import annotations

import json


from conftest import needs_data


def _one_line_error(run, *words):
    assert run.rc != 0
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    lines = [l for l in run.stderr.strip().splitlines() if l.startswith("error:")]
    assert len(lines) == 1, run.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_config_value_is_one_line(evaluate):
    _one_line_error(evaluate("model=canonical", "iters=-1"), "iters", ">= 0")
    _one_line_error(evaluate("model=canonical", "protocol=secret"), "protocol", "tests")


def test_wrong_type_of_strategy_knob_is_one_line(evaluate):
    _one_line_error(evaluate("model=canonical", "strategy=reflection", "strategy.history_rounds=abc"),
                    "strategy.history_rounds", "an integer", "'abc'")
    _one_line_error(evaluate("model=canonical", "strategy=reflection", "strategy.rewrite_when_stuck=3"),
                    "strategy.rewrite_when_stuck", "true or false")


def test_unknown_key_is_one_line(evaluate):
    _one_line_error(evaluate("model=canonical", "iterz=3"), "iterz")


def test_missing_dataset_file_is_one_line(evaluate, tmp_path):
    _one_line_error(evaluate("model=canonical", f"dataset.path={tmp_path}/nope.jsonl"), "nope.jsonl", "dataset.path")
    _one_line_error(evaluate("model=canonical", f"dataset.path={tmp_path}"), "dataset.path", "is a directory", ".jsonl")


def test_a_zero_batch_is_one_line(tmp_path):
    import pytest

    from agents.models.config import TransformersModelConf
    from serving import EngineTuning
    from serving.hf import BadModelConfig, TransformersModel

    with pytest.raises(BadModelConfig) as e:
        TransformersModel(TransformersModelConf(name="x", path=str(tmp_path), max_batch=0))
    assert str(e.value) == "model.max_batch must be an integer >= 1, got 0"
    for key in ("max_prefill_tokens", "draft_step_tokens"):  # the engine's own settings (tests and benchmarks set them)
        with pytest.raises(BadModelConfig) as e:
            TransformersModel(TransformersModelConf(name="x", path=str(tmp_path)), tuning=EngineTuning(**{key: 0}))
        assert str(e.value) == f"EngineTuning.{key} must be an integer >= 1, got 0"


@needs_data
def test_malformed_row_names_row_and_field(evaluate, tmp_path):
    from conftest import DATA

    rows = [json.loads(l) for l in open(DATA)][:3]
    del rows[1]["test"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _one_line_error(evaluate("model=canonical", f"dataset.path={bad}"), "Python/1", "row 2", "'test'")
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    _one_line_error(evaluate("model=canonical", f"dataset.path={bad}"), "line 2", "JSON")


def test_react_without_turns_is_one_line(evaluate):
    _one_line_error(evaluate("model=canonical", "strategy=react", "strategy.max_turns=0"), "max_turns", ">= 1")


def test_a_run_that_ends_failed_exits_non_zero(evaluate):
    """Tasks that ended in an error leave the run FAILED (resume=last runs them again): the exit code says so, for a
    script or a scheduler, after the summary line."""
    run = evaluate("model=openai-server", "model.model=qwen", "model.base_url=http://127.0.0.1:1/v1",
                   "model.max_retries=0", "dataset.limit=1", "iters=0")
    assert run.rc == 1, run.stderr[-2000:]
    assert "1 of 1 tasks ended in an error" in run.stderr and "Traceback" not in run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["errors"] == 1
