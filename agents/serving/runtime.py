"""Which runtime serves a local model: fixlab's engine (hf.py) or, for a registry pack, llama.cpp on the same GGUF
(llamacpp.py), measured where `runtime: auto` (step 2 of the path chooser, paths.py: the weights and int8 kernels
are step 1). `build_local` is what agents.models.build_model calls for a transformers config; it prints the path line
and remembers the path each config took in this process (`recorded`: the trajectory cache's identity, flows/cache.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from ..models.config import LlamaCppModelConf, TransformersModelConf
from .paths import DECODE_ROWS, Choice, cache_key, read_cached, say, shapes_for, write_cached


def _decode_rate(model, rows: int, new_tokens: int) -> float:
    """Tokens/s of `rows` concurrent requests of `new_tokens` each (a listing the model will not end early), after one
    pass that fills the prompt caches: what is timed is decoding at that width, as in a job's rounds."""
    from concurrent.futures import ThreadPoolExecutor

    from ..models.base import GenRequest

    def req(i, n):
        return GenRequest(messages=[{"role": "user", "content": f"List the integers from {i} to {i + 500}, one "
                                     "per line, nothing else."}], max_new_tokens=n, temperature=0.0)

    with ThreadPoolExecutor(rows) as pool:
        list(pool.map(lambda i: model.generate(req(i, 1)), range(rows)))
        t0 = time.perf_counter()
        gens = list(pool.map(lambda i: model.generate(req(i, new_tokens)), range(rows)))
    return sum(g.completion_tokens for g in gens) / (time.perf_counter() - t0)


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


def _conf_key(cfg) -> str:
    return json.dumps(asdict(cfg), sort_keys=True, default=str)


def recorded(cfg) -> dict | None:
    """The path (Choice.record) a model built from this config took in this process, None if none was built."""
    return _BUILT.get(_conf_key(cfg))


def build_local(cfg: TransformersModelConf):
    model = _build_local(cfg)
    _BUILT[_conf_key(cfg)] = model.choice.record()
    return model


def _build_local(cfg: TransformersModelConf):
    """The model a transformers config serves through: fixlab's engine (TransformersModel) or, for a pack whose
    `runtime` is auto or llamacpp, llama.cpp where it was measured faster (LlamaCppModel). Prints the path line."""
    from .devices import BadModelConfig
    from .hf import TransformersModel

    runtime = str(cfg.runtime or "auto").strip().lower()
    if runtime not in ("auto", "engine", "llamacpp"):
        raise BadModelConfig(f"unknown runtime {cfg.runtime!r}: use auto, engine or llamacpp")
    if runtime == "llamacpp":
        if not cfg.pack:
            raise BadModelConfig("runtime=llamacpp serves a registry pack's GGUF: set pack, or use runtime=engine")
        return _llamacpp(cfg, None, "runtime=llamacpp as configured")
    if not runtime_eligible(cfg):
        model = TransformersModel(cfg)
        say(f"path: {model.choice.label()}: {model.choice.reason}")
        return model
    shapes = shapes_for(cfg)
    key, ident = cache_key(shapes, "runtime", {"engine": _engine_ident(cfg)})
    cached = read_cached(key)
    if cached is not None and cached.get("runtime") == "llamacpp":
        return _llamacpp(cfg, cached, _runtime_reason(cached))
    model = TransformersModel(cfg)
    if cached is None:
        say("measuring fixlab's engine against llama.cpp on the same pack (once; cached)")
        rates = {"engine": round(_decode_rate(model, int(cfg.max_batch), 24), 1)}
        try:
            from .llamacpp import LlamaCppModel

            other = LlamaCppModel(llamacpp_conf(cfg))
            try:
                rates["llamacpp"] = round(_decode_rate(other, int(cfg.max_batch), 24), 1)
            finally:
                other.close()
        except Exception as e:  # llama.cpp cannot run here: the engine serves, and the reason is recorded
            rates["llamacpp_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        cached = {"runtime": "llamacpp" if rates.get("llamacpp", 0) > rates["engine"] else "engine",
                  "decode_tok_s": rates, "engine_path": model.choice.label(), "rows": int(cfg.max_batch)}
        write_cached(key, ident, cached)
        if cached["runtime"] == "llamacpp":
            model.close()
            return _llamacpp(cfg, cached, _runtime_reason(cached))
    model.choice.runtime = "engine"
    model.choice.decode_tok_s = cached["decode_tok_s"]
    model.choice.reason = f"{_runtime_reason(cached)}; {model.choice.reason}"
    say(f"path: {model.choice.label()}: {model.choice.reason}")
    return model


def _engine_ident(cfg: TransformersModelConf) -> dict:
    """What the engine's measured rate depends on, among its settings."""
    return {k: getattr(cfg, k) for k in ("weights", "dtype", "int8_kernel", "int8_skip", "max_batch", "kv_dtype",
                                         "draft_tokens", "threads")}


def _runtime_reason(cached: dict) -> str:
    r = cached["decode_tok_s"]
    ll = f"llama.cpp {r['llamacpp']:.0f}" if "llamacpp" in r else f"llama.cpp could not run ({r.get('llamacpp_error')})"
    out = f"{cached.get('rows', DECODE_ROWS)} real requests, tokens/s: engine {r['engine']:.0f}, {ll}"
    return out + expected_job(max(r["engine"], r.get("llamacpp", 0)))


def expected_job(rate: float) -> str:
    """`; make eval's job decodes in about N min at this rate`, from the newest recorded run of that job
    (benchmarks/results/fullsize-single_shot-default-*.json: its completion tokens); "" where none is at hand."""
    files = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob(
        "fullsize-single_shot-default-*.json"), key=lambda p: p.stat().st_mtime)
    try:
        tokens = json.loads(files[-1].read_text())["runs"][0]["cost"]["completion_tokens"]
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        return ""
    return (f"; at that rate make eval's job ({tokens:,.0f} completion tokens when last recorded) decodes in about "
            f"{tokens / max(rate, 1e-9) / 60:.0f} min, plus prefill and tests")


def _llamacpp(cfg: TransformersModelConf, cached: dict | None, reason: str):
    from .llamacpp import LlamaCppModel

    model = LlamaCppModel(llamacpp_conf(cfg))
    model.choice = Choice(weights="gguf", dtype="gguf", int8=None, runtime="llamacpp", reason=reason,
                          decode_tok_s=(cached or {}).get("decode_tok_s", {}))
    say(f"path: {model.choice.label()}: {reason}")
    return model
