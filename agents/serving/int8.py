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

Linears that read the same input (q/k/v of attention, gate/up of the MLP) can be fused (`fuse`, `model.int8_fuse`): one
input rounding and one matmul over their stacked weights, each linear then handed its columns. Integer sums are
exact and the scales per row and per channel, so the fused outputs are bit-equal to the separate ones (test).
Off by default: on a 2-core EPYC it bought nothing measurable (benchmarks/weights.py rows int8-sep vs int8).
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


class _Stacked(torch.nn.Module):
    """Linears that read one input, as one Int8Linear over their stacked weights. The first member called with an
    input computes every member's output; the others, called with that same tensor, take theirs. A member called
    with another input (or twice) recomputes, so a caller with another call order still gets exact answers."""

    def __init__(self, linears: list[torch.nn.Linear]):
        super().__init__()
        stacked = torch.nn.Linear(linears[0].in_features, sum(m.out_features for m in linears),
                                  bias=any(m.bias is not None for m in linears))
        with torch.no_grad():
            stacked.weight.copy_(torch.cat([m.weight.detach().float() for m in linears]))
            if stacked.bias is not None:
                stacked.bias.copy_(torch.cat([m.bias.detach().float() if m.bias is not None
                                              else torch.zeros(m.out_features) for m in linears]))
        self.inner = Int8Linear(stacked)
        self.splits = [m.out_features for m in linears]
        self._x: torch.Tensor | None = None
        self._outs: tuple = ()
        self._left: set[int] = set()

    def output(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if x is not self._x or i not in self._left:
            self._outs = self.inner(x).split(self.splits, dim=-1)
            self._x, self._left = x, set(range(len(self.splits)))
        self._left.discard(i)
        out = self._outs[i]
        if not self._left:
            self._x, self._outs = None, ()  # drop the reference: the next layer's input is another tensor
        return out


class StackedSlice(torch.nn.Module):
    """One member of a _Stacked group (q_proj of q/k/v...): its columns of the group's product."""

    def __init__(self, group: _Stacked, index: int):
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the parent holds the group once
        self.index = index
        self.in_features, self.out_features = group.inner.in_features, group.splits[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(self.index, x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 stacked #{self.index}"


# Linears of one parent module that transformers' decoder layers call on the same input, in this order.
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def quantize_int8(model, skip: tuple[str, ...] = ("lm_head",), fuse: bool = False) -> int:
    """Replace every nn.Linear whose name does not end with one of `skip` by int8 (an Int8Linear, or with `fuse` a
    slice of a stacked group for q/k/v and gate/up), in place. Returns how many linears were replaced."""
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is torch.nn.Linear and not any(name == s or name.endswith("." + s) for s in skip)]
    done = set()
    if fuse:
        chosen = {name for name, _ in targets}
        for parent_name, parent in list(model.named_modules()):
            for g, names in enumerate(SHARED_INPUT):
                full = [f"{parent_name}.{n}" if parent_name else n for n in names]
                if not all(f in chosen for f in full):
                    continue
                members = [getattr(parent, n) for n in names]
                if len({m.in_features for m in members}) != 1:
                    continue
                group = _Stacked(members)
                parent.add_module(f"int8_stacked{g}", group)
                for i, n in enumerate(names):
                    setattr(parent, n, StackedSlice(group, i))
                done.update(full)
    for name, mod in targets:
        if name in done:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Int8Linear(mod))
    return len(targets)
