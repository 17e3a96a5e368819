"""MLflow records of a job: params, pass@1 and its curve over rounds, per-task trajectories and traces.

Store: sqlite database mlruns/mlflow.db and artifact folder mlruns/artifacts (both git-ignored), so the
UI (`make ui`) and MlflowClient read the same runs. Per run: tags (model, strategy, protocol, git commit,
dirty tree), params (the whole resolved config), metrics (pass@1, its curve over rounds, pass@1 per bug
type, tokens, wall time), artifacts (summary.json, results.jsonl, results_table.json, tasks/<id>.json)
and one MLflow trace per task (Traces tab: each model call and each sandbox run as a span).

Many jobs on one store at once (a sweep's workers, the nightly flow beside someone's run): SQLite takes one writer at
a time and MLflow's sqlite store fails a write that waits longer than its 20 s busy timeout ("database is locked",
lost trace links), and two processes creating a fresh store both run its migrations. So for a sqlite store every
process makes the store under a cross-process file lock (<db>.lock) and takes the same lock around each MLflow write
transaction: fixlab's writers queue on the lock instead of racing SQLite's busy handler. Traces are exported
synchronously and read back (run link, span count), so a failed write is retried, never left half-logged.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterable

from agents.tasks import project_root

from .config import ConfigError
from .core import safe_name, task_order
from .neutral import result_neutral
from .schema import TrackingConf, knob_default, without_retired

REPO_ROOT = Path(__file__).resolve().parent.parent
MLRUNS = project_root() / "mlruns"  # the checkout's (or, installed, the working directory's)
# Set by the sweep callback (flows/sweep.py): every job of a Hydra multirun becomes a child of this run.
PARENT_ENV = "FIXLAB_PARENT_RUN_ID"


def tracking_uri(tracking: TrackingConf) -> str:
    return tracking.uri or f"sqlite:///{MLRUNS / 'mlflow.db'}"


def artifact_root(tracking: TrackingConf) -> str:
    return Path(tracking.artifacts or MLRUNS / "artifacts").resolve().as_uri()


# ---------------------------------------------------------------- one sqlite store, many processes
# A write waits this long for the store lock, then goes ahead unlocked (SQLite's own busy handling): a job stopped
# with Ctrl-Z while it holds the lock must not hang every other job.
STORE_LOCK_WAIT_S = 120.0
# A waiting writer retries this often (filelock polls; a write holds the lock ~30 ms): at filelock's default 50 ms
# 10 processes logging 40 traces each took ~100 s here, at 2 ms ~80 s.
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


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def git_state() -> dict[str, str]:
    from .results import git_commit

    commit, dirty = git_commit(REPO_ROOT)
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower()}


def machine_name() -> str:
    """The kind of machine a run ran on, e.g. "AMD EPYC, 2 cores" (+ the GPU where one is visible): wall times
    compare only between runs on the same kind (flows/frontier.py)."""
    import shutil

    from agents.serving import cpu_info, isa_family

    c = cpu_info()
    name = f"{c['model']}, {c['cores']} cores, {isa_family(c)}"
    if shutil.which("nvidia-smi"):
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=10).stdout.split("\n")
            gpus = [g.strip() for g in gpus if g.strip()]
            if gpus:
                name += f", {len(gpus)}x {gpus[0]}"
        except (OSError, subprocess.SubprocessError):
            pass
    return name


class RunTracker:
    """One MLflow run per Hydra job. Thread-safe enough for per-task logging (one file per task)."""

    def __init__(self, tracking: TrackingConf):
        import mlflow

        self.mlflow = mlflow
        self.uri = tracking_uri(tracking)
        self.client = open_client(self.uri)
        mlflow.set_tracking_uri(self.uri)
        db = sqlite_path(self.uri)
        self.experiment_id = get_or_create_experiment(self.client, tracking.experiment,
                                                      artifact_root(tracking), store_lock(db) if db else None)
        self.run_id: str | None = None
        # Local per-task state (resume) lives beside the artifacts: mlruns/state by default.
        self.store_dir = Path(tracking.artifacts or MLRUNS / "artifacts").resolve().parent
        self._claim = None

    def start(self, run_name: str, params: dict, tags: dict, resume_run_id: str | None = None) -> str:
        if resume_run_id:
            return self._resume(resume_run_id, params)
        tags = {**git_state(), "fixlab.kind": "job", "fixlab.machine": machine_name(), **tags}
        if os.environ.get(PARENT_ENV):
            tags["mlflow.parentRunId"] = os.environ[PARENT_ENV]
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        self._claim_run(self.run_id)
        flat = flatten(params)
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        return self.run_id

    def _resume(self, run_id: str, params: dict) -> str:
        """Continue an earlier run: same MLflow run, only if its config matches (else results would mix)."""
        run = self.client.get_run(run_id)
        if run.info.experiment_id != self.experiment_id:
            raise ConfigError(f"resume={run_id}: that run belongs to another experiment")
        if run.data.tags.get("fixlab.kind", "job") != "job":
            raise ConfigError(f"resume={run_id}: that is a {run.data.tags['fixlab.kind']} run, not an evaluation job")
        # a knob retired since that run, at the default it had, is no difference (flows/schema.py RETIRED)
        old, new = without_retired(run.data.params), {k[:250]: v[:6000] for k, v in flatten(params).items()}
        diff = sorted(k for k in set(old) | set(new)
                      if old.get(k) != new.get(k) and not result_neutral(k)
                      and not (k not in old and new[k] == knob_default(k, new))
                      and not (k not in old and k.startswith("serving.")))  # runs from before the path was recorded
        if diff:
            k = diff[0]
            raise ConfigError(f"resume={run_id}: config differs from that run's at {k} "
                              f"({old.get(k)!r} there, {new.get(k)!r} now); resume with the same settings")
        if not self._claim_run(run_id):
            raise ConfigError(f"resume={run_id}: that run is still going in another job; wait for it to end "
                              f"(or stop it) and resume then")
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "fixlab.resumed", str(int(run.data.tags.get("fixlab.resumed", "0")) + 1))
        self.run_id = run_id
        return run_id

    def last_run_id(self) -> str | None:
        """The newest evaluation job of this experiment that did not finish and that no live job is still working
        on (what resume=last continues)."""
        runs = self.client.search_runs([self.experiment_id], "attributes.status != 'FINISHED'",
                                       order_by=["attributes.start_time DESC"], max_results=50)
        runs = [r for r in runs if r.data.tags.get("fixlab.kind", "job") == "job" and not self.run_is_live(r.info.run_id)]
        return runs[0].info.run_id if runs else None

    # A job holds its run's lock, state/<run id>/job.lock, while it works on the run (the kernel drops it when the
    # process ends, however it ends): two jobs on one run would run and log every task twice.
    def _run_lock(self, run_id: str):
        from filelock import FileLock

        return FileLock(str(self.store_dir / "state" / run_id / "job.lock"), thread_local=False)

    def _claim_run(self, run_id: str, wait_s: float = 2.0) -> bool:
        from filelock import Timeout

        (self.store_dir / "state" / run_id).mkdir(parents=True, exist_ok=True)
        lock = self._run_lock(run_id)
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            return False
        self.release_run()
        self._claim = lock
        return True

    def run_is_live(self, run_id: str) -> bool:
        """Whether some job holds this run now."""
        from filelock import Timeout

        if self._claim is not None and self.run_id == run_id:
            return True
        if not (self.store_dir / "state" / run_id).is_dir():
            return False
        lock = self._run_lock(run_id)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return True
        lock.release()
        return False

    def release_run(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def log_task(self, traj: dict) -> None:
        self.log_json(traj, f"tasks/{safe_name(traj['task_id'])}.json")
        self.log_trace(traj)

    TRACE_TRIES = 4

    def log_trace(self, traj: dict) -> str:
        """Log the task's trace and read it back: linked to this run, every span there. A trace that is not (a write
        that failed under load) is deleted and logged again, so none is left half-written or without its run."""
        for attempt in range(self.TRACE_TRIES):
            tid, spans = log_trace(self.client, self.experiment_id, self.run_id, traj)
            flush_traces()
            problem = self._trace_problem(tid, spans)
            if problem is None:
                return tid
            try:
                self.client.delete_traces(self.experiment_id, trace_ids=[tid])
            except Exception:
                pass  # not there at all
            if attempt + 1 < self.TRACE_TRIES:
                time.sleep(0.5 * 2 ** attempt)
        raise RuntimeError(f"the trace of {traj['task_id']} did not reach MLflow intact after "
                           f"{self.TRACE_TRIES} tries ({problem})")

    def _trace_problem(self, tid: str, spans: int) -> str | None:
        try:
            trace = self.client.get_trace(tid, display=False)
        except Exception as e:
            return f"not found: {type(e).__name__}"
        if trace.info.trace_metadata.get("mlflow.sourceRun") != self.run_id:
            return "not linked to its run"
        if len(trace.data.spans) != spans:
            return f"{len(trace.data.spans)} of {spans} spans"
        return None

    def complete_tasks(self, trajs: list[dict]) -> int:
        """Log the trajectories and traces that are not in MLflow yet (a kill between a task's state file
        and its upload, or an upload that failed). Returns how many were added."""
        have_files = {a.path for a in self.client.list_artifacts(self.run_id, "tasks")}
        have_traces = logged_trace_keys(self.experiment_id, self.run_id)
        added = 0
        for t in trajs:
            if f"tasks/{safe_name(t['task_id'])}.json" not in have_files:
                self.log_json(t, f"tasks/{safe_name(t['task_id'])}.json")
            if (t["task_id"], str(t.get("sample", 0))) not in have_traces:
                self.log_trace(t)
                added += 1
        return added

    def log_results_table(self, trajs: list[dict]) -> None:
        """One row per task (and sample): what a person sorts and filters in the run's Artifacts view."""
        rows = sorted(trajs, key=lambda t: (task_order(t["task_id"]), t.get("sample", 0)))
        cols = {"task_id": [], "sample": [], "bug_type": [], "verdict": [], "first_pass_round": [],
                "rounds": [], "prompt_tokens": [], "completion_tokens": [], "seconds": []}
        for t in rows:
            cols["task_id"].append(t["task_id"])
            cols["sample"].append(t.get("sample", 0))
            cols["bug_type"].append(t["bug_type"])
            cols["verdict"].append(verdict(t))
            # -1 = never passed (the table viewer shows None as an empty cell that sorts badly)
            cols["first_pass_round"].append(-1 if t.get("first_pass_round") is None else t["first_pass_round"])
            cols["rounds"].append(len(t.get("attempts", [])))
            cols["prompt_tokens"].append(t.get("prompt_tokens", 0))
            cols["completion_tokens"].append(t.get("completion_tokens", 0))
            cols["seconds"].append(round(float(t.get("seconds", 0.0)), 3))
        self.client.log_table(self.run_id, data=cols, artifact_file="results_table.json")

    def log_json(self, obj, artifact_path: str) -> None:
        # log_text, not log_dict: trajectories hold values json.dumps needs default=str for
        self.client.log_text(self.run_id, json.dumps(obj, indent=1, default=str), artifact_path)

    def log_lines(self, rows: Iterable[dict], artifact_path: str) -> None:
        self.client.log_text(self.run_id, "".join(json.dumps(r, default=str) + "\n" for r in rows), artifact_path)

    def finish(self, summary: dict, status: str = "FINISHED") -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        metrics = [Metric("pass_at_1", summary["pass@1"], now, 0)]
        for r, v in enumerate(summary["pass@1_by_iter"]):
            metrics.append(Metric("pass_at_1_by_iter", v, now, r))
        for key in ("passed", "total", "errors", "prompt_tokens", "prefill_tokens", "completion_tokens", "model_calls",
                    "sandbox_runs", "length_stops", "draft_tokens", "draft_accepted", "suspicious", "wall_s"):
            if key in summary:
                metrics.append(Metric(key, float(summary[key]), now, 0))
        if "pass@1_ci95" in summary:
            metrics += [Metric("pass_at_1_ci_low", summary["pass@1_ci95"][0], now, 0),
                        Metric("pass_at_1_ci_high", summary["pass@1_ci95"][1], now, 0)]
        for r, (lo, hi) in enumerate(summary.get("pass@1_ci95_by_iter", [])):
            metrics += [Metric("pass_at_1_by_iter_ci_low", lo, now, r), Metric("pass_at_1_by_iter_ci_high", hi, now, r)]
        for k, v in summary.get("pass@k", {}).items():
            metrics.append(Metric(f"pass_at_{k}", v, now, 0))
        for bug_type, v in summary.get("pass@1_by_bug_type", {}).items():
            metrics.append(Metric("pass_at_1_" + re.sub(r"\W+", "_", bug_type), v, now, 0))
        self.client.log_batch(self.run_id, metrics=metrics)
        self.log_json(summary, "summary.json")
        flush_traces()
        self.client.set_terminated(self.run_id, status=status)
        self.release_run()


