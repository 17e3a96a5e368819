"""The cost-accuracy frontier as pure functions over records (flows/analysis/records.py): which configurations the
records hold and what each is called, the Pareto set on completion tokens and on seconds, and the paired test of
each frontier point against cheaper configurations. No I/O: rendering is flows/analysis/render.py and figures.py,
the command flows/frontier.py.

A configuration counts only if it beats a cheaper one at equal cost (Kapoor et al., "AI Agents That Matter", 2024):
- Pareto set: pass@1 against completion tokens per task (always known; or US dollars per task, from the model's list
  prices, with axis="usd"), and against seconds per task where those
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

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

from agents.types import passed_at

from ..result_neutral import result_neutral
from ..stats import paired, wilson
from .records import FrontierError, Record, price_per_task

# Params that say which frontier a record belongs to, or where/how much it ran, not what a configuration is.
NOT_A_KNOB = ("model.name", "protocol", "iters", "answers", "strategy.name", "samples", "dataset.")
ABSENT = "-"  # a knob a record does not have: the run predates it


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


# the frontier's cost axis: its name in documents -> its key in Config.cost (`--axis usd` asks for dollars)
COST_AXES = {"completion tokens": "completion_tokens", "US dollars": "usd"}
AXIS_NAMES = {"tokens": "completion tokens", "usd": "US dollars"}


@dataclass
class Step:
    """A frontier point paired with a cheaper configuration."""
    point: str
    against: str
    why: str  # "next cheaper frontier point", "cheapest inside its interval", or both
    axis: str  # "completion tokens", "US dollars" or "seconds"
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
    language: str = "python"  # the dataset's language (one frontier is for one)
    axis: str = "completion tokens"  # the cost axis: COST_AXES' name; token_frontier and its steps are on it

    @property
    def axis_key(self) -> str:
        return COST_AXES[self.axis]

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
        from .render import markdown

        return markdown(self)

    def html(self) -> str:
        from .render import html_page

        return html_page(self)


# ---------------------------------------------------------------------------------------------------- configurations

def _knob_name(k: str) -> str:
    return k[len("strategy."):] if k.startswith("strategy.") else k


def _is_knob(k: str) -> bool:
    return not result_neutral(k) and not any(k == n or (n.endswith(".") and k.startswith(n)) for n in NOT_A_KNOB)


def _identity(r: Record, keys: list[str]) -> tuple:
    return (r.params.get("strategy.name", "?"), int(r.params.get("iters", 0)),
            tuple((k, r.params.get(k, ABSENT)) for k in keys))


def _differing_knobs(records: list[Record], strategy_of: dict[int, str]):
    """(id(record) -> every knob that differs in its scope with its value, (id(record), knob) -> the usual value
    in that scope). A strategy's knobs are scoped to runs of that strategy; a knob set to one value where set (added
    or retired later) is no difference."""
    keys = sorted({k for r in records for k in r.params if _is_knob(k)})
    knobs: dict[int, dict[str, str]] = {id(r): {} for r in records}
    usual: dict[tuple[int, str], str] = {}
    for k in keys:
        groups: dict[str, list[Record]] = {}
        for r in records:
            groups.setdefault(strategy_of[id(r)] if k.startswith("strategy.") else "", []).append(r)
        for rs in groups.values():
            vals = Counter(r.params.get(k, ABSENT) for r in rs)
            if len(set(vals) - {ABSENT}) < 2:
                continue
            common = max(sorted(vals), key=lambda v: (vals[v], v != ABSENT))
            for r in rs:
                knobs[id(r)][k] = r.params.get(k, ABSENT)
                usual[(id(r), k)] = common
    return knobs, usual


def _labels(records: list[Record]) -> dict[int, tuple[str, str, dict]]:
    """id(record) -> (label, family, knobs); by record, not run id, as one run may hold several points.

    A label is the configuration's full difference from its defaults, whatever else was loaded: the strategy, then
    every knob whose value is not the default the job config gives it for that strategy and model
    (`Record.defaults`: e.g. `candidates=2`, `answer_format=line`), then the budget. A knob the run predates is no
    difference (named `knob=-` only where a configuration that differs in nothing else sits at the default). A knob
    with no default (the path a run took, `serving.*`; a knob no record has any more) is named where its value is
    not the usual one among the loaded runs it differs across.

    `knobs` is every knob that differs among the loaded runs in its scope (what tells configurations apart: a
    strategy's knobs count against runs of the same strategy only, as react's max_turns is not a difference from
    single_shot; a knob set to one value where set, added or retired later, is no difference)."""
    strategy_of = {id(r): r.params.get("strategy.name", "?") for r in records}
    knobs, usual = _differing_knobs(records, strategy_of)

    def named(r: Record, k: str) -> bool:
        default = (r.defaults or {}).get(k)
        value = r.params.get(k, ABSENT)
        if default is None:  # nothing to differ from: named where it differs from the loaded runs' usual value
            return (id(r), k) in usual and value != usual[(id(r), k)]
        return value not in (default, ABSENT)

    def label(r: Record, ks: list[str]) -> tuple[str, str]:
        family = " ".join([strategy_of[id(r)]] + [f"{_knob_name(k)}={r.params.get(k, ABSENT)}" for k in ks])
        return f"{family} iters={int(r.params.get('iters', 0))}", family

    shown = {id(r): [k for k in sorted(set(r.params) | set(knobs[id(r)])) if _is_knob(k) and named(r, k)]
             for r in records}
    every = sorted({k for r in records for k in knobs[id(r)]})

    def clashes() -> list[list[Record]]:
        """Records of different configurations that would share a label."""
        by: dict[str, list[Record]] = {}
        for r in records:
            by.setdefault(label(r, shown[id(r)])[0], []).append(r)
        return [rs for rs in by.values() if len({_identity(r, every) for r in rs}) > 1]

    # Two configurations apart only in a knob one of them predates (the other at its default): that one names it
    # (`knob=-`). Where that is not enough (two runs each at its own default), both name the knobs they differ in.
    for rs in clashes():
        for r in rs:
            shown[id(r)] = sorted(set(shown[id(r)]) | {k for k, v in knobs[id(r)].items() if v == ABSENT})
    for rs in clashes():
        split = {k for k in every if len({r.params.get(k, ABSENT) for r in rs}) > 1}
        for r in rs:
            shown[id(r)] = sorted(set(shown[id(r)]) | split)
    return {id(r): (*label(r, shown[id(r)]), knobs[id(r)]) for r in records}


def _select(records: list[Record], model: str | None, protocol: str | None,
            language: str | None = None) -> tuple[list[Record], str, str, str]:
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
    records, lang = pick("language", "--language", "dataset.language", "python", language, records)
    return records, m, p, lang


def _costs(r: Record) -> dict[str, float]:
    """A record's costs per task, and its US dollars where the model's config carries list prices (a cent a task
    is a large figure, so dollars keep six places where tokens keep two)."""
    cost = {k: round(v, 2) for k, v in r.cost.items()}
    usd = price_per_task(r)
    if usd is not None:
        cost["usd"] = usd
    return cost


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
    short: dict[int, dict[str, str]] = {}  # tasks covered -> {run id: its file}: a run of several budgets once
    for r in records:
        if r.total < full:
            short.setdefault(r.total, {}).setdefault(r.run_id[:8], r.source)
    for n, runs in short.items():
        notes.append(f"left out {len(runs)} run{'s' if len(runs) > 1 else ''} covering {n} of {full} tasks, so "
                     f"pass@1 there is not comparable: " + ", ".join(f"{i} ({src})" for i, src in runs.items()))
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
            ci95=(round(lo, 4), round(hi, 4)), cost=_costs(chosen),
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
    unit = f"the {axis}"
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
             use: tuple[str, ...] = (), paired_only: bool = False, language: str | None = None,
             axis: str = "tokens") -> Frontier:
    """The frontier of one model on one protocol over the given records (results-file or MLflow runs), on completion
    tokens per task (`axis="tokens"`) or on US dollars per task (`axis="usd"`, for a model whose config carries
    prices). Configurations whose record keeps no per-task outcomes are listed but not placed on the frontier (a
    frontier point must be paired); `paired_only` leaves them out of the table too."""
    if axis not in AXIS_NAMES:
        raise FrontierError(f"axis {axis!r}: not a cost axis; use one of {', '.join(AXIS_NAMES)}")
    axis_name = AXIS_NAMES[axis]
    records, model, protocol, language = _select(records, model, protocol, language)
    if paired_only:
        dropped = sorted({r.run_id[:8] for r in records if not r.outcomes})
        records = [r for r in records if r.outcomes]
        if not records:
            raise FrontierError("no record keeps per-task outcomes; run them again (a job's results file keeps them) "
                                "or drop --paired-only")
    configs, notes = configurations(records, use)
    if paired_only and dropped:
        notes.append(f"left out {len(dropped)} runs without per-task outcomes (--paired-only): {', '.join(dropped)}")
    unplaced = [c.label for c in configs if not c.paired]
    if unplaced:
        notes.append(f"not placed on the frontier, no per-task outcomes to pair (recorded before benchmarks/fullsize.py "
                     f"kept them): {', '.join(unplaced)}")
    placed = [c for c in configs if c.paired]
    key = COST_AXES[axis_name]
    tok = lambda c: c.cost.get(key)  # noqa: E731
    if axis == "usd":
        unpriced = [c.label for c in placed if tok(c) is None]
        if len(unpriced) == len(placed):
            raise FrontierError(f"--axis usd: {model}'s runs carry no prices (a local model has none); set "
                                "model.price_prompt_per_mtok and model.price_completion_per_mtok, or drop --axis usd")
        if unpriced:
            notes.append(f"not placed on the dollar axis, no prices in their config: {', '.join(unpriced)}")
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
    steps = steps_along(token_front, placed, axis_name, tok)
    if time_front:
        steps += steps_along(time_front, on_machine, "seconds", lambda c: c.seconds)
    return Frontier(model=model, protocol=protocol, tasks=max(c.total for c in configs), configs=configs,
                    token_frontier=token_front, time_frontier=time_front,
                    time_machine=time_machine if time_front else None, steps=steps, notes=notes,
                    time_commit=time_commit if time_front else None, language=language, axis=axis_name)
