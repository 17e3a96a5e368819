"""A step's decoder layers over its real positions only (serving/unpadded.py) give each real position the numbers
the padded layers give it, and those a row fed alone gets: hidden states and the
keys and values written to the cache, bit for bit, so the engine's answers do not move (issue #52)."""
from __future__ import annotations

import pytest
import torch

from serving import native

pytestmark = pytest.mark.skipif(not native.available(), reason="needs gcc for fixlab's compiled kernels")


def _cache(config):
    from transformers import DynamicCache

    from serving.kvcache import _GrowingLayer

    cache = DynamicCache(config=config)
    cache.layers = [_GrowingLayer(torch.float16) for _ in cache.layers]  # the engine's float16 KV cache
    return cache


def _padded_forward(model, ids, mask, only):
    """transformers' own forward over the padded block (the matmuls skip the padding: int8.only_rows)."""
    from serving.int8 import only_rows

    cache = _cache(model.config)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.inference_mode(), only_rows(ids.numel(), only):
        h = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                        use_cache=True).last_hidden_state
    return h, cache


def _packed(model, ids, mask, only):
    from serving.unpadded import forward

    cache = _cache(model.config)
    with torch.inference_mode():
        return forward(model, ids, mask, (mask.cumsum(-1) - 1).clamp_min(0), cache, only), cache


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_layers_give_each_real_position_its_padded_and_alone_numbers(arch):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from serving.cpu_attention import use_grouped_attention
    from serving.fused import use_fused_ops
    from serving.int8 import quantize_int8
    from serving.unpadded import can_pack
    from tests.tiny_models import tiny_qwen2

    config = tiny_qwen2(hidden_size=128, intermediate_size=256) if arch == "qwen2" else LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    quantize_int8(model, skip=())
    assert use_grouped_attention(model) and use_fused_ops(model) > 0 and can_pack(model)
    # a draft step's layout: each row's real positions first (its pending token and its feed), padding after
    lengths = [6, 1, 3, 6]
    ids = torch.randint(0, 512, (len(lengths), 6))
    mask = torch.zeros(len(lengths), 6, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    only = mask.bool().view(-1).nonzero().squeeze(1)
    padded, padded_cache = _padded_forward(model, ids, mask, only)
    packed, packed_cache = _packed(model, ids, mask, only)
    assert packed.shape[0] == len(only)  # the layers carried the real positions only
    assert torch.equal(packed, padded.reshape(-1, padded.shape[-1])[only])
    for a, b in zip(packed_cache.layers, padded_cache.layers):
        real = mask.bool()
        assert torch.equal(a.keys.transpose(1, 2)[real], b.keys.transpose(1, 2)[real])
        assert torch.equal(a.values.transpose(1, 2)[real], b.values.transpose(1, 2)[real])
    at = 0
    for i, n in enumerate(lengths):  # each row alone, no padding: the same numbers
        alone, _ = _packed(model, ids[i:i + 1, :n], mask[i:i + 1, :n], None)
        assert torch.equal(alone, packed[at:at + n]), i
        at += n
