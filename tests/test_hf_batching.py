"""transformers' own batched serving (serving/hf_batching.py), what a GPU serves through, run here on the CPU with a
tiny real Qwen2: what users rely on is that concurrent requests through continuous batching or the static cache get
what transformers' one-at-a-time `generate` gives them (greedy tokens, stop strings, finish reasons, token counts),
that `runtime: auto` on a GPU times both on the loaded model, keeps the faster and caches the decision, and that the
path line does not claim answers repeat."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from serving import EngineTuning, runtime  # noqa: E402
from serving.devices import BadModelConfig  # noqa: E402
from tiny_models import make_random_model, tiny_qwen2  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # a context that holds the race's long prompt (runtime._rates)
    return str(make_random_model(tiny_qwen2(max_position_embeddings=2048), tmp_path_factory.mktemp("tiny-kept")))


@pytest.fixture(scope="module")
def reference(tiny):
    """Requests of different prompts and budgets, and what one-at-a-time `generate` answers to each; two of them
    carry a stop string that occurs inside the answer, so it must cut it."""
    reqs = [GenRequest(messages=[{"role": "user", "content": f"def add(a, b): {i} " * (1 + i % 3)}],
                       max_new_tokens=8 + 2 * i) for i in range(8)]
    ref = runtime.build_local(TransformersModelConf(name="t", path=tiny, device="cpu", batching=False))
    try:
        first = [ref.generate(r) for r in reqs]
        for i in (1, 5):  # a stop string from inside the reference answer, not at its start
            reqs[i] = GenRequest(messages=reqs[i].messages, max_new_tokens=reqs[i].max_new_tokens,
                                 stop=(first[i].text[4:7],))
        return reqs, [ref.generate(r) for r in reqs]
    finally:
        ref.close()


@pytest.mark.parametrize("kind", ["continuous", "static"])
def test_concurrent_requests_get_what_generate_gives_one_at_a_time(tiny, reference, kind):
    reqs, want = reference
    assert want[1].finish_reason == "stop" and want[1].text and len(want[1].text) < 8  # the stop string did cut
    model = runtime.build_local(TransformersModelConf(name="t", path=tiny, device="cpu", runtime=kind),
                                EngineTuning(gather_ms=50.0))
    try:
        assert model.choice.record()["runtime"] == kind and model.choice.record()["deterministic"] is False
        assert "may differ between reruns" in model.choice.repeat_words()
        with ThreadPoolExecutor(len(reqs)) as pool:
            got = list(pool.map(model.generate, reqs))
        for w, g in zip(want, got):
            assert (g.text, g.finish_reason, g.prompt_tokens) == (w.text, w.finish_reason, w.prompt_tokens)
            if w.finish_reason == "length":
                assert g.completion_tokens == w.completion_tokens
        # sampled requests go through too, each within its budget
        hot = GenRequest(messages=reqs[0].messages, max_new_tokens=6, temperature=0.8, seed=1)
        with ThreadPoolExecutor(3) as pool:
            for g in pool.map(model.generate, [hot] * 3):
                assert 1 <= g.completion_tokens <= 6
        assert model.activity()["tokens"] > 0
    finally:
        model.close()


def test_on_a_gpu_auto_times_both_kept_paths_keeps_the_faster_and_caches_it(tiny, monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("FIXLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(runtime, "_on_gpu", lambda cfg: True)  # the race as it runs on cuda, here on the CPU
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    timed = []
    real_rates = runtime._rates

    def rates(model, rows, new_tokens):
        timed.append(model.choice.runtime)
        r = real_rates(model, rows, new_tokens)
        # the static path as the faster one, whatever this CPU measures: the choice must follow the figures
        return {k: v * (10 if model.choice.runtime == "static" else 1) for k, v in r.items()}

    monkeypatch.setattr(runtime, "_rates", rates)
    cfg = TransformersModelConf(name="t", path=tiny, device="cpu", runtime="auto", max_batch=4)
    tuning = EngineTuning(gather_ms=5.0)
    model = runtime.build_local(cfg, tuning)
    try:
        assert timed == ["continuous", "continuous", "static", "static"]  # each warm, then timed
        assert model.choice.runtime == "static" and runtime.recorded(cfg, tuning)["runtime"] == "static"
        assert "Test GPU" in model.choice.reason and set(model.choice.decode_tok_s) == {"continuous", "static"}
        assert model.generate(GenRequest(messages=[{"role": "user", "content": "hi"}], max_new_tokens=3)).text
    finally:
        model.close()
    timed.clear()
    again = runtime.build_local(cfg, tuning)  # the cached decision: nothing timed again
    try:
        assert timed == [] and again.choice.runtime == "static"
    finally:
        again.close()


def test_settings_kept_batching_cannot_serve_give_one_line(tiny):
    with pytest.raises(BadModelConfig, match="batches requests itself"):
        runtime.build_local(TransformersModelConf(name="t", path=tiny, device="cpu", runtime="static",
                                                  batching=False))
    with pytest.raises(BadModelConfig, match="use auto, engine, llamacpp, continuous or static"):
        runtime.build_local(TransformersModelConf(name="t", path=tiny, device="cpu", runtime="vllm"))


def test_the_gpu_checks_rows_run_and_agree_with_generate_here_on_the_cpu(tmp_path):
    """benchmarks/gpu_check.sh gets one try on a lent GPU: its kept-library rows (generation.py --kept) run here on
    the CPU at a small size, and every row's greedy tokens equal one-at-a-time generate's."""
    import json
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "gen.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "generation.py"), "--arch",
                        "Qwen2.5-Coder-0.5B-Instruct", "--layers", "1", "--batches", "1", "2", "--new-tokens", "4",
                        "--seq-prompts", "2", "--prompt-len", "20", "40", "--kept", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["mode"]: row for row in json.loads(out.read_text())["runs"]}
    for mode in ("fixlab's static cache + compile server 2", "fixlab's continuous batching server 2",
                 "fixlab's continuous batching server 1", "engine batch 2"):
        assert rows[mode].get("exact") is True and rows[mode]["tokens"] == 8, (mode, rows[mode])
