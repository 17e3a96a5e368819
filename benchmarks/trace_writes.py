"""What one task's MLflow trace costs a job, side by side in one run: `flows.traces.log_trace` with a trace's spans in
one transaction (the job's way) against MLflow's own export (a transaction a span), on a fresh SQLite store, then
RunTracker's read-back of each trace. The trajectories are made here (rounds of a model call and a sandbox run, with
prompts and answers the size of make eval's), so the run needs no data and no model. The two ways alternate per
trace, so drift in the machine falls on both.

    .venv/bin/python benchmarks/trace_writes.py [--traces 30] [--rounds 1,4]

Writes benchmarks/results/trace-writes-<UTC time>.json and prints the table.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serving.machine import describe  # noqa: E402
from flows import traces  # noqa: E402
from flows.results import write  # noqa: E402
from flows.tracking_store import open_client  # noqa: E402

TITLE = "One task's MLflow trace: spans in one transaction against one a span (`benchmarks/trace_writes.py`)"
TEXT = ("Milliseconds to log one task's trace (a span for the task, each round, each model call and sandbox run) on a "
        "fresh SQLite store, the job's way (`traces._SpansInOneWrite`: the spans in one transaction just before the "
        "trace) and MLflow's own (each span in a transaction of its own as it ends), alternating trace by trace; then "
        "reading each back as RunTracker does. `same rows` says whether one trajectory logged both ways left the same "
        "rows in every trace table (the trace id aside).")
TABLE = {"rows": "rows", "columns": [["rounds", "rounds"], ["spans a trace", "spans"], ["traces each way", "traces"],
                                    ["one transaction ms", "one_write_ms"], ["a transaction a span ms", "per_span_ms"],
                                    ["speed-up", "speedup"], ["read back ms", "read_back_ms"], ["same rows", "same_rows"]]}


def trajectory(i: int, rounds: int) -> dict:
    """A failed task's trajectory of `rounds` rounds, each a model call and a sandbox run, at make eval's sizes."""
    prompt = "def candidate(numbers, threshold):\n" + "    x = [n for n in numbers if n > threshold]\n" * 30
    attempts = [{"round": r, "decision": "tested", "seconds": 4.0, "code": prompt, "feedback": "AssertionError" * 20,
                 "calls": [{"messages": [{"role": "system", "content": "You repair Python code." * 10},
                                         {"role": "user", "content": prompt}],
                            "output": "```python\n" + prompt + "```", "prompt_tokens": 1100, "completion_tokens": 270,
                            "temperature": 0.0 if r == 0 else 0.8, "seed": r, "seconds": 3.5}],
                 "result": {"status": "failed", "exit_code": 1, "duration_s": 0.4, "backend": "local",
                            "failing_line": "assert candidate([1.0, 2.0], 0.5) == False", "error_type": "AssertionError",
                            "stdout": "", "stderr": "Traceback (most recent call last):\n" * 8}}
                for r in range(rounds)]
    return {"task_id": f"Python/{i}", "sample": 0, "bug_type": "value misuse", "strategy": "single_shot",
            "budget": rounds - 1, "seconds": 4.0 * rounds, "passed_round": None, "attempts": attempts,
            "prompt_tokens": 1100 * rounds, "completion_tokens": 270 * rounds}


@contextlib.contextmanager
def _per_span():
    yield


# Columns that name a trace or span (random ids) or count the writes to a trace's row (db_payload_generation: 14
# writes a span at a time, 2 in one transaction): the rest must be equal.
IDS = ("request_id", "trace_id", "span_id", "parent_span_id", "db_payload_generation")


def rows_of(db: Path, tid: str) -> str:
    """Every row a trace left in the store's trace tables, its ids taken out (spans' JSON content too)."""
    import json
    import sqlite3

    c = sqlite3.connect(db)
    out = []
    for table, key in (("trace_info", "request_id"), ("trace_request_metadata", "request_id"),
                       ("trace_tags", "request_id"), ("trace_metrics", "request_id"), ("spans", "trace_id")):
        cols = [r[1] for r in c.execute(f"pragma table_info({table})") if r[1] not in IDS]
        rows = c.execute(f"select {', '.join(cols)} from {table} where {key} = ?", (tid,)).fetchall()
        if "content" in cols:
            at = cols.index("content")
            rows = [r[:at] + (json.dumps({k: v for k, v in json.loads(r[at]).items() if k not in IDS},
                                         sort_keys=True),) + r[at + 1:] for r in rows]
        out.append(sorted(rows))
    c.close()
    return json.dumps(out, default=str).replace(tid, "T")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=30, help="traces logged each way")
    ap.add_argument("--rounds", default="1,4", help="rounds a trajectory, one row each (make eval's: 1 to 4)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import mlflow

    tmp = Path(tempfile.mkdtemp(prefix="fixlab-trace-writes-"))
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = open_client(uri)
    mlflow.set_tracking_uri(uri)  # the trace exporter writes to the process's tracking URI, as in a job
    exp = client.create_experiment("trace-writes", artifact_location=str(tmp / "artifacts"))
    run = client.create_run(exp).info.run_id
    try:
        rows = [measure(client, exp, run, tmp, args.traces, int(r)) for r in args.rounds.split(",")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    dest = write("trace-writes", {"rows": rows}, title=TITLE, text=TEXT, table=TABLE, out=args.out,
                 config=vars(args), machine=describe(threads=1, load_avg_start=os.getloadavg()))
    print(f"wrote {dest}")


def measure(client, exp: str, run: str, tmp: Path, n: int, rounds: int) -> dict:
    one_write = traces._spans_in_one_write
    ways = {"one": one_write, "per_span": _per_span}
    ms = {k: [] for k in ways}
    read = []
    spans = 0
    traces.log_trace(client, exp, run, trajectory(0, rounds))  # warm: the tracer and the store's first writes
    for i in range(n):
        for k, way in ways.items():
            traces._spans_in_one_write = way
            t0 = time.perf_counter()
            tid, spans = traces.log_trace(client, exp, run, trajectory(i, rounds))
            ms[k].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            assert len(client.get_trace(tid, display=False).data.spans) == spans
            read.append((time.perf_counter() - t0) * 1e3)
    same = []
    for k, way in ways.items():  # one trajectory at one clock, each way
        traces._spans_in_one_write = way
        same.append(traces.log_trace(client, exp, run, trajectory(10**6 + rounds, rounds), end_ns=10**18)[0])
    traces._spans_in_one_write = one_write
    same_rows = rows_of(tmp / "mlflow.db", same[0]) == rows_of(tmp / "mlflow.db", same[1])
    one, per = (sorted(v)[len(v) // 2] for v in (ms["one"], ms["per_span"]))  # medians
    row = {"rounds": rounds, "spans": spans, "traces": n, "one_write_ms": round(one, 1),
           "per_span_ms": round(per, 1), "speedup": round(per / one, 2),
           "read_back_ms": round(sorted(read)[len(read) // 2], 1), "same_rows": same_rows}
    print(f"{spans} spans a trace: one transaction {one:.1f} ms, a transaction a span {per:.1f} ms "
          f"({per / one:.2f}x); read back {row['read_back_ms']} ms; same rows: {same_rows}")
    return row


if __name__ == "__main__":
    main()
