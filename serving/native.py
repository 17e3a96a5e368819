"""fixlab's compiled CPU loops (kernels.c): int8's input rounding and output scaling (EngineTuning.int8_native), and
decode attention over a float16 KV cache (EngineTuning.kv_dtype, serving/cpu_attention.py).

Int8 loops. Why: around each torch._int_mm the eager path makes five passes over memory (abs, amax, divide, round,
cast in; int32 to float, two multiplies, add out), each a new tensor or a full read and write. On a 2-core EPYC
they took a large share of the int8 matmul time in decode and more of it in prefill (benchmarks/decode_profile.py).
The C loops read the input twice (absmax, then round) and scale the int32 products in place, in one pass.

The results are bit-equal to the eager ops (kernels.c says how; test in tests/test_models_int8.py), so
turning this on or off changes no answer.

3. int8 matmul over packed weights (`PackedInt8`): exact integer sums as torch._int_mm, for CPUs where that is slow
(AVX2-only: a reference loop) or slower than this kernel (few rows); which one a job uses is measured
(serving/paths.py).

Built once per machine and instruction set at first use: gcc -O3 -march=native -fopenmp (ISAS: or AVX2 only) into
FIXLAB_CACHE/kernels (quick), named by a hash of the source, the compiler, the flags and the CPU's flags. Loaded
after torch, so its OpenMP calls run on the runtime torch already loaded (torch/lib/libgomp.so.1: one thread pool).
Without gcc, or if the build fails, `available()` is False: Int8Linear keeps the eager ops and the KV cache stays
float32 (one line on stderr says why).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing", "-fPIC", "-shared"]
# The instruction sets a build can target. native: every instruction this CPU has (AVX-512 VNNI where present);
# avx2: x86-64-v3 (AVX2, FMA, F16C), the code an AVX2-only CPU (AMD Zen 2/3, Intel before Ice Lake) runs, which an
# AVX-512 machine runs too: so the AVX2 paths are built, tested and timed there; portable: no vector intrinsics.
ISAS = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3", "-mtune=generic"],
        "portable": ["-march=x86-64" if platform.machine() in ("x86_64", "AMD64") else "-march=native"]}
# FIXLAB_CPU_ISA=avx2 makes this process behave as on an AVX2-only CPU: the kernels are built for AVX2 (agents/
# serving/paths.py also keeps torch's own int8 and bf16 matmuls out of the calibration, as that CPU would).
FORCED_ISA = os.environ.get("FIXLAB_CPU_ISA", "").strip().lower() or None

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _build(isa: str) -> ctypes.CDLL | None:
    cc = shutil.which(os.environ.get("CC") or "gcc") or (None if os.environ.get("CC") else shutil.which("cc"))
    if cc is None or not SOURCE.exists():
        print("fixlab: compiled kernels: no C compiler (gcc) found; using the eager int8 ops and a float32 KV cache",
              file=sys.stderr)
        return None
    from .machine import cache_root

    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    flags = ISAS[isa] + FLAGS
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, _cpu_flags(), " ".join(flags)]).encode())
    out = cache_root() / "kernels" / f"kernels-{isa}-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        r = subprocess.run([cc, *flags, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = (r.stderr.strip().splitlines() or ["?"])[0][:200]
            print(f"fixlab: compiled kernels: {cc} failed (exit {r.returncode}: {first}); using the eager int8 ops "
                  "and a float32 KV cache", file=sys.stderr)
            return None
        os.replace(tmp, out)  # atomic: a concurrent builder's file is the same bytes
    return _declared(ctypes.CDLL(str(out)))


def _declared(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The library with each kernel's argument and result types (kernels.c's signatures)."""
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.fixlab_quantize_rows.argtypes = [p, i64, i64, i64, p, p, ctypes.c_int]
    lib.fixlab_scale_products.argtypes = [p, i64, i64, p, p, p, ctypes.c_int]
    lib.fixlab_decode_attention.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, p, p, i64, i64,
                                            i64, i64, i64, i64, i64, i64, p, i64, i64, ctypes.c_int, ctypes.c_float,
                                            p, p, ctypes.c_int]
    lib.fixlab_scale_floats.argtypes = [p, i64, i64, p, p, p, ctypes.c_int]
    lib.fixlab_quantize_rows.restype = lib.fixlab_scale_products.restype = lib.fixlab_scale_floats.restype = None
    lib.fixlab_decode_attention.restype = None
    lib.fixlab_gemm_isa.restype = ctypes.c_char_p
    lib.fixlab_gemm_isa.argtypes = []
    lib.fixlab_int8_packed_size.restype = i64
    lib.fixlab_int8_packed_size.argtypes = [i64, i64]
    lib.fixlab_int8_pack.argtypes = [p, i64, i64, i64, p, p, ctypes.c_int]
    lib.fixlab_int8_pack.restype = None
    lib.fixlab_int8_matmul.argtypes = [p, i64, i64, i64, p, p, i64, p, p, p, p, i64, ctypes.c_int]
    lib.fixlab_int8_matmul.restype = None
    lib.fixlab_f32_packed_size.restype = i64
    lib.fixlab_f32_packed_size.argtypes = [i64, i64]
    lib.fixlab_f32_pack.argtypes = [p, i64, i64, i64, p, ctypes.c_int]
    lib.fixlab_f32_pack.restype = None
    lib.fixlab_f32_matmul.argtypes = [p, i64, i64, i64, p, i64, p, p, i64, ctypes.c_int]
    lib.fixlab_f32_matmul.restype = None
    lib.fixlab_argmax_rows.argtypes = [p, i64, i64, i64, p, ctypes.c_int]
    lib.fixlab_argmax_rows.restype = None
    lib.fixlab_rms_scale.argtypes = [p, i64, i64, i64, p, ctypes.c_float, p, p, i64, ctypes.c_int]
    lib.fixlab_rotary.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, p, p, i64, p, ctypes.c_int]
    lib.fixlab_mul_quantize_rows.argtypes = [p, p, i64, i64, i64, i64, p, p, ctypes.c_int]
    lib.fixlab_rms_scale.restype = lib.fixlab_rotary.restype = lib.fixlab_mul_quantize_rows.restype = None
    lib.fixlab_mt_seed.argtypes = [p, ctypes.c_uint64]
    lib.fixlab_exponential.argtypes = [p, p, i64]
    lib.fixlab_multinomial1.argtypes = [p, p, i64]
    lib.fixlab_mt_seed.restype = lib.fixlab_exponential.restype = None
    lib.fixlab_multinomial1.restype = i64
    lib.fixlab_dequant_q4_k.argtypes = lib.fixlab_dequant_q6_k.argtypes = [p, i64, p, ctypes.c_int]
    lib.fixlab_dequant_q4_k.restype = lib.fixlab_dequant_q6_k.restype = None
    return lib


