"""Results files that describe themselves: the one writer every benchmark and the full-size recorder call, and the
reader `python -m flows.report` derives the results document from.

A results file is `benchmarks/results/<kind>-<UTC stamp>[-<note>].json`: the script's figures plus an `about` block

    kind      what made it (weights, memory, fullsize, ...; the file name's prefix)
    utc       when, as 20261128T050431Z
    commit    the git commit of the tree that measured (`dirty`: it had uncommitted changes)
    machine   serving.describe_machine(): CPU model and flags, cores, torch, forced instruction sets, GPU
    config    the resolved settings the figures depend on (a job's config, a script's arguments)
    command   the command line that made it
    title     one line: what was measured, in words (a table's heading)
    text      what a reader needs to read the figures (how they were taken); never a figure
    table     optional: {"rows": where the records are, "columns": [[heading, field], ...]} (flows/report.py reads
              every record and, without `columns`, every scalar field of it)
    sweeps    fullsize files: [{"select": {param: value}, "label", "wall_note", "change"}] the sweeps the file holds

Files written before this block existed got theirs once from benchmarks/migrate_results.py.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from agents.types import cut, passed_at, verdicts

from .stats import Paired, paired

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"


class ResultsError(Exception):
    """One line for the user: which file, what is wrong, how to fix it."""


ReportError = ResultsError


def git_commit(repo: Path = REPO) -> tuple[str, bool]:
    """(commit, dirty) of the tree at `repo`; ("", False) outside git."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "", False
    return head, dirty


def stamp(t: float | None = None) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def about(kind: str, *, title: str, text: str = "", config: dict | None = None, command: str | None = None,
          machine: dict | None = None, table: dict | None = None, **extra) -> dict:
    """The `about` block of a results file being written now (machine: this one unless given)."""
    from serving import describe_machine as describe

    commit, dirty = git_commit()
    out = {"kind": kind, "utc": stamp(), "commit": commit, "dirty": dirty, "machine": machine or describe(),
           "config": config or {}, "command": command if command is not None else shlex.join(["python", *sys.argv]),
           "title": title, "text": text}
    if table:
        out["table"] = table
    return {**out, **extra}


def write(kind: str, data: dict, *, title: str, note: str = "", out: Path | str | None = None, **about_fields) -> Path:
    """Write `data` with its `about` block as the next results file of `kind` (or to `out`); returns its path."""
    block = about(kind, title=title, **about_fields)
    dest = Path(out) if out else RESULTS_DIR / f"{kind.replace('_', '-')}-{block['utc']}{'-' + note if note else ''}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"about": block, **{k: v for k, v in data.items() if k != "about"}}, indent=1) + "\n")
    return dest


