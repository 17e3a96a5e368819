"""Sandbox throughput on HumanEvalFix: one new interpreter per program vs the warm-fork sandbox.

    python benchmarks/sandbox.py [--data PATH] [--timeout S] [--workers N]

Both modes use the same jail, limits and verdict rule (sandboxes.local.LocalSandbox, mode=fresh|fork) and
run in this same process, one after the other. Programs: declaration + canonical / buggy solution + test
(program.build_program), 164 each. The programs that end are timed for programs/s; the ones that loop are
run apart (their wall time is the timeout, the same in both modes) and must end as `timeout`.
Writes benchmarks/results/sandbox-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandboxes import build_program  # noqa: E402
from sandboxes.local import LocalSandbox  # noqa: E402
from sandboxes.procs import processes_of_uids, sandbox_uids  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "humanevalfix_python.jsonl"
LOOPING = ("Python/10", "Python/156", "Python/160")


def load(path: Path) -> list[tuple[str, str, str]]:
    if not path.exists():
        sys.exit(f"error: HumanEvalFix data not found at {path} (pass --data)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["task_id"], kind, build_program(r["declaration"] + r[f"{kind}_solution"], r["test"]))
            for kind in ("canonical", "buggy") for r in rows]


def run_all(sbx: LocalSandbox, jobs, timeout: float, workers: int):
    start = time.monotonic()
    with ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(lambda j: sbx.run(j[2], timeout), jobs))
    return results, time.monotonic() - start


def measure(mode: str, jobs, timeout: float, workers: int, uid_base: int) -> dict:
    t0 = time.monotonic()
    sbx = LocalSandbox(mode=mode, workers=workers, uid_base=uid_base)
    if mode == "fork":
        sbx.warm_up()  # one-time start of the warm workers, reported apart
    warm = time.monotonic() - t0
    ending = [j for j in jobs if not (j[1] == "buggy" and j[0] in LOOPING)]
    looping = [j for j in jobs if j[1] == "buggy" and j[0] in LOOPING]
    try:
        res_end, wall_end = run_all(sbx, ending, timeout, workers)
        res_loop, wall_loop = run_all(sbx, looping, timeout, workers)
    finally:
        sbx.close()
    left = processes_of_uids(sandbox_uids(sbx))  # close() returns once the jails' processes are gone
    verdicts = {f"{tid}/{kind}": r.status for (tid, kind, _), r in zip(ending + looping, res_end + res_loop)}
    counts = Counter((kind, r.status) for (_, kind, _), r in zip(ending + looping, res_end + res_loop))
    return {
        "mode": mode, "workers": workers, "isolated": sbx.isolated, "startup_s": round(warm, 3),
        "ending_programs": len(ending), "ending_wall_s": round(wall_end, 3),
        "programs_per_s": round(len(ending) / wall_end, 2),
        "looping_wall_s": round(wall_loop, 3),
        "looping": {tid: {"status": r.status, "duration_s": r.duration_s} for (tid, _, _), r in zip(looping, res_loop)},
        "canonical_passed": counts[("canonical", "passed")],
        "buggy_not_passed": sum(v for (k, s), v in counts.items() if k == "buggy" and s != "passed"),
        "statuses": {f"{k}:{s}": v for (k, s), v in sorted(counts.items())},
        "leftover_processes": len(left),
        "verdicts": verdicts,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per program (harness default 10)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="concurrent programs (default: cores)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    if args.timeout <= 0 or args.workers < 1:
        sys.exit("error: --timeout must be positive and --workers at least 1")
    jobs = load(args.data)
    load_before = os.getloadavg()
    fresh = measure("fresh", jobs, args.timeout, args.workers, 63000)
    fork = measure("fork", jobs, args.timeout, args.workers, 63100)
    same = fresh["verdicts"] == fork["verdicts"]
    speedup = fork["programs_per_s"] / fresh["programs_per_s"]
    report = {
        "benchmark": "sandbox", "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "timeout_s": args.timeout, "programs": len(jobs),
        "a_fresh_interpreter": {k: v for k, v in fresh.items() if k != "verdicts"},
        "b_warm_fork": {k: v for k, v in fork.items() if k != "verdicts"},
        "speedup_b_over_a": round(speedup, 2), "identical_verdicts": same,
        "verdicts": fork["verdicts"],
        "verdict_differences": {k: [fresh["verdicts"][k], v] for k, v in fork["verdicts"].items()
                                if fresh["verdicts"].get(k) != v},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sandbox-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    rows = [("", "(a) new interpreter", "(b) warm fork")]
    for key, label in (("startup_s", "startup (s)"), ("ending_wall_s", "325 ending programs, wall (s)"),
                       ("programs_per_s", "programs/s"), ("canonical_passed", "canonical passed /164"),
                       ("buggy_not_passed", "buggy not passed /164"), ("looping_wall_s", "3 looping programs, wall (s)"),
                       ("leftover_processes", "processes left behind")):
        rows.append((label, str(fresh[key]), str(fork[key])))
    rows.append(("looping statuses", " ".join(v["status"] for v in fresh["looping"].values()),
                 " ".join(v["status"] for v in fork["looping"].values())))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(" | ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    print(f"speedup (b)/(a): {speedup:.1f}x   identical verdicts: {same}   "
          f"workers: {args.workers}   timeout: {args.timeout:g} s   isolated: {fork['isolated']}")
    print(f"results: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    ok = (same and fork["canonical_passed"] == 164 and fork["buggy_not_passed"] == 164
          and all(v["status"] == "timeout" for v in fork["looping"].values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
