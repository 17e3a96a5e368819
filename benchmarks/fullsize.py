"""Record full-size runs: read finished (or stopped) job runs back from MLflow and write their figures to
benchmarks/results/fullsize-<name>-<UTC date>.json, then print the README's table rows.

    .venv/bin/python benchmarks/fullsize.py RUN_ID [RUN_ID ...] --name default --command "make eval"
    .venv/bin/python benchmarks/fullsize.py RUN_ID --name x --against benchmarks/results/fullsize-y.json:RUN_ID

Per run: pass@1 after each round with its 95% Wilson interval, the same on the tuning sample (Python/0-23, where
prompts and knobs were shaped) and on the other 140 tasks apart, pass@1 by bug type, cost (tokens sent and
prefilled, completion tokens, model calls, sandbox runs, answers cut at max_new_tokens, suspicious passes) and
wall time, the tasks' own seconds per task cut to the budget (`task_seconds`, what `python -m flows.frontier` compares)
and the machine (the run's fixlab.machine tag, else this one). With several runs, each is paired against the first
on their common tasks (flows.compare).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agents.selfcheck import SELF_TESTS_PASS, satisfied  # noqa: E402
from agents.types import Attempt, passed_at, row_verdicts  # noqa: E402
from flows.compare import compare, load_runs, paired_verdicts  # noqa: E402
from flows.frontier import cost_by_round, run_machine, task_seconds  # noqa: E402
from flows.stats import paired, wilson  # noqa: E402
from flows.schema import TrackingConf  # noqa: E402
from flows.tracking import tracking_uri  # noqa: E402

TUNING = {f"Python/{i}" for i in range(24)}  # the tuning sample: never report a claim from it alone
COST = ("prompt_tokens", "prefill_tokens", "completion_tokens", "model_calls", "sandbox_runs", "length_stops",
        "suspicious", "errors", "wall_s")


def rate(rows: list[dict], rnd: int | None = None) -> dict:
    """pass@1 (after round `rnd`, or at the end) of one sample per task, with its Wilson interval."""
    ok = [passed_at(row_verdicts(r), rnd) for r in rows]
    lo, hi = wilson(sum(ok), len(ok))
    return {"passed": sum(ok), "total": len(ok), "pass@1": round(sum(ok) / len(ok), 4) if ok else 0.0,
            "ci95": [round(lo, 4), round(hi, 4)]}


def record(run: dict) -> dict:
    rows = [r for r in run["rows"] if r.get("sample", 0) == 0]
    iters = int(run["params"].get("iters", 0))
    by_bug = defaultdict(list)
    for r in rows:
        by_bug[r.get("bug_type") or "?"].append(r)
    m = run["metrics"]
    machine, machine_source = run_machine(run["run"])
    return {
        "run_id": run["run_id"], "status": run["run"].info.status, "params": run["params"],
        "overall": rate(rows), "by_round": [rate(rows, k) for k in range(iters + 1)],
        "tuning_sample_0_23": rate([r for r in rows if r["task_id"] in TUNING]),
        "other_tasks": rate([r for r in rows if r["task_id"] not in TUNING]),
        "by_bug_type": {b: rate(rs) for b, rs in sorted(by_bug.items())},
        "cost": {k: m[k] for k in COST if k in m},
        "per_task_mean": {k: round(m[k] / len(rows), 1) for k in ("prompt_tokens", "completion_tokens", "model_calls",
                                                                 "sandbox_runs", "wall_s") if k in m and rows},
        # the time a run's tasks took, cut to its budget (a budget sweep's later jobs only cut the first job's
        # trajectories, so their wall_s is not their cost): comparable between runs on one kind of machine
        "task_seconds": task_seconds(rows), "machine": machine, "machine_source": machine_source,
        # the engine that ran it (the frontier compares seconds only between runs of one machine and one commit)
        "git_commit": run["run"].data.tags.get("git_commit"), "git_dirty": run["run"].data.tags.get("git_dirty"),
        # each smaller budget's cost per task, summed over tasks (rows that keep per-round costs; None otherwise)
        "cost_by_round": cost_by_round(rows, iters),
        # outcomes only (no trajectories): what a later session needs to pair a new run against this one. Each is
        # the first passing round (null: never), or where the verdict is not monotone in the budget
        # (strategy.held_at_end=hand_in) the verdict at each budget 0..iters
        "first_pass_round": {f"{r['task_id']}#{r.get('sample', 0)}": row_verdicts(r) for r in rows},
    }


def overfit_gap(client, run: dict) -> dict | None:
    """Under `docs`/`hidden` the agent is judged by tests it never saw: how often it stopped satisfied with an answer
    the hidden verdict rejects. Read from the per-task trajectories (results.jsonl keeps no visible verdict). The gap
    is the rate of answers it was satisfied with (passed what it was shown, and its self-check agreed when it ran
    one: stop reason not "unsure") minus the hidden pass rate, paired on the same tasks (Newcombe interval)."""
    if run["params"].get("protocol", "tests") == "tests":
        return None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fixlab-fullsize-") as tmp:
        trajs = [json.loads(p.read_text()) for p in Path(client.download_artifacts(run["run_id"], "tasks", tmp)).glob("*.json")]
    trajs = [t for t in trajs if t.get("sample", 0) == 0]
    vis = [passed_what_it_saw(t) for t in trajs]
    sat = [v and t.get("stop_reason") != "unsure" and (t.get("stop_reason") == "solved" or not any(
        (a.get("self_check") or {}).get("held") for a in t["attempts"])) for v, t in zip(vis, trajs)]
    hid = [t["first_pass_round"] is not None for t in trajs]
    gap = paired(sat, hid)
    out = {"visible_passed": sum(vis), "satisfied": sum(sat), "hidden_passed": sum(hid), "total": len(trajs),
           "gap": round(gap.diff, 4), "ci95": [round(gap.low, 4), round(gap.high, 4)], "visible_only": gap.only_a,
           "hidden_only": gap.only_b}
    if any(a.get("self_check") for t in trajs for a in t["attempts"]):
        out["without_self_check"] = without_self_check(trajs, hid, vis)
    # self_check_scope=task: its groups span rounds, so no own-tests read-back; the held answer's instead
    across = run["params"].get("strategy.self_check_scope", "round") == "task"
    if across and run["params"].get("strategy.held_at_end", "hold") == "hold":  # hand_in: what the run did
        out["held_handed_in"] = held_handed_in(trajs, hid, sat)
    if not across and any((a.get("self_check") or {}).get("own_tests") for t in trajs for a in t["attempts"]):
        need = int(run["params"].get("strategy.self_check", 1))
        out["without_own_tests"] = without_own_tests(trajs, hid, need)
        # the label at today's default share (runs before the knob judged at more than half): same answers
        ran, today = float(run["params"].get("strategy.self_tests_pass", 0.5)), SELF_TESTS_PASS
        if ran != today:
            out["at_default_pass"] = at_own_tests_pass(trajs, hid, need, today)
    return out


def passed_what_it_saw(t: dict) -> bool:
    """A task's trajectory had an answer that passed the tests the agent was shown."""
    return any(((a.get("visible_result") or a.get("result") or {}).get("status") == "passed") for a in t["attempts"])


