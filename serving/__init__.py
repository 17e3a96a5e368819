"""The local serving stack (transformers with fixlab's batching engine, llama.cpp) behind agents.models' Model protocol.

Its public surface, all that code outside serving/ needs (flows/ imports this package only, never a module
inside it: tests/test_layout.py):
- the Model protocol and its request and answer (agents/models/base.py): Model, GenRequest, Generation,
  ModelUnavailable;
- `build(conf)`: the model a transformers or llamacpp config serves through; a transformers config's model has
  `.choice.record()`, the path it took (runtime, weights, dtype, whether its answers repeat: paths.py);
- `EngineTuning`: the engine's internal settings (tuning.py), not a config's: the product runs its defaults, tests
  and benchmarks pass others to `build`; flows reads its fields' neutral marks for runs logged while they were knobs;
- the facts the trajectory cache and the run records need: NUMERICS, `cache_root()`, `recorded_path(conf)`,
  `auto_dtype(conf)`; and the machine's: `describe_machine()`, `cpu_info()`, `isa_family()`, `huge_pages()`.
Importing it imports no torch or transformers: each function loads what it needs when called. It asks torch for
huge pages on large CPU tensors (heap.py `use_huge_pages`), which torch reads at its first CPU allocation.
"""
from __future__ import annotations

from typing import Callable

from agents.models.base import Generation, GenRequest, Model, ModelUnavailable
from agents.models.config import LlamaCppModelConf, TransformersModelConf
from .heap import use_huge_pages
from .machine import cache_root  # noqa: F401 (fixlab's cache folder, part of the public surface)
from .tuning import EngineTuning

use_huge_pages()  # before torch's first CPU allocation, which reads it (heap.py)

# The engine's arithmetic, versioned: bumped whenever a change to the kernels or the engine changes which bits a
# request's answer gets, so that cached trajectories from the older arithmetic are not replayed as this one's
# (flows/cache.py). 2: batch-invariant attention (prefill, decode and drafts in one kernel, the softmax sum in a fixed
# order) and float32 matmuls in fixlab's packed kernel.
NUMERICS = 2


def serves(conf) -> bool:
    """Whether a model config runs here, on this machine's engine (transformers, llamacpp), not behind an API."""
    return isinstance(conf, (TransformersModelConf, LlamaCppModelConf))


def build(conf: TransformersModelConf | LlamaCppModelConf, tuning: EngineTuning | None = None,
          beside: Callable[[], None] | None = None) -> Model:
    """The model a config serves through: the one entry the job calls for a model that runs here. transformers:
    fixlab's engine, transformers' own batching (hf_batching.py) or, for a registry pack, llama.cpp, as configured or
    measured here (runtime.py; prints the path line and remembers the path for `recorded_path`); llamacpp: llama.cpp
    embedded in the job. A missing pip extra is one line naming it. `tuning`: the engine's internal settings for a
    transformers config (None: the defaults, what every job runs; tests and benchmarks set others). `beside`: work
    the caller starts beside the build (the job's Prefect server), called at once, or after the build where it
    first times this machine's paths, so that nothing shares the CPU with those timings."""
    timing = beside is not None and _measures_on_build(conf)
    if beside is not None and not timing:
        beside()
    model = _build(conf, tuning)
    if timing:
        beside()
    return model


def _build(conf: TransformersModelConf | LlamaCppModelConf, tuning: EngineTuning | None) -> Model:
    from agents.models.base import require_extra

    if isinstance(conf, TransformersModelConf):
        runtime = str(conf.runtime or "auto").strip().lower()
        require_extra("llamacpp" if runtime == "llamacpp" else "local", f"model={conf.name}", ModelUnavailable)
        from .runtime import build_local

        return build_local(conf, tuning)
    if isinstance(conf, LlamaCppModelConf):
        require_extra("llamacpp", f"model={conf.name}", ModelUnavailable)
        from .llamacpp import LlamaCppModel

        return LlamaCppModel(conf)
    raise ModelUnavailable(f"serving serves transformers and llamacpp configs, not {conf.backend!r}")


def recorded_path(conf: TransformersModelConf) -> dict | None:
    """The path (Choice.record()) a model built from this config took in this process; None if none was built."""
    from .runtime import recorded

    return recorded(conf)


def _measures_on_build(conf) -> bool:
    """Whether building this config here would first time this machine's paths (a local CPU model whose measured path
    is not cached yet). False for anything else, or when it cannot tell."""
    if not isinstance(conf, TransformersModelConf):
        return False
    try:
        from .cores import would_claim
        from .devices import resolve_device
        from .paths import will_measure

        return (conf.runtime in ("engine", "auto") and resolve_device(conf.device).type == "cpu"
                and will_measure(conf, would_claim(conf.threads)))
    except Exception:  # noqa: BLE001 - a wrong config fails where the model is built, with its own one line
        return False


def auto_dtype(conf: TransformersModelConf) -> str | None:
    """The dtype a config's `dtype: auto` means on this machine before any model loads ("float32", "bfloat16": bf16
    or fp32 on a CPU depends on its instructions and fixlab's kernels); None where the config names a dtype. Its device
    is resolved either way: a wrong or absent one raises BadModelConfig (devices.py)."""
    from .devices import resolve_device, resolve_dtype, resolve_weights

    device = resolve_device(conf.device)
    if conf.dtype != "auto":
        return None
    weights = resolve_weights(conf.weights, device)
    return str(resolve_dtype("auto", device, weights)).replace("torch.", "")


def describe_machine(**extra) -> dict:
    """The machine block of a results file: CPU model and flags, cores, Python's and torch's versions, forced
    instruction sets, the GPU where CUDA is up already; then `extra` (machine.py describe(); imports no torch)."""
    from .machine import describe

    return describe(**extra)


def cpu_info() -> dict:
    """{"model", "arch", "flags", "cores"} of this CPU, without torch (machine.py cpu())."""
    from .machine import cpu

    return cpu()


def isa_family(info: dict | None = None) -> str:
    """The kernel family a CPU gets (this one's without `info`): amx, avx512-vnni, avx512, avx2, arm or baseline."""
    from .machine import isa_family as family

    return family(info)


def huge_pages() -> dict:
    """{"mode": the kernel's transparent huge page mode or None, "gib": this process's memory on them now or None}:
    what the weights and KV cache stream through (heap.py)."""
    from .heap import huge_page_bytes, huge_pages_mode

    got = huge_page_bytes()
    return {"mode": huge_pages_mode(), "gib": None if got is None else round(got / 2**30, 2)}


__all__ = ["NUMERICS", "EngineTuning", "Generation", "GenRequest", "Model", "ModelUnavailable", "auto_dtype", "build", "huge_pages",
           "cache_root", "cpu_info", "describe_machine", "isa_family", "recorded_path"]
