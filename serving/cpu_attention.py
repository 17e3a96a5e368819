"""Decode attention on CPU: grouped-query heads as two batched matmuls (EngineTuning.cpu_attention, default on).

Why: in a decode step each row has 1 query token against its whole padded KV cache. torch's SDPA with a padding
mask and grouped K/V heads was the step's biggest cost on 2-core CPUs (py-spy on a react job: most of the forward
in SDPA). Measured for Qwen2.5-1.5B's 12:2 heads, 32 rows, per decode step over 28 layers (torch 2.13, 2-core
EPYC): at 600 KV tokens this path in fp32 took clearly less than SDPA in fp32, and SDPA in bf16 several times more;
at 2000 tokens the gap to SDPA in fp32 widened. Here the query heads that share a K/V head become the rows of one
matmul against that head's keys (no K/V copy: the cache buffer is viewed, not repeated), the mask is applied to the
scores and softmax runs in fp32.

A batch whose rows differ in length carries left padding (a job's decode batches: a large share of the slots at 1200
tokens, benchmarks/forward.py); when it is large enough to pay for a few small ops a row (PADDING_SHARE,
PADDING_SLOTS below), each row attends to its own columns only.

With the float16 KV cache (EngineTuning.kv_dtype, the default on CPU where fixlab's compiled kernels build) the same
steps go to native.decode_attention instead (serving/kernels.c): it reads half the bytes, widened to float32, and
each row only over the columns its mask lets it see, with no per-row Python calls; on AVX-512 CPUs with fused
multiply-adds and each block of query rows' sums held in registers. On the 2-core EPYC at 32 rows x 700 tokens
its attention took clearly less of a step than this path's, and the AVX-512 loops clearly less than the portable
ones (benchmarks/decode_profile.py; the kernels alone, side by side: benchmarks/attention.py). Prefill (more query
tokens) widens the cache and keeps SDPA.

With the float16 KV cache every fp32 step takes the compiled kernel, prefill included (a long prompt in blocks of
query positions): one kernel for prefill, decode and draft checks, whose sums per query are fixed by the row's own
tokens, so a row's answer does not depend on its batch, its padding or a prefix hit (kernels.c section 2; make eval's
job took no longer with it: benchmarks/results/repeat-*.json). Other dtypes go to transformers' SDPA. bf16
scores would be rounded before the softmax (8 bits of mantissa on logits up to ~30), so bf16 stays on SDPA.
Numerics: fp32 results agree with SDPA to about 1e-6 (tests/test_models_engine.py: against SDPA, and greedy answers
with this path on and off).
"""
from __future__ import annotations

import threading

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import native

NAME = "fixlab_cpu"
SMALL_QUERY = 16  # without the float16 cache: query tokens per row up to which the matmul path wins over SDPA


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """query (B, H, Q, D); key, value (B, KV, L, D); attention_mask None, bool (B, 1, Q, >=L; True = attend) or
    additive float. Returns (B, Q, H, D) as transformers' attention functions do."""
    B, H, Q, D = query.shape
    KV, L = key.shape[1], key.shape[2]
    plain = not (query.device.type != "cpu" or query.dtype != torch.float32 or H % KV or dropout
                 or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None)
    scale = scaling if scaling is not None else D ** -0.5
    if (plain and key.dtype == value.dtype == torch.float16
            and key.stride(-1) == value.stride(-1) == 1 and native.available()
            and (attention_mask is None or attention_mask.dtype == torch.bool)):
        causal = attention_mask is None and Q > 1 and (is_causal if is_causal is not None
                                                       else getattr(module, "is_causal", True))
        return native.decode_attention(query, key, value, attention_mask, causal, scale, _real(B * Q)), None
    if key.dtype != query.dtype and query.device.type == "cpu":  # a float16 KV cache (kv_dtype) read by prefill
        key, value = key.to(query.dtype), value.to(query.dtype)
    if not plain or Q > SMALL_QUERY:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    G = H // KV
    plan = _row_starts(attention_mask, B, L)
    if plan is not None:
        return _attention_by_row(query, key, value, plan, scale), None
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


def _real(n: int) -> torch.Tensor | None:
    """Inside int8.only_rows over these n query positions (a draft step, a grouped prefill): which are real, one flag
    a position, as the kernel reads them; None elsewhere."""
    from .int8 import _ONLY

    only = getattr(_ONLY, "rows", None)
    return only[2] if only is not None and only[0] == n else None


# A row's left padding is skipped (each row attends to its own columns only, one pair of matmuls per row) when the
# padded slots are at least PADDING_SHARE of the batch's and at least PADDING_SLOTS in all: per-row calls cost a few
# small ops a row, a padded slot only its share of two matmuls, so skipping pays only where padding is a large share
# (benchmarks/forward.py's results files: the gain with the gate, and the loss below it without).
PADDING_SHARE = 0.25
PADDING_SLOTS = 8192
_memo = threading.local()  # .last = (mask, version, plan): one mask serves every layer of a forward (per thread)


def _row_starts(mask, B: int, L: int):
    """(starts, masked): each row's first attended column (from the last query's mask) and the mask's negation
    when a column after a row's start is masked out (rejected drafts, causal queries), else None. None when
    padding is too small a share to pay for per-row matmuls, or the mask is not a boolean one."""
    if mask is None or mask.dtype != torch.bool or B == 1 or mask.shape[0] != B:
        return None
    version = None if mask.is_inference() else mask._version  # inference tensors keep no count (masks are new
    last_seen = getattr(_memo, "last", None)                     # in every forward there)
    if last_seen is not None and last_seen[0] is mask and last_seen[1] == version:  # not written since
        return last_seen[2]
    last = mask[:, 0, -1, :L]
    starts = last.byte().argmax(dim=1).tolist()  # first True; an all-False row gives 0 (attends to all, masked)
    plan = None
    if sum(starts) >= max(PADDING_SHARE * B * L, PADDING_SLOTS):
        inv = ~mask[..., :L]
        plan = (starts, inv if int(inv.sum()) > sum(starts) * mask.shape[-2] else None)
    _memo.last = (mask, version, plan)
    return plan


def _attention_by_row(query, key, value, plan, scale: float) -> torch.Tensor:
    """grouped_attention with each row's matmuls over its columns from its start on (the same sums: the skipped
    columns are masked out, exp(-inf) = 0)."""
    starts, masked = plan
    B, H, Q, D = query.shape
    KV, L = key.shape[1], key.shape[2]
    G = H // KV
    qs = (query * scale).reshape(B, KV, G * Q, D)  # scaled once for every row
    out = query.new_empty(B, KV, G * Q, D)
    for b, s in enumerate(starts):
        sc = torch.bmm(qs[b], key[b, :, s:].transpose(1, 2)).view(KV, G, Q, L - s)
        if masked is not None:
            sc.masked_fill_(masked[b, 0, :, s:], float("-inf"))
        torch.bmm(torch.softmax(sc, dim=-1).view(KV, G * Q, L - s), value[b, :, s:], out=out[b])
    return out.view(B, H, Q, D).transpose(1, 2).contiguous()


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
