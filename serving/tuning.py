"""The engine's internal settings (EngineTuning): how fixlab's serving stack runs, decided here and not by a user.

None of them was ever set away from its default in a run config but the prefill width, which the 1.5B pack's yaml set
for a reason now derived per model (`prefill_tokens`): what the measured path decides is not a user's knob, so the
product always runs with `EngineTuning()`; TransformersModel (hf.py) and the builders
(runtime.py `build_local`, `serving.build`) take one so that tests and benchmarks can still compare them (a
float32 KV cache against float16, int8_kernel=torch against fixlab, SDPA against cpu_attention). A field that
changes no answer says so (`metadata={"neutral": why}`).
Importing this module loads no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from agents.models.config import SPEED

MLP_BYTES = 4  # a float32 activation: prefill's MLP activations, intermediate_size wide, are float32 on the CPU path


@dataclass(frozen=True)
class EngineTuning:
    # None = transformers' choice (SDPA; fixlab's CPU decode attention replaces it where cpu_attention is on)
    attn_implementation: str | None = None
    # int8's input rounding and output scaling as compiled loops (native.py), bit-equal to the eager ops they replace
    int8_native: bool = field(default=True, metadata={"neutral": "bit-equal: compiled loops or eager ops"})
    # which kernel multiplies int8 weights: auto = measured here per number of rows (paths.py); torch | fixlab: forced
    int8_kernel: str = field(default="auto", metadata={"neutral": "bit-equal: exact integer products either way"})
    # cpu fp32: decode matmuls as W @ x.T, which MKL runs faster than x @ W.T at a few rows (skinny_matmul.py says why)
    skinny_matmul: bool = field(default=True, metadata={"neutral": SPEED})
    # cpu: SDPA's grouped K/V heads under a padding mask, not K/V repeated per query head (much faster for
    # Qwen2.5's 14:2)
    sdpa_gqa: bool = field(default=True, metadata={"neutral": SPEED})
    # cpu: fixlab's batch-invariant fp32 attention (cpu_attention.py, kernels.c), what makes answers repeat
    cpu_attention: bool = True
    # int8: sibling linears of one input (q, k, v; gate, up) as one matrix each, one rounding and one kernel call
    # (int8.Int8Group), bit-equal
    int8_groups: bool = field(default=True, metadata={"neutral": "bit-equal: the same sums, one matrix or several"})
    # cpu fp32: RMSNorm's tail, rotary embedding and the MLP's product as compiled loops (fused.py), bit-equal
    fused_ops: bool = field(default=True, metadata={"neutral": "bit-equal: compiled loops or eager ops"})
    # the KV cache: auto = float16 on cpu where the kernels build (decode reads half the bytes), else the model's dtype
    kv_dtype: str = "auto"
    # an idle engine waits this long for concurrent callers, so the job's first wave starts as one batch
    gather_ms: float = field(default=30.0, metadata={"neutral": SPEED})
    # padded prompt tokens per prefill forward; None = prefill_tokens(): the MLP's activations stay in the heap
    max_prefill_tokens: int | None = field(default=None, metadata={"neutral": SPEED})
    # free heap back to the OS: a 4 MiB mmap threshold while decoding and a trim after each admission (heap.py)
    heap_trim: bool = field(default=True, metadata={"neutral": "memory only"})
    # the n-gram a prompt-lookup draft is found by: the fastest at full batch (benchmarks/drafts.py)
    draft_ngram: int = field(default=3, metadata={"neutral": SPEED})
    # most tokens one forward feeds, all rows' pending tokens and drafts together: the fastest (benchmarks/drafts.py)
    draft_step_tokens: int = field(default=128, metadata={"neutral": SPEED})

    def __post_init__(self):
        from .devices import BadModelConfig

        for key in ("max_prefill_tokens", "draft_step_tokens", "draft_ngram"):  # one line before anything loads
            v = getattr(self, key)
            if v is None and key == "max_prefill_tokens":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BadModelConfig(f"EngineTuning.{key} must be an integer >= 1, got {v!r}")

    def changed(self) -> dict:
        """The fields set away from their defaults."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


def prefill_tokens(config) -> int:
    """Padded prompt tokens per prefill forward for a transformers model config: as many as keep one MLP activation
    (tokens x intermediate_size float32s) under the mmap threshold a prefill runs with (heap.py PREFILL_BLOCKS, 32 MiB,
    glibc's ceiling), so it comes from the heap, not from fresh pages faulted in layer after layer (gate and up stacked as
    one int8 group give twice that width: fused.py runs the MLP in row blocks under the same bound); a multiple of 128,
    at least 128. Qwen2.5-Coder-1.5B (8960): 896, as measured faster on its full job (docs/RESULTS.md, memory);
    0.5B (4864): 1664; SmolLM2-135M (1536): 5376. A config without intermediate_size: 8192, the old default."""
    from .heap import PREFILL_BLOCKS

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    width = getattr(text, "intermediate_size", None)
    if not isinstance(width, int) or width < 1:
        return 8192
    return max(128, PREFILL_BLOCKS // (width * MLP_BYTES) // 128 * 128)