def candidate_verdict(last: dict, call: int) -> bool:
    """Whether candidate `call` of a recorded round passed the full test (Attempt.candidate_passed)."""
    return Attempt.from_dict(last).candidate_passed(call)


def without_self_check(trajs: list[dict], hid: list[bool], vis: list[bool]) -> dict:
    """The same answers without the self-check: the round that stopped keeps its first candidate that passed what the
    agent saw (read from the candidates' recorded visible and full-test statuses) and is believed. Paired with the
    self-check's own verdicts."""
    def first_passing(t: dict) -> bool:
        # the first round whose answer passed what the agent saw (self_check_scope=task goes on past it when unsure)
        last = next((a for a in t["attempts"] if a.get("self_check")), None)
        if last is None:
            return t["first_pass_round"] is not None
        ran = [r["call"] for r in last["rejected"] if r.get("status") == "passed"] + [last["candidate"]]
        return candidate_verdict(last, min(ran))

    off = [first_passing(t) for t in trajs]
    gap = paired(vis, off)  # without the check every answer that passed what it saw is believed
    check = paired(hid, off)
    return {"hidden_passed": sum(off), "satisfied": sum(vis), "gap": round(gap.diff, 4),
            "ci95": [round(gap.low, 4), round(gap.high, 4)],
            "self_check_vs_none": {"diff": round(check.diff, 4), "ci95": [round(check.low, 4), round(check.high, 4)],
                                   "only_with": check.only_a, "only_without": check.only_b,
                                   "p_value": round(check.p_value, 6)}}


