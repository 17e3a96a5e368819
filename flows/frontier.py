"""The cost-accuracy frontier: what each configuration (strategy, budget, candidates, any knob) buys one model on one
protocol, at what cost per task, and which steps up in cost buy something a paired test can see.

    python -m flows.frontier benchmarks/results/fullsize-*.json --model qwen1.5b-coder-q4 --protocol tests
    python -m flows.frontier --sweep PARENT_RUN_ID                 # a -m sweep's jobs, read from MLflow
    python -m flows.frontier RUN_ID RUN_ID ... --out frontier.png --md frontier.md --json frontier.json

Inputs are finished runs: results files written by benchmarks/fullsize.py (which keep per-task outcomes, so they
pair across machines and days), MLflow job run ids, or a sweep's parent. Output: a markdown table on stdout (--md:
also to a file), JSON (--json), a picture (--out: PNG, and an HTML page beside it) and the same PNG and HTML logged
on an MLflow run (the sweep's parent when given one, else a new run tagged fixlab.kind=frontier; --no-mlflow skips).

A configuration counts only if it beats a cheaper one at equal cost (Kapoor et al., "AI Agents That Matter", 2024):
- Pareto set: pass@1 against completion tokens per task (always known), and against seconds per task where those
  compare (same kind of machine and same engine commit, per-task seconds known; records that keep no commit are
  compared across engine versions, and the output says so).
- Each frontier point is paired (exact McNemar on the shared tasks, Newcombe interval; flows.stats) with the next
  cheaper frontier point and with the cheapest configuration whose pass@1 lies inside its 95% interval. A step
  "buys" something only when the paired test says so.
Seconds are the sum of each task's own seconds cut to the budget, per task (`task_seconds` in a record): in a budget
sweep the first job runs every task to the largest budget and the later jobs only cut it, so their wall time is not
their cost. Records made before fullsize kept per-task seconds have no time axis.
"""
from __future__ import annotations

import argparse
import html
import io
import json
import re
import sys
import textwrap
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agents.types import cut_outcome, passed_at, row_outcome

from .markdown import table
from .neutral import result_neutral
from .schema import strategy_knobs, without_retired
from .stats import paired, wilson

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
COSTS = ("prompt_tokens", "completion_tokens", "model_calls", "sandbox_runs")
# Params that say which frontier a record belongs to, or where/how much it ran, not what a configuration is.
NOT_A_KNOB = ("model.name", "protocol", "iters", "answers", "strategy.name", "samples", "dataset.")
ABSENT = "-"  # a knob a record does not have: the run predates it


class FrontierError(ValueError):
    """Input the frontier cannot be drawn from; the message is one line that names the fix."""


@dataclass
class Record:
    """One finished run, as a results file or MLflow keeps it."""
    run_id: str
    source: str  # results file name, or "mlflow"
    recorded: str  # when its file was written (ISO), to pick the newest of reruns
    order: int  # position among the inputs (a later one is newer at equal `recorded`)
    params: dict[str, str]
    status: str
    passed: int
    total: int
    cost: dict[str, float]  # per task: prompt_tokens, completion_tokens, model_calls, sandbox_runs
    # "task#sample" -> first passing round (None: never), or a verdict per budget (agents/types.py Outcome); None: not kept
    outcomes: dict[str, int | list[bool] | None] | None
    seconds: float | None  # per task: the tasks' own seconds cut to the budget, summed, / tasks; None: not known
    machine: str
    machine_source: str  # "tag", "recorder" (where fullsize ran), "file text", "unknown"
    commit: str | None = None  # the engine's git commit ("+dirty": uncommitted changes); None: not recorded


@dataclass
class Config:
    label: str
    family: str  # the label without the budget: one line in the picture
    strategy: str
    iters: int
    knobs: dict[str, str]
    run_id: str
    source: str
    machine: str
    passed: int
    total: int
    pass_at_1: float
    ci95: tuple[float, float]
    cost: dict[str, float]
    seconds: float | None
    paired: bool  # per-task outcomes kept
    reruns: list[str] = field(default_factory=list)  # other records of this configuration ("run_id (file)")
    commit: str | None = None  # the engine's git commit; None: not recorded
    on_token_frontier: bool = False
    on_time_frontier: bool = False
    outcomes: dict[str, int | None] | None = field(default=None, repr=False)  # for pairing; not in the JSON


@dataclass
class Step:
    """A frontier point paired with a cheaper configuration."""
    point: str
    against: str
    why: str  # "next cheaper frontier point", "cheapest inside its interval", or both
    axis: str  # "completion tokens" or "seconds"
    cost_ratio: float | None
    shared_tasks: int
    diff: float  # pass@1 of the point minus the other's, on the shared tasks
    ci95: tuple[float, float]
    only_point: int  # tasks the point fixed and the other did not
    only_against: int
    p_value: float  # exact McNemar
    buys: bool  # the point is better and the test says so (p < 0.05)
    text: str


@dataclass
class Frontier:
    model: str
    protocol: str
    tasks: int
    configs: list[Config]
    token_frontier: list[str]
    time_frontier: list[str]
    time_machine: str | None
    steps: list[Step]
    notes: list[str]
    time_commit: str | None = None  # the engine commit the seconds compare at; None: not recorded (they may mix)

    @property
    def time_where(self) -> str | None:
        """Where the seconds axis compares: the machine and the engine commit, or that the commits mix."""
        if self.time_machine is None:
            return None
        return f"{self.time_machine}, " + (f"engine {self.time_commit}" if self.time_commit else
                                           "engine commits not recorded, may mix")

    def config(self, label: str) -> Config:
        return next(c for c in self.configs if c.label == label)

    def to_dict(self) -> dict:
        d = json.loads(json.dumps(asdict(self)))
        for c in d["configs"]:
            c.pop("outcomes")
        return d

    def markdown(self) -> str:
        return markdown(self)

    def html(self) -> str:
        return html_page(self)


