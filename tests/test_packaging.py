"""`pip install .` (not editable) ships everything a job needs: every package directory, the prompt templates, the C
source of the int8 loops and the Hydra configs (conf/, inside the wheel as flows/conf)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from conftest import REPO

PACKAGES = ("agents", "serving", "sandboxes", "flows")


def test_the_wheel_holds_every_package_prompt_and_config(tmp_path):
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "mlruns", "outputs", "multirun", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                          "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("fixlab-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())

    wanted = {str(p.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
              if "__pycache__" not in p.parts and not p.is_relative_to(REPO / "flows" / "conf")}
    wanted |= {str(p.relative_to(REPO)) for p in (REPO / "agents" / "prompts").rglob("*") if p.is_file()}
    wanted |= {str(p.relative_to(REPO)) for p in REPO.joinpath("serving").rglob("*.c")}  # compiled at first use
    wanted |= {"flows/" + str(p.relative_to(REPO)) for p in (REPO / "conf").rglob("*") if p.is_file()}
    assert not wanted - shipped, sorted(wanted - shipped)
    dirs = {p.parent for p in map(REPO.joinpath, wanted) if p.suffix == ".py"}
    assert all((d / "__init__.py").is_file() for d in dirs), "a code directory without __init__.py is not a package"
