"""A CPU matmul patch for float32 decode steps: nn.Linear as W @ x.T for a few rows (hf.py applies it where
EngineTuning.skinny_matmul is on, the default; paths.py times it as a float32 path)."""
from __future__ import annotations

import torch


def _skinny_linear(self, x: torch.Tensor) -> torch.Tensor:
    # W @ x.T instead of x @ W.T for a few rows: MKL's sgemm packs the whole weight matrix for small M, which
    # made small-batch decode steps far slower than the matrix-vector speed (benchmarks/forward.py measures it).
    rows = x.numel() // x.shape[-1]
    if rows > _SKINNY_MAX_ROWS or x.dtype != self.weight.dtype:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], y.shape[-1]).contiguous()


_SKINNY_MAX_ROWS = 128


def use_skinny_matmul(model) -> int:
    """Route the CPU decode-step matmuls of every nn.Linear through _skinny_linear. Returns how many."""
    import types

    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear:
            mod.forward = types.MethodType(_skinny_linear, mod)
            n += 1
    return n
