"""A draft step's decoder layers over its real positions only (CPU float32 Qwen2 and Llama models): `forward` over
groups of rows, each over its own KV cache (the engine's draft steps pass one).

Why: a draft step feeds every row as many positions as its longest draft, so many positions of the (rows, width) block
are padding. The int8 matmuls and the attention kernel skipped them, but every other op of a layer (norms, residual
adds, rotary, the zeros each skipping projection returns) still ran over the whole block. Here the layers carry only
the real positions, as one (positions, hidden) block from the first layer to the last; the padded layout exists only
where attention needs it: the new keys and values written into a cache, and the queries the kernel reads (padding ones
are never read, cpu_attention.py). Side by side on the 2-core Xeon (benchmarks/results/decode-profile-
20261129T152034Z-drafts24-before-8916506.json against 20261129T151844Z-drafts24-after-packed.json): 479.9 against
432.6 ms a draft step at 24 rows.

Every position's numbers are those of the padded layers and of its row alone (per-row matmuls and norms, element-wise
rotary and adds, each query's attention over its own row: tests/test_packed.py, with two groups too), so answers do
not move.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from .int8 import only_rows

MODELS = ("Qwen2ForCausalLM", "LlamaForCausalLM")


@dataclass
class Group:
    """Rows fed together over one cache: ids (rows, width); mask (rows, cached + width), 1 = a real token; position
    ids (rows, width); `index` the real positions among rows x width (flat, row-major), None = all."""
    ids: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor
    cache: object
    index: torch.Tensor | None

    def real(self) -> int:
        return self.ids.numel() if self.index is None else len(self.index)


def can_pack(model) -> bool:
    """The model's decoder runs here: a plain Qwen2 or Llama causal LM on CPU float32, full attention in every layer."""
    inner = getattr(model, "model", None)
    config = getattr(model, "config", None)
    return (type(model).__name__ in MODELS and inner is not None and config is not None
            and not getattr(inner, "has_sliding_layers", False)
            and all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])
            and next(model.parameters()).device.type == "cpu" and inner.embed_tokens.weight.dtype == torch.float32)


def forward(model, groups: list[Group]) -> torch.Tensor:
    """The decoder's last hidden states at every group's real positions, (positions, hidden): the groups in order, each
    row-major. Each group's cache takes its new keys and values, as a forward of that group alone would."""
    from transformers.masking_utils import create_causal_mask

    inner = model.model
    xs, cos, sin, masks = [], [], [], []
    for g in groups:
        emb = inner.embed_tokens(g.ids)
        masks.append(create_causal_mask(config=inner.config, inputs_embeds=emb, attention_mask=g.mask,
                                        past_key_values=g.cache, position_ids=g.pos))
        c, s = inner.rotary_emb(emb, g.pos)
        xs.append(_real(emb, g.index))
        cos.append(_real(c.expand(g.ids.shape[0], -1, -1), g.index))
        sin.append(_real(s.expand(g.ids.shape[0], -1, -1), g.index))
    x = torch.cat(xs) if len(xs) > 1 else xs[0]
    cos = (torch.cat(cos) if len(cos) > 1 else cos[0])[:, None]  # (positions, 1, head_dim): one query position each
    sin = (torch.cat(sin) if len(sin) > 1 else sin[0])[:, None]
    for layer in inner.layers[: inner.config.num_hidden_layers]:
        x = _layer(layer, x, groups, masks, cos, sin)
    with only_rows(x.shape[0], None):
        return inner.norm(x)


def _real(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    flat = t.reshape(-1, t.shape[-1])
    return flat if index is None else flat.index_select(0, index)


def _layer(layer, x: torch.Tensor, groups: list[Group], masks: list, cos: torch.Tensor, sin: torch.Tensor):
    """Qwen2DecoderLayer.forward / LlamaDecoderLayer.forward over the real positions x (positions, hidden)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn, n, d = layer.self_attn, x.shape[0], layer.self_attn.head_dim
    module = importlib.import_module(type(layer).__module__)
    with only_rows(n, None):  # the block has no padding
        h = layer.input_layernorm(x)
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    q, k = module.apply_rotary_pos_emb(q.view(n, 1, -1, d).transpose(1, 2), k.view(n, 1, -1, d).transpose(1, 2),
                                       cos, sin)  # fused.py's loop where it applies
    q, k = q.transpose(1, 2).reshape(n, -1), k.transpose(1, 2).reshape(n, -1)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, module.eager_attention_forward)
    outs, at = [], 0
    for g, mask in zip(groups, masks):
        m = g.real()
        B, W = g.ids.shape
        query, key, value = (_padded(t[at:at + m], g.index, B * W, zeros=t is not q) for t in (q, k, v))
        query, key, value = (t.view(B, W, -1, d).transpose(1, 2) for t in (query, key, value))
        key, value = g.cache.update(key, value, attn.layer_idx)
        with only_rows(B * W, g.index):  # the kernel skips the padding queries
            out, _ = attention(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling,
                               sliding_window=getattr(attn, "sliding_window", None))
        outs.append(_real(out.reshape(B * W, -1), g.index))
        at += m
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    with only_rows(n, None):
        x = x + attn.o_proj(out)
        return x + layer.mlp(layer.post_attention_layernorm(x))


def _padded(t: torch.Tensor, index: torch.Tensor | None, flat: int, zeros: bool) -> torch.Tensor:
    """(flat, width) with t's rows at `index`: zeros elsewhere (keys and values: a cache holds finite numbers), or
    whatever was there (queries: the kernel never reads a padding one)."""
    if index is None:
        return t
    out = t.new_zeros((flat, t.shape[1])) if zeros else t.new_empty((flat, t.shape[1]))
    return out.index_copy_(0, index, t)
