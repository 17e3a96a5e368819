"""run_job is a library function: typed settings and any runner that reports each job's outcome. A job that
raised becomes an error trajectory there (one place), and the run goes on."""
from __future__ import annotations

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