# ---------------------------------------------------------------------------------------------------- reading

def machine_from_text(text: str) -> str | None:
    """Older results files keep no machine: their file name or command text may name its kind (EPYC / Xeon)."""
    low = text.lower()
    return "AMD EPYC" if "epyc" in low else "Intel Xeon" if "xeon" in low else None


def task_seconds(rows: list[dict]) -> float | None:
    """The sum of the tasks' own seconds (a cut trajectory's are its rounds'); None if any task lacks them."""
    secs = [r.get("seconds") for r in rows]
    if not secs or any(s is None for s in secs):
        return None
    return round(sum(secs), 3)


ROUND_COSTS = ("prompt_tokens", "completion_tokens", "model_calls", "sandbox_runs")


def cost_by_round(rows: list[dict], iters: int) -> list[dict] | None:
    """[cost after round 0, after round 1, ...]: each cost summed over tasks and over the rounds up to that one, and
    the tasks' seconds the same way (a stream-cut task's seconds are apportioned: `derived_from`). None when the rows
    keep no per-round cost (runs logged before results.jsonl kept it)."""
    attempts = [a for r in rows for a in r.get("attempts") or ()]
    if not attempts or any(k not in a for a in attempts for k in ROUND_COSTS):
        return None
    out = []
    for k in range(iters + 1):
        upto = [a for r in rows for a in r["attempts"] if a["round"] <= k]
        c = {key: sum(a[key] for a in upto) for key in ROUND_COSTS}
        # a cut (derived) trajectory's seconds are the stream's, apportioned: spread them by completion tokens
        secs = 0.0
        for r in rows:
            mine = [a for a in r["attempts"] if a["round"] <= k]
            if r.get("derived_from"):
                total = sum(a["completion_tokens"] for a in r["attempts"]) or 1
                secs += r["seconds"] * sum(a["completion_tokens"] for a in mine) / total
            else:
                secs += sum(a.get("seconds") or 0.0 for a in mine)
        c["task_seconds"] = round(secs, 3)
        out.append(c)
    return out


def commit_of(sha: str | None, dirty) -> str | None:
    """A run's engine commit as the frontier compares it: the short sha, "+dirty" for uncommitted changes."""
    if not sha or sha == "unknown":
        return None
    return sha[:12] + ("+dirty" if str(dirty).lower() == "true" else "")


def run_machine(run) -> tuple[str, str]:
    """The machine a run ran on: its fixlab.machine tag, else this machine (where its record is being made)."""
    from .tracking import machine_name

    tag = run.data.tags.get("fixlab.machine")
    return (tag, "tag") if tag else (machine_name(), "recorder")


def _per_task_cost(rec: dict, total: int) -> dict[str, float]:
    if rec.get("cost") and total:
        return {k: rec["cost"][k] / total for k in COSTS if k in rec["cost"]}
    return {k: float(v) for k, v in (rec.get("per_task_mean") or {}).items() if k in COSTS}


def records_from_file(path: Path, order: int = 0) -> list[Record]:
    """The runs of a results file (benchmarks/fullsize.py's format, or a file in its shape)."""
    try:
        doc = json.loads(Path(path).read_text())
        runs = doc["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FrontierError(f"{path}: not a results file with a 'runs' list ({type(e).__name__}); give files that "
                            "benchmarks/fullsize.py wrote") from None
    guess = machine_from_text(f"{Path(path).name} {doc.get('command', '')}")
    out = []
    for i, r in enumerate(runs):
        try:
            total = int(r["overall"]["total"])
            secs = r.get("task_seconds")
            machine, src = (r["machine"], r.get("machine_source", "recorded")) if r.get("machine") else \
                (f"{guess} (file text)", "file text") if guess else ("unknown", "unknown")
            rec = Record(
                run_id=r["run_id"], source=Path(path).name, recorded=str(doc.get("recorded", "")), order=order * 1000 + i,
                params=param_values(r["params"]), status=r.get("status", "FINISHED"),
                passed=int(r["overall"]["passed"]), total=total, cost=_per_task_cost(r, total),
                outcomes=r.get("first_pass_round"), seconds=round(secs / total, 3) if secs is not None and total
                else None, machine=machine,
                machine_source=src, commit=commit_of(r.get("git_commit"), r.get("git_dirty")))
            out += budgets(rec, r.get("cost_by_round"))
        except (KeyError, TypeError, ValueError) as e:
            raise FrontierError(f"{path}: run {i} lacks {e} (run_id, params, overall); record it with "
                                "benchmarks/fullsize.py") from None
    return out


