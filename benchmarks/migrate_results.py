"""Bring every results file to results schema 2, once; afterwards the readers keep no code for older shapes.

    .venv/bin/python -m benchmarks.migrate_results            # rewrite the files still at schema 1
    .venv/bin/python -m benchmarks.migrate_results --check    # exit 1 if one is left

Schema 2, against what files held before it:
- `about.schema` is 2 (files that lacked an `about` block were given theirs in an earlier pass of this script,
  see its git history).
- a run's per-task outcomes are `verdicts` (task#sample -> the verdict at each budget), not `first_pass_round`,
  which held first passing rounds in the oldest files and verdict lists since.
- a run's params are as the current config writes them: knobs retired since, at the default they had, dropped;
  the local engine's internal settings (once `model.*` knobs, never answer-changing) dropped; knobs added since,
  filled in at the default that does what the older run did; the dataset's language and the local file's
  `{language}` spelling; a local model's path (`serving.*`) as it was (fixlab's engine; int8 weights where
  `weights` was auto or int8); whole numbers written one way.
- a run that kept no machine gets the one its file name or command names (`machine_source: file text`) or
  `unknown`.
Run once at the commit that added it (the tables it migrates by are the readers' of the commit before); the next
commit removes it, and flows/results.py MIGRATED names this one.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
SCHEMA = 2

# Knobs removed from the records, with the default they had, as run params wrote it. None was ever switched on, so a
# run logged before the removal that carries one at this value is the same configuration as a run without it
# (what the readers dropped until schema 2).
RETIRED = {"model.int8_fuse": "False", "strategy.diagnose": "False", "strategy.edge_case_hint": "False",
           "strategy.few_shot": "0", "strategy.show_diff": "False",
           # never varied in a full-size run: now constants beside the code that reads them
           "strategy.resample_temperature": "0.8", "strategy.temperature_step": "0.2", "strategy.temperature_max": "1.0",
           "strategy.temperatures": "[0.7, 0.5, 0.3]", "strategy.keep_task_context": "True",
           "strategy.check_signature": "True", "strategy.syntax_path": "True", "strategy.detect_repeats": "True",
           "strategy.flag_unchanged": "True", "strategy.feedback_style": "shaped", "strategy.feedback_chars": "1200",
           "strategy.compute_actual": "True", "strategy.trace_chars": "0", "strategy.stop_after_code": "True",
           "strategy.candidate_temperature": "0.8", "strategy.function_every": "4", "strategy.self_tests_pass": "0.0",
           "strategy.repeat_redraw": "True", "strategy.revise_temperature": "0.2",
           # now the local engine's own settings (serving/tuning.py EngineTuning: the product runs its
           # defaults). max_prefill_tokens: old runs carry 896 (the 1.5B pack's yaml, make eval's) or 8192 (the record's
           # default then); one value per key, so a run at 8192 keeps its param and reads as differing here, and then as
           # the same configuration only because EngineTuning marks the field neutral (flows/neutral.py)
           "model.attn_implementation": "None", "model.int8_native": "True", "model.int8_kernel": "auto",
           "model.skinny_matmul": "True", "model.sdpa_gqa": "True", "model.cpu_attention": "True",
           "model.kv_dtype": "auto", "model.gather_ms": "30.0", "model.max_prefill_tokens": "896",
           "model.heap_trim": "True", "model.draft_ngram": "3", "model.draft_step_tokens": "128",
           # one language's hub config since the six languages: dataset.language names it
           "dataset.hub_config": "python"}


# Settings added since runs were logged without them, with what those runs did; and the old spelling of a default
# that now names the language (dataset.local_fallback's {language}).
ADDED = {"dataset.language": "python"}
RESPELT = {"dataset.local_fallback": ("../shared/data/humanevalfix_python.jsonl",
                                      "../shared/data/humanevalfix_{language}.jsonl")}


def without_retired(params: dict) -> dict:
    """Run params without the retired knobs that sit at their old default (one set otherwise stays: it differs),
    with the settings added since filled in as those runs had them. Numbers compare as numbers: a reader may have
    written 1.0 as "1"."""
    out = {k: v for k, v in params.items() if k not in RETIRED or not _same(RETIRED[k], str(v))}
    if any(k.startswith("dataset.") for k in out):  # a run's params (not a bare knob table)
        for k, v in ADDED.items():
            out.setdefault(k, v)
    for k, (old, now) in RESPELT.items():
        if out.get(k) == old:
            out[k] = now
    return out


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


# Strategy knobs added after runs were recorded without them, with what those runs did (their `before` value).
BEFORE = {"strategy.answer_format": "function", "strategy.show_failure": "False", "strategy.self_inputs": "0",
          "strategy.self_check_scope": "round", "strategy.held_at_end": "hold"}
BEFORE_STRATEGIES = ("single_shot", "reflection", "portfolio")



def migrate_params(params: dict) -> dict:
    """A run's params as the current config writes them, by the back-fills the readers made until schema 2: numbers
    written one way, retired knobs at their old default dropped, knobs added since filled in as the older run did
    them (flows/schema.py and flows/analysis/records.py before this commit); then every knob of the options the run
    names that it lacks, at the config's default for them (what a knob's default does is what runs before it did)."""
    from serving.tuning import EngineTuning

    from flows.analysis.records import config_defaults

    engine = {f"model.{f.name}" for f in dataclasses.fields(EngineTuning)}
    out = without_retired({k: re.sub(r"^(-?\d+)\.0+$", r"\1", str(v)) for k, v in params.items()})
    if out.get("strategy.name") in BEFORE_STRATEGIES:
        for key, before in BEFORE.items():
            out.setdefault(key, before)
    if out.get("model.backend") == "transformers" and "serving.runtime" not in out:
        out["serving.runtime"] = "engine"
        out.setdefault("serving.weights", "int8" if out.get("model.weights") in ("auto", "int8") else "dtype")
    out = {k: v for k, v in out.items() if k not in engine}
    for k, v in config_defaults(out).items():
        out.setdefault(k, v)
    return out


def _verdicts(stored) -> list[bool]:
    if isinstance(stored, list):
        return [bool(v) for v in stored]
    return [False] * int(stored) + [True] if stored is not None else [False]


def _machine_from_text(text: str) -> str | None:
    low = text.lower()
    return "AMD EPYC" if "epyc" in low else "Intel Xeon" if "xeon" in low else None


def _run_from_counts(data: dict) -> dict:
    """The oldest full-size shape, one stopped run with its counts as text, as a run of schema 2 (no verdicts)."""
    frac = lambda t: dict(zip(("passed", "total"), (int(x) for x in t.split("/"))))  # noqa: E731
    total = data["total_tasks"]
    return {"run_id": data["run_id"], "status": "KILLED", "params": {},
            "overall": {"passed": data["passed"], "total": total},
            "by_round": [{"passed": p, "total": total} for p in data["passed_by_round"]],
            "tuning_sample_0_23": frac(data["tuning_sample_Python_0_23"]), "other_tasks": frac(data["rest_Python_24_163"]),
            "by_bug_type": {b: frac(v) for b, v in data.get("by_bug_type", {}).items()},
            "cost": {k: data[k] for k in ("prompt_tokens", "prefill_tokens", "completion_tokens", "model_calls")},
            "machine": data["machine"], "machine_source": "file text", "verdicts": None}


def migrate(name: str, data: dict) -> dict:
    out = dict(data)
    out["about"] = {**data["about"], "schema": SCHEMA}
    if "runs" not in data and "passed_by_round" in data:
        out["runs"] = [_run_from_counts(data)]
    elif isinstance(data.get("runs"), list) and all(isinstance(r, dict) and "params" in r for r in data["runs"]):
        guess = _machine_from_text(f"{name} {data.get('command', '')}")
        runs = []
        for r in data["runs"]:
            r = dict(r)
            r["params"] = migrate_params(r["params"])
            if "first_pass_round" in r:
                stored = r.pop("first_pass_round")
                r["verdicts"] = {t: _verdicts(v) for t, v in stored.items()} if stored else None
            if not r.get("machine"):
                r["machine"], r["machine_source"] = (f"{guess} (file text)", "file text") if guess else \
                    ("unknown", "unknown")
            runs.append(r)
        out["runs"] = runs
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a file is still at an older schema")
    args = ap.parse_args()
    old = []
    for p in sorted(RESULTS.glob("*.json")):
        data = json.loads(p.read_text())
        if data.get("about", {}).get("schema") == SCHEMA:
            continue
        old.append(p.name)
        if not args.check:
            p.write_text(json.dumps(migrate(p.name, data), indent=1) + "\n")
    print(f"{len(old)} file(s) {'at an older schema' if args.check else 'migrated to schema 2'}")
    return 1 if args.check and old else 0


if __name__ == "__main__":
    sys.exit(main())
