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


@needs_data
def test_dask_runner_bad_address_is_one_line_error(evaluate):
    run = evaluate("runner=dask", "runner.address=tcp://127.0.0.1:9", "model=canonical", "dataset.limit=1",
                   "cache=false", timeout=300)
    assert run.rc == 2, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1].startswith("error: runner.address tcp://127.0.0.1:9: no Dask scheduler")