def read(path: Path) -> dict:
    """A results file, checked to describe itself."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path} is missing: restore it, or drop its name from benchmarks/results/report.yaml") \
            from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    a = data.get("about") if isinstance(data, dict) else None
    if not isinstance(a, dict) or not all(k in a for k in ("kind", "utc", "machine", "title")):
        raise ResultsError(f"{path.name} does not describe itself (no `about` block with kind, utc, machine, title): "
                           "write it with flows/results.py write(), or run python -m benchmarks.migrate_results")
    return data


def records(data: dict, spec: dict) -> list[tuple[list[str], dict]]:
    """(the wildcards' keys, the record) for each record at spec["rows"] ("." = the file, "a.*.b" = over a dict)."""
    path = spec.get("rows") or next((k for k in ("rows", "runs") if isinstance(data.get(k), list)), ".")
    found = [([], data)]
    for seg in ([] if path == "." else path.split(".")):
        nxt = []
        for ks, node in (f for f in found if isinstance(f[1], dict)):
            nxt += ([(ks + [k], v) for k, v in node.items() if k != "about" and isinstance(v, (dict, list))]
                    if seg == "*" else [(ks, node.get(seg))])
        found = nxt
    return [(ks, r) for ks, node in found for r in (node if isinstance(node, list) else [node]) if isinstance(r, dict)]


def field(data: dict, keys: list[str], rec: dict, path: str):
    node = data if path.startswith("$.") else rec
    for seg in path.removeprefix("$.").format(*keys).split("."):
        if seg == "*" and isinstance(node, dict):  # over a dict's values: the records themselves (cell() counts)
            return list(node.values())
        node = node.get(seg) if isinstance(node, dict) else None
    return node


def cell(v) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.2g}"
    if isinstance(v, list):
        return f"{sum(bool(x.get('passed')) for x in v)}/{len(v)}" if v and isinstance(v[0], dict) else \
            " / ".join(cell(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={cell(x)}" for k, x in v.items()) or "defaults"
    return str(v)



def machine_words(m: dict) -> str:
    """A machine block in words: CPU, cores, kernel family and any instruction set forced on it (or the GPU)."""
    if m.get("name"):
        return m["name"]
    out = (m.get("cpu") or "CPU not recorded") + next((f", {m[k]} {w}" for k, w in (("cores", "cores"), ("cpus", "cores"),
                                                                                  ("threads", "threads")) if m.get(k)), "")
    out += f", {m['cpu_family']}" if m.get("cpu_family") else ""
    out += f", {m['gpu']}" if m.get("gpu") else ""
    return out + (" (forced: " + " ".join(f"{k}={v}" for k, v in m["forced"].items()) + ")" if m.get("forced") else "")


def load_dir(results: Path = RESULTS_DIR) -> dict[str, dict]:
    """Every results file of the folder by name, oldest first."""
    files = {p.name: read(p) for p in results.glob("*.json")}
    return dict(sorted(files.items(), key=lambda kv: (kv[1]["about"]["utc"], kv[0])))


# --- full-size files: sweeps of runs, as report.yaml names them --------------------------------------------------------------------------------------------------
@dataclass
class Run:
    run_id: str
    iters: int
    by_round: list[int]  # tasks passed after each round
    total: int
    outcomes: dict | None  # task#sample -> the verdict at each budget (agents/types.py Verdicts); None: not recorded
    cost: dict
    tuning: tuple[int, int] | None = None  # (passed, total) on Python/0-23
    other: tuple[int, int] | None = None
    by_bug: dict | None = None
    overfit: dict | None = None
    index: int = 0  # position in the file's runs (its `paired` list is each run against the first)
    params: dict | None = None
    cost_by_round: list | None = None

    def cut(self, iters: int) -> "Run":
        """This run as a budget-`iters` run would have been (round r never depends on the budget: agents/loop.py)."""
        if self.outcomes is None or not self.cost_by_round or not 0 <= iters <= self.iters:
            raise ReportError(f"run {self.short} cannot be cut to iters={iters}: it keeps no per-round outcomes; "
                              "run it again (a job's results file keeps them)")
        cost = {k: v for k, v in self.cost_by_round[iters].items() if k != "task_seconds"}
        return replace(self, iters=iters, by_round=self.by_round[:iters + 1], cost=cost, overfit=None,
                       outcomes={t: cut(v, iters) for t, v in self.outcomes.items()})

    passed = property(lambda self: self.by_round[-1])
    short = property(lambda self: self.run_id[:8])


@dataclass
class Sweep:
    key: str
    file: str
    about: dict  # the file's about block
    spec: dict  # its entry in about.sweeps: label, wall_note, change, machine
    runs: list[Run]
    stored_pairs: list

    label = property(lambda self: self.spec.get("label") or self.about["title"])
    machine = property(lambda self: self.spec.get("machine") or machine_words(self.about["machine"]))
    last = property(lambda self: self.runs[-1])

    @property
    def wall_s(self) -> float | None:
        walls = [r.cost.get("wall_s") for r in self.runs]
        ok = not self.spec.get("wall_note") and all(isinstance(w, (int, float)) for w in walls)
        return sum(walls) if ok else None

    def at(self, iters: int) -> Run:
        for r in self.runs:
            if r.iters == iters:
                return r
        return self.last.cut(iters)


def _verdicts(stored: dict | None) -> dict[str, list[bool]] | None:
    """A results file's per-task outcomes (first passing rounds in older files) as verdicts per budget."""
    return {t: verdicts(v) for t, v in stored.items()} if stored else None


def _run(i: int, r: dict) -> Run:
    f = lambda d: (d["passed"], d["total"])  # noqa: E731
    return Run(r["run_id"], int(r["params"].get("iters", len(r["by_round"]) - 1)), [x["passed"] for x in r["by_round"]],
               r["overall"]["total"], _verdicts(r.get("first_pass_round")), r.get("cost", {}), f(r["tuning_sample_0_23"]),
               f(r["other_tasks"]), {b: f(v) for b, v in r.get("by_bug_type", {}).items()}, r.get("overfit_gap"), i,
               r["params"], r.get("cost_by_round"))


def load_sweep(key: str, ref: str, files: dict) -> Sweep:
    name, _, select = ref.partition("#")
    if name not in files:
        raise ReportError(f"benchmarks/results/report.yaml names {name}, which is not in benchmarks/results: restore "
                          "it or drop its line")
    data, sel = files[name], dict([select.split("=", 1)]) if select else {}
    try:
        about = data["about"]
        spec = next((s for s in about.get("sweeps", [{}]) if {k: str(v) for k, v in s.get("select", {}).items()} == sel),
                    {})
        if "runs" not in data:  # the oldest shape: one stopped run, its counts as text
            fr = lambda t: tuple(int(x) for x in t.split("/"))  # noqa: E731
            cost = {k: data[k] for k in ("prompt_tokens", "prefill_tokens", "completion_tokens", "model_calls")}
            runs = [Run(data["run_id"], len(data["passed_by_round"]) - 1, data["passed_by_round"], data["total_tasks"],
                        None, cost, fr(data["tuning_sample_Python_0_23"]), fr(data["rest_Python_24_163"]),
                        {b: fr(v) for b, v in data.get("by_bug_type", {}).items()}, params={})]
        else:
            runs = [_run(i, r) for i, r in enumerate(data["runs"])
                    if all(str(r["params"].get(k, 1 if k == "strategy.candidates" else None)) == v for k, v in sel.items())]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ReportError(f"benchmarks/results/{name} lacks what its table reads ({type(e).__name__}: {e}); record "
                          "it again (a job's results file keeps them)") from None
    if not runs:
        raise ReportError(f"{ref} (report.yaml: {key}) selects no runs")
    return Sweep(key, name, about, spec, sorted(runs, key=lambda r: r.iters), data.get("paired", []))


def load_all(results: Path) -> tuple[dict, dict[str, Sweep], dict]:
    files = load_dir(results)
    try:
        curated = yaml.safe_load((results / "report.yaml").read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ReportError(f"{results}/report.yaml cannot be read ({e}): restore it from git") from None
    return files, {k: load_sweep(k, ref, files) for k, ref in curated["sweeps"].items()}, curated


@dataclass
class Pair:
    a: Run
    b: Run
    result: Paired
    per_round: list | None


def pair_runs(a: Run, b: Run) -> Pair | None:
    if a.outcomes is None or b.outcomes is None:
        return None
    keys = sorted(set(a.outcomes) & set(b.outcomes))
    ok = lambda run, k: [passed_at(run.outcomes[t], k) for t in keys]  # noqa
    per = [paired(ok(a, k), ok(b, k)) for k in range(a.iters + 1)] if a.iters == b.iters else None
    return Pair(a, b, paired(ok(a, None), ok(b, None)), per)


def budget_pair(sw: Sweep) -> Paired | None:
    """The sweep's largest budget against its smallest (or its own round 0), on the same tasks; a file without
    per-task outcomes keeps its discordant counts, from which the 2x2 table is rebuilt exactly."""
    first, last = (sw.runs[0], sw.last) if len(sw.runs) > 1 else (None, sw.last)
    if first is None:
        return pair_runs(last, last.cut(0)).result if last.iters and last.cost_by_round else None
    pr = pair_runs(last, first)
    if pr or first.index != 0 or last.index == 0 or len(sw.stored_pairs) < last.index:
        return pr.result if pr else None
    s, n = sw.stored_pairs[last.index - 1], first.total
    both = last.passed - s["only_a"]
    neither = n - both - s["only_a"] - s["only_b"]
    return paired([True] * (both + s["only_a"]) + [False] * (s["only_b"] + neither),
                  [True] * both + [False] * s["only_a"] + [True] * s["only_b"] + [False] * neither)
