"""Models side by side: `python -m flows.leaderboard [results files or folders] [--config LABEL | --all]`.

One row per model, configuration and language (one protocol: `--protocol`, default tests), from the results files jobs write (default: benchmarks/results): pass@1
with its 95% Wilson interval, completion tokens and seconds per task, what a task cost where the model has a price
(a local model has none, and says so), the machine and the file. By default the configuration is make eval's job
(the strategy and budget conf/config.yaml names, every knob at its default), so the rows differ in the model and the
language only; `--config "single_shot answer_format=line show_failure=True iters=4"` picks another (the label
`python -m flows.frontier` prints) and `--all` shows every one. Rows of one language share their tasks, so each is
paired (exact McNemar, Newcombe interval) with the first row of its language. The frontier draws one model's
configurations; here the models meet. docs/RESULTS.md's leaderboard comes from here (flows/report.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agents.types import passed_at

from .analysis.pareto import configurations
from .analysis.records import RESULTS, FrontierError, Record, price_per_task, records_from_files
from .markdown import ci, rate, table
from .stats import paired


@dataclass
class Row:
    model: str
    language: str
    protocol: str
    label: str  # the configuration, as the frontier names it
    passed: int
    total: int
    pass_at_1: float
    ci95: tuple[float, float]
    completion_tokens: float | None  # per task
    seconds: float | None  # per task: the tasks' own seconds cut to the budget
    usd: float | None  # per task, where the model has a price (model.price_*), else None
    machine: str
    source: str
    run_id: str
    vs_first: str = ""  # the paired verdict against the first row of its language
    outcomes: dict | None = field(default=None, repr=False)


def default_label() -> str:
    """make eval's configuration as the frontier labels it: conf/config.yaml's strategy at its budget, no knob moved."""
    from hydra import compose, initialize_config_dir

    from .schema import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config")
    return f"{cfg.strategy.name} iters={cfg.iters}"


def leaderboard(records: list[Record], label: str | None = None, every: bool = False,
                protocol: str = "tests") -> tuple[list[Row], list[str]]:
    """The rows (languages in HumanEvalPack's order, best first within one) and notes on what was left out: one
    protocol's (make eval's, `tests`, by default), as a pass@1 under docs or hidden answers another question."""
    from sandboxes.languages import NAMES

    want = label or default_label()
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        # a run of ours judged again (flows.rescore RUN) is that run's model twice: its check, not a row of its own
        if r.params.get("protocol", "tests") == protocol and r.params.get("model.format") != "run":
            key = (r.params.get("model.name", "?"), r.params.get("dataset.language", "python"), protocol)
            groups.setdefault(key, []).append(r)
    rows, notes = [], []
    for (model, language, protocol), rs in sorted(groups.items()):
        # a model's own settings (its weights, runtime, prices) and the path it took are the model, not the
        # configuration: the label is what the agent did, so that rows of different models name one configuration
        agent_only = [dataclasses.replace(r, params={k: v for k, v in r.params.items()
                                                     if k == "model.name" or not k.startswith(("model.", "serving."))})
                      for r in rs]
        try:
            configs, said = configurations(agent_only)
        except FrontierError as e:
            notes.append(f"{model} {language} {protocol}: {e}")
            continue
        notes += [f"{model} {language}: {n}" for n in said if "left out" in n]
        for c in configs:
            if not every and c.label != want:
                continue
            rec = next(r for r in rs if r.run_id == c.run_id and int(r.params.get("iters", 0)) == c.iters)
            rows.append(Row(model, language, protocol, c.label, c.passed, c.total, c.pass_at_1, c.ci95,
                            c.cost.get("completion_tokens"), c.seconds, price_per_task(rec),
                            c.machine, c.source, c.run_id, outcomes=c.outcomes))
    order = {n: i for i, n in enumerate(NAMES)}
    rows.sort(key=lambda r: (order.get(r.language, len(order)), r.protocol, -r.pass_at_1, r.model, r.label))
    for i, row in enumerate(rows):
        first = next(r for r in rows if r.language == row.language and r.protocol == row.protocol)
        if first is row or not (row.outcomes and first.outcomes):
            continue
        keys = sorted(set(row.outcomes) & set(first.outcomes))
        if keys:
            res = paired([passed_at(row.outcomes[k]) for k in keys], [passed_at(first.outcomes[k]) for k in keys])
            row.vs_first = res.verdict(name(row, rows), name(first, rows))
    if not rows:
        raise FrontierError(f"no finished 164-task run of the configuration {want!r} under protocol {protocol} among the "
                            f"records (--all shows every configuration; --config LABEL picks one)")
    return rows, notes


def name(row: Row, rows: list[Row]) -> str:
    """What tells a row apart from the others of its language: the model, and the configuration where they differ."""
    labels = {r.label for r in rows if r.language == row.language}
    return row.model if len(labels) == 1 else f"{row.model} ({row.label})"


def markdown(rows: list[Row], link=lambda source: source) -> str:
    """The table; `link` turns a results file's name into what the cell shows (the report links it)."""
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    body = [[r.language, r.model, r.label, f"{rate(r.passed, r.total)} ({ci(r.passed, r.total)})",
             f"{r.passed} / {r.total}", num(r.completion_tokens, ".0f"), num(r.seconds, ".1f"),
             "no price (local)" if r.usd is None else f"${r.usd:.5f}", r.vs_first or "-", r.machine, link(r.source)]
            for r in rows]
    return "\n".join(table(["language", "model", "configuration", "pass@1 (95% CI)", "passed", "completion tokens / task",
                  "seconds / task", "cost / task", "paired with the first row of its language", "machine",
                  "results file"], body)) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.leaderboard", description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="results files or folders of fullsize-*.json (default: benchmarks/results)")
    ap.add_argument("--config", help="the configuration's label, as flows.frontier prints it (default: make eval's)")
    ap.add_argument("--all", action="store_true", help="every configuration, not one")
    ap.add_argument("--protocol", default="tests", help="the protocol (tests, docs, hidden; default: make eval's, tests)")
    ap.add_argument("--md", type=Path, help="also write the table here")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    files = []
    for x in args.inputs or [str(RESULTS)]:
        p = Path(x)
        if not p.exists():
            print(f"error: {x}: no such results file or folder", file=sys.stderr)
            return 2
        files += sorted(p.glob("fullsize-*.json")) if p.is_dir() else [p]
    try:
        rows, notes = leaderboard(records_from_files(files), args.config, args.all, args.protocol)
    except FrontierError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = markdown(rows)
    sys.stdout.write(text)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in asdict(r).items() if k != "outcomes"} for r in rows],
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
