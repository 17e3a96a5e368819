"""Shared fixtures: an isolated MLflow store, Prefect home and offline environment per test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = (REPO / ".." / "shared" / "data" / "humanevalfix_python.jsonl").resolve()

needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"HumanEvalFix data not found at {DATA}")


def pytest_configure(config):
    """Under pytest-xdist (`make test`: 3 workers, whole files each), every model a worker or its evaluate subprocesses
    load takes 1 thread: workers whose torch takes every core starve each other (serving/cores.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and "FIXLAB_THREADS" not in os.environ:
        os.environ["FIXLAB_THREADS"] = "1"


# The longest files first (make test --durations=0, summed a file; Xeon, 2026-11-29), so that the workers given
# whole files end together; the rest keep their order. Only a scheduling hint: a stale list costs minutes, never a
# result.
LONGEST_FIRST = ("test_repeat_real.py", "test_repeat_nightly.py", "test_resume.py", "test_rescore.py",
                 "test_stream.py", "test_models_packs.py", "test_concurrency.py", "test_harness_e2e.py", "test_languages_agents.py",
                 "test_dask.py", "test_lang_java.py", "test_lang_rust.py", "test_lang_go.py",
                 "test_sweep_cache.py", "test_models_llamacpp.py", "test_nightly.py", "test_mlflow_sweep.py",
                 "test_sandbox_attacks.py", "test_mlflow_postgres.py", "test_hf_batching.py", "test_trace.py",
                 "test_real_model.py", "test_agents_real_model.py", "test_report.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


def job_settings(*overrides: str, config_name: str = "config"):
    """The typed settings `python -m flows.evaluate OVERRIDES` runs with: composed from conf/ and checked."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from flows.config import settings_from

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    return settings_from(OmegaConf.to_container(cfg, resolve=True))


def base_env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PREFECT_HOME=str(tmp / "prefect"),
               PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    return env


@dataclass
class EvalRun:
    rc: int
    stdout: str
    stderr: str
    tracking_uri: str

    @property
    def summaries(self) -> list[dict]:
        return [json.loads(l) for l in self.stdout.splitlines() if l.startswith("{")]

    @property
    def summary(self) -> dict:
        s = self.summaries
        assert len(s) == 1, f"expected one JSON line, got {len(s)}:\n{self.stdout}\n{self.stderr[-3000:]}"
        return s[0]


def stop_group(proc: subprocess.Popen, wait_s: float = 15) -> None:
    """SIGTERM a server's whole process group, SIGKILL it if it lingers."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """One real `prefect server start` on a free loopback port for the whole session: every evaluate
    subprocess would otherwise start its own temporary server (12-25 s each on 2 cores)."""
    from flows.prefect_api import start_prefect_server

    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = base_env(home)
    env.update(PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    try:
        proc = start_prefect_server("127.0.0.1", port, home / "server.log", env=env)
    except RuntimeError as e:
        pytest.fail(f"{e}: {(home / 'server.log').read_text()[-2000:]}")
    url = f"http://127.0.0.1:{port}/api"
    yield url
    stop_group(proc)


@pytest.fixture
def evaluate(tmp_path, prefect_api):
    """Run `python -m flows.evaluate ARGS...` for real, against a throwaway MLflow store and the
    session's Prefect server."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"

    def run(*args: str, timeout: float = 600, env_extra: dict | None = None) -> EvalRun:
        cmd = [sys.executable, "-m", "flows.evaluate", f"tracking.uri={uri}",
               f"tracking.artifacts={tmp_path}/artifacts", f"hydra.run.dir={tmp_path}/outputs",
               f"hydra.sweep.dir={tmp_path}/multirun", f"cache_dir={tmp_path}/trajectories", *args]
        env = base_env(tmp_path)
        env.update(PREFECT_API_URL=prefect_api)
        env.update(env_extra or {})
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        return EvalRun(p.returncode, p.stdout, p.stderr, uri)

    run.tmp = tmp_path
    run.uri = uri
    return run
