"""int8 weights and int8 matmuls on CPU (`weights: int8` in conf/model/*.yaml).

Each nn.Linear of the decoder layers becomes an Int8Linear: its weight is rounded once to int8 with one scale
per output channel, and each input row is rounded to int8 with its own scale (absmax / 127) on every call.
The product is torch._int_mm (oneDNN; VNNI where the CPU has it), exact in int32, then scaled back.

Why this scheme: a row's result depends only on that row (integer sums are exact and the scales are
per row and per channel), so batching, padding and prefix reuse change no bits, as in fp32. torch's dynamic
quantization uses one scale per tensor, which ties a row's rounding to whatever shares its batch.
Measured on 2 cores (Xeon, AVX-512 VNNI, torch 2.13), one 1536x8960 matmul: int8 520 GFLOP/s at 16 rows and
1137 at 256 rows, against 29 and 122 for fp32 (a probe); the whole model: benchmarks/weights.py. Weights in
memory: 1/4 of fp32.
lm_head stays in the model's dtype: the argmax over 150k logits is where rounding would flip tokens.
"""
from __future__ import annotations

import torch


class Int8Linear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        # Stored N x K and passed as its transpose (a K x N view): oneDNN was 1.1-3.5x faster with this layout
        # than with a contiguous K x N matrix for 1-64 rows (measured here).
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float(),
                                                                        requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        rows = x.reshape(-1, shape[-1]).float()
        xs = (rows.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
        xq = torch.round(rows / xs).to(torch.int8)
        y = torch._int_mm(xq, self.qweight.t()).float().mul_(xs).mul_(self.scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row x per-channel"


def quantize_int8(model, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every nn.Linear whose name does not end with one of `skip` by an Int8Linear, in place.
    Returns how many were replaced."""
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is torch.nn.Linear and not any(name == s or name.endswith("." + s) for s in skip)]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Int8Linear(mod))
    return len(targets)
