"""The model's typed settings, one record per backend: the only place their defaults are defined.
conf/model/<name>.yaml picks a record as its schema (flows/schema.py) and holds only what differs from it:
which weights, and the runtime knobs a model was measured faster with. flows/neutral.py lists the knobs that
change no answer (where a job runs and how fast)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConf:
    name: str  # names the run (<model>-<strategy>-iters<k>) and its MLflow tag
    backend: str  # transformers | llamacpp | openai | oracle: set by each record below


@dataclass
class TransformersModelConf(ModelConf):
    """A local causal LM through transformers and fixlab's batching engine (agents/serving/hf.py, engine.py)."""

    backend: str = "transformers"
    # --- the weights: exactly one of model (hub id), pack (agents/serving/packs.py PACKS) or path (a folder)
    model: str | None = None
    revision: str | None = None  # hub revision; pin a commit sha for reproducible runs
    pack: str | None = None
    path: str | None = None
    trust_remote_code: bool = False
    attn_implementation: str | None = None  # null = transformers' choice
    # --- runtime
    device: str = "auto"  # auto = cuda if available else cpu; or cpu, cuda, cuda:N
    # auto = bfloat16 on cuda; on cpu float32 beside int8 weights (bf16 decode attention was 1.6x slower), else
    # bfloat16 where the cpu has bf16 instructions (avx512_bf16, amx), else float32
    dtype: str = "auto"
    # dtype = weights in that dtype; int8 = cpu matmuls in int8, per-row scales (agents/serving/int8.py); auto = on
    # cpu the faster of int8, float32 and bf16 as measured here (agents/serving/paths.py), dtype elsewhere
    weights: str = "dtype"
    # modules left in the dtype under int8 ([] = lm_head too: +10-17% decode, benchmarks/weights.py)
    int8_skip: list[str] = field(default_factory=lambda: ["lm_head"])
    # true: q/k/v and gate/up as one stacked int8 matmul each (bit-equal). No gain measured: 2-core EPYC, bf16:
    # prefill 138 tokens/s fused vs 153 apart, decode at batch 1/16/32 7.1/29.7/36.8 vs 6.5/31.1/35.8
    int8_fuse: bool = False
    # true: int8's input rounding and output scaling as compiled loops, built with gcc at first use (bit-equal;
    # agents/serving/native.py); eager torch ops where no compiler is found
    int8_native: bool = True
    # which kernel multiplies int8 weights: auto = measured on this machine per number of rows (agents/serving/
    # paths.py); torch = torch._int_mm; fixlab = fixlab's own (AVX-512 VNNI, AVX2 or portable). Same values either way
    int8_kernel: str = "auto"
    # engine = fixlab's engine; llamacpp = llama.cpp on a pack's GGUF; auto = the one measured faster here (packs)
    runtime: str = "engine"
    threads: int | None = None  # torch CPU threads; null = the cores this process may use (agents/serving/cores.py)
    skinny_matmul: bool = True  # cpu fp32: decode matmuls as W @ x.T (MKL's x @ W.T is up to 3x slower for 2-32 rows)
    sdpa_gqa: bool = True  # cpu: SDPA's grouped K/V heads under a padding mask (10x faster for Qwen2.5's 14:2 heads)
    cpu_attention: bool = True  # cpu: fixlab's fp32 decode attention (agents/serving/cpu_attention.py)
    # the engine's KV cache: auto = float16 on cpu where the compiled kernels build (decode attention reads half the
    # bytes, widened to float32 as it reads: agents/serving/kernels.c), else the model's dtype; float16; float32
    kv_dtype: str = "auto"
    # --- batching engine (agents call generate() from many threads; the engine batches them)
    batching: bool = True  # false = one request at a time through transformers generate (reference path)
    max_batch: int = 16  # rows decoded together; finished rows leave and waiting requests take their place
    gather_ms: float = 30.0  # an idle engine waits this long for more requests before starting a batch
    max_prefill_tokens: int = 8192  # padded prompt tokens per prefill forward (bounds prefill memory)
    max_context: int | None = None  # null = the model config's max_position_embeddings
    prefix_cache_mib: float = 1024.0  # KV of earlier prompts kept for reuse by a later round (0 = off)
    kv_cache_mib: float = 0.0  # budget of the running batch's KV; requests wait while it is full (0 = none)
    heap_trim: bool = True  # free heap back to the OS: 4 MiB mmap threshold, trim after prefills (serving/heap.py)
    draft_tokens: int = 4  # prompt-lookup drafts a row proposes per decode step, twice that when few rows (0 = off)
    draft_ngram: int = 3  # n-gram length a draft is looked up by
    draft_step_tokens: int = 128  # most tokens one forward feeds, all rows' pending tokens and drafts together
    # (drafts at full batch: benchmarks/drafts.py, endtoend.py, docs/RESULTS.md section 7; they were 8 and 16)


