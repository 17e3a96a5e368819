"""Processes on this machine by uid: the local sandbox waits on them when it closes; tests and the benchmark check
that a sandbox left none running. And a long program's CPU priority, lowered from outside its jail."""
from __future__ import annotations

import os


def processes_of_uids(uids: range) -> list[tuple[int, int, str]]:
    """(pid, uid, command) of every live, non-zombie process whose real uid is in `uids` (host /proc view)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields.get("Uid", "-1 0").split()[0])
        if uid in uids and not fields.get("State", "").strip().startswith("Z"):
            found.append((int(name), uid, cmd))
    return found


def sandbox_uids(sbx) -> range:
    return range(sbx.uid_base, sbx.uid_base + sbx.workers)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of a live process, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def yield_cpu_below(root: int) -> int:
    """Lowest CPU priority for the program sessions under a sandbox worker (`root`, its bwrap): each program runs in a
    session of its own, and the kernel's autogroups give every session an equal share of the CPU whatever its
    processes' nice, so the jail's own renice (sandboxes/_jail.py) cannot make a loop yield to the model's decoding.
    This writes the session's autogroup nice (/proc/PID/autogroup), which a jail without /proc cannot; where the kernel
    has no autogroups the jail's renice is enough. Returns how many sessions were lowered."""
    parents: dict[int, list[int]] = {}
    sessions: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            parents.setdefault(st[0], []).append(int(name))
            sessions[int(name)] = st[1]
    below, todo = [], list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        below.append(pid)
        todo += parents.get(pid, [])
    worker_sessions = {sessions.get(root)} | {sessions.get(p) for p in parents.get(root, [])}
    lowered = set()
    for pid in below:
        sid = sessions.get(pid)
        if sid in worker_sessions or sid in lowered:
            continue
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write("19")
            lowered.add(sid)
        except OSError:
            pass
    return len(lowered)
