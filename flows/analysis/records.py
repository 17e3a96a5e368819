"""The one reader of finished runs: the results files jobs write when they end (`read_runs`: each run as a `Run`)
and job runs read back from MLflow, each turned into one `Record` per budget it holds, with the defaults of the
config it ran (`Record.defaults`, what a configuration's label is the difference from). Passes per budget are
counted here, from the verdicts, and nowhere else."""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from agents.types import cut, passed_at, row_verdicts

from ..result_neutral import param_values
from ..results import ResultsError, read
from ..schema import CONF_DIR, GROUPS, JobConf

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "benchmarks" / "results"
COSTS = ("prompt_tokens", "completion_tokens", "model_calls", "sandbox_runs")
ROUND_COSTS = ("prompt_tokens", "completion_tokens", "model_calls", "sandbox_runs")


FrontierError = ResultsError  # input the frontier cannot be drawn from: one line that names the fix


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
    # "task#sample" -> the verdict at each budget (agents/types.py Verdicts); None: not kept
    outcomes: dict[str, list[bool]] | None
    seconds: float | None  # per task: the tasks' own seconds cut to the budget, summed, / tasks; None: not known
    machine: str
    machine_source: str  # "job" (the job's own), "tag", "recorder" (where an old recorder ran), "file text", "unknown"
    commit: str | None = None  # the engine's git commit ("+dirty": uncommitted changes); None: not recorded
    # the config's defaults for the options `params` names (config_defaults), as params write them; None: not known
    defaults: dict[str, str] | None = field(default=None, repr=False, compare=False)


def price_per_task(rec: Record) -> float | None:
    """US dollars a task, from the model's list prices per million tokens where its config carries them."""
    try:
        prompt, completion = (float(rec.params[f"model.price_{k}_per_mtok"]) for k in ("prompt", "completion"))
    except (KeyError, TypeError, ValueError):
        return None
    return round((rec.cost.get("prompt_tokens", 0.0) * prompt + rec.cost.get("completion_tokens", 0.0) * completion)
                 / 1e6, 6)


# ---------------------------------------------------------------------------------------------------- back-fills

def _as_param(v) -> str:
    """A value as run params write it (flows/tracking.py flatten), a whole number written one way."""
    s = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return re.sub(r"^(-?\d+)\.0+$", r"\1", s)


def _fields(record: type, prefix: str) -> dict[str, str]:
    """A config record's scalar defaults, flattened under `prefix`, as params write them."""
    out = {}
    for f in dataclasses.fields(record):
        if f.default is not dataclasses.MISSING:
            v = f.default
        elif f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
        else:
            continue
        if v == "???" or dataclasses.is_dataclass(v):
            continue  # a value still to be given (omegaconf MISSING), or a nested record (dataset: not a knob)
        out[prefix + f.name] = _as_param(v)
    return out


@functools.cache
def _option_defaults(group: str, record: type, option: str | None) -> tuple[tuple[str, str], ...]:
    """The defaults of one group option: its record's, with what conf/<group>/<option>.yaml sets over them (a model's
    yaml holds the runtime knobs it was measured faster with) where that file names this record as its schema."""
    from omegaconf import OmegaConf

    out = _fields(record, f"{group}.")
    path = CONF_DIR / group / f"{option}.yaml"
    if option and path.is_file():
        raw = OmegaConf.to_container(OmegaConf.load(path))
        schemas = raw.pop("defaults", None) or []
        _, records = GROUPS[group]
        if any(isinstance(s, str) and records.get(s.removesuffix("_schema")) is record for s in schemas):
            out.update({f"{group}.{k}": _as_param(v) for k, v in raw.items() if not isinstance(v, dict)})
    return tuple(sorted(out.items()))


@functools.cache
def _defaults(options: tuple[tuple[str, str | None, str | None], ...]) -> dict[str, str]:
    out = _fields(JobConf, "")
    for group, selected, option in options:
        record = GROUPS[group][1].get(selected or "")
        if record is not None:
            out.update(_option_defaults(group, record, option))
    return out


def config_defaults(params: dict[str, str]) -> dict[str, str]:
    """What the job config holds by default for the options `params` names (its strategy, model, sandbox): the
    records' defaults (flows/schema.py) with the model's own yaml over them, flattened as run params write them.
    A key it lacks has no default: the path a run took (`serving.*`), or a knob no record has any more. One dict per
    set of options, shared by the records that name them."""
    options = tuple((group, params.get(f"{group}.{sel}"), params.get("model.name") if group == "model"
                     else params.get(f"{group}.{sel}")) for group, (sel, _) in GROUPS.items())
    return {**_defaults(options), **_default_choices()}


@functools.cache
def _default_choices() -> dict[str, str]:
    """The sandbox and runner conf/config.yaml picks, as their selector params: a run on another one (Docker) differs
    from the defaults there, so its label names it whatever else is loaded (its own option's record would make it
    no difference, and only runs loaded beside it would tell it apart)."""
    from omegaconf import OmegaConf

    picks = {k: v for d in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]
             if isinstance(d, dict) for k, v in d.items()}
    return {f"{group}.{GROUPS[group][0]}": picks[group] for group in ("sandbox", "runner") if group in picks}


