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
    schema    the shape of the file (SCHEMA); a file of another is refused, in one line that names the migration

A job's file holds `runs`, which flows/analysis/records.py reads (the one reader of runs).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
SCHEMA = 2  # the results files' shape
MIGRATED = "c0237e1"  # the commit that migrated benchmarks/results/ to it, with the script that did


class ResultsError(ValueError):
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
    out = {"schema": SCHEMA, "kind": kind, "utc": stamp(), "commit": commit, "dirty": dirty, "machine": machine or describe(),
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
                           "write it with flows/results.py write()")
    if a.get("schema") != SCHEMA:
        raise ResultsError(f"{path.name} is results schema {a.get('schema', 1)}, this fixlab reads {SCHEMA}: migrate it "
                           f"with benchmarks/migrate_results.py as of commit {MIGRATED} (git show "
                           f"{MIGRATED}:benchmarks/migrate_results.py)")
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
