"""Give every results file written before flows/results.py its `about` block, once, from what it already holds.

    .venv/bin/python -m benchmarks.migrate_results            # fill in the files that lack the block
    .venv/bin/python -m benchmarks.migrate_results --check    # exit 1 if a file still lacks it

What each field comes from:
- kind: the file name's prefix (`fullsize` for the full-size recorder's files); utc: the stamp in the name, else the
  file's own time field, else the commit that added it; commit: the commit that added the file (`commit_is`
  says so: the tree that measured was that commit's parent or a working tree beside it).
- machine: the file's own machine block (`machine` or `meta`). Full-size files recorded none: theirs, their labels,
  notes and the sweeps a file holds are what flows/report.py's registry said of them at REPORT_REV (read from git,
  where that registry was the only record), as are each speed table's title and text (the registry's renderers at
  that commit); each table's columns are its script's TABLE.
- config: what the file says its figures depend on (a memory job's arguments, with the 1.5B pack's defaults of the
  day it ran, from the history the registry kept; a profile's model settings).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
REPORT_REV = "4fe5fc6"  # the last commit whose flows/report.py held the hand registry

# The script behind each kind: its TABLE (where the records are, the wildcards' headings, the columns) is the one its
# new files carry, so old and new files of a kind draw the same table.
SCRIPTS = {"weights": "weights", "endtoend": "endtoend", "generation": "generation", "generation_gpu": "generation",
           "sandbox": "sandbox", "decode_profile": "decode_profile", "attention": "attention",
           "int8_matmul": "int8_matmul", "memory": "memory", "paths": "paths", "drafts": "drafts",
           "forward": "forward", "sweep_cache": "sweep"}
RENDERERS = {"weights": "speed_weights", "endtoend": "speed_endtoend", "generation": "speed_generation",
             "sandbox": "speed_sandbox", "decode_profile": "speed_decode_profile", "attention": "speed_attention",
             "int8_matmul": "speed_int8_matmul", "memory": "speed_memory", "paths": "speed_paths",
             "drafts": "speed_drafts", "forward": "speed_forward"}
OTHER_TEXT = {
    "generation_gpu": ("On a GPU: fixlab's engine, `generate` and transformers' continuous batching "
                       "(`benchmarks/gpu_check.sh`)",
                       "The Qwen2.5-Coder-1.5B architecture with random weights, every request the same number of new "
                       "tokens (no EOS, so padded `generate` wastes no slots here as it would on real answers). Greedy "
                       "answers are compared with one-at-a-time `generate` on the first prompts: in bf16 random weights "
                       "give near-ties that batched kernels flip, so float32 is the exactness check."),
    "sweep_cache": ("The trajectory cache across a sweep over budgets (`benchmarks/sweep.py`)",
                    "One job with `iters=3` against the sweep `iters=0,1,2,3 -m` on the same tasks: with the trajectory "
                    "cache the sweep costs about one job, and every budget's curve equals the single job's."),
}


def old_report():
    """flows/report.py as it stood at REPORT_REV, loaded as a module of the flows package."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{REPORT_REV}:flows/report.py"], check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("flows._report_at_rev", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "flows"
    mod.__file__ = str(REPO / "flows" / "report.py")
    sys.modules[spec.name] = mod
    exec(compile(source, f"{REPORT_REV}:flows/report.py", "exec"), mod.__dict__)
    return mod


def added_by(name: str) -> tuple[str, str]:
    """(commit, its UTC stamp) of the commit that added benchmarks/results/NAME."""
    out = subprocess.run(["git", "-C", str(REPO), "log", "--diff-filter=A", "--format=%H %ct", "--",
                          f"benchmarks/results/{name}"], capture_output=True, text=True).stdout.split()
    if len(out) < 2:
        return "", ""
    import time
    return out[-2], time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(int(out[-1])))


def utc_of(name: str, data: dict, fallback: str) -> str:
    m = re.search(r"(\d{8})T(\d{6})Z", name) or re.search(r"(\d{8})-(\d{6})", name)
    if m:
        return f"{m.group(1)}T{m.group(2)}Z"
    for v in (data.get("time_utc"), data.get("utc"), data.get("recorded"), (data.get("meta") or {}).get("time")):
        if isinstance(v, str) and re.match(r"\d{4}-?\d\d-?\d\d", v):
            digits = re.sub(r"[^0-9]", "", v)[:14].ljust(14, "0")
            return f"{digits[:8]}T{digits[8:]}Z"
    m = re.search(r"(\d{8})", name)
    return fallback if not m or fallback.startswith(m.group(1)) else f"{m.group(1)}T000000Z"


