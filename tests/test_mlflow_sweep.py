"""What a person browsing MLflow sees for one sweep: a parent run with the jobs' pass@1-vs-rounds plot,
table and best figures; child runs with tags, per-bug-type metrics, a per-task results table and one
trace per task; the cost-accuracy frontier (`python -m flows.frontier --sweep`) logged on the parent; and the UI
itself (`mlflow server` as `make ui` starts it) rendering the run page and the frontier page in headless Chromium.

One sweep (canonical vs buggy test doubles, 2 feedback rounds, 4 tasks) feeds every test in this module.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, base_env, free_port, needs_data, stop_group

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--hide-scrollbars"]


def render(page: str, shot, tmp, drawn=lambda shot: True, tries: int = 3) -> str:
    """The page in headless Chromium after its scripts ran: its live DOM, and a screenshot written to `shot`.

    The screenshot is a second, separate page load. On a busy machine (CI runs the suite on 2 workers) the MLflow UI
    can still be fetching an artifact for its iframe when Chromium's virtual-time budget ends, so a load whose
    screenshot does not show what `drawn` looks for is taken again, up to `tries` loads; the caller's assertion
    still fails when no load draws it."""
    common = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium'}", "--window-size=1400,1000",
              "--virtual-time-budget=20000"]
    dom = subprocess.run([*common, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    for _ in range(tries):
        subprocess.run([*common, f"--screenshot={shot}", page], capture_output=True, text=True, timeout=120)
        if Path(shot).exists() and drawn(shot):
            break
    return dom


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, prefect_api):
    if not Path(REPO / ".." / "shared" / "data" / "humanevalfix_python.jsonl").exists():
        pytest.skip("HumanEvalFix data not found")
    tmp = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{tmp}/mlflow.db"
    env = base_env(tmp)
    env["PREFECT_API_URL"] = prefect_api
    cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}", f"tracking.artifacts={tmp}/artifacts",
           f"hydra.sweep.dir={tmp}/multirun", f"cache_dir={tmp}/trajectories",
           "model=canonical,buggy", "iters=2", "dataset.limit=4", "-m"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    (tmp / "sweep.log").write_text(p.stderr)
    assert p.returncode == 0, p.stderr[-3000:]
    summaries = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    mlflow.set_tracking_uri(uri)
    return {"tmp": tmp, "uri": uri, "summaries": {s["model"]: s for s in summaries},
            "client": MlflowClient(uri)}


def _parent(sweep):
    client = sweep["client"]
    exp = client.get_experiment_by_name("humanevalfix")
    parents = client.search_runs([exp.experiment_id], "tags.`fixlab.kind` = 'sweep'")
    assert len(parents) == 1
    return exp, parents[0]


@needs_data
def test_sweep_parent_run_has_plot_table_and_best_job_metrics(sweep):
    client = sweep["client"]
    exp, parent = _parent(sweep)
    assert parent.info.status == "FINISHED"
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_model = sweep["summaries"]
    assert sorted(r.info.run_id for r in children) == sorted(s["run_id"] for s in by_model.values())

    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"pass_at_1_vs_rounds.png", "sweep_curves.json"} <= arts
    png = Path(client.download_artifacts(parent.info.run_id, "pass_at_1_vs_rounds.png", str(sweep["tmp"])))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "sweep_curves.json",
                                                      str(sweep["tmp"]))).read_text())
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    # Lines are labelled by what the sweep varies (the model), one row per job and round.
    curves = {}
    for r in rows:
        curves.setdefault(r["job"], []).append((r["round"], r["pass_at_1"]))
    assert curves == {"model=canonical": [(0, 1.0), (1, 1.0), (2, 1.0)],
                      "model=buggy": [(0, 0.0), (1, 0.0), (2, 0.0)]}

    m = parent.data.metrics
    assert m["best_pass_at_1"] == 1.0 and m["passed"] == 4 and m["total"] == 4 and m["jobs"] == 2
    assert parent.data.tags["best_run_id"] == by_model["canonical"]["run_id"]
    assert [x.value for x in client.get_metric_history(parent.info.run_id, "pass_at_1_by_iter")] == [1.0, 1.0, 1.0]


@needs_data
def test_child_run_tags_bug_type_metrics_and_results_table(sweep):
    client = sweep["client"]
    run = client.get_run(sweep["summaries"]["buggy"]["run_id"])
    tags = run.data.tags
    assert (tags["model"], tags["strategy"], tags["protocol"]) == ("buggy", "single_shot", "tests")
    assert len(tags["git_commit"]) == 40 and tags["git_dirty"] in ("true", "false")
    by_bug = sweep["summaries"]["buggy"]["pass@1_by_bug_type"]
    assert by_bug and all(run.data.metrics["pass_at_1_" + b.replace(" ", "_")] == 0.0 for b in by_bug)

    table = json.loads(Path(client.download_artifacts(run.info.run_id, "results_table.json",
                                                      str(sweep["tmp"] / "buggy"))).read_text())
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [r["task_id"] for r in rows] == ["Python/0", "Python/1", "Python/2", "Python/3"]
    assert {"bug_type", "verdict", "passed_round", "prompt_tokens", "completion_tokens", "seconds"} <= set(rows[0])
    assert {r["verdict"] for r in rows} == {"failed"} and {r["passed_round"] for r in rows} == {-1}
    results = {json.loads(l)["task_id"]: json.loads(l)
               for l in open(client.download_artifacts(run.info.run_id, "results.jsonl", str(sweep["tmp"] / "b2")))}
    assert all(r["bug_type"] == results[r["task_id"]]["bug_type"] for r in rows)


@needs_data
def test_every_task_is_a_trace_with_model_call_and_sandbox_spans(sweep):
    run_id = sweep["summaries"]["buggy"]["run_id"]
    exp_id = sweep["client"].get_run(run_id).info.experiment_id
    traces = mlflow.search_traces(locations=[exp_id], run_id=run_id, return_type="list")
    assert sorted(t.info.tags["task_id"] for t in traces) == ["Python/0", "Python/1", "Python/2", "Python/3"]
    t = next(t for t in traces if t.info.tags["task_id"] == "Python/0")
    assert t.info.tags["verdict"] == "failed"
    spans = t.data.spans
    rounds = [s for s in spans if s.name.startswith("round ")]
    assert [s.name for s in rounds] == ["round 0", "round 1", "round 2"]
    calls = [s for s in spans if s.span_type == "CHAT_MODEL"]
    assert len(calls) == 3
    first = calls[0]
    assert first.inputs["messages"][-1]["role"] == "user" and "def " in first.inputs["messages"][-1]["content"]
    assert "```python" in first.outputs["choices"][0]["message"]["content"]
    assert first.attributes["mlflow.chat.tokenUsage"]["total_tokens"] == 0  # the oracle double counts none
    # Round 0 ran the buggy code in the sandbox; the later rounds repeated it (not run again).
    runs = [s for s in spans if s.span_type == "TOOL"]
    assert len(runs) == 1 and runs[0].outputs["status"] == "failed" and runs[0].inputs["code"]
    assert runs[0].parent_id == rounds[0].span_id
    assert [s.outputs["decision"] for s in rounds] == ["tested", "repeat", "repeat"]
    assert all(s.start_time_ns >= t.info.timestamp_ms * 1_000_000 - 1_000_000 for s in spans)


@pytest.fixture(scope="module")
def ui(sweep):
    """`mlflow server` with the settings of `make ui` (one worker, no job runner) on a free loopback port."""
    port = free_port()
    env = base_env(sweep["tmp"])
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = open(sweep["tmp"] / "ui.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--workers", "1",
                             "--backend-store-uri", sweep["uri"],
                             "--default-artifact-root", str(sweep["tmp"] / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() - t0 > 90:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"mlflow server did not start: {(sweep['tmp'] / 'ui.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield {"url": url, "startup_s": time.monotonic() - t0}
    stop_group(proc)
    log.close()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())


@needs_data
def test_ui_serves_runs_over_rest_and_renders_run_page_in_chromium(sweep, ui):
    exp = json.loads(urllib.request.urlopen(
        ui["url"] + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=humanevalfix", timeout=30).read())
    exp_id = exp["experiment"]["experiment_id"]
    runs = _post(ui["url"] + "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp_id]})["runs"]
    assert len(runs) == 3  # the sweep's parent and its two jobs
    canonical = next(r for r in runs if r["info"]["run_id"] == sweep["summaries"]["canonical"]["run_id"])
    metrics = {m["key"]: m["value"] for m in canonical["data"]["metrics"]}
    assert metrics["pass_at_1"] == 1.0 and metrics["total"] == 4

    if not CHROMIUM:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium; `make setup` does it as root)")
    run_id = canonical["info"]["run_id"]
    page = f"{ui['url']}/#/experiments/{exp_id}/runs/{run_id}"
    shot = sweep["tmp"] / "run_page.png"
    dom = render(page, shot, sweep["tmp"], drawn=lambda s: s.stat().st_size > 20_000)
    # The single-page app rendered the run: its name, its metrics and its tags are in the live DOM.
    assert canonical["info"]["run_name"] in dom, dom[-2000:]
    assert "pass_at_1" in dom and "single_shot" in dom
    assert shot.exists() and shot.stat().st_size > 20_000
    print(f"run page screenshot: {shot}; UI started in {ui['startup_s']:.1f} s")


@pytest.fixture(scope="module")
def frontier_on_parent(sweep):
    """`python -m flows.frontier --sweep PARENT` as a user runs it: once over the mixed sweep, once for one model."""
    _, parent = _parent(sweep)
    cmd = [sys.executable, "-m", "flows.frontier", "--sweep", parent.info.run_id, "--tracking-uri", sweep["uri"]]
    env = base_env(sweep["tmp"])
    mixed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    one = subprocess.run(cmd + ["--model", "canonical"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return {"parent": parent, "mixed": mixed, "one": one}


@needs_data
def test_frontier_of_the_sweep_is_logged_on_its_parent(sweep, frontier_on_parent):
    from flows.tracking import machine_name

    mixed, one = frontier_on_parent["mixed"], frontier_on_parent["one"]
    # canonical and buggy are two models: one frontier is for one, and the error says how to pick it
    assert mixed.returncode == 2 and mixed.stdout == ""
    assert mixed.stderr.strip() == ("error: the records cover 2 models (buggy, canonical): one frontier is for one "
                                    "model; pick one with --model NAME")
    assert one.returncode == 0, one.stderr[-2000:]
    # the iters=2 job holds budgets 0, 1 and 2 (its rows keep each round's cost): three configurations
    assert one.stdout.splitlines()[0].startswith("Cost-accuracy frontier: canonical, protocol `tests`, 4 tasks, 3 ")
    client, parent_id = sweep["client"], frontier_on_parent["parent"].info.run_id
    # every job says where it ran, and its tasks' seconds make the time axis
    job = client.get_run(sweep["summaries"]["canonical"]["run_id"])
    assert job.data.tags["fixlab.machine"] == machine_name()
    data = json.loads(Path(client.download_artifacts(parent_id, "frontier.json", str(sweep["tmp"] / "fr"))).read_text())
    assert [(c["label"], c["passed"], c["total"], c["run_id"]) for c in data["configs"]] == [
        (f"single_shot iters={b}", 4, 4, job.info.run_id) for b in range(3)]
    config = data["configs"][0]  # the oracle passes at round 0: the smaller budgets cost the same, iters=0 is the point
    assert config["machine"] == machine_name() and config["seconds"] is not None
    assert data["token_frontier"][0] == "single_shot iters=0"
    arts = {a.path for a in client.list_artifacts(parent_id)}
    assert {"frontier.png", "frontier.html", "pass_at_1_vs_rounds.png"} <= arts


@needs_data
def test_ui_shows_the_frontier_page_in_chromium(sweep, ui, frontier_on_parent):
    """The run page's Artifacts view opens frontier.html in its sandboxed iframe; the screenshot shows the page's
    header band (#0b6e4f), which only the frontier page draws."""
    assert frontier_on_parent["one"].returncode == 0
    if not CHROMIUM:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium; `make setup` does it as root)")
    import matplotlib.image

    parent = frontier_on_parent["parent"]
    page = f"{ui['url']}/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}/artifacts/frontier.html"
    shot = sweep["tmp"] / "frontier_page.png"

    def band(shot) -> int:  # pixels of the frontier page's header colour
        pixels = (matplotlib.image.imread(shot)[..., :3] * 255).round().astype(int)
        return int((pixels == [0x0B, 0x6E, 0x4F]).all(-1).sum())

    dom = render(page, shot, sweep["tmp"], drawn=lambda s: band(s) > 5_000)
    assert "mlflow-html-iframe" in dom and "frontier.png" in dom, dom[-2000:]
    assert band(shot) > 5_000, (f"the frontier page's header is not on screen ({band(shot)} pixels, 3 loads); "
                                f"screenshot {shot}")
