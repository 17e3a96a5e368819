"""The Prefect API a job reports to: PREFECT_API_URL when set, else a temporary local server of this job's own.

Prefect would start a temporary server by itself, but that one outlives a job killed with SIGTERM or SIGKILL
(it is stopped by an atexit hook only). Ours is Prefect's own server command run under `setpriv --pdeathsig
KILL`, so the kernel kills it when the job dies, however it dies. Its address goes into the environment, so
Dask worker processes report to it too instead of each starting a server of their own (12-25 s each here).
"""
from __future__ import annotations

import os
import shutil

from prefect.server.api.server import SubprocessASGIServer

STARTUP_TIMEOUT_S = int(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"))


class _DiesWithJob(SubprocessASGIServer):
    """Prefect's temporary server, started so that it dies with this process (PR_SET_PDEATHSIG)."""

    def _run_uvicorn_command(self):
        import subprocess

        real_popen = subprocess.Popen
        setpriv = shutil.which("setpriv")

        def popen(args, *a, **kw):
            return real_popen([setpriv, "--pdeathsig", "KILL", "--", *args] if setpriv else args, *a, **kw)

        subprocess.Popen = popen  # only for the one call below, made from this thread
        try:
            return super()._run_uvicorn_command()
        finally:
            subprocess.Popen = real_popen


_server: _DiesWithJob | None = None


def ensure_prefect_api() -> str:
    """The API URL this job uses, starting the temporary server if none is configured."""
    global _server
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    if _server is None:
        _server = _DiesWithJob(port=None)
        _server.start(timeout=STARTUP_TIMEOUT_S)
    os.environ["PREFECT_API_URL"] = _server.api_url
    return _server.api_url


def healthy(url: str) -> bool:
    """Whether a Prefect API answers at `url` (its /health endpoint)."""
    import urllib.request

    try:
        urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2).read()
        return True
    except OSError:
        return False


def start_prefect_server(host: str, port: int | str, log_path, env: dict | None = None, timeout_s: float = 120):
    """A real `prefect server start` (the one nightly schedules need; the tests share one per session), in its own
    session so its whole process group can be stopped; returns the process once /health answers."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    url = f"http://{host}:{port}/api"
    log = open(log_path, "a")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", str(host),
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()  # the child holds its own copy
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"prefect server did not start at {url} (log: {log_path})")
        time.sleep(0.5)
    return proc


def stop_prefect_api() -> None:
    """Stop the temporary server now (a clean exit or Ctrl-C; SIGKILL is covered by the kernel)."""
    global _server
    if _server is not None:
        os.environ.pop("PREFECT_API_URL", None)
        _server.stop()
        _server = None
