"""The Prefect API a job reports to: PREFECT_API_URL when set, else a temporary local server of this job's own.

Prefect would start a temporary server by itself, but that one outlives a job killed with SIGTERM or SIGKILL
(it is stopped by an atexit hook only). Ours is Prefect's own server command run under `setpriv --pdeathsig
KILL`, so the kernel kills it when the job dies, however it dies. Its address goes into the environment, so
Dask worker processes report to it too instead of each starting a server of their own, each slow to start.

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


class TemporaryServer:
    """Prefect's API under uvicorn in a child process that dies with this one (PR_SET_PDEATHSIG), on a socket bound
    here. Started at once, waited for on first use: a job starts it before it builds its model, so the server's
    start-up (its imports, the database's migrations: a noticeable part of a job's start, benchmarks/startup.py)
    runs beside the build. Prefect's own SubprocessASGIServer starts and waits in one call, and its module alone is
    slow to import."""

    def __init__(self):
        import subprocess

        from prefect.settings import get_current_settings

        settings = get_current_settings()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               **settings.to_environment_variables(exclude_unset=True)}
        home = Path(settings.home).expanduser()
        home.mkdir(parents=True, exist_ok=True)
        sock = self.bound_socket()
        self.port = sock.getsockname()[1]
        cmd = [sys.executable, "-c", _SERVE_ON_SOCKET, str(sock.fileno()), str(home / ".fixlab-server-startup.lock")]
        setpriv = shutil.which("setpriv")
        try:
            self.process = subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", *cmd] if setpriv else cmd,
                                            env=env, pass_fds=(sock.fileno(),))
        finally:
            sock.close()  # the server holds its own copy
        self.ready = False

    @staticmethod
    def bound_socket() -> socket.socket:
        """Bound, not listening: until the server listens a connection is refused at once (the wait below polls), and
        no other process can bind the port in the meantime."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        return sock

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait(self, timeout_s: float = STARTUP_TIMEOUT_S) -> str:
        """The API URL once /health answers; RuntimeError if the server exits or does not answer in time."""
        import time

        deadline = time.monotonic() + timeout_s
        while not self.ready:
            if healthy(self.api_url, timeout_s=1):
                self.ready = True
            elif self.process.poll() is not None:
                raise RuntimeError(f"Prefect's temporary server exited with code {self.process.returncode} before it "
                                   "answered (its error is above); fix: set PREFECT_API_URL to a running server")
            elif time.monotonic() > deadline:
                raise RuntimeError(f"Prefect's temporary server did not answer within {timeout_s:.0f} s; fix: raise "
                                   "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS or set PREFECT_API_URL")
            else:
                time.sleep(0.1)
        return self.api_url

    def stop(self) -> None:
        import subprocess

        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_server: TemporaryServer | None = None  # this process's temporary server


def start_prefect_api() -> None:
    """Start the temporary server now, without waiting for it, unless PREFECT_API_URL is set or it is started."""
    global _server
    if _server is None and not os.environ.get("PREFECT_API_URL"):
        _server = TemporaryServer()


def ensure_prefect_api() -> str:
    """The API URL this job uses: PREFECT_API_URL, else the temporary server's once it answers (started if need be)."""
    if os.environ.get("PREFECT_API_URL") and _server is None:
        return os.environ["PREFECT_API_URL"]
    start_prefect_api()
    os.environ["PREFECT_API_URL"] = _server.wait()
    # Prefect's process-wide settings were read from the environment when prefect was imported, before the URL was
    # there; a thread outside a flow's context reads those, and without a URL it starts a server of Prefect's own
    # (seen: one that outlived a stopped job). Read again, they hold the URL.
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()
    return _server.api_url


def healthy(url: str, timeout_s: float = 2) -> bool:
    """Whether a Prefect API answers at `url` (its /health endpoint)."""
    import urllib.request

    try:
        urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s).read()
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


def stop_prefect_api(drain_logs: bool = True) -> None:
    """Stop the temporary server now (a clean exit or Ctrl-C; SIGKILL is covered by the kernel). On a clean exit the
    flow and task lines still queued for the API go first: a server stopped under Prefect's log worker made it print
    "--- Error logging to API --- All connection attempts failed" as a sweep's last line. A stop does not wait."""
    global _server
    if _server is not None:
        handlers = sys.modules.get("prefect.logging.handlers")  # not loaded: nothing was logged to the API
        if drain_logs and handlers is not None:
            try:
                handlers.APILogHandler.flush()  # blocks until the queue is sent, 5 s at most
            except Exception:
                pass
        os.environ.pop("PREFECT_API_URL", None)
        _server.stop()
        _server = None
