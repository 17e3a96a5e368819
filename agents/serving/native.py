"""fixlab's compiled CPU loops (kernels.c): int8's input rounding and output scaling (`model.int8_native`), and
decode attention over a float16 KV cache (`model.kv_dtype`, agents/serving/cpu_attention.py).

Int8 loops. Why: around each torch._int_mm the eager path makes five passes over memory (abs, amax, divide, round,
cast in; int32 to float, two multiplies, add out), each a new tensor or a full read and write. On a 2-core EPYC they took
about a third of the int8 matmul time in decode and 40% of it in prefill (benchmarks/decode_profile.py). The C
loops read the input twice (absmax, then round) and scale the int32 products in place, in one pass.

The results are bit-equal to the eager ops (kernels.c says how; test in tests/test_models_int8.py), so
turning this on or off changes no answer.

Built once per machine at first use: gcc -O3 -march=native -fopenmp into FIXLAB_CACHE/kernels (~0.2 s), named by a
hash of the source, the compiler and the CPU's flags. Loaded after torch, so its OpenMP calls run on the runtime
torch already loaded (torch/lib/libgomp.so.1: one thread pool). Without gcc, or if the build fails, `available()`
is False: Int8Linear keeps the eager ops and the KV cache stays float32 (one line on stderr says why).
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
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing", "-fPIC", "-shared"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _build() -> ctypes.CDLL | None:
    cc = shutil.which(os.environ.get("CC") or "gcc") or (None if os.environ.get("CC") else shutil.which("cc"))
    if cc is None or not SOURCE.exists():
        print("fixlab: compiled kernels: no C compiler (gcc) found; using the eager int8 ops and a float32 KV cache",
              file=sys.stderr)
        return None
    from .packs import cache_root

    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, _cpu_flags(), " ".join(FLAGS)]).encode())
    out = cache_root() / "kernels" / f"kernels-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        r = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = (r.stderr.strip().splitlines() or ["?"])[0][:200]
            print(f"fixlab: compiled kernels: {cc} failed (exit {r.returncode}: {first}); using the eager int8 ops "
                  "and a float32 KV cache", file=sys.stderr)
            return None
        os.replace(tmp, out)  # atomic: a concurrent builder's file is the same bytes
    lib = ctypes.CDLL(str(out))
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.fixlab_quantize_rows.argtypes = [p, i64, i64, i64, p, p, ctypes.c_int]
    lib.fixlab_scale_products.argtypes = [p, i64, i64, p, p, p, ctypes.c_int]
    lib.fixlab_decode_attention.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, p, p, i64, i64,
                                            i64, i64, i64, i64, i64, i64, p, i64, i64, ctypes.c_int, ctypes.c_float,
                                            p, ctypes.c_int]
    lib.fixlab_quantize_rows.restype = lib.fixlab_scale_products.restype = None
    lib.fixlab_decode_attention.restype = None
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first call; None where they cannot be built."""
    global _lib, _tried
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    _lib = _build()
                except OSError as e:
                    print(f"fixlab: compiled kernels: {e}; using the eager int8 ops and a float32 KV cache",
                          file=sys.stderr)
                    _lib = None
                _tried = True
    return _lib


def available() -> bool:
    return library() is not None


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, scales of shape (M, 1)) for a float32 (M, K) tensor whose last dim is contiguous: the eager
    `xs = (rows.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)`, `round(rows / xs).to(int8)`."""
    m, k = rows.shape
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    q = torch.empty((m, k), dtype=torch.int8)
    xs = torch.empty((m, 1), dtype=torch.float32)
    _lib.fixlab_quantize_rows(rows.data_ptr(), m, k, rows.stride(0), q.data_ptr(), xs.data_ptr(),
                              torch.get_num_threads())
    return q, xs


def scale_products(acc: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """acc (M, N) int32, contiguous, becomes float32 in place: `acc.float().mul_(xs).mul_(ws).add_(bias)`."""
    m, n = acc.shape
    _lib.fixlab_scale_products(acc.data_ptr(), m, n, xs.data_ptr(), ws.data_ptr(),
                               None if bias is None else bias.data_ptr(), torch.get_num_threads())
    return acc.view(torch.float32)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     causal: bool, scale: float) -> torch.Tensor:
    """query (B, H, Q, D) float32; key, value (B, KV, L, D) float16, last dim contiguous; mask None or
    bool (B or 1, 1, Q, >= L), True = attend. Returns (B, Q, H, D) float32, as transformers' attention functions."""
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
    _lib.fixlab_decode_attention(
        query.data_ptr(), B, H, Q, D, query.stride(0), query.stride(1), query.stride(2),
        key.data_ptr(), value.data_ptr(), KV, L,
        key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
        None if mask is None else mask.data_ptr(), msb, msq, int(causal), float(scale), out.data_ptr(),
        torch.get_num_threads())
    return out
