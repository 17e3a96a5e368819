"""The MLflow store a job writes to: its URI and artifact root, the database driver and reachability probe, and the
cross-process lock that lets many jobs share one sqlite store. Apart from tracking.py (what a run logs) because every
MLflow reader and writer (jobs, sweeps, compare, frontier, `make ui`'s init-store) opens the store this one way.

Many jobs on one store at once (a sweep's workers, the nightly flow beside someone's run): SQLite takes one writer at
a time and MLflow's sqlite store fails a write that waits longer than its 20 s busy timeout ("database is locked",
lost trace links), and two processes creating a fresh store both run its migrations. So for a sqlite store every
process makes the store under a cross-process file lock (<db>.lock) and takes the same lock around each MLflow write
transaction: fixlab's writers queue on the lock instead of racing SQLite's busy handler.
"""
from __future__ import annotations

import os
import re
import sys
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path

from agents.tasks import project_root

from .config import ConfigError
from .schema import TrackingConf

MLRUNS = project_root() / "mlruns"  # the checkout's (or, installed, the working directory's)


def tracking_uri(tracking: TrackingConf) -> str:
    return tracking.uri or f"sqlite:///{MLRUNS / 'mlflow.db'}"


def artifact_root(tracking: TrackingConf) -> str:
    return Path(tracking.artifacts or MLRUNS / "artifacts").resolve().as_uri()


# ---------------------------------------------------------------- one sqlite store, many processes
# A write waits this long for the store lock, then goes ahead unlocked (SQLite's own busy handling): a job stopped
# with Ctrl-Z while it holds the lock must not hang every other job.
STORE_LOCK_WAIT_S = 120.0
# A waiting writer retries this often (filelock polls, and a write holds the lock briefly): at filelock's default
# interval many processes logging traces at once spent much of their time waiting between tries.
STORE_LOCK_POLL_S = 0.002
_store_locks: dict[str, object] = {}
_store_locks_guard = threading.Lock()
# brief_store_waits: a stop's KILLED mark waits briefly for the store lock (its thread only). The lock is exclusive
# between threads and its holder may be a thread the stop is tearing down; at STORE_LOCK_WAIT_S the mark outlasted
# the stop's deadline and left the runs RUNNING.
_lock_wait = threading.local()


@contextmanager
def brief_store_waits(seconds: float = 0.5):
    """In this thread, store writes wait at most `seconds` for the store lock, then write without it."""
    _lock_wait.s = seconds
    try:
        yield
    finally:
        _lock_wait.s = None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// tracking URI, None for any other store (a server, a file store)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def store_lock(db: Path):
    """The cross-process lock of one sqlite store (one object per store and process: re-entrant per thread,
    exclusive between threads and processes)."""
    from filelock import FileLock

    key = str(Path(db).resolve())
    with _store_locks_guard:
        if key not in _store_locks:
            _store_locks[key] = FileLock(key + ".lock")
        return _store_locks[key]


@contextmanager
def _holding(lock, what: str):
    """Hold `lock`, or after STORE_LOCK_WAIT_S go ahead without it (one warning line)."""
    from filelock import Timeout

    brief = getattr(_lock_wait, "s", None)
    try:
        lock.acquire(timeout=STORE_LOCK_WAIT_S if brief is None else brief, poll_interval=STORE_LOCK_POLL_S)
    except Timeout:
        if brief is None:
            print(f"fixlab: {what}: the store lock {lock.lock_file} is held for over {STORE_LOCK_WAIT_S:.0f} s "
                  f"(a stopped job?); writing without it", file=sys.stderr, flush=True)
        yield
        return
    try:
        yield
    finally:
        lock.release()


