"""docs/RESULTS.md's sections across languages and models (flows/report.py puts them in the document): the language
table (make eval's config, and another, in each language with the paired verdict between them), the verdict's check
by the test doubles per language and backend, and the leaderboard (flows/leaderboard.py's rows)."""
from __future__ import annotations

from pathlib import Path

from sandboxes.languages import NAMES

from .markdown import ALPHA, ci, link, pts, pval, rate, table, wrap
from .analysis.sweeps import Sweep, pair_runs
from .results import read


def section_languages(sweeps: dict[str, Sweep], cur: dict, results: Path) -> list[str]:
    """One row per language: each configuration's pass@1 with its interval, and the second configuration against the
    first on the same tasks (report.yaml `languages`: the configurations' names, each a sweep per language)."""
    spec = cur.get("languages")
    if not spec:
        return []
    names = list(spec["configs"])
    langs = [lang for lang in NAMES if all(lang in spec["configs"][n] for n in names)]
    ref = ref_about = None
    if spec.get("reference"):  # the authors' own figures, as published, beside ours (a results file of kind reference)
        doc = read(results / spec["reference"])
        ref, ref_about = doc["models"][0], doc["about"]
    body = []
    for lang in langs:
        runs = [sweeps[spec["configs"][n][lang]].last for n in names]
        cells = [f"{rate(r.passed, r.total)} ({ci(r.passed, r.total)}), {r.passed} / {r.total}" for r in runs]
        verdict = "-"
        if len(runs) > 1:
            pr = pair_runs(runs[1], runs[0])
            if pr is not None:
                p = pr.result
                verdict = (f"{pts(p.diff)} ({pts(p.low)} to {pts(p.high)}), {p.only_a} / {p.only_b} fixed by one only, "
                           f"p {pval(p.p_value)}: "
                           f"{'no verdict' if p.p_value >= ALPHA else 'better' if p.diff > 0 else 'worse'}")
        files = " / ".join(link(sweeps[spec["configs"][n][lang]].file) for n in names)

        def cost(run, key):
            wall = run.cost.get("wall_s")  # a resumed job's covers only its last part
            return (f"{run.cost.get('completion_tokens', '-')}, "
                    f"{'resumed' if key in spec.get('resumed', ()) or wall is None else f'{wall:.0f} s'}")
        costs = [cost(r, spec["configs"][n][lang]) for r, n in zip(runs, names)]
        published = [] if ref is None else [
            "-" if ref["pass_at_1"].get(lang) is None else f"{ref['pass_at_1'][lang]:.3f}"]
        machines = " / ".join(dict.fromkeys(sweeps[spec["configs"][n][lang]].machine for n in names))
        body.append([lang, *cells, verdict, *published, *costs, machines, files])
    labels = [spec.get("labels", {}).get(n, n) for n in names]
    return ["## Languages: HumanEvalFix in HumanEvalPack's six languages", "",
            wrap(spec.get("text", "")), "",
            *table(["language", *(f"{x}: pass@1 (95% CI), passed" for x in labels),
                    f"{labels[-1]} vs {labels[0]}, points (95% CI)" if len(labels) > 1 else "paired",
                    *([f"published: {ref['model']}, pass@1"] if ref else []),
                    *(f"{x}: completion tokens, job time" for x in labels), "machine", "results files"], body), "",
            *([wrap(f"Published figures: {ref_about['text']} Source files: {link(spec['reference'])}."), ""]
              if ref else [])]


def section_checks(sweeps: dict[str, Sweep], cur: dict) -> list[str]:
    """The verdict's own check per language and backend: how many tasks the test doubles' answers pass (report.yaml
    `checks`: columns by label, each a sweep per language). Every canonical solution must pass, every buggy one fail."""
    spec = cur.get("checks")
    if not spec:
        return []
    names = list(spec["columns"])
    langs = [lang for lang in NAMES if any(lang in spec["columns"][n] for n in names)]
    body = []
    for lang in langs:
        keys = [spec["columns"][n].get(lang) for n in names]
        cells = ["-" if k is None else f"{sweeps[k].last.passed} / {sweeps[k].last.total}" for k in keys]
        files = " / ".join(link(sweeps[k].file) for k in keys if k)
        body.append([lang, *cells, next(sweeps[k].machine for k in keys if k), files])
    return ["## Languages: the verdict checked by the test doubles", "", wrap(spec.get("text", "")), "",
            *table(["language", *(f"{n}: passed / tasks" for n in names), "machine", "results files"], body), ""]


