"""Verdicts a second in each language: fixlab's way beside the reference harness's way, side by side in one run.

    python benchmarks/verdicts.py [--languages js,java,go,cpp,rust,python] [--tasks 40] [--workers 1]

For each language, the canonical programs of `--tasks` HumanEvalFix tasks (spread over the 164) run in the same
local jail twice: fixlab's way (sandboxes/languages/<lang>.py: prepared toolchain parts, the tests built apart, the
harness's proof) and the reference's way (bigcode-evaluation-harness's one file and its own commands, e.g. `g++
test.cpp` then `./a.out`, `javac Main.java` then `java Main`, `go test main_test.go`, a cargo project's `cargo check`
and `cargo test`; Language.reference_as_program), one program at a time per worker, alternating the two ways task by
task so that both see the same machine. Per way: each program's wall time (median, p90), verdicts a second, and how
many passed; the ratio is the reference's median over fixlab's. Writes benchmarks/results/verdicts-<UTC>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serving.machine import describe  # noqa: E402
from sandboxes.languages import NAMES, language  # noqa: E402
from sandboxes.local import LocalSandbox  # noqa: E402

DATA = REPO.parent / "shared" / "data"
TITLE = "Verdicts a second per language (`benchmarks/verdicts.py`)"
TEXT = ("The canonical programs of the same tasks in each language, run in the local jail fixlab's way and the "
        "reference harness's way (its one file, its own compile and run commands), alternating task by task. A "
        "program's wall time covers building and running it; `ratio` is the reference's median over fixlab's.")
TABLE = {"rows": "languages.*", "keys": ["language"],
         "columns": [["programs", "programs"], ["fixlab median s", "fixlab.median_s"], ["fixlab p90 s", "fixlab.p90_s"],
                     ["fixlab verdicts/s", "fixlab.verdicts_per_s"], ["reference median s", "reference.median_s"],
                     ["reference p90 s", "reference.p90_s"], ["reference verdicts/s", "reference.verdicts_per_s"],
                     ["ratio (median)", "ratio_median"], ["fixlab passed", "fixlab.passed"],
                     ["reference passed", "reference.passed"]]}


def tasks_of(lang: str, n: int) -> list:
    path = DATA / f"humanevalfix_{lang}.jsonl"
    if not path.exists():
        sys.exit(f"error: HumanEvalFix data not found at {path}")
    rows = [json.loads(line) for line in path.open()]
    picked = [rows[round(i * (len(rows) - 1) / max(n - 1, 1))] for i in range(min(n, len(rows)))]
    out = []
    for r in picked:
        t = types.SimpleNamespace(**r)
        t.imports = r["import"]
        out.append(t)
    return out


def summary(times: list[float], passed: int) -> dict:
    """One way's programs: their wall times (median, p90, mean) and verdicts a second over the time they took."""
    q = sorted(times)
    return {"median_s": round(statistics.median(q), 4), "p90_s": round(q[min(len(q) - 1, int(0.9 * len(q)))], 4),
            "mean_s": round(statistics.mean(q), 4), "verdicts_per_s": round(len(q) / sum(q), 3), "passed": passed}


def measure(name: str, n: int, workers: int, sbx) -> dict:
    lang = language(name)
    tasks = tasks_of(name, n)
    ref_ok = lambda res: res.exit_code == 0 and lang.reference_pass(0, res.stdout, res.stderr)  # noqa: E731
    warm = tasks[0]
    code = lang.context(warm) + warm.canonical_solution
    sbx.run(lang.program(code, warm.test, warm), 10)  # first use: prepared parts, per-task test objects, warm workers
    sbx.run(lang.reference_as_program(code, warm.test, warm), 10)
    rows = {"fixlab": [], "reference": []}

    def one(t):
        code = lang.context(t) + t.canonical_solution
        lang.program(code, t.test, t)  # a task's test is built once in a job (C++'s object): not timed per program
        out = {}
        for way in ("fixlab", "reference") if int(t.task_id.rsplit("/", 1)[1]) % 2 else ("reference", "fixlab"):
            t0 = time.perf_counter()
            prog = lang.program(code, t.test, t) if way == "fixlab" else lang.reference_as_program(code, t.test, t)
            res = sbx.run(prog, 10)
            out[way] = (time.perf_counter() - t0, res.passed if way == "fixlab" else ref_ok(res), res.status)
        return t.task_id, out

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, tasks))
    wall = time.perf_counter() - start
    for _, out in results:
        for way, v in out.items():
            rows[way].append(v)
    report = {way: summary([v[0] for v in vs], sum(v[1] for v in vs)) for way, vs in rows.items()}
    report["wall_s"] = round(wall, 2)
    report["programs"] = len(tasks)
    report["ratio_median"] = round(report["reference"]["median_s"] / report["fixlab"]["median_s"], 2)
    report["differ"] = {tid: {w: v[2] for w, v in out.items()} for tid, out in results
                        if out["fixlab"][1] != out["reference"][1]}
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--languages", default=",".join(n for n in NAMES))
    ap.add_argument("--tasks", type=int, default=40, help="tasks per language, spread over the 164 (default 40)")
    ap.add_argument("--workers", type=int, default=1, help="programs at once (default 1: per-program latency)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    names = [x.strip() for x in args.languages.split(",") if x.strip()]
    unknown = [x for x in names if x not in NAMES]
    if unknown or args.tasks < 2 or args.workers < 1:
        sys.exit(f"error: --languages takes {', '.join(NAMES)}; --tasks at least 2, --workers at least 1")
    load_before = os.getloadavg()
    sbx = LocalSandbox(workers=args.workers, require_isolation=True)
    try:
        langs = {}
        for name in names:
            print(f"verdicts: {name} ...", file=sys.stderr, flush=True)
            langs[name] = measure(name, args.tasks, args.workers, sbx)
            r = langs[name]
            print(f"verdicts: {name}: fixlab {r['fixlab']['median_s']} s, reference {r['reference']['median_s']} s a "
                  f"program (x{r['ratio_median']}), passed {r['fixlab']['passed']}/{r['reference']['passed']}",
                  file=sys.stderr, flush=True)
    finally:
        sbx.close()
    from flows.results import stamp, write

    report = {"languages": langs, "workers": args.workers}
    path = write("verdicts", report, title=TITLE, text=TEXT, table=TABLE, out=args.out / f"verdicts-{stamp()}.json",
                 config={k: str(v) for k, v in vars(args).items()},
                 machine=describe(platform=platform.platform(), loadavg_at_start=[round(x, 2) for x in load_before],
                                  loadavg_after=[round(x, 2) for x in os.getloadavg()]))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
