"""Model backends. One file per provider; `build_model` picks one from a conf/model/*.yaml dict."""
from __future__ import annotations

from typing import Iterable

from .base import Generation, GenRequest, Model, ModelUnavailable

BACKENDS = ("transformers", "llamacpp", "openai", "oracle", "scripted")


def build_model(cfg: dict, tasks: Iterable = ()) -> Model:
    backend = cfg.get("backend")
    if backend == "oracle":
        from .doubles import OracleModel

        return OracleModel(tasks, solution=cfg.get("solution", "canonical"), name=cfg.get("name", "oracle"))
    if backend == "scripted":
        from .doubles import ScriptedModel

        return ScriptedModel(cfg.get("outputs", []), name=cfg.get("name", "scripted"))
    if backend == "transformers":
        from .hf import TransformersModel

        return TransformersModel(cfg)
    if backend == "llamacpp":
        from .llamacpp import LlamaCppModel

        return LlamaCppModel(cfg)
    if backend == "openai":
        from .openai_backend import OpenAIModel

        return OpenAIModel(cfg)
    raise ModelUnavailable(f"unknown model backend {backend!r}: use one of {', '.join(BACKENDS)}")


__all__ = ["Generation", "GenRequest", "Model", "ModelUnavailable", "build_model"]
