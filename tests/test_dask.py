"""runner=dask: the task map runs on a local Dask cluster of worker processes (prefect-dask), each loading
the model once, with results identical to the thread runner. Both jobs run as one sweep (one process)."""
from __future__ import annotations

import json
import re

import pytest
from mlflow.tracking import MlflowClient

from conftest import needs_data


def _rows(client, run_id, dest):
    rows = [json.loads(l) for l in open(client.download_artifacts(run_id, "results.jsonl", str(dest)))]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _by_runner(run):
    out = {}
    for s in run.summaries:
        params = MlflowClient(run.tracking_uri).get_run(s["run_id"]).data.params
        out[params["runner.name"]] = s
    return out


@needs_data
def test_dask_local_cluster_matches_thread_runner(evaluate):
    run = evaluate("runner=threads,dask", "runner.workers=2", "++runner.threads_per_worker=1", "model=canonical",
                   "iters=1", "dataset.limit=6", "cache=false", "-m")
    assert run.rc == 0, run.stderr[-3000:]
    jobs = _by_runner(run)
    assert set(jobs) == {"threads", "dask"}
    figures = ("pass@1", "passed", "total", "pass@1_by_iter", "pass@1_by_bug_type", "errors")
    assert {k: jobs["dask"][k] for k in figures} == {k: jobs["threads"][k] for k in figures}
    assert jobs["dask"]["passed"] == 6
    client = MlflowClient(run.tracking_uri)
    assert _rows(client, jobs["dask"]["run_id"], evaluate.tmp / "d") == \
        _rows(client, jobs["threads"]["run_id"], evaluate.tmp / "t")

    # The thread job loaded the model in the main process; the dask job in each of its 2 worker processes
    # (once each), never again in the main process.
    loads = re.findall(r"fixlab: process (\d+) loaded model canonical", run.stderr)
    main_pid, *worker_pids = loads
    assert len(worker_pids) == len(set(worker_pids)) == 2 and main_pid not in worker_pids, loads


@pytest.mark.slow
@needs_data
def test_dask_with_real_model_matches_thread_runner(evaluate):
    """The smollm2-135m pack (real weights, greedy) on 2 tasks: same answers through 2 Dask worker processes
    as through the thread runner. One request in flight per process on both sides, so batching is the same."""
    common = ("model=smollm2-135m", "iters=0", "dataset.limit=2", "max_new_tokens=48", "cache=false")
    threads = evaluate("runner=threads", "runner.workers=1", *common, timeout=1500)
    dask = evaluate("runner=dask", "runner.workers=2", "runner.threads_per_worker=1", *common, timeout=1500)
    assert threads.rc == 0, threads.stderr[-3000:]
    assert dask.rc == 0, dask.stderr[-3000:]
    assert len(set(re.findall(r"fixlab: process (\d+) loaded model smollm2-135m", dask.stderr))) == 2
    dask_rows = _rows(MlflowClient(dask.tracking_uri), dask.summary["run_id"], evaluate.tmp / "d")
    assert dask_rows == _rows(MlflowClient(threads.tracking_uri), threads.summary["run_id"], evaluate.tmp / "t")
    assert all(r["completion_tokens"] > 0 for r in dask_rows)  # the model really answered


def test_dask_runner_bad_address_is_one_line_error():
    from flows.config import ConfigError
    from flows.prefect_flow import check_runner
    from conftest import free_port

    addr = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConfigError, match=f"^runner.address {addr}: no Dask scheduler answers there"):
        check_runner({"name": "dask", "address": addr, "workers": 2})
    check_runner({"name": "threads", "workers": 2})  # nothing to check
