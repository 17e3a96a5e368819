"""What machine a measurement ran on: the CPU's model name and the instruction-set flags that decide which kernels it
can run, or the GPU. One helper for every results file (benchmarks/, the full-size recorder, MLflow params) and for
the path chooser's cache key (serving/paths.py). Imports no torch: a hosted-model job describes its machine too.
"""
from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

# The flags that decide speed here: int8 dot products (VNNI, AMX), bf16 in hardware, 512-bit vectors, AVX2 + FMA.
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
         "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "bf16", "sve")


@lru_cache(maxsize=1)
def cpu() -> dict:
    """{"model": name, "arch": x86_64 | aarch64, "flags": [the FLAGS present], "cores": logical CPUs this process may
    use}. On a machine without /proc/cpuinfo the model is platform.processor() and the flags are empty."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "cpu model") and not model:
                    model = " ".join(value.split())
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    from .cores import usable_cores

    return {"model": model or platform.processor() or "unknown", "arch": platform.machine(),
            "flags": [f for f in FLAGS if f in flags], "cores": usable_cores()}


def isa_family(info: dict | None = None) -> str:
    """The kernel family a CPU gets: amx, avx512-vnni, avx512, avx2, arm or baseline (the headings speed is grouped
    by in docs/RESULTS.md)."""
    info = info or cpu()
    f = set(info.get("flags") or ())
    if info.get("arch") in ("aarch64", "arm64"):
        return "arm"
    if "amx_int8" in f:
        return "amx"
    if "avx512_vnni" in f:
        return "avx512-vnni"
    if "avx512f" in f:
        return "avx512"
    if {"avx2", "fma"} <= f:
        return "avx2"
    return "baseline"


def describe(**extra) -> dict:
    """The machine block of a results file: the CPU's model name (`cpu`), `arch`, `cpu_flags` (the FLAGS present),
    `cpu_family` (isa_family), usable `cores`, Python's and torch's versions, instruction sets forced by environment
    (FIXLAB_CPU_ISA, ONEDNN_MAX_CPU_ISA...: a figure measured so is not the CPU's own) and, where CUDA is up in this
    process already, the GPU; then `extra` (threads, load average...)."""
    from importlib import metadata
    import sys

    c = cpu()
    out = {"cpu": c["model"], "arch": c["arch"], "cpu_flags": c["flags"], "cpu_family": isa_family(c),
           "cores": c["cores"], "python": platform.python_version()}
    try:
        out["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        pass
    forced = {k: os.environ[k] for k in ("FIXLAB_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                         "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS") if os.environ.get(k)}
    if forced:
        out["forced"] = forced
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return {**out, **extra}


def summary(c: dict | None = None) -> str:
    """One line: `Intel(R) Xeon(R) Processor (x86_64; avx2 fma ... amx_int8)`."""
    c = c or cpu()
    return f"{c['model']} ({c['arch']}; {' '.join(c['flags']) or 'no vector flags read'})"


def cache_root() -> Path:
    """fixlab's cache folder ($FIXLAB_CACHE, else ~/.cache/fixlab), where what is made once per machine is kept: the
    packs, the compiled kernels, the measured paths, the toolchains."""
    return Path(os.environ.get("FIXLAB_CACHE") or Path.home() / ".cache" / "fixlab").expanduser()
