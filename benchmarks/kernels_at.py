"""kernels.c (serving/kernels.c) at a git revision, built with this tree's compiler flags, for the benchmarks
that time one tree's compiled kernels against another's in one process (attention.py, int8_matmul.py --against)."""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

from serving import native

REPO = Path(__file__).resolve().parent.parent


def build(rev: str, into: Path, needs: str, since: str, functions: tuple[str, ...]) -> ctypes.CDLL:
    """kernels.c at `rev` ("." = this working tree) built into `into` with today's argument types for `functions`;
    exits with one line where the revision has no kernels.c, lacks `needs` (it came with `since`) or does not build."""
    if rev == ".":
        source = native.SOURCE.read_text()
    else:
        got = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:serving/kernels.c"],
                             capture_output=True, text=True)
        if got.returncode:
            sys.exit(f"error: --against {rev}: no serving/kernels.c at that revision (git log shows commits)")
        source = got.stdout
    if needs not in source:
        sys.exit(f"error: --against {rev}: its kernels.c has no {needs} (it came with {since})")
    name = rev.replace("/", "_")
    src, lib = into / f"kernels-{name}.c", into / f"kernels-{name}.so"
    src.write_text(source)
    done = subprocess.run(["gcc", *native.ISAS[native.default_isa()], *native.FLAGS, str(src), "-o", str(lib)],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: kernels.c at {rev} did not build: {(done.stderr.strip().splitlines() or ['?'])[0][:200]}")
    so = ctypes.CDLL(str(lib))
    ours = native.library()
    for f in functions:
        getattr(so, f).argtypes = getattr(ours, f).argtypes
        getattr(so, f).restype = getattr(ours, f).restype
    return so
