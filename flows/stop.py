"""How a job stops: SIGTERM and Ctrl-C end it within seconds with its run marked KILLED (`resume=last` continues it),
and a job whose reader went away keeps going. flows/evaluate.py installs both before the job starts."""
from __future__ import annotations

import io
import os
import sys
import threading
import time

from .job import STOPPING
from .mark_killed import OpenRun, hand_over
from .prefect_api import stop_prefect_api


class Stop:
    """Marks the runs KILLED when a stop cannot wait for the job to unwind (run_job hands over its open run).

    The mark starts the moment the signal arrives, in its own thread, over the runs open at that moment, and both ways
    out (the job unwinding, or the watcher after GRACE_S) wait for it until the same deadline. A store write can wait
    past it (another thread of the job, torn down mid-write, may hold SQLite's lock: CI once left the run RUNNING so);
    the runs not marked by then go to a detached process that marks them once the job is gone (flows/mark_killed.py)."""

    job_run: OpenRun | None = None
    signalled = STOPPING  # SIGTERM or Ctrl-C arrived (set by the handler, or the watcher the C-level handler wakes)
    GRACE_S = 3.0  # tasks in flight (a model call can take minutes) are dropped after this; resume reruns them
    # Past the grace, a mark still running gets this much longer; then the process leaves regardless (and hands the
    # mark over). A stop whose mark is done by the end of the grace still leaves at once.
    MARK_WAIT_S = 5.0
    marker: threading.Thread | None = None
    runs: list[OpenRun] = []
    marked: set[str] = set()
    deadline = 0.0
    _lock = threading.Lock()

    @classmethod
    def hold(cls, run: OpenRun | None) -> None:
        with cls._lock:
            if cls.marker is None:  # once a stop began, its runs are fixed: the job unwinding must not drop them
                cls.job_run = run

    @classmethod
    def start_marking(cls) -> None:
        from .sweep import SweepParentRun

        with cls._lock:
            if cls.marker is not None:
                return
            cls.runs = [r for r in (cls.job_run, SweepParentRun.open_run()) if r is not None]
            cls.deadline = time.monotonic() + cls.GRACE_S + cls.MARK_WAIT_S
            cls.marker = threading.Thread(target=cls._mark, name="fixlab-mark-killed", daemon=True)
            cls.marker.start()

    @classmethod
    def _mark(cls) -> None:
        from .tracking import brief_store_waits

        with brief_store_waits():  # the store lock's holder may be a thread this stop tears down
            for run in cls.runs:
                try:
                    run.mark()
                    cls.marked.add(run.run_id)
                except Exception:
                    pass

    @classmethod
    def leave(cls) -> None:
        """Wait for the mark until the deadline, hand what is not marked by then to a process of its own, say so, and
        leave at once (an unmarked run stays RUNNING; resume=last still finds it)."""
        cls.start_marking()
        cls.marker.join(max(0.0, cls.deadline - time.monotonic()))
        pending = [r for r in cls.runs if r.run_id not in cls.marked]
        helper = hand_over(pending) if pending else None
        said = ("the run is marked KILLED" if not pending else
                f"the store was busy, so process {helper} marks the run KILLED once it is free" if helper else
                "the store was busy, the run left RUNNING")
        say(f"fixlab: stopped; {said} and `resume=last` continues it")
        stop_now(130)


def stop_on_signals() -> None:
    """SIGTERM and Ctrl-C stop a job within seconds. The handler raises KeyboardInterrupt, which unwinds the job
    (the run is marked KILLED; `resume=last` continues it). Python runs that handler only when the main thread
    gets back to bytecode, and Prefect can hold it for as long as a task in flight takes (measured: as long as the
    answer it waits for), so the signal also wakes a watcher thread through signal.set_wakeup_fd (written by the C-level
    handler at once): it starts the KILLED mark, and after GRACE_S leaves. Finished tasks are already on disk."""
    import signal

    def handler(signum, frame):
        Stop.signalled.set()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    threading.Thread(target=_leave_after_grace, args=(r,), name="fixlab-stop", daemon=True).start()


def _leave_after_grace(fd: int) -> None:
    import signal

    while os.read(fd, 1)[0] not in (signal.SIGTERM, signal.SIGINT):
        pass
    Stop.signalled.set()
    Stop.start_marking()
    time.sleep(Stop.GRACE_S)
    Stop.leave()


def say(line: str) -> None:
    """One line on stderr, if anyone still reads it: a parent that died (a closed pipe) must not stop the stop."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class ReaderMayLeave(io.TextIOBase):
    """sys.stdout or sys.stderr of a job whose reader may go away (a wrapper or an ssh session died, `| head`): the
    first write to the closed pipe points the descriptor at /dev/null, so that write and every later one (the job's
    progress, Hydra's, the sandboxes' children) succeed. Otherwise the job's next line raised BrokenPipeError and
    the job died with exit 1 and its tasks in flight (CI once: the job stopped that way instead of by its SIGTERM)."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            self._stream.flush()  # what the buffer held goes to /dev/null

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return self._stream.encoding

    @property
    def errors(self) -> str:
        return self._stream.errors

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    @classmethod
    def install(cls) -> None:
        sys.stdout, sys.stderr = cls(sys.stdout), cls(sys.stderr)


def stop_now(code: int) -> None:
    """Leave at once: worker threads still inside a task would hold a normal exit until their task ends (minutes
    for a model call). Every finished task is already on disk and the run is already marked, so nothing is lost."""
    try:
        stop_prefect_api(drain_logs=False)
    finally:
        for stream in (sys.stderr, sys.stdout):
            try:
                stream.flush()
            except (OSError, ValueError):  # its reader is gone
                pass
        os._exit(code)
