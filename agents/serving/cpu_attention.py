"""Decode attention on CPU: grouped-query heads as two batched matmuls (`model.cpu_attention`, default on).

Why: in a decode step each row has 1 query token against its whole padded KV cache. torch's SDPA with a padding
mask and grouped K/V heads was the step's biggest cost on 2-core CPUs (py-spy on a react job: 72% of the forward
in SDPA). Measured for Qwen2.5-1.5B's 12:2 heads, 32 rows, per decode step over 28 layers (torch 2.13, 2-core
EPYC): at 600 KV tokens SDPA 146 ms in fp32 and 906 ms in bf16, this path 100 ms in fp32; at 2000 tokens
716 ms in fp32 against 388. Here the query heads that share a K/V head become the rows of one matmul against
that head's keys (no K/V copy: the cache buffer is viewed, not repeated), the mask is applied to the scores
and softmax runs in fp32.

Only fp32 steps with at most SMALL_QUERY query tokens take this path (decode, prompt-lookup drafts); prefill and
other dtypes go to transformers' SDPA. bf16 scores would be rounded before the softmax (8 bits of mantissa on
logits up to ~30), so bf16 stays on SDPA. Numerics: fp32 results agree with SDPA to about 1e-6
(tests/test_models_engine.py: against SDPA, and greedy answers with this path on and off).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "fixlab_cpu"
SMALL_QUERY = 16  # query tokens per row up to which the matmul path wins (decode: 1; drafts: up to 16)


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """query (B, H, Q, D); key, value (B, KV, L, D); attention_mask None, bool (B, 1, Q, >=L; True = attend) or
    additive float. Returns (B, Q, H, D) as transformers' attention functions do."""
    B, H, Q, D = query.shape
    KV, L = key.shape[1], key.shape[2]
    if (Q > SMALL_QUERY or query.device.type != "cpu" or query.dtype != torch.float32 or H % KV
            or dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    G = H // KV
    scale = scaling if scaling is not None else D ** -0.5
    q = query.reshape(B * KV, G * Q, D)  # heads of one K/V group, then their query positions
    k = key.reshape(B * KV, L, D)  # a view of the cache buffer (batch and head dims merge), no copy
    v = value.reshape(B * KV, L, D)
    s = torch.bmm(q, k.transpose(1, 2)).view(B, KV, G, Q, L).mul_(scale)
    if attention_mask is not None:
        m = attention_mask[..., :L][:, :, None]  # (B or 1, 1, 1, Q, L): broadcasts over K/V heads and groups
        if m.dtype == torch.bool:
            s.masked_fill_(~m, float("-inf"))
        else:
            s.add_(m)
    elif Q > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        keep = torch.ones(Q, L, dtype=torch.bool, device=s.device).tril(L - Q)  # the last Q positions are the queries
        s.masked_fill_(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).view(B * KV, G * Q, L)
    out = torch.bmm(p, v).view(B, H, Q, D)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model) -> bool:
    """Switch a loaded transformers model from SDPA to grouped_attention (registered once, process-wide, under
    NAME). Models on another attention (eager, flash) or without the functional attention API are left alone."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # same masks as SDPA
    try:
        model.set_attn_implementation(NAME)
    except Exception:  # a model that cannot switch keeps SDPA
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
