"""Model backends. One file per provider; `build_model` picks one from a conf/model/*.yaml dict."""
from __future__ import annotations

from .base import Generation, GenRequest, Model, ModelUnavailable

BACKENDS = ("transformers", "llamacpp", "openai", "oracle", "scripted")


def build_model(cfg: dict, dataset: dict | None = None) -> Model:
    """A model from its config; the oracle test doubles read their answers from the job's `dataset` config."""
    backend = cfg.get("backend")
    if backend == "oracle":
        from ..tasks import load_tasks
        from .doubles import OracleModel

        return OracleModel(load_tasks(dataset or {}), solution=cfg.get("solution", "canonical"),
                           name=cfg.get("name", "oracle"), delay_s=cfg.get("delay_s", 0))
    if backend == "scripted":
        from .doubles import ScriptedModel

        return ScriptedModel(cfg.get("outputs", []), name=cfg.get("name", "scripted"))
    if backend == "transformers":
        from ..serving.hf import TransformersModel

        return TransformersModel(cfg)
    if backend == "llamacpp":
        from ..serving.llamacpp import LlamaCppModel

        return LlamaCppModel(cfg)
    if backend == "openai":
        from .openai_backend import OpenAIModel

        return OpenAIModel(cfg)
    raise ModelUnavailable(f"unknown model backend {backend!r}: use one of {', '.join(BACKENDS)}")


__all__ = ["Generation", "GenRequest", "Model", "ModelUnavailable", "build_model"]
