"""A finished run as its results file keeps it: the figures a job writes about itself when it ends (flows/job.py),
and the read-backs on its trajectories (the same answers under another rule). Pure functions: the job hands in its
rows, trajectories, params and costs; nothing here reads MLflow or writes a file.

Per run: pass@1 after each round with its 95% Wilson interval, the same on the tuning sample (Python/0-23, where
prompts and knobs were shaped) and on the other 140 tasks apart, pass@1 by bug type, cost (tokens sent and
prefilled, completion tokens, model calls, sandbox runs, answers cut at max_new_tokens, suspicious passes) and wall
time, the tasks' own seconds cut to the budget (`task_seconds`, what `python -m flows.frontier` compares), each
smaller budget's cost (`cost_by_round`), every task's verdict at each budget (`verdicts`), and under docs/hidden the overfit
gap with its read-backs.
"""
from __future__ import annotations

from collections import defaultdict

from agents.selfcheck import satisfied
from agents.types import Attempt, passed_at, row_verdicts

from ..stats import paired, wilson
from .records import cost_by_round, task_seconds

# the tuning sample: tasks 0-23 of each language (Python/0-23, CPP/0-23, ...); never report a claim from it alone
TUNING = {f"{prefix}/{i}" for prefix in ("Python", "JavaScript", "Java", "Go", "CPP", "Rust") for i in range(24)}
COST = ("prompt_tokens", "prefill_tokens", "completion_tokens", "reasoning_tokens", "model_calls", "sandbox_runs",
        "length_stops", "suspicious", "errors", "wall_s", "cost_usd")
TITLE = "A run of `python -m flows.evaluate`, as the job recorded it when it ended"
TEXT = ("Written by the job itself (flows/job.py) from its own trajectories: pass@1 after each round with 95% Wilson "
        "intervals, the tuning sample (Python/0-23) and the other tasks apart, cost, each task's verdict at each budget "
        "and, under docs/hidden, the overfit gap. `config` is the run's params; the MLflow run holds every trajectory.")


def rate(rows: list[dict], rnd: int | None = None) -> dict:
    ok = [passed_at(row_verdicts(r), rnd) for r in rows]
    lo, hi = wilson(sum(ok), len(ok))
    return {"passed": sum(ok), "total": len(ok), "pass@1": round(sum(ok) / len(ok), 4) if ok else 0.0,
            "ci95": [round(lo, 4), round(hi, 4)]}


def run_record(run_id: str, status: str, params: dict, rows: list[dict], cost: dict, *, machine: str,
               machine_source: str, git_commit: str | None = None, git_dirty=None,
               trajectories: list[dict] | None = None, usage: dict | None = None) -> dict:
    """One run's record: `rows` as flows/job.py's results rows, `cost` its totals (COST keys), `trajectories` its
    trajectory dicts (Trajectory.to_dict) for the overfit gap under docs/hidden."""
    rows = [r for r in rows if r.get("sample", 0) == 0]
    iters = int(params.get("iters", 0))
    by_bug = defaultdict(list)
    for r in rows:
        by_bug[r.get("bug_type") or "?"].append(r)
    out = {
        "run_id": run_id, "status": status, "params": params,
        "overall": rate(rows), "by_round": [rate(rows, k) for k in range(iters + 1)],
        "tuning_sample_0_23": rate([r for r in rows if r["task_id"] in TUNING]),
        "other_tasks": rate([r for r in rows if r["task_id"] not in TUNING]),
        "by_bug_type": {b: rate(rs) for b, rs in sorted(by_bug.items())},
        "cost": {k: cost[k] for k in COST if k in cost},
        "per_task_mean": {k: round(cost[k] / len(rows), 1 if k != "cost_usd" else 6)
                          for k in ("prompt_tokens", "completion_tokens", "model_calls", "sandbox_runs", "wall_s",
                                    "cost_usd") if cost.get(k) is not None and rows},
        # the time a run's tasks took, cut to its budget (a budget sweep's later jobs only cut the first job's
        # trajectories, so their wall_s is not their cost): comparable between runs on one kind of machine
        "task_seconds": task_seconds(rows), "machine": machine, "machine_source": machine_source,
        # the engine that ran it (the frontier compares seconds only between runs of one machine and one commit)
        "git_commit": git_commit, "git_dirty": git_dirty,
        # each smaller budget's cost per task, summed over tasks (rows that keep per-round costs; None otherwise)
        "cost_by_round": cost_by_round(rows, iters),
        # what a later session needs to pair a new run against this one (no trajectories): each task's verdict at
        # each budget 0..iters
        "verdicts": {f"{r['task_id']}#{r.get('sample', 0)}": row_verdicts(r) for r in rows},
    }
    if cost.get("pass@k"):  # n answers a task: pass@k for each k <= n, with its bootstrap interval over tasks
        out["pass_at_k"] = {str(k): {"value": v, "ci95": cost.get("pass@k_ci95", {}).get(k)}
                            for k, v in cost["pass@k"].items()}
        out["pass_at_k_ci_method"] = cost.get("pass@k_ci_method")
    if usage:  # where the job's time went (flows/usage.py): the machine's CPU, the engine busy and idle
        out["usage"] = usage
    if trajectories is not None:
        gap = overfit_gap(params, [t for t in trajectories if t.get("sample", 0) == 0])
        if gap:
            out["overfit_gap"] = gap
    return out


