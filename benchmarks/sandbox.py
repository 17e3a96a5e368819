"""Sandbox throughput on HumanEvalFix: one new interpreter (or container) per program vs warm workers.

    python benchmarks/sandbox.py [--data PATH] [--timeout S] [--workers N] [--backends local,docker] [--rows a,b,c,d]

Rows: (a) local jail, a new interpreter per program; (b) local jail, warm fork; with docker (when the daemon and
`make docker-image` are there): (c) a new container per program, what one-container-per-run harnesses do;
(d) warm containers forking a child per program (sandbox=docker); (e) (d) with each container in its own
cgroup under the root (`cgroup_parent: /`). Every row has the same limits and verdict rule
(sandboxes.local.LocalSandbox / sandboxes.docker.DockerSandbox, mode=fresh|fork) and runs in this same process,
one after the other. Programs: declaration + canonical / buggy solution + test (program.build_program), 164
each. The programs that end are timed for programs/s; the ones that loop are run apart (their wall time is the
timeout, the same in every row) and must end as `timeout`. Writes benchmarks/results/sandbox-<UTC time>.json.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serving.machine import describe  # noqa: E402
from sandboxes import build_program  # noqa: E402
from sandboxes.docker import DockerSandbox, docker_problem  # noqa: E402
from sandboxes.local import LocalSandbox  # noqa: E402
from sandboxes.procs import processes_of_uids, sandbox_uids  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "humanevalfix_python.jsonl"
LOOPING = ("Python/10", "Python/156", "Python/160")


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "Sandbox throughput (`benchmarks/sandbox.py`)"
TEXT = ("Every canonical and every buggy HumanEvalFix program through each way of running them, in one run per file: "
        "the local bubblewrap jail (a new interpreter per program, warm forked workers) and, where the file has them, "
        "Docker (a container per program, warm containers).")
TABLE = {"rows": "*", "keys": ["way"], "columns": [["programs", "$.programs"], ["mode", "mode"], ["workers", "workers"],
                                                   ["programs/s", "programs_per_s"],
                                                   ["canonical passed", "canonical_passed"],
                                                   ["buggy not passed", "buggy_not_passed"],
                                                   ["processes left", "leftover_processes"],
                                                   ["identical verdicts", "$.identical_verdicts"]]}


def load(path: Path) -> list[tuple[str, str, str]]:
    if not path.exists():
        sys.exit(f"error: HumanEvalFix data not found at {path} (pass --data)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["task_id"], kind, build_program(r["declaration"] + r[f"{kind}_solution"], r["test"]))
            for kind in ("canonical", "buggy") for r in rows]


def run_all(sbx, jobs, timeout: float, workers: int):
    start = time.monotonic()
    with ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(lambda j: sbx.run(j[2], timeout), jobs))
    return results, time.monotonic() - start


def measure(backend: str, mode: str, jobs, timeout: float, workers: int, uid_base: int, **opts) -> dict:
    t0 = time.monotonic()
    make = LocalSandbox if backend == "local" else DockerSandbox
    sbx = make(mode=mode, workers=workers, uid_base=uid_base, **opts)
    if mode == "fork":
        sbx.warm_up()  # one-time start of the warm workers (containers), reported apart
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
        "backend": backend, "mode": mode, "options": opts, "workers": workers, "isolated": sbx.isolated, "startup_s": round(warm, 3),
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


# (e): each container its own CPU-scheduler entity, as each local worker is; under docker's own cgroup all
# containers together weigh as much as one process of the host (what (d) measures on a loaded machine).
ROWS = {"a_fresh_interpreter": ("local", "fresh", 63000, "(a) local, new interpreter", {}),
        "b_warm_fork": ("local", "fork", 63100, "(b) local, warm fork", {}),
        "c_docker_container_per_program": ("docker", "fresh", 63200, "(c) docker, container per program", {}),
        "d_docker_warm_containers": ("docker", "fork", 63300, "(d) docker, warm containers", {}),
        "e_docker_warm_cgroup_parent_root": ("docker", "fork", 63400, "(e) (d) with cgroup_parent=/",
                                             {"cgroup_parent": "/"})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per program (harness default 10)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="concurrent programs (default: cores)")
    ap.add_argument("--backends", default=None,
                    help="comma list of local, docker (default: local, and docker when its daemon and image are there)")
    ap.add_argument("--rows", default="a,b,c,d,e", help="which rows to run (default all: a,b,c,d,e)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    picked = {r.strip() for r in args.rows.split(",")}
    if not picked <= {"a", "b", "c", "d", "e"}:
        sys.exit(f"error: --rows takes a, b, c, d, e, got {args.rows!r}")
    if args.timeout <= 0 or args.workers < 1:
        sys.exit("error: --timeout must be positive and --workers at least 1")
    why_not_docker = docker_problem()
    backends = args.backends.split(",") if args.backends else ["local"] + (["docker"] if why_not_docker is None else [])
    if not set(backends) <= {"local", "docker"}:
        sys.exit(f"error: --backends takes local and/or docker, got {args.backends!r}")
    if "docker" in backends and why_not_docker:
        sys.exit(f"error: {why_not_docker}")
    if why_not_docker and not args.backends:
        print(f"docker rows skipped: {why_not_docker}", file=sys.stderr)
    jobs = load(args.data)
    load_before = os.getloadavg()
    rows = {key: measure(backend, mode, jobs, args.timeout, args.workers, uid, **opts)
            for key, (backend, mode, uid, _, opts) in ROWS.items() if backend in backends and key[0] in picked}
    first = next(iter(rows.values()))
    base = rows.get("a_fresh_interpreter")
    report = {
        "timeout_s": args.timeout, "programs": len(jobs),
        **{key: {k: v for k, v in r.items() if k != "verdicts"} for key, r in rows.items()},
        "speedup_over_a": {key: round(r["programs_per_s"] / base["programs_per_s"], 2) for key, r in rows.items()}
        if base else {},
        "identical_verdicts": all(r["verdicts"] == first["verdicts"] for r in rows.values()),
        "verdicts": first["verdicts"],
        "verdict_differences": {f"{key}:{k}": [first["verdicts"].get(k), v] for key, r in rows.items()
                                for k, v in r["verdicts"].items() if first["verdicts"].get(k) != v},
    }
    from flows.results import stamp, write

    path = write("sandbox", report, title=TITLE, text=TEXT, table=TABLE, out=args.out / f"sandbox-{stamp()}.json",
                 config={k: str(v) for k, v in vars(args).items()},
                 machine=describe(platform=platform.platform(), loadavg_at_start=[round(x, 2) for x in load_before],
                                  loadavg_after=[round(x, 2) for x in os.getloadavg()]))
    table = [[""] + [ROWS[key][3] for key in rows]]
    for key, label in (("startup_s", "startup (s)"), ("ending_wall_s", "325 ending programs, wall (s)"),
                       ("programs_per_s", "programs/s"), ("canonical_passed", "canonical passed /164"),
                       ("buggy_not_passed", "buggy not passed /164"), ("looping_wall_s", "3 looping programs, wall (s)"),
                       ("leftover_processes", "processes left behind")):
        table.append([label] + [str(r[key]) for r in rows.values()])
    table.append(["looping statuses"] + [" ".join(v["status"] for v in r["looping"].values()) for r in rows.values()])
    w = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print(" | ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    if base:
        print("speedup over (a): " + "  ".join(f"{ROWS[k][3][:3]} {v:.1f}x" for k, v in report["speedup_over_a"].items()))
    print(f"identical verdicts: {report['identical_verdicts']}   workers: {args.workers}   timeout: {args.timeout:g} s")
    print(f"results: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    ok = report["identical_verdicts"] and all(
        r["canonical_passed"] == 164 and r["buggy_not_passed"] == 164 and r["leftover_processes"] == 0
        and all(v["status"] == "timeout" for v in r["looping"].values()) for r in rows.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
