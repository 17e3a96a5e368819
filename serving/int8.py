"""int8 weights and int8 matmuls on CPU (`weights: int8` in conf/model/*.yaml).

Each nn.Linear of the decoder layers becomes an Int8Linear: its weight is rounded once to int8 with one scale
per output channel, and each input row is rounded to int8 with its own scale (absmax / 127) on every call.
The product is exact in int32, then scaled back. Three kernels compute it, with the same values (`Int8Plan`): torch's
torch._int_mm (oneDNN: AMX or VNNI where the CPU has them; on AVX2-only CPUs a reference loop, many times slower
than float32: benchmarks/paths.py), oneDNN's int8 matmul over weights it packed once (`onednn`: _int_mm reorders
them on every call) and fixlab's own over packed weights (native.PackedInt8: AVX-512 VNNI, AVX2 or portable loops).
Which one runs at which number of rows is measured on each machine (serving/paths.py; EngineTuning.int8_kernel forces
one). The rounding and the scaling run as two compiled loops where gcc builds them (native.py, EngineTuning.int8_native;
bit-equal to the eager ops kept below): on the 2-core EPYC they cut the work around the products in a decode step
to a fraction of the eager ops' (benchmarks/decode_profile.py).

Why this scheme: a row's result depends only on that row (integer sums are exact and the scales are
per row and per channel), so batching, padding and prefix reuse change no bits, as in fp32. torch's dynamic
quantization uses one scale per tensor, which ties a row's rounding to whatever shares its batch.
Measured on 2 cores (Xeon, AVX-512 VNNI, torch 2.13), one 1536x8960 matmul: int8 several times fp32's throughput
at 16 rows and at 256 rows (a probe); the whole model: benchmarks/weights.py. Weights in
memory: 1/4 of fp32.
lm_head stays in the model's dtype by default (`int8_skip: [lm_head]`): the argmax over 150k logits is where rounding
would flip tokens. The 1.5B pack quantizes it too: paired on every task its answers held (as many tasks passed, and
as many by one only: docs/RESULTS.md), decode ran faster, the fp32 tied weight's pages stay unread (0.9 GiB), and
its logits no longer depend on the batch (fp32's do: docs/RESULTS.md, memory).

Memory while quantizing: transformers maps a float32 safetensors file into the process and the weights are views
of that mapping, paged in when first read. Reading them through the mapping would leave every float32 page resident
(mapped file pages count in RSS until unmapped, and the embedding and lm_head keep the mapping alive): most of
the float32 model as dead pages for the 1.5B pack. So a weight that is an untouched view of a mapped file is read
with pread instead (`MappedFiles`: the same bytes, from the page cache, and the mapping's pages are never touched),
and the linears are replaced one at a time with no reference kept to the float32 ones, so an in-memory float32 model
is freed as it goes.
The embedding, used as it is, reads the rows a step asks for the same way (embedding.py).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from . import native as kernels


def quantize_rows(w: torch.Tensor, native: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, q): one scale per row, absmax / 127, and round(w / scale) clamped to [-127, 127] as int8.
    `native`: the compiled loop that rounds activations (native.quantize_rows: the same steps, one pass over a row,
    on torch's threads) where it builds. Its values are these: |w / scale| <= 127 (1 + 2^-24) rounds to at most 127,
    so the clamp never acts. The eager steps below took a large share of the 1.5B's build (2-core Xeon, AVX-512).
    max(amax, -amin) is absmax exactly, and rounding/clamping in place gives the same values as new tensors; it
    saves three float32 temporaries per matrix."""
    if native and w.dtype == torch.float32 and w.dim() == 2 and w.device.type == "cpu" and kernels.available():
        q, xs = kernels.quantize_rows(w)
        return xs.view(-1), q
    scale = (torch.maximum(w.amax(dim=1), w.amin(dim=1).neg_()) / 127.0).clamp_(min=1e-12)
    q = (w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return scale, q


_ONLY = threading.local()  # .rows = (n, index, real): inside only_rows, what Int8Linear computes of an n-row input
_OUT = threading.local()  # .lent = (module, pool): inside reuse_output, where that Int8Linear's output goes


class only_rows:
    """Inside this block, an Int8Linear whose input has `n` rows (tokens) computes only the rows in `index` and
    gives zeros for the rest. For a forward whose batch carries padding positions (a draft step: rows with fewer
    drafts than the longest): the matmuls cost what the real tokens cost. Rows are independent (per-row scales,
    exact integer sums), so the computed rows are bit-equal to a full computation's. `real`, the same rows as one flag a
    position, is what the attention kernel reads (cpu_attention.py: it skips the others too)."""

    def __init__(self, n: int, index: torch.Tensor | None):
        if index is None:
            self.value = None
        else:
            real = torch.zeros(n, dtype=torch.bool)
            real[index] = True
            self.value = (n, index, real)

    def __enter__(self):
        self.saved, _ONLY.rows = getattr(_ONLY, "rows", None), self.value

    def __exit__(self, *exc):
        _ONLY.rows = self.saved


def real_positions(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """t's (rows x width) positions, flat, at the real ones `index` (None: all), as only_rows names them."""
    flat = t.reshape(-1, t.shape[-1])
    return flat if index is None else flat.index_select(0, index)


class OutputPool:
    """One float32 buffer, grown to the largest output asked of it, that reuse_output lends to Int8Linear."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.float32)

    def take(self, rows: int, cols: int) -> torch.Tensor:
        if self.buffer.numel() < rows * cols:
            self.buffer = torch.empty(rows * cols, dtype=torch.float32)
        return self.buffer[:rows * cols].view(rows, cols)


class reuse_output:
    """Inside this block, `module` (an Int8Linear: the output layer) writes an output of at least MIN_BYTES into
    `pool`'s buffer, which its next call overwrites: for the engine's decode and draft steps, whose logits (19 MB at
    32 rows of Qwen2.5's 151,936) are read before the next forward. Outside a pool a tensor that large is a fresh
    mapping (heap.py: 4 MiB and up while decoding) whose pages fault in on every step. Values are the same either
    way. Only that module: two layers sharing one buffer would overwrite each other within a forward."""

    MIN_BYTES = 4 << 20

    def __init__(self, module, pool: OutputPool):
        self.lent = (module, pool) if isinstance(module, Int8Linear) else None

    def __enter__(self):
        self.saved, _OUT.lent = getattr(_OUT, "lent", None), self.lent

    def __exit__(self, *exc):
        _OUT.lent = self.saved


@dataclass(frozen=True)
class Int8Plan:
    """Which int8 kernel multiplies an input of a given number of rows (tokens): `small` up to `split` rows, `large`
    above. A kernel is "torch" (torch._int_mm), "fixlab" (native.PackedInt8 of build `isa`, None = this CPU's) or
    "onednn" (oneDNN's int8 matmul over weights it packed once: torch.ops.onednn.qlinear_prepack, AMX or VNNI where
    the CPU has them; torch._int_mm reorders the weights on every call and took twice as long at 64-896 rows here).
    All give the same values, so a plan changes speed only. Int8Linear keeps only the weight layouts its plan uses."""

    small: str = "torch"
    large: str = "torch"
    split: int = 0
    isa: str | None = None

    def __post_init__(self):
        for k in (self.small, self.large):
            if k not in INT8_KERNELS:
                raise ValueError(f"int8 kernel {k!r} is unknown: use one of {', '.join(INT8_KERNELS)}")

    def kernel(self, rows: int) -> str:
        return self.small if rows <= self.split else self.large

    @property
    def kernels(self) -> set[str]:
        return {self.large} | ({self.small} if self.split > 0 else set())

    def describe(self) -> str:
        name = {"torch": "torch._int_mm", "onednn": "oneDNN packed", "fixlab": f"fixlab {kernels.gemm_isa(self.isa)}"
                if "fixlab" in self.kernels else "fixlab"}
        if len(self.kernels) == 1:
            return name[self.large]
        return f"{name[self.small]} up to {self.split} rows, {name[self.large]} above"


INT8_KERNELS = ("torch", "fixlab", "onednn")


def onednn_available() -> bool:
    """oneDNN's packed int8 matmul is in this torch (x86 CPU builds), fixlab's scaling loop is built, and oneDNN's
    sums are exact on this CPU (_onednn_exact)."""
    return (hasattr(torch.ops.onednn, "qlinear_prepack") and torch.backends.mkldnn.is_available()
            and kernels.available() and _onednn_exact())


_EXACT: list[bool] = []  # _onednn_exact's answer, once per process


def _onednn_exact() -> bool:
    """Whether oneDNN's int8 products equal torch._int_mm's exact sums here, probed once on inputs at the ends of the
    range Int8Linear rounds to. Where the CPU multiplies bytes into int32 lanes (VNNI, AMX) they do; on an AVX2-only
    CPU oneDNN sums pairs of products in 16 bits first, which saturate at that range, so there it is no int8 kernel:
    it would change answers (tests/test_paths.py)."""
    if not _EXACT:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(-127, 128, (4, 128), generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (32, 128), generator=g, dtype=torch.int8)
        x[0], x[1], w[:8], w[8:16] = 127, -127, 127, -127  # pairs of products past 16 bits, of either sign
        want = torch._int_mm(x, w.t()).float()
        got = torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, torch.ops.onednn.qlinear_prepack(w, None),
                                                 torch.ones(32), torch.zeros(32, dtype=torch.long), None, 1.0, 0,
                                                 torch.float32, "none", [], "")
        _EXACT.append(bool(torch.equal(got, want)))
    return _EXACT[0]


class Int8Linear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear, weight: torch.Tensor | None = None, native: bool = False,
                 plan: Int8Plan | None = None, quantized: tuple[torch.Tensor, torch.Tensor] | None = None):
        """`weight`: linear.weight's values when the caller read them elsewhere (MappedFiles), else linear.weight.
        `native`: round the input and scale the products with the compiled loops of native.py (bit-equal).
        `plan`: which kernel at how many rows (default torch._int_mm always); fixlab's needs the compiled loops.
        `quantized`: (scale, q) already rounded (then `linear` gives only the shape and bias; it may be on "meta")."""
        super().__init__()
        self.native = native and kernels.available()
        self.plan = plan or Int8Plan()
        if "fixlab" in self.plan.kernels and not kernels.available():
            raise RuntimeError("int8 kernel fixlab needs fixlab's compiled kernels, which could not be built here")
        if "onednn" in self.plan.kernels and not onednn_available():
            raise RuntimeError("int8 kernel onednn needs torch's oneDNN int8 ops and fixlab's compiled kernels")
        if quantized is not None:
            scale, q = quantized
        else:
            scale, q = quantize_rows((linear.weight if weight is None else weight).detach().float())
        # Stored N x K and passed as its transpose (a K x N view): oneDNN is faster with this layout than with a
        # contiguous K x N matrix at decode's row counts (benchmarks/int8_matmul.py). Not kept where the plan never
        # uses it.
        self.packed = kernels.PackedInt8(q, self.plan.isa) if "fixlab" in self.plan.kernels else None
        if self.packed is not None:  # buffers too, so that what a model holds counts them (benchmarks/weights.py)
            self.register_buffer("packed_weight", self.packed.data, persistent=False)
            self.register_buffer("packed_colsum", self.packed.colsum, persistent=False)
        self.register_buffer("qweight", q.contiguous() if "torch" in self.plan.kernels else None)
        # oneDNN: its own packing of the weights, and unit scales: it gives the products as (float)int32 sums,
        # which scale_floats scales as scale_products does the int32 ones
        onednn = "onednn" in self.plan.kernels
        self.register_buffer("onednn_weight", torch.ops.onednn.qlinear_prepack(q.contiguous(), None) if onednn
                             else None, persistent=False)
        self.register_buffer("unit_scales", torch.ones(q.shape[0]) if onednn else None, persistent=False)
        self.register_buffer("zero_points", torch.zeros(q.shape[0], dtype=torch.long) if onednn else None,
                             persistent=False)
        self.register_buffer("scale", scale)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float(),
                                                                        requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        rows = x.reshape(-1, shape[-1]).float()
        only = getattr(_ONLY, "rows", None)
        if only is not None and only[0] == rows.shape[0]:  # a draft step's padding positions: not computed
            y = rows.new_zeros(rows.shape[0], self.out_features).index_copy_(0, only[1], self._rows(rows[only[1]]))
        else:
            y = self._rows(rows)
        return y.reshape(*shape[:-1], self.out_features).to(dtype)

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:
        if self.native or self.qweight is None:  # the rounding as a compiled loop (native.py), then the plan's kernel
            xq, xs = kernels.quantize_rows(rows)
            return self.quantized(xq, xs)
        xs = (rows.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
        xq = torch.round(rows / xs).to(torch.int8)
        y = torch._int_mm(xq, self.qweight.t()).float().mul_(xs).mul_(self.scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y

    def quantized(self, xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        """The product for input rows already rounded as _rows rounds them (xq int8 (M, K), xs float32 (M, 1)): the
        same values. Needs the compiled loops (fused.py rounds the MLP's product itself)."""
        out = self._out(xq.shape[0])
        kernel = self.plan.kernel(xq.shape[0])
        if self.packed is not None and kernel == "fixlab":
            return self.packed.matmul(xq, xs, self.scale, self.bias, out)
        if self.onednn_weight is not None and kernel == "onednn":
            m = xq.shape[0]
            if m == 1:  # oneDNN's one-row case is a slow path, two rows are not: a zero row beside it
                xq = torch.cat([xq, xq.new_zeros(1, xq.shape[1])])  # (rows are independent: the same values)
            y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, self.onednn_weight, self.unit_scales, self.zero_points,
                                                   None, 1.0, 0, torch.float32, "none", [], "")
            return kernels.scale_floats(y[:m], xs, self.scale, self.bias)
        acc = torch._int_mm(xq, self.qweight.t()) if out is None else torch._int_mm(
            xq, self.qweight.t(), out=out.view(torch.int32))
        return kernels.scale_products(acc, xs, self.scale, self.bias)

    def _out(self, rows: int) -> torch.Tensor | None:
        """The pool's buffer for a large output inside reuse_output, else None (a new tensor)."""
        lent = getattr(_OUT, "lent", None)
        if lent is None or lent[0] is not self or rows * self.out_features * 4 < reuse_output.MIN_BYTES:
            return None
        return lent[1].take(rows, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row x per-channel, "
                f"{self.plan.describe()}")


# Sibling projections of one input, multiplied as one matrix (Int8Group): attention's query, key and value, and the
# MLP's gate and up projections (Qwen2, Llama, Mistral share these names).
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Int8Group(torch.nn.Module):
    """Sibling linears that read the same input as one Int8Linear over their weights stacked by output channel, whose
    members (Int8Member, in the siblings' places) hand out their columns of its output.

    Why: each Int8Linear rounds its input and calls its kernel; the 1.5B pack's q, k, v and gate, up made five
    roundings and five kernel calls a layer where two do. On the 2-core Xeon (AMX) at 32 rows, oneDNN took clearly
    less time for the stacked q, k, v than for the three, and less for gate and up stacked than for the two. The
    values are the same: each output is its own channel's exact integer sum, scaled by its row's and its channel's
    scale, and the input's rounding is per row; stacking changes no element's arithmetic (tests/test_models_int8.py).

    The first member called with an input computes every member's columns and holds them until each member has
    taken its own; a call with another input (or a member called twice) computes again."""

    def __init__(self, linear: Int8Linear, sizes: list[int]):
        super().__init__()
        self.linear = linear
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.bounds = list(zip(starts[:-1], starts[1:]))
        self._held = threading.local()  # .v = [input, output, taken flags], per thread

    def take(self, x: torch.Tensor, i: int) -> torch.Tensor:
        held = getattr(self._held, "v", None)
        if held is None or held[0] is not x or held[2][i]:
            held = [x, self.linear(x), [False] * len(self.bounds)]
        held[2][i] = True
        self._held.v = None if all(held[2]) else held  # the last member's call lets both tensors go
        a, b = self.bounds[i]
        return held[1][..., a:b]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Int8Member(torch.nn.Module):
    """One linear of an Int8Group, where that linear was: its output is its columns of the group's (a view)."""

    def __init__(self, group: Int8Group, index: int):
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the group is its parent's, counted once
        self.index = index
        a, b = group.bounds[index]
        self.in_features, self.out_features = group.linear.in_features, b - a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.take(x, self.index)

    def weights(self) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """(int8 weight or None where the plan keeps only packed copies, scale, bias): this linear's rows of the
        group's, as an Int8Linear of its own would hold them."""
        a, b = self.group.bounds[self.index]
        g = self.group.linear
        return (None if g.qweight is None else g.qweight[a:b], g.scale[a:b], None if g.bias is None else g.bias[a:b])

    def extra_repr(self) -> str:
        a, b = self.group.bounds[self.index]
        return f"columns {a}:{b} of an Int8Group"


def _group_targets(model, targets: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(parent name, sibling names) for each GROUPS set whose linears are all targets under one parent, with one input
    width and all or none with a bias (a zero bias added would turn -0.0 into +0.0)."""
    chosen = set(targets)
    out = []
    for parent_name, parent in model.named_modules():
        for names in GROUPS:
            full = [f"{parent_name}.{n}" if parent_name else n for n in names]
            mods = [getattr(parent, n, None) for n in names]
            if (all(f in chosen for f in full) and len({m.in_features for m in mods}) == 1
                    and len({m.bias is None for m in mods}) == 1):
                out.append((parent_name, names))
    return out


def quantize_int8(model, skip: tuple[str, ...] = ("lm_head",), native: bool = True,
                  plan: Int8Plan | None = None, group: bool = True) -> int:
    """Replace every nn.Linear whose name does not end with one of `skip` by an Int8Linear, in place. Returns how
    many linears were replaced.
    `native`: the compiled rounding and scaling loops where they build (native.py; same values). `plan`: which
    int8 kernel at how many rows (Int8Plan; same values). `group`: siblings of one input (GROUPS) become one
    Int8Group (the same values), registered on their parent as `int8_group_<first name>`.
    One linear at a time, and only names are kept: a float32 linear is freed as soon as it is replaced."""
    targets = [name for name, mod in model.named_modules()
               if type(mod) is torch.nn.Linear and not any(name == s or name.endswith("." + s) for s in skip)]
    groups = _group_targets(model, targets) if group else []
    with MappedFiles() as files:
        for parent_name, names in groups:
            parent = model.get_submodule(parent_name) if parent_name else model
            mods = [getattr(parent, n) for n in names]
            rounded = [quantize_rows(files.read(m.weight).detach().float()) for m in mods]  # per channel, as apart
            shape = torch.nn.Linear(mods[0].in_features, sum(m.out_features for m in mods), bias=False, device="meta")
            if mods[0].bias is not None:
                shape.bias = torch.nn.Parameter(torch.cat([m.bias.detach().float() for m in mods]),
                                                requires_grad=False)
            linear = Int8Linear(shape, native=native, plan=plan, quantized=(
                torch.cat([s for s, _ in rounded]), torch.cat([q for _, q in rounded])))
            del rounded, mods
            together = Int8Group(linear, [getattr(parent, n).out_features for n in names])
            parent.add_module(f"int8_group_{names[0]}", together)
            for i, n in enumerate(names):
                setattr(parent, n, Int8Member(together, i))
        grouped = {f"{p}.{n}" if p else n for p, names in groups for n in names}
        for name in targets:
            if name in grouped:
                continue
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            mod = getattr(parent, attr)
            setattr(parent, attr, Int8Linear(mod, files.read(mod.weight), native=native, plan=plan))
            del mod
    return len(targets)


def read_fully(fd: int, view: memoryview, pos: int) -> bool:
    """Fill `view` from file offset `pos` (pread until done); False where the file ends first."""
    got = 0
    while got < len(view):
        k = os.preadv(fd, [view[got:]], pos + got)
        if k <= 0:
            return False
        got += k
    return True


class MappedFiles:
    """Reads a tensor that is a view of a memory-mapped file with pread, so the mapping's pages stay untouched.

    `read(t)` returns a new tensor equal to t, or t itself when t is not such a view. It reads the file only when the
    bytes there are provably t's: t is contiguous and inside one file mapping (/proc/self/maps) of a file that is
    still the one mapped (same device and inode), and no page of t was written since it was mapped (a written page
    of a private mapping is an anonymous copy, told apart by /proc/self/pagemap's file-page bit)."""

    PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self):
        self.maps: list[tuple[int, int, int, int, int, str]] = []  # start, end, file offset, device, inode, path
        self.fds: dict[str, int] = {}
        self.pagemap: int | None = None
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) < 6 or not parts[5].startswith("/"):
                        continue
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    major, minor = (int(x, 16) for x in parts[3].split(":"))
                    self.maps.append((start, end, int(parts[2], 16), os.makedev(major, minor), int(parts[4]),
                                      parts[5].rstrip("\n")))
            self.pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
        except OSError:  # not Linux, or no /proc: read every tensor as it is
            self.maps = []

    def __enter__(self) -> "MappedFiles":
        return self

    def __exit__(self, *exc) -> None:
        for fd in list(self.fds.values()) + ([self.pagemap] if self.pagemap is not None else []):
            os.close(fd)
        self.fds.clear()
        self.pagemap = None

    def locate(self, t: torch.Tensor) -> tuple[int, int] | None:
        """(fd, offset): where t's bytes lie in the file it is an untouched view of (the fd stays this object's:
        os.dup it to keep it); None when t is not such a view."""
        if self.pagemap is None or t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            return None
        ptr, n = t.data_ptr(), t.numel() * t.element_size()
        where = next((m for m in self.maps if m[0] <= ptr and ptr + n <= m[1]), None)
        if where is None or not self._pristine(ptr, n):
            return None
        start, _, offset, dev, inode, path = where
        fd = self._open(path, dev, inode)
        return None if fd is None else (fd, offset + ptr - start)

    def read(self, t: torch.Tensor) -> torch.Tensor:
        at = self.locate(t)
        if at is None:
            return t
        out = torch.empty(t.shape, dtype=t.dtype)
        # a file shorter than its mapping says: read through the mapping
        return out if read_fully(at[0], memoryview(out.view(-1).view(torch.uint8).numpy()), at[1]) else t

    def _open(self, path: str, dev: int, inode: int) -> int | None:
        if path not in self.fds:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, inode):  # replaced or deleted since it was mapped
                os.close(fd)
                return None
            self.fds[path] = fd
        return self.fds[path]

    def _pristine(self, ptr: int, n: int) -> bool:
        """No page of [ptr, ptr + n) is an anonymous copy: each is either not present (never read: the file's) or
        present as a file page. pagemap entry bits: 63 present, 62 swapped, 61 file page or shared anonymous."""
        first, last = ptr // self.PAGE, (ptr + n - 1) // self.PAGE
        try:
            raw = os.pread(self.pagemap, 8 * (last - first + 1), 8 * first)
        except OSError:
            return False
        if len(raw) != 8 * (last - first + 1):
            return False
        e = np.frombuffer(raw, dtype="<u8")
        present, swapped, filepage = (e >> np.uint64(63)) & 1, (e >> np.uint64(62)) & 1, (e >> np.uint64(61)) & 1
        return bool(np.all(np.where(present == 1, filepage == 1, swapped == 0)))
