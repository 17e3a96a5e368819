"""Processes on this machine by uid: the local sandbox waits on them when it closes; tests and the benchmark check
that a sandbox left none running."""
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
