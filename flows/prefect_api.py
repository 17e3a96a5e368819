"""The Prefect API a job reports to: PREFECT_API_URL when set, else a temporary local server of this job's own.

Prefect would start a temporary server by itself, but that one outlives a job killed with SIGTERM or SIGKILL
(it is stopped by an atexit hook only). Ours is Prefect's own server command run under `setpriv --pdeathsig
KILL`, so the kernel kills it when the job dies, however it dies. Its address goes into the environment, so
Dask worker processes report to it too instead of each starting a server of their own (12-25 s each here).

Its port is not chosen the way Prefect's own would be (a random free-looking port, bound by the server seconds
later: two jobs started together could pick the same one, and then one job's health check reached the other
job's server). This process binds port 0 (the kernel picks a free port) and hands the bound socket to the server,
so the port is this job's from the moment it is chosen. Jobs' temporary servers share one database (in
PREFECT_HOME) and each migrates it as it starts: two starting together on a fresh one broke each other's
migration, so a server's start-up (migrations, block registration; not its imports) holds a file lock there.
"""
from __future__ import annotations

import os
import shutil
import socket
import sys
from functools import cache
from pathlib import Path

STARTUP_TIMEOUT_S = int(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"))


# The server's command: Prefect's app under uvicorn (what SubprocessASGIServer runs), serving on the inherited socket,
# its start-up under the lock argv[2].
_SERVE_ON_SOCKET = """
import socket, sys
import uvicorn
from filelock import FileLock
sock = socket.socket(fileno=int(sys.argv[1]))
startup_lock = FileLock(sys.argv[2], thread_local=False)

class Server(uvicorn.Server):
    async def startup(self, sockets=None):
        startup_lock.acquire()
        try:
            await super().startup(sockets=sockets)
        finally:
            startup_lock.release()

config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, log_level="error", lifespan="on")
Server(config).run(sockets=[sock])
"""


@cache
def _dies_with_job():
    """The server class, made on first use: Prefect's server module takes 2.5 s to import, and a job that reports to
    PREFECT_API_URL (the tests, a nightly, a user's own server) never starts one."""
    from prefect.server.api.server import SubprocessASGIServer

    class _DiesWithJob(SubprocessASGIServer):
        """Prefect's temporary server, started so that it dies with this process (PR_SET_PDEATHSIG), on a port bound
        here before the server starts."""

        _sock: socket.socket | None = None

        def find_available_port(self) -> int:
            # Bound, not listening: until the server listens a connection is refused at once (the start-up health
            # check waits), and no other process can bind the port in the meantime.
            self._close_socket()
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.bind(("127.0.0.1", 0))
            return self._sock.getsockname()[1]

        def _close_socket(self) -> None:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

        def _run_uvicorn_command(self):
            import subprocess

            from prefect.settings import get_current_settings

            if self._sock is None:  # a port given from outside: bind it here all the same
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("127.0.0.1", int(self.port)))
                self._sock = sock
            settings = get_current_settings()
            env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
                   **settings.to_environment_variables(exclude_unset=True)}
            home = Path(settings.home).expanduser()
            home.mkdir(parents=True, exist_ok=True)
            fd = self._sock.fileno()
            setpriv = shutil.which("setpriv")
            cmd = [sys.executable, "-c", _SERVE_ON_SOCKET, str(fd), str(home / ".fixlab-server-startup.lock")]
            try:
                return subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", *cmd] if setpriv else cmd,
                                        env=env, pass_fds=(fd,))
            finally:
                self._close_socket()  # the server holds its own copy

    return _DiesWithJob


_server = None  # this job's temporary server (_dies_with_job)


def ensure_prefect_api() -> str:
    """The API URL this job uses, starting the temporary server if none is configured."""
    global _server
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    if _server is None:
        _server = _dies_with_job()(port=None)
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
