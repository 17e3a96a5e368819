"""A step's decoder layers as one compiled call (serving/decoder.py) give what unpadded.py's Python loop gives:
the hidden states and the cache's new keys and values, bit for bit, for a decode step and a draft step, Qwen2 and
Llama, so the engine's answers do not move (issue #52). And torch's own variance and SiLU, which the C loop does
itself, are matched at these widths on this CPU."""
from __future__ import annotations

import pytest
import torch

from serving import native

pytestmark = pytest.mark.skipif(not native.available(), reason="needs gcc for fixlab's compiled kernels")


def _model(arch: str, hidden: int, inter: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from serving.cpu_attention import use_grouped_attention
    from serving.fused import use_fused_ops
    from serving.int8 import Int8Plan, quantize_int8
    from tests.tiny_models import tiny_qwen2

    config = tiny_qwen2(hidden_size=hidden, intermediate_size=inter) if arch == "qwen2" else LlamaConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    quantize_int8(model, skip=(), plan=Int8Plan("fixlab", "fixlab", 0))
    assert use_grouped_attention(model) and use_fused_ops(model) > 0
    return model


def _prefilled(model, lengths: list[int]):
    """A cache holding rows of these lengths, left-padded as the engine holds them, and its mask."""
    from transformers import DynamicCache

    from serving.kvcache import _GrowingLayer
    from serving.unpadded import loop

    T = max(lengths)
    ids = torch.randint(0, 512, (len(lengths), T))
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, T - n:] = 1
    cache = DynamicCache(config=model.config)
    cache.layers = [_GrowingLayer(torch.float16) for _ in cache.layers]
    with torch.inference_mode():
        loop(model, ids, mask, (mask.cumsum(-1) - 1).clamp_min(0), cache, None)
    return cache, mask


def _clone(cache):
    import copy

    twin = copy.copy(cache)
    twin.layers = []
    for layer in cache.layers:
        c = copy.copy(layer)
        c._kbuf, c._vbuf = layer._kbuf.clone(), layer._vbuf.clone()
        c._view()
        twin.layers.append(c)
    return twin


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("feed", [1, 3])
def test_compiled_layers_give_the_loops_hidden_states_and_cache_bit_for_bit(arch, feed):
    from serving import decoder
    from serving.unpadded import loop

    model = _model(arch, 128, 256)
    cache, mask = _prefilled(model, [9, 4, 13, 1, 7])
    B = mask.shape[0]
    ids = torch.randint(0, 512, (B, feed))
    new = torch.ones(B, feed, dtype=torch.long)
    if feed > 1:  # a draft step: rows with fewer drafts carry padding positions, masked out
        new[1, 1:] = 0
        new[3, 2:] = 0
    step_mask = torch.cat([mask, new], dim=1)
    pos = mask.sum(1, keepdim=True) + torch.arange(feed)[None, :]
    real = new.bool().view(-1)
    index = None if bool(real.all()) else real.nonzero().squeeze(1)
    twin = _clone(cache)
    with torch.inference_mode():
        want = loop(model, ids, step_mask, pos, cache, index)
        got = decoder.forward(model, ids, step_mask, pos, twin, index)
    assert got is not None, "the compiled layers did not take this step"
    assert torch.equal(got, want)
    for a, b in zip(twin.layers, cache.layers):
        assert a.keys.shape == b.keys.shape
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_torch_variance_and_silu_are_matched_at_a_real_models_widths():
    from serving import decoder

    lib = native.library()
    decoder._declare(lib)
    # Qwen2.5-1.5B's widths (1536, 8960) and deepseek-coder-1.3B's (2048, 5504), at every row count a step has
    for hid, inter in ((1536, 8960), (2048, 5504)):
        assert decoder._torch_order(lib, hid, inter) is not None, (hid, inter)


def test_a_variance_in_another_order_is_caught():
    """The first-use check can fail: sums in 4-lane vectors (no torch kernel's width) differ from torch's."""
    from serving import decoder

    lib = native.library()
    decoder._declare(lib)
    x = torch.randn(32, 1536) * 30
    got = torch.empty(32)
    lib.fixlab_torch_mean_squares(x.data_ptr(), 32, 1536, 1536, got.data_ptr(), 4, torch.get_num_threads())
    assert not torch.equal(got, x.pow(2).mean(-1))


def test_the_engine_answers_the_same_with_the_compiled_layers_as_with_the_loop(tmp_path, monkeypatch):
    """Decode steps, draft steps and prefix-hit prefills through the compiled layers, and through unpadded.py's loop:
    every answer the same, the first turn and the follow-ups that hit the prefix store."""
    from serving import decoder
    from tests.test_determinism import follow_ups, load, requests, together
    from tests.tiny_models import make_random_model, tiny_qwen2

    folder = (make_random_model(tiny_qwen2(hidden_size=128, intermediate_size=256, initializer_range=0.02),
                                tmp_path), "int8")
    reqs = requests()
    order, delays = list(range(len(reqs))), [0.0] * len(reqs)
    calls = {"compiled": 0}
    real_forward = decoder.Stack.forward

    def counted(self, *a, **kw):
        h = real_forward(self, *a, **kw)
        calls["compiled"] += h is not None
        return h

    answers = {}
    for compiled in (True, False):
        if compiled:
            monkeypatch.setattr(decoder.Stack, "forward", counted)
        else:
            monkeypatch.setattr(decoder, "forward", lambda *a, **kw: None)
        m = load(folder, max_batch=4, draft_ngram=1)
        try:
            first = together(m, reqs, order, delays)
            answers[compiled] = (first, together(m, follow_ups(reqs, first), order, delays))
            st = m.engine.stats
            assert st["draft_steps"] > 0 and st["kept_grouped"] > 0, st
        finally:
            m.close()
    assert calls["compiled"] > 0
    assert answers[True] == answers[False]
