"""No lost work: a run killed with kill -9 mid-way continues with resume=last, runs only the missing tasks,
logs to the same MLflow run and ends with the same figures and per-task results as an uninterrupted run.

The oracle double's `model.delay_s` (a test-double knob, result-neutral) slows each answer down so the kill lands
mid-run; the resume runs without it.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, base_env, needs_data

N = 10
ARGS = ("model=canonical", "iters=1", f"dataset.limit={N}", "runner.workers=2", "cache=false")
SLOW = "model.delay_s=1.5"  # the oracle double takes 1.5 s an answer
FIGURES = ("pass@1", "passed", "total", "pass@1_by_iter", "pass@1_by_bug_type", "errors", "prompt_tokens",
           "completion_tokens")


def _rows(client, run_id, dest):
    path = client.download_artifacts(run_id, "results.jsonl", str(dest))
    rows = [json.loads(l) for l in open(path)]
    # Durations differ between runs; everything the agent did must not.
    return [{k: ([{a: b for a, b in x.items() if a != "seconds"} for x in v] if k == "attempts" else v)
             for k, v in r.items() if k != "seconds"} for r in rows]


def _statuses_once_marked(uri: str, wait_s: float = 60.0) -> dict[str, str]:
    """{kind: status} of the store's runs once none is RUNNING (or after wait_s): a stop whose mark the store held up
    hands it to a process that writes it after the job is gone (flows/mark_killed.py)."""
    deadline = time.monotonic() + wait_s
    while True:
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("humanevalfix").experiment_id])
        kinds = {r.data.tags.get("fixlab.kind", "job"): r.info.status for r in runs}
        if "RUNNING" not in kinds.values() or time.monotonic() > deadline:
            return kinds
        time.sleep(0.5)


@needs_data
def test_kill_9_mid_run_then_resume_matches_uninterrupted_run(evaluate, prefect_api):
    full = evaluate(*ARGS)
    assert full.rc == 0, full.stderr[-3000:]
    expected = full.summary

    # Same job in a store of its own, slowed down, killed with SIGKILL once a few tasks are on disk.
    tmp = evaluate.tmp / "killed"
    uri = f"sqlite:///{tmp}/mlflow.db"
    common = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}", f"tracking.artifacts={tmp}/artifacts",
              f"hydra.run.dir={tmp}/outputs", *ARGS]
    env = base_env(tmp)
    env.update(PREFECT_API_URL=prefect_api)
    proc = subprocess.Popen([*common, SLOW], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    state = tmp / "state"
    while True:
        done = list(state.glob("*/tasks/*.json")) if state.exists() else []
        if len(done) >= 3:
            break
        assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no task finished in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run, sandboxes included, as a machine stop would
    proc.wait()
    saved = len(list(state.glob("*/tasks/*.json")))
    assert 3 <= saved < N
    run_id = next(state.iterdir()).name
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"  # kill -9: nobody could mark it

    p = subprocess.run([*common, "resume=last"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("{")))
    assert resumed["run_id"] == run_id
    assert f"{N - saved} to run" in p.stderr
    assert {k: resumed[k] for k in FIGURES} == {k: expected[k] for k in FIGURES}

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["fixlab.resumed"] == "1"
    assert run.data.params["model.name"] == "canonical" and run.data.metrics["pass_at_1"] == expected["pass@1"]
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the same MLflow run, no second one
    assert _rows(client, run_id, tmp / "a") == _rows(MlflowClient(full.tracking_uri), expected["run_id"], tmp / "b")
    assert len(client.list_artifacts(run_id, "tasks")) == N
    mlflow.set_tracking_uri(uri)
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run_id, return_type="list",
                                  include_spans=False)
    assert sorted(t.info.tags["task_id"] for t in traces) == sorted(f"Python/{i}" for i in range(N))



def test_resume_with_other_settings_is_one_line_error(tmp_path):
    """Resuming with another config would mix two configs' results in one run: refused, naming the key."""
    from flows.config import ConfigError
    from flows.schema import TrackingConf
    from flows.tracking import RunTracker

    import pytest

    tracking = TrackingConf(uri=f"sqlite:///{tmp_path}/mlflow.db", artifacts=str(tmp_path / "artifacts"))
    cfg = {"model": {"name": "canonical"}, "iters": 1, "resume": None, "runner": {"workers": 8}}
    run_id = RunTracker(tracking).start("r", cfg, {})
    # runner, tracking, resume and speed knobs may change (another machine, more workers, threads) ...
    assert RunTracker(tracking).start("r", {**cfg, "resume": run_id, "runner": {"workers": 2},
                                            "model": {"name": "canonical", "threads": 1}}, {},
                                      resume_run_id=run_id) == run_id
    # ... the model may not.
    with pytest.raises(ConfigError, match=r"config differs from that run's at model.name \('canonical' there, 'buggy' now\)"):
        RunTracker(tracking).start("r", {**cfg, "model": {"name": "buggy"}}, {}, resume_run_id=run_id)
    # A knob the run's params lack resumes at its default, not at another value.
    ss = {**cfg, "strategy": {"name": "single_shot", "candidates": 1}}
    old = RunTracker(tracking).start("r", ss, {})
    grown = {**ss, "strategy": {**ss["strategy"], "self_tests": 0}}
    assert RunTracker(tracking).start("r", grown, {}, resume_run_id=old) == old
    with pytest.raises(ConfigError, match=r"at strategy.self_tests \(None there, '4' now\)"):
        RunTracker(tracking).start("r", {**ss, "strategy": {**ss["strategy"], "self_tests": 4}}, {}, resume_run_id=old)
    # A whole number logged as 10 or 10.0 is one value.
    timed = {**ss, "sandbox": {"timeout_s": 10}}
    logged = RunTracker(tracking).start("r", timed, {})
    assert RunTracker(tracking).start("r", {**ss, "sandbox": {"timeout_s": 10.0}}, {}, resume_run_id=logged) == logged


