"""A decode step's float work between the matmuls as compiled loops (EngineTuning.fused_ops; kernels.c section 6).

Why: outside its matmuls and attention, a decode step ran transformers' eager ops, hundreds of multiplies, adds and
norms, each a dispatch, an allocation and a pass over memory: a large share of the step on 2 cores
(benchmarks/decode_profile.py's results files). Three of them run here as one loop each, on CPU
float32 only, bit-equal to the ops they replace (the same IEEE operations in the same order on every element; tests/
test_fused.py), so answers do not move:
- RMSNorm (Qwen2, Llama): torch still computes the variance (`x.pow(2).mean(-1)`: the sum's order is torch's); the
  rest, `weight * (x * rsqrt(variance + eps))`, is one pass.
- rotary embedding (transformers' `apply_rotary_pos_emb` of those models): query and key, one pass each.
- the MLP with int8 projections and SiLU: the gate's SiLU stays torch's (in place), and its product with the up
  projection is rounded for the down projection in the same pass (Int8Linear.quantized), never written.
Anything else (another dtype or device, a draft step's skipped positions, an unknown model) takes the eager ops.
"""
from __future__ import annotations

import types

import torch

from . import native

NORMS = ("Qwen2RMSNorm", "LlamaRMSNorm")
MLPS = ("Qwen2MLP", "LlamaMLP")
ROTARY_MODULES = ("transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama")


def _plain(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype == torch.float32


def rms_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Qwen2RMSNorm.forward / LlamaRMSNorm.forward with the tail in one pass."""
    w = self.weight
    if not (_plain(hidden_states) and _plain(w) and hidden_states.stride(-1) == 1 and hidden_states.dim() >= 2):
        return type(self).forward(self, hidden_states)
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    var = x.pow(2).mean(-1, keepdim=True)  # torch's reduction, as the eager norm
    return native.rms_scale(x, var, self.variance_epsilon, w.detach().contiguous()).view(hidden_states.shape)


def rotary(eager):
    """transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), fused where it applies, else `eager`."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and all(map(_plain, (q, k, cos, sin)))
                and q.stride(-1) == 1 and k.stride(-1) == 1 and q.shape[-1] % 2 == 0
                and cos.shape == sin.shape and cos.shape[1:] == (q.shape[2], q.shape[3]) and k.shape[2:] == q.shape[2:]
                and cos.shape[0] in (1, q.shape[0]) and q.shape[0] == k.shape[0]
                and cos.is_contiguous() and sin.is_contiguous()):
            return native.rotary(q, cos, sin), native.rotary(k, cos, sin)
        return eager(q, k, cos, sin, unsqueeze_dim)
    apply_rotary_pos_emb.fixlab_eager = eager
    return apply_rotary_pos_emb


def mlp(self, x: torch.Tensor) -> torch.Tensor:
    """Qwen2MLP.forward / LlamaMLP.forward over Int8Linear projections: SiLU in place, then the product rounded for the
    down projection in one pass. Inside int8.only_rows (a draft step's or a grouped prefill's padding positions): the
    real positions are taken out once, go through the three projections as one compact block, and come back once
    (padding positions give zeros, as each projection would give them)."""
    from .int8 import _ONLY, only_rows

    rows = x.reshape(-1, x.shape[-1])
    only = getattr(_ONLY, "rows", None)
    if not _plain(x):
        return type(self).forward(self, x)
    if only is not None and only[0] == rows.shape[0]:
        real = rows[only[1]]
        with only_rows(real.shape[0], None):  # the compact block has no padding
            y = _mlp_rows(self, real)
        out = rows.new_zeros(rows.shape[0], y.shape[1]).index_copy_(0, only[1], y)
    else:
        out = _mlp_rows(self, rows)
    return out.reshape(*x.shape[:-1], self.down_proj.out_features)


def _mlp_rows(self, rows: torch.Tensor) -> torch.Tensor:
    """The fused MLP of (M, hidden) float32 rows: (M, hidden). With gate and up as one Int8Group (int8.py), both are
    column views of its output, read with their row stride, and a prefill's rows go in blocks (`_block_rows`)."""
    block = _block_rows(self)
    if rows.shape[0] > block:
        return torch.cat([_mlp_block(self, rows[i:i + block]) for i in range(0, rows.shape[0], block)])
    return _mlp_block(self, rows)


def _block_rows(self) -> int:
    """Most rows whose gate and up outputs (one tensor when they are an Int8Group) stay under heap.PREFILL_BLOCKS, so
    that a prefill's MLP output comes from the heap and not from fresh pages, layer after layer (tuning.prefill_tokens
    sizes a prefill for one intermediate_size-wide output; stacked, the gate and up output is twice that). Rows are
    independent (per-row rounding, exact integer sums): blocks change no value."""
    from .heap import PREFILL_BLOCKS
    from .int8 import Int8Member

    gate = self.gate_proj
    width = gate.group.linear.out_features if isinstance(gate, Int8Member) else gate.out_features
    return max(16, (PREFILL_BLOCKS - (64 << 10)) // (width * 4) // 16 * 16)  # glibc's chunk header and alignment


def _mlp_block(self, rows: torch.Tensor) -> torch.Tensor:
    a = torch.nn.functional.silu(self.gate_proj(rows), inplace=True)  # the projection's own tensor (or its columns)
    q, xs = native.mul_quantize_rows(a, self.up_proj(rows))
    return self.down_proj.quantized(q, xs)


def use_fused_ops(model) -> int:
    """Route a loaded CPU float32 model's norms, MLPs and rotary embedding through the fused loops where they apply.
    Returns how many modules were switched (the rotary embedding, process-wide, counts once); 0 without the compiled
    kernels."""
    import importlib

    from torch.nn import SiLU
    from transformers.activations import SiLUActivation

    from .int8 import Int8Linear, Int8Member

    if not native.available():
        return 0
    n = 0
    for mod in model.modules():
        name = type(mod).__name__
        if name in NORMS and hasattr(mod, "variance_epsilon"):
            mod.forward = types.MethodType(rms_norm, mod)
            n += 1
        elif (name in MLPS and isinstance(getattr(mod, "act_fn", None), (SiLUActivation, SiLU))
              and all(isinstance(getattr(mod, p, None), (Int8Linear, Int8Member)) for p in ("gate_proj", "up_proj"))
              and isinstance(getattr(mod, "down_proj", None), Int8Linear)):
            mod.forward = types.MethodType(mlp, mod)
            n += 1
    for path in ROTARY_MODULES:
        if type(model).__module__ == path or any(type(m).__module__ == path for m in model.modules()):
            module = importlib.import_module(path)
            if not hasattr(module.apply_rotary_pos_emb, "fixlab_eager"):
                module.apply_rotary_pos_emb = rotary(module.apply_rotary_pos_emb)
            n += 1
    return n
