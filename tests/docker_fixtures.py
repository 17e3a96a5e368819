"""The Docker backend's test precondition: the daemon (started here when installed and not running, stopped when
the test process exits) and the image (`make docker-image`; tests skip with that fix when it is missing)."""
from __future__ import annotations

import atexit
import os
import tempfile

from sandboxes.docker import DEFAULT_IMAGE, docker_problem, start_daemon, stop_daemon

_checked: list = []


def docker_unavailable(image: str = DEFAULT_IMAGE) -> str | None:
    """None when the Docker sandbox can run here, else the one-line reason to skip (checked once per process)."""
    if not _checked:
        why = docker_problem(image=image)
        if why and "daemon is not reachable" in why:
            log = os.path.join(tempfile.gettempdir(), f"fixlab-test-dockerd-{os.getpid()}.log")
            proc = start_daemon(log)
            if isinstance(proc, str):  # the log stays for a look
                why = f"sandbox=docker: the Docker daemon is not running and the tests could not start it: {proc}"
            else:
                atexit.register(_stop, proc, log)
                why = docker_problem(image=image)
        _checked.append(why)
    return _checked[0]


def _stop(proc, log: str) -> None:
    stop_daemon(proc)
    if proc.returncode is not None:
        os.unlink(log)
