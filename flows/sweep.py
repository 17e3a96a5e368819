"""Hydra callback: a sweep (`python -m flows.evaluate ... -m`) gets one MLflow parent run.

on_multirun_start creates the parent run and hands its id to the jobs through FIXLAB_PARENT_RUN_ID, so
each job's run is a child (tag mlflow.parentRunId; RunTracker.start reads it). on_multirun_end reads the
children back from MLflow (so it works with any launcher, in-process or not) and logs on the parent:
  pass_at_1_vs_rounds.png - pass@1 against rounds, one line per job, labelled by what the sweep varies;
  sweep_curves.json       - the same numbers as a table (one row per job and round);
  metrics                 - the best job's figures (pass_at_1, its curve, passed, total, tokens, wall_s),
                            tags best_run_id / best_job.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import time

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from .mark_killed import OpenRun
from .result_neutral import config_diff
from .schema import TrackingConf, typed
from .stream import stream_plan
from .tracking import PARENT_ENV, RunTracker, git_state


class SweepParentRun(Callback):
    live: "SweepParentRun | None" = None  # the sweep of this process, for a stop that cannot unwind (flows/evaluate.py)

    def __init__(self) -> None:
        self.tracker: RunTracker | None = None
        self.run_id: str | None = None
        self.t0 = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        tracking = typed(TrackingConf, OmegaConf.to_container(config.tracking, resolve=True) if "tracking" in config
                         else {}, "tracking")
        overrides = list(config.hydra.overrides.task) if "hydra" in config else []
        swept = [o for o in overrides if "," in o or "range(" in o or "choice(" in o]
        self.tracker = RunTracker(tracking)
        name = "sweep " + " ".join(swept or overrides)[:200]
        run = self.tracker.client.create_run(self.tracker.experiment_id, run_name=name, tags={
            **git_state(), "fixlab.kind": "sweep", "sweep.overrides": " ".join(overrides)[:5000]})
        self.run_id = run.info.run_id
        os.environ[PARENT_ENV] = self.run_id
        budgets = swept_budgets(overrides)
        if len(budgets) > 1:  # each task runs to the largest budget once; the other jobs cut it (flows/core.py)
            # An override every job of the sweep gets: Hydra's sweeper reads the task overrides after this callback.
            with read_write(config.hydra.overrides), open_dict(config.hydra.overrides):
                config.hydra.overrides.task.append(f"sweep_ahead_to={max(budgets)}")
        plan = stream_plan(sweep_points(overrides, config))
        if plan:  # single_shot: one stream of answers per task holds every (candidates, iters) job (flows/stream.py)
            with read_write(config.hydra.overrides), open_dict(config.hydra.overrides):
                config.hydra.overrides.task.append(f"sweep_stream=[{plan[0]},{plan[1]}]")
        self.t0 = time.perf_counter()
        atexit.register(self._abandon)  # a job that ends the process (bad config) must not leave it RUNNING
        SweepParentRun.live = self
        print(f"fixlab: sweep parent run {self.run_id}", file=sys.stderr, flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if not self.run_id:
            return
        try:
            log_sweep(self.tracker.client, self.run_id, time.perf_counter() - self.t0)
            self.tracker.client.set_terminated(self.run_id, status="FINISHED")
        finally:
            os.environ.pop(PARENT_ENV, None)
            self.run_id = None

    def _abandon(self, status: str = "FAILED") -> None:
        if self.run_id:
            try:
                self.tracker.client.set_terminated(self.run_id, status=status)
            except Exception:
                pass
            self.run_id = None

    @classmethod
    def open_run(cls) -> OpenRun | None:
        """SIGTERM/Ctrl-C leave through os._exit, past atexit: the sweep's parent run, for the stop to mark KILLED as it
        marks its job (flows/evaluate.py)."""
        live = cls.live
        return OpenRun(live.tracker.uri, live.run_id, live.tracker.client) if live is not None and live.run_id else None


def swept_budgets(overrides: list[str]) -> list[int]:
    """The budgets an `iters=...` sweep override lists (iters=0,1,2,3, iters=range(0,4)...); [] when iters is not swept
    or the override cannot be read (the sweep then simply runs each budget on its own)."""
    values = _values(overrides, "iters")
    try:
        return sorted({int(v) for v in values}) if len(values) > 1 else []
    except (TypeError, ValueError):  # iters=a,b: each job fails on its own, in one line
        return []


def _values(overrides: list[str], key: str) -> list:
    """The values an override of `key` gives (one, or a sweep's list); [] when absent or unreadable."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        for o in OverridesParser.create().parse_overrides([o for o in overrides if o.split("=")[0].lstrip("+~") == key]):
            return list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
    except Exception:
        pass
    return []


def sweep_points(overrides: list[str], config: DictConfig | None = None) -> list[tuple[int, int]]:
    """The (candidates, iters) points of a sweep's jobs, as the job settings will compute them (`answers` sets iters).
    Values that are not integers (an interpolation) give no points: the jobs then run on their own."""
    from itertools import product

    default_k = _default(config, "strategy", "candidates", 1)
    ks = _values(overrides, "strategy.candidates") or [default_k]
    answers = _values(overrides, "answers")
    iters = _values(overrides, "iters") or [_default(config, None, "iters", 0)]
    try:
        if answers and answers != [None]:
            return [(int(k), int(n) // int(k) - 1) for k, n in product(ks, answers) if int(n) % int(k) == 0]
        return [(int(k), int(r)) for k, r in product(ks, iters)]
    except (TypeError, ValueError):
        return []


def _default(config, group: str | None, key: str, fallback):
    try:
        node = config[group] if group else config
        return node[key] if node is not None and key in node and node[key] is not None else fallback
    except Exception:
        return fallback


def job_labels(children) -> dict[str, str]:
    """run id -> what sets this job apart, e.g. "model=canonical" or "strategy=reflection iters=3"."""
    params = {r.info.run_id: dict(r.data.params) for r in children}
    keys = sorted({k for p in params.values() for k in p})
    differ = [k for k in keys if len({p.get(k) for p in params.values()}) > 1]
    # what changes answers names a job; a sweep over speed knobs alone (model.threads=1,2) is named by them
    first = next(iter(params.values()), {})
    answer_changing = {k for p in params.values() for k in config_diff(first, p)}
    varying = [k for k in differ if k in answer_changing] or \
        [k for k in differ if not k.startswith(("tracking.", "resume", "cache_dir"))]
    groups: dict[str, list[str]] = {}
    for k in varying:
        groups.setdefault(k.split(".")[0] if "." in k else k, []).append(k)
    def differs_within_name(g: str, k: str) -> bool:  # e.g. two reflection runs, one with a knob changed
        seen: dict = {}
        return any(seen.setdefault(p.get(f"{g}.name"), p.get(k)) != p.get(k) for p in params.values())

    labels = {}
    for r in children:
        p = params[r.info.run_id]
        parts = []
        for g, ks in groups.items():
            # A config group (model, strategy...) is named by its `name`; its other keys follow from it,
            # unless they also differ between runs of the same name.
            if f"{g}.name" in ks:
                parts.append(f"{g}={p.get(f'{g}.name')}")
                ks = [k for k in ks if k != f"{g}.name" and differs_within_name(g, k)]
            parts += [f"{k}={p[k]}" for k in ks if k in p]
        labels[r.info.run_id] = " ".join(parts) or r.info.run_name
    return labels


def log_sweep(client, parent_id: str, wall_s: float) -> dict:
    """On the sweep's parent run: the jobs' pass@1 curves with their 95% bands (plot and table), and the best
    job's figures as the parent's metrics."""
    jobs = _sweep_jobs(client, parent_id)
    _plot_curves(client, parent_id, jobs)
    _log_curve_table(client, parent_id, jobs)
    best = _log_best(client, parent_id, jobs, wall_s)
    summary = {"jobs": [{k: j[k] for k in ("job", "run_id", "status", "curve")} for j in jobs],
               "best": best and {k: best[k] for k in ("job", "run_id", "curve")}}
    print(f"fixlab: sweep of {len(jobs)} jobs logged on parent run {parent_id}"
          + (f"; best: {best['job']} pass@1={best['metrics']['pass_at_1']}" if best else ""), file=sys.stderr, flush=True)
    return json.loads(json.dumps(summary))


def _latest_steps(client, run_id: str, key: str) -> list[float]:
    """One value per round; a resumed run logs its curve again, the latest value wins."""
    latest: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if m.step not in latest or m.timestamp >= latest[m.step][0]:
            latest[m.step] = (m.timestamp, m.value)
    return [latest[s][1] for s in sorted(latest)]


def _sweep_jobs(client, parent_id: str) -> list[dict]:
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'",
                                  order_by=["attributes.start_time ASC"], max_results=1000)
    labels = job_labels(children)
    return [{"job": labels[r.info.run_id], "run_id": r.info.run_id, "run_name": r.info.run_name,
             "status": r.info.status, "curve": _latest_steps(client, r.info.run_id, "pass_at_1_by_iter"),
             "low": _latest_steps(client, r.info.run_id, "pass_at_1_by_iter_ci_low"),
             "high": _latest_steps(client, r.info.run_id, "pass_at_1_by_iter_ci_high"),
             "metrics": r.data.metrics} for r in children]


def _plot_curves(client, parent_id: str, jobs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for j in jobs:
        if j["curve"]:
            rounds = range(len(j["curve"]))
            line, = ax.plot(rounds, j["curve"], marker="o", label=j["job"])
            if len(j["low"]) == len(j["high"]) == len(j["curve"]):
                ax.fill_between(rounds, j["low"], j["high"], color=line.get_color(), alpha=0.12, linewidth=0)
    ax.set_xlabel("round (0 = first attempt, then feedback rounds)")
    ax.set_ylabel("pass@1 (band: 95% interval)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(range(max((len(j["curve"]) for j in jobs), default=1)))
    ax.grid(alpha=0.3)
    ax.set_title(f"pass@1 vs rounds, {len(jobs)} jobs")
    if any(j["curve"] for j in jobs):
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    client.log_figure(parent_id, fig, "pass_at_1_vs_rounds.png")
    plt.close(fig)


def _log_curve_table(client, parent_id: str, jobs: list[dict]) -> None:
    rows = {"job": [], "round": [], "pass_at_1": [], "ci_low": [], "ci_high": [], "run_id": [], "run_name": [],
            "status": []}
    for j in jobs:
        for rnd, v in enumerate(j["curve"] or [None]):
            rows["job"].append(j["job"])
            rows["round"].append(rnd if j["curve"] else None)
            rows["pass_at_1"].append(v)
            rows["ci_low"].append(j["low"][rnd] if rnd < len(j["low"]) else None)
            rows["ci_high"].append(j["high"][rnd] if rnd < len(j["high"]) else None)
            rows["run_id"].append(j["run_id"])
            rows["run_name"].append(j["run_name"])
            rows["status"].append(j["status"])
    client.log_table(parent_id, data=rows, artifact_file="sweep_curves.json")


def _log_best(client, parent_id: str, jobs: list[dict], wall_s: float) -> dict | None:
    """Best: highest pass@1, then fewest tokens, then fewest rounds; its figures become the parent's."""
    from mlflow.entities import Metric

    done = [j for j in jobs if j["status"] == "FINISHED" and "pass_at_1" in j["metrics"]]
    now = int(time.time() * 1000)
    metrics = [Metric("jobs", float(len(jobs)), now, 0), Metric("jobs_finished", float(len(done)), now, 0),
               Metric("sweep_wall_s", round(wall_s, 2), now, 0)]
    best = None
    if done:
        best = max(done, key=lambda j: (j["metrics"]["pass_at_1"],
                                        -(j["metrics"].get("prompt_tokens", 0) + j["metrics"].get("completion_tokens", 0)),
                                        -len(j["curve"])))
        m = best["metrics"]
        metrics += [Metric("best_pass_at_1", m["pass_at_1"], now, 0), Metric("pass_at_1", m["pass_at_1"], now, 0)]
        metrics += [Metric("pass_at_1_by_iter", v, now, s) for s, v in enumerate(best["curve"])]
        metrics += [Metric(k, m[k], now, 0) for k in ("passed", "total", "prompt_tokens", "completion_tokens", "wall_s")
                    if k in m]
        client.set_tag(parent_id, "best_run_id", best["run_id"])
        client.set_tag(parent_id, "best_job", best["job"][:5000])
    client.log_batch(parent_id, metrics=metrics)
    return best