def section_leaderboard(results: Path, cur: dict) -> list[str]:
    """The models side by side on one configuration, from every results file (report.yaml `leaderboard`: its text,
    and the configuration's label where it is not make eval's)."""
    from .analysis.records import records_from_files
    from .leaderboard import leaderboard, markdown

    spec = cur.get("leaderboard")
    if not spec:
        return []
    rows, _ = leaderboard(records_from_files(sorted(results.glob("fullsize-*.json"))), spec.get("config"))
    return ["## Leaderboard: the models side by side (`python -m flows.leaderboard`)", "", wrap(spec.get("text", "")),
            "", *markdown(rows, link=link).rstrip("\n").split("\n"), ""]


def _runs_holding(files: dict, key: str):
    """(file name, run record, its `key` block) for every job's run record that has one, files in name order."""
    for name, doc in sorted(files.items()):
        if doc.get("about", {}).get("kind") == "fullsize":
            yield from ((name, run, run[key]) for run in doc.get("runs", []) if run.get(key))


def section_pass_at_k(files: dict) -> list[str]:
    """Every recorded run of n answers a task: pass@k for each k <= n, each with its bootstrap interval over tasks."""
    rows = []
    for name, run, table_k in _runs_holding(files, "pass_at_k"):
        p = run.get("params", {})
        cells = [f"pass@{k} {v['value']:.3f} ({v['ci95'][0]:.3f}-{v['ci95'][1]:.3f})"
                 for k, v in sorted(table_k.items(), key=lambda kv: int(kv[0]))]
        rows.append([p.get("model.name", "?"), p.get("dataset.language", "python"),
                     f"{p.get('strategy.name', '?')} iters={p.get('iters', '?')} temperature={p.get('temperature', '?')}",
                     p.get("samples", "?"), "; ".join(cells), link(name)])
    if not rows:
        return []
    return ["## pass@k from n answers a task", "",
            wrap("The unbiased estimator (Chen et al. 2021) over every task, each k with a 95% percentile bootstrap "
                 "interval over tasks (10,000 resamples, seed 0): `python -m flows.evaluate samples=N temperature=T`, "
                 "or an answers file of N answers a task through `python -m flows.rescore`."), "",
            *table(["model", "language", "configuration", "answers a task", "pass@k (95% bootstrap CI)",
                    "results file"], rows), ""]


def section_rescores(files: dict) -> list[str]:
    """Every recorded rescore (flows.rescore): what it judged again, and how today's verdicts agreed with the old."""
    rows = []
    for name, run, r in _runs_holding(files, "rescore"):
        a = r.get("agreement") or {}
        p = run.get("params", {})
        differ = a.get("attempts_differ") or []
        rows.append([p.get("dataset.language", "python"), f"`{r['source'][:8]}`" if r["format"] == "run" else
                     r["source"].rsplit("/", 1)[-1], r["format"],
                     f"{a['attempts_same']} / {a['attempts']}" if a else "-",
                     "; ".join(differ[:3]) + (f" (+{len(differ) - 3} more)" if len(differ) > 3 else "") or "-",
                     f"{a['tasks_same']} / {a['tasks']}" if a else "-",
                     f"{a['old_passed']} -> {a['new_passed']}" if a else f"{run['overall']['passed']}",
                     link(name)])
    if not rows:
        return []
    return ["## Verdicts judged again (`python -m flows.rescore`)", "",
            wrap("A recorded run's every attempt run again by today's sandbox, with no model call: the attempts whose "
                 "status is the same, those that differ, and the tasks whose verdict is the same."), "",
            *table(["language", "judged again", "format", "attempts, the same status", "attempts that differ",
                    "tasks, the same verdict", "tasks passed then -> now", "results file"], rows), ""]