# ---------------------------------------------------------------------------------------------------- reading

def task_seconds(rows: list[dict]) -> float | None:
    """The sum of the tasks' own seconds (a cut trajectory's are its rounds'); None if any task lacks them."""
    secs = [r.get("seconds") for r in rows]
    if not secs or any(s is None for s in secs):
        return None
    return round(sum(secs), 3)


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
    from ..tracking import machine_name

    tag = run.data.tags.get("fixlab.machine")
    return (tag, "tag") if tag else (machine_name(), "recorder")


def _per_task_cost(cost: dict, total: int) -> dict[str, float]:
    return {k: cost[k] / total for k in COSTS if k in cost} if total else {}


@dataclass
class Run:
    """One run of a results file, as the one reader reads it (`read_runs`); its budgets' records: `records()`."""
    run_id: str
    iters: int
    by_round: list[int]  # tasks passed after each round: counted from the verdicts where the file keeps them
    total: int
    outcomes: dict | None  # task#sample -> the verdict at each budget (agents/types.py Verdicts); None: not kept
    cost: dict  # the run's totals (tokens, model calls, sandbox runs, wall_s)
    tuning: tuple[int, int] | None = None  # (passed, total) on Python/0-23
    other: tuple[int, int] | None = None
    by_bug: dict | None = None
    overfit: dict | None = None
    index: int = 0  # position in the file's runs (its `paired` list is each run against the first)
    params: dict | None = None
    cost_by_round: list | None = None
    status: str = "FINISHED"
    machine: str = "unknown"
    machine_source: str = "unknown"
    commit: str | None = None
    task_seconds: float | None = None
    source: str = ""  # the results file's name
    recorded: str = ""  # when the file was written (ISO)

    passed = property(lambda self: self.by_round[-1])
    short = property(lambda self: self.run_id[:8])

    def cut(self, iters: int) -> "Run":
        """This run as a budget-`iters` run would have been (round r never depends on the budget: agents/loop.py)."""
        if self.outcomes is None or not self.cost_by_round or not 0 <= iters <= self.iters:
            raise ResultsError(f"run {self.short} cannot be cut to iters={iters}: it keeps no per-round outcomes; "
                               "run it again (a job's results file keeps them)")
        cost = {k: v for k, v in self.cost_by_round[iters].items() if k != "task_seconds"}
        return dataclasses.replace(self, iters=iters, by_round=self.by_round[:iters + 1], cost=cost, overfit=None,
                                   outcomes={t: cut(v, iters) for t, v in self.outcomes.items()})

    def records(self, order: int = 0) -> list[Record]:
        """This run as one Record per budget it holds."""
        params = param_values(self.params or {})
        rec = Record(
            run_id=self.run_id, source=self.source, recorded=self.recorded, order=order * 1000 + self.index,
            params=params, status=self.status, passed=self.passed, total=self.total,
            cost=_per_task_cost(self.cost, self.total), outcomes=self.outcomes,
            seconds=round(self.task_seconds / self.total, 3) if self.task_seconds is not None and self.total else None,
            machine=self.machine, machine_source=self.machine_source, commit=self.commit,
            defaults=config_defaults(params))
        return budgets(rec, self.cost_by_round)


