"""Where a job's time went: the machine's CPU and the model's engine over the job.

A job's results file and summary carry `usage`: wall seconds; the CPU the whole machine was busy over them, in percent
of one core as `time -v` says it (200% = both of 2 cores; the job is meant to run alone: other load counts too); the
job's own process and its finished children (sandbox runs) in CPU seconds; its peak resident memory; and, for
fixlab's engine, the seconds it prefilled, decoded and sat idle with no request to serve (every task in the sandbox or
in agent code), decode steps, rows a step and requests queued beside them. Read from /proc/stat, getrusage and the
engine's running totals: no sampling, nothing on the hot path.

`setup_s` is the wall before the job's model and sandbox were ready (on first use: the pack's parts installed and
converted, the paths timed), `tasks_s` the rest. The engine's busy share is of `tasks_s`: over the whole wall, a first
job's setup counted as time the engine sat unused, before it had a model to run.
"""
from __future__ import annotations

import os
import time


def _machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU since boot, from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            cpu = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in cpu[:8]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


class Usage:
    """Started with the job; `finish(model)` gives the usage dict."""

    def __init__(self):
        self.t0, self.jiffies, self.times = time.perf_counter(), _machine_jiffies(), os.times()
        self.ready: float | None = None

    def model_ready(self) -> None:
        """The model and sandbox are up: what follows is the tasks' time."""
        self.ready = time.perf_counter()

    def finish(self, model=None) -> dict:
        wall = time.perf_counter() - self.t0
        out: dict = {"wall_s": round(wall, 1), "cores": os.cpu_count() or 1}
        setup = (self.ready - self.t0) if self.ready is not None else 0.0
        out["setup_s"], out["tasks_s"] = round(setup, 1), round(wall - setup, 1)
        end = _machine_jiffies()
        if self.jiffies and end and end[1] > self.jiffies[1]:
            busy, total = end[0] - self.jiffies[0], end[1] - self.jiffies[1]
            out["machine_cpu_pct"] = round(100.0 * out["cores"] * busy / total, 1)
        t = os.times()
        out["process_cpu_s"] = round(t.user + t.system - self.times.user - self.times.system, 1)
        try:  # the job process's peak resident memory so far (Linux: KiB), model and path check included
            import resource

            out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        except (ImportError, OSError):
            pass
        if model is not None:  # what the weights and KV cache streamed through (serving/heap.py)
            from serving import huge_pages

            out["huge_pages"] = huge_pages()
        out["children_cpu_s"] = round(t.children_user + t.children_system - self.times.children_user
                                      - self.times.children_system, 1)
        stats = model.engine_stats() if model is not None and hasattr(model, "engine_stats") else None
        if stats:
            steps = stats.get("steps", 0)  # every forward step, draft steps among them (engine.py, drafts.py)
            out["engine"] = {
                "prefill_s": round(stats.get("prefill_s", 0.0), 1), "decode_s": round(stats.get("decode_s", 0.0), 1),
                "idle_s": round(stats.get("idle_s", 0.0), 1),
                "prefill_tokens": stats.get("prompt_tokens", 0) - stats.get("reused_tokens", 0),
                "decode_steps": steps, "rows_a_step": round(stats.get("row_steps", 0) / steps, 1) if steps else None,
                # requests that waited beside each step: for a free row (max_batch) or KV room (kv_cache_mib)
                "queued_a_step": round(stats.get("queued_row_steps", 0) / steps, 1) if steps else None,
                "busy_pct": round(100.0 * (stats.get("prefill_s", 0.0) + stats.get("decode_s", 0.0))
                                  / max(wall - setup, 1e-9), 1),  # of the tasks' time
            }
        return out

    @staticmethod
    def line(u: dict) -> str:
        """One line for the job's stderr."""
        setup = f" ({u['setup_s']:.0f} s model and sandbox, {u['tasks_s']:.0f} s tasks)" if u.get("setup_s") else ""
        parts = [f"usage: {u['wall_s']:.0f} s{setup}"]
        if "machine_cpu_pct" in u:
            parts.append(f"machine CPU {u['machine_cpu_pct']:.0f}% of {100 * u['cores']}%")
        if "peak_rss_gib" in u:
            parts.append(f"peak memory {u['peak_rss_gib']:.2f} GiB")
        hp = u.get("huge_pages") or {}
        if hp.get("mode") is not None:
            parts.append(f"huge pages {hp['mode']}" + (f", {hp['gib']:.2f} GiB on them" if hp.get("gib") else ""))
        e = u.get("engine")
        if e:
            parts.append(f"engine busy {e['busy_pct']:.0f}% of the tasks' time (prefill {e['prefill_s']:.0f} s, decode "
                         f"{e['decode_s']:.0f} s at {e['rows_a_step']} rows a step, {e['queued_a_step']} more queued), "
                         f"idle {e['idle_s']:.0f} s waiting for requests")
        return "; ".join(parts)
