"""Nightly regression flow: run the pinned config (conf/nightly.yaml), compare with the last good nightly.

  python -m flows.nightly serve [overrides]        register the deployment with its cron schedule and run
                                                  what the server schedules (`make nightly`; --start-server
                                                  first starts `prefect server start` when none answers)
  python -m flows.nightly now [--wait] [overrides] trigger one run of the served deployment at once
                                                  (`make nightly-now`); --wait: exit 1 when it ends Failed
  python -m flows.nightly run [overrides]          run the flow here, without a server (debugging)

A run evaluates like `flows.evaluate` (one MLflow run in the nightly experiment), then compares with the
newest earlier nightly run whose verdict was ok: pass@1 delta, tasks that flipped pass->fail and
fail->pass, tokens and wall-time deltas, config differences. The report goes on the nightly's MLflow run
(nightly/regression_report.md and .json); the flow run ends Failed when pass@1 drops by more than
nightly.tolerance or a task on nightly.must_pass fails.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from prefect import flow

from .config import ConfigError, settings_from
from .core import task_order
from .markdown import table
from .result_neutral import config_diff
from .schema import CONF_DIR, NightlyConf, describe, typed
from .tracking import RunTracker
FLOW_NAME = "fixlab-nightly"
DEPLOYMENT = "nightly"


def compose(overrides: list[str], config_name: str = "nightly") -> dict:
    """The pinned config plus overrides, resolved, as `python -m flows.evaluate --config-name nightly` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:
        raise ConfigError(describe(e)) from None


def nightly_options(cfg: dict) -> dict:
    """conf/nightly.yaml's `nightly` block, checked: a bad value is one line now, not a broken 02:00 run."""
    opts = typed(NightlyConf, cfg.get("nightly") or {}, "nightly")
    if not 0 <= opts.tolerance <= 1:
        raise ConfigError(f"nightly.tolerance must be a number between 0 and 1, got {opts.tolerance!r}")
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=opts.cron, timezone=opts.timezone)
    except Exception:
        raise ConfigError(f"nightly.cron {opts.cron!r} / nightly.timezone {opts.timezone!r}: "
                          f"not a valid cron string and IANA timezone (e.g. '0 2 * * *', UTC)") from None
    return {"cron": opts.cron, "timezone": opts.timezone, "tolerance": float(opts.tolerance),
            "must_pass": list(opts.must_pass)}


def _results(client, run_id: str) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, "results.jsonl", tmp)
        rows = [json.loads(l) for l in open(path)]
    out: dict[str, dict] = {}
    for r in rows:  # with samples > 1 a task counts as passed when any sample passed
        o = out.setdefault(r["task_id"], {"passed": False, "tokens": 0, "seconds": 0.0, "error": None})
        o["passed"] = o["passed"] or bool(r["passed"])
        o["error"] = o["error"] or r.get("error")
        o["tokens"] += r.get("prompt_tokens", 0) + r.get("completion_tokens", 0)
        o["seconds"] += r.get("seconds") or 0.0
    return out