def read_runs(path: Path, doc: dict | None = None) -> list[Run]:
    """The runs of a results file (the shape flows/analysis/run_record.py writes), checked to be of this schema."""
    path = Path(path)
    doc = read(path) if doc is None else doc
    if not isinstance(doc.get("runs"), list):
        raise ResultsError(f"{path.name}: not a results file with a 'runs' list; give files that a job wrote when it "
                           "ended")
    out = []
    for i, r in enumerate(doc["runs"]):
        try:
            out.append(_run(i, r, path.name, _recorded(doc)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ResultsError(f"{path.name}: run {i} lacks what a run keeps ({type(e).__name__}: {e}); record it "
                               "again (a job's results file keeps it)") from None
    return out


def _run(i: int, r: dict, source: str, recorded: str) -> Run:
    f = lambda d: (d["passed"], d["total"]) if d else None  # noqa: E731
    outcomes = r.get("verdicts")
    iters = int(r["params"].get("iters", len(r.get("by_round") or [0]) - 1))
    by_round = [sum(passed_at(v, k) for v in outcomes.values()) for k in range(iters + 1)] if outcomes else \
        [x["passed"] for x in r["by_round"]] if r.get("by_round") else [int(r["overall"]["passed"])]
    return Run(r["run_id"], iters, by_round, int(r["overall"]["total"]), outcomes, r.get("cost", {}),
               f(r.get("tuning_sample_0_23")), f(r.get("other_tasks")),
               {b: f(v) for b, v in r.get("by_bug_type", {}).items()}, r.get("overfit_gap"), i, r["params"],
               r.get("cost_by_round"), r.get("status", "FINISHED"), r["machine"], r.get("machine_source", "recorded"),
               commit_of(r.get("git_commit"), r.get("git_dirty")), r.get("task_seconds"), source, recorded)


def records_from_file(path: Path, order: int = 0) -> list[Record]:
    """The records of a results file's runs, one per run and budget."""
    return [rec for run in read_runs(path) for rec in run.records(order)]


def budgets(rec: Record, cost_by_round: list[dict] | None) -> list[Record]:
    """A run with per-round costs holds every smaller budget too (rounds never depend on the budget: agents/loop.py):
    one record per budget, its outcomes and costs cut to that round. Without them, the run's own budget only."""
    if not cost_by_round or not rec.outcomes:
        return [rec]
    out = []
    for b, cost in enumerate(cost_by_round):
        outcomes = {t: cut(v, b) for t, v in rec.outcomes.items()}
        out.append(Record(
            run_id=rec.run_id, source=rec.source, recorded=rec.recorded, order=rec.order,
            params={**rec.params, "iters": str(b)}, status=rec.status,
            passed=sum(passed_at(f) for f in outcomes.values()), total=rec.total,
            cost={k: cost[k] / rec.total for k in COSTS if k in cost},
            outcomes=outcomes, seconds=round(cost["task_seconds"] / rec.total, 3)
            if cost.get("task_seconds") is not None else None,
            machine=rec.machine, machine_source=rec.machine_source, commit=rec.commit, defaults=rec.defaults))
    return out


def _recorded(doc: dict) -> str:
    """When a results file was written, ISO: its `recorded`, or (the files a job writes itself keep only the
    self-description's UTC stamp, 20261130T115114Z) that stamp. Without it, every job-written file read as older
    than any hand-run one, and a rerun's "newest record" was an old file."""
    if doc.get("recorded"):
        return str(doc["recorded"])
    utc = str((doc.get("about") or {}).get("utc", ""))
    if len(utc) == 16 and utc[8] == "T" and utc.endswith("Z"):
        return f"{utc[:4]}-{utc[4:6]}-{utc[6:8]}T{utc[9:11]}:{utc[11:13]}:{utc[13:15]}Z"
    return ""


def records_from_files(paths: list[Path]) -> list[Record]:
    """The runs of several results files, in order (a later file's record of the same run wins at equal dates);
    e.g. `frontier(records_from_files(sorted(RESULTS.glob("fullsize-*.json"))), model=..., protocol=...)`."""
    return [rec for i, f in enumerate(paths) for rec in records_from_file(f, order=i)]


def record_from_run(run: dict, order: int = 0) -> Record:
    """A job run read back by load_runs, as a Record (the fields a job's results file keeps)."""
    rows = [r for r in run["rows"] if r.get("sample", 0) == 0]
    firsts = {f"{r['task_id']}#0": row_verdicts(r) for r in rows}
    m = run["metrics"]
    machine, src = run_machine(run["run"])
    total = len(rows)
    secs = task_seconds(rows)
    start = run["run"].info.start_time or 0
    params = param_values(run["params"])
    return Record(run_id=run["run_id"], source="mlflow",
                  recorded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start / 1000)), order=order,
                  params=params, status=run["run"].info.status,
                  passed=sum(passed_at(f) for f in firsts.values()), total=total,
                  cost={k: m[k] / total for k in COSTS if k in m and total}, outcomes=firsts,
                  seconds=None if secs is None or not total else round(secs / total, 3), machine=machine,
                  machine_source=src, commit=commit_of(run["run"].data.tags.get("git_commit"),
                                                       run["run"].data.tags.get("git_dirty")),
                  defaults=config_defaults(params))


def records_from_mlflow(client, run_ids: list[str], sweep: str | None = None, order: int = 0,
                        uri: str = "") -> list[Record]:
    """Job runs read back from an MLflow store (`sweep`: a sweep's parent, whose jobs are added to `run_ids`), one
    record per budget each holds; `order` numbers them after the results files read before them."""
    from mlflow.exceptions import MlflowException


    run_ids = list(run_ids)
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
    return [rec for i, r in enumerate(runs)
            for rec in budgets(record_from_run(r, order=order + i),
                               cost_by_round([x for x in r["rows"] if x.get("sample", 0) == 0],
                                             int(r["params"].get("iters", 0))))]


def load_runs(client, run_ids: list[str]) -> list[dict]:
    """Job runs read back from an MLflow store: the run, its params and metrics, and its results rows
    (`results.jsonl`; a run still going or stopped: the trajectories logged as each task ended)."""
    import os
    import tempfile

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    runs = []
    for rid in run_ids:
        run = client.get_run(rid)
        names = {a.path for a in client.list_artifacts(rid)}
        with tempfile.TemporaryDirectory(prefix="fixlab-compare-") as tmp:
            if "results.jsonl" in names:
                text = Path(client.download_artifacts(rid, "results.jsonl", tmp)).read_text()
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            elif "tasks" in names:  # a run still going (or stopped): the trajectories logged as each task ended
                rows = [json.loads(p.read_text()) for p in sorted(Path(client.download_artifacts(rid, "tasks", tmp)).glob("*.json"))]
            else:
                rows = []
        runs.append({"run": run, "run_id": rid, "params": run.data.params, "metrics": run.data.metrics,
                     "rows": rows, "finished": run.info.status == "FINISHED"})
    return runs
