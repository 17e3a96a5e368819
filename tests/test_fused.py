"""The compiled decode ops (serving/fused.py; kernels.c sections 5 and 6) give the bits of the torch and
transformers ops they replace, on every build this CPU runs, and a model's logits do not move when they are on: so
turning them on changed no answer (issue #52)."""
from __future__ import annotations

import pytest
import torch

from serving import native

pytestmark = pytest.mark.skipif(not native.available(), reason="needs gcc for fixlab's compiled kernels")


def test_argmax_gives_torchs_index_on_every_build():
    torch.manual_seed(0)
    nan = torch.randn(4, 100)
    nan[0, 50] = nan[0, 70] = nan[1, 99] = float("nan")  # NaN counts as the largest: its first index
    nan[2, 3] = nan[2, 90] = 1e30  # ties: the first
    nan[3] = 0.0
    nan[3, 5] = -0.0  # +0 and -0 are equal: the first of either
    ties = torch.zeros(2, 50)
    ties[0, :10] = -0.0
    ties[1, 7] = ties[1, 9] = float("inf")
    cases = [torch.randn(32, 151936), torch.randn(1, 17), torch.randn(5, 16), torch.full((3, 40), -float("inf")),
             nan, ties, torch.randn(6, 1000)[:, :999]]  # the last: rows 1000 apart
    for isa in native.runnable_isas():
        for c in cases:
            assert torch.equal(native.argmax(c, isa), c.argmax(dim=-1)), isa
            assert int(native.argmax(c[0], isa)) == int(c[0].argmax()), isa


def test_norm_rotary_and_mlp_product_are_the_eager_ops_bits_on_every_build():
    from transformers.models.qwen2 import modeling_qwen2 as qwen2

    from tests.tiny_models import tiny_qwen2

    torch.manual_seed(1)
    norm = qwen2.Qwen2RMSNorm(1536, eps=1e-6)
    norm.weight.data = torch.randn(1536)
    x = torch.randn(32, 1, 1536) * 3
    eager_norm = norm(x)
    config = tiny_qwen2(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    rope = qwen2.Qwen2RotaryEmbedding(config)
    eager_rotary = getattr(qwen2.apply_rotary_pos_emb, "fixlab_eager", qwen2.apply_rotary_pos_emb)
    B, L, H, D = 3, 5, 4, 64
    q = torch.randn(B, L, H, D).transpose(1, 2)  # as the attention's projections are viewed
    k = torch.randn(B, L, 2, D).transpose(1, 2)
    a, b = torch.randn(32, 8960), torch.randn(32, 8960)
    for isa in native.runnable_isas():
        var = x.reshape(-1, 1536).pow(2).mean(-1, keepdim=True)
        assert torch.equal(native.rms_scale(x.reshape(-1, 1536), var, 1e-6, norm.weight.data, isa).view(x.shape),
                           eager_norm), isa
        for pos in (torch.arange(L)[None].repeat(B, 1) + torch.tensor([[0], [7], [100]]), torch.arange(L)[None]):
            cos, sin = rope(q, pos)
            want_q, want_k = eager_rotary(q, k, cos, sin)
            assert torch.equal(native.rotary(q, cos, sin, isa), want_q), (isa, pos.shape)
            assert torch.equal(native.rotary(k, cos, sin, isa), want_k), (isa, pos.shape)
        got_q, got_s = native.mul_quantize_rows(a, b, isa)
        want_q, want_s = native.quantize_rows(a * b)
        assert torch.equal(got_q, want_q) and torch.equal(got_s, want_s), isa


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_models_logits_do_not_move_with_the_fused_ops(arch):
    """A tiny model with int8 weights: a left-padded batch's logits and a decode step's, before and after
    use_fused_ops, bit for bit."""
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    from serving.fused import use_fused_ops
    from serving.int8 import only_rows, quantize_int8
    from tests.tiny_models import tiny_qwen2

    config = tiny_qwen2() if arch == "qwen2" else LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    quantize_int8(model, skip=())
    ids = torch.randint(0, 512, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4] = mask[2, :9] = 0  # left padding

    real = mask.bool().view(-1).nonzero().squeeze(1)  # a draft step's real positions: the matmuls skip the others

    def run():
        with torch.inference_mode():
            cache = DynamicCache(config=config)
            first = model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits
            step = model(input_ids=first[:, -1:].argmax(-1), past_key_values=cache,
                         attention_mask=torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)).logits
            with only_rows(ids.numel(), real):  # the fused MLP takes the real positions out once
                skipped = model(input_ids=ids, attention_mask=mask).logits
        return first, step, skipped[mask.bool()]

    before = run()
    assert use_fused_ops(model) > 0
    after = run()
    assert all(torch.equal(b, a) for b, a in zip(before, after))