def last_good_nightly(client, experiment_id: str, exclude: str) -> object | None:
    runs = client.search_runs([experiment_id], "tags.`fixlab.nightly` = 'true' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=50)
    for r in runs:
        if r.info.run_id != exclude and r.data.tags.get("fixlab.nightly.verdict") == "ok":
            return r
    return None


def compare(client, current, baseline, tolerance: float, must_pass: list[str]) -> dict:
    """The regression report as a dict (also what the JSON artifact holds)."""
    cur = _results(client, current.info.run_id)
    m = current.data.metrics
    report = {
        "run_id": current.info.run_id, "run_name": current.info.run_name,
        "pass@1": m.get("pass_at_1"), "tolerance": tolerance, "must_pass": must_pass,
        "must_pass_failed": [t for t in must_pass if not cur.get(t, {}).get("passed")],
        # A crash of the harness (not a wrong answer) on a task: counted as failed, listed so nobody blames the model.
        "harness_errors": {t: cur[t]["error"] for t in sorted(cur, key=task_order) if cur[t]["error"]},
        "baseline": None,
    }
    reasons = []
    if baseline is not None:
        base = _results(client, baseline.info.run_id)
        b = baseline.data.metrics
        common = sorted(set(cur) & set(base), key=task_order)
        delta = round(m.get("pass_at_1", 0.0) - b.get("pass_at_1", 0.0), 6)
        cur_tokens = m.get("prompt_tokens", 0) + m.get("completion_tokens", 0)
        base_tokens = b.get("prompt_tokens", 0) + b.get("completion_tokens", 0)
        was, now = baseline.data.params, current.data.params
        report.update({
            "baseline": {"run_id": baseline.info.run_id, "run_name": baseline.info.run_name,
                         "pass@1": b.get("pass_at_1"), "started": _iso(baseline.info.start_time)},
            "pass@1_delta": delta,
            "pass_to_fail": [t for t in common if base[t]["passed"] and not cur[t]["passed"]],
            "fail_to_pass": [t for t in common if not base[t]["passed"] and cur[t]["passed"]],
            "only_in_current": sorted(set(cur) - set(base), key=task_order),
            "only_in_baseline": sorted(set(base) - set(cur), key=task_order),
            "tokens": {"current": cur_tokens, "baseline": base_tokens, "delta": cur_tokens - base_tokens},
            "wall_s": {"current": m.get("wall_s"), "baseline": b.get("wall_s"),
                       "delta": round((m.get("wall_s") or 0) - (b.get("wall_s") or 0), 2)},
            "config_changes": {k: [was.get(k), now.get(k)] for k in config_diff(was, now)},
        })
        if delta < -tolerance - 1e-9:
            reasons.append(f"pass@1 dropped by {-delta:.4f} (tolerance {tolerance})")
    if report["must_pass_failed"]:
        reasons.append(f"must-pass task(s) failed: {', '.join(report['must_pass_failed'])}")
    report["verdict"] = "regression" if reasons else "ok"
    report["reasons"] = reasons
    return report


def markdown(r: dict) -> str:
    lines = [f"# Nightly regression report: {r['verdict'].upper()}", "",
             f"Run `{r['run_name']}` ({r['run_id']}): pass@1 = {r['pass@1']}", ""]
    if r["reasons"]:
        lines += ["## Why it failed", *[f"- {x}" for x in r["reasons"]], ""]
    if r["baseline"] is None:
        lines += ["No earlier good nightly run to compare with: this run becomes the baseline.", ""]
    else:
        b = r["baseline"]
        lines += [f"Baseline: `{b['run_name']}` ({b['run_id']}, {b['started']}): pass@1 = {b['pass@1']}", "",
                  *table(["figure", "baseline", "current", "delta"], [
                      ["pass@1", b["pass@1"], r["pass@1"], f"{r['pass@1_delta']:+.4f} (tolerance {r['tolerance']})"],
                      ["tokens", f"{r['tokens']['baseline']:.0f}", f"{r['tokens']['current']:.0f}",
                       f"{r['tokens']['delta']:+.0f}"],
                      ["wall s", r["wall_s"]["baseline"], r["wall_s"]["current"], f"{r['wall_s']['delta']:+.2f}"]]), ""]
        lines += [f"## Pass -> fail ({len(r['pass_to_fail'])})", ", ".join(r["pass_to_fail"]) or "none", "",
                  f"## Fail -> pass ({len(r['fail_to_pass'])})", ", ".join(r["fail_to_pass"]) or "none", ""]
        if r["only_in_current"] or r["only_in_baseline"]:
            lines += ["## Task sets differ", f"only now: {', '.join(r['only_in_current']) or 'none'}; "
                      f"only in baseline: {', '.join(r['only_in_baseline']) or 'none'}", ""]
        if r["config_changes"]:
            lines += ["## Config changes since the baseline",
                      *table(["key", "baseline", "current"], [[k, a, c] for k, (a, c) in r["config_changes"].items()]),
                      ""]
    if r["harness_errors"]:
        lines += [f"## Harness errors ({len(r['harness_errors'])}): tasks that crashed, counted as failed",
                  *[f"- {t}: {e}" for t, e in r["harness_errors"].items()], ""]
    lines += [f"Must-pass tasks: {', '.join(r['must_pass']) or 'none configured'}; failed: "
              f"{', '.join(r['must_pass_failed']) or 'none'}", ""]
    return "\n".join(lines)


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


@flow(name=FLOW_NAME, persist_result=False, log_prints=True)
def nightly(overrides: list[str] | None = None, config_name: str = "nightly"):
    from mlflow.entities import Metric
    from prefect.states import Completed, Failed

    from .job import run_job
    from .workers import close_all

    cfg = compose(overrides or [], config_name)
    opts = nightly_options(cfg)
    tolerance, must_pass = opts["tolerance"], opts["must_pass"]
    cfg.setdefault("tracking", {})["run_name"] = cfg["tracking"].get("run_name") or \
        f"nightly-{time.strftime('%Y-%m-%d-%H%M', time.gmtime())}"
    settings = settings_from(cfg)
    try:
        summary = run_job(settings)
    finally:
        close_all()
    tracker = RunTracker(settings.tracking)
    client = tracker.client
    run_id = summary["run_id"]
    client.set_tag(run_id, "fixlab.nightly", "true")
    current = client.get_run(run_id)
    baseline = last_good_nightly(client, current.info.experiment_id, exclude=run_id)
    report = compare(client, current, baseline, tolerance, must_pass)
    tracker.run_id = run_id
    tracker.log_json(report, "nightly/regression_report.json")
    md = markdown(report)
    client.log_text(run_id, md, "nightly/regression_report.md")
    now = int(time.time() * 1000)
    metrics = [Metric("nightly_regression", float(report["verdict"] == "regression"), now, 0)]
    if baseline is not None:
        metrics += [Metric("nightly_pass_at_1_delta", report["pass@1_delta"], now, 0),
                    Metric("nightly_pass_to_fail", float(len(report["pass_to_fail"])), now, 0),
                    Metric("nightly_fail_to_pass", float(len(report["fail_to_pass"])), now, 0),
                    Metric("nightly_tokens_delta", float(report["tokens"]["delta"]), now, 0),
                    Metric("nightly_wall_s_delta", float(report["wall_s"]["delta"]), now, 0)]
        client.set_tag(run_id, "fixlab.nightly.baseline", baseline.info.run_id)
    client.log_batch(run_id, metrics=metrics)
    client.set_tag(run_id, "fixlab.nightly.verdict", report["verdict"])
    print(md)
    if report["verdict"] == "regression":
        return Failed(message="nightly regression: " + "; ".join(report["reasons"]), data=report)
    return Completed(message=f"nightly ok: pass@1={report['pass@1']}", data=report)


# ---------------------------------------------------------------- command line
def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value() or ""


def start_server() -> "object | None":
    """`prefect server start` (a real server: the temporary one runs no scheduler), unless one answers."""
    from .prefect_api import healthy, start_prefect_server

    host = os.environ.setdefault("PREFECT_SERVER_API_HOST", "127.0.0.1")
    port = os.environ.setdefault("PREFECT_SERVER_API_PORT", "4200")
    url = os.environ.setdefault("PREFECT_API_URL", f"http://{host}:{port}/api")
    if healthy(url):
        print(f"fixlab: using the Prefect server at {url}", file=sys.stderr)
        return None
    log = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")) / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = start_prefect_server(host, port, log)
    except RuntimeError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"fixlab: started prefect server at {url} (UI http://{host}:{port}, log {log})", file=sys.stderr)
    return proc


