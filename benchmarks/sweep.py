"""Wall time of a budget sweep (`iters=0,1,2,3 -m`) versus `iters=3` alone, same tasks, same real model.

Round r of a trajectory does not depend on the budget, so with the trajectory cache (flows/cache.py) the
sweep should cost about one budget: target ratio <= 1.2. Also checks that every job's curve equals the
prefix of the single run's curve. Both runs start from an empty cache and a fresh MLflow store.

    .venv/bin/python benchmarks/sweep.py --model smollm2-135m --tasks 8
Writes benchmarks/results/sweep.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))



# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "The trajectory cache across a sweep over budgets (`benchmarks/sweep.py`)"
TEXT = ("One job with `iters=3` against the sweep `iters=0,1,2,3 -m` on the same tasks: with the trajectory cache the "
        "sweep costs about one job, and every budget's curve equals the single job's.")
TABLE = {"rows": ".", "columns": [["model", "model"], ["strategy", "strategy"], ["tasks", "tasks"],
                                  ["iters=3 alone s", "single_iters3_wall_s"],
                                  ["sweep iters=0,1,2,3 s", "sweep_0123_wall_s"], ["ratio", "ratio"],
                                  ["curves equal", "curves_equal"]]}


def evaluate(args: list[str], work: Path) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri=sqlite:///{work}/mlflow.db",
           f"tracking.artifacts={work}/artifacts", f"cache_dir={work}/cache", f"hydra.run.dir={work}/out",
           f"hydra.sweep.dir={work}/multirun", *args]
    env = dict(os.environ, PREFECT_HOME=str(work / "prefect"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"benchmark run failed ({' '.join(args)}):\n{p.stderr[-3000:]}")
    return wall, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--strategy", default="reflection")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/sweep-cache-<UTC>.json)")
    a = ap.parse_args()
    common = [f"model={a.model}", f"strategy={a.strategy}", f"dataset.limit={a.tasks}", f"max_new_tokens={a.max_new_tokens}"]
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        single_wall, single = evaluate(common + ["iters=3"], Path(d1))
        sweep_wall, sweep = evaluate(common + ["iters=0,1,2,3", "-m"], Path(d2))
    curve = single[0]["pass@1_by_iter"]
    exact = all(s["pass@1_by_iter"] == curve[: s["iters"] + 1] for s in sweep)
    result = {
        "model": a.model, "strategy": a.strategy, "tasks": a.tasks, "max_new_tokens": a.max_new_tokens,
        "single_iters3_wall_s": round(single_wall, 1), "sweep_0123_wall_s": round(sweep_wall, 1),
        "ratio": round(sweep_wall / single_wall, 3), "curves_equal": exact, "single_curve": curve,
        "sweep_curves": {s["iters"]: s["pass@1_by_iter"] for s in sweep},
        "completion_tokens": {"single": single[0]["completion_tokens"], "sweep": sum(s["completion_tokens"] for s in sweep)},
    }
    from flows.results import write

    out = write("sweep_cache", result, title=TITLE, text=TEXT, table=TABLE, out=a.out, config=vars(a))
    print(f"| run | wall s | curve |\n|---|---|---|\n| iters=3 | {single_wall:.1f} | {curve} |")
    print(f"| iters=0,1,2,3 -m | {sweep_wall:.1f} | {result['sweep_curves']} |")
    print(f"ratio sweep/single = {result['ratio']}  (target <= 1.2); curves equal: {exact}; results: {out}")


if __name__ == "__main__":
    main()
