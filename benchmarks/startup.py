"""How long a job takes to start: from its command to its model built, and to its flow's beginning (the first task
submitted), for this tree and another checkout (`--vs DIR`: a git worktree at an earlier commit), taking turns so
that drift in the machine falls on both. Each job is make eval's (the defaults, or the overrides given) on a fresh
MLflow store and its own temporary Prefect server, stopped with SIGTERM once its flow begins: only the start is timed.
One untimed job a tree first (the Prefect database's migrations, the page cache).

    .venv/bin/python benchmarks/startup.py [--runs 3] [--vs DIR] [--vs-python PY] [OVERRIDE ...]

`--vs-python`: the interpreter of the second tree's jobs (another venv: its packages, its bytecode); with it, `--vs`
may be this tree, so that only the venv differs.

Writes benchmarks/results/startup-<UTC time>.json and prints the table.
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

TITLE = "A job's start: its model built, its flow begun (`benchmarks/startup.py`)"
TEXT = ("Seconds from `python -m flows.evaluate` to the line saying the model is loaded (imports, the model's build) "
        "and to Prefect's 'Beginning flow run' (the MLflow run, the Prefect server, the flow), median over the runs "
        "(min-max beside it), for each tree in turn; the job is stopped with SIGTERM there.")
TABLE = {"rows": "rows", "columns": [["tree", "tree"], ["commit", "commit"], ["runs", "runs"],
                                    ["model built s", "model_s"], ["model range", "model_range"],
                                    ["flow begun s", "flow_s"], ["flow range", "flow_range"]]}


def one_start(tree: Path, work: Path, overrides: list[str], python: str = sys.executable) -> tuple[float, float]:
    """(seconds to the model's line, seconds to the flow's line) of one job in `tree`, then stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(work.parent / "prefect"), PYTHONUNBUFFERED="1")
    cmd = [python, "-m", "flows.evaluate", "cache=false", f"tracking.uri=sqlite:///{work}/mlflow.db",
           f"tracking.artifacts={work}/artifacts", f"hydra.run.dir={work}/outputs", f"tracking.results={work}/results",
           *overrides]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    model = flow = None
    tail = []
    for line in proc.stderr:
        tail = (tail + [line])[-20:]
        if model is None and "loaded model" in line:
            model = time.perf_counter() - t0
        if "Beginning flow run" in line:
            flow = time.perf_counter() - t0
            break
    proc.send_signal(signal.SIGTERM)
    proc.stderr.close()
    proc.wait(120)
    if model is None or flow is None:
        raise SystemExit(f"error: the job in {tree} ended before its flow began:\n{''.join(tail)}")
    return model, flow


def commit(tree: Path) -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return p.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="timed jobs a tree")
    ap.add_argument("--vs", default=None, help="another checkout to time in turn (a git worktree)")
    ap.add_argument("--vs-python", default=sys.executable, help="the interpreter of the --vs tree's jobs")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="the job's overrides (default: make eval's job)")
    args = ap.parse_args()
    trees = [REPO] + ([Path(args.vs).resolve()] if args.vs else [])
    pythons = [sys.executable, args.vs_python]
    times: dict[int, list[tuple[float, float]]] = {j: [] for j in range(len(trees))}
    with tempfile.TemporaryDirectory(prefix="fixlab-startup-") as tmp:
        for i in range(-1, args.runs):  # -1: the untimed first job of each tree
            for j, tree in enumerate(trees):
                work = Path(tmp) / f"job-{j}-{i + 1}"
                m, f = one_start(tree, work, args.overrides, pythons[j])
                print(f"{tree} run {i + 1}: model {m:.1f} s, flow {f:.1f} s" + (" (untimed)" if i < 0 else ""))
                if i >= 0:
                    times[j].append((m, f))
    rows = []
    for j, tree in enumerate(trees):
        ms, fs = sorted(m for m, _ in times[j]), sorted(f for _, f in times[j])
        rows.append({"tree": "this" if j == 0 else "vs", "commit": commit(tree), "python": pythons[j], "runs": len(ms),
                     "model_s": round(ms[len(ms) // 2], 1), "model_range": f"{ms[0]:.1f}-{ms[-1]:.1f}",
                     "flow_s": round(fs[len(fs) // 2], 1), "flow_range": f"{fs[0]:.1f}-{fs[-1]:.1f}"})
    dest = write("startup", {"rows": rows}, title=TITLE, text=TEXT, table=TABLE, out=args.out,
                 config={**vars(args), "trees": [str(t) for t in trees]},
                 machine=describe(load_avg_start=os.getloadavg()))
    for r in rows:
        print(r)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
