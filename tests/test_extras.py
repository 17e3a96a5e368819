"""`pip install fixlab` without extras (pyproject.toml) runs the harness with the oracle doubles, hosted models and the
local sandbox: nothing on that path may import an extra's package (torch, transformers, xllamacpp, e2b, dask...), and a
feature whose extra is missing is one line naming the extra. The packages are hidden from a child process by an import
hook that fails like a missing package, so the suite's own venv (every extra installed) stands in for a bare one."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import DATA, REPO, base_env, needs_data

# every package the extras bring that fixlab imports, and theirs that matter (a top-level import of any fails the test)
HIDDEN = ("torch", "transformers", "accelerate", "gguf", "sentencepiece", "xllamacpp", "e2b", "e2b_code_interpreter",
          "prefect_dask", "dask", "distributed", "openai")

HIDE = f"""
import sys
HIDDEN = {HIDDEN!r}
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Hide())
"""


def _child(code: str, tmp_path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = base_env(tmp_path)
    env.update(DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env.pop("E2B_API_KEY", None)
    return subprocess.run([sys.executable, "-c", HIDE + code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@needs_data
def test_the_canonical_job_runs_without_any_extra(tmp_path):
    """The CLI's modules, the job (model, local sandbox, MLflow run) over two tasks: no extra's package is imported."""
    code = f"""
import json
try:
    import torch
    raise SystemExit("the import hook did not hide torch")
except ImportError:
    pass
import flows.evaluate, flows.prefect_flow  # the CLI's whole import graph, and the Prefect runner's module
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from flows.config import settings_from
from flows.job import run_job
from flows.workers import close_all, repair_in_process

with initialize_config_dir(config_dir={str(REPO / "conf")!r}, version_base=None):
    cfg = compose(config_name="config", overrides=["model=canonical", "sandbox=local", "dataset.limit=2",
        "dataset.path={DATA}", "iters=1", "offline=true", "tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        "tracking.artifacts={tmp_path}/artifacts", "cache_dir={tmp_path}/trajectories"])
settings = settings_from(OmegaConf.to_container(cfg, resolve=True))

def in_order(jobs, settings, done):  # no Prefect server (12-25 s): one task after another, in this thread
    for task, sample in jobs:
        done((task, sample), repair_in_process(task, sample, settings))

try:
    summary = run_job(settings, in_order)
finally:
    close_all()
print(json.dumps({{"summary": summary, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)}}))
"""
    out = _child(code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    s = result["summary"]
    assert (s["total"], s["passed"], s["errors"], s["sandbox_runs"]) == (2, 2, 0, 2), out.stderr[-3000:]
    assert result["loaded"] == []


@pytest.mark.parametrize("override, extra, missing", [
    ("model=qwen1.5b-coder-q4", "local", "torch is not installed"),
    ("model=smollm2-135m-llamacpp", "llamacpp", "xllamacpp is not installed"),
    ("sandbox=e2b", "e2b", "No module named 'e2b_code_interpreter'"),
    ("runner=dask", "dask", "prefect_dask is not installed"),
])
@needs_data
def test_a_missing_extra_is_one_line_naming_it(tmp_path, override, extra, missing):
    args = ["flows.evaluate", *([] if override.startswith("model=") else ["model=canonical"]), override,
            "dataset.limit=1", f"dataset.path={DATA}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"tracking.artifacts={tmp_path}/artifacts", f"hydra.run.dir={tmp_path}/outputs"]
    code = f"""
import runpy
sys.argv = {args!r}
runpy.run_module("flows.evaluate", run_name="__main__", alter_sys=True)
"""
    out = _child(code, tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip() == (f"error: {override} needs fixlab's [{extra}] extra ({missing}): "
                                  f"pip install 'fixlab[{extra}]'"), out.stderr[-3000:]


def test_the_extras_are_what_pyproject_declares():
    import tomllib

    from agents.extras import EXTRAS

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = project["optional-dependencies"]
    assert set(EXTRAS) <= set(groups)
    assert groups["all"] == [f"fixlab[{','.join(EXTRAS)}]"]
    base = " ".join(project["dependencies"]).lower()
    for heavy in ("torch", "transformers", "gguf", "xllamacpp", "e2b", "dask", "accelerate", "sentencepiece"):
        assert heavy not in base, f"{heavy} is a base dependency: it belongs in an extra"
