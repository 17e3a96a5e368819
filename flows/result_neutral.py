"""Result-neutral settings: where a job runs and how fast, never what it answers. Each one says so on its own field
in the config records (`metadata={"neutral": why}`: agents/models/config.py, sandboxes/config.py, flows/schema.py
JobConf, whose runner, tracking and nightly fields cover their whole group, and ServingParams for the recorded
`serving.*` params); this module only derives the flattened keys ("model.threads", "runner.") from them, and
`config_diff`, the one answer to "do two runs' configurations differ?".

Shared by the trajectory cache key (flows/cache.py), resume's config check (flows/tracking.py), sweep labels
(flows/sweep.py), the nightly report's config diff (flows/nightly.py) and the frontier's grouping (flows/frontier.py),
so a speed knob changed between two runs neither throws the cache away nor blocks a resume nor reads as a config
change. On the tiny test models these knobs leave every answer as it is (tests); on real packs the batch a row shares
moves the last bits of its fp32 lm_head and attention (and more in bf16), so reruns differ on a few tasks either way
(docs/RESULTS.md, memory): compare by paired tests.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import typing


@functools.cache
def neutral_keys() -> dict[str, str]:
    """Every result-neutral flattened key, or group prefix ending in ".", with the reason its field gives."""
    from .schema import GROUPS, NightlyJobConf, ServingParams

    out: dict[str, str] = {}
    for group, (_, records) in GROUPS.items():
        for record in records.values():
            out.update(_marked(record, f"{group}."))
    out.update(_marked(NightlyJobConf, ""))
    out.update(_marked(ServingParams, "serving."))
    return out


def _marked(record: type, prefix: str) -> dict[str, str]:
    """The neutral fields of one record (a field holding a group or a record: its whole group), and those of the
    records nested in it."""
    from .schema import GROUPS

    hints = typing.get_type_hints(record)
    out = {}
    for f in dataclasses.fields(record):
        key = prefix + f.name
        holds_group = f.name in GROUPS and not prefix or dataclasses.is_dataclass(hints.get(f.name))
        why = f.metadata.get("neutral")
        if why is not None:
            out[key + "." if holds_group else key] = why
        elif holds_group and f.name not in GROUPS:
            out.update(_marked(hints[f.name], key + "."))  # a nested record (dataset): its own neutral fields
    return out


def result_neutral(key: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a flattened config key is result-neutral (or in `extra`: keys, or prefixes ending in ".")."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in (*neutral_keys(), *extra))


def without_neutral(group: str, cfg: dict) -> dict:
    """A config group (e.g. "model") without its result-neutral keys."""
    return {k: v for k, v in cfg.items() if not result_neutral(f"{group}.{k}")}


def param_values(params: dict) -> dict[str, str]:
    """Params as strings, a whole number written one way: the typed config logs `10.0` for a float knob set as 10,
    and the same setting must not read as a knob that differs."""
    return {k: re.sub(r"^(-?\d+)\.0+$", r"\1", str(v)) for k, v in params.items()}


def config_diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The params (flattened, as runs log them) in which two runs differ in what changes answers: the one question
    resume, the nightly, a sweep's labels, the report's pairs and the frontier's configurations ask. A whole number
    written `10` or `10.0` is one value; a result-neutral setting is no difference; a knob only one run's options
    have (reflection's history_rounds against single_shot) differs where it is away from its default; the path a
    local model took (`serving.*`) is an observation, not a setting: it differs only where both runs recorded it."""
    from .schema import option_default

    a, b = param_values(a), param_values(b)

    def differs(k: str) -> bool:
        va, vb = a.get(k), b.get(k)
        if va == vb or result_neutral(k):
            return False
        if va is None or vb is None:
            there, params = (vb, b) if va is None else (va, a)
            return not k.startswith("serving.") and there != option_default(k, params)
        return True

    return sorted(k for k in set(a) | set(b) if differs(k))
