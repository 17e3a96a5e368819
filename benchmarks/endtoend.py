"""End-to-end speed of the default job: the real 1.5B pack, the default strategy, 30 fixed tasks outside the
tuning sample (Python/0-23), one configuration per row, run one after another on a quiet machine.

Each row is a real `python -m flows.evaluate` with an empty trajectory cache and its own MLflow store, so rows
never share work. For each row: tasks/min, wall time, prompt tokens sent and actually prefilled, completion
tokens and completion tokens/s of wall time, answers cut at max_new_tokens, drafts accepted, and pass@1.

    .venv/bin/python benchmarks/endtoend.py                      # every row on all 30 tasks
    .venv/bin/python benchmarks/endtoend.py --rows llamacpp,llamacpp+ngram --tasks 10
    .venv/bin/python benchmarks/endtoend.py --strategy react --rows llamacpp

Writes benchmarks/results/endtoend-<strategy>-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.results import write  # noqa: E402
# Every 5th task from Python/25, plus the last two: 30 tasks, none from the tuning sample Python/0-23.
TASKS = [f"Python/{i}" for i in range(25, 164, 5)] + ["Python/162", "Python/163"]
# Rows that turned the stop at the closing fence off (engine-today, engine+reuse, engine+bf16, engine+int8,
# llamacpp-stock) went with the knob (#51: the stop is always on); their results files still read.
# Rows that set the engine's own settings through model knobs (engine-eager-kv32, engine-drafts-below-8-rows) went when
# those became serving/tuning.py EngineTuning (#51); their results files still read.
ROWS = {
    # fixlab's transformers engine without the later speed work: float32 weights, no prefix reuse
    "engine+stop": ["model=qwen1.5b-coder-q4", "model.dtype=float32", "model.weights=dtype", "model.prefix_cache_mib=0"],
    # everything on: the config's defaults (int8 matmuls, prefix reuse, stop at the closing fence)
    "engine": ["model=qwen1.5b-coder-q4"],
    # llama.cpp on the same GGUF with fixlab's settings
    "llamacpp": ["model=qwen1.5b-coder-q4-llamacpp"],
    "llamacpp+ngram": ["model=qwen1.5b-coder-q4-llamacpp", "model.speculative=ngram"],
}


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "End to end on fixed tasks outside the tuning sample (`benchmarks/endtoend.py`)"
TEXT = "Each row is a real job from a cold start with its own store and no trajectory cache."
TABLE = {"rows": "rows", "columns": [["strategy", "$.strategy"], ["iters", "$.iters"], ["backend", "row"],
                                     ["tasks", "tasks"], ["wall s", "wall_s"], ["tasks/min", "tasks_per_min"],
                                     ["passed", "passed"], ["tokens sent", "prompt_tokens"],
                                     ["prefilled", "prefill_tokens"], ["completion", "completion_tokens"],
                                     ["completion tokens/s", "completion_tok_per_s"],
                                     ["finished (stopped)", "tasks_finished"],
                                     ["passed of finished", "passed_of_finished"], ["note", "error"]]}


def run_row(name: str, overrides: list[str], tasks: list[str], strategy: str, work: Path,
            timeout_s: float | None = None, iters: int = 3) -> dict:
    ids = "[" + ",".join(f"'{t}'" for t in tasks) + "]"
    cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri=sqlite:///{work}/mlflow.db",
           f"tracking.artifacts={work}/artifacts", f"cache_dir={work}/cache", f"hydra.run.dir={work}/out",
           f"strategy={strategy}", f"iters={iters}", f"dataset.task_ids={ids}", "cache=false", *overrides]
    env = dict(os.environ, PREFECT_HOME=str(work / "prefect"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # the job stops in seconds and marks its run KILLED
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        return partial_row(name, overrides, work, time.perf_counter() - t0, len(tasks))
    wall = time.perf_counter() - t0
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"row": name, "error": (stderr.strip().splitlines() or ["no output"])[-1][:300]}
    s = lines[-1]
    return {
        "row": name, "overrides": overrides, "tasks": s["total"], "wall_s": round(wall, 1),
        "tasks_per_min": round(s["total"] / wall * 60, 3), "pass@1": s["pass@1"], "passed": s["passed"],
        "pass@1_ci95": s.get("pass@1_ci95"), "pass@1_by_iter": s["pass@1_by_iter"],
        "prompt_tokens": s["prompt_tokens"], "prefill_tokens": s.get("prefill_tokens"),
        "completion_tokens": s["completion_tokens"],
        "completion_tok_per_s": round(s["completion_tokens"] / wall, 2), "length_stops": s.get("length_stops"),
        "model_calls": s.get("model_calls"), "draft_tokens": s.get("draft_tokens"),
        "draft_accepted": s.get("draft_accepted"), "errors": s["errors"],
    }


def partial_row(name: str, overrides: list[str], work: Path, wall: float, total: int) -> dict:
    """A row stopped at its time limit: what the tasks that finished cost and scored (not a pass@1 of all)."""
    done = [json.loads(f.read_text()) for f in work.glob("state/*/tasks/*.json")]
    return {"row": name, "overrides": overrides, "stopped_at_s": round(wall, 1), "tasks_finished": len(done),
            "tasks": total, "passed_of_finished": sum(bool(t.get("passed")) for t in done),
            "prompt_tokens": sum(t.get("prompt_tokens", 0) for t in done),
            "prefill_tokens": sum(t.get("prefill_tokens") or 0 for t in done),
            "completion_tokens": sum(t.get("completion_tokens", 0) for t in done),
            "error": f"stopped at the time limit ({wall:.0f} s) with {len(done)} of {total} tasks finished"}


def table(rows: list[dict]) -> str:
    head = "| row | tasks | wall s | tasks/min | prompt sent / prefilled | completion (tok/s) | cut at max | pass@1 |"
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['row']} | failed: {r['error']} |||||||")
            continue
        out.append(f"| {r['row']} | {r['tasks']} | {r['wall_s']:.0f} | {r['tasks_per_min']:.2f} | "
                   f"{r['prompt_tokens']} / {r['prefill_tokens']} | {r['completion_tokens']} "
                   f"({r['completion_tok_per_s']:.1f}) | {r['length_stops']} | {r['pass@1']:.3f} ({r['passed']}) |")
    return "\n".join(out)


def machine() -> dict:
    """What the rows ran on: bf16 instructions decide the engine's dtype (auto), so they belong with the figures."""
    from serving.hf import cpu_has_native_bf16
    from serving.machine import describe

    return describe(native_bf16=cpu_has_native_bf16(), platform=platform.platform())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from: {', '.join(ROWS)}")
    ap.add_argument("--tasks", type=int, default=len(TASKS), help="the first N of the 30 fixed tasks")
    ap.add_argument("--strategy", default="reflection")
    ap.add_argument("--iters", type=int, default=3, help="feedback rounds (0: round 0 only, the plainest comparison)")
    ap.add_argument("--row-timeout-min", type=float, default=None,
                    help="stop a row after this long (SIGTERM) and record the tasks it finished")
    args = ap.parse_args()
    names = [r for r in args.rows.split(",") if r]
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        sys.exit(f"error: unknown row(s) {', '.join(unknown)}: use {', '.join(ROWS)}")
    tasks = TASKS[: max(1, min(args.tasks, len(TASKS)))]
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="fixlab-e2e-") as work:
            rows.append(run_row(name, ROWS[name], tasks, args.strategy, Path(work),
                                None if args.row_timeout_min is None else args.row_timeout_min * 60, args.iters))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    out = write("endtoend", {"strategy": args.strategy, "iters": args.iters, "task_ids": tasks, "rows": rows},
                title=TITLE, text=TEXT, table=TABLE, note=args.strategy, config=vars(args), machine=machine())
    print(table(rows))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
