"""Which runtime serves a local model: fixlab's engine (hf.py) or, for a registry pack, llama.cpp on the same GGUF
(llamacpp.py), measured where `runtime: auto` (step 2 of the path chooser, paths.py: the weights and int8 kernels
are step 1). `build_local` is what agents.models.build_model calls for a transformers config; it prints the path line
and remembers the path each config took in this process (`recorded`: the trajectory cache's identity, flows/cache.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, replace

from agents.models.config import LlamaCppModelConf, TransformersModelConf
from .paths import DECODE_ROWS, Choice, cache_key, read_cached, say, shapes_for, write_cached
from .tuning import EngineTuning


def _rates(model, rows: int, new_tokens: int) -> dict:
    """{"decode": tokens/s of `rows` concurrent requests of `new_tokens` each (a listing the model will not end early,
    after one pass that fills the prompt caches: decoding at that width, as in a job's rounds), "prefill": prompt
    tokens/s of one long prompt that shares no prefix with anything before it}."""
    from concurrent.futures import ThreadPoolExecutor

    from agents.models.base import GenRequest

    def req(i, n):
        return GenRequest(messages=[{"role": "user", "content": f"List the integers from {i} to {i + 500}, one "
                                     "per line, nothing else."}], max_new_tokens=n, temperature=0.0)

    with ThreadPoolExecutor(rows) as pool:
        list(pool.map(lambda i: model.generate(req(i, 1)), range(rows)))
        t0 = time.perf_counter()
        gens = list(pool.map(lambda i: model.generate(req(i, new_tokens)), range(rows)))
        decode = sum(g.completion_tokens for g in gens) / (time.perf_counter() - t0)
    words = " ".join(f"w{(i * 7919) % 10007}" for i in range(120))  # about 600 tokens, unlike any earlier prompt
    t0 = time.perf_counter()
    g = model.generate(GenRequest(messages=[{"role": "user", "content": f"Repeat the last word: {words}"}],
                                  max_new_tokens=1, temperature=0.0))
    return {"decode": round(decode, 1), "prefill": round(g.prompt_tokens / (time.perf_counter() - t0), 1)}


# make eval's token mix: what the runtime races weigh decode and prefill rates by. A parameter of the race (`mix`),
# not a file found by modification time (a fresh clone's files all have the same age): the default job as recorded
# on 2026-11-28 on the EPYC (benchmarks/results/fullsize-single_shot-default-fma-attention-epyc-20261128.json).
JOB_MIX = (43434, 54842, "make eval's job as recorded on 2026-11-28 (fullsize-single_shot-default-fma-attention-epyc)")


def job_seconds(rates: dict, mix: tuple[int, int, str] = JOB_MIX) -> float:
    """What decoding and prefilling a job of `mix` (make eval's by default) would take at these rates (its sandbox
    time is the same either way)."""
    completion, prefill, _ = mix
    return completion / max(rates["decode"], 1e-9) + prefill / max(rates["prefill"], 1e-9)


def llamacpp_conf(cfg: TransformersModelConf) -> LlamaCppModelConf:
    """The same pack served by llama.cpp with as many slots as the engine's rows."""
    return LlamaCppModelConf(name=cfg.name, pack=cfg.pack, slots=int(cfg.max_batch), threads=cfg.threads)


def runtime_eligible(cfg: TransformersModelConf) -> bool:
    if str(cfg.runtime).lower() != "auto" or not cfg.pack or str(cfg.device).lower() not in ("auto", "cpu"):
        return False
    import torch

    if torch.cuda.is_available() and str(cfg.device).lower() == "auto":
        return False
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        return False
    return True


_BUILT: dict[str, dict] = {}  # a config's JSON -> the path its model took in this process (Choice.record)


def _conf_key(cfg, tuning: EngineTuning | None = None) -> str:
    """A config's JSON; with a tuning other than the defaults, that too (the product's builds are keyed by the config
    alone)."""
    changed = tuning.changed() if tuning is not None else {}
    return json.dumps({**asdict(cfg), **({"tuning": changed} if changed else {})}, sort_keys=True, default=str)


def recorded(cfg, tuning: EngineTuning | None = None) -> dict | None:
    """The path (Choice.record) a model built from this config (on this tuning; None: the defaults, as every job's)
    took in this process; None if none was built."""
    return _BUILT.get(_conf_key(cfg, tuning))


def build_local(cfg: TransformersModelConf, tuning: EngineTuning | None = None):
    """`tuning`: the engine's internal settings (tuning.py); None = the defaults, what the product runs."""
    tuning = tuning if tuning is not None else EngineTuning()
    model = _build_local(cfg, tuning)
    _BUILT[_conf_key(cfg, tuning)] = model.choice.record()
    return model


def _race(cfg: TransformersModelConf, model) -> dict:
    """The engine (`model`, built) and llama.cpp on the same pack, timed on make eval's mix of prefill and decode:
    which serves, the rates and seconds behind it, and why llama.cpp could not run where it could not."""
    say("measuring fixlab's engine against llama.cpp on the same pack (once; cached)")
    rates = {"engine": _rates(model, int(cfg.max_batch), 24)}
    error = None
    try:
        from .llamacpp import LlamaCppModel

        # short requests: slots of 2048 tokens hold them (the job's 4096 would add gigabytes of KV beside the engine)
        other = LlamaCppModel(replace(llamacpp_conf(cfg), context_per_slot=2048))
        try:
            rates["llamacpp"] = _rates(other, int(cfg.max_batch), 24)
        finally:
            other.close()
    except Exception as e:  # llama.cpp cannot run here: the engine serves, and the reason is recorded
        error = f"{type(e).__name__}: {str(e)[:200]}"
    # a job both prefills and decodes: the runtime that does make eval's mix of the two sooner serves
    seconds = {k: round(job_seconds(r), 1) for k, r in rates.items()}
    return {"runtime": min(seconds, key=seconds.get), "rates": rates, "job_seconds": seconds, "job_mix": JOB_MIX,
            "engine_path": model.choice.label(), "rows": int(cfg.max_batch),
            **({"llamacpp_error": error} if error else {})}


def _build_local(cfg: TransformersModelConf, tuning: EngineTuning):
    """The model a transformers config serves through: fixlab's engine (TransformersModel) or, for a pack whose
    `runtime` is auto or llamacpp, llama.cpp where it was measured faster (LlamaCppModel). Prints the path line."""
    from .devices import BadModelConfig
    from .hf import TransformersModel

    from .hf_batching import KEPT_RUNTIMES

    runtime = str(cfg.runtime or "auto").strip().lower()
    if runtime not in ("auto", "engine", "llamacpp") + KEPT_RUNTIMES:
        raise BadModelConfig(f"unknown runtime {cfg.runtime!r}: use auto, engine, llamacpp, continuous or static")
    if runtime in KEPT_RUNTIMES:
        model = TransformersModel(cfg, runtime=runtime, tuning=tuning)
        model.choice.reason = f"runtime={runtime} as configured; {model.choice.reason}"
        say(f"path: {model.choice.label()}: {model.choice.reason}; {model.choice.repeat_words()}")
        return model
    if runtime == "auto" and _on_gpu(cfg):
        return _kept_race(cfg, tuning)
    if runtime == "llamacpp":
        if not cfg.pack:
            raise BadModelConfig("runtime=llamacpp serves a registry pack's GGUF: set pack, or use runtime=engine")
        return _llamacpp(cfg, None, "runtime=llamacpp as configured")
    if not runtime_eligible(cfg):
        model = TransformersModel(cfg, tuning=tuning)
        say(f"path: {model.choice.label()}: {model.choice.reason}; {model.choice.repeat_words()}")
        return model
    model = TransformersModel(cfg, tuning=tuning)
    if model.choice.deterministic:
        # the engine repeats its answers and llama.cpp does not (its sums depend on which slots share a batch:
        # benchmarks/results/invariance-*-llamacpp.json), so auto never picks it and need not race it
        model.choice.reason = (f"{model.choice.reason}; runtime: the engine (llama.cpp not raced: its answers do not "
                               "repeat across slots; runtime=llamacpp serves it when asked)")
        say(f"path: {model.choice.label()}: {model.choice.reason}; {model.choice.repeat_words()}")
        return model
    key, ident = cache_key(shapes_for(cfg), "runtime", {"engine": _engine_ident(cfg, tuning)})
    cached = read_cached(key)
    if cached is None:
        cached = _race(cfg, model)
        write_cached(key, ident, cached)
    if cached["runtime"] == "llamacpp":
        model.close()
        return _llamacpp(cfg, cached, _runtime_reason(cached))
    model.choice.runtime = "engine"
    model.choice.decode_tok_s = {k: r["decode"] for k, r in cached["rates"].items()}
    model.choice.reason = f"{_runtime_reason(cached)}; {model.choice.reason}"
    say(f"path: {model.choice.label()}: {model.choice.reason}; {model.choice.repeat_words()}")
    return model


def _on_gpu(cfg: TransformersModelConf) -> bool:
    from .devices import resolve_device

    return resolve_device(cfg.device).type == "cuda"


def _kept_race(cfg: TransformersModelConf, tuning: EngineTuning):
    """On a GPU, `runtime: auto` serves through the faster of transformers' two batched paths (hf_batching.py), timed on the
    loaded model at `max_batch` real requests, each path warm (a first pass compiles; the second is the figure), then
    cached per GPU, model shapes and settings. fixlab's engine is not raced there: it lost to both on a GPU
    (benchmarks/gpu_check.sh's results files)."""
    import torch

    from .hf import TransformersModel
    from .hf_batching import KEPT_RUNTIMES

    model = TransformersModel(cfg, runtime=KEPT_RUNTIMES[0], tuning=tuning)
    gpu = torch.cuda.get_device_name(model.device)
    key, ident = cache_key(shapes_for(cfg), "gpu-runtime", {"gpu": gpu, "dtype": model.choice.dtype,
                                                            "max_batch": int(cfg.max_batch)})
    cached = read_cached(key)
    if cached is None:
        say(f"measuring transformers' continuous batching against its static cache + compile on {gpu} (once; cached)")
        rates = {}
        try:
            for kind in KEPT_RUNTIMES:
                model.use_runtime(kind)
                _rates(model, int(cfg.max_batch), 24)  # compiles and fills what the timed pass reuses
                rates[kind] = _rates(model, int(cfg.max_batch), 24)
        except BaseException:
            model.close()
            raise
        seconds = {k: round(job_seconds(r), 1) for k, r in rates.items()}
        cached = {"runtime": min(seconds, key=seconds.get), "rates": rates, "job_seconds": seconds,
                  "job_mix": JOB_MIX, "rows": int(cfg.max_batch), "gpu": gpu}
        write_cached(key, ident, cached)
    model.use_runtime(cached["runtime"])
    r = cached["rates"]
    model.choice.decode_tok_s = {k: v["decode"] for k, v in r.items()}
    model.choice.reason = (f"{cached['rows']} real requests on {cached['gpu']}: " + "; ".join(
        f"{k} {v['decode']:.0f} decoded, {v['prefill']:.0f} prefilled a second" for k, v in r.items())
        + f"; the faster for make eval's job serves ({model.choice.reason})")
    say(f"path: {model.choice.label()}: {model.choice.reason}; {model.choice.repeat_words()}")
    return model


def _engine_ident(cfg: TransformersModelConf, tuning: EngineTuning) -> dict:
    """What the engine's measured rate depends on, among its settings (the same keys as when int8_kernel and kv_dtype
    were model knobs, so a rate measured then is still found)."""
    return {**{k: getattr(cfg, k) for k in ("weights", "dtype", "int8_skip", "max_batch", "draft_tokens", "threads")},
            "int8_kernel": tuning.int8_kernel, "kv_dtype": tuning.kv_dtype}


def _runtime_reason(cached: dict) -> str:
    r, sec = cached["rates"], cached["job_seconds"]

    def one(k: str, name: str) -> str:
        return (f"{name} {r[k]['decode']:.0f} decoded, {r[k]['prefill']:.0f} prefilled a second, make eval's job "
                f"about {sec[k] / 60:.0f} min of model time")

    out = f"{cached.get('rows', DECODE_ROWS)} real requests: " + one("engine", "engine")
    out += f"; {one('llamacpp', 'llama.cpp')}" if "llamacpp" in r else \
        f"; llama.cpp could not run ({cached.get('llamacpp_error')})"
    return out + f" ({cached['job_mix'][0]:,} completion and {cached['job_mix'][1]:,} prefill tokens: {cached['job_mix'][2]})"


def _llamacpp(cfg: TransformersModelConf, cached: dict | None, reason: str):
    from .llamacpp import LlamaCppModel

    model = LlamaCppModel(llamacpp_conf(cfg))
    model.choice = Choice(weights="gguf", dtype="gguf", int8=None, runtime="llamacpp", reason=reason,
                          why_not="llama.cpp's sums depend on which slots share a batch (measured: "
                                  "serving/README.md)",
                          decode_tok_s={k: r["decode"] for k, r in (cached or {}).get("rates", {}).items()})
    say(f"path: {model.choice.label()}: {reason}; {model.choice.repeat_words()}")
    return model