def param_values(params: dict) -> dict[str, str]:
    """Params as strings, a whole number written one way: the typed config logs `10.0` where older runs logged `10`,
    and the same setting must not read as a knob that differs. A knob retired since the run, at the default it had,
    is dropped (flows/schema.py RETIRED): the same configuration as a newer run without it. A local model's run from
    before the path was recorded (agents/serving/paths.py) took fixlab's engine, with int8 weights where `weights`
    was auto or int8 (all of them ran on CPUs): filled in, so that such a run is never pooled with a run that took
    another path."""
    out = without_retired({k: re.sub(r"^(-?\d+)\.0+$", r"\1", str(v)) for k, v in params.items()})
    # a run from before a strategy knob existed did what the knob's `before` value does (agents/config.py field
    # metadata): filled in, so the older run groups with newer ones that log it
    for key, before in strategy_knobs(out.get("strategy.name")).items():
        out.setdefault(key, before)
    if out.get("model.backend") == "transformers" and "serving.runtime" not in out:
        out["serving.runtime"] = "engine"
        out.setdefault("serving.weights", "int8" if out.get("model.weights") in ("auto", "int8") else "dtype")
    return out


def budgets(rec: Record, cost_by_round: list[dict] | None) -> list[Record]:
    """A run with per-round costs holds every smaller budget too (rounds never depend on the budget: agents/loop.py):
    one record per budget, its outcomes and costs cut to that round. Without them, the run's own budget only."""
    if not cost_by_round or not rec.outcomes:
        return [rec]
    out = []
    for b, cost in enumerate(cost_by_round):
        outcomes = {t: cut_outcome(f, b) for t, f in rec.outcomes.items()}
        out.append(Record(
            run_id=rec.run_id, source=rec.source, recorded=rec.recorded, order=rec.order,
            params={**rec.params, "iters": str(b)}, status=rec.status,
            passed=sum(passed_at(f) for f in outcomes.values()), total=rec.total,
            cost={k: cost[k] / rec.total for k in COSTS if k in cost},
            outcomes=outcomes, seconds=round(cost["task_seconds"] / rec.total, 3)
            if cost.get("task_seconds") is not None else None,
            machine=rec.machine, machine_source=rec.machine_source, commit=rec.commit))
    return out


def records_from_files(paths: list[Path]) -> list[Record]:
    """The runs of several results files, in order (a later file's record of the same run wins at equal dates);
    e.g. `frontier(records_from_files(sorted(RESULTS.glob("fullsize-*.json"))), model=..., protocol=...)`."""
    return [rec for i, f in enumerate(paths) for rec in records_from_file(f, order=i)]


def record_from_run(run: dict, order: int = 0) -> Record:
    """A job run read back by flows.compare.load_runs, as a Record (the fields benchmarks/fullsize.py keeps)."""
    rows = [r for r in run["rows"] if r.get("sample", 0) == 0]
    firsts = {f"{r['task_id']}#0": row_outcome(r) for r in rows}
    m = run["metrics"]
    machine, src = run_machine(run["run"])
    total = len(rows)
    secs = task_seconds(rows)
    start = run["run"].info.start_time or 0
    return Record(run_id=run["run_id"], source="mlflow",
                  recorded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start / 1000)), order=order,
                  params=param_values(run["params"]), status=run["run"].info.status,
                  passed=sum(passed_at(f) for f in firsts.values()), total=total,
                  cost={k: m[k] / total for k in COSTS if k in m and total}, outcomes=firsts,
                  seconds=None if secs is None or not total else round(secs / total, 3), machine=machine,
                  machine_source=src, commit=commit_of(run["run"].data.tags.get("git_commit"),
                                                       run["run"].data.tags.get("git_dirty")))


# ---------------------------------------------------------------------------------------------------- configurations

def _knob_name(k: str) -> str:
    return k[len("strategy."):] if k.startswith("strategy.") else k


def _is_knob(k: str) -> bool:
    return not result_neutral(k) and not any(k == n or (n.endswith(".") and k.startswith(n)) for n in NOT_A_KNOB)


def _identity(r: Record, keys: list[str]) -> tuple:
    return (r.params.get("strategy.name", "?"), int(r.params.get("iters", 0)),
            tuple((k, r.params.get(k, ABSENT)) for k in keys))


def _labels(records: list[Record]) -> dict[int, tuple[str, str, dict]]:
    """id(record) -> (label, family, knobs); by record, not run id, as one run may hold several points. A strategy's
    knobs count against runs of the same strategy only (react's max_turns is not a difference from single_shot); a
    knob is named on the runs whose value is not the usual one for that strategy (e.g. `candidates=2`), so the plain
    label is the common setting."""
    strategy_of = {id(r): r.params.get("strategy.name", "?") for r in records}
    keys = sorted({k for r in records for k in r.params if _is_knob(k)})
    knobs: dict[int, dict[str, str]] = {id(r): {} for r in records}  # every knob that differs in its scope
    shown: dict[int, list[str]] = {id(r): [] for r in records}  # those not at their usual value
    for k in keys:
        groups: dict[str, list[Record]] = {}
        for r in records:
            groups.setdefault(strategy_of[id(r)] if k.startswith("strategy.") else "", []).append(r)
        for rs in groups.values():
            vals = Counter(r.params.get(k, ABSENT) for r in rs)
            if len(set(vals) - {ABSENT}) < 2:  # one value where set: a knob added or retired later is no difference
                continue
            usual = max(sorted(vals), key=lambda v: (vals[v], v != ABSENT))
            for r in rs:
                knobs[id(r)][k] = r.params.get(k, ABSENT)
                if knobs[id(r)][k] != usual:
                    shown[id(r)].append(k)
    out = {}
    for r in records:
        family = " ".join([strategy_of[id(r)]] + [f"{_knob_name(k)}={knobs[id(r)][k]}" for k in shown[id(r)]])
        out[id(r)] = (f"{family} iters={int(r.params.get('iters', 0))}", family, knobs[id(r)])
    return out


