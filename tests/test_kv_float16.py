"""The engine's float16 KV cache on CPU (EngineTuning.kv_dtype, auto = float16 where fixlab's compiled kernels build) and
the compiled decode attention that reads it (serving/kernels.c). What users rely on: attention over the
float16 cache equals exact attention over the same (widened) values, every row sees only its own columns, a row's
answer does not depend on its batch, and a wrong setting is one line."""
from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from serving import EngineTuning  # noqa: E402
from serving.hf import BadModelConfig, TransformersModel  # noqa: E402
from test_models_engine import assert_batched_answers_equal_alone, msgs, run_concurrently  # noqa: E402
from tiny_models import make_random_model, tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the compiled kernels need gcc")


class _Layer:
    is_causal = True

    def __init__(self, groups: int = 3):
        self.num_key_value_groups = groups  # query heads per K/V head


def _reference(query, key, value, mask):
    """Exact attention (SDPA, float32) over the float16 cache's values; (B, Q, H, D)."""
    g = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query, key.float().repeat_interleave(g, 1),
                                         value.float().repeat_interleave(g, 1), attn_mask=mask)
    return out.transpose(1, 2)


def _runnable_isas() -> list[str]:
    from serving.native import runnable_isas

    return runnable_isas()


# (head size, query heads per K/V head): the AVX-512 path keeps up to 6 query rows x 4 vectors of 16 in registers, the
# AVX2 path 6 rows x 2 vectors of 8, so these cover every block of 1-6 rows (with 1, 3 and 16 queries a row) and every
# vector count; 40 takes the portable loops on AVX-512 and a one-vector tail on AVX2, 20 the portable loops on both.
# Every build this CPU runs (native, AVX2, portable): an AVX-512 machine tests the AVX2 path too.
@pytest.mark.parametrize("isa", _runnable_isas())
@pytest.mark.parametrize("D,G", [(16, 3), (48, 7), (96, 2), (128, 6), (64, 5), (40, 3), (20, 2)])
def test_float16_cache_attention_equals_exact_attention_over_its_values(D, G, isa, monkeypatch):
    from serving import native
    from serving.cpu_attention import grouped_attention

    monkeypatch.setattr(native, "FORCED_ISA", isa)  # native.decode_attention runs that build
    assert native.available(), isa

    g = torch.Generator().manual_seed(D)
    B, KV, L, cap = 4, 2, 37, 50
    H = G * KV
    layer = _Layer(G)
    # the cache as the engine holds it: a view of a buffer with spare columns on both sides
    kbuf = (torch.randn(B + 2, KV, cap, D, generator=g) * 3).half()
    vbuf = torch.randn(B + 2, KV, cap, D, generator=g).half()
    key, value = kbuf[:B, :, 5:5 + L], vbuf[:B, :, 5:5 + L]
    for Q in (1, 3, 16):
        # as transformers hands it over: (B, Q, H, D) transposed to (B, H, Q, D), not contiguous
        query = torch.randn(B, Q, H, D, generator=g).transpose(1, 2)
        keep = torch.ones(Q, L, dtype=torch.bool).tril(L - Q).expand(B, 1, Q, L).clone()
        keep[1, :, :, :5] = False  # left padding
        keep[3, :, :, :30] = False
        keep[2, :, :, 20:23] = False  # holes: rejected drafts
        for mask in (keep, keep[:1], None):  # per row, one for all rows, none (causal)
            want_mask = torch.ones(Q, L, dtype=torch.bool).tril(L - Q) if mask is None else mask
            ours, _ = grouped_attention(layer, query, key, value, mask)
            assert ours.shape == (B, Q, H, D) and ours.dtype == torch.float32
            want = _reference(query, key, value, want_mask)
            assert torch.allclose(ours, want, atol=2e-5, rtol=1e-5), (D, Q, (ours - want).abs().max())
    # a column no query may see is never read: NaN there changes nothing
    poisoned = key.clone()
    poisoned[3, :, :30] = float("nan")
    q1 = torch.randn(B, H, 1, D, generator=g)
    a, _ = grouped_attention(layer, q1, poisoned, value, keep[:, :, -1:])
    b, _ = grouped_attention(layer, q1, key, value, keep[:, :, -1:])
    assert torch.equal(a, b)
    # a row that may see nothing gives zeros, not NaN
    none = keep[:, :, -1:].clone()
    none[0] = False
    a, _ = grouped_attention(layer, q1, key, value, none)
    assert torch.equal(a[0], torch.zeros_like(a[0])) and torch.isfinite(a).all()
    # long queries (prefill) read the float16 cache through SDPA, widened
    qp = torch.randn(B, H, 20, D, generator=g)
    a, _ = grouped_attention(layer, qp, key[:, :, :20], value[:, :, :20], None)
    assert torch.allclose(a, _reference(qp, key[:, :, :20], value[:, :, :20],
                                        torch.ones(20, 20, dtype=torch.bool).tril()), atol=2e-5)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_random_model(tiny_qwen2(), tmp_path_factory.mktemp("qwen2-kv16"))


def test_the_cache_is_float16_by_default_on_cpu_and_answers_do_not_depend_on_the_batch(tiny_path):
    m = TransformersModel(TransformersModelConf(name="tiny", path=str(tiny_path), max_batch=3, dtype="float32",
                                                prefix_cache_mib=64), tuning=EngineTuning(gather_ms=50))
    try:
        assert m.kv_dtype == torch.float16 and m.engine.kv_dtype == torch.float16
        assert_batched_answers_equal_alone(m)
        assert m.engine.stats["max_rows"] == 3
        (_, kv, _), *_ = m.engine.prefixes._entries.values()  # what a later round reuses: float16 too
        assert kv[0][0].dtype == torch.float16
        assert m.engine.kv_token_bytes == 2 * 2 * 2 * 16 * 2  # layers x (K, V) x KV heads x head dim x 2 bytes
    finally:
        m.close()


def test_float16_and_float32_caches_give_the_same_greedy_answer_where_the_winner_is_clear(tiny_path):
    # the only thing float16 changes: K and V rounded to 11 significant bits (the 1.5B pack: paired on every task,
    # docs/RESULTS.md)
    from serving.hf import resolve_kv_dtype

    assert resolve_kv_dtype("auto", torch.device("cpu"), torch.float32) == torch.float16
    reqs = [GenRequest(messages=msgs(3), max_new_tokens=12)]
    texts = {}
    for kv in ("float16", "float32"):
        m = TransformersModel(TransformersModelConf(name="tiny", path=str(tiny_path), max_batch=2, dtype="float32"),
                              tuning=EngineTuning(gather_ms=10, kv_dtype=kv))
        try:
            texts[kv] = [g.text for g in run_concurrently(m, reqs)]
        finally:
            m.close()
    assert texts["float16"] == texts["float32"]  # clear winners in the tiny model: the same greedy answer


def test_a_wrong_kv_dtype_is_one_line():
    from serving.hf import resolve_kv_dtype

    for bad, device, dtype, attn in (("int4", "cpu", torch.float32, True), ("float16", "cpu", torch.bfloat16, True),
                                     ("float16", "cpu", torch.float32, False), ("float16", "cuda", torch.bfloat16,
                                                                                 True)):
        with pytest.raises(BadModelConfig) as e:
            resolve_kv_dtype(bad, torch.device(device), dtype, attn)
        assert "\n" not in str(e.value) and "kv_dtype" in str(e.value)
    assert resolve_kv_dtype("auto", torch.device("cuda"), torch.bfloat16) is None  # the model's dtype elsewhere
    assert resolve_kv_dtype("float32", torch.device("cpu"), torch.float32) is None
