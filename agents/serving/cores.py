"""CPU threads for a model: a fair share of the cores this process may use, among fixlab's model processes.

Two processes that each take every core starve each other (measured here: torch with 2 threads on 2 cores ran
about 3x slower beside a second such process than with 1 thread). So each process that loads a model on the
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


def claim_threads(requested: int | None = None) -> CoreClaim:
    """Threads for a model of this process: `requested`, else FIXLAB_THREADS, else a fair share of the cores."""
    if requested:
        return CoreClaim(max(1, int(requested)), False)
    env = os.environ.get("FIXLAB_THREADS")
    if env:
        return CoreClaim(max(1, int(env)), False)
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
