"""From a resolved Hydra config to checked, typed settings. Bad values fail here with one clear line.

The records and their defaults are flows/schema.py's (and the modules it names); this adds the range checks a
type cannot say (iters >= 0, a known protocol...) and builds the agent's own record.
"""
from __future__ import annotations

from dataclasses import dataclass

from agents.config import PROTOCOLS, AgentConfig, DraftsConf, check_config
from agents.models.config import ModelConf
from agents.tasks import DatasetConf
from sandboxes.config import SandboxConf

from .schema import ConfigError, RunnerConf, TrackingConf, job_conf
from .stream import parse_plan

__all__ = ["ConfigError", "JobSettings", "settings_from"]


@dataclass
class JobSettings:
    agent: AgentConfig
    model: ModelConf
    sandbox: SandboxConf
    dataset: DatasetConf
    runner: RunnerConf
    tracking: TrackingConf
    samples: int
    offline: bool | str
    resume: str | None
    raw: dict  # the resolved config as given (logged as the run's params; resume compares it)
    cache: bool
    cache_dir: str | None
    run_ahead: int  # a budget sweep's largest budget: each task runs to it once and the cache holds it (flows/core.py)
    stream: tuple[int, int] | None  # a candidates x budgets sweep's stream (K a round, N answers): flows/stream.py

    @property
    def stream_applies(self) -> bool:
        from .stream import applies

        return applies(self.agent, self.stream)

    @property
    def run_name(self) -> str:
        s, k = self.agent.strategy, ""
        if isinstance(s, DraftsConf):
            k += f"-k{s.candidates}" if s.candidates > 1 else ""  # several answers per round
            k += f"-rd{s.redraws}" if s.redraws else ""  # known failures drawn again
        lang = "" if self.dataset.language == "python" else f"-{self.dataset.language}"  # Python's names as before
        return self.tracking.run_name or f"{self.model.name}-{self.agent.strategy.name}{k}-iters{self.agent.iters}{lang}"


# Techniques that read Python with its own parser and run Python probes (agents/selfcheck.py, agents/patch.py's
# worked example): in the other languages a config that asks for one is refused in one line.
PYTHON_ONLY = (("self_check", 0), ("self_tests", 0), ("self_inputs", 0))


def check_language(job) -> None:
    """The dataset's language is one of the six, and what the config asks for works in it."""
    from agents.tasks import DatasetError, dataset_language

    try:
        lang = dataset_language(job.dataset)
    except DatasetError as e:
        raise ConfigError(str(e)) from None
    if lang.name == "python":
        return
    for knob, off in PYTHON_ONLY:
        if getattr(job.strategy, knob, off) != off:
            raise ConfigError(f"strategy.{knob} runs Python probes; with dataset.language={lang.name} leave it at {off}")
    if getattr(job.strategy, "answer_format", "function") == "patch":
        raise ConfigError(f"strategy.answer_format=patch is Python's (its worked example); with "
                          f"dataset.language={lang.name} use function or line")
    if job.sandbox.backend == "e2b":
        raise ConfigError(f"sandbox=e2b runs what its template offers, Python only; with dataset.language={lang.name} "
                          "use sandbox=local or sandbox=docker")


def _in_range(label: str, v, lo: float, hi: float | None = None) -> None:
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ConfigError(f"{label} must be {'an integer' if isinstance(v, int) else 'a number'} {rng}, got {v!r}")


def model_prices(model) -> tuple[float, float] | None:
    """(prompt, completion) US dollars per million tokens where the model's record carries both, else None (a local
    model has no price: it is shown as such, never as zero)."""
    p, c = getattr(model, "price_prompt_per_mtok", None), getattr(model, "price_completion_per_mtok", None)
    return (float(p), float(c)) if p is not None and c is not None else None


def settings_from(cfg: dict) -> JobSettings:
    """`cfg` is the resolved Hydra config as a plain dict (or a dict built the same way)."""
    job = job_conf(cfg)
    if job.protocol not in PROTOCOLS:
        raise ConfigError(f"protocol={job.protocol!r} is unknown: use one of {', '.join(PROTOCOLS)}")
    if job.offline not in ("auto", True, False):
        raise ConfigError(f"offline must be auto, true or false, got {job.offline!r}")
    iters = job.iters
    if job.answers is not None:  # answers per task, candidates a round: the budget follows
        from .stream import iters_for_answers

        _in_range("answers", job.answers, 1)
        try:
            iters = iters_for_answers(job.answers, getattr(job.strategy, "candidates", 1))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        cfg = {**cfg, "iters": iters}  # what the run logs is the budget that ran
    for label, v, lo, hi in (("iters", iters, 0, None), ("temperature", job.temperature, 0.0, 5.0),
                             ("max_new_tokens", job.max_new_tokens, 1, None), ("seed", job.seed, 0, None),
                             ("samples", job.samples, 1, None), ("runner.workers", job.runner.workers, 1, None),
                             ("sandbox.timeout_s", job.sandbox.timeout_s, 0.001, None)):
        _in_range(label, v, lo, hi)
    prices = model_prices(job.model)
    limit = job.budget.usd_per_task
    if limit is not None:
        _in_range("budget.usd_per_task", limit, 0.0)
        if prices is None:
            fix = ("set model.price_prompt_per_mtok and model.price_completion_per_mtok"
                   if hasattr(job.model, "price_prompt_per_mtok") else f"a {job.model.backend} model has no price")
            raise ConfigError(f"budget.usd_per_task={limit} needs the model's prices, and model={job.model.name} has "
                              f"none ({fix}); or drop the limit")
    agent = AgentConfig(strategy=job.strategy, iters=iters, protocol=job.protocol, temperature=job.temperature,
                        max_new_tokens=job.max_new_tokens, seed=job.seed, timeout_s=job.sandbox.timeout_s,
                        audit_passes=job.sandbox.audit, strict=job.sandbox.strict, usd_per_task=limit,
                        prices=prices if limit is not None else None)
    try:
        check_config(agent)  # schedules, feedback styles, tool formats: one line here, not one error per task
    except ValueError as e:
        raise ConfigError(f"strategy: {e}") from None
    check_language(job)
    return JobSettings(
        agent=agent, model=job.model, sandbox=job.sandbox, dataset=job.dataset, runner=job.runner,
        tracking=job.tracking, samples=job.samples, offline=job.offline, resume=job.resume, raw=dict(cfg),
        cache=job.cache, cache_dir=job.cache_dir,
        run_ahead=(job.sweep_ahead_to or 0) if job.sweep_ahead else 0,
        stream=parse_plan(job.sweep_stream) if job.sweep_ahead else None,
    )