def serve(overrides: list[str]) -> None:
    from prefect.schedules import Cron

    opts = nightly_options(compose(overrides))
    print(f"fixlab: serving {FLOW_NAME}/{DEPLOYMENT} on cron {opts['cron']!r} ({opts['timezone']}) "
          f"against {_api_url()}", file=sys.stderr, flush=True)
    nightly.serve(name=DEPLOYMENT, schedules=[Cron(opts["cron"], timezone=opts["timezone"])],
                  parameters={"overrides": overrides}, pause_on_shutdown=False)


def trigger(overrides: list[str], wait: bool) -> int:
    from prefect.deployments import run_deployment

    from .prefect_api import healthy

    url = _api_url()
    if not url or not healthy(url):
        print(f"error: no Prefect server answers at {url or '(PREFECT_API_URL unset)'}: start `make nightly` first",
              file=sys.stderr)
        return 2
    params = {"overrides": overrides} if overrides else None
    try:
        fr = run_deployment(f"{FLOW_NAME}/{DEPLOYMENT}", parameters=params, timeout=None if wait else 0,
                            poll_interval=2, as_subflow=False)
    except Exception as e:
        if "ObjectNotFound" in type(e).__name__ or "not found" in str(e).lower():
            print(f"error: deployment {FLOW_NAME}/{DEPLOYMENT} is not registered at {url}: start `make nightly` first",
                  file=sys.stderr)
            return 2
        raise
    state = fr.state
    print(json.dumps({"flow_run_id": str(fr.id), "name": fr.name, "state": state.type.value if state else None,
                      "message": state.message if state else None}), flush=True)
    return 1 if wait and state is not None and state.is_failed() else 0


def cli(argv: list[str]) -> int:
    if not argv or argv[0] not in ("serve", "now", "run"):
        print("usage: python -m flows.nightly serve [--start-server] | now [--wait] | run  [hydra overrides...]",
              file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    flags = {a for a in rest if a.startswith("--")}
    overrides = [a for a in rest if not a.startswith("--")]
    unknown = flags - {"--start-server", "--wait"}
    if unknown:
        print(f"error: unknown option {sorted(unknown)[0]}", file=sys.stderr)
        return 2
    try:
        nightly_options(compose(overrides))  # a bad override is one line now, not a failed run at 02:00
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cmd == "now":
        return trigger(overrides, "--wait" in flags)
    if cmd == "run":
        state = nightly(overrides, return_state=True)
        return 1 if state.is_failed() else 0
    server = start_server() if "--start-server" in flags else None
    try:
        serve(overrides)
    finally:
        if server is not None:  # the server's own process group: the CLI and its uvicorn child
            import signal

            os.killpg(server.pid, signal.SIGTERM)
    return 0


if __name__ == "__main__":
    code = cli(sys.argv[1:])
    gc.freeze()  # the interpreter's last collection would walk every object of the jobs' libraries (flows/evaluate.py)
    sys.exit(code)