@dataclass
class LlamaCppModelConf(ModelConf):
    """A GGUF served by llama.cpp (xllamacpp) embedded in the job (agents/serving/llamacpp.py). None of the runtime
    knobs changes an answer."""

    backend: str = "llamacpp"
    pack: str | None = None  # a registry pack (agents/serving/packs.py PACKS) ...
    gguf: str | None = None  # ... or the path of a .gguf file
    slots: int = 8  # sequences decoded together (llama.cpp parallel slots); runner.workers should match
    context_per_slot: int = 4096  # tokens of context each slot holds (prompt + answer)
    threads: int | None = None  # CPU threads; null = the cores this process may use
    cache_prompt: bool = True  # a slot keeps its last prompt, so a follow-up round prefills only the new turn
    cache_ram_mib: int = 2048  # host memory for prompts evicted from slots
    speculative: str = "none"  # none | ngram (prompt-lookup drafts: README "Speed" has the measurement)
    ngram_size: int = 3
    draft_tokens: int = 12
    log_verbosity: int = 1  # llama.cpp's own log: 1 = warnings and errors only
    timeout_s: float = 3600.0  # per request to the embedded server


@dataclass
class OpenAIModelConf(ModelConf):
    """An OpenAI-compatible chat API (agents/models/openai_backend.py): OpenAI, Together, HF router, vLLM..."""

    backend: str = "openai"
    model: str | None = None  # the server's model name (required)
    base_url: str | None = None  # null = $OPENAI_BASE_URL, else https://api.openai.com/v1
    api_key_env: str = "OPENAI_API_KEY"  # env var holding the key
    api_keys_env: str = "API_KEYS"  # env var holding several keys, k1,k2 (used in turn)
    api_key_required: bool = False  # hosted presets: fail at once with one line when no key is set
    max_concurrency: int = 8  # requests in flight; model.max_concurrency=N runner.workers=N if your rate limit allows
    timeout_s: float = 120.0  # per request
    max_retries: int = 6  # 429, 5xx, timeouts: exponential backoff with jitter, Retry-After honoured
    backoff_s: float = 1.0  # first retry's wait, doubled per retry ...
    backoff_max_s: float = 60.0  # ... up to this
    max_tokens_param: str = "max_tokens"  # some APIs want max_completion_tokens
    extra_body: dict[str, Any] = field(default_factory=dict)  # added to every request's JSON body


@dataclass
class OracleModelConf(ModelConf):
    """Test double (agents/models/doubles.py): answers every task with its reference fix or its original bug."""

    backend: str = "oracle"
    solution: str = "canonical"  # canonical (must score 164/164) | buggy (must score 0/164)
    delay_s: float = 0.0  # seconds per answer (tests slow a job down with it to stop it mid-way)


MODEL_CONFS: dict[str, type[ModelConf]] = {"transformers": TransformersModelConf, "llamacpp": LlamaCppModelConf,
                                           "openai": OpenAIModelConf, "oracle": OracleModelConf}