def held_handed_in(trajs: list[dict], hid: list[bool], sat: list[bool]) -> dict:
    """self_check_scope=task: the same answers, but a budget that ends with nothing the agent is satisfied with hands
    in its best held answer (the first of the last self-check's best group), labelled unsure, as scope round does.
    Exact at the run's own budget: every answer was drawn before the budget ended, and handing in at the end changes
    none of them. Satisfied stays as it was; the gap counts only what the agent was satisfied with."""
    def verdict(t: dict, passed: bool, satisfied: bool) -> bool:
        checks = [a["self_check"] for a in t["attempts"] if a.get("self_check")]
        if satisfied or not checks or not checks[-1]["groups"][0]:
            return passed
        r, i = checks[-1]["groups"][0][0]
        a = next(a for a in t["attempts"] if a["round"] == r)
        return candidate_verdict(a, i)

    handed = [verdict(t, h, s) for t, h, s in zip(trajs, hid, sat)]
    gap, vs = paired(sat, handed), paired(handed, hid)
    return {"hidden_passed": sum(handed), "satisfied": sum(sat), "gap": round(gap.diff, 4),
            "ci95": [round(gap.low, 4), round(gap.high, 4)],
            "vs_holding": {"diff": round(vs.diff, 4), "ci95": [round(vs.low, 4), round(vs.high, 4)],
                           "only_with": vs.only_a, "only_without": vs.only_b, "p_value": round(vs.p_value, 6)}}


def without_own_tests(trajs: list[dict], hid: list[bool], need: int) -> dict:
    """The same answers judged by agreement alone (the self-check without the model's own assertions): the round that
    stopped keeps the first answer of its largest group and is satisfied when at least `need` answers agree. Read
    from the recorded groups and the candidates' full-test statuses; paired with what the own tests chose."""
    picked, sat = [], []
    for t, h in zip(trajs, hid):
        last = t["attempts"][-1] if t["attempts"] else None
        check = (last or {}).get("self_check") or {}
        if not check.get("own_tests"):  # no own tests ran for this task: its outcome stands
            picked.append(h)
            sat.append(bool(check.get("satisfied")) if check else passed_what_it_saw(t))
            continue
        top = min(check["groups"], key=lambda g: (-len(g), g[0]))
        picked.append(candidate_verdict(last, top[0]))
        sat.append(len(top) >= need)
    gap, vs = paired(sat, picked), paired(hid, picked)
    return {"hidden_passed": sum(picked), "satisfied": sum(sat), "gap": round(gap.diff, 4),
            "ci95": [round(gap.low, 4), round(gap.high, 4)], "satisfied_but_rejected": gap.only_a,
            "own_tests_vs_none": {"diff": round(vs.diff, 4), "ci95": [round(vs.low, 4), round(vs.high, 4)],
                                  "only_with": vs.only_a, "only_without": vs.only_b, "p_value": round(vs.p_value, 6)}}


