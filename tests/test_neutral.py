"""The one list of result-neutral settings: speed knobs keep the trajectory cache key, answer-changing ones do
not, and every user of the list agrees (cache, sweep labels)."""
from __future__ import annotations

from types import SimpleNamespace

from agents.config import AgentConfig, SingleShotConf
from agents.models.config import TransformersModelConf
from flows.cache import TrajectoryCache
from flows.neutral import result_neutral
from sandboxes.config import LocalSandboxConf

MODEL = {"name": "m", "pack": "qwen1.5b-coder-q4", "dtype": "float32"}


def key(tmp_path, model=None, sandbox=None, agent=None) -> str:
    return TrajectoryCache(tmp_path, TransformersModelConf(**{**MODEL, **(model or {})}),
                           agent or AgentConfig(SingleShotConf()), LocalSandboxConf(**(sandbox or {}))).key


def test_speed_knobs_keep_the_cache_key(tmp_path):
    base = key(tmp_path)
    for change in ({"threads": 2}, {"max_batch": 4}, {"prefix_cache_mib": 0}, {"draft_tokens": 0},
                   {"batching": False}, {"skinny_matmul": False}):
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
    import agents.serving.devices as devices

    keys = {}
    for native in (True, False):
        monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda native=native: native)
        keys[native] = key(tmp_path, model={"dtype": "auto", "device": "cpu"})
    assert keys[True] == key(tmp_path, model={"dtype": "bfloat16", "device": "cpu"})
    assert keys[False] == key(tmp_path, model={"dtype": "float32", "device": "cpu"})


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