def _children(pid: int) -> set[int]:
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out |= {int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()}
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        return not open(f"/proc/{pid}/status").read().split("State:")[1].strip().startswith("Z")
    except (OSError, IndexError):
        return False


@needs_data
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_job_leaves_nothing_behind_and_resumes(tmp_path, sig, prefect_api):
    """SIGTERM: out within seconds, the run marked KILLED, even when the store is locked as the stop lands (a thread
    torn down mid-write): a process of its own then marks it once the store is free. SIGKILL: nobody can mark it, but
    the job's own temporary Prefect server dies with it all the same. Either way `resume=last` finishes the run
    (against the session's Prefect server: a second temporary one would only cost time)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}", f"tracking.artifacts={tmp_path}/artifacts",
           f"hydra.run.dir={tmp_path}/outputs", *ARGS]
    env = base_env(tmp_path)  # no PREFECT_API_URL: the job starts its own temporary server
    # SIGTERM: answers take longer than the 5 s allowed, so tasks are still in flight when it lands
    slow = "model.delay_s=8" if sig == signal.SIGTERM else SLOW
    proc = subprocess.Popen([*cmd, slow], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state = tmp_path / "state"
    deadline = time.monotonic() + 240
    while not (state.exists() and len(list(state.glob("*/tasks/*.json"))) >= 2):
        assert proc.poll() is None, f"run ended before it could be stopped: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no task finished in time"
        time.sleep(0.2)
    children = _children(proc.pid)
    assert children, "the job should have started its temporary Prefect server"
    locked = None
    if sig == signal.SIGTERM:  # the store's write lock held by someone else for the whole stop
        locked = sqlite3.connect(tmp_path / "mlflow.db", timeout=60, isolation_level=None)
        locked.execute("BEGIN EXCLUSIVE")
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(60)
    took = time.monotonic() - t0
    time.sleep(1.0)
    assert [c for c in children if _alive(c)] == []  # the temporary server and the sandbox jails are gone
    run_id = next(state.iterdir()).name
    if sig == signal.SIGTERM:
        from flows.stop import Stop as _Stop  # the grace for tasks in flight, then at most MARK_WAIT_S for the mark

        said = proc.stderr.read()[-2000:]
        assert rc == 130 and took < _Stop.GRACE_S + _Stop.MARK_WAIT_S + 1.0, (rc, took, said)
        assert "marks the run KILLED once it is free" in said, said
        locked.execute("ROLLBACK")
        locked.close()
        assert _statuses_once_marked(uri) == {"job": "KILLED"}
    else:
        assert MlflowClient(uri).get_run(run_id).info.status == "RUNNING"
    env["PREFECT_API_URL"] = prefect_api
    p = subprocess.run([*cmd, "resume=last"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("{")))
    assert resumed["run_id"] == run_id and resumed["passed"] == N


@needs_data
def test_a_job_whose_parent_died_still_stops_within_seconds(tmp_path, prefect_api):
    """A wrapper that read the job's output died (its pipes closed) before the job wrote a line: the job keeps going
    (its lines go nowhere; CI once saw the first one kill it with exit 1), and a SIGTERM then stops it within seconds,
    not when its tasks in flight end."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}", f"tracking.artifacts={tmp_path}/artifacts",
           f"hydra.run.dir={tmp_path}/outputs", *ARGS, "model.delay_s=30"]
    env = base_env(tmp_path)
    env["PREFECT_API_URL"] = prefect_api
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the parent is gone: nobody reads what the job writes
    proc.stderr.close()
    state = tmp_path / "state"
    deadline = time.monotonic() + 240
    while not (state.exists() and list(state.glob("*"))):  # the run exists: its tasks are in flight (30 s each)
        assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before it could be stopped"
        assert time.monotonic() < deadline, "the run did not start in time"
        time.sleep(0.2)
    time.sleep(2.0)  # past the job's line naming its run, and Prefect's flow lines
    assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before it could be stopped"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    took = time.monotonic() - t0
    from flows.stop import Stop as _Stop

    assert rc == 130 and took < _Stop.GRACE_S + _Stop.MARK_WAIT_S + 1.0, (rc, took)
    assert _statuses_once_marked(uri) == {"job": "KILLED"}


@needs_data
def test_sigterm_during_a_sweep_marks_its_parent_run_killed_too(tmp_path, prefect_api):
    """A stop leaves through os._exit (tasks in flight cannot hold it), past atexit: the sweep's parent run must
    not be left RUNNING beside its KILLED job."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [a for a in ARGS if not a.startswith("iters=")]
    cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}", f"tracking.artifacts={tmp_path}/artifacts",
           f"hydra.sweep.dir={tmp_path}/multirun", *args, "model.delay_s=8", "iters=0,1", "-m"]
    env = base_env(tmp_path)
    env["PREFECT_API_URL"] = prefect_api
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state = tmp_path / "state"
    deadline = time.monotonic() + 240
    while not (state.exists() and list(state.glob("*/tasks/*.json"))):
        assert proc.poll() is None, f"run ended before it could be stopped: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no task finished in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 130
    said = proc.stderr.read()[-1500:]
    kinds = _statuses_once_marked(uri)
    assert kinds == {"sweep": "KILLED", "job": "KILLED"}, (kinds, said)