def _select(records: list[Record], model: str | None, protocol: str | None) -> tuple[list[Record], str, str]:
    def pick(what: str, flag: str, key: str, default: str, want: str | None, rs: list[Record]) -> tuple[list, str]:
        values = sorted({r.params.get(key, default) for r in rs})
        if want is None:
            if len(values) > 1:
                raise FrontierError(f"the records cover {len(values)} {what}s ({', '.join(values)}): one frontier is "
                                    f"for one {what}; pick one with {flag} NAME")
            return rs, values[0]
        chosen = [r for r in rs if r.params.get(key, default) == want]
        if not chosen:
            raise FrontierError(f"no record has {what} {want!r} (there: {', '.join(values)}); fix {flag}")
        return chosen, want

    if not records:
        raise FrontierError("no records: give results files, run ids or --sweep PARENT_RUN_ID")
    records, m = pick("model", "--model", "model.name", "?", model, records)
    records, p = pick("protocol", "--protocol", "protocol", "tests", protocol, records)
    return records, m, p


def configurations(records: list[Record], use: tuple[str, ...] = ()) -> tuple[list[Config], list[str]]:
    """One Config per configuration (reruns collapsed to the newest record, or the one --use names), and notes
    on what was left out or collapsed."""
    notes = []
    # One run recorded in two files: the newer record. Keyed by run and params, as one run may hold several points
    # (a grid over candidates x budgets recorded from one run, each point with its own params).
    seen: dict[tuple, Record] = {}
    for r in records:
        key = (r.run_id, tuple(sorted(r.params.items())))
        if key not in seen or (r.recorded, r.order) > (seen[key].recorded, seen[key].order):
            seen[key] = r
    records = list(seen.values())
    unfinished = [r for r in records if r.status != "FINISHED"]
    for r in unfinished:
        notes.append(f"left out {r.run_id[:8]} ({r.source}): status {r.status}, not a finished run")
    records = [r for r in records if r.status == "FINISHED"]
    if not records:
        raise FrontierError("no finished run among the records")
    full = max(r.total for r in records)
    short: dict[tuple[str, int], list[str]] = {}
    for r in records:
        if r.total < full:
            short.setdefault((r.source, r.total), []).append(r.run_id[:8])
    for (src, n), ids in short.items():
        notes.append(f"left out {', '.join(ids)} ({src}): {'they cover' if len(ids) > 1 else 'it covers'} {n} of "
                     f"{full} tasks, so pass@1 there is not comparable")
    records = [r for r in records if r.total == full]
    labels = _labels(records)
    keys = sorted({k for r in records for k in labels[id(r)][2]})
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(_identity(r, keys), []).append(r)
    configs = []
    for rs in groups.values():
        rs.sort(key=lambda r: (r.recorded, r.order), reverse=True)
        picked = [r for r in rs if any(r.run_id.startswith(u) for u in use)]
        chosen = picked[0] if picked else rs[0]
        label, family, knobs = labels[id(chosen)]
        others = [f"{r.run_id[:8]} ({r.source}, {r.passed}/{r.total})" for r in rs if r is not chosen]
        if others:
            how = "chosen with --use" if picked else "the newest record"
            notes.append(f"{label}: {len(rs)} runs of this configuration; used {chosen.run_id[:8]} ({chosen.source}, "
                         f"{chosen.passed}/{chosen.total}, {how}); also {', '.join(others)} (--use RUN_ID picks one)")
        lo, hi = wilson(chosen.passed, chosen.total)
        configs.append(Config(
            label=label, family=family, strategy=chosen.params.get("strategy.name", "?"),
            iters=int(chosen.params.get("iters", 0)), knobs=knobs, run_id=chosen.run_id, source=chosen.source,
            machine=chosen.machine, passed=chosen.passed, total=chosen.total,
            pass_at_1=round(chosen.passed / chosen.total, 4) if chosen.total else 0.0,
            ci95=(round(lo, 4), round(hi, 4)), cost={k: round(v, 2) for k, v in chosen.cost.items()},
            seconds=chosen.seconds, paired=bool(chosen.outcomes), reruns=others, outcomes=chosen.outcomes,
            commit=chosen.commit))
    configs.sort(key=lambda c: (c.cost.get("completion_tokens", 0.0), c.pass_at_1, c.label))
    return configs, notes


# ---------------------------------------------------------------------------------------------------- frontier

def pareto(points: list[tuple[str, float, float]]) -> list[str]:
    """Labels of the points (label, cost, pass@1) no other point beats: none costs no more and scores no less
    with one of the two strictly. Cheapest first. A point that passes nothing is beaten by handing nothing in (no
    cost), so it is never on the frontier (a budget too small for any answer to be handed in, e.g. agreement needs
    two)."""
    out = [(c, -p, lab) for lab, c, p in points
           if p > 0 and not any(c2 <= c and p2 >= p and (c2 < c or p2 > p) for _, c2, p2 in points)]
    return [lab for _, _, lab in sorted(out)]


