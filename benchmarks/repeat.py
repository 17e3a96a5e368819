"""Does make eval's job repeat its own readings? Its config on the first N tasks, run as separate jobs with
`cache=false` and a store of their own each: twice as it is, once with `model.max_batch=4`; every attempt's code,
verdict and token count compared task by task. With `--before DIR` (a checkout of an older commit, sharing this
.venv) the same runs there first, each job's time side by side (one job at a time, alone on the machine), and the
default job's answers before against after (`across`: did the change move any answer?).

    python -m benchmarks.repeat --tasks 30 [--before /tmp/before] [--save]

Writes benchmarks/results/repeat-<time>.json with --save: per checkout, the pairs' identical answer sequences,
identical first answers, differing verdicts and passes; each job's wall time and its model's seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the data file this checkout reads, passed to an older checkout elsewhere too (it finds ../shared/data by its place)
_LOCAL = REPO.parent / "shared" / "data" / "humanevalfix_python.jsonl"
DATA = [f"dataset.path={_LOCAL}"] if _LOCAL.exists() else []


def run_job(repo: Path, tasks: int, extra: list[str], work: Path) -> dict:
    """One job in its own store; returns its JSON summary line plus every trajectory's attempts."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cmd = [sys.executable, "-m", "flows.evaluate", f"dataset.limit={tasks}", "cache=false",
           f"tracking.uri=sqlite:///{work}/mlflow.db", f"tracking.artifacts={work}/artifacts",
           f"hydra.run.dir={work}/outputs", *DATA, *extra]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"job failed in {repo} ({' '.join(extra) or 'default'}): {p.stderr[-1500:]}")
    summary = json.loads(next(line for line in reversed(p.stdout.splitlines()) if line.startswith("{")))
    path_line = next((line for line in p.stderr.splitlines() if "path:" in line), "")
    trajs = {}
    for f in sorted((work / "state").glob("*/tasks/*.json")):
        t = json.loads(f.read_text())
        trajs[t["task_id"]] = [{"code": a.get("code"), "passed": (a.get("result") or {}).get("passed"),
                                "tokens": sum(c.get("completion_tokens") or 0 for c in a.get("calls", []))}
                               for a in t.get("attempts", [])]
    return {"summary": {k: summary.get(k) for k in ("pass@1", "passed", "total", "wall_s", "run_id")},
            "path": path_line.strip(), "trajectories": trajs}


def pair(a: dict, b: dict) -> dict:
    ta, tb = a["trajectories"], b["trajectories"]
    ids = sorted(set(ta) & set(tb))
    same = sum(ta[i] == tb[i] for i in ids)
    first = sum(bool(ta[i]) and bool(tb[i]) and ta[i][0]["code"] == tb[i][0]["code"] for i in ids)
    verdict = lambda t: any(bool(x["passed"]) for x in t)  # noqa: E731
    return {"tasks": len(ids), "identical_sequences": same, "identical_first": first,
            "verdicts_differ": sum(verdict(ta[i]) != verdict(tb[i]) for i in ids),
            "passed": [a["summary"]["passed"], b["summary"]["passed"]],
            "differing_tasks": [i for i in ids if ta[i] != tb[i]]}


JOBS = {"default": [], "again": [], "max_batch=4": ["model.max_batch=4"]}


def checkout(repo: Path, tasks: int, work: Path, label: str, time_tasks: int = 0, only: tuple = tuple(JOBS)) -> dict:
    print(f"{label}: warming the path cache (one task)", file=sys.stderr, flush=True)
    run_job(repo, 1, [], work / "warm")
    runs = {}
    jobs = [(name, tasks, extra) for name, extra in JOBS.items() if name in only]
    if time_tasks:
        jobs.append((f"{time_tasks} tasks", time_tasks, []))
    for name, n, extra in jobs:
        runs[name] = run_job(repo, n, extra, work / name.replace("=", "-").replace(" ", "-"))
        s = runs[name]["summary"]
        print(f"{label} {name}: {s['passed']}/{s['total']} in {s['wall_s']:.0f} s", file=sys.stderr, flush=True)
    return {"runs": {k: {"summary": v["summary"], "path": v["path"]} for k, v in runs.items()},
            "_default": runs["default"],  # compared with the other checkout's, then dropped
            "pairs": {what: pair(runs["default"], runs[other]) for what, other in
                      (("same config, run again", "again"), ("default vs model.max_batch=4", "max_batch=4"))
                      if other in runs}}


