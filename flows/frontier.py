"""The cost-accuracy frontier: what each configuration (strategy, budget, candidates, any knob) buys one model on one
protocol, at what cost per task, and which steps up in cost buy something a paired test can see.

    python -m flows.frontier benchmarks/results/fullsize-*.json --model qwen1.5b-coder-q4 --protocol tests
    python -m flows.frontier --sweep PARENT_RUN_ID                 # a -m sweep's jobs, read from MLflow
    python -m flows.frontier RUN_ID RUN_ID ... --out frontier.png --md frontier.md --json frontier.json
    python -m flows.frontier benchmarks/results/fullsize-*.json --model gpt-4o-mini --axis usd   # dollars a task

Inputs are finished runs: the results files jobs write when they end (which keep per-task outcomes, so they
pair across machines and days), MLflow job run ids, or a sweep's parent. Output: a markdown table on stdout (--md:
also to a file), JSON (--json), a picture (--out: PNG, and an HTML page beside it) and the same PNG and HTML logged
on an MLflow run (the sweep's parent when given one, else a new run tagged fixlab.kind=frontier; --no-mlflow skips).

What the frontier is, how configurations are named and grouped and how its steps are tested:
flows/analysis/pareto.py (records: flows/analysis/records.py; the table and page: render.py; the picture:
figures.py). This module is the command and the MLflow logging; it re-exports the analysis' names.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .analysis.figures import figure, png_bytes, svg_text
from .analysis.pareto import (ABSENT, AXIS_NAMES, COST_AXES, NOT_A_KNOB, Config, Frontier, Step, configurations, frontier, pair_step,
                                pareto, steps_along)
from .analysis.records import (COSTS, REPO, RESULTS, ROUND_COSTS, FrontierError, Record, budgets, commit_of,
                               config_defaults, cost_by_round, param_values, record_from_run,
                               records_from_file, records_from_files, records_from_mlflow, run_machine, task_seconds)
from .analysis.render import html_page, markdown, table_rows, verdict_words

__all__ = ["ABSENT", "AXIS_NAMES", "COST_AXES", "COSTS", "NOT_A_KNOB", "REPO", "RESULTS", "ROUND_COSTS", "Config", "Frontier", "FrontierError",
           "Record", "Step", "budgets", "commit_of", "config_defaults", "configurations", "cost_by_round", "figure",
           "frontier", "html_page", "log_to_mlflow", "main", "markdown", "pair_step",
           "param_values", "pareto", "png_bytes", "record_from_run", "records_from_file", "records_from_files",
           "records_from_mlflow", "run_machine", "steps_along", "svg_text", "table_rows", "task_seconds",
           "verdict_words"]


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

        client = mlflow.MlflowClient(uri)
        records += records_from_mlflow(client, run_ids, sweep, order=len(files) * 1000, uri=uri)
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
    ap.add_argument("--language", help="the dataset's language (python, js, java, go, cpp, rust) when the records "
                    "cover several")
    ap.add_argument("--use", action="append", default=[], metavar="RUN_ID",
                    help="of several runs of one configuration, use this one (prefix; default: the newest record)")
    ap.add_argument("--axis", choices=("tokens", "usd"), default="tokens",
                    help="the cost axis: completion tokens per task, or US dollars per task from the model's list "
                    "prices (model.price_*_per_mtok; hosted presets carry them, a local model has none)")
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
                      paired_only=args.paired_only, language=args.language, axis=args.axis)
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
