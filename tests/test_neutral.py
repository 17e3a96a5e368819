"""Result-neutral settings, marked on the config records' fields: speed knobs keep the trajectory cache key,
answer-changing ones do not, and every user of the derived keys agrees (cache, sweep labels, resume, nightly,
frontier), through one config_diff."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from agents.config import AgentConfig, SingleShotConf
from agents.models.config import TransformersModelConf
from flows.cache import TrajectoryCache
from flows.result_neutral import neutral_keys, result_neutral
from flows.result_neutral import config_diff
from flows.schema import GROUPS
from sandboxes.config import LocalSandboxConf

MODEL = {"name": "m", "pack": "qwen1.5b-coder-q4", "dtype": "float32"}


def key(tmp_path, model=None, sandbox=None, agent=None) -> str:
    return TrajectoryCache(tmp_path, TransformersModelConf(**{**MODEL, **(model or {})}),
                           agent or AgentConfig(SingleShotConf()), LocalSandboxConf(**(sandbox or {}))).key


def test_speed_knobs_keep_the_cache_key(tmp_path):
    base = key(tmp_path)
    for change in ({"threads": 2}, {"max_batch": 4}, {"prefix_cache_mib": 0}, {"draft_tokens": 0},
                   {"batching": False}, {"kv_cache_mib": 1536}):
        assert key(tmp_path, model=change) == base, change
    assert key(tmp_path, sandbox={"workers": 1, "mode": "fresh"}) == base


def test_what_changes_answers_changes_the_cache_key(tmp_path):
    base = key(tmp_path)
    assert key(tmp_path, model={"dtype": "bfloat16"}) != base
    assert key(tmp_path, model={"pack": "qwen0.5b-coder-q4"}) != base
    assert key(tmp_path, sandbox={"timeout_s": 5}) != base
    assert key(tmp_path, agent=AgentConfig(SingleShotConf(), temperature=0.5)) != base
    assert key(tmp_path, agent=AgentConfig(SingleShotConf(candidates=2))) != base


def test_dtype_auto_is_keyed_by_what_it_resolves_to(tmp_path, monkeypatch):
    import serving.devices as devices
    import serving.native as native

    keys = {}
    for kernels in (True, False):  # fixlab's compiled kernels: float32, whose answers repeat; else bf16 if native
        monkeypatch.setattr(native, "available", lambda kernels=kernels: kernels)
        for bf16 in (True, False):
            monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda bf16=bf16: bf16)
            keys[kernels, bf16] = key(tmp_path, model={"dtype": "auto", "device": "cpu"})
    fp32 = key(tmp_path, model={"dtype": "float32", "device": "cpu"})
    assert keys[True, True] == keys[True, False] == keys[False, False] == fp32
    assert keys[False, True] == key(tmp_path, model={"dtype": "bfloat16", "device": "cpu"})


def test_sweep_labels_name_jobs_by_what_changes_answers():
    from flows.sweep import job_labels

    def run(rid, **params):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, run_name=rid), data=SimpleNamespace(params=params))

    jobs = [run("a", **{"strategy.name": "reflection", "model.threads": "1", "runner.workers": "8"}),
            run("b", **{"strategy.name": "react", "model.threads": "2", "runner.workers": "16"})]
    assert job_labels(jobs) == {"a": "strategy=reflection", "b": "strategy=react"}
    speed_only = [run("a", **{"model.threads": "1"}), run("b", **{"model.threads": "2"})]
    assert job_labels(speed_only) == {"a": "model.threads=1", "b": "model.threads=2"}
    assert result_neutral("runner.workers") and result_neutral("model.draft_tokens")
    assert not result_neutral("model.dtype") and not result_neutral("cache_dirt")


def test_neutral_keys_come_from_the_records():
    keys = neutral_keys()
    # the groups marked on the job record's fields, the job's own, each backend's, and the recorded serving path
    for k in ("runner.", "tracking.", "nightly.", "resume", "cache", "cache_dir", "sweep_ahead", "sweep_ahead_to",
              "sweep_stream", "offline", "model.threads", "model.max_batch", "model.slots", "model.max_concurrency", "model.delay_s", "sandbox.workers", "sandbox.mode",
              "sandbox.uid_base", "sandbox.cgroup_parent", "serving.int8_kernel"):
        assert k in keys and keys[k], k
    assert result_neutral("tracking.uri") and result_neutral("nightly.tolerance")
    for k in ("model.int8_skip", "model.kv_dtype", "model.cpu_attention", "model.weights", "serving.weights",
              "serving.dtype", "serving.runtime", "sandbox.timeout_s", "strategy.candidates", "iters", "seed",
              "dataset.limit"):
        assert not result_neutral(k), k
    # a flattened key cannot tell the backend: a field name neutral in one record of a group is so in all that have it
    for group, (_, records) in GROUPS.items():
        marks: dict[str, set[bool]] = {}
        for r in records.values():
            for f in dataclasses.fields(r):
                marks.setdefault(f.name, set()).add("neutral" in f.metadata)
        assert [f"{group}.{n}" for n, m in marks.items() if len(m) > 1] == []


def test_config_diff_is_the_one_question_and_reads_no_older_shape():
    from flows.sweep import job_labels

    a = {"strategy.name": "reflection", "iters": "1", "model.threads": "2", "sandbox.timeout_s": "10"}
    # speed knobs are no difference, a whole number is one value, an answer-changing knob is
    assert config_diff(a, {**a, "model.threads": "4", "sandbox.timeout_s": "10.0"}) == []
    assert config_diff(a, {**a, "iters": "2"}) == ["iters"]
    # a knob only one run's options have: no difference at its default, one away from it; a knob no option has any
    # more differs whatever its value (results files were migrated once to drop them: results schema 2)
    ss = {"strategy.name": "single_shot", "iters": "1"}
    assert config_diff(a, {**a, "strategy.history_rounds": "1"}) == []
    assert config_diff(a, {**a, "strategy.history_rounds": "3"}) == ["strategy.history_rounds"]
    assert config_diff(ss, {**ss, "strategy.self_tests": "4"}) == ["strategy.self_tests"]
    assert config_diff(a, {**a, "strategy.few_shot": "0"}) == ["strategy.few_shot"]

    def run(rid, **params):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, run_name=rid), data=SimpleNamespace(params=params))

    jobs = [run("a", **{"strategy.name": "reflection", "model.threads": "1", "iters": "1"}),
            run("b", **{"strategy.name": "reflection", "model.threads": "2", "iters": "2"})]
    assert job_labels(jobs) == {"a": "iters=1", "b": "iters=2"}


def test_nightly_diff_skips_neutral_keys(monkeypatch):
    import flows.nightly as nightly

    monkeypatch.setattr(nightly, "_results", lambda client, run_id: {"Python/0": {"passed": True, "error": None}})

    def run(rid, **params):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, run_name=rid, start_time=0),
                               data=SimpleNamespace(params=params, metrics={"pass_at_1": 1.0}, tags={}))

    base = run("b", **{"iters": "1", "model.threads": "2", "nightly.tolerance": "0.02"})
    cur = run("c", **{"iters": "2", "model.threads": "4", "nightly.tolerance": "0.05"})
    report = nightly.compare(None, cur, base, 0.02, [])
    assert report["config_changes"] == {"iters": ["1", "2"]}


