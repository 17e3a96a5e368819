"""Fair share of the cores: a second fixlab model process beside a first takes half, a dead or closed one
stops counting, and an explicit thread count always wins."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from serving import cores
from conftest import REPO

HOLDER = textwrap.dedent("""
    import sys
    from serving.cores import claim_threads
    claim = claim_threads(None)
    print(claim.threads, flush=True)
    sys.stdin.readline()          # hold the claim until told
    claim.release()
    print("released", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("FIXLAB_CORES_DIR", str(tmp_path))
    monkeypatch.delenv("FIXLAB_THREADS", raising=False)
    return tmp_path


def _holder(registry):
    env = dict(os.environ, FIXLAB_CORES_DIR=str(registry), PYTHONPATH=str(REPO))
    env.pop("FIXLAB_THREADS", None)
    p = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env, cwd=REPO)
    first = int(p.stdout.readline())
    return p, first


def test_second_process_takes_its_share_and_gets_all_back_when_the_first_goes(registry):
    n = cores.usable_cores()
    holder, its_threads = _holder(registry)
    try:
        assert its_threads == n  # alone on the machine: every core
        mine = cores.claim_threads(None)
        assert mine.threads == max(1, n // 2)
        mine.release()
        # the first process closes its model: it no longer counts
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        again = cores.claim_threads(None)
        assert again.threads == n
        again.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_process_stops_counting_and_its_file_is_removed(registry):
    holder, _ = _holder(registry)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (registry / f"{holder.pid}.pid").exists()  # nobody could remove it ...
    claim = cores.claim_threads(None)
    assert claim.threads == cores.usable_cores()  # ... but it does not count
    assert not (registry / f"{holder.pid}.pid").exists()
    claim.release()
    assert list(registry.glob("*.pid")) == []


def test_explicit_threads_win(registry, monkeypatch):
    holder, _ = _holder(registry)
    try:
        assert cores.claim_threads(3).threads == 3  # model.threads=3
        monkeypatch.setenv("FIXLAB_THREADS", "5")
        assert cores.claim_threads(None).threads == 5
        assert not (registry / f"{os.getpid()}.pid").exists()  # an explicit count registers nothing
    finally:
        holder.kill()
        holder.wait()