# ---------------------------------------------------------------- traces
def verdict(t: dict) -> str:
    return "error" if t.get("error") else ("passed" if t.get("first_pass_round") is not None else "failed")


def flush_traces() -> None:
    import mlflow

    try:  # traces are exported by a background queue; the run's end must not outrun them
        mlflow.flush_trace_async_logging(terminate=False)
    except TypeError:
        mlflow.flush_trace_async_logging()


def logged_trace_keys(experiment_id: str, run_id: str) -> set[tuple[str, str]]:
    import mlflow

    flush_traces()
    traces = mlflow.search_traces(locations=[experiment_id], run_id=run_id, return_type="list",
                                  include_spans=False)
    return {(t.info.tags.get("task_id"), t.info.tags.get("sample", "0")) for t in traces}


def _ns(seconds: float) -> int:
    return int(max(float(seconds or 0.0), 0.0) * 1e9)


def log_trace(client, experiment_id: str, run_id: str, traj: dict, end_ns: int | None = None) -> tuple[str, int]:
    """One MLflow trace for one finished trajectory: a root span for the task, a span per round, and under
    it a span per model call (messages, answer, tokens) and one for the sandbox run (verdict, output).
    Returns the trace id and how many spans it has.

    The trajectory records durations, not clock times, so spans are laid out back to back ending at
    `end_ns` (default: now). The agent code stays free of tracing."""
    import time

    from mlflow.entities import SpanType

    end_ns = end_ns or time.time_ns()
    start_ns = end_ns - _ns(traj.get("seconds"))
    v = verdict(traj)
    tags = {"task_id": traj["task_id"], "sample": str(traj.get("sample", 0)), "bug_type": traj["bug_type"],
            "verdict": v, "first_pass_round": str(traj.get("first_pass_round")), "strategy": traj.get("strategy", "")}
    root = client.start_trace(
        f"{traj['task_id']}" + (f" s{traj['sample']}" if traj.get("sample") else ""), span_type=SpanType.AGENT,
        inputs={"task_id": traj["task_id"], "bug_type": traj["bug_type"], "strategy": traj.get("strategy"),
                "budget": traj.get("budget"), "sample": traj.get("sample", 0)},
        attributes={"verdict": v, "seconds": traj.get("seconds", 0.0)},
        tags=tags, experiment_id=experiment_id, start_time_ns=start_ns, run_id=run_id)
    tid = root.trace_id
    cursor, spans = start_ns, 1
    for a in traj.get("attempts", []):
        cursor, n = _log_round(client, tid, root.span_id, a, cursor, end_ns)
        spans += n
    client.end_trace(tid, end_time_ns=end_ns, status="ERROR" if traj.get("error") else "OK",
                     outputs={"verdict": v, "first_pass_round": traj.get("first_pass_round"),
                              "stop_reason": traj.get("stop_reason"), "handed_in": traj.get("handed_in"),
                              "error": traj.get("error"), "prompt_tokens": traj.get("prompt_tokens", 0),
                              "completion_tokens": traj.get("completion_tokens", 0)})
    return tid, spans


