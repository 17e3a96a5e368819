"""A draft step's decoder layers over its real positions only (CPU float32 Qwen2 and Llama models): `forward`; a plain
decode step's too (one position a row). Where decoder.py applies they run as one compiled call, else as `loop`.

Why: a draft step feeds every row as many positions as its longest draft, so many positions of the (rows, width) block
are padding. The int8 matmuls and the attention kernel skipped them, but every other op of a layer (norms, residual
adds, rotary, the zeros each skipping projection returns) still ran over the whole block. Here the layers carry only
the real positions, as one (positions, hidden) block from the first layer to the last; the padded layout exists only
where attention needs it: the new keys and values written into a cache, and the queries the kernel reads (padding ones
are never read, cpu_attention.py). Side by side on the 2-core Xeon (benchmarks/decode_profile.py, before and after):
a draft step at 24 rows took somewhat less time, and much less held to AVX2 (FIXLAB_CPU_ISA=avx2).

Every position's numbers are those of the padded layers and of its row alone (per-row matmuls and norms, element-wise
rotary and adds, each query's attention over its own row: tests/test_unpadded.py), so answers do
not move.
"""
from __future__ import annotations

import importlib

import torch

from .int8 import only_rows, real_positions

MODELS = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def can_pack(model) -> bool:
    """The model's decoder runs here: a plain Qwen2 or Llama causal LM on CPU float32, full attention in every layer."""
    inner = getattr(model, "model", None)
    config = getattr(model, "config", None)
    return (type(model).__name__ in MODELS and inner is not None and config is not None
            and not getattr(inner, "has_sliding_layers", False)
            and all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])
            and next(model.parameters()).device.type == "cpu" and inner.embed_tokens.weight.dtype == torch.float32)


def forward(model, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache,
            index: torch.Tensor | None) -> torch.Tensor:
    """The decoder's last hidden states at the real positions, (positions, hidden), row-major: ids and position ids
    (rows, width); mask (rows, cached + width), 1 = a real token; `index` the real positions among rows x width (flat,
    row-major), None = all. The cache takes the new keys and values, as the padded forward would write them.
    The layers run as one compiled call where it applies (decoder.py: the same values), else as `loop` runs them."""
    from . import decoder

    h = decoder.forward(model, ids, mask, pos, cache, index)
    return loop(model, ids, mask, pos, cache, index) if h is None else h


def loop(model, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache,
         index: torch.Tensor | None) -> torch.Tensor:
    """`forward`'s layers as a Python loop over transformers' modules."""
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = model.model
    emb = inner.embed_tokens(ids)
    causal = create_causal_mask(config=inner.config, inputs_embeds=emb, attention_mask=mask, past_key_values=cache,
                                position_ids=pos)
    c, s = inner.rotary_emb(emb, pos)
    rows = ids.shape[0]
    cos = real_positions(c.expand(rows, -1, -1), index)[:, None]  # (positions, 1, head_dim): one query position each
    sin = real_positions(s.expand(rows, -1, -1), index)[:, None]
    x = real_positions(emb, index)
    layers = inner.layers[: inner.config.num_hidden_layers]
    module = importlib.import_module(type(layers[0]).__module__)  # the model's rotary and eager attention
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(inner.config._attn_implementation, module.eager_attention_forward)
    for layer in layers:
        x = _layer(layer, x, ids.shape, cache, index, causal, cos, sin, module.apply_rotary_pos_emb, attention)
    with only_rows(x.shape[0], None):
        return inner.norm(x)


def _layer(layer, x: torch.Tensor, shape, cache, index, causal, cos, sin, rotary, attention) -> torch.Tensor:
    """Qwen2DecoderLayer.forward / LlamaDecoderLayer.forward over the real positions x (positions, hidden)."""
    attn, n, d = layer.self_attn, x.shape[0], layer.self_attn.head_dim
    B, W = shape
    with only_rows(n, None):  # the block has no padding
        h = layer.input_layernorm(x)
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    q, k = rotary(q.view(n, 1, -1, d).transpose(1, 2), k.view(n, 1, -1, d).transpose(1, 2), cos, sin)
    q, k = q.transpose(1, 2).reshape(n, -1), k.transpose(1, 2).reshape(n, -1)
    query, key, value = (_padded(t, index, B * W, zeros=t is not q) for t in (q, k, v))
    query, key, value = (t.view(B, W, -1, d).transpose(1, 2) for t in (query, key, value))
    key, value = cache.update(key, value, attn.layer_idx)
    with only_rows(B * W, index):  # the kernel skips the padding queries
        out, _ = attention(attn, query, key, value, causal, dropout=0.0, scaling=attn.scaling,
                           sliding_window=getattr(attn, "sliding_window", None))
    with only_rows(n, None):
        x = x + attn.o_proj(real_positions(out.reshape(B * W, -1), index))
        return x + layer.mlp(layer.post_attention_layernorm(x))


def _padded(t: torch.Tensor, index: torch.Tensor | None, flat: int, zeros: bool) -> torch.Tensor:
    """(flat, width) with t's rows at `index`: zeros elsewhere (keys and values: a cache holds finite numbers), or
    whatever was there (queries: the kernel never reads a padding one)."""
    if index is None:
        return t
    out = t.new_zeros((flat, t.shape[1])) if zeros else t.new_empty((flat, t.shape[1]))
    return out.index_copy_(0, index, t)