def from_mlflow(run: dict) -> dict:
    """The record of a run read back by records.load_runs (its results rows, params, metrics and tags)."""
    from .records import run_machine

    machine, source = run_machine(run["run"])
    tags = run["run"].data.tags
    return run_record(run["run_id"], run["run"].info.status, run["params"], run["rows"], run["metrics"],
                      machine=machine, machine_source=source, git_commit=tags.get("git_commit"),
                      git_dirty=tags.get("git_dirty"))


def overfit_gap(params: dict, trajs: list[dict]) -> dict | None:
    """Under `docs`/`hidden` the agent is judged by tests it never saw: how often it stopped satisfied with an answer
    the hidden verdict rejects. The gap is the rate of answers it was satisfied with (passed what it was shown, and
    its self-check agreed when it ran one: stop reason not "unsure") minus the hidden pass rate, paired on the same
    tasks (Newcombe interval)."""
    if params.get("protocol", "tests") == "tests" or not trajs:
        return None
    vis = [passed_what_it_saw(t) for t in trajs]
    sat = [v and t.get("stop_reason") != "unsure" and (t.get("stop_reason") == "solved" or not any(
        (a.get("self_check") or {}).get("held") for a in t["attempts"])) for v, t in zip(vis, trajs)]
    hid = [t["passed_round"] is not None for t in trajs]
    gap = paired(sat, hid)
    out = {"visible_passed": sum(vis), "satisfied": sum(sat), "hidden_passed": sum(hid), "total": len(trajs),
           "gap": round(gap.diff, 4), "ci95": [round(gap.low, 4), round(gap.high, 4)], "visible_only": gap.only_a,
           "hidden_only": gap.only_b}
    if any(a.get("self_check") for t in trajs for a in t["attempts"]):
        out["without_self_check"] = without_self_check(trajs, hid, vis)
    # self_check_scope=task: its groups span rounds, so no own-tests read-back; the held answer's instead
    across = params.get("strategy.self_check_scope", "round") == "task"
    if across and params.get("strategy.held_at_end", "hold") == "hold":  # hand_in: what the run did
        out["held_handed_in"] = held_handed_in(trajs, hid, sat)
    if not across and any((a.get("self_check") or {}).get("own_tests") for t in trajs for a in t["attempts"]):
        out["without_own_tests"] = without_own_tests(trajs, hid, int(params.get("strategy.self_check", 1)))
    return out


def passed_what_it_saw(t: dict) -> bool:
    """A task's trajectory had an answer that passed the tests the agent was shown."""
    return any(((a.get("visible_result") or a.get("result") or {}).get("status") == "passed") for a in t["attempts"])


def candidate_verdict(last: dict, call: int) -> bool:
    """Whether candidate `call` of a recorded round passed the full test (Attempt.candidate_passed)."""
    return Attempt.from_dict(last).candidate_passed(call)


def _vs(p) -> dict:
    return {"diff": round(p.diff, 4), "ci95": [round(p.low, 4), round(p.high, 4)], "only_with": p.only_a,
            "only_without": p.only_b, "p_value": round(p.p_value, 6)}


def without_self_check(trajs: list[dict], hid: list[bool], vis: list[bool]) -> dict:
    """The same answers without the self-check: the round that stopped keeps its first candidate that passed what the
    agent saw (read from the candidates' recorded visible and full-test statuses) and is believed. Paired with the
    self-check's own verdicts."""
    def first_passing(t: dict) -> bool:
        # the first round whose answer passed what the agent saw (self_check_scope=task goes on past it when unsure)
        last = next((a for a in t["attempts"] if a.get("self_check")), None)
        if last is None:
            return t["passed_round"] is not None
        ran = [r["call"] for r in last["rejected"] if r.get("status") == "passed"] + [last["candidate"]]
        return candidate_verdict(last, min(ran))

    off = [first_passing(t) for t in trajs]
    gap = paired(vis, off)  # without the check every answer that passed what it saw is believed
    return {"hidden_passed": sum(off), "satisfied": sum(vis), "gap": round(gap.diff, 4),
            "ci95": [round(gap.low, 4), round(gap.high, 4)], "self_check_vs_none": _vs(paired(hid, off))}


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
    gap = paired(sat, handed)
    return {"hidden_passed": sum(handed), "satisfied": sum(sat), "gap": round(gap.diff, 4),
            "ci95": [round(gap.low, 4), round(gap.high, 4)], "vs_holding": _vs(paired(handed, hid))}


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
    gap = paired(sat, picked)
    return {"hidden_passed": sum(picked), "satisfied": sum(sat), "gap": round(gap.diff, 4),
            "ci95": [round(gap.low, 4), round(gap.high, 4)], "satisfied_but_rejected": gap.only_a,
            "own_tests_vs_none": _vs(paired(hid, picked))}


def at_own_tests_pass(trajs: list[dict], hid: list[bool], need: int, share: float) -> dict:
    """The same answers labelled as if agents/selfcheck.py's SELF_TESTS_PASS had been `share`: it moves only the label
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