def speed_words(old, kind: str) -> tuple[str, str]:
    """The title and text the old renderer printed above its table (its registry emptied, so only those remain)."""
    if kind in OTHER_TEXT:
        return OTHER_TEXT[kind]
    registry, old.SPEED = old.SPEED, []
    try:
        lines = getattr(old, RENDERERS[kind])(RESULTS)
    finally:
        old.SPEED = registry
    return lines[0].lstrip("# ").strip(), lines[2]


def table_of(kind: str, data: dict) -> dict:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import each other by module name
    script = importlib.import_module(SCRIPTS[kind])
    t = json.loads(json.dumps(script.TABLE))
    if kind == "weights":
        t["columns"] += script.batch_columns(data["rows"])
    if kind == "paths":
        t["columns"] += script.width_columns(data["modes"])
    return t


def machine_of(data: dict) -> dict:
    m = data.get("machine") or data.get("meta") or {}
    if isinstance(m, str):
        return {"cpu": m}
    if "modes" in data:  # paths: a machine block per mode; the native one is the machine's own
        return data["modes"].get("native", {}).get("machine", {})
    return {k: v for k, v in m.items() if k in ("cpu", "cpus", "cores", "threads", "cpu_family", "cpu_flags", "arch",
                                               "forced", "avx512_vnni", "native_bf16", "gpu", "torch", "python",
                                               "platform", "mem_total_gib", "transformers")}


def memory_config(old, data: dict) -> dict:
    """The job's overrides with the 1.5B pack's defaults of the day (the registry's history of them)."""
    args = [a for a in data.get("job_args", []) if not a.startswith(("tracking.", "hydra.", "cache="))]
    cfg = dict(a.split("=", 1) for a in args if "=" in a)
    for key, (history, today) in old.CHANGED_DEFAULTS.items():
        if key not in cfg:
            cfg[key] = next((v for until, v in history if data.get("utc", "") < until), today)
    return cfg


def migrate(name: str, data: dict, old) -> dict:
    commit, added = added_by(name)
    sweeps = [(k, s) for k, s in old.SWEEPS.items() if s.file == name]
    kind = next((k for k, f in old.SPEED if f == name), None)
    if sweeps or name in old.HARNESS:
        kind = "fullsize"
    if kind is None:
        raise SystemExit(f"migrate_results: {name} is in no table of flows/report.py at {REPORT_REV}: give it an "
                         "`about` block by hand")
    block = {"kind": kind, "utc": utc_of(name, data, added), "commit": commit, "dirty": False,
             "commit_is": "the commit that added the file (recorded before results files named their tree)",
             "machine": machine_of(data), "config": {}, "command": data.get("command", "")}
    if kind == "fullsize":
        name0 = sweeps[0][1].machine if sweeps else "EPYC"
        block["machine"] = {"name": name0, "cpu": old.MACHINES[name0]}
        block["title"] = (sweeps[0][1].label if len(sweeps) == 1 else "full-size runs") if sweeps else \
            "the oracle doubles through a sandbox backend on every task"
        block["text"] = ""
        block["sweeps"] = [{k: v for k, v in (("select", {**({"strategy.name": s.strategy} if s.strategy else {}),
                                                        **({"strategy.candidates": s.candidates} if s.candidates
                                                           else {})}),
                                              ("label", s.label), ("wall_note", s.no_wall), ("change", s.change),
                                              ("machine", s.machine)) if v or k == "select"} for _, s in sweeps]
        return block
    block["title"], block["text"] = speed_words(old, kind)
    block["table"] = table_of(kind, data)
    if kind == "memory":
        block["config"] = memory_config(old, data)
    if kind == "decode_profile":
        block["config"] = {f"model.{k}": v for k, v in (data.get("model") or {}).items() if k not in old.PROFILE_FIXED}
    return block


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file lacks its about block")
    args = ap.parse_args(argv)
    lacking = [p for p in sorted(RESULTS.glob("*.json")) if "about" not in json.loads(p.read_text())]
    if args.check:
        for p in lacking:
            print(f"migrate_results: {p.name} has no about block", file=sys.stderr)
        return 1 if lacking else 0
    old = old_report() if lacking else None
    for p in lacking:
        data = json.loads(p.read_text())
        p.write_text(json.dumps({"about": migrate(p.name, data, old), **data}, indent=1) + "\n")
        print(f"migrate_results: {p.name}: {data and 'about block added'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
