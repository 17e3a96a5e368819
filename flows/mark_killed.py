"""The KILLED mark of a stopped job's runs, written after the job is gone when the job could not write it in time.

A stop (SIGTERM, Ctrl-C: flows/evaluate.py) leaves within seconds and marks its runs KILLED on the way out. The store
can be busy past that deadline: another thread of the job, torn down mid-write, may hold SQLite's write lock (CI once
left a run RUNNING so). The job then hands its runs to `python -m flows.mark_killed URI RUN_ID...`, a detached process
that waits for the store (the job's locks die with it) and marks each run that is still RUNNING and that no live job
holds (a `resume=last` started meanwhile holds its run's claim: flows/tracking.py); it writes nothing else and gives up
after GIVE_UP_S.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

GIVE_UP_S = 120.0


@dataclass(frozen=True)
class OpenRun:
    """A run a stop must mark KILLED: in the job's process while it can (`client`), else by this module's process."""
    uri: str
    run_id: str
    client: object  # the job's MlflowClient (its writes take the store lock)
    claim: str | None = None  # the run's claim lock (state/<run>/job.lock), held by whichever job runs it

    def mark(self) -> None:
        self.client.set_terminated(self.run_id, status="KILLED")


def hand_over(runs: list[OpenRun]) -> int | None:
    """Start the detached process that marks `runs` (one store) KILLED once the store is free; its pid, or None if it
    could not start (the runs then stay RUNNING, and `resume=last` still finds them)."""
    if not runs:
        return None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flows.mark_killed", runs[0].uri,
                                 *(r.run_id + (f"@{r.claim}" if r.claim else "") for r in runs)],
                                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # not in the job's process group: a Ctrl-C there spares it
    except OSError:
        return None
    return proc.pid


def mark_when_free(uri: str, runs: list[str], give_up_s: float = GIVE_UP_S) -> list[str]:
    """Mark each run (`RUN_ID` or `RUN_ID@CLAIM_LOCK`) KILLED if it is still RUNNING and no live job holds its claim,
    retrying while the store is busy; the run ids marked."""
    from filelock import FileLock, Timeout

    from .tracking_store import open_client

    deadline = time.monotonic() + give_up_s
    marked: list[str] = []
    pending = list(runs)
    while pending and time.monotonic() < deadline:
        try:
            client = open_client(uri)
            for arg in list(pending):
                run_id, _, claim = arg.partition("@")
                lock = FileLock(claim, thread_local=False) if claim else None
                try:
                    if lock is not None:
                        lock.acquire(timeout=0)  # held: a job (a resume) runs it now, and marks it itself
                except Timeout:
                    pending.remove(arg)
                    continue
                try:
                    if client.get_run(run_id).info.status == "RUNNING":  # a run that ended keeps its status
                        client.set_terminated(run_id, status="KILLED")
                        marked.append(run_id)
                finally:
                    if lock is not None:
                        lock.release()
                pending.remove(arg)
        except Exception:  # the store is still locked (or briefly unreachable): wait and try again
            time.sleep(0.5)
    return marked


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print("usage: python -m flows.mark_killed TRACKING_URI RUN_ID[@CLAIM_LOCK]...", file=sys.stderr)
        sys.exit(2)
    job, waited = os.getppid(), time.monotonic()
    while os.getppid() == job and time.monotonic() - waited < 30:  # the job leaves at once; its claims go with it
        time.sleep(0.05)
    mark_when_free(sys.argv[1], sys.argv[2:])
