"""float32 linears whose rows do not depend on their batch: fixlab's packed float32 matmul (kernels.c section 4).

Why: BLAS (MKL, oneDNN) picks its kernel and blocking by the number of rows, so a row's logits moved in the last bits
between 1, 2 and 16 rows here (up to 4e-5 on SmolLM2's lm_head: benchmarks/invariance.py), enough to flip a greedy
tie or a temperature sample, and so a rerun's answers. Here every output is one fused multiply-add chain over K in
order. Used where a float32 matmul remains in a model that is otherwise batch-invariant: the lm_head left in float32
beside int8 weights (`int8_skip`), and every linear under `weights: dtype` in float32.
"""
from __future__ import annotations

import torch

from . import native as kernels
from .int8 import _ONLY, MappedFiles


class PackedLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear, weight: torch.Tensor | None = None):
        super().__init__()
        self.packed = kernels.PackedF32((linear.weight if weight is None else weight).detach())
        self.register_buffer("packed_weight", self.packed.data, persistent=False)  # counted in what a model holds
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float().contiguous(),
                                                                        requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        rows = x.reshape(-1, shape[-1]).float()
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        only = getattr(_ONLY, "rows", None)
        if only is not None and only[0] == rows.shape[0]:  # a draft step's padding positions: not computed
            sel = rows[only[1]].contiguous()
            y = rows.new_zeros(rows.shape[0], self.out_features).index_copy_(0, only[1], self.packed.matmul(sel, self.bias))
        else:
            y = self.packed.matmul(rows, self.bias)
        return y.reshape(*shape[:-1], self.out_features).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float32 packed, batch-invariant"


def pack_float_linears(model) -> int:
    """Replace every float32 nn.Linear of `model` (int8 ones are already exact per row) by a PackedLinear, in place,
    one at a time. Returns how many."""
    targets = [name for name, mod in model.named_modules()
               if type(mod) is torch.nn.Linear and mod.weight.dtype == torch.float32 and mod.weight.device.type == "cpu"]
    with MappedFiles() as files:
        for name in targets:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            mod = getattr(parent, attr)
            setattr(parent, attr, PackedLinear(mod, files.read(mod.weight)))
            del mod
    return len(targets)
