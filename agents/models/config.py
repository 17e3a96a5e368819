"""The model's typed settings, one record per backend: the only place their defaults are defined.
conf/model/<name>.yaml picks a record as its schema (flows/schema.py) and holds only what differs from it:
which weights, and the runtime knobs a model was measured faster with. The local engine's internal settings are not
here: serving/tuning.py EngineTuning. A knob that changes no answer (where a job
runs and how fast) says so on its field: `metadata={"neutral": why}` (flows/result_neutral.py derives the list from it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPEED = "speed and memory, not answers"


@dataclass
class ModelConf:
    name: str  # names the run (<model>-<strategy>-iters<k>) and its MLflow tag
    backend: str  # transformers | llamacpp | openai | oracle | answers: set by each record below


@dataclass
class TransformersModelConf(ModelConf):
    """A local causal LM through transformers and fixlab's batching engine (serving/hf.py, engine.py).

    Twelve serving knobs a user sets (each earns its place), besides the weights' identity; how the
    engine runs beyond them (KV cache dtype, attention and matmul kernels, prefill chunk, gather wait, heap trims,
    draft lookup) is decided by the engine and measured paths, not by a user: serving/tuning.py EngineTuning,
    which tests and benchmarks set through serving.build(conf, tuning)."""

    backend: str = "transformers"
    # --- the weights: exactly one of model (hub id), pack (serving/packs.py PACKS) or path (a folder)
    model: str | None = None
    revision: str | None = None  # hub revision; pin a commit sha for reproducible runs
    pack: str | None = None
    path: str | None = None
    trust_remote_code: bool = False
    # --- runtime
    device: str = "auto"  # auto = cuda if available else cpu; or cpu, cuda, cuda:N
    # auto = bfloat16 on cuda; on cpu float32 beside int8 weights (bf16 decode attention is slower there), else
    # bfloat16 where the cpu has bf16 instructions (avx512_bf16, amx), else float32
    dtype: str = "auto"
    # dtype = weights in that dtype; int8 = cpu matmuls in int8, per-row scales (serving/int8.py); auto = on
    # cpu the faster of int8, float32 and bf16 as measured here (serving/paths.py), dtype elsewhere
    weights: str = "dtype"
    # modules left in the dtype under int8: lm_head by default, as its argmax over the vocabulary is where rounding
    # would flip tokens first; [] quantizes it too (faster decode, other numerics)
    int8_skip: list[str] = field(default_factory=lambda: ["lm_head"])
    # engine = fixlab's engine; llamacpp = llama.cpp on a pack's GGUF; continuous / static = transformers' continuous
    # batching / static cache (+ torch.compile on a GPU; serving/hf_batching.py); auto = measured here: on a GPU the
    # faster of continuous and static, on a CPU the engine (or, for a pack, llama.cpp where it is faster and the
    # engine's answers would not repeat)
    runtime: str = "engine"
    # torch CPU threads; null = the cores this process may use (serving/cores.py)
    threads: int | None = field(default=None, metadata={"neutral": SPEED})
    # --- batching engine (agents call generate() from many threads; the engine batches them)
    # false = one request at a time through transformers generate (the reference path)
    batching: bool = field(default=True, metadata={"neutral": SPEED})
    # rows decoded together; finished rows leave and waiting requests take their place
    max_batch: int = field(default=16, metadata={"neutral": SPEED})
    max_context: int | None = None  # null = the model config's max_position_embeddings
    # KV of earlier prompts kept for reuse by a later round (0 = off)
    prefix_cache_mib: float = field(default=1024.0, metadata={"neutral": SPEED})
    # budget of the running batch's KV; requests wait while it is full (0 = none)
    kv_cache_mib: float = field(default=0.0, metadata={"neutral": SPEED})
    # prompt-lookup drafts a row proposes per decode step, up to twice that where the match they follow is long
    # (0 = off); a draft is kept only where it equals what the model decodes anyway
    draft_tokens: int = field(default=4, metadata={"neutral": SPEED})


@dataclass
class LlamaCppModelConf(ModelConf):
    """A GGUF served by llama.cpp (xllamacpp) embedded in the job (serving/llamacpp.py). None of the runtime
    knobs changes an answer."""

    backend: str = "llamacpp"
    pack: str | None = None  # a registry pack (serving/packs.py PACKS) ...
    gguf: str | None = None  # ... or the path of a .gguf file
    # sequences decoded together (llama.cpp parallel slots); runner.workers should match
    slots: int = field(default=8, metadata={"neutral": SPEED})
    context_per_slot: int = 4096  # tokens of context each slot holds (prompt + answer)
    # CPU threads; null = the cores this process may use
    threads: int | None = field(default=None, metadata={"neutral": SPEED})
    # a slot keeps its last prompt, so a follow-up round prefills only the new turn
    cache_prompt: bool = field(default=True, metadata={"neutral": SPEED})
    # host memory for prompts evicted from slots
    cache_ram_mib: int = field(default=2048, metadata={"neutral": SPEED})
    # none | ngram: prompt-lookup drafts, kept only where they equal what the model decodes anyway
    speculative: str = field(default="none", metadata={"neutral": SPEED})
    ngram_size: int = field(default=3, metadata={"neutral": SPEED})
    draft_tokens: int = field(default=12, metadata={"neutral": SPEED})
    # llama.cpp's own log: 1 = warnings and errors only
    log_verbosity: int = field(default=1, metadata={"neutral": "what the server prints"})
    # per request to the embedded server
    timeout_s: float = field(default=3600.0, metadata={"neutral": "how long a request may wait"})


@dataclass
class OpenAIModelConf(ModelConf):
    """An OpenAI-compatible chat API (agents/models/openai_backend.py): OpenAI, Together, HF router, vLLM..."""

    backend: str = "openai"
    model: str | None = None  # the server's model name (required)
    base_url: str | None = None  # null = $OPENAI_BASE_URL, else https://api.openai.com/v1
    api_key_env: str = "OPENAI_API_KEY"  # env var holding the key
    # env var holding several keys, k1,k2 (used in turn)
    api_keys_env: str = field(default="API_KEYS", metadata={"neutral": "which credentials, not what is asked"})
    api_key_required: bool = False  # hosted presets: fail at once with one line when no key is set
    # requests in flight; model.max_concurrency=N runner.workers=N if your rate limit allows
    max_concurrency: int = field(default=8, metadata={"neutral": "how many requests at once"})
    timeout_s: float = field(default=120.0, metadata={"neutral": "how long a request may wait"})  # per request
    # 429, 5xx, timeouts: exponential backoff with jitter, Retry-After honoured
    max_retries: int = field(default=6, metadata={"neutral": "how a failed request is retried"})
    # first retry's wait, doubled per retry, up to backoff_max_s
    backoff_s: float = field(default=1.0, metadata={"neutral": "how a failed request is retried"})
    backoff_max_s: float = field(default=60.0, metadata={"neutral": "how a failed request is retried"})
    max_tokens_param: str = "max_tokens"  # some APIs want max_completion_tokens
    # list prices in US dollars per million tokens (null: no price known), and when and where they were read: what a
    # task costs (results files, MLflow, flows.leaderboard) and what budget.usd_per_task counts against
    price_prompt_per_mtok: float | None = field(default=None, metadata={"neutral": "what a call costs, not its answer"})
    price_completion_per_mtok: float | None = field(default=None, metadata={"neutral": "what a call costs, not its answer"})
    prices_read: str | None = field(default=None, metadata={"neutral": "where the prices come from"})
    extra_body: dict[str, Any] = field(default_factory=dict)  # added to every request's JSON body


@dataclass
class OracleModelConf(ModelConf):
    """Test double (agents/models/doubles.py): answers every task with its reference fix or its original bug."""

    backend: str = "oracle"
    solution: str = "canonical"  # canonical (must score 164/164) | buggy (must score 0/164)
    # seconds per answer (tests slow a job down with it to stop it mid-way)
    delay_s: float = field(default=0.0, metadata={"neutral": "when the answer comes, not what it is"})


@dataclass
class AnswersModelConf(ModelConf):
    """Answers already made, judged again (`python -m flows.rescore`): no model is asked. `source` is a run id of the
    store or an answers file; flows/rescore.py reads it (the formats: its docstring)."""

    backend: str = "answers"
    source: str = ""
    format: str = "auto"  # auto (by the source) | run | bigcode | evalplus | fixlab


MODEL_CONFS: dict[str, type[ModelConf]] = {"transformers": TransformersModelConf, "llamacpp": LlamaCppModelConf,
                                           "openai": OpenAIModelConf, "oracle": OracleModelConf,
                                           "answers": AnswersModelConf}
