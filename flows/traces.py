"""One MLflow trace per finished trajectory (Traces tab: a span per round, model call and sandbox run), built after the
fact from what the trajectory recorded, so the agent code has no tracing in it; and the helpers that flush traces and
list those a run already has. Apart from tracking.py (the run's params, metrics and artifacts): it reads only a
trajectory and an MLflow client.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager, suppress


def verdict(t: dict) -> str:
    return "error" if t.get("error") else ("passed" if t.get("passed_round") is not None else "failed")


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


class _SpansInOneWrite:
    """Stands in for the trace exporter's client while one trace is logged. MLflow's exporter writes each span in a
    transaction of its own as the span ends (a trace of 13 spans, 13 writes: benchmarks/trace_writes.py times both ways
    side by side); this holds them and writes them all in one `log_spans` just before the exporter records the trace
    itself (`start_trace`, at the root span's end), the order MLflow's exporter keeps. Anything else goes through."""

    def __init__(self, client):
        self._client, self._held, self._location = client, [], None

    def log_spans(self, location, spans):
        self._location = location
        self._held.extend(spans)
        return list(spans)

    def start_trace(self, trace_info):
        self.flush()
        return self._client.start_trace(trace_info)

    def flush(self) -> None:
        held, self._held = self._held, []
        if held:
            self._client.log_spans(self._location, held)

    def __getattr__(self, name):
        return getattr(self._client, name)


_ONE_WRITER = threading.Lock()


@contextmanager
def _spans_in_one_write():
    """While inside, the process's MLflow trace exporter writes a trace's spans in one transaction (_SpansInOneWrite);
    where this MLflow has no such exporter, it writes them as it always does."""
    from mlflow.tracing.provider import _get_trace_exporter

    with _ONE_WRITER:  # the exporter is the process's: one trace at a time goes through the stand-in
        exporter = _get_trace_exporter()
        real = getattr(exporter, "_client", None)
        if real is None or not hasattr(real, "log_spans"):
            yield
            return
        exporter._client = held = _SpansInOneWrite(real)
        try:
            yield
        finally:
            exporter._client = real
            # spans of a trace whose root never ended (an error inside): written where the store takes them; as in
            # MLflow's own export, a failed write raises nothing here (RunTracker's read-back finds it and retries)
            with suppress(Exception):
                held.flush()


def _ns(seconds: float) -> int:
    return int(max(float(seconds or 0.0), 0.0) * 1e9)


def log_trace(client, experiment_id: str, run_id: str, traj: dict, end_ns: int | None = None) -> tuple[str, int]:
    """One MLflow trace for one finished trajectory: a root span for the task, a span per round, and under
    it a span per model call (messages, answer, tokens) and one for the sandbox run (verdict, output).
    Returns the trace id and how many spans it has.

    The trajectory records durations, not clock times, so spans are laid out back to back ending at
    `end_ns` (default: now). The agent code stays free of tracing."""
    import time

    end_ns = end_ns or time.time_ns()
    start_ns = end_ns - _ns(traj.get("seconds"))
    v = verdict(traj)
    tags = {"task_id": traj["task_id"], "sample": str(traj.get("sample", 0)), "bug_type": traj["bug_type"],
            "verdict": v, "passed_round": str(traj.get("passed_round")), "strategy": traj.get("strategy", "")}
    with _spans_in_one_write():
        return _log_trace(client, experiment_id, run_id, traj, start_ns, end_ns, tags, v)


def _log_trace(client, experiment_id, run_id, traj, start_ns, end_ns, tags, v) -> tuple[str, int]:
    from mlflow.entities import SpanType

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
                     outputs={"verdict": v, "passed_round": traj.get("passed_round"),
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
                        outputs={"choices": [{"index": 0, "finish_reason": c.get("finish_reason", "stop"),
                                              "message": {"role": "assistant", "content": c.get("output", ""),
                                                          **({"reasoning_content": c["reasoning"]}
                                                             if c.get("reasoning") else {})}}],
                                 **({"reasoning_tokens": c["reasoning_tokens"]}
                                    if c.get("reasoning_tokens") is not None else {}),
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
