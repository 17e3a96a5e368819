"""runner=dask: the task map runs on a local Dask cluster of worker processes (prefect-dask), each loading
the model once, with results identical to the thread runner."""
from __future__ import annotations

import json
import re

import pytest
from mlflow.tracking import MlflowClient

from conftest import needs_data


def _rows(client, run_id, dest):
    rows = [json.loads(l) for l in open(client.download_artifacts(run_id, "results.jsonl", str(dest)))]
    return [{k: ([{a: b for a, b in x.items() if a != "seconds"} for x in v] if k == "attempts" else v)
             for k, v in r.items() if k != "seconds"} for r in rows]


@needs_data
def test_dask_local_cluster_matches_thread_runner(evaluate):
    common = ("runner.workers=2", "model=canonical", "iters=1", "dataset.limit=6", "cache=false")
    threads = evaluate("runner=threads", *common)
    dask = evaluate("runner=dask", "runner.threads_per_worker=1", *common)
    assert threads.rc == 0, threads.stderr[-3000:]
    assert dask.rc == 0, dask.stderr[-3000:]
    figures = ("pass@1", "passed", "total", "pass@1_by_iter", "pass@1_by_bug_type", "errors")
    assert {k: dask.summary[k] for k in figures} == {k: threads.summary[k] for k in figures}
    assert dask.summary["passed"] == 6
    client = MlflowClient(dask.tracking_uri)
    assert client.get_run(dask.summary["run_id"]).data.params["runner.name"] == "dask"
    assert _rows(client, dask.summary["run_id"], evaluate.tmp / "d") == \
        _rows(client, threads.summary["run_id"], evaluate.tmp / "t")

    # The thread job loaded the model in its main process; the dask job in each of its 2 worker processes
    # (once each), never in its main process.
    main_pid = re.findall(r"fixlab: process (\d+) loaded model canonical", threads.stderr)
    worker_pids = re.findall(r"fixlab: process (\d+) loaded model canonical", dask.stderr)
    assert len(main_pid) == 1 and len(worker_pids) == len(set(worker_pids)) == 2, (main_pid, worker_pids)


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
    from flows.schema import DaskRunnerConf, ThreadsRunnerConf
    from conftest import free_port

    addr = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConfigError, match=f"^runner.address {addr}: no Dask scheduler answers there"):
        check_runner(DaskRunnerConf(address=addr, workers=2))
    check_runner(ThreadsRunnerConf(workers=2))  # nothing to check
