"""Many jobs on one tracking store at once, nothing lost: N canonical jobs (the oracle test double) started together
on a fresh sqlite store, then N more on the used store while `make ui`'s MLflow server runs on it. Every run must
end FINISHED with all its task files, results.jsonl and one trace per task linked to it (and no stray trace), with
no traceback in any job's output. Also: the trajectory cache's "keep the longest" across processes, a run that a
live job holds is not resumed a second time, and the temporary Prefect server's port is taken at once.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, base_env, free_port, needs_data, stop_group

JOBS = 4  # started together, each a process of its own
TASKS = 5


def _start_jobs(tmp: Path, uri: str, prefect_api: str, tag: str) -> list[subprocess.Popen]:
    env = base_env(tmp)
    env["PREFECT_API_URL"] = prefect_api
    procs = []
    for i in range(JOBS):
        cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}", f"tracking.artifacts={tmp}/artifacts",
               f"hydra.run.dir={tmp}/outputs/{tag}{i}", "model=canonical", f"dataset.limit={TASKS}", "iters=1",
               "runner.workers=2", f"tracking.run_name={tag}{i}"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append((p.returncode, stdout, stderr))
    return out


def _check_round(uri: str, results, tmp: Path, names: list[str]) -> dict:
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
        for bad in ("Traceback", "database is locked", "Failed to send trace", "could not log"):
            assert bad not in err, f"{bad!r} in a job's stderr:\n{err[-3000:]}"
    run_ids = [json.loads(next(l for l in out.splitlines() if l.startswith("{")))["run_id"] for _, out, _ in results]
    client = MlflowClient(uri)
    mlflow.set_tracking_uri(uri)
    exp = client.get_experiment_by_name("humanevalfix")
    task_ids = sorted(f"Python/{i}" for i in range(TASKS))
    for run_id, name in zip(run_ids, names):
        run = client.get_run(run_id)
        assert (run.info.status, run.info.run_name) == ("FINISHED", name)
        assert run.data.metrics["pass_at_1"] == 1.0 and run.data.metrics["total"] == TASKS
        assert sorted(a.path for a in client.list_artifacts(run_id, "tasks")) == \
            sorted(f"tasks/Python_{i}.json" for i in range(TASKS))
        rows = [json.loads(l) for l in open(client.download_artifacts(run_id, "results.jsonl", str(tmp)))]
        assert sorted(r["task_id"] for r in rows) == task_ids
        traces = mlflow.search_traces(locations=[exp.experiment_id], run_id=run_id, return_type="list")
        assert sorted(t.info.tags["task_id"] for t in traces) == task_ids
        assert all(len(t.data.spans) == 4 for t in traces)  # task, round 0, its model call, its sandbox run
    return {"runs": len(client.search_runs([exp.experiment_id])),
            "traces": len(mlflow.search_traces(locations=[exp.experiment_id], return_type="list",
                                               include_spans=False))}


def _start_ui(tmp: Path, uri: str):
    """`mlflow server` as `make ui` starts it (one worker, no job runner), on a free loopback port."""
    port = free_port()
    env = base_env(tmp)
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = open(tmp / "ui.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--workers", "1",
                             "--backend-store-uri", uri, "--default-artifact-root", str(tmp / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_group(proc)
                pytest.fail(f"mlflow server did not start: {(tmp / 'ui.log').read_text()[-2000:]}")
            time.sleep(0.5)


@needs_data
def test_jobs_started_together_lose_nothing_on_a_fresh_store_and_beside_the_ui(tmp_path, prefect_api):
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t0, cpu0 = time.monotonic(), cpu()
    fresh = _check_round(uri, _finish(_start_jobs(tmp_path, uri, prefect_api, "fresh")), tmp_path / "a",
                         [f"fresh{i}" for i in range(JOBS)])
    t_fresh = time.monotonic() - t0
    assert fresh == {"runs": JOBS, "traces": JOBS * TASKS}

    # The same store, used, with the UI's server reading it (a person browsing while jobs write).
    ui, url = _start_ui(tmp_path, uri)
    try:
        t1 = time.monotonic()
        procs = _start_jobs(tmp_path, uri, prefect_api, "used")
        while any(p.poll() is None for p in procs):  # browse: the runs list, as the UI polls it
            urllib.request.urlopen(url + "/api/2.0/mlflow/experiments/search?max_results=10", timeout=30).read()
            time.sleep(0.5)
        used = _check_round(uri, _finish(procs), tmp_path / "b", [f"used{i}" for i in range(JOBS)])
        t_used = time.monotonic() - t1
        req = urllib.request.Request(url + "/api/2.0/mlflow/runs/search", json.dumps(
            {"experiment_ids": [MlflowClient(uri).get_experiment_by_name("humanevalfix").experiment_id]}).encode(),
            {"Content-Type": "application/json"})
        assert len(json.loads(urllib.request.urlopen(req, timeout=30).read())["runs"]) == 2 * JOBS
    finally:
        stop_group(ui)
    log = (tmp_path / "ui.log").read_text()
    assert "Traceback" not in log and "database is locked" not in log, log[-3000:]
    assert used == {"runs": 2 * JOBS, "traces": 2 * JOBS * TASKS}
    print(f"\nconcurrency: {JOBS} jobs x {TASKS} tasks together; fresh store {t_fresh:.1f} s, used store beside "
          f"the UI server {t_used:.1f} s ({cpu() - cpu0:.0f} CPU s in all); {used['runs']} runs FINISHED, "
          f"{used['traces']} traces, all linked, 0 tracebacks")


# ---------------------------------------------------------------- the trajectory cache, shared by jobs
ROUNDS, CACHED_TASKS = 30, 6


def _cache(root):
    from agents.config import AgentConfig, SingleShotConf
    from agents.models.config import OpenAIModelConf
    from flows.cache import TrajectoryCache
    from sandboxes.config import LocalSandboxConf

    return TrajectoryCache(root, OpenAIModelConf(name="stand-in", model="stand-in"), AgentConfig(SingleShotConf()),
                           LocalSandboxConf())


def _tasks():
    import dataclasses

    from agents.types import Task

    return [Task(**{**{f.name: "" for f in dataclasses.fields(Task)}, "task_id": f"T/{i}", "prompt": f"task {i}"})
            for i in range(CACHED_TASKS)]


def _cache_writer(root, parity, barrier, seen):
    """Round r: this process puts budget 2r + parity for every task (the other process the other one), at the same
    moment; after the round every entry must hold budget 2r + 1, the longer one."""
    from agents.types import Attempt, Trajectory

    cache, tasks = _cache(root), _tasks()
    big = [Attempt(round=0, decision="tested", code="x" * 200_000)]  # a large entry: its write takes a while
    for r in range(ROUNDS):
        barrier.wait()
        for t in tasks:
            cache.put(Trajectory(task_id=t.task_id, bug_type="x", strategy="single_shot", budget=2 * r + parity,
                                 attempts=big), t)
        barrier.wait()
        if parity:
            seen.put([(cache.get(t, 0) or Trajectory(t.task_id, "x", "", -1)).budget for t in tasks])


def test_two_processes_sharing_the_trajectory_cache_keep_the_longest_entry(tmp_path):
    """A job that read the old entry before the other wrote a longer one must not put its shorter one over it."""
    pytest.importorskip("filelock")
    ctx = mp.get_context("fork")
    barrier, seen = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_cache_writer, args=(tmp_path, parity, barrier, seen)) for parity in (0, 1)]
    for p in procs:
        p.start()
    rounds = [seen.get(timeout=120) for _ in range(ROUNDS)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert rounds == [[2 * r + 1] * CACHED_TASKS for r in range(ROUNDS)]
    assert not list(tmp_path.rglob("*.tmp*"))  # no temp file left behind


# ---------------------------------------------------------------- a run is one job's at a time
HOLD = """
import sys, time
from flows.schema import TrackingConf
from flows.tracking import RunTracker
t = RunTracker(TrackingConf(uri=sys.argv[1], artifacts=sys.argv[2]))
print(t.start("held", {"model": {"name": "canonical"}}, {}), flush=True)
time.sleep(120)
"""


def test_a_run_that_a_live_job_holds_is_not_resumed_twice(tmp_path):
    """resume=last takes the newest unfinished run; one whose job still runs (RUNNING, not stopped) is skipped, and
    naming it is a one-line error: two jobs on one run would run and log every task twice."""
    from mlflow.tracking._tracking_service.utils import _get_store

    from flows.config import ConfigError
    from flows.schema import TrackingConf
    from flows.tracking import RunTracker

    tracking = TrackingConf(uri=f"sqlite:///{tmp_path}/mlflow.db", artifacts=str(tmp_path / "artifacts"))
    cfg = {"model": {"name": "canonical"}}
    stopped = RunTracker(tracking).start("stopped", cfg, {})  # its job is gone (as after kill -9): resumable
    # The store object MLflow hands every client of this URI (the trace exporter's too) takes the store lock.
    assert _get_store(tracking.uri)._fixlab_write_lock.lock_file == f"{tmp_path}/mlflow.db.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, tracking.uri, tracking.artifacts], cwd=REPO,
                              env=base_env(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        live = holder.stdout.readline().strip()
        assert len(live) == 32, live
        tracker = RunTracker(tracking)
        assert tracker.last_run_id() == stopped  # newer, but its job still runs
        with pytest.raises(ConfigError, match=f"resume={live}: that run is still going in another job"):
            tracker.start("r", cfg, {}, resume_run_id=live)
    finally:
        holder.kill()
        holder.wait()
    assert RunTracker(tracking).last_run_id() == live  # its job is gone now
    assert RunTracker(tracking).start("r", cfg, {}, resume_run_id=live) == live


# ---------------------------------------------------------------- the temporary Prefect server's port
def test_temporary_prefect_server_port_is_taken_when_chosen():
    """Two jobs started together must not pick the same port: the port is bound here from the moment it is chosen
    (Prefect's own way picks a free-looking port that its server binds seconds later)."""
    from flows.prefect_api import TemporaryServer

    sock = TemporaryServer.bound_socket()  # the server's socket, before the server is started on it
    port = sock.getsockname()[1]
    other = socket.socket()
    try:
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    finally:
        other.close()
        sock.close()


def test_a_stops_mark_is_written_while_another_thread_holds_the_store_lock(tmp_path):
    """A stop marks its runs KILLED in its own thread while the job's threads are torn down; one of them may hold the
    store's lock (exclusive between threads) and never give it back. The mark waits briefly, then writes anyway."""
    import threading

    from flows.tracking import brief_store_waits, open_client, sqlite_path, store_lock

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = open_client(uri)
    run_id = client.create_run(client.create_experiment("stop")).info.run_id
    held, done = threading.Event(), threading.Event()

    def holder():  # a worker caught by the stop inside a store write
        store_lock(sqlite_path(uri)).acquire()
        held.set()
        done.wait(30)

    threading.Thread(target=holder, daemon=True).start()
    assert held.wait(10)
    t0 = time.monotonic()
    with brief_store_waits(0.5):
        client.set_terminated(run_id, status="KILLED")
    took = time.monotonic() - t0
    done.set()
    assert client.get_run(run_id).info.status == "KILLED" and took < 3.0, took


def test_the_mark_handed_over_after_a_stop_kills_only_runs_still_running(tmp_path):
    """flows/mark_killed.py, run once the stopped job is gone: a run it finds RUNNING becomes KILLED; a run that ended
    meanwhile (the job's own unwinding marked it) keeps its status, and so does a run a live job holds again (a
    `resume=last` started at once)."""
    from filelock import FileLock

    from flows.mark_killed import mark_when_free
    from flows.tracking import open_client

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = open_client(uri)
    exp = client.create_experiment("handed-over")
    running, finished, resumed = (client.create_run(exp).info.run_id for _ in range(3))
    client.set_terminated(finished, status="FINISHED")
    claim = tmp_path / "job.lock"
    held = FileLock(str(claim), thread_local=False)
    held.acquire()  # a resume of that run holds its claim
    try:
        assert mark_when_free(uri, [running, finished, f"{resumed}@{claim}"], give_up_s=30) == [running]
    finally:
        held.release()
    assert [client.get_run(r).info.status for r in (running, finished, resumed)] == ["KILLED", "FINISHED", "RUNNING"]
