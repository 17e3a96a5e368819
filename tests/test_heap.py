"""The engine's heap setting (serving/heap.py): with map_large_blocks, tensors of a few MiB freed between
long-lived small ones go back to the OS at once; without it glibc keeps them as free heap (the 2.2 GiB of free heap
seen at the default job's peak). Each case in a fresh interpreter: the setting is process-wide."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = """
import json, sys, torch
from serving.heap import free_heap_bytes, map_large_blocks
if sys.argv[1] == "on":
    map_large_blocks()
first = torch.empty(2 << 20)        # 8 MiB, mapped; once freed glibc raises its mmap threshold past it
del first
# Holes that torch's import left free in the heap would take the small blocks below, the large ones would lie
# side by side at the top and go back to the OS when freed: fill every hole of 1 MiB and up first
fillers = [torch.empty(1 << 18) for _ in range(int(free_heap_bytes()) // (1 << 20) + 1)]
big, small = [], []
for i in range(48):                 # KV-buffer-sized blocks, each followed by a small block that stays
    big.append(torch.ones(2 << 20))  # 8 MiB
    small.append(torch.ones(1 << 18))  # 1 MiB: it can no longer fit in a hole below
del big
print(json.dumps({"free_heap_mib": free_heap_bytes() / 2**20}))
"""


def _free_heap_mib(mode: str) -> float:
    # torch's huge-page allocations (THP_MEM_ALLOC_ENABLE, which serving sets) are page-aligned, so glibc maps
    # every one of 2 MiB and up by itself whatever its threshold: the heap's own behaviour is seen with them off
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0"}
    p = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])["free_heap_mib"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_blocks_of_a_few_mib_leave_the_heap_only_with_map_large_blocks():
    off, on = _free_heap_mib("off"), _free_heap_mib("on")
    assert off > 300, f"without the setting the freed 8 MiB blocks should stay as free heap ({off:.0f} MiB)"
    assert on < 32, f"with map_large_blocks they should have gone back to the OS ({on:.0f} MiB free heap)"


HUGE = """
import json, os, sys
if sys.argv[1] == "off":
    os.environ["THP_MEM_ALLOC_ENABLE"] = "0"  # the user's own setting
import serving  # asks torch for huge pages before torch allocates anything
import torch
from serving import huge_pages
before = huge_pages()["gib"] or 0.0
kv = torch.ones(64 << 20, dtype=torch.uint8)  # a KV-cache-sized buffer, touched
print(json.dumps({"env": os.environ.get("THP_MEM_ALLOC_ENABLE"), "gib": huge_pages()["gib"] - before,
                  "mode": huge_pages()["mode"]}))
"""


def _huge(mode: str) -> dict:
    p = subprocess.run([sys.executable, "-c", HUGE, mode], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux transparent huge pages")
def test_large_tensors_lie_on_huge_pages_once_agents_serving_is_imported_unless_the_user_says_no():
    on, off = _huge("on"), _huge("off")
    assert on["env"] == "1" and off["env"] == "0"
    assert off["gib"] < 0.01  # the user's 0 wins
    if on["mode"] not in ("madvise", "always"):
        pytest.skip(f"this kernel's transparent huge pages are {on['mode']!r}: torch's advice has no effect")
    assert on["gib"] >= 0.05, on  # most of the 64 MiB buffer on 2 MiB pages