def pair_step(point: Config, against: Config, why: str, axis: str, cost_of) -> Step:
    """The paired verdict of one frontier point against one cheaper configuration, in words."""
    ratio = round(cost_of(point) / cost_of(against), 3) if cost_of(against) else None
    unit = "the completion tokens" if axis == "completion tokens" else "the seconds"
    at = f"{ratio:.1f}x {unit} per task" if ratio is not None else f"more {axis}"
    a, b = point.outcomes, against.outcomes  # both kept: only paired configurations are placed
    keys = sorted(set(a) & set(b))
    res = paired([passed_at(a[k]) for k in keys], [passed_at(b[k]) for k in keys])
    buys = res.p_value < 0.05 and res.diff > 0
    worse = res.p_value < 0.05 and res.diff < 0
    word = "buys something" if buys else "is worse" if worse else "buys nothing the paired test can see"
    return Step(point.label, against.label, why, axis, ratio, res.n, round(res.diff, 6),
                (round(res.low, 6), round(res.high, 6)), res.only_a, res.only_b, round(res.p_value, 6), buys,
                f"{point.label} against {against.label} ({why}; {at}): {word}. "
                f"{res.verdict(point.label, against.label)}")


def steps_along(front: list[str], configs: list[Config], axis: str, cost_of) -> list[Step]:
    by = {c.label: c for c in configs}
    steps = []
    for i, lab in enumerate(front):
        p = by[lab]
        nxt = by[front[i - 1]] if i else None
        cheaper = [c for c in configs if cost_of(c) is not None and cost_of(c) < cost_of(p)
                   and p.ci95[0] <= c.pass_at_1 <= p.ci95[1]]
        inside = min(cheaper, key=lambda c: (cost_of(c), -c.pass_at_1, c.label), default=None)
        if nxt is not None and inside is not None and inside.label == nxt.label:
            steps.append(pair_step(p, nxt, "next cheaper frontier point, and the cheapest inside its interval",
                                   axis, cost_of))
            continue
        if nxt is not None:
            steps.append(pair_step(p, nxt, "next cheaper frontier point", axis, cost_of))
        if inside is not None:
            steps.append(pair_step(p, inside, "cheapest configuration inside its interval", axis, cost_of))
    return steps


def frontier(records: list[Record], model: str | None = None, protocol: str | None = None,
             use: tuple[str, ...] = (), paired_only: bool = False) -> Frontier:
    """The frontier of one model on one protocol over the given records (results-file or MLflow runs).
    Configurations whose record keeps no per-task outcomes are listed but not placed on the frontier (a frontier
    point must be paired); `paired_only` leaves them out of the table too."""
    records, model, protocol = _select(records, model, protocol)
    if paired_only:
        dropped = sorted({r.run_id[:8] for r in records if not r.outcomes})
        records = [r for r in records if r.outcomes]
        if not records:
            raise FrontierError("no record keeps per-task outcomes; record the runs again with benchmarks/fullsize.py "
                                "or drop --paired-only")
    configs, notes = configurations(records, use)
    if paired_only and dropped:
        notes.append(f"left out {len(dropped)} runs without per-task outcomes (--paired-only): {', '.join(dropped)}")
    unplaced = [c.label for c in configs if not c.paired]
    if unplaced:
        notes.append(f"not placed on the frontier, no per-task outcomes to pair (recorded before benchmarks/fullsize.py "
                     f"kept them): {', '.join(unplaced)}")
    placed = [c for c in configs if c.paired]
    tok = lambda c: c.cost.get("completion_tokens")  # noqa: E731
    token_front = pareto([(c.label, tok(c), c.pass_at_1) for c in placed if tok(c) is not None])
    # Seconds compare only on one kind of machine at one engine commit: the pair most timed configurations ran on.
    # Records that keep no commit (None) are one group, which may mix engine versions: the output says so.
    timed = [c for c in placed if c.seconds is not None]
    engines = Counter((c.machine, c.commit) for c in timed)
    time_machine, time_commit = max(sorted(engines, key=lambda e: (e[0], e[1] or "")), key=lambda e: engines[e]) \
        if engines else (None, None)
    on_machine = [c for c in timed if (c.machine, c.commit) == (time_machine, time_commit)]
    time_front = pareto([(c.label, c.seconds, c.pass_at_1) for c in on_machine]) if len(on_machine) > 1 else []
    left = [c.label for c in timed if (c.machine, c.commit) != (time_machine, time_commit)]
    if left:
        where = time_machine + (f" at engine {time_commit}" if time_commit else " (engine commit not recorded)")
        notes.append(f"seconds of {', '.join(left)} left off the time axis: run on another machine or engine commit "
                     f"than {where}")
    for c in configs:
        c.on_token_frontier = c.label in token_front
        c.on_time_frontier = c.label in time_front
    steps = steps_along(token_front, placed, "completion tokens", tok)
    if time_front:
        steps += steps_along(time_front, on_machine, "seconds", lambda c: c.seconds)
    return Frontier(model=model, protocol=protocol, tasks=max(c.total for c in configs), configs=configs,
                    token_frontier=token_front, time_frontier=time_front,
                    time_machine=time_machine if time_front else None, steps=steps, notes=notes,
                    time_commit=time_commit if time_front else None)


# ---------------------------------------------------------------------------------------------------- output

def _fmt_p(p: float) -> str:
    return f"{p:.2g}"  # 0.052, not 0.05: a p-value just above the line must not read as on it


def _short(s: Step) -> str:
    word = "buys" if s.buys else "worse" if s.p_value < 0.05 else "no significant gain"
    return f"vs {s.against}: {s.diff * 100:+.1f} (p = {_fmt_p(s.p_value)}), {word}"


def _where(c: Config) -> str:
    if not c.paired:
        return "not placed (unpaired)"
    return ", ".join(x for x, on in (("tokens", c.on_token_frontier), ("seconds", c.on_time_frontier)) if on) or "no"


