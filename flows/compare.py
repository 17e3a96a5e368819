"""Compare runs side by side on the tasks they share: pass@1 after each round, what the agent did
with each round, tokens and time, and which tasks each run fixed. Runs in several languages pair on the
HumanEvalPack problems they share (CPP/3 with Python/3); --language keeps one.

    python -m flows.compare RUN_ID RUN_ID ...          # job runs
    python -m flows.compare --sweep PARENT_RUN_ID        # every job of a -m sweep
    python -m flows.compare --sweep PARENT --json out.json
    python -m flows.compare RUN_ID --against benchmarks/results/fullsize-x.json:RUN_ID   # against a recorded run
    python -m flows.compare --sweep PARENT_RUN_ID --language cpp   # one language of a languages x strategies sweep

Runs are labelled by what differs between them, as a sweep's plot labels its jobs (e.g. `strategy=react`). Everything is
read back from MLflow (params, `results.jsonl`), so it works on any tracking store the runs were logged to. A run
still going, or stopped, has no `results.jsonl` yet: its `tasks/*.json` trajectories (logged as each task ends)
stand in, and it is labelled "(unfinished)".
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from agents.types import first_pass, passed_at, row_verdicts

from .analysis.records import load_runs  # noqa: F401 - the MLflow reader, re-exported for its callers
from .core import task_order
from .markdown import table as md_table
from .stats import pass_at_k_paired, pass_at_k_table, paired, wilson
from .sweep import job_labels
from .schema import TrackingConf
from .tracking import tracking_uri


def compare(runs: list[dict]) -> dict:
    """Per run, on the (task, sample) pairs every run has: pass@1 after each round and decision counts."""
    labels = job_labels([r["run"] for r in runs])  # what sets each run apart, as the sweep plot says it
    # runs in several languages pair on HumanEvalPack's problems (CPP/3 and Python/3 are one problem)
    across = len({r["params"].get("dataset.language", "python") for r in runs}) > 1
    tid = (lambda row: "problem/" + row["task_id"].rsplit("/", 1)[-1]) if across else (lambda row: row["task_id"])
    common = set.intersection(*({(tid(row), row["sample"]) for row in r["rows"]} for r in runs))
    out = {"tasks": len({t for t, _ in common}), "runs": [], "across_languages": across}
    for r in runs:
        rows = [row for row in r["rows"] if (tid(row), row["sample"]) in common]
        rows.sort(key=lambda row: (task_order(tid(row)), row["sample"]))
        iters = int(r["params"].get("iters", 0))
        n = len(rows) or 1
        firsts = [row_verdicts(row) for row in rows]  # the verdict at each budget (agents/types.py)
        decisions = Counter(a["decision"] for row in rows for a in row["attempts"])
        out["runs"].append({
            "label": labels[r["run_id"]] + ("" if r["finished"] else " (unfinished)"),
            "run_id": r["run_id"], "iters": iters,
            "pass@1_by_iter": [round(sum(passed_at(f, k) for f in firsts) / n, 4) for k in range(iters + 1)],
            "pass@1_ci95": [round(x, 4) for x in wilson(sum(passed_at(f) for f in firsts), len(rows))],
            "passed": sum(passed_at(f) for f in firsts),
            "errors": sum(bool(row.get("error")) for row in rows),
            "decisions": dict(decisions),
            "prompt_tokens": sum(row.get("prompt_tokens", 0) for row in rows),
            "completion_tokens": sum(row.get("completion_tokens", 0) for row in rows),
            "wall_s": r["metrics"].get("wall_s") if r["finished"] else None,
            "verdicts": {f"{tid(row)}#{row['sample']}": f for row, f in zip(rows, firsts)},
            # n answers a task (samples=n): each task's passes of them, for pass@k (paired where both have n >= k)
            "samples": len({row["sample"] for row in rows}) or 1,
            "passes_by_task": dict(Counter(tid(row) for row, f in zip(rows, firsts) if passed_at(f))),
        })
        n = out["runs"][-1]["samples"]
        if n > 1:
            tasks = sorted({tid(row) for row in rows}, key=task_order)
            table = pass_at_k_table([out["runs"][-1]["passes_by_task"].get(t, 0) for t in tasks], n)
            out["runs"][-1]["pass@k"] = {k: row for k, row in table.items()}
    out["paired"] = paired_verdicts(out["runs"])
    return out


def paired_verdicts(runs: list[dict]) -> list[dict]:
    """Each run against the first, on the shared tasks: after the last round and after each round both have."""
    if len(runs) < 2:
        return []
    base = runs[0]
    keys = sorted(base["verdicts"])
    out = []
    for other in runs[1:]:
        rounds = min(base["iters"], other["iters"]) + 1
        per_round = []
        for k in range(rounds):
            a = [passed_at(other["verdicts"][t], k) for t in keys]
            b = [passed_at(base["verdicts"][t], k) for t in keys]
            per_round.append(paired(a, b))
        a_all = [passed_at(other["verdicts"][t]) for t in keys]
        b_all = [passed_at(base["verdicts"][t]) for t in keys]
        final = paired(a_all, b_all)
        out.append({"a": other["label"], "b": base["label"], "diff": round(final.diff, 4),
                    "ci95": [round(final.low, 4), round(final.high, 4)], "only_a": final.only_a,
                    "only_b": final.only_b, "p_value": round(final.p_value, 6),
                    "verdict": final.verdict(other["label"], base["label"]),
                    "by_round": [{"round": k, "diff": round(p.diff, 4), "ci95": [round(p.low, 4), round(p.high, 4)],
                                  "only_a": p.only_a, "only_b": p.only_b, "p_value": round(p.p_value, 6)}
                                 for k, p in enumerate(per_round)],
                    "pass@k": _pass_at_k_pairs(other, base)})
    return out


def _pass_at_k_pairs(a: dict, b: dict) -> list[dict]:
    """pass@k of A minus B for each k > 1 both runs have n >= k answers for (their shared tasks), paired over tasks."""
    na, nb = a.get("samples", 1), b.get("samples", 1)
    tasks = sorted({key.split("#")[0] for key in b["verdicts"]}, key=task_order)
    if not tasks or "passes_by_task" not in a or "passes_by_task" not in b:
        return []
    pa, pb = ([r["passes_by_task"].get(t, 0) for t in tasks] for r in (a, b))
    return [pass_at_k_paired(pa, na, pb, nb, k) for k in (2, 5, 10, 100) if k <= min(na, nb)]


def table(result: dict) -> str:
    runs = result["runs"]
    rounds = max(r["iters"] for r in runs) + 1
    head = ["run", *(f"r{k}" for k in range(rounds)), "passed", "95% CI", "tokens in/out", "wall s", "decisions"]
    rows = []
    for r in runs:
        curve = [f"{p:.3f}" for p in r["pass@1_by_iter"]] + [""] * (rounds - len(r["pass@1_by_iter"]))
        dec = ", ".join(f"{k} {v}" for k, v in sorted(r["decisions"].items()))
        wall = f"{r['wall_s']:.0f}" if r["wall_s"] is not None else "-"
        ci = f"{r['pass@1_ci95'][0]:.3f}-{r['pass@1_ci95'][1]:.3f}"
        rows.append([r["label"], *curve, r["passed"], ci, f"{r['prompt_tokens']}/{r['completion_tokens']}", wall, dec])
    lines = [f"{result['tasks']} common tasks", *md_table(head, rows)]
    if result.get("paired"):
        lines += ["", f"paired on the {result['tasks']} common tasks (95% CI of the difference: Newcombe; p: exact McNemar):"]
        for p in result["paired"]:
            rounds_txt = ", ".join(f"r{x['round']} {x['diff'] * 100:+.1f} (p={x['p_value']:.3g})" for x in p["by_round"])
            lines += [f"- {p['verdict']}", f"  per round: {rounds_txt}"]
            for x in p.get("pass@k", []):
                lines.append(f"  pass@{x['k']}: {x['diff'] * 100:+.1f} points (95% paired bootstrap over tasks "
                             f"{x['ci95'][0] * 100:+.1f} to {x['ci95'][1] * 100:+.1f})")
    keys = sorted(runs[0]["verdicts"])
    fixed_by_some = [k for k in keys if any(passed_at(r["verdicts"][k]) for r in runs)]
    firsts = [[k.split("#")[0], *(first_cell(r["verdicts"][k]) for r in runs)]
              for k in sorted(fixed_by_some, key=lambda k: (task_order(k.split("#")[0]), k))]
    lines += ["", "first passing round per task (- = never; \"at\": the budgets at which it passed, where the verdict is "
              "not monotone), tasks some run fixed:",
              *md_table(["task", *(r["label"] for r in runs)], firsts)]
    return "\n".join(lines)


def first_cell(v: list[bool]) -> str:
    """A task's verdicts per budget as the table shows them: the first passing round where they are monotone, else
    (held_at_end=hand_in) the budgets at which it passed, in runs: "at 0-1,5-23"."""
    first = first_pass(v)
    if first is None or all(v[first:]):
        return "-" if first is None else str(first)
    runs, start = [], None
    for k, ok in enumerate([*v, False]):
        if ok and start is None:
            start = k
        elif not ok and start is not None:
            runs.append(str(start) if k - 1 == start else f"{start}-{k - 1}")
            start = None
    return "at " + ",".join(runs)


# ---- pairing a run against one an earlier results file recorded ---------------------------------------------------
def name_of(params: dict) -> str:
    return (f"{params.get('model.name', '?')} {params.get('strategy.name', '?')} protocol={params.get('protocol', 'tests')} "
            f"iters={params.get('iters', '?')}")


class RecordError(ValueError):
    """One line: which file or run, what is wrong, how to fix it."""


def from_file(spec: str, results: Path | None = None) -> dict:
    """FILE:RUN_ID_PREFIX -> that run's record from a results file, in flows.compare.paired_verdicts' shape (a bare
    file name is looked up in `results`, benchmarks/results by default)."""
    from .analysis.records import RESULTS

    path, _, prefix = spec.rpartition(":")
    if not path:
        raise RecordError(f"--against wants FILE:RUN_ID (got {spec!r})")
    file = Path(path) if Path(path).exists() else (results or RESULTS) / path
    if not file.exists():
        raise RecordError(f"--against {spec!r}: no file {path!r} here or in benchmarks/results/; give a results file's path")
    from .analysis.records import read_runs
    from .results import ResultsError

    try:
        runs = [r for r in read_runs(file) if r.run_id.startswith(prefix)]
    except ResultsError as e:
        raise RecordError(str(e)) from None
    if len(runs) != 1 or runs[0].outcomes is None:
        raise RecordError(f"{path} has no single run {prefix!r} with per-task outcomes: give a longer run id prefix")
    r = runs[0]
    return {"label": f"{name_of(r.params)} ({r.run_id[:8]}, {Path(path).name})", "iters": r.iters,
            "verdicts": r.outcomes}


def pair_with_earlier(base: dict, rec: dict) -> dict:
    """A run's record against an earlier one (from_file) as the baseline, on the tasks both have."""
    keys = set(base["verdicts"]) & set(rec["verdicts"])
    mine = {"label": f"{name_of(rec['params'])} ({rec['run_id'][:8]})", "iters": int(rec["params"].get("iters", 0)),
            "verdicts": {k: rec["verdicts"][k] for k in keys}}
    theirs = dict(base, verdicts={k: base["verdicts"][k] for k in keys})
    return paired_verdicts([theirs, mine])[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_ids", nargs="*", help="MLflow job run ids")
    ap.add_argument("--sweep", help="a sweep's parent run id: compare all its jobs")
    ap.add_argument("--language", help="only the runs in this dataset language (python, js, java, go, cpp, rust); "
                    "runs in several languages pair on the problems they share")
    ap.add_argument("--tracking-uri", default=tracking_uri(TrackingConf()))
    ap.add_argument("--json", type=Path, help="also write the comparison here")
    ap.add_argument("--against", action="append", default=[], metavar="FILE:RUN_ID",
                    help="also pair each run against a run an earlier results file recorded (repeatable): a later "
                         "session, whose MLflow store is gone, still pairs on the tasks both have")
    args = ap.parse_args(argv)
    from .analysis.run_record import from_mlflow

    try:
        earlier = [from_file(spec) for spec in args.against]
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(args.tracking_uri)
    run_ids = list(args.run_ids)
    try:
        if args.sweep:
            parent = client.get_run(args.sweep)
            children = client.search_runs([parent.info.experiment_id],
                                          filter_string=f"tags.mlflow.parentRunId = '{args.sweep}'",
                                          order_by=["attributes.start_time ASC"])
            run_ids += [c.info.run_id for c in children]
        if not run_ids:
            print("error: no runs to compare: give job run ids or --sweep PARENT_RUN_ID", file=sys.stderr)
            return 2
        runs = load_runs(client, run_ids)
        if args.language:
            runs = [r for r in runs if r["params"].get("dataset.language", "python") == args.language]
            if not runs:
                print(f"error: no run in language {args.language!r} among them", file=sys.stderr)
                return 2
    except (MlflowException, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: cannot read the runs from {args.tracking_uri}: {first} (check the run ids and --tracking-uri)",
              file=sys.stderr)
        return 2
    result = compare(runs)
    if not result["tasks"]:
        print("error: the runs share no task; compare runs over the same dataset", file=sys.stderr)
        return 2
    print(table(result))
    result["paired_with_earlier"] = [pair_with_earlier(base, from_mlflow(run)) for base in earlier for run in runs]
    for p in result["paired_with_earlier"]:
        print(f"- {p['verdict']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