def at_own_tests_pass(trajs: list[dict], hid: list[bool], need: int, share: float) -> dict:
    """The same answers labelled as if `strategy.self_tests_pass` had been `share`: that knob moves only the label
    (satisfied or unsure), never which answer is kept, so this reads back exactly what such a run would have said."""
    sat = []
    for t in trajs:
        last = t["attempts"][-1] if t["attempts"] else None
        check = (last or {}).get("self_check") or {}
        seen = passed_what_it_saw(t)
        if not seen or not check.get("own_tests"):  # no own tests ran: its label stands
            sat.append(seen and t.get("stop_reason") != "unsure")
            continue
        # the kept answer's group is ranked first; the agent's own rule (agents/selfcheck.py)
        sat.append(satisfied(len(check["groups"][0]), need, check["own_passed"][0], check["own_tests"], share))
    gap = paired(sat, hid)
    right = sum(s and h for s, h in zip(sat, hid))
    return {"share": share, "hidden_passed": sum(hid), "satisfied": sum(sat), "satisfied_and_passed": right,
            "gap": round(gap.diff, 4), "ci95": [round(gap.low, 4), round(gap.high, 4)],
            "satisfied_but_rejected": gap.only_a, "passed_but_unsure": gap.only_b}


def _name(params: dict) -> str:
    return (f"{params.get('model.name', '?')} {params.get('strategy.name', '?')} protocol={params.get('protocol', 'tests')} "
            f"iters={params.get('iters', '?')}")


def from_file(spec: str) -> dict:
    """FILE:RUN_ID_PREFIX -> that run's record from an earlier results file, in paired_verdicts' shape."""
    path, _, prefix = spec.rpartition(":")
    if not path:
        raise SystemExit(f"fullsize: --against wants FILE:RUN_ID (got {spec!r})")
    file = Path(path) if Path(path).exists() else REPO / "benchmarks" / "results" / path  # a bare name: results/
    if not file.exists():
        raise SystemExit(f"fullsize: --against {spec!r}: no file {path!r} here or in benchmarks/results/; give a "
                         "results file's path")
    recs = [r for r in json.loads(file.read_text())["runs"] if r["run_id"].startswith(prefix)]
    if len(recs) != 1 or "first_pass_round" not in recs[0]:
        raise SystemExit(f"fullsize: {path} has no single run {prefix!r} with per-task outcomes; record it again "
                         "with this script")
    r = recs[0]
    label = f"{_name(r['params'])} ({r['run_id'][:8]}, {Path(path).name})"
    return {"label": label, "iters": int(r["params"].get("iters", 0)), "first_pass_round": r["first_pass_round"]}