def table_rows(fr: Frontier) -> tuple[list[str], list[list[str]]]:
    machines = {c.machine for c in fr.configs}
    commits = {c.commit for c in fr.configs}
    engine = len(commits) > 1  # a column only where the records name more than one commit (or some none)
    head = ["configuration", "pass@1 [95% CI]", "passed", "prompt tok", "completion tok", "model calls",
            "sandbox runs", "seconds"] + (["machine"] if len(machines) > 1 else []) + (["engine"] if engine else []) \
        + ["frontier", "paired verdict"]
    rows = []
    for c in fr.configs:
        verdict = "; ".join(_short(s) for s in fr.steps if s.point == c.label and s.axis == "completion tokens")
        if c.on_token_frontier and not verdict:
            verdict = "cheapest configuration"
        rows.append([c.label, f"{c.pass_at_1:.3f} [{c.ci95[0]:.3f}, {c.ci95[1]:.3f}]", f"{c.passed}/{c.total}",
                     f"{c.cost.get('prompt_tokens', 0):,.0f}", f"{c.cost.get('completion_tokens', 0):,.0f}",
                     f"{c.cost.get('model_calls', 0):.1f}", f"{c.cost.get('sandbox_runs', 0):.1f}",
                     "-" if c.seconds is None else f"{c.seconds:.1f}"]
                    + ([c.machine] if len(machines) > 1 else []) + ([c.commit or "-"] if engine else [])
                    + [_where(c), verdict])
    return head, rows


def _time_line(fr: Frontier) -> str:
    if fr.time_frontier and fr.time_commit:
        return (f"seconds: each task's own seconds cut to the budget, per task, on {fr.time_machine} at engine "
                f"{fr.time_commit} (compared only there); '-' where the record keeps no per-task seconds")
    if fr.time_frontier:
        return (f"seconds: each task's own seconds cut to the budget, per task, on {fr.time_machine} (compared only "
                "there, but across engine versions: these records keep no git commit, so a faster engine reads as a "
                "cheaper configuration); '-' where the record keeps no per-task seconds")
    return ("seconds: not compared (no two configurations with per-task seconds on one machine and engine commit; "
            "records made before benchmarks/fullsize.py kept them have none)")


def verdict_words(fr: Frontier) -> str:
    """The frontier in one paragraph: which strategies lie on it, which lie off it, and what its steps buy."""
    placed = [c for c in fr.configs if c.paired]
    on = [c for c in placed if c.on_token_frontier]
    if not on:
        return "No configuration keeps per-task outcomes, so none is placed on the frontier."
    fams = list(dict.fromkeys(c.family for c in on))
    off = sorted({c.strategy for c in placed} - {c.strategy for c in on})
    steps = [s for s in fr.steps if s.axis == "completion tokens" and "next cheaper" in s.why]
    bought = [s for s in steps if s.buys]
    def span(f: str) -> str:
        its = sorted(c.iters for c in on if c.family == f)
        return f"{f} at iters={its[0]}" + (f"-{its[-1]}" if len(its) > 1 else "")
    text = (f"On completion tokens the frontier is {' and '.join(span(f) for f in fams)} ({len(on)} point"
            f"{'s' if len(on) > 1 else ''}, pass@1 {on[0].pass_at_1:.3f} to {on[-1].pass_at_1:.3f})")
    text += f"; {', '.join(off)} lie{'s' if len(off) == 1 else ''} off it." if off else "."
    if steps:
        text += (f" Of its {len(steps)} steps to the next cheaper point, {len(bought)} buy{'s' if len(bought) == 1 else ''}"
                 " something the paired test sees" + (": " + "; ".join(
                     f"{s.point} over {s.against} ({s.diff * 100:+.1f} points, p = {_fmt_p(s.p_value)})"
                     for s in bought) if bought else "") + ".")
        inside = [s for s in fr.steps if s.axis == "completion tokens" and "cheapest" in s.why]
        if inside:
            text += (f" Against the cheapest configuration inside its interval, {sum(s.buys for s in inside)} of "
                     f"{len(inside)} frontier points buy something.")
    dominated = [c for c in placed if not c.on_token_frontier and any(
        o.pass_at_1 >= c.pass_at_1 and o.cost.get("completion_tokens", 0) < c.cost.get("completion_tokens", 0)
        and o.family != c.family for o in on) and c.strategy == on[0].strategy]
    if dominated:
        n = len(dominated)
        text += (f" {n} other {on[0].strategy} configuration{'s are' if n > 1 else ' is'} matched or beaten by a "
                 "frontier point at fewer completion tokens.")
    return text


def markdown(fr: Frontier) -> str:
    head, rows = table_rows(fr)
    machines = sorted({c.machine for c in fr.configs})
    lines = [f"Cost-accuracy frontier: {fr.model}, protocol `{fr.protocol}`, {fr.tasks} tasks, {len(fr.configs)} "
             f"configurations; costs per task; machine{'s' if len(machines) > 1 else ''}: {'; '.join(machines)}. "
             + _time_line(fr) + ".", "", *table(head, rows)]
    lines += ["", "In words: " + verdict_words(fr), ""]
    lines += ["Frontier on completion tokens per task (cheapest first): " + (" < ".join(fr.token_frontier) or "-")]
    if fr.time_frontier:
        lines.append(f"Frontier on seconds per task ({fr.time_where}): " + " < ".join(fr.time_frontier))
    lines += ["", "Paired verdicts (exact McNemar on the shared tasks, 95% Newcombe interval of the difference):"]
    for s in fr.steps:
        lines.append(f"- [{s.axis}] {s.text}")
    if not fr.steps:
        lines.append("- one frontier point: nothing cheaper to pair it with")
    if fr.notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in fr.notes]
    return "\n".join(lines) + "\n"


