"""Model backends. One file per provider; `build_model` builds the one a model record names
(agents/models/config.py; conf/model/*.yaml)."""
from __future__ import annotations

from .base import Generation, GenRequest, Model, ModelUnavailable
from .config import (MODEL_CONFS, AnswersModelConf, LlamaCppModelConf, ModelConf, OpenAIModelConf, OracleModelConf,
                     TransformersModelConf)

BACKENDS = tuple(MODEL_CONFS)


def build_model(conf: ModelConf, dataset=None) -> Model:
    """A model from its record; the oracle test doubles read their answers from the job's dataset (a DatasetConf)."""
    if isinstance(conf, OracleModelConf):
        from ..tasks import DatasetConf, load_tasks
        from .doubles import OracleModel

        return OracleModel(load_tasks(dataset or DatasetConf()), conf)
    if isinstance(conf, (TransformersModelConf, LlamaCppModelConf)):  # the local engine lives in serving/, above us
        raise ModelUnavailable(f"model={conf.name} ({conf.backend}) runs on this machine: build it with serving.build")
    if isinstance(conf, AnswersModelConf):
        from .doubles import RecordedAnswers

        return RecordedAnswers(conf)
    if isinstance(conf, OpenAIModelConf):
        from .openai_backend import OpenAIModel

        return OpenAIModel(conf)
    raise ModelUnavailable(f"unknown model backend {conf.backend!r}: use one of {', '.join(BACKENDS)}")


__all__ = ["Generation", "GenRequest", "Model", "ModelConf", "ModelUnavailable", "build_model"]
