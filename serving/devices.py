"""A local model's settings resolved on this machine, before anything loads: device, dtype, weights, KV cache dtype,
where the weights come from; and the one-line error for a wrong value (BadModelConfig). Shared by the model
(hf.py) and the path chooser (paths.py), which import this module, not each other."""
from __future__ import annotations

from pathlib import Path

from agents.models.base import ModelUnavailable
from agents.models.config import TransformersModelConf

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "half": "float16"}
class BadModelConfig(ModelUnavailable, ValueError):
    """The model config is wrong (unknown dtype/device, no model named). One line."""


def resolve_device(name: str | None):
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise BadModelConfig(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadModelConfig(f"device {name!r} requested but no CUDA device is available here: use device=auto or cpu")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise BadModelConfig(f"unsupported device {name!r}: use auto, cpu, cuda or cuda:N")
    return dev


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512_BF16 or AMX), read from /proc/cpuinfo's flags.

    Measured on a 2-core AMD EPYC with avx512_bf16 (torch 2.13, 1.5B Qwen): bf16 prefill and batch-8 decode ran
    much faster than fp32 (benchmarks/weights.py). On an AVX2-only EPYC bf16 matmuls were emulated, several times
    slower than fp32. So auto picks bf16 only where the instruction exists."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def resolve_dtype(name: str | None, device, weights: str = "dtype"):
    """auto: bf16 on CUDA (fp16 where bf16 is unsupported). On CPU with int8 weights fp32: the int8 matmuls do the
    heavy work, and the rest (attention, norms, lm_head) ran slower in bf16 (decode attention over a padded batch:
    SDPA several times slower in bf16 than in fp32, and fixlab's fp32 path faster still, serving/cpu_attention.py).
    Otherwise on CPU fp32 where fixlab's compiled kernels build: its answers repeat whatever shares the batch, and a
    bf16 row's last bits depend on its batch (batch-invariant serving: bf16 only when asked for). Without the kernels,
    bf16 where the CPU has bf16 instructions, else fp32 (emulated bf16 is several times slower)."""
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and weights == "int8":
            return torch.float32
        from .native import available

        if device.type == "cpu" and available():
            return torch.float32
        return torch.bfloat16 if device.type == "cpu" and cpu_has_native_bf16() else torch.float32
    if name not in DTYPES:
        raise BadModelConfig(f"unknown dtype {name!r}: use auto, {', '.join(sorted(set(DTYPES.values())))}")
    return getattr(torch, DTYPES[name])


WEIGHTS = ("auto", "dtype", "int8")


def resolve_weights(name: str | None, device) -> str:
    """dtype: weights kept in the model's dtype; int8: decoder matmuls in int8 on CPU (serving/int8.py);
    auto: int8 on CPU, dtype elsewhere."""
    name = str(name or "dtype").strip().lower()
    if name not in WEIGHTS:
        raise BadModelConfig(f"unknown weights {name!r}: use {', '.join(WEIGHTS)}")
    if name == "auto":
        return "int8" if device.type == "cpu" else "dtype"
    if name == "int8" and device.type != "cpu":
        raise BadModelConfig(f"weights: int8 is a CPU path, not for device {device.type}: use weights=dtype there")
    return name


KV_DTYPES = ("auto", "float16", "float32")


def resolve_kv_dtype(name: str | None, device, dtype, cpu_attention: bool = True):
    """The batching engine's KV cache dtype (EngineTuning.kv_dtype, tuning.py), None = the model's. float16: decode
    attention reads half the bytes, widened to float32 as it reads (serving/kernels.c); CPU with float32 compute
    only. auto: float16 there when fixlab's compiled kernels build (serving/native.py), else the model's
    dtype."""
    import torch

    name = str(name or "auto").strip().lower()
    if name not in KV_DTYPES:
        raise BadModelConfig(f"unknown kv_dtype {name!r}: use {', '.join(KV_DTYPES)}")
    fits = device.type == "cpu" and dtype == torch.float32 and cpu_attention
    if name == "float32" or (name == "auto" and not fits):
        return None  # the model's dtype (float32 on CPU beside int8 weights)
    if not fits:
        raise BadModelConfig(f"kv_dtype: float16 is for CPU decode in float32 with cpu_attention on (here: "
                             f"{device.type}, {str(dtype).replace('torch.', '')}); "
                             "fix: EngineTuning(kv_dtype='auto')")
    from .native import available

    if available():
        return torch.float16
    if name == "auto":
        return None
    raise BadModelConfig("kv_dtype: float16 needs fixlab's compiled kernels, which could not be built here "
                         "(no gcc?); fix: EngineTuning(kv_dtype='auto') or install gcc")


def weights_source(cfg: TransformersModelConf) -> tuple[str, dict]:
    """Where the weights come from: (path or hub id, from_pretrained kwargs)."""
    given = [k for k in ("pack", "path", "model") if getattr(cfg, k)]
    if not given:
        raise BadModelConfig(f"model config {cfg.name!r} names no weights: set model (hub id), "
                             "pack or path")
    if len(given) > 1:
        raise BadModelConfig(f"model config {cfg.name!r} sets {' and '.join(given)}: set only one")
    if cfg.pack:
        from .native import build_beside
        from .packs import ensure_pack

        build_beside()  # gcc beside the pack's install and conversion, not after them
        return str(ensure_pack(cfg.pack)), {}
    if cfg.path:
        p = Path(cfg.path).expanduser()
        if not (p / "config.json").is_file():
            raise ModelUnavailable(f"model path {str(p)!r} has no config.json")
        return str(p), {}
    kw = {}
    if cfg.revision:
        kw["revision"] = str(cfg.revision)
    return str(cfg.model), kw


