"""A team's MLflow: a real PostgreSQL, a real `mlflow server` on it, and 4 jobs at once logging to the server (one over
runner=dask), each run FINISHED with every task's artifact; a store that cannot be reached is one line."""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, base_env, free_port, needs_data, stop_group

pytestmark = [pytest.mark.slow, needs_data]

PG_BIN = next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), None)


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its commands as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres():
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (make setup installs the postgresql package)")
    home = Path(tempfile.mkdtemp(prefix="fixlab-pg-", dir="/tmp"))  # a path the postgres user can reach
    if os.geteuid() == 0:
        shutil.chown(home, "postgres", "postgres")
    data, port = home / "data", free_port()
    subprocess.run(_as_postgres([f"{PG_BIN}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres"]),
                   check=True, capture_output=True)
    subprocess.run(_as_postgres([f"{PG_BIN}/pg_ctl", "-D", str(data), "-l", str(home / "log"), "-w", "-o",
                                 f"-p {port} -k {home} -c listen_addresses=127.0.0.1", "start"]),
                   check=True, capture_output=True)
    try:
        subprocess.run(_as_postgres([f"{PG_BIN}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                                     "mlflow"]), check=True, capture_output=True)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(_as_postgres([f"{PG_BIN}/pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = base_env(tmp)
    env.update(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true")
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres,
                             "--default-artifact-root", str(tmp / "artifacts"), "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            assert proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer"
            time.sleep(1)
    yield url
    stop_group(proc, 20)
    log.close()


def test_four_jobs_at_once_log_to_an_mlflow_server_on_postgresql(mlflow_server, prefect_api, tmp_path):
    env = base_env(tmp_path)
    env["PREFECT_API_URL"] = prefect_api
    common = ["model=canonical", "dataset.limit=4", "iters=0", "cache=false", f"tracking.uri={mlflow_server}",
              f"tracking.artifacts={tmp_path}/artifacts", "tracking.experiment=team"]
    procs = []
    for i, extra in enumerate([[], [], [], ["runner=dask", "runner.workers=1", "runner.threads_per_worker=2"]]):
        procs.append(subprocess.Popen([sys.executable, "-m", "flows.evaluate", *common, *extra,
                                       f"tracking.run_name=job{i}", f"hydra.run.dir={tmp_path}/outputs{i}"],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("team")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["job0", "job1", "job2", "job3"]
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.metrics["pass_at_1"] == 1.0
        tasks = [a.path for a in client.list_artifacts(r.info.run_id, "tasks")]
        assert len(tasks) == 4, (r.info.run_name, tasks)


@pytest.mark.parametrize("uri,says", [("postgresql://postgres@127.0.0.1:{port}/mlflow", "cannot reach the MLflow store"),
                                      ("http://127.0.0.1:{port}", "cannot reach the MLflow store"),
                                      ("mysql://u@127.0.0.1:{port}/mlflow", "its driver pymysql is not installed"
                                       if importlib.util.find_spec("pymysql") is None
                                       else "cannot reach the MLflow store")])
def test_a_store_that_cannot_be_reached_is_one_line(uri, says, tmp_path):
    uri = uri.format(port=free_port())  # nothing listens there
    p = subprocess.run([sys.executable, "-m", "flows.evaluate", "model=canonical", "dataset.limit=1",
                        f"tracking.uri={uri}", f"tracking.artifacts={tmp_path}/artifacts",
                        f"hydra.run.dir={tmp_path}/outputs"], cwd=REPO, env=base_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert says in lines[-1] and "fix:" in lines[-1], lines[-3:]
