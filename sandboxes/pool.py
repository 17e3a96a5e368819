"""The warm-worker pool both the local and the Docker backends are (`_WorkerPool`): one worker per slot, checked out by
one run at a time, replaced when in doubt, and all of them stopped by close() or at interpreter exit. Apart from
worker.py (one worker's run) and the backends (local.py, docker.py: how a worker is started).
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref

from .base import ExecResult, SandboxUnavailable
from .config import PoolSandboxConf
from .languages.base import Program
from .worker import _Worker

_live: "weakref.WeakSet[_WorkerPool]" = weakref.WeakSet()


class _WorkerPool:
    """Warm workers (one per slot, each a `_Worker`), checked out by one run at a time and replaced when in doubt.
    The backends differ only in how a worker is started: LocalSandbox in a bubblewrap jail, DockerSandbox
    (sandboxes/docker.py) in a container. mode=fresh: a worker runs one program and is discarded."""

    name = ""
    worker_class: type = _Worker
    isolated = False
    switch_uid = False

    def _init_pool(self, c: PoolSandboxConf, default_uid_base: int) -> None:
        """Check and keep the options every backend with a worker pool shares (each error one line)."""
        mode, workers, uid_base = c.mode, c.workers, c.uid_base
        if mode not in ("fork", "fresh"):
            raise SandboxUnavailable(f"sandbox mode must be 'fork' or 'fresh', got {mode!r}")
        n = workers if workers is not None else (os.cpu_count() or 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SandboxUnavailable(f"sandbox workers must be a positive integer, got {workers!r}")
        for k in ("memory_mb", "cpu_s", "max_processes", "max_file_mb", "max_open_files", "max_output_mb",
                  "scratch_mb", "output_cap_bytes"):
            v = getattr(c, k)
            if not isinstance(v, (int, float)) or v <= 0:
                raise SandboxUnavailable(f"sandbox option {k} must be a positive number, got {v!r}")
        self.mode, self.workers, self.allow_fork = mode, n, bool(c.allow_fork)
        if uid_base is None:  # per process, so that sandboxes of parallel processes do not share uids
            uid_base = default_uid_base + (os.getpid() % 10000) * 64
        self.scratch_mb, self.uid_base = int(c.scratch_mb), int(uid_base)
        self.ready_timeout_s = float(c.ready_timeout_s)
        self.max_output_bytes = int(c.max_output_mb * 1024 * 1024)
        self.output_cap_bytes = int(c.output_cap_bytes)
        self.limits = {"memory_bytes": int(c.memory_mb * 1024 * 1024), "cpu_s": int(c.cpu_s),
                       "processes": int(c.max_processes), "file_bytes": int(c.max_file_mb * 1024 * 1024),
                       "open_files": int(c.max_open_files)}
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(n)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._free_slots = list(range(n))
        self._closed = False

    def service_fd(self, program) -> int | None:
        """A warm compile service's connection for the program (LocalSandbox has them); None: its steps run."""
        return None

    def _checkout(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("sandbox is closed")
            w = self._idle.pop() if self._idle else self.worker_class(self, self._free_slots.pop())
            self._busy.add(w)
            return w

    def _checkin(self, w: _Worker, healthy: bool) -> None:
        replace = None
        with self._lock:
            self._busy.discard(w)
            if healthy and self.mode == "fork" and not self._closed:
                self._idle.append(w)
                return
        w.kill()
        with self._lock:
            if self.mode == "fork" and not self._closed:
                replace = self.worker_class(self, w.slot)  # starts warming now, in the background
                self._idle.append(replace)
            else:
                self._free_slots.append(w.slot)

    def warm_up(self) -> None:
        """Start every worker now and wait until each has imported the helper (optional)."""
        with self._lock:
            while self._free_slots and self.mode == "fork":
                self._idle.append(self.worker_class(self, self._free_slots.pop()))
            idle = list(self._idle)
        for w in idle:
            why = w.wait_ready(self.ready_timeout_s)
            if why:
                raise SandboxUnavailable(f"sandbox worker failed to start: {why}")

    def run(self, program: "str | Program", timeout_s: float) -> ExecResult:
        if not isinstance(program, (str, Program)):
            raise TypeError(f"program must be Python source or a Program, got {type(program).__name__}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        with self._sem:
            w = self._checkout()
            healthy = False
            try:
                why = w.wait_ready(self.ready_timeout_s)
                if why:
                    return ExecResult(status="error", stderr=f"sandbox worker failed to start: {why}",
                                      backend=self.name, details={"isolated": self.isolated})
                result, healthy = w.execute(program, float(timeout_s))
                return result
            finally:
                self._checkin(w, healthy)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = self._idle + list(self._busy)
            self._idle = []
        for w in workers:
            w.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@atexit.register
def _close_all() -> None:
    for sbx in list(_live):
        try:
            sbx.close()
        except Exception:
            pass
