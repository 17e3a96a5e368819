"""Readings that repeat where users rely on them, with a real model (the SmolLM2 pack in float32 through fixlab's
engine, whose path repeats): a job stopped by SIGTERM and resumed at another batch limit gives the answers of one
that ran through. (Two nightly runs: test_repeat_nightly.py, a file of its own so that the suite's two workers can
run the two slowest tests at once.)"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, base_env, needs_data

pytestmark = [pytest.mark.slow, needs_data]

# answers cut at 96 tokens: the point is that they repeat, not how long they are (the suite's slowest test otherwise)
JOB = ("model=smollm2-135m", "dataset.limit=8", "iters=1", "cache=false", "temperature=0.7", "runner.workers=8",
       "max_new_tokens=96")


def _cmd(tmp: Path, *args: str, module: str = "flows.evaluate", command: tuple = ()) -> list[str]:
    return [sys.executable, "-m", module, *command, f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            f"tracking.artifacts={tmp}/artifacts", f"hydra.run.dir={tmp}/outputs", *args]


def _answers(tmp: Path) -> dict[str, list]:
    """Every task's attempts (code, verdict, tokens) from the run's state files."""
    out = {}
    for f in sorted((tmp / "state").glob("*/tasks/*.json")):
        t = json.loads(f.read_text())
        out[t["task_id"]] = [(a.get("code"), a.get("passed"), a.get("completion_tokens")) for a in t["attempts"]]
    return out


def test_a_job_stopped_by_sigterm_and_resumed_gives_the_answers_of_one_that_ran_through(tmp_path, prefect_api):
    env = base_env(tmp_path)
    env["PREFECT_API_URL"] = prefect_api
    through = tmp_path / "through"
    p = subprocess.run(_cmd(through, *JOB), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "answers repeat bit for bit" in p.stderr  # the path line says so
    assert json.loads(p.stdout.strip().splitlines()[-1])["total"] == 8

    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(_cmd(stopped, *JOB, "model.max_batch=3"), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while len(list((stopped / "state").glob("*/tasks/*.json"))) < 2:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "no task finished in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 130
    done = len(list((stopped / "state").glob("*/tasks/*.json")))
    assert done < 8, "the job finished before it could be stopped"
    p = subprocess.run(_cmd(stopped, *JOB, "model.max_batch=5", "resume=last"), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _answers(stopped) == _answers(through)
