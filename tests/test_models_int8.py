"""`weights: int8`: decoder matmuls in int8 with per-row activation scales. What users rely on: a row's answer
does not depend on what it is batched with (as in fp32), the numbers stay close to fp32, and a wrong value is
one line."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Qwen2Config  # noqa: E402

from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from agents.serving.hf import BadModelConfig, TransformersModel  # noqa: E402
from agents.serving.int8 import Int8Linear, StackedSlice, quantize_int8  # noqa: E402
from test_models_engine import msgs, run_concurrently  # noqa: E402
from tiny_models import make_random_model  # noqa: E402


def test_int8_linear_rows_are_independent_and_close_to_fp32():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200)
    q = Int8Linear(lin)
    x = torch.randn(37, 96) * torch.linspace(0.1, 10, 37)[:, None]  # rows of very different magnitudes
    together = q(x)
    alone = torch.cat([q(x[i:i + 1]) for i in range(len(x))])
    assert torch.equal(together, alone)  # bit for bit: no row's rounding depends on the others
    assert torch.equal(q(x.reshape(37, 1, 96)).reshape(37, 200), together)
    want = lin(x)
    rel = (together - want).norm(dim=1) / want.norm(dim=1)
    assert rel.max() < 0.03, rel.max()
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (200, 96)


def test_quantize_skips_lm_head_and_keeps_zero_rows_finite():
    net = torch.nn.Module()
    net.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8, bias=False))
    net.lm_head = torch.nn.Linear(8, 5)
    assert quantize_int8(net) == 2
    assert type(net.lm_head) is torch.nn.Linear and all(isinstance(m, Int8Linear) for m in net.body)
    y = net.body(torch.zeros(3, 8))
    assert torch.isfinite(y).all()


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory):
    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.2, tie_word_embeddings=False)
    path = make_random_model(cfg, tmp_path_factory.mktemp("qwen2-int8"))
    m = TransformersModel(TransformersModelConf(name="tiny-int8", path=str(path), max_batch=3, gather_ms=50,
                                                dtype="float32", weights="int8"))
    yield m
    m.close()


def test_int8_model_answers_the_same_batched_and_alone(tiny_int8):
    m = tiny_int8
    # per layer: q, k, v, o, gate, up, down each an int8 matmul (stacking is off by default: no gain measured)
    assert sum(isinstance(x, Int8Linear) for x in m.model.modules()) == 2 * 7
    assert not any(isinstance(x, StackedSlice) for x in m.model.modules())
    assert type(m.model.lm_head) is torch.nn.Linear
    reqs = [GenRequest(messages=msgs(k), max_new_tokens=6 + 3 * k) for k in range(1, 7)]
    alone = [m.generate(r) for r in reqs]
    together = run_concurrently(m, reqs)
    for a, b in zip(alone, together):
        assert not isinstance(b, Exception), b
        assert a.text == b.text and a.completion_tokens == b.completion_tokens
    assert m.engine.stats["max_rows"] == 3


def test_stacked_qkv_and_gate_up_are_bit_equal_to_separate_matmuls(tmp_path):
    import copy

    from transformers import AutoModelForCausalLM

    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      initializer_range=0.2, tie_word_embeddings=False)
    base = AutoModelForCausalLM.from_pretrained(make_random_model(cfg, tmp_path / "m"), dtype=torch.float32).eval()
    separate, stacked = copy.deepcopy(base), copy.deepcopy(base)
    assert quantize_int8(separate) == quantize_int8(stacked, fuse=True) == 2 * 7
    assert isinstance(stacked.model.layers[0].self_attn.k_proj, StackedSlice)
    ids = torch.randint(0, 256, (3, 17))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row
    with torch.no_grad():
        a = separate(input_ids=ids, attention_mask=mask).logits
        b = stacked(input_ids=ids, attention_mask=mask).logits
        # a member called out of order or with another input recomputes: still exact
        x = torch.randn(2, 64)
        layer = stacked.model.layers[1].self_attn
        assert torch.equal(layer.v_proj(x), separate.model.layers[1].self_attn.v_proj(x))
        assert torch.equal(layer.v_proj(x), layer.v_proj(x.clone()))
    assert torch.equal(a, b)


def test_weights_auto_is_int8_on_cpu_only():
    from agents.serving.hf import resolve_weights

    assert resolve_weights("auto", torch.device("cpu")) == "int8"
    assert resolve_weights("auto", torch.device("cuda")) == "dtype"
    assert resolve_weights(None, torch.device("cpu")) == "dtype"
    with pytest.raises(BadModelConfig, match="CPU path"):
        resolve_weights("int8", torch.device("cuda"))


def test_bad_weights_value_is_one_line(tiny_int8):
    with pytest.raises(BadModelConfig) as e:
        TransformersModel(TransformersModelConf(name="bad", path=tiny_int8.cfg.path, weights="int4"))
    assert "unknown weights 'int4'" in str(e.value) and "\n" not in str(e.value)
