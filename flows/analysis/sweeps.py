"""The sweeps benchmarks/results/report.yaml names, each a results file's runs (or a selection of them), and the
paired verdicts the report draws between runs. The runs are read by records.py, the one reader."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from agents.types import passed_at

from ..results import ReportError, load_dir, machine_words
from ..stats import Paired, paired
from .records import Run, read_runs



@dataclass
class Sweep:
    key: str
    file: str
    about: dict  # the file's about block
    spec: dict  # its entry in about.sweeps: label, wall_note, change, machine
    runs: list[Run]
    stored_pairs: list  # a file without per-task verdicts keeps its pairs' discordant counts

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


def load_sweep(key: str, ref: str, files: dict) -> Sweep:
    name, _, select = ref.partition("#")
    if name not in files:
        raise ReportError(f"benchmarks/results/report.yaml names {name}, which is not in benchmarks/results: restore "
                          "it or drop its line")
    data, sel = files[name], dict([select.split("=", 1)]) if select else {}
    about = data["about"]
    spec = next((s for s in about.get("sweeps", [{}]) if {k: str(v) for k, v in s.get("select", {}).items()} == sel),
                {})
    runs = [r for r in read_runs(Path(name), data)
            if all(str(r.params.get(k)) == v for k, v in sel.items())]
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
