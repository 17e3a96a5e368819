"""CPU threads for a model: a fair share of the cores this process may use, among fixlab's model processes.

Two processes that each take every core starve each other (measured here: torch with 2 threads on 2 cores ran
several times slower beside a second such process than with 1 thread). So each process that loads a model on the
CPU registers itself in a machine-wide folder (one file per process, held under an flock for its whole life,
so a crashed process's file counts as gone) and takes cores // (processes already there + 1), at least 1.
The share is decided when the model loads: a process that started first keeps its threads.
`model.threads=N` (or FIXLAB_THREADS=N) overrides it; `taskset` narrows the cores a process may use.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from pathlib import Path

_lock = threading.Lock()
_claims: dict[int, list] = {}  # pid -> [open flocked registration file, number of models holding it]


def usable_cores() -> int:
    """The cores this process may use (affinity/cgroup aware where the OS says so)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def registry_dir() -> Path:
    root = os.environ.get("FIXLAB_CORES_DIR") or Path(tempfile.gettempdir()) / f"fixlab-cores-{os.getuid()}"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _others(folder: Path, me: int) -> int:
    """Live fixlab model processes other than this one; files of dead ones are removed."""
    live = 0
    for f in folder.glob("*.pid"):
        if f.stem == str(me):
            continue
        try:
            with open(f, "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # got it: its owner is gone
                f.unlink(missing_ok=True)
        except BlockingIOError:
            live += 1
        except OSError:
            pass
    return live


class CoreClaim:
    """This process's registration while a model is loaded; `release()` (the model's close) ends it."""

    def __init__(self, threads: int, registered: bool):
        self.threads, self._registered = threads, registered

    def release(self) -> None:
        if not self._registered:
            return
        self._registered = False
        me = os.getpid()
        with _lock:
            claim = _claims.get(me)
            if claim is None:
                return
            claim[1] -= 1
            if claim[1] <= 0:
                del _claims[me]
                try:
                    Path(claim[0].name).unlink(missing_ok=True)
                finally:
                    claim[0].close()


def would_claim(requested: int | None = None) -> int:
    """The threads claim_threads would give a model of this process now, without registering one."""
    if requested:
        return max(1, int(requested))
    if os.environ.get("FIXLAB_THREADS"):
        return max(1, int(os.environ["FIXLAB_THREADS"]))
    try:
        return max(1, usable_cores() // (_others(registry_dir(), os.getpid()) + 1))
    except OSError:
        return usable_cores()


def claim_threads(requested: int | None = None) -> CoreClaim:
    """Threads for a model of this process: `requested`, else FIXLAB_THREADS, else a fair share of the cores."""
    if requested or os.environ.get("FIXLAB_THREADS"):
        return CoreClaim(would_claim(requested), False)
    cores = usable_cores()
    me = os.getpid()
    try:
        with _lock:
            folder = registry_dir()
            if me not in _claims:  # after a fork the child registers itself anew
                fh = open(folder / f"{me}.pid", "a")
                fcntl.flock(fh, fcntl.LOCK_EX)
                _claims[me] = [fh, 0]
            _claims[me][1] += 1
            others = _others(folder, me)
    except OSError:  # no writable temp folder: every usable core
        return CoreClaim(cores, False)
    return CoreClaim(max(1, cores // (others + 1)), True)


# libgomp (torch's OpenMP on Linux) keeps a team of worker threads for each thread that ran a parallel region, for
# the life of that thread. Once it manages more threads than the process has cores, it stops spinning between
# regions, and every parallel op then waits for a futex wake: the model loads (and measures its paths) in the
# caller's thread and serves from the engine's, so the loader's idle team made every small decode op many times
# slower (benchmarks/decode_profile.py's results files, with and without it).
_gomp = None


def _libgomp():
    """torch's libgomp as loaded in this process (found in /proc/self/maps, inside torch's folder), or None
    (another OpenMP runtime, or not Linux)."""
    global _gomp
    if _gomp is None:
        _gomp = False
        try:
            import ctypes

            import torch

            root = os.path.dirname(os.path.dirname(torch.__file__))  # site-packages: torch/lib or torch.libs
            with open("/proc/self/maps") as f:
                paths = {line.split(None, 5)[5].strip() for line in f if "libgomp" in line and line.count(" ") >= 5}
            mine = sorted(p for p in paths if p.startswith(os.path.join(root, "torch")))
            if mine:
                lib = ctypes.CDLL(mine[0])
                lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
                _gomp = lib
        except (OSError, AttributeError, IndexError):
            pass
    return _gomp or None


def release_thread_team() -> bool:
    """End the OpenMP worker team of the calling thread (omp_pause_resource_all, soft: the next parallel region in
    this thread starts a new one). Called where a thread other than the engine's has finished its torch work (a
    model's load). True when released."""
    lib = _libgomp()
    return bool(lib is not None and lib.omp_pause_resource_all(1) == 0)
