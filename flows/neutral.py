"""The one list of result-neutral settings: where a job runs and how fast, never what it answers.

Shared by the trajectory cache key (flows/cache.py), resume's config check (flows/tracking.py), sweep labels
(flows/sweep.py) and the nightly report's config diff (flows/nightly.py), so a speed knob changed between two
runs neither throws the cache away nor blocks a resume nor reads as a config change. Keys are flattened
("model.threads"); an entry ending in "." covers a whole group. On the tiny test models these knobs leave every
answer as it is (tests); on real packs the batch a row shares moves the last bits of its fp32 lm_head and attention
(and more in bf16), so reruns differ on a few tasks either way (docs/RESULTS.md, memory): compare by paired tests.
"""
from __future__ import annotations

RESULT_NEUTRAL = (
    "resume", "cache", "cache_dir", "sweep_ahead", "sweep_ahead_to", "sweep_stream", "offline", "runner.", "tracking.",
    # model: batching engine, CPU threads, prefix reuse, drafts, llama.cpp slots, HTTP client
    "model.max_batch", "model.gather_ms", "model.max_prefill_tokens", "model.batching", "model.threads",
    "model.skinny_matmul", "model.int8_fuse", "model.int8_kernel", "serving.int8_kernel", "model.sdpa_gqa", "model.prefix_cache_mib", "model.kv_cache_mib",
    "model.heap_trim", "model.draft_tokens", "model.draft_ngram",
    "model.draft_step_tokens", "model.slots", "model.cache_prompt", "model.cache_ram_mib", "model.log_verbosity",
    "model.speculative", "model.ngram_size", "model.max_concurrency", "model.timeout_s", "model.max_retries",
    "model.backoff_s", "model.backoff_max_s", "model.api_keys_env",
    "model.delay_s",  # the oracle test double's answer time
    # sandbox: how programs are started, not what they may do
    "sandbox.workers", "sandbox.mode", "sandbox.uid_base", "sandbox.cgroup_parent",
)


def result_neutral(key: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a flattened config key is in RESULT_NEUTRAL (or in `extra`, same rules)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESULT_NEUTRAL + extra)


def without_neutral(group: str, cfg: dict) -> dict:
    """A config group (e.g. "model") without its result-neutral keys."""
    return {k: v for k, v in cfg.items() if not result_neutral(f"{group}.{k}")}