def open_client(uri: str):
    """An MlflowClient on `uri`. For a sqlite store: made under the store lock (a fresh store's tables and default
    experiment are created by one process while the others wait), and every write transaction of this process's
    store object (MLflow keeps one per URI, shared by the client and the trace exporter) then takes the lock too."""
    from mlflow.tracking import MlflowClient

    # Export each trace while it is logged, in the logging thread (not by MLflow's pool of 10 background threads):
    # one writer per job, and a trace is in the store, or visibly not, when log_trace returns (RunTracker checks it).
    os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"
    db = sqlite_path(uri)
    if db is None:
        probe(_with_driver(uri))  # before MLflow, which retries a dead store for a minute, a traceback a try
        return MlflowClient(uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    lock = store_lock(db)
    with _holding(lock, "creating the MLflow store"):
        client = MlflowClient(uri)
    _serialize_writes(client._tracking_client.store, lock)
    return client


# database stores MLflow reaches through SQLAlchemy, and the Python driver each needs (the extra that brings it)
DRIVERS = {"postgresql": ("psycopg2", "postgres"), "mysql": ("pymysql", None), "mssql": ("pyodbc", None)}


def _with_driver(uri: str) -> str:
    """`uri` when its database driver is importable; else one line naming the extra that brings it."""
    import importlib.util

    scheme = uri.split(":", 1)[0].lower()
    db, _, driver = scheme.partition("+")
    if db not in DRIVERS:
        return uri
    module, extra = DRIVERS[db]
    module = {"psycopg": "psycopg", "pg8000": "pg8000"}.get(driver, module) if driver else module
    if importlib.util.find_spec(module) is None:
        fix = f"pip install 'fixlab[{extra}]'" if extra else f"pip install {module}"
        raise ConfigError(f"tracking.uri is a {db} store but its driver {module} is not installed; fix: {fix}")
    return uri


def probe(uri: str, timeout_s: float = 5.0) -> None:
    """One connection to a database store or one request to a tracking server's /health; on failure one line naming
    the store and the fix (down, wrong host or password), instead of MLflow's retries and tracebacks."""
    shown = re.sub(r"//([^:/@]+):[^@/]+@", r"//\1:***@", uri)  # no password in the message
    scheme = uri.split(":", 1)[0].lower()
    try:
        if scheme in ("http", "https"):
            import urllib.error
            import urllib.request

            try:
                urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s)
            except urllib.error.HTTPError:
                pass  # it answered: a server, if not on /health
        elif scheme.partition("+")[0] in DRIVERS:
            import sqlalchemy

            args = {"connect_timeout": int(timeout_s)} if scheme.startswith("postgresql") else {}
            engine = sqlalchemy.create_engine(uri, connect_args=args)
            try:
                engine.connect().close()
            finally:
                engine.dispose()
    except Exception as e:  # noqa: BLE001 - urllib, SQLAlchemy and the drivers each raise their own
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)[:200]
        raise ConfigError(f"cannot reach the MLflow store {shown}: {first}; fix: start the database or `mlflow "
                          "server` it names, or point tracking.uri elsewhere") from None


def _serialize_writes(store, lock) -> None:
    """Wrap the store's session factory: write sessions (MLflow marks them read_only=False) hold `lock`."""
    if getattr(store, "_fixlab_write_lock", None) is lock or not hasattr(store, "ManagedSessionMaker"):
        return
    sessions = store.ManagedSessionMaker

    @contextmanager
    def session(read_only=True):
        if read_only:
            with sessions(read_only=True) as s:
                yield s
        else:
            with _holding(lock, "an MLflow write"), sessions(read_only=False) as s:
                yield s

    store.ManagedSessionMaker = session
    store._fixlab_write_lock = lock


def get_or_create_experiment(client, name: str, artifact_location: str, lock=None) -> str:
    """The experiment's id, created if missing (under the store lock for sqlite; for a server, a concurrent
    create that lost the race reads the winner's)."""
    from mlflow.exceptions import MlflowException

    with _holding(lock, "creating the experiment") if lock is not None else nullcontext():
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return client.get_experiment_by_name(name).experiment_id