def _log_round(client, tid: str, parent_id: str, a: dict, start_ns: int, end_ns: int) -> tuple[int, int]:
    """A round's span (decision, verdict, feedback) with its model calls and sandbox runs laid out back to back
    from `start_ns`; returns where it ends and how many spans it logged."""
    from mlflow.entities import SpanType

    a_end = min(start_ns + _ns(a.get("seconds")), end_ns)
    span = client.start_span(f"round {a['round']}", trace_id=tid, parent_id=parent_id,
                             span_type=SpanType.CHAIN, inputs={"round": a["round"]},
                             attributes={"decision": a["decision"]}, start_time_ns=start_ns)
    t = start_ns
    for i, c in enumerate(a.get("calls", [])):
        c_end = min(t + _ns(c.get("seconds")), a_end)
        usage = {"input_tokens": c.get("prompt_tokens", 0), "output_tokens": c.get("completion_tokens", 0),
                 "total_tokens": c.get("prompt_tokens", 0) + c.get("completion_tokens", 0)}
        cs = client.start_span(f"model call {i}" if i else "model call", trace_id=tid, parent_id=span.span_id,
                               span_type=SpanType.CHAT_MODEL, inputs={"messages": c.get("messages", [])},
                               attributes={"mlflow.chat.tokenUsage": usage, "temperature": c.get("temperature"),
                                           "seed": c.get("seed"), "seconds": c.get("seconds")},
                               start_time_ns=t)
        client.end_span(tid, cs.span_id, end_time_ns=c_end, status="ERROR" if c.get("error") else "OK",
                        outputs={"choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": c.get("output", "")}}],
                                 **({"tool_calls": c["tool_calls"]} if c.get("tool_calls") else {}),
                                 **({"error": c["error"]} if c.get("error") else {})})
        t = c_end
    r = a.get("result")
    # Under protocols other than `tests` the agent's feedback came from a separate run on the visible tests.
    runs = [("sandbox run (visible tests)", a.get("visible_result"))] if a.get("visible_result") not in (None, r) else []
    runs += [("sandbox run", r)] if r else []
    for label, run in runs:
        r_end = min(t + _ns(run.get("duration_s")), a_end) if a_end > t else t
        rs = client.start_span(label, trace_id=tid, parent_id=span.span_id, span_type=SpanType.TOOL,
                               inputs={"code": a.get("code")},
                               attributes={"backend": run.get("backend"), "duration_s": run.get("duration_s")},
                               start_time_ns=t)
        client.end_span(tid, rs.span_id, end_time_ns=r_end, outputs={
            "status": run.get("status"), "exit_code": run.get("exit_code"), "failing_line": run.get("failing_line"),
            "error_type": run.get("error_type"), "stdout": (run.get("stdout") or "")[-4000:],
            "stderr": (run.get("stderr") or "")[-4000:]})
        t = r_end
    client.end_span(tid, span.span_id, end_time_ns=a_end,
                    outputs={"decision": a["decision"], "verdict": (r or {}).get("status"), "feedback": a.get("feedback")})
    return a_end, 1 + len(a.get("calls", [])) + len(runs)


if __name__ == "__main__":
    # `python -m flows.tracking init-store [URI]` (`make ui` runs it first): create the store under the store lock,
    # so a server opening a fresh store cannot run its migrations at the same moment as a job starting beside it.
    if len(sys.argv) < 2 or sys.argv[1] != "init-store":
        sys.exit("usage: python -m flows.tracking init-store [TRACKING_URI]")
    open_client(sys.argv[2] if len(sys.argv) > 2 else tracking_uri(TrackingConf()))