TABLE = {"rows": "rows", "columns": [["checkout", "checkout"], ["commit", "commit"], ["what", "what"],
                                     ["identical answer sequences", "identical_sequences"],
                                     ["identical first answers", "identical_first"],
                                     ["verdicts that differ", "verdicts_differ"], ["of tasks", "tasks"],
                                     ["passed", "passed"], ["job wall s", "wall_s"], ["after / before", "ratio"]]}


def rows_of(out: dict) -> list[dict]:
    """The results table: each checkout's pairs, then each job's time (side by side where both ran)."""
    rows = []
    for side, d in out.items():
        if not isinstance(d, dict) or "pairs" not in d:
            continue
        commit = (d.get("commit") or "")[:8] or "this tree"
        for name, p in d["pairs"].items():
            rows.append({"checkout": side, "commit": commit, "what": name,
                         **{k: p[k] for k in ("identical_sequences", "identical_first", "verdicts_differ", "tasks",
                                              "passed")}})
    for name in out.get("after", {}).get("runs", {}):
        for side in ("before", "after"):
            if side in out:
                r = {"checkout": side, "what": f"job: {name}", "wall_s": out[side]["runs"][name]["summary"]["wall_s"]}
                if side == "after" and "before" in out:
                    r["ratio"] = round(r["wall_s"] / out["before"]["runs"][name]["summary"]["wall_s"], 3)
                rows.append(r)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--time-tasks", type=int, default=0, help="one more job per checkout on this many tasks, timed")
    ap.add_argument("--before", default=None, help="a checkout of an older commit to run first, side by side")
    ap.add_argument("--jobs", default=",".join(JOBS),
                    help=f"which jobs each checkout runs, of {', '.join(JOBS)} (default among them, always)")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--rewrite", default=None, help="a results file of this script: write its table again")
    a = ap.parse_args()
    if a.rewrite:
        d = json.loads(Path(a.rewrite).read_text())
        d["rows"] = rows_of(d)
        d["about"]["table"] = TABLE
        Path(a.rewrite).write_text(json.dumps(d, indent=1) + "\n")
        return
    only = tuple({"default", *a.jobs.split(",")})
    if set(only) - set(JOBS):
        raise SystemExit(f"--jobs {a.jobs}: use some of {', '.join(JOBS)}")
    work = Path(tempfile.mkdtemp(prefix="fixlab-repeat-"))
    out = {}
    if a.before:
        out["before"] = checkout(Path(a.before).resolve(), a.tasks, work / "before", "before", a.time_tasks,
                                 only)
        out["before"]["commit"] = subprocess.run(["git", "-C", a.before, "rev-parse", "HEAD"], capture_output=True,
                                                 text=True).stdout.strip()
    out["after"] = checkout(REPO, a.tasks, work / "after", "after", a.time_tasks, only)
    if "before" in out:  # the same job on both checkouts: did the change move any answer?
        out["across"] = {"commit": out["before"]["commit"], "pairs": {
            "make eval's job, before vs after": pair(out["before"]["_default"], out["after"]["_default"])}}
    for d in out.values():
        d.pop("_default", None)
    for side, d in out.items():
        for name, p in d["pairs"].items():
            print(f"{side:6s} {name:30s} identical sequences {p['identical_sequences']}/{p['tasks']}, first answers "
                  f"{p['identical_first']}/{p['tasks']}, verdicts differ {p['verdicts_differ']}, passed {p['passed']}")
    if "before" in out:
        for name in out["after"]["runs"]:
            b, f = out["before"]["runs"][name]["summary"]["wall_s"], out["after"]["runs"][name]["summary"]["wall_s"]
            print(f"wall {name:12s} before {b:.0f} s, after {f:.0f} s: {f / b:.3f}x")
    shutil.rmtree(work, ignore_errors=True)
    if a.save:
        sys.path.insert(0, str(REPO))
        from flows.results import write

        out["rows"] = rows_of(out)
        print(write("repeat", out, config=vars(a), table=TABLE, title="make eval's job, run again and at another batch limit",
                    text=__doc__.split("\n\n")[1].replace("\n", " ")))


if __name__ == "__main__":
    main()
