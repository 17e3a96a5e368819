"""run_job is a library function: typed settings and any runner that reports each job's outcome. A job that
raised becomes an error trajectory there (one place), and the run goes on."""
from __future__ import annotations

import pytest

from conftest import job_settings, needs_data


@needs_data
def test_run_job_over_a_plain_runner_turns_a_crash_into_one_error_trajectory(tmp_path, monkeypatch):
    from flows.job import run_job
    from flows.workers import close_all, repair_in_process

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    settings = job_settings("model=canonical", "dataset.limit=3", "iters=1", "offline=true",
                            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifacts={tmp_path}/artifacts")
    seen = []

    def in_order(jobs, settings, done):  # no Prefect: one job after another, in this thread
        for task, sample in jobs:
            seen.append(task.task_id)
            done((task, sample), RuntimeError("worker lost") if task.task_id == "Python/1"
                 else repair_in_process(task, sample, settings))

    def in_order_ok(jobs, settings, done):
        for task, sample in jobs:
            seen.append(task.task_id)
            done((task, sample), repair_in_process(task, sample, settings))

    try:
        summary = run_job(settings, in_order)
    finally:
        close_all()
    assert seen == ["Python/0", "Python/1", "Python/2"]
    assert (summary["total"], summary["passed"], summary["errors"]) == (3, 2, 1)
    assert summary["pass@1_by_iter"] == [round(2 / 3, 6)] * 2 and summary["model"] == "canonical"
    # the run stays open for resume=last, which runs only the task that ended in an error
    from flows.tracking import RunTracker

    assert RunTracker(settings.tracking).client.get_run(summary["run_id"]).info.status == "FAILED"
    seen.clear()
    try:
        again = run_job(job_settings("model=canonical", "dataset.limit=3", "iters=1", "offline=true", "resume=last",
                                     f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                                     f"tracking.artifacts={tmp_path}/artifacts"), in_order_ok)
    finally:
        close_all()
    assert seen == ["Python/1"] and again["run_id"] == summary["run_id"]
    assert (again["passed"], again["errors"]) == (3, 0)
    assert RunTracker(settings.tracking).client.get_run(summary["run_id"]).info.status == "FINISHED"


@needs_data
def test_the_job_writes_its_own_results_file_which_the_analysis_reads(tmp_path, monkeypatch, capsys):
    """When a job ends it writes its self-describing results file (no read-back of the store): the frontier's reader
    and the report's reader take it as they take a recorded full-size run, its per-task verdicts pair with a later
    run (flows.compare --against), and the MLflow run carries it too."""
    import json

    from agents.types import passed_at
    from flows import compare
    from flows.analysis.records import records_from_file
    from flows.job import run_job
    from flows.analysis.records import read_runs
    from flows.results import read
    from flows.tracking import RunTracker
    from flows.workers import close_all, repair_in_process

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    store = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifacts={tmp_path}/artifacts"]

    def in_order(jobs, settings, done):
        for task, sample in jobs:
            done((task, sample), repair_in_process(task, sample, settings))

    runs = []
    for model, where in (("canonical", f"tracking.results={tmp_path}/results"), ("buggy", None)):
        settings = job_settings(f"model={model}", "dataset.limit=4", "iters=1", "offline=true", *store,
                                *([where] if where else []))
        try:
            runs.append(run_job(settings, in_order))
        finally:
            close_all()
    mine, default_place = runs
    path = tmp_path / "results" / mine["results_file"].rsplit("/", 1)[-1]
    assert path.exists() and path.name.startswith("fullsize-canonical-single_shot")
    assert mine["results_file"] == str(path)
    assert default_place["results_file"].startswith(str(tmp_path / "results"))  # beside the store by default
    doc = read(path)  # describes itself: kind, utc, machine, title, config, the command
    assert doc["about"]["kind"] == "fullsize" and doc["about"]["config"]["model.name"] == "canonical"
    rec = doc["runs"][0]
    assert rec["status"] == "FINISHED" and rec["overall"]["passed"] == rec["overall"]["total"] == 4
    assert [r["passed"] for r in rec["by_round"]] == [4, 4] and rec["per_task_mean"]["model_calls"] == 1.0
    assert rec["verdicts"] == {f"Python/{i}#0": [True, True] for i in range(4)}
    assert rec["cost_by_round"] and rec["task_seconds"] is not None and rec["machine_source"] == "job"
    # where its time went (flows/usage.py): the oracle model has no engine, so wall, CPU and memory only
    usage = rec["usage"]
    assert usage == mine["usage"] and 0 < usage["wall_s"] and usage["peak_rss_gib"] > 0 and "engine" not in usage
    assert 0 <= usage.get("machine_cpu_pct", 0) <= 100 * usage["cores"] + 1
    # the one reader: the run, which the report cuts, and its records, one per budget, which the frontier reads
    recs = records_from_file(path)
    assert [(r.params["iters"], r.passed, r.total) for r in recs] == [("0", 4, 4), ("1", 4, 4)]
    [run] = read_runs(path)
    assert run.by_round == [x["passed"] for x in rec["by_round"]] and doc["about"]["schema"] == 2
    assert run.cut(0).passed == 4 and all(passed_at(v) for v in run.outcomes.values())
    # attached to the MLflow run
    client = RunTracker(settings.tracking).client
    assert path.name in [a.path for a in client.list_artifacts(mine["run_id"])]
    # a later session pairs the buggy run against the file's run: every task only in the file's
    capsys.readouterr()
    assert compare.main([default_place["run_id"], f"--tracking-uri=sqlite:///{tmp_path}/mlflow.db",
                         "--against", f"{path}:{mine['run_id'][:8]}"]) == 0
    out = capsys.readouterr().out
    assert "4" in out.splitlines()[-1] and "canonical" in out.splitlines()[-1], out
    assert compare.main([default_place["run_id"], f"--tracking-uri=sqlite:///{tmp_path}/mlflow.db",
                         "--against", f"{path}:ffffffff"]) == 2
    assert "no single run 'ffffffff'" in capsys.readouterr().err
    json.loads(path.read_text())  # plain JSON


@needs_data
def test_prefects_server_starts_beside_the_model_unless_the_build_times_this_machines_paths(tmp_path, monkeypatch):
    """The temporary server's start-up overlaps the model's build, except when the build first times the matmul
    paths: then nothing may share the CPU with those timings, and serving.build starts it after. A model built
    elsewhere (a test double here) or already held: at once."""
    import flows.job as job
    import flows.prefect_api as api
    import flows.prefect_flow as flow
    import flows.workers as workers
    import serving
    from agents.models.config import TransformersModelConf
    from flows.workers import close_all, repair_in_process

    order = []
    for measures, want in ((False, ["server", "model"]), (True, ["model", "server"])):
        monkeypatch.setattr(serving, "_measures_on_build", lambda conf, m=measures: m)
        monkeypatch.setattr(serving, "_build", lambda conf, tuning: order.append("model"))
        order.clear()
        serving.build(TransformersModelConf(name="m", model="m"), beside=lambda: order.append("server"))
        assert order == want, measures

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(api, "start_prefect_api", lambda: order.append("server"))
    build = workers.build_model
    monkeypatch.setattr(workers, "build_model", lambda *a, **k: (order.append("model"), build(*a, **k))[1])

    def in_order(jobs, settings, done):
        for task, sample in jobs:
            done((task, sample), repair_in_process(task, sample, settings))
    monkeypatch.setattr(flow, "run_jobs", in_order)
    order.clear()
    try:
        job.run_job(job_settings("model=canonical", "dataset.limit=1", "iters=0", "offline=true",
                                 f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                                 f"tracking.artifacts={tmp_path}/artifacts"))
    finally:
        close_all()
    assert order == ["server", "model"]


def test_a_run_stopped_while_an_error_unwinds_it_is_killed_not_failed(tmp_path, monkeypatch):
    """SIGTERM inside a flow arrives as Prefect's TerminationSignal, and Prefect records the crash on its server
    before it lets go: an error raised there (a call cut short) reaches run_job in its place. The run was stopped,
    so it is KILLED (resume=last continues it), as for Ctrl-C; a plain error stays FAILED."""
    from prefect.exceptions import TerminationSignal

    from flows.job import run_job
    from flows.tracking import RunTracker
    from flows.workers import close_all

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    statuses = {}
    for name, error in (("stop", TerminationSignal), ("crash", None)):
        settings = job_settings("model=canonical", "dataset.limit=2", "iters=0", "offline=true",
                                f"tracking.uri=sqlite:///{tmp_path}/{name}.db",
                                f"tracking.artifacts={tmp_path}/{name}-artifacts")

        def runner(jobs, settings, done, error=error):
            try:
                if error is not None:
                    raise error(15)
                raise ValueError("a bug in the runner")
            except TerminationSignal:
                raise RuntimeError("the crash's state update was cut short")

        try:
            with pytest.raises((RuntimeError, ValueError)):
                run_job(settings, runner)
        finally:
            close_all()
        client = RunTracker(settings.tracking).client
        run = client.search_runs([client.get_experiment_by_name(settings.tracking.experiment).experiment_id])[0]
        statuses[name] = run.info.status
    assert statuses == {"stop": "KILLED", "crash": "FAILED"}
