"""Transformers backend: a local causal LM (hub id, registry pack or folder) behind the Model protocol.

generate() is thread-safe. By default requests go through the per-model BatchEngine (engine.py), which batches
what concurrent threads ask for; `batching: false` runs one request at a time through `model.generate`.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from agents.models.base import Generation, GenRequest, ModelUnavailable
from agents.models.config import TransformersModelConf
from agents.models.toolcalls import parse_tool_calls

log = logging.getLogger(__name__)

# End-of-turn tokens of common chat formats: generation stops on these even if the config names another eos.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|EOT|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


from .native import available as native_kernels  # noqa: E402
from .devices import (DTYPES, KV_DTYPES, WEIGHTS, BadModelConfig, cpu_has_native_bf16,  # noqa: E402,F401
                      resolve_device, resolve_dtype, resolve_kv_dtype, resolve_weights, weights_source)
from .tuning import EngineTuning, prefill_tokens  # noqa: E402


class TransformersModel:
    def __init__(self, cfg: TransformersModelConf, runtime: str = "engine", tuning: EngineTuning | None = None):
        """`runtime`: what batches the requests: fixlab's engine (engine.py) or transformers' own (hf_batching.py:
        continuous, static); runtime.py decides it. `tuning`: the engine's internal settings (tuning.py; None = its
        defaults, what the product runs: tests and benchmarks set others)."""
        import torch

        self.cfg = cfg
        self.tuning = tuning = tuning if tuning is not None else EngineTuning()
        self.name = cfg.name
        v = cfg.max_batch  # one line before anything loads
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadModelConfig(f"model.max_batch must be an integer >= 1, got {v!r}")
        self.device = resolve_device(cfg.device)
        self._cores = None
        if self.device.type == "cpu":
            # torch defaults to the physical cores of the machine, which can exceed what this process may use,
            # and two processes that take every core starve each other: a fair share (serving/cores.py).
            from .cores import claim_threads

            self._cores = claim_threads(cfg.threads)
        try:
            # weights, dtype and int8 kernels: as configured, and what `auto` measures on this machine (paths.py)
            from .paths import resolve

            self.choice = resolve(cfg, self.device, self._cores.threads if self._cores else 1, tuning)
            self.choice.runtime = runtime
            self.weights = self.choice.weights
            self.dtype = (resolve_dtype(cfg.dtype, self.device, self.weights) if self.weights == "int8"
                          else getattr(torch, self.choice.dtype))
            self.kv_dtype = resolve_kv_dtype(tuning.kv_dtype, self.device, self.dtype, bool(tuning.cpu_attention))
            t0 = time.perf_counter()
            self._load(cfg)
            self.load_seconds = time.perf_counter() - t0
        except BaseException:
            if self._cores is not None:
                self._cores.release()
            raise
        if not getattr(self.tokenizer, "chat_template", None):
            raise ModelUnavailable(f"model {self.name!r} has no chat template: use an instruct/chat checkpoint")
        self.eos_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)
        self.max_context = int(cfg.max_context or getattr(self.model.config, "max_position_embeddings", 0)
                               or 4096)
        # padded prompt tokens per prefill forward: the tuning's, else derived from the model's MLP width (tuning.py)
        self.max_prefill_tokens = int(tuning.max_prefill_tokens or prefill_tokens(self.model.config))
        if self._cores is not None:
            torch.set_num_threads(self._cores.threads)
        self._lock = threading.Lock()  # the unbatched path runs one request at a time
        self.engine = None
        try:
            self.use_runtime(runtime)
        except BaseException:
            if self._cores is not None:
                self._cores.release()
            raise
        if self.device.type == "cpu":  # serving runs in the engine's thread: end the loader thread's OpenMP team (cores.py)
            from .cores import release_thread_team

            release_thread_team()

    def use_runtime(self, runtime: str) -> None:
        """Serve through `runtime` (engine | continuous | static) from now on, on the weights already loaded (the
        GPU race times each in turn); what served before is closed."""
        from .hf_batching import KEPT_RUNTIMES, ContinuousServer, StaticServer

        cfg, tuning = self.cfg, self.tuning
        if runtime not in ("engine",) + KEPT_RUNTIMES:
            raise BadModelConfig(f"unknown runtime {runtime!r}: use auto, engine, llamacpp, continuous or static")
        if runtime != "engine" and not cfg.batching:
            raise BadModelConfig(f"runtime={runtime} batches requests itself: drop batching=false, or use "
                                 "runtime=engine")
        if (runtime == "engine") != (self.choice.runtime == "engine"):
            # the engine's CPU kernels are installed at load (_load) and transformers' batching cannot run on them
            raise ValueError(f"runtime {runtime} needs the model loaded for it, not for {self.choice.runtime}")
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if cfg.batching:
            kw = dict(eos_ids=self.eos_ids, max_context=self.max_context, max_batch=int(cfg.max_batch),
                      pad_id=self.pad_id)
            if runtime == "continuous":
                self.engine = ContinuousServer(self.model, self.tokenizer, **kw)
            elif runtime == "static":
                self.engine = StaticServer(self.model, self.tokenizer, gather_ms=float(tuning.gather_ms), **kw)
            else:
                from .engine import BatchEngine

                self.engine = BatchEngine(
                    self.model, self.tokenizer, gather_ms=float(tuning.gather_ms),
                    max_prefill_tokens=self.max_prefill_tokens, name=f"engine-{self.name}",
                    prefix_cache_mib=float(cfg.prefix_cache_mib or 0), draft_tokens=int(cfg.draft_tokens or 0),
                    draft_ngram=int(tuning.draft_ngram), draft_step_tokens=int(tuning.draft_step_tokens),
                    kv_cache_mib=float(cfg.kv_cache_mib or 0), heap_trim=bool(tuning.heap_trim),
                    kv_dtype=self.kv_dtype, **kw)
        self.choice.runtime = runtime
        self.choice.why_not = self._why_not_repeatable()
        self.choice.deterministic = not self.choice.why_not

    def _load(self, cfg: TransformersModelConf) -> None:
        """Tokenizer and weights onto the device, with the CPU kernels' settings; one line when they cannot load."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src, kw = weights_source(cfg)
        trust = bool(cfg.trust_remote_code)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=trust, **kw)
            mkw = dict(dtype=self.dtype, trust_remote_code=trust, **kw)
            if self.tuning.attn_implementation:
                mkw["attn_implementation"] = self.tuning.attn_implementation
            self.model = AutoModelForCausalLM.from_pretrained(src, **mkw)
        except ModelUnavailable:
            raise
        except (OSError, ValueError, EnvironmentError) as e:
            where = f"{src}@{kw['revision']}" if kw.get("revision") else src
            offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0") else ""
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ModelUnavailable(f"cannot load model {where!r}{offline}: {first}; fix: check the id/revision and "
                                   "network, or use a local `path` or a registry `pack`") from None
        self.model.to(self.device).eval()
        if self.weights == "int8":
            from .int8 import quantize_int8

            quantize_int8(self.model, skip=tuple(cfg.int8_skip),  # []: lm_head in int8 too
                          native=bool(self.tuning.int8_native), plan=self.choice.plan(),
                          group=bool(self.tuning.int8_groups))
        if self.device.type == "cpu":  # the embedding's rows by pread: its mapped pages stay unread (embedding.py)
            from .embedding import read_embedding_rows

            read_embedding_rows(self.model)
        self.packed_linears = 0
        if self.choice.runtime != "engine":
            return  # transformers' own batching (hf_batching.py) runs its own attention and torch's linears
        if self.device.type == "cpu" and self.dtype == torch.float32 and native_kernels():
            # what stays float32 (the lm_head beside int8 weights, or every linear): one chain per output, the same
            # at any number of rows (f32.py); BLAS's sums depend on the batch
            from .f32 import pack_float_linears

            self.packed_linears = pack_float_linears(self.model)
        if self.device.type == "cpu" and self.dtype == torch.float32 and self.tuning.skinny_matmul:
            # fp32 only: oneDNN's bf16 kernels are already fast for a few rows (skinny was slower there)
            from .skinny_matmul import use_skinny_matmul

            use_skinny_matmul(self.model)
        if self.device.type == "cpu" and self.tuning.sdpa_gqa:
            # Batched rows carry a padding mask, and with a mask transformers expands grouped K/V heads
            # (repeat_kv: a full copy of the KV cache per layer per step) instead of SDPA's enable_gqa. On CPU
            # the GQA kernel takes masks and is much faster for Qwen2.5's 14:2 heads (same results). Process-wide
            # switch, read at call time; not set for CUDA, where a mask + GQA falls back to the math kernel.
            os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
        if self.device.type == "cpu" and self.tuning.cpu_attention:
            from .cpu_attention import use_grouped_attention

            use_grouped_attention(self.model)  # decode steps in fp32: grouped heads as batched matmuls
        if self.device.type == "cpu" and self.dtype == torch.float32 and self.tuning.fused_ops:
            from .fused import use_fused_ops

            use_fused_ops(self.model)  # norms, rotary and the MLP's product as one loop each, bit-equal (fused.py)

    def _why_not_repeatable(self) -> str:
        """'' when a request's answer depends only on its own prompt, seed and temperature (what shares its batch,
        arrival order, prefix hits and drafts change no bit: benchmarks/invariance.py, tests/test_determinism.py);
        else what breaks that."""
        import torch

        if self.device.type != "cpu":
            return f"on {self.device.type}, torch's matmul and attention kernels depend on the batch"
        if self.cfg.batching and self.choice.runtime != "engine":
            return (f"transformers' {self.choice.runtime} batching runs torch's kernels, whose sums depend on what "
                    "shares the batch")
        if not self.cfg.batching:
            return ""  # one request at a time through transformers' generate: nothing shares its forward
        if not native_kernels():
            return "fixlab's compiled kernels did not build (gcc), so attention and matmuls are torch's"
        if self.dtype != torch.float32:
            return f"{str(self.dtype).replace('torch.', '')} activations round differently at each batch size"
        if self.kv_dtype != torch.float16 or getattr(self.model.config, "_attn_implementation", None) != "fixlab_cpu":
            return "attention runs in torch's kernels, whose sums depend on the padding"
        if any(type(m) is torch.nn.Linear for m in self.model.modules()):
            return "a float matmul runs in BLAS, whose sums depend on the number of rows"
        return ""

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.model.config):
            v = getattr(src, "eos_token_id", None) if src is not None else None
            ids.update([v] if isinstance(v, int) else (v or []))
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN if t in vocab)
        return ids

    # ---- prompts ---------------------------------------------------------------------------------------------
    def prompt_ids(self, request: GenRequest) -> list[int]:
        kw = {"tools": list(request.tools)} if request.tools else {}
        text = self.tokenizer.apply_chat_template(list(request.messages), tokenize=False,
                                                  add_generation_prompt=True, **kw)
        # The template already writes BOS/special tokens where the model wants them.
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ---- generation ------------------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        """Tokens `text` encodes to (a think block's, counted apart from the answer: agents/reasoning.py)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, request: GenRequest) -> Generation:
        ids = self.prompt_ids(request)
        if self.engine is not None:
            gen = self.engine.generate(request, ids)
        else:
            gen = self._generate_one(request, ids)
        if request.tools:
            gen.tool_calls = parse_tool_calls(gen.text)
        return gen

    def _generate_one(self, request: GenRequest, ids: list[int]) -> Generation:
        """Reference path: one request at a time through transformers' own generate."""
        import torch
        from transformers import GenerationConfig

        from agents.models.base import answer_budget
        from .hf_batching import finish

        n = len(ids)
        max_new = answer_budget(request, n, self.max_context)
        sample = bool(request.temperature and request.temperature > 0)
        # Explicit config: the checkpoint's own defaults (top_k, repetition penalty...) would make this path
        # differ from the engine's plain greedy / temperature sampling.
        gc = GenerationConfig(max_new_tokens=max_new, do_sample=sample, temperature=request.temperature or 1.0,
                              top_k=None, top_p=None, eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id,
                              stop_strings=list(request.stop) or None)
        t0 = time.perf_counter()
        with self._lock, torch.inference_mode():
            if sample:
                torch.manual_seed(request.seed if request.seed is not None else int.from_bytes(os.urandom(4), "big"))
            inp = torch.tensor([ids], device=self.device)
            out = self.model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=gc,
                                      tokenizer=self.tokenizer if request.stop else None)
        new = out[0, n:].tolist()
        text, why = finish(self.tokenizer, new, self.eos_ids, request.stop)
        return Generation(text=text, prompt_tokens=n, completion_tokens=len(new),
                          seconds=time.perf_counter() - t0, finish_reason=why)

    def activity(self) -> dict | None:
        return self.engine.activity() if self.engine is not None else None

    def engine_stats(self) -> dict | None:
        """fixlab's engine's running totals (seconds prefilling, decoding and idle, steps, rows...), None on another
        runtime: what a job's usage reports (flows/usage.py)."""
        stats = getattr(self.engine, "stats", None)
        return dict(stats) if isinstance(stats, dict) else None

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self._cores is not None:
            self._cores.release()
