"""Result-neutral settings: where a job runs and how fast, never what it answers. Each one says so on its own field
in the config records (`metadata={"neutral": why}`: agents/models/config.py, sandboxes/config.py, flows/schema.py
JobConf, whose runner, tracking and nightly fields cover their whole group, and ServingParams for the recorded
`serving.*` params); this module only derives the flattened keys ("model.threads", "runner.") from them. The local
engine's internal settings (serving EngineTuning) were once `model.*` knobs: their marks still apply to
the params of runs logged then (a run at max_prefill_tokens 8192 is the same configuration as one at 896).

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
import typing


@functools.cache
def neutral_keys() -> dict[str, str]:
    """Every result-neutral flattened key, or group prefix ending in ".", with the reason its field gives."""
    from serving import EngineTuning

    from .schema import GROUPS, NightlyJobConf, ServingParams

    out: dict[str, str] = {}
    for group, (_, records) in GROUPS.items():
        for record in records.values():
            out.update(_marked(record, f"{group}."))
    out.update(_marked(NightlyJobConf, ""))
    out.update(_marked(ServingParams, "serving."))
    out.update(_marked(EngineTuning, "model."))  # as runs logged them while they were model knobs (schema.py RETIRED)
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


def config_diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The params (flattened, as runs log them) in which two runs differ in what changes answers: the one question
    resume, the nightly, a sweep's labels, the report's pairs and the run records ask. No difference: a result-neutral
    setting; a knob retired since a run, at the default it had; a knob one run predates where the other has it at its
    default; a local model's path (`serving.*`), which runs from before paths were recorded lack."""
    from .schema import knob_default, without_retired

    a, b = without_retired(a), without_retired(b)

    def same(k: str) -> bool:
        va, vb = a.get(k), b.get(k)
        if va == vb:
            return True
        absent, there, params = (va, vb, b) if va is None else (vb, va, a) if vb is None else (1, None, None)
        return absent is None and (there == knob_default(k, params) or k.startswith("serving."))

    return sorted(k for k in set(a) | set(b) if not result_neutral(k) and not same(k))
