"""Result-neutral settings, marked on the config records' fields: speed knobs keep the trajectory cache key,
answer-changing ones do not, and every user of the derived keys agrees (cache, sweep labels, resume, nightly,
frontier). Retired knobs at their old default read as absent in old runs."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from agents.config import AgentConfig, SingleShotConf
from agents.models.config import TransformersModelConf
from flows.cache import TrajectoryCache
from flows.neutral import neutral_keys, result_neutral
from flows.schema import GROUPS, RETIRED, without_retired
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
              "sweep_stream", "offline", "model.threads", "model.max_batch", "model.int8_native", "model.int8_kernel",
              "model.slots", "model.max_concurrency", "model.delay_s", "sandbox.workers", "sandbox.mode",
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


def test_retired_knobs_at_their_old_default_read_as_absent():
    from flows.frontier import param_values
    from flows.sweep import job_labels

    old = {"strategy.name": "reflection", "strategy.diagnose": "False", "strategy.few_shot": "0",
           "strategy.show_diff": "False", "strategy.edge_case_hint": "False", "model.int8_fuse": "False"}
    assert without_retired(old) == {"strategy.name": "reflection"}
    assert param_values(old) == {"strategy.name": "reflection", "strategy.answer_format": "function",
                                 "strategy.show_failure": "False", "strategy.self_check_scope": "round",
                                 "strategy.self_inputs": "0", "strategy.held_at_end": "hold"}
    assert {"model.int8_fuse", "strategy.diagnose", "strategy.edge_case_hint", "strategy.few_shot",
            "strategy.show_diff", "strategy.feedback_style", "strategy.candidate_temperature"} <= set(RETIRED)
    # a run logged while they were knobs, at their defaults, reads as the same configuration as one after
    then = {"strategy.name": "reflection", "strategy.feedback_style": "shaped", "strategy.temperatures": "[0.7, 0.5, 0.3]",
            "strategy.candidate_temperature": "0.8", "strategy.stop_after_code": "True"}
    assert without_retired(then) == {"strategy.name": "reflection"}
    # switched on (no run did): a difference that stays
    assert without_retired({"strategy.few_shot": "2"}) == {"strategy.few_shot": "2"}
    # the engine's own settings, model knobs until #51 (serving EngineTuning): a run at their defaults is the
    # same configuration; the old runs at a prefill width of 8192 keep the param, which is result-neutral
    engine_then = {"model.name": "qwen1.5b-coder-q4", "model.kv_dtype": "auto", "model.gather_ms": "30",
                   "model.attn_implementation": "None", "model.cpu_attention": "True", "model.int8_native": "True",
                   "model.max_prefill_tokens": "896", "model.draft_step_tokens": "128"}
    assert without_retired(engine_then) == {"model.name": "qwen1.5b-coder-q4"}
    assert without_retired({"model.max_prefill_tokens": "8192"}) == {"model.max_prefill_tokens": "8192"}
    assert result_neutral("model.max_prefill_tokens") and result_neutral("model.gather_ms")
    assert without_retired({"model.kv_dtype": "float32"}) == {"model.kv_dtype": "float32"}  # changes answers
    # for every retired knob, the record no longer has it
    from flows.schema import knob_default
    for k in RETIRED:
        assert knob_default(k, {"model.backend": "transformers", "strategy.name": "reflection"}) is None, k

    def run(rid, **params):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, run_name=rid), data=SimpleNamespace(params=params))

    jobs = [run("a", **{"strategy.name": "reflection", "strategy.few_shot": "0", "iters": "1"}),
            run("b", **{"strategy.name": "reflection", "iters": "2"})]
    assert job_labels(jobs) == {"a": "iters=1", "b": "iters=2"}


def test_nightly_diff_skips_neutral_and_retired_keys(monkeypatch):
    import flows.nightly as nightly

    monkeypatch.setattr(nightly, "_results", lambda client, run_id: {"Python/0": {"passed": True, "error": None}})

    def run(rid, **params):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, run_name=rid, start_time=0),
                               data=SimpleNamespace(params=params, metrics={"pass_at_1": 1.0}, tags={}))

    base = run("b", **{"iters": "1", "strategy.few_shot": "0", "model.threads": "2", "nightly.tolerance": "0.02"})
    cur = run("c", **{"iters": "2", "model.threads": "4", "nightly.tolerance": "0.05"})
    report = nightly.compare(None, cur, base, 0.02, [])
    assert report["config_changes"] == {"iters": ["1", "2"]}


def test_a_run_from_before_a_knob_groups_with_newer_runs_at_what_it_did():
    """strategy.answer_format came after many recorded runs: they wrote whole functions, so they are the same
    configuration as a newer run logging answer_format=function, and never the same as a patch run."""
    from flows.frontier import param_values

    old = {"strategy.name": "single_shot", "strategy.candidates": "1"}
    assert param_values(old) == param_values({**old, "strategy.answer_format": "function"})
    assert param_values(old) != param_values({**old, "strategy.answer_format": "patch"})