def figure(fr: Frontier):
    """pass@1 with its 95% interval against completion tokens per task (and seconds per task where they compare):
    one colour per configuration family, points labelled by budget, the frontier drawn as a black line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = [("completion tokens per task", lambda c: c.cost.get("completion_tokens"), fr.token_frontier)]
    if fr.time_frontier:
        axes_spec.append((f"seconds per task ({fr.time_where})", lambda c: c.seconds
                          if (c.machine, c.commit) == (fr.time_machine, fr.time_commit) else None, fr.time_frontier))
    fig, axes = plt.subplots(1, len(axes_spec), figsize=(6.5 * len(axes_spec) + 3.2, 5.2), dpi=110, squeeze=False)
    families = list(dict.fromkeys(c.family for c in fr.configs))
    colours = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    by = {c.label: c for c in fr.configs}
    for ax, (xlabel, cost_of, front) in zip(axes[0], axes_spec):
        for fam in families:
            pts = sorted(((cost_of(c), c) for c in fr.configs if c.family == fam and cost_of(c) is not None),
                         key=lambda xc: (xc[0], xc[1].iters))
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ys = [c.pass_at_1 for _, c in pts]
            err = [[c.pass_at_1 - c.ci95[0] for _, c in pts], [c.ci95[1] - c.pass_at_1 for _, c in pts]]
            placed = all(c.paired for _, c in pts)  # unpaired runs are shown hollow: never on the frontier
            ax.plot(xs, ys, color=colours[fam], alpha=0.35, linewidth=1)
            ax.errorbar(xs, ys, yerr=err, fmt="o", color=colours[fam], capsize=3, markersize=5,
                        mfc=None if placed else "white", alpha=1.0 if placed else 0.5,
                        label=textwrap.fill(fam if placed else f"{fam} (unpaired)", 44, subsequent_indent="  "))
            for x, c in pts:
                ax.annotate(f"i{c.iters}", (x, c.pass_at_1), textcoords="offset points", xytext=(5, -10), fontsize=7,
                            color=colours[fam], fontweight="bold" if c.label in front else "normal")
        if front:
            ax.plot([cost_of(by[l]) for l in front], [by[l].pass_at_1 for l in front], color="black", linewidth=2,
                    zorder=0, label="frontier")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("pass@1 (bars: 95% Wilson interval)")
        ax.grid(alpha=0.3)
        ax.set_ylim(max(-0.02, min(c.ci95[0] for c in fr.configs) - 0.05),
                    min(1.02, max(c.ci95[1] for c in fr.configs) + 0.05))
    # One legend for both panels, from the token panel: it holds every family (the seconds panel only the timed ones).
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       title="configuration (iN: iters=N)", title_fontsize=7)
    fig.suptitle(f"{fr.model}, protocol {fr.protocol}: pass@1 against cost per task, {fr.tasks} tasks", fontsize=10)
    fig.tight_layout()
    return fig


def png_bytes(fr: Frontier) -> bytes:
    import matplotlib.pyplot as plt

    fig = figure(fr)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def svg_text(fr: Frontier) -> str:
    import matplotlib.pyplot as plt

    fig = figure(fr)
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def html_page(fr: Frontier) -> str:
    """One self-contained page (inline SVG, no scripts, no outside links) that the MLflow UI shows as an artifact."""
    e = html.escape
    head, rows = table_rows(fr)
    grid = ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr" + (' class="front"' if r[-2] not in ("no", "not placed (unpaired)") else "") + ">"
                      + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in rows) + "</table>")
    verdicts = "".join(f"<li>[{e(s.axis)}] {e(s.text)}</li>" for s in fr.steps)
    notes = "".join(f"<li>{e(n)}</li>" for n in fr.notes)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>fixlab frontier: {e(fr.model)} {e(fr.protocol)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0; color: #1a1a1a; font-size: 13px; }}
header {{ background: #0b6e4f; color: #fff; padding: 8px 16px; }}
header h1 {{ margin: 0; font-size: 15px; }}
h2 {{ font-size: 14px; }}
main {{ padding: 8px 16px; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; }}
tr.front td {{ background: #e8f4ef; font-weight: 600; }}
li {{ font-size: 13px; margin: 3px 0; }}
svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<header><h1>Cost-accuracy frontier: {e(fr.model)}, protocol {e(fr.protocol)}, {fr.tasks} tasks</h1></header>
<main>
<p>Frontier on completion tokens per task: {e(" < ".join(fr.token_frontier))}</p>
{svg_text(fr)}
<p>Costs per task. {e(_time_line(fr))}.</p>
{grid}
<h2>Paired verdicts</h2><p>Exact McNemar on the shared tasks, 95% Newcombe interval of the difference.</p>
<ul>{verdicts}</ul>
{"<h2>Notes</h2><ul>" + notes + "</ul>" if notes else ""}
</main></body></html>
"""