def default_isa() -> str:
    """The build this process runs: FIXLAB_CPU_ISA's, else native."""
    return FORCED_ISA or "native"


def library(isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels for an instruction set (ISAS; default: this CPU's own, or FIXLAB_CPU_ISA), built on first
    call; None where they cannot be built."""
    isa = isa or default_isa()
    if isa not in ISAS:
        raise ValueError(f"FIXLAB_CPU_ISA={isa!r} is unknown: use one of {', '.join(ISAS)}")
    if isa not in _libs:
        with _lock:
            if isa not in _libs:
                try:
                    _libs[isa] = _build(isa)
                except OSError as e:
                    print(f"fixlab: compiled kernels: {e}; using the eager int8 ops and a float32 KV cache",
                          file=sys.stderr)
                    _libs[isa] = None
    return _libs[isa]


def available() -> bool:
    return library() is not None


_beside: threading.Thread | None = None
_beside_lock = threading.Lock()


def build_beside() -> threading.Thread | None:
    """Build this process's kernels (library()) on a thread of their own, so that a first job compiles them while its
    weights install, download or convert instead of after (gcc once per machine; later jobs load the cached build).
    library() waits for that build rather than starting its own. None where they are already loaded here."""
    global _beside
    with _beside_lock:
        # A job asks for its weights more than once as it starts; one build thread is enough.
        if default_isa() in _libs or (_beside is not None and _beside.is_alive()):
            return None

        def build() -> None:
            try:
                library()
            except ValueError:  # an unknown FIXLAB_CPU_ISA: the caller's own library() call says so in one line
                pass

        _beside = threading.Thread(target=build, name="fixlab-kernels-build", daemon=True)
        _beside.start()
        return _beside


def runnable_isas() -> list[str]:
    """The builds this CPU can run, best first: native, then avx2 where the CPU has AVX2 and FMA (and native is more),
    then portable."""
    flags = set(_cpu_flags().split(":", 1)[-1].split())
    out = [default_isa()]
    if out[0] == "native" and {"avx2", "fma", "f16c"} <= flags and platform.machine() in ("x86_64", "AMD64"):
        out.append("avx2")
    out.append("portable")
    return out


def gemm_isa(isa: str | None = None) -> str:
    """What fixlab's int8 matmul in that build runs on: avx512vnni, avx2 or portable."""
    return library(isa).fixlab_gemm_isa().decode()


class PackedInt8:
    """An N x K int8 matrix packed for fixlab's int8 matmul of one build (kernels.c section 3): panels of columns, K in
    groups, plus each column's sum. Bit-equal to torch._int_mm with the same scaling (tests/test_models_int8.py)."""

    def __init__(self, q: torch.Tensor, isa: str | None = None):
        self.lib = library(isa)
        n, k = q.shape
        q = q.contiguous()
        self.n, self.k = n, k
        self.data = torch.empty(self.lib.fixlab_int8_packed_size(n, k), dtype=torch.int8)
        self.colsum = torch.empty(n, dtype=torch.int32)
        self.lib.fixlab_int8_pack(q.data_ptr(), n, k, k, self.data.data_ptr(), self.colsum.data_ptr(),
                                  torch.get_num_threads())

    def matmul(self, xq: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 (M, N) = ((xq @ w.T as exact int32) * xs) * ws + bias, for xq (M, K) int8 with unit column
        stride and xs (M, 1); into `out` (contiguous float32 (M, N)) when given."""
        m = xq.shape[0]
        y = torch.empty((m, self.n), dtype=torch.float32) if out is None else out
        self.lib.fixlab_int8_matmul(xq.data_ptr(), m, self.k, xq.stride(0), self.data.data_ptr(),
                                    self.colsum.data_ptr(), self.n, xs.data_ptr(), ws.data_ptr(),
                                    None if bias is None else bias.data_ptr(), y.data_ptr(), self.n,
                                    torch.get_num_threads())
        return y


class PackedF32:
    """An N x K float32 matrix packed for fixlab's float32 matmul (kernels.c section 4): every output is one fused
    multiply-add chain over K in order, so a row's result is the same at any number of rows (BLAS's is not)."""

    def __init__(self, w: torch.Tensor, isa: str | None = None):
        self.lib = library(isa)
        n, k = w.shape
        w = w.detach().float().contiguous()
        self.n, self.k = n, k
        self.data = torch.empty(self.lib.fixlab_f32_packed_size(n, k), dtype=torch.float32)
        self.lib.fixlab_f32_pack(w.data_ptr(), n, k, k, self.data.data_ptr(), torch.get_num_threads())

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """float32 (M, N) = x @ w.T + bias for x (M, K) float32 with unit column stride."""
        m = x.shape[0]
        y = torch.empty((m, self.n), dtype=torch.float32)
        self.lib.fixlab_f32_matmul(x.data_ptr(), m, self.k, x.stride(0), self.data.data_ptr(), self.n,
                                   None if bias is None else bias.data_ptr(), y.data_ptr(), self.n,
                                   torch.get_num_threads())
        return y


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, scales of shape (M, 1)) for a float32 (M, K) tensor whose last dim is contiguous: the eager
    `xs = (rows.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)`, `round(rows / xs).to(int8)`."""
    m, k = rows.shape
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    q = torch.empty((m, k), dtype=torch.int8)
    xs = torch.empty((m, 1), dtype=torch.float32)
    library().fixlab_quantize_rows(rows.data_ptr(), m, k, rows.stride(0), q.data_ptr(), xs.data_ptr(),
                              torch.get_num_threads())
    return q, xs


def scale_products(acc: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """acc (M, N) int32, contiguous, becomes float32 in place: `acc.float().mul_(xs).mul_(ws).add_(bias)`."""
    m, n = acc.shape
    library().fixlab_scale_products(acc.data_ptr(), m, n, xs.data_ptr(), ws.data_ptr(),
                               None if bias is None else bias.data_ptr(), torch.get_num_threads())
    return acc.view(torch.float32)


def scale_floats(y: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y (M, N) float32 products ((float)acc), contiguous, scaled in place as scale_products scales int32 ones."""
    m, n = y.shape
    library().fixlab_scale_floats(y.data_ptr(), m, n, xs.data_ptr(), ws.data_ptr(),
                                  None if bias is None else bias.data_ptr(), torch.get_num_threads())
    return y


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     causal: bool, scale: float, real: torch.Tensor | None = None) -> torch.Tensor:
    """query (B, H, Q, D) float32; key, value (B, KV, L, D) float16, last dim contiguous; mask None or
    bool (B or 1, 1, Q, >= L), True = attend; real None or bool (B * Q): the query positions to compute (the others,
    padding, give zeros). Returns (B, Q, H, D) float32, as transformers' attention functions."""
    B, H, Q, D = query.shape
    KV, L = key.shape[1], key.shape[2]
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = torch.empty((B, Q, H, D), dtype=torch.float32)
    msb = msq = 0
    if mask is not None:
        mask = mask[..., :L]
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
        msb, msq = (mask.stride(0) if mask.shape[0] > 1 else 0), mask.stride(2)
    library().fixlab_decode_attention(
        query.data_ptr(), B, H, Q, D, query.stride(0), query.stride(1), query.stride(2),
        key.data_ptr(), value.data_ptr(), KV, L,
        key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
        None if mask is None else mask.data_ptr(), msb, msq, int(causal), float(scale),
        None if real is None else real.data_ptr(), out.data_ptr(),
        torch.get_num_threads())
    return out


def argmax(x: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """x.argmax(dim=-1) for a CPU float32 tensor of 1 or 2 dims (the same indices: kernels.c section 5), through the
    compiled loop of build `isa` (None: this process's) where it is built; torch's otherwise."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() not in (1, 2) or x.shape[-1] == 0
            or x.stride(-1) != 1 or library(isa) is None):
        return x.argmax(dim=-1)
    rows = x.view(1, -1) if x.dim() == 1 else x
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    library(isa).fixlab_argmax_rows(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0), out.data_ptr(),
                                    torch.get_num_threads())
    return out[0] if x.dim() == 1 else out


# kernels.c section 6 (fused.py says when they apply): float32 CPU tensors, last dim contiguous.
def rms_scale(x: torch.Tensor, var: torch.Tensor, eps: float, w: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """w * (x * (1 / sqrt(var + eps))) for x (M, N), var (M, 1) contiguous, w (N,) contiguous: RMSNorm's tail."""
    m, n = x.shape
    out = torch.empty((m, n), dtype=torch.float32)
    library(isa).fixlab_rms_scale(x.data_ptr(), m, n, x.stride(0), var.data_ptr(), float(eps), w.data_ptr(),
                                  out.data_ptr(), n, torch.get_num_threads())
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin for x (B, H, L, D) and cos, sin (B or 1, L, D) contiguous; the result is
    (B, H, L, D), laid out (B, L, H, D) as transformers' ops lay out a transposed projection's."""
    B, H, L, D = x.shape
    out = torch.empty((B, L, H, D), dtype=torch.float32)
    library(isa).fixlab_rotary(x.data_ptr(), B, H, L, D, x.stride(0), x.stride(1), x.stride(2), cos.data_ptr(),
                               sin.data_ptr(), 0 if cos.shape[0] == 1 else L * D, out.data_ptr(),
                               torch.get_num_threads())
    return out.transpose(1, 2)


def mul_quantize_rows(a: torch.Tensor, b: torch.Tensor, isa: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows(a * b) for a, b (M, K) without writing the product: (int8 rows, scales (M, 1))."""
    m, k = a.shape
    q = torch.empty((m, k), dtype=torch.int8)
    xs = torch.empty((m, 1), dtype=torch.float32)
    library(isa).fixlab_mul_quantize_rows(a.data_ptr(), b.data_ptr(), m, k, a.stride(0), b.stride(0), q.data_ptr(),
                                          xs.data_ptr(), torch.get_num_threads())
    return q, xs