def pair_with_earlier(base: dict, rec: dict) -> dict:
    """A new run's record against an earlier one (from_file) as the baseline, on the tasks both have."""
    keys = set(base["first_pass_round"]) & set(rec["first_pass_round"])
    mine = {"label": f"{_name(rec['params'])} ({rec['run_id'][:8]})",
            "iters": int(rec["params"].get("iters", 0)), "first_pass_round": {k: rec["first_pass_round"][k] for k in keys}}
    theirs = dict(base, first_pass_round={k: base["first_pass_round"][k] for k in keys})
    return paired_verdicts([theirs, mine])[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_ids", nargs="+")
    ap.add_argument("--name", required=True, help="what the runs are, for the file name (e.g. default, strategies)")
    ap.add_argument("--label", default="", help="what was run, in words, for the results document (default: --name)")
    ap.add_argument("--command", default="", help="the command that made the runs, kept in the file")
    ap.add_argument("--against", action="append", default=[], metavar="FILE:RUN_ID",
                    help="also pair each run against a run recorded in an earlier results file (repeatable)")
    ap.add_argument("--tracking-uri", default=tracking_uri(TrackingConf()))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results",
                    help="folder for the file (a tuning-sample run goes elsewhere: it is not a result to report)")
    args = ap.parse_args(argv)
    earlier = [from_file(spec) for spec in args.against]

    import mlflow

    client = mlflow.MlflowClient(args.tracking_uri)
    runs = load_runs(client, args.run_ids)
    out = {"command": args.command, "runs": [record(r) for r in runs]}
    for rec, run in zip(out["runs"], runs):
        gap = overfit_gap(client, run)
        if gap:
            rec["overfit_gap"] = gap
    if len(runs) > 1:
        cmp = compare(runs)
        out["common_tasks"] = cmp["tasks"]
        out["paired"] = cmp["paired"]
    for base in earlier:
        for rec in out["runs"]:
            out.setdefault("paired_with_earlier", []).append(pair_with_earlier(base, rec))
    from flows.results import stamp, write

    first = out["runs"][0]
    label = args.label or args.name
    dest = write("fullsize", out, title=label, out=args.out / f"fullsize-{args.name}-{stamp()}.json",
                 text="Runs read back from MLflow; the command that made them is `command`.", command=args.command,
                 config=first["params"], sweeps=[{"select": {}, "label": label}],
                 **({"machine": {"cpu": first["machine"]}} if first["machine_source"] == "tag" else {}))
    print(f"wrote {dest}")
    for rec in out["runs"]:
        p = rec["params"]
        curve = " | ".join(f"{x['pass@1']:.3f}" for x in rec["by_round"])
        o = rec["overall"]
        print(f"| {p.get('model.name', '?')} {p.get('strategy.name', '?')} | {curve} | {o['passed']} / {o['total']} | {o['ci95'][0]:.3f}-{o['ci95'][1]:.3f} "
              f"| {rec['cost'].get('prompt_tokens', 0):.0f} / {rec['cost'].get('prefill_tokens', 0):.0f} / "
              f"{rec['cost'].get('completion_tokens', 0):.0f} | {rec['cost'].get('wall_s', 0) / 60:.1f} min |")
        t, r = rec["tuning_sample_0_23"], rec["other_tasks"]
        print(f"  tuning sample {t['passed']}/{t['total']}; other tasks {r['passed']}/{r['total']} "
              f"({r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}); status {rec['status']}")
        if "overfit_gap" in rec:
            g = rec["overfit_gap"]
            print(f"  overfit gap: satisfied {g.get('satisfied', g['visible_passed'])}/{g['total']} (passed what it saw "
                  f"{g['visible_passed']}) - hidden {g['hidden_passed']}/{g['total']} = "
                  f"{g['gap'] * 100:+.1f} points (95% CI {g['ci95'][0] * 100:+.1f} to {g['ci95'][1] * 100:+.1f})")
            for key, vs, words, against in (
                    ("without_self_check", "self_check_vs_none", "without the self-check", "self-check vs none"),
                    ("held_handed_in", "vs_holding", "handing in the best held answer, unsure, when the budget ends",
                     "vs holding")):
                if key in g:
                    w, v = g[key], g[key][vs]
                    print(f"  the same answers {words}: hidden {w['hidden_passed']}/{g['total']}, gap "
                          f"{w['gap'] * 100:+.1f} points ({w['ci95'][0] * 100:+.1f} to {w['ci95'][1] * 100:+.1f}); "
                          f"{against} {v['diff'] * 100:+.1f} points ({v['only_with']} vs {v['only_without']}, "
                          f"p = {v['p_value']:.3g})")
            if "without_own_tests" in g:
                w = g["without_own_tests"]
                v = w["own_tests_vs_none"]
                print(f"  the same answers by agreement alone (no own tests): hidden {w['hidden_passed']}/{g['total']}, "
                      f"satisfied {w['satisfied']} ({w['satisfied_but_rejected']} of them rejected by the full test), "
                      f"gap {w['gap'] * 100:+.1f} points; own tests vs none {v['diff'] * 100:+.1f} points "
                      f"({v['only_with']} vs {v['only_without']}, p = {v['p_value']:.3g})")
            if "at_default_pass" in g:
                w = g["at_default_pass"]
                print(f"  the same answers labelled at today's self_tests_pass={w['share']}: satisfied {w['satisfied']} "
                      f"({w['satisfied_and_passed']} right, {w['satisfied_but_rejected']} rejected by the full test, "
                      f"{w['passed_but_unsure']} right but unsure), gap {w['gap'] * 100:+.1f} points "
                      f"({w['ci95'][0] * 100:+.1f} to {w['ci95'][1] * 100:+.1f})")
    for p in out.get("paired", []) + out.get("paired_with_earlier", []):
        print(f"- {p['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