def log_to_mlflow(client, fr: Frontier, run_id: str | None = None, experiment: str = "humanevalfix",
                  sources: list[str] = ()) -> str:
    """Log the picture (frontier.png), the page (frontier.html), the table (frontier.md) and the numbers
    (frontier.json) on `run_id` (a sweep's parent), or on a new run tagged fixlab.kind=frontier."""
    import matplotlib.pyplot as plt

    from .tracking import git_state

    created = run_id is None
    if created:
        exp = client.get_experiment_by_name(experiment)
        uri = str(client.tracking_uri)
        where = (Path(uri[len("sqlite:///"):]).parent / "artifacts").resolve().as_uri() if uri.startswith("sqlite:///") \
            else None  # beside the store, as RunTracker puts a job's artifacts
        exp_id = exp.experiment_id if exp else client.create_experiment(experiment, artifact_location=where)
        run = client.create_run(exp_id, run_name=f"frontier {fr.model} {fr.protocol}", tags={
            **git_state(), "fixlab.kind": "frontier", "model": fr.model, "protocol": fr.protocol,
            "frontier.sources": " ".join(sources)[:5000]})
        run_id = run.info.run_id
    fig = figure(fr)
    client.log_figure(run_id, fig, "frontier.png")
    plt.close(fig)
    client.log_text(run_id, fr.html(), "frontier.html")
    client.log_text(run_id, fr.markdown(), "frontier.md")
    client.log_dict(run_id, fr.to_dict(), "frontier.json")
    client.set_tag(run_id, "frontier.token_frontier", " < ".join(fr.token_frontier)[:5000])
    if created:
        client.set_terminated(run_id, "FINISHED")
    return run_id


# ---------------------------------------------------------------------------------------------------- command

def _read_inputs(inputs: list[str], sweep: str | None, uri: str) -> tuple[list[Record], object]:
    files, run_ids = [], []
    for x in inputs:
        p = Path(x)
        if p.is_dir():
            files += sorted(p.glob("fullsize-*.json"))
        elif p.exists():
            files.append(p)
        elif re.fullmatch(r"[0-9a-f]{32}", x):
            run_ids.append(x)
        else:
            raise FrontierError(f"{x}: no such results file, and not an MLflow run id (32 hex digits)")
    if not files and not run_ids and not sweep:
        files = sorted(RESULTS.glob("fullsize-*.json"))
    records = records_from_files(files)
    client = None
    if run_ids or sweep:
        import mlflow
        from mlflow.exceptions import MlflowException

        from .compare import load_runs

        client = mlflow.MlflowClient(uri)
        try:
            if sweep:
                parent = client.get_run(sweep)
                children = client.search_runs([parent.info.experiment_id],
                                              f"tags.`mlflow.parentRunId` = '{sweep}'",
                                              order_by=["attributes.start_time ASC"], max_results=1000)
                run_ids += [c.info.run_id for c in children]
                if not children:
                    raise FrontierError(f"--sweep {sweep}: that run has no jobs under it; give a sweep's parent run")
            runs = load_runs(client, run_ids)
        except (MlflowException, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FrontierError(f"cannot read the runs from {uri}: {first} (check the run ids and --tracking-uri)") from None
        base = len(files) * 1000
        records += [rec for i, r in enumerate(runs)
                    for rec in budgets(record_from_run(r, order=base + i),
                                       cost_by_round([x for x in r["rows"] if x.get("sample", 0) == 0],
                                                     int(r["params"].get("iters", 0))))]
    return records, client


def main(argv: list[str] | None = None) -> int:
    from .schema import TrackingConf
    from .tracking import tracking_uri

    ap = argparse.ArgumentParser(prog="python -m flows.frontier", description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="results files (or a folder of fullsize-*.json) and/or MLflow job run "
                    "ids; none: benchmarks/results/fullsize-*.json")
    ap.add_argument("--sweep", help="a sweep's parent run id: its jobs, and the picture logged on it")
    ap.add_argument("--model", help="the model (params model.name) when the records cover several")
    ap.add_argument("--protocol", help="the protocol when the records cover several")
    ap.add_argument("--use", action="append", default=[], metavar="RUN_ID",
                    help="of several runs of one configuration, use this one (prefix; default: the newest record)")
    ap.add_argument("--md", type=Path, help="also write the markdown table here")
    ap.add_argument("--json", type=Path, help="write the frontier as JSON here")
    ap.add_argument("--out", type=Path, help="write the picture here (PNG) and the HTML page beside it (.html)")
    ap.add_argument("--paired-only", action="store_true",
                    help="leave out runs whose record keeps no per-task outcomes (they are never on the frontier)")
    ap.add_argument("--tracking-uri", default=tracking_uri(TrackingConf()))
    ap.add_argument("--experiment", default="humanevalfix", help="MLflow experiment of the frontier run")
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the picture on an MLflow run")
    args = ap.parse_args(argv)
    try:
        records, client = _read_inputs(args.inputs, args.sweep, args.tracking_uri)
        fr = frontier(records, model=args.model, protocol=args.protocol, use=tuple(args.use),
                      paired_only=args.paired_only)
    except FrontierError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = fr.markdown()
    sys.stdout.write(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(fr.to_dict(), indent=1) + "\n")
    if args.out:
        png = args.out.with_suffix(".png")
        png.write_bytes(png_bytes(fr))
        args.out.with_suffix(".html").write_text(fr.html())
        print(f"frontier: wrote {png} and {args.out.with_suffix('.html')}", file=sys.stderr)
    if not args.no_mlflow:
        import mlflow

        client = client or mlflow.MlflowClient(args.tracking_uri)
        if args.tracking_uri.startswith("sqlite:///"):
            Path(args.tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        run_id = log_to_mlflow(client, fr, run_id=args.sweep, experiment=args.experiment,
                               sources=[Path(x).name for x in args.inputs])
        print(f"frontier: logged frontier.png and frontier.html on MLflow run {run_id}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
