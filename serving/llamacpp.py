"""llama.cpp's own HTTP server, embedded in this process (xllamacpp), spoken to through the OpenAI backend.

The server serves a registry pack's GGUF as is (no conversion; Q4 weights stay Q4) or any GGUF `path`. It
lives in this process's threads, so it dies with the job, even after a SIGKILL, and binds 127.0.0.1 only.
Measured here (2 cores): prefill of the 1.5B pack is compute-bound and slow (benchmarks/weights.py), so prompt tokens
are what a job costs; slots keep their last prompt (`cache_prompt`) and llama.cpp picks the slot whose cached
prompt shares the longest prefix with a new request, so a reflection round that extends its conversation
prefills only the new turn. `prefill_tokens` reports what was actually computed.
"""
from __future__ import annotations

import logging
import socket
import threading

from agents.models.base import Generation, GenRequest, ModelUnavailable, extra_message
from .cores import claim_threads
from agents.models.config import LlamaCppModelConf, OpenAIModelConf
from agents.models.openai_backend import OpenAIModel

log = logging.getLogger(__name__)
SPECULATIVE = ("none", "ngram")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaCppModel:
    def __init__(self, cfg: LlamaCppModelConf):
        self.cfg = cfg
        self.name = cfg.name
        slots = _positive(cfg, "slots")  # bad values first: one line before any pack is installed
        ctx = _positive(cfg, "context_per_slot")
        spec = cfg.speculative
        if spec not in SPECULATIVE:
            raise ModelUnavailable(f"model.speculative={spec!r} is unknown: use one of {', '.join(SPECULATIVE)}")
        gguf = self._gguf(cfg)
        try:
            import xllamacpp
        except ImportError:
            raise ModelUnavailable(extra_message("llamacpp", f"model={cfg.name}")) from None
        self._cores = claim_threads(cfg.threads)  # a fair share beside other fixlab model processes
        threads = self._cores.threads
        p = xllamacpp.CommonParams()
        p.model.path = str(gguf)
        p.hostnames = ["127.0.0.1"]
        p.port = _free_port()
        p.n_parallel = slots
        p.n_ctx = slots * ctx  # llama.cpp shares n_ctx among the slots
        p.cpuparams.n_threads = int(threads)
        p.cpuparams_batch.n_threads = int(threads)
        p.model_alias = {self.name}
        p.verbosity = int(cfg.log_verbosity)  # 1: llama.cpp's warnings and errors only
        p.cache_prompt = bool(cfg.cache_prompt)
        p.cache_ram_mib = int(cfg.cache_ram_mib)  # host-memory copies of evicted slot prompts
        if spec == "ngram":
            # Prompt lookup: a repair copies most of the buggy code, so drafts come from n-grams already seen.
            p.speculative.types = [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
            p.speculative.ngram_simple.size_n = _positive(cfg, "ngram_size")
            p.speculative.ngram_simple.size_m = _positive(cfg, "draft_tokens")
        self._lock = threading.Lock()
        try:
            self.server = xllamacpp.Server(p)
        except Exception as e:
            self._cores.release()
            raise ModelUnavailable(f"llama.cpp could not load {gguf} ({type(e).__name__}: {e})") from None
        self.base_url = f"{self.server.listening_address}/v1"
        self.api = OpenAIModel(OpenAIModelConf(
            name=self.name, model=self.name, base_url=self.base_url, max_concurrency=slots, timeout_s=cfg.timeout_s,
            max_retries=0, api_keys_env="FIXLAB_NO_KEYS", api_key_env="FIXLAB_NO_KEY"))
        log.info("llama.cpp serves %s at %s (%d slots x %d tokens, %s threads)", gguf, self.base_url, slots, ctx, threads)

    @staticmethod
    def _gguf(cfg: LlamaCppModelConf):
        from pathlib import Path

        if cfg.pack:
            from .packs import ensure_gguf

            return ensure_gguf(cfg.pack)
        if cfg.gguf:
            path = Path(str(cfg.gguf)).expanduser()
            if not path.is_file():
                raise ModelUnavailable(f"model.gguf={path}: no such file; give the path of a .gguf model file")
            return path
        raise ModelUnavailable(f"llamacpp model config {cfg.name!r} needs `pack` or `gguf` (a .gguf file)")

    def generate(self, request: GenRequest) -> Generation:
        return self.api.generate(request)

    def close(self) -> None:
        with self._lock:
            server = self.__dict__.pop("server", None)
            api = self.__dict__.pop("api", None)
        if api is not None:
            api.close()
        self._cores.release()
        del server  # the server's destructor stops its threads and frees the model


def _positive(cfg: LlamaCppModelConf, key: str) -> int:
    v = getattr(cfg, key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelUnavailable(f"model.{key} must be an integer >= 1, got {v!r}")
    return v
