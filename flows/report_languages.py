"""docs/RESULTS.md's two language tables: each configuration's pass@1 per language, and the test doubles' counts per
language and backend. Both read report.yaml's grid of sweeps: a column label (a configuration, a backend) to
{language: sweep name}."""
from __future__ import annotations

from sandboxes.languages import NAMES

from .markdown import table
from .report import ALPHA, ci, link, pts, pval, rate, wrap
from .results import Sweep, pair_runs


def _grid(spec: dict, key: str, every: bool) -> tuple[list[str], list[str]]:
    """The grid's column labels, and its languages in HumanEvalPack's order: those every column has (`every`), or
    those any column has."""
    names = list(spec[key])
    has = all if every else any
    return names, [lang for lang in NAMES if has(lang in spec[key][n] for n in names)]


def section_languages(sweeps: dict[str, Sweep], cur: dict) -> list[str]:
    """One row per language: each configuration's pass@1 with its interval, and the second configuration against the
    first on the same tasks (report.yaml `languages`: the configurations' names, each a sweep per language)."""
    spec = cur.get("languages")
    if not spec:
        return []
    names, langs = _grid(spec, "configs", every=True)
    body = []
    for lang in langs:
        keys = [spec["configs"][n][lang] for n in names]
        runs = [sweeps[k].last for k in keys]
        cells = [f"{rate(r.passed, r.total)} ({ci(r.passed, r.total)}), {r.passed} / {r.total}" for r in runs]
        verdict = "-"
        if len(runs) > 1:
            pr = pair_runs(runs[1], runs[0])
            if pr is not None:
                p = pr.result
                verdict = (f"{pts(p.diff)} ({pts(p.low)} to {pts(p.high)}), {p.only_a} / {p.only_b} fixed by one only, "
                           f"p {pval(p.p_value)}: "
                           f"{'no verdict' if p.p_value >= ALPHA else 'better' if p.diff > 0 else 'worse'}")
        wall = runs[0].cost.get("wall_s")  # a resumed job's covers only its last part
        cost = (f"{runs[0].cost.get('completion_tokens', '-')}, "
                f"{'resumed' if keys[0] in spec.get('resumed', ()) or wall is None else f'{wall:.0f} s'}")
        files = " / ".join(link(sweeps[k].file) for k in keys)
        body.append([lang, *cells, verdict, cost, sweeps[keys[0]].machine, files])
    labels = [spec.get("labels", {}).get(n, n) for n in names]
    return ["## Languages: HumanEvalFix in HumanEvalPack's six languages", "",
            wrap(spec.get("text", "")), "",
            *table(["language", *(f"{x}: pass@1 (95% CI), passed" for x in labels),
                    f"{labels[-1]} vs {labels[0]}, points (95% CI)" if len(labels) > 1 else "paired",
                    f"{labels[0]}: completion tokens, job time", "machine", "results files"], body), ""]


def section_checks(sweeps: dict[str, Sweep], cur: dict) -> list[str]:
    """The verdict's own check per language and backend: how many tasks the test doubles' answers pass (report.yaml
    `checks`: columns by label, each a sweep per language). Every canonical solution must pass, every buggy one fail."""
    spec = cur.get("checks")
    if not spec:
        return []
    names, langs = _grid(spec, "columns", every=False)
    body = []
    for lang in langs:
        keys = [spec["columns"][n].get(lang) for n in names]
        cells = ["-" if k is None else f"{sweeps[k].last.passed} / {sweeps[k].last.total}" for k in keys]
        files = " / ".join(link(sweeps[k].file) for k in keys if k)
        body.append([lang, *cells, next(sweeps[k].machine for k in keys if k), files])
    return ["## Languages: the verdict checked by the test doubles", "", wrap(spec.get("text", "")), "",
            *table(["language", *(f"{n}: passed / tasks" for n in names), "machine", "results files"], body), ""]
