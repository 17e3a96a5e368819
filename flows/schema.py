"""The job's typed config: one record per option of each config group, registered in Hydra's ConfigStore as the
schema of its yaml file, and `typed`, which turns a plain dict into those records.

Each default is defined once, beside the code that reads it: the strategies' in agents/config.py, the models' in
agents/models/config.py, the sandboxes' in sandboxes/config.py, the dataset's in agents/tasks.py, the runners',
tracking's and the job's own here. A yaml file names its record first in its defaults list (`- react_schema`)
and holds only what differs from it. A wrong key or type, in a yaml file, on the command line or in a dict, is
one line that names it and the nearest valid key (`describe`).

A setting that changes no answer (where a job runs, how fast, what it logs) carries `metadata={"neutral": why}` on
its field; on a field that holds a group (runner, tracking, nightly) it covers the whole group. flows/result_neutral.py
derives the result-neutral keys from these records and `ServingParams` (a run's recorded path).
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from agents.config import STRATEGY_CONFS, AgentConfig
from agents.models.config import MODEL_CONFS
from agents.tasks import DatasetConf
from sandboxes.config import SANDBOX_CONFS


CONF_DIR = Path(__file__).resolve().parent / "conf"  # the repository's conf/ (a link), or its copy in the package


class ConfigError(ValueError):
    """A bad config value. The message is one line that names the key, the value and what is allowed."""


@dataclass
class RunnerConf:
    name: str  # threads | dask: set by each record below


@dataclass
class ThreadsRunnerConf(RunnerConf):
    """Prefect ThreadPoolTaskRunner: tasks run in threads of this process and share one model and sandbox."""

    name: str = "threads"
    # tasks in flight; the model engine batches their requests (the 1.5B pack: max_batch 48): more only wait for KV
    # room (make eval's results files at 48 and 64)
    workers: int = 48


@dataclass
class DaskRunnerConf(RunnerConf):
    """Prefect DaskTaskRunner (prefect-dask): tasks run on a Dask cluster; each worker process loads the model once
    and serves all its tasks through the batching engine. flows/README.md: several GPU machines."""

    name: str = "dask"
    address: str | None = None  # tcp://host:8786 of a running `dask scheduler`; null: start a local cluster
    workers: int = 2  # local cluster: worker processes (one model copy each)
    threads_per_worker: int = 4  # tasks in flight per worker process; the model engine batches their requests


RUNNER_CONFS: dict[str, type[RunnerConf]] = {"threads": ThreadsRunnerConf, "dask": DaskRunnerConf}


# A run's `serving.*` params: not set by anyone, recorded by flows/job.py from the path the local model took
# (serving/paths.py Choice.record()). Runs on different paths are different configurations, except for the
# int8 kernel, which computes the same integer products either way.
@dataclass
class ServingParams:
    runtime: str  # engine | llamacpp | continuous | static (transformers' batching, on a GPU)
    weights: str  # int8 | float32 | bfloat16 | gguf
    dtype: str  # the activations' dtype (gguf under llama.cpp)
    int8_kernel: str | None = field(default=None, metadata={"neutral": "bit-equal: which kernel, same products"})
    # whether the path repeats its answers bit for bit whatever else is in flight (batch size, order, prefix hits,
    # drafts): true for fixlab's engine on its batch-invariant kernels, false for llama.cpp, bf16 and every server
    deterministic: bool | None = field(default=None, metadata={"neutral": "a property of the path, not a setting"})


@dataclass
class TrackingConf:
    uri: str | None = None  # null: sqlite:///<repo>/mlruns/mlflow.db
    artifacts: str | None = None  # null: <repo>/mlruns/artifacts
    experiment: str = "humanevalfix"
    run_name: str | None = None  # null: <model>-<strategy>-iters<k>
    # the folder the job writes its results file to when it ends (fullsize-<run name>-<UTC>.json: flows/results.py
    # reads it, flows.frontier and flows.report take it); null: <artifacts' parent>/results, beside the store. A
    # full-size run to report: tracking.results=benchmarks/results
    results: str | None = None


@dataclass
class BudgetConf:
    """What one task may spend before its loop stops (recorded as the task's stop reason)."""

    # US dollars a task at the model's list prices (model.price_*_per_mtok); null: no limit. A model without prices
    # cannot be held to one: one line says so.
    usd_per_task: float | None = None


@dataclass
class JobConf:
    """One evaluation job (conf/config.yaml). The agent's run-level defaults are AgentConfig's (agents/config.py)."""

    model: Any = MISSING  # a group: conf/model/<option>.yaml (picked by the defaults list)
    strategy: Any = MISSING  # conf/strategy/<option>.yaml
    sandbox: Any = MISSING  # conf/sandbox/<option>.yaml
    dataset: DatasetConf = field(default_factory=DatasetConf)  # conf/dataset/<option>.yaml
    runner: Any = field(default=MISSING, metadata={"neutral": "where tasks run"})  # conf/runner/<option>.yaml
    tracking: TrackingConf = field(default_factory=TrackingConf, metadata={"neutral": "where the run is logged"})
    iters: int = AgentConfig.iters  # feedback rounds after the first attempt; 0 = single-shot pass@1
    # Answers per task instead of iters: iters = answers / strategy.candidates - 1. The grid
    # `strategy.candidates=1,2,4,8 answers=8 -m` (single_shot) costs one run: flows/stream.py
    answers: int | None = None
    seed: int = AgentConfig.seed  # seeds sampling; on a path that repeats (serving.deterministic) so does the run
    temperature: float = AgentConfig.temperature  # first attempt's temperature (0 = greedy)
    max_new_tokens: int = AgentConfig.max_new_tokens
    protocol: str = AgentConfig.protocol  # tests | docs | hidden: what the agent sees (agents/README.md)
    samples: int = 1  # independent trajectories per task (pass@k for k <= samples); n > 1 needs temperature > 0
    budget: BudgetConf = field(default_factory=BudgetConf)  # budget.usd_per_task: a spend limit per task
    # auto: go offline at once when the Hugging Face hub cannot be resolved; true | false
    offline: Any = field(default="auto", metadata={"neutral": "where files come from, not which"})
    # reuse trajectories across budgets (flows/cache.py): iters=0,1,2,3 -m costs about iters=3
    cache: bool = field(default=True, metadata={"neutral": "a cached round is the round a fresh run makes"})
    # null: $FIXLAB_CACHE/trajectories or ~/.cache/fixlab/trajectories
    cache_dir: str | None = field(default=None, metadata={"neutral": "where the cache lives"})
    # In a sweep over iters (-m), each task runs to the largest budget once, in the first job, as one conversation
    # (prefix reuse sees every round); later jobs only cut it.
    sweep_ahead: bool = field(default=True, metadata={"neutral": "rounds never depend on the budget"})
    # that largest budget: set by the sweep callback (flows/sweep.py), not by hand
    sweep_ahead_to: int | None = field(default=None, metadata={"neutral": "rounds never depend on the budget"})
    # [K, N]: a sweep's single_shot answer stream (K answers a round, N in all) its jobs are cut from (flows/stream.py):
    # set by the sweep callback, not by hand
    sweep_stream: list[int] | None = field(default=None, metadata={"neutral": "a cut stream is the job's own answers"})
    # an MLflow run id, or "last": run only the tasks that run has not finished
    resume: str | None = field(default=None, metadata={"neutral": "which run is continued"})


@dataclass
class NightlyConf:
    """conf/nightly.yaml's `nightly` block (flows/nightly.py). No defaults: that file pins every value."""

    cron: str  # e.g. "0 2 * * *"
    timezone: str  # IANA timezone of the cron string
    tolerance: float  # fail when pass@1 drops by more than this (absolute) against the last good nightly
    must_pass: list[str]  # task ids that must pass every night


@dataclass
class NightlyJobConf(JobConf):
    nightly: NightlyConf = field(default=MISSING, metadata={"neutral": "when it runs and how it is judged"})


# group -> (the key that names the option's record, record by option)
GROUPS: dict[str, tuple[str, dict[str, type]]] = {
    "model": ("backend", MODEL_CONFS), "strategy": ("name", STRATEGY_CONFS), "sandbox": ("backend", SANDBOX_CONFS),
    "runner": ("name", RUNNER_CONFS),
}
RECORDS: dict[str, type] = {c.__name__: c for c in (
    *MODEL_CONFS.values(), *STRATEGY_CONFS.values(), *SANDBOX_CONFS.values(), *RUNNER_CONFS.values(), DatasetConf,
    TrackingConf, BudgetConf, JobConf, NightlyConf, NightlyJobConf)}


def register() -> None:
    """Every record in Hydra's ConfigStore: `<option>_schema` in its group (conf/<group>/*.yaml name it first in their
    defaults list), `job_schema` and `nightly_schema` at the top."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="job_schema", node=JobConf)
    cs.store(name="nightly_schema", node=NightlyJobConf)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConf)
    for group, (_, records) in GROUPS.items():
        for option, record in records.items():
            cs.store(group=group, name=f"{option}_schema", node=record)


register()


# ---------------------------------------------------------------- plain dicts -> records
def typed(record: type, data: Any, where: str = "", source: str | None = None):
    """`data` (a dict from a resolved config) checked against `record` and turned into one; `where` is its key in
    the job config ("model", "" for the top), `source` the yaml file it came from, for the message."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_values(record, data, where, source)
    try:
        node = OmegaConf.merge(OmegaConf.structured(record), data)
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise ConfigError(describe(e, prefix=where, source=source)) from None


def check_values(record: type, data: Any, where: str = "", source: str | None = None) -> None:
    """The types OmegaConf would quietly convert: 3 or "yes" for true/false, true for a string... A value of the
    wrong type is one ConfigError line. Unknown keys are left to OmegaConf (describe names the nearest)."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(record):
        return
    hints = typing.get_type_hints(record)
    for key, value in data.items():
        if key not in hints:
            continue
        full = f"{where}.{key}" if where else key
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[key]):
            check_values(hints[key], value, full, source)
            continue
        want = wrong_type(hints[key], value)
        if want:
            raise ConfigError(f"{full} must be {want}, got {value!r}" + (f" ({source})" if source else ""))


def wrong_type(hint: Any, value: Any) -> str | None:
    """What `value` should have been for a field typed `hint`, or None when it fits."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    if hint is Any or value == "???" or (isinstance(value, str) and value.startswith("${")):
        return None  # anything goes / a value still to be given / an interpolation
    if typing.get_origin(hint) is list:
        if not isinstance(value, (list, tuple)):
            return "a list"
        bad = [w for w in (wrong_type(args[0], v) for v in value) if w] if args else []
        return f"a list of {bad[0].removeprefix('a ').removeprefix('an ')}s" if bad else None
    if hint is bool:
        return None if isinstance(value, bool) else "true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if hint is str:
        return None if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "a string"
    return None


def group_record(group: str, data: Any) -> type:
    """The record a group's dict is an option of, by its `backend` or `name`."""
    key, records = GROUPS[group]
    if not isinstance(data, dict) or data.get(key) not in records:
        got = data.get(key) if isinstance(data, dict) else data
        raise ConfigError(f"{group}.{key} {got!r} is unknown: use {' | '.join(records)} "
                          f"(conf/{group}/*.yaml pick one: {group}=NAME)")
    return records[data[key]]


def option_default(key: str, params: dict[str, str]) -> str | None:
    """A flattened key's default ("strategy.self_tests" -> "0") for the group options `params` names, as run params
    write it; None when those options have no such knob (react has no `candidates`) or it has no scalar default."""
    group, _, name = key.partition(".")
    nested = {f.name: f.default_factory for f in dataclasses.fields(JobConf) if f.default_factory is not dataclasses.MISSING}
    if group in GROUPS:
        sel, records = GROUPS[group]
        record = records.get(params.get(f"{group}.{sel}"))
    elif group in nested and name:  # a record inside the job's (budget.usd_per_task)
        record = type(nested[group]())
    else:
        record, name = JobConf, key
    for f in dataclasses.fields(record) if record else ():
        if f.name == name and f.default is not dataclasses.MISSING and f.default is not MISSING:
            return str(f.default) if not isinstance(f.default, (list, tuple)) else None
    return None


def job_conf(cfg: dict) -> JobConf:
    """The whole job config as records (a NightlyJobConf when it has a `nightly` block)."""
    data = dict(cfg)
    for group in GROUPS:
        data[group] = typed(group_record(group, cfg.get(group)), cfg.get(group), group)
    return typed(NightlyJobConf if "nightly" in cfg else JobConf, data)


def check_composed(cfg, overrides: list) -> None:
    """What Hydra's composition let through, checked against the records: the values each chosen yaml file gives
    (read as written) and each command-line override (`overrides`: Hydra's parsed Override objects). `cfg` is the
    composed config with its `hydra` node (compose(..., return_hydra_config=True))."""
    from omegaconf import OmegaConf

    for group, option in cfg.hydra.runtime.choices.items():
        path = CONF_DIR / group / f"{option}.yaml"
        if group in cfg and not group.startswith("hydra") and path.is_file():
            raw = OmegaConf.to_container(OmegaConf.load(path))
            raw.pop("defaults", None)
            check_values(OmegaConf.get_type(cfg[group]), raw, group, f"conf/{group}/{option}.yaml")
    for o in overrides:
        key = o.get_key_element()
        if "." not in key and key in cfg.hydra.runtime.choices:
            continue  # picks a group's option
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        record = OmegaConf.get_type(node) if node is not None else None
        if not dataclasses.is_dataclass(record):
            continue
        hint = typing.get_type_hints(record).get(leaf)
        try:
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        except Exception:  # a sweep the basic sweeper cannot list (interval): the job checks its own value
            values = []
        for v in values if hint is not None else []:
            want = wrong_type(hint, v)
            if want:
                raise ConfigError(f"{key} must be {want}, got {v!r}")


# ---------------------------------------------------------------- errors as one line
_WANT = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def describe(e: BaseException, prefix: str = "", source: str | None = None) -> str:
    """An OmegaConf or Hydra error about a key, a value or an option, as one line: the key, what is wrong with it,
    the nearest valid key, and the yaml file it came from. Falls back to the error's own text, on one line."""
    cause = e.__cause__ if e.__cause__ is not None else e
    text = str(e)
    m = re.match(r"In '([^']+)': ", text)
    if m and m.group(1) != "config":  # an error inside a yaml file while Hydra composed the config
        source = f"conf/{m.group(1)}.yaml"
    where = f" ({source})" if source else ""
    missing_option = re.search(r"Could not find '(\w+)/([^']+)'", text)
    if missing_option:
        group, option = missing_option.groups()
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return f"{group}={option} is unknown: use one of {', '.join(options)} (conf/{group}/*.yaml)"
    full = getattr(cause, "full_key", None) or _field(text, r"full_key: (\S+)")
    obj = getattr(cause, "object_type", None)
    record = obj if isinstance(obj, type) else RECORDS.get(_field(text, r"object_type=(\w+)") or "")
    if full is None:
        return " ".join(text.split("Config search path")[0].split())[:400]
    full = f"{prefix}.{full}" if prefix and not full.startswith(prefix + ".") else full
    key = full.rsplit(".", 1)[-1]
    if re.search(r"Key '[^']+' (?:not in|is not in struct)", str(cause) + text):
        return f"unknown key {full}: {_nearest(record, key)}{where}"[:400]
    lines = [l for l in (str(cause) + "\n" + text).splitlines() if l.strip() and not l.startswith("In '")]
    msg = lines[0] if lines else text
    conv = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if conv:
        got = repr(conv.group(1)) if conv.group(2) == "str" else conv.group(1)
        return f"{full} must be {_WANT.get(conv.group(3), conv.group(3))}, got {got}{where}"
    bad_bool = re.search(r"Value '(.*)' is not a valid bool", msg)
    if bad_bool:
        return f"{full} must be true or false, got {bad_bool.group(1)}{where}"
    if "Missing mandatory value" in msg:
        return f"{full} must be set{where}"
    if "is not a ListConfig" in msg:
        return f"{full} must be a list{where}"
    if "is not Optional" in msg:
        return f"{full} cannot be null{where}"
    return f"{full}: {msg}{where}"[:400]


def _nearest(record: type | None, key: str) -> str:
    """What to say about `key`, unknown to `record`: the nearest key it has, else the options of its group that
    have it, else its keys."""
    known = [f.name for f in dataclasses.fields(record)] if record else []
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]}?"
    for group, (_, records) in GROUPS.items():
        if record in records.values():
            mine = next(o for o, r in records.items() if r is record)
            others = [o for o, r in records.items() if key in {f.name for f in dataclasses.fields(r)}]
            if others:
                return f"{group}={mine} has no {key} ({' and '.join(others)} {'have' if len(others) > 1 else 'has'} it)"
            return f"{group}={mine} has {', '.join(known)}"
    if known:
        return f"use one of {', '.join(known)}"
    return "check the spelling (`python -m flows.evaluate --cfg job` prints every setting)"


def _field(text: str, pattern: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None
