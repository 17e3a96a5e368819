"""A step's decoder layers as one compiled call (kernels.c section 8): what unpadded.py's Python loop does for each
layer of a CPU float32 Qwen2 or Llama model with int8 projections, for the real positions of a decode step, a draft
step or the prefill of rows whose kept KV the cache already holds (a prefix hit).

Why: at 32 rows x 700 tokens of context the loop spent a noticeable share of a decode step between its kernels
(benchmarks/decode_profile.py's "rest of the forward"), Python and torch's dispatch while the other core spun in
OpenMP. Here the kernels run back to back in C: norms, roundings, the four int8 matmuls, rotary, the cache's new
columns, attention, SiLU and the residual adds.

Every value is the one the loop gives (tests/test_decoder.py). The loop's two torch ops, RMSNorm's variance
(`x.pow(2).mean(-1)`) and SiLU, are done as torch does them: its float sum's order and its own Sleef exp, taken from
libtorch. Which vector width and which exp this torch uses on this CPU is found at first use by comparing with torch
(`_torch_order`); where nothing matches, or a step falls outside what the C loop does (another model, a kernel plan
other than fixlab's, a float32 cache), `forward` returns None and unpadded.py runs its loop.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading

import torch

from . import native

log = logging.getLogger(__name__)
LAYERS = ("Qwen2DecoderLayer", "LlamaDecoderLayer")
KEEP_SCRATCH_ROWS = 256  # positions up to which a call's scratch buffers are kept for the next (decode, draft steps)
_c = ctypes


class _Linear(_c.Structure):
    _fields_ = [("packed", _c.c_void_p), ("colsum", _c.c_void_p), ("ws", _c.c_void_p), ("bias", _c.c_void_p),
                ("n", _c.c_int64)]


class _Layer(_c.Structure):
    _fields_ = [("norm_in", _c.c_void_p), ("norm_post", _c.c_void_p), ("eps_in", _c.c_float),
                ("eps_post", _c.c_float), ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear),
                ("down", _Linear), ("k", _c.c_void_p), ("v", _c.c_void_p), ("ksb", _c.c_int64), ("ksh", _c.c_int64),
                ("ksl", _c.c_int64), ("vsb", _c.c_int64), ("vsh", _c.c_int64), ("vsl", _c.c_int64),
                ("k0", _c.c_void_p), ("v0", _c.c_void_p)]


def _declare(lib) -> None:
    i64, p, i32, f32 = _c.c_int64, _c.c_void_p, _c.c_int, _c.c_float
    lib.fixlab_torch_mean_squares.argtypes = [p, i64, i64, i64, p, i32, i32]
    lib.fixlab_torch_silu.argtypes = [p, i64, i64, i64, i32, p, i32]
    lib.fixlab_decoder_layers.argtypes = [p, i64, p, i64, i64, i64, i64, i64, i64, i64, i64, p, p, p, p, i64, p,
                                          i64, i64, i32, f32, i32, i32, p, i64, p, p, p, p, p, p, p, p, p, i32]
    lib.fixlab_torch_mean_squares.restype = lib.fixlab_torch_silu.restype = None
    lib.fixlab_decoder_layers.restype = None


# torch's Sleef exp for each vector width (libtorch_cpu exports them); the first that gives torch's SiLU is used
EXPS = {16: ("Sleef_finz_expf16_u10avx512f", "Sleef_expf16_u10avx512f", "Sleef_expf16_u10"),
        8: ("Sleef_finz_expf8_u10avx2", "Sleef_expf8_u10avx2", "Sleef_expf8_u10")}


def _sleef(name: str) -> int | None:
    try:
        lib = _c.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        return _c.cast(getattr(lib, name), _c.c_void_p).value
    except (OSError, AttributeError):
        return None


def _torch_order(lib, hid: int, inter: int) -> tuple[int, int, int] | None:
    """(sum lanes, SiLU lanes, exp address) with which the C loops give torch's own variance and SiLU bit for bit on
    this CPU, at these widths and the row counts a step has; None where no choice does."""
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    rows = (1, 2, 3, 5, 8, 13, 32, 33, 48, 64, 97)
    sums = None
    for lanes in (8, 16):
        ok = True
        for m in rows:
            x = torch.randn(m, hid, generator=g) * torch.rand(m, 1, generator=g) * 40
            want = x.pow(2).mean(-1)
            got = torch.empty(m)
            lib.fixlab_torch_mean_squares(x.data_ptr(), m, hid, hid, got.data_ptr(), lanes, threads)
            if not torch.equal(want.view(torch.int32), got.view(torch.int32)):
                ok = False
                break
        if ok:
            sums = lanes
            break
    if sums is None:
        return None
    for lanes, names in EXPS.items():
        for name in names:
            fn = _sleef(name)
            if fn is None:
                continue
            ok = True
            for m in rows:
                both = torch.randn(m, 2 * inter, generator=g) * 12
                want, got = both.clone(), both.clone()
                torch.nn.functional.silu(want[:, :inter], inplace=True)  # as fused.py: in place on the gate's columns
                lib.fixlab_torch_silu(got.data_ptr(), m, inter, 2 * inter, lanes, fn, threads)
                if not torch.equal(want.view(torch.int32), got.view(torch.int32)):
                    ok = False
                    break
            if ok:
                return sums, lanes, fn
    return None


def _linear(lin) -> _Linear:
    return _Linear(lin.packed.data.data_ptr(), lin.packed.colsum.data_ptr(), lin.scale.data_ptr(),
                   None if lin.bias is None else lin.bias.data_ptr(), lin.out_features)


class Stack:
    """A model's decoder layers as kernels.c sees them: built once (`of`), then `forward` per step."""

    def __init__(self, model, lib, order, layers: list[_Layer], plans: list, dims: dict, block: int):
        self.model, self.lib, self.order, self.plans, self.dims = model, lib, order, plans, dims
        self.block = block  # fused.py's MLP takes rows in blocks of this many (each its own SiLU call): so does C
        self.layers = (_Layer * len(layers))(*layers)
        self._scratch: dict[str, torch.Tensor] = {}

    @classmethod
    def of(cls, model) -> "Stack | None":
        """The model's Stack, built at first call; None where the C loop does not apply to this model."""
        st = model.__dict__.get("_fixlab_decoder", False)
        if st is False:
            try:
                st = cls._build(model)
            except Exception:  # anything unexpected in a model's layout: unpadded.py's loop serves it
                log.warning("compiled decoder layers unavailable", exc_info=True)
                st = None
            model.__dict__["_fixlab_decoder"] = st
        return st

    @classmethod
    def _build(cls, model) -> "Stack | None":
        from . import fused
        from .cpu_attention import NAME
        from .int8 import Int8Linear, Int8Member

        inner = model.model
        if not native.available() or getattr(inner.config, "_attn_implementation", None) != NAME:
            return None
        layers = list(inner.layers[: inner.config.num_hidden_layers])
        libs, plans, out = set(), [], []
        dims = None
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            if type(layer).__name__ not in LAYERS:
                return None
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if any(getattr(m.forward, "__func__", None) is not fused.rms_norm for m in norms):
                return None
            if getattr(mlp.forward, "__func__", None) is not fused.mlp:
                return None
            q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
            gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
            if not (all(isinstance(m, Int8Member) for m in (q, k, v, gate, up))
                    and q.group is k.group is v.group and (q.index, k.index, v.index) == (0, 1, 2)
                    and gate.group is up.group and (gate.index, up.index) == (0, 1)
                    and isinstance(o, Int8Linear) and isinstance(down, Int8Linear)):
                return None
            lins = (q.group.linear, o, gate.group.linear, down)
            if any(lin.packed is None for lin in lins):
                return None
            libs |= {id(lin.packed.lib) for lin in lins}
            plans += [lin.plan for lin in lins]
            D, H, KV = attn.head_dim, q.out_features // attn.head_dim, k.out_features // attn.head_dim
            d = {"hid": layer.input_layernorm.weight.shape[0], "H": H, "KV": KV, "D": D, "inter": up.out_features,
                 "scale": float(attn.scaling)}
            if dims is None:
                dims = d
            if d != dims or o.in_features != H * D or o.out_features != d["hid"] or v.out_features != KV * D:
                return None
            w_in, w_post = (m.weight.detach() for m in norms)
            if not all(w.dtype == torch.float32 and w.is_contiguous() for w in (w_in, w_post)):
                return None
            out.append(_Layer(w_in.data_ptr(), w_post.data_ptr(), norms[0].variance_epsilon,
                              norms[1].variance_epsilon, _linear(lins[0]), _linear(o), _linear(lins[2]),
                              _linear(down)))
        if not out or len(libs) != 1:
            return None
        lib = layers[0].self_attn.o_proj.packed.lib
        if not hasattr(lib, "fixlab_decoder_layers"):
            return None
        _declare(lib)
        order = _torch_order(lib, dims["hid"], dims["inter"])
        if order is None:
            log.info("compiled decoder layers: torch's variance or SiLU order not matched here; Python loop kept")
            return None
        return cls(model, lib, order, out, list({id(p): p for p in plans}.values()), dims,
                   fused._block_rows(layers[0].mlp))

    def _buf(self, name: str, numel: int, dtype=torch.float32) -> torch.Tensor:
        t = self._scratch.get(name)
        if t is None or t.numel() < numel or t.dtype != dtype:
            t = self._scratch[name] = torch.empty(max(numel, 1), dtype=dtype)
        return t

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache,
                index: torch.Tensor | None) -> torch.Tensor | None:
        """unpadded.forward's result (the last hidden states at the real positions, the cache's new columns written),
        or None, having changed nothing, where this step is not one the C loop does."""
        from transformers.masking_utils import create_causal_mask

        from .int8 import only_rows, real_positions
        from .kvcache import _GrowingKV

        B, W = ids.shape
        n = B * W if index is None else int(index.numel())
        if any(plan.kernel(n) != "fixlab" for plan in self.plans):
            return None
        cl = cache.layers
        held = cl[0].get_seq_length() if cl and isinstance(cl[0], _GrowingKV) else 0
        if held <= 0 or len(cl) != len(self.layers) or not all(
                isinstance(c, _GrowingKV) and c.get_seq_length() == held and c._b == B
                and c._kbuf.dtype == torch.float16 for c in cl):
            return None  # an empty cache (a plain prefill) or one this loop does not write
        inner, d = self.model.model, self.dims
        emb = inner.embed_tokens(ids)
        causal = create_causal_mask(config=inner.config, inputs_embeds=emb, attention_mask=mask,
                                    past_key_values=cache, position_ids=pos)
        if causal is not None and causal.dtype != torch.bool:
            return None
        c, s = inner.rotary_emb(emb, pos)
        cos, sin = (real_positions(t.expand(B, -1, -1), index).float().contiguous() for t in (c, s))
        x = real_positions(emb, index).contiguous()
        L = held + W
        self._point_at_cache(cl, B, W)
        msb = msq = 0
        mptr = None
        if causal is not None:
            m = causal[..., :L]
            m = m if m.stride(-1) == 1 else m.contiguous()
            msb, msq, mptr = (m.stride(0) if m.shape[0] > 1 else 0), m.stride(2), m.data_ptr()
        idx, real = self._rows(index, n, B * W)
        H, KV, D, hid, inter = d["H"], d["KV"], d["D"], d["hid"], d["inter"]
        HD = H * D
        lanes_sum, lanes_silu, vexp = self.order
        qkv_n = self.layers[0].qkv.n
        self.lib.fixlab_decoder_layers(
            _c.addressof(self.layers), len(self.layers), x.data_ptr(), n, hid, H, KV, D, inter, B, W, idx.data_ptr(),
            None if real is None else real.data_ptr(), cos.data_ptr(), sin.data_ptr(), L, mptr, msb, msq,
            int(causal is None and W > 1), d["scale"], lanes_sum, lanes_silu, vexp, self.block,
            self._buf("xn", n * hid).data_ptr(), self._buf("q8", n * max(hid, inter, HD), torch.int8).data_ptr(),
            self._buf("xs", n).data_ptr(), self._buf("qkv", n * qkv_n).data_ptr(),
            self._buf("qpad", B * W * HD).data_ptr(), self._buf("att", max(B * W * HD, n * KV * D)).data_ptr(),
            self._buf("tmp", n * max(hid, HD)).data_ptr(), self._buf("gu", n * 2 * inter).data_ptr(),
            self._buf("var", n).data_ptr(), torch.get_num_threads())
        for c_ in cl:
            c_.took(B, W)
        if n > KEEP_SCRATCH_ROWS:  # a prefill's buffers go (the loop's activations would have); a step's are kept
            self._scratch.clear()
        with only_rows(n, None):
            return inner.norm(x)

    def _point_at_cache(self, cl, B: int, W: int) -> None:
        """Each layer's record told where its cache's keys and values are, with room made for W new columns."""
        for layer, c_ in zip(self.layers, cl):
            c_.make_room(B, W)
            kb, vb = c_._kbuf, c_._vbuf
            layer.ksb, layer.ksh, layer.ksl = kb.stride(0), kb.stride(1), kb.stride(2)
            layer.vsb, layer.vsh, layer.vsl = vb.stride(0), vb.stride(1), vb.stride(2)
            layer.k, layer.v = kb.data_ptr() + 2 * c_._n * layer.ksl, vb.data_ptr() + 2 * c_._n * layer.vsl
            layer.k0, layer.v0 = kb.data_ptr() + 2 * c_._s * layer.ksl, vb.data_ptr() + 2 * c_._s * layer.vsl

    def _rows(self, index: torch.Tensor | None, n: int, slots: int):
        """(the rows the loop computes, as int64 indices; which of the batch's slots are real, or None: all are)."""
        if index is None:
            return self._arange(n), None
        real = torch.zeros(slots, dtype=torch.bool)
        idx = index.to(torch.int64).contiguous()
        real[idx] = True
        return idx, real

    def _arange(self, n: int) -> torch.Tensor:
        t = self._scratch.get("arange")
        if t is None or t.numel() < n:
            t = self._scratch["arange"] = torch.arange(max(n, 64), dtype=torch.int64)
        return t[:n]


_lock = threading.Lock()


def forward(model, ids, mask, pos, cache, index):
    """unpadded.forward through the compiled layers, or None where they do not apply (see Stack.forward)."""
    with _lock:
        st = Stack.of(model)
    return None if st is None else st.forward(ids, mask, pos, cache, index)
