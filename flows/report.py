"""The results document: docs/RESULTS.md, the README's headline sentence and the frontier picture, derived from the
self-describing files in benchmarks/results/ (flows/results.py).

    python -m flows.report            # rewrite what differs
    python -m flows.report --check    # exit 1, naming the command that fixes it, where a document differs

Labels, machines, notes and every speed table's title, text and columns come from each file's `about` block; sweeps,
the best run, pairs' config differences and CPU families are computed. Only the editorial choice of which sweeps and
pairs each table shows is curated, in benchmarks/results/report.yaml. Intervals and paired tests: flows.stats.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .analysis.figures import png_bytes
from .markdown import ALPHA, ci, link, minutes, pts, pval, rate, rounds, table, tok, wrap
from .report_languages import (section_checks, section_languages, section_leaderboard, section_pass_at_k,
                               section_rescores)
from .analysis.records import Run
from .analysis.sweeps import Sweep, budget_pair, load_all, pair_runs
from .results import RESULTS_DIR, ReportError, cell, field, machine_words, records
from .stats import sign_test_p

REPO = Path(__file__).resolve().parent.parent
DOC, README, PICTURE = REPO / "docs" / "RESULTS.md", REPO / "README.md", REPO / "docs" / "frontier.png"
HEADLINE_START, HEADLINE_END = "<!-- results:headline -->", "<!-- /results:headline -->"
COMMAND = "python -m flows.report"
FRONTIER_MODEL, FRONTIER_PROTOCOL = "qwen1.5b-coder-q4", "tests"  # the frontier the README shows


def family(m: dict) -> str:
    if m.get("gpu"):
        return "gpu"
    if m.get("cpu_family"):
        return m["cpu_family"] + (" as avx2 (forced)" if (m.get("forced") or {}).get("FIXLAB_CPU_ISA") else "")
    return "avx512-vnni (flags not recorded)"


# --- pairs ----------------------------------------------------------------------------------------------------
def differs(a: Run, b: Run) -> str:
    """What changes answers between two runs' resolved configs (result_neutral.config_diff), in words."""
    from .analysis.records import param_values
    from .result_neutral import config_diff

    pa, pb = param_values(a.params or {}), param_values(b.params or {})
    keys = [k for k in config_diff(pa, pb)
            if not k.startswith(("dataset.", "fixlab.", "sweep_")) and k not in ("iters", "answers")]
    words = [f"{k}: {pa.get(k, '-')} vs {pb.get(k, '-')}" for k in keys[:4]]
    return "; ".join(words) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "") or "the same config"


def pairs_table(sweeps: dict[str, Sweep], specs: list) -> list[str]:
    rows = []
    for spec in specs:
        (ka, ba), (kb, bb) = (s.split("@") for s in spec[:2])
        sa, sb = sweeps[ka], sweeps[kb]
        pr = pair_runs(sa.at(int(ba)), sb.at(int(bb)))
        if pr is None:
            raise ReportError(f"pair {spec[:2]}: a run keeps no per-task outcomes; run it again (a job's results file keeps them)")
        p, ca, cb = pr.result, pr.a.cost, pr.b.cost
        per = "" if pr.per_round is None else " / ".join(pts(x.diff) + "*" * (x.p_value < ALPHA) for x in pr.per_round)
        rows.append([spec[2] if len(spec) > 2 else "", differs(pr.a, pr.b) + f"; iters {ba} vs {bb}",
                     f"{p.a_passed} / {p.n}", f"{p.b_passed} / {p.n}",
                     f"**{pts(p.diff)}** ({pts(p.low)} to {pts(p.high)})", f"{p.only_a} / {p.only_b}", pval(p.p_value),
                     "no verdict" if p.p_value >= ALPHA else "better" if p.diff > 0 else "worse", per,
                     f"{tok(ca.get('prompt_tokens'))} / {tok(ca.get('completion_tokens'))} vs "
                     f"{tok(cb.get('prompt_tokens'))} / {tok(cb.get('completion_tokens'))}",
                     f"{pr.a.short} vs {pr.b.short}: {sa.file} vs {sb.file}"])
    return table(["with vs without", "what differs (resolved configs)", "with", "without", "difference, points (95% CI)",
                  "fixed by one only", "p", "verdict", f"per round (* p < {ALPHA})", "tokens sent / completion",
                  "MLflow runs: results files"], rows)


# --- sections -------------------------------------------------------------------------------------------------
def sweep_table(rows: list[Sweep], extra_head=(), extra=lambda sw: []) -> list[str]:
    body = []
    for sw in rows:
        r, c = sw.last, sw.last.cost
        curve = [rate(p, r.total) for p in r.by_round[:4]] + [""] * (4 - len(r.by_round[:4]))
        body.append([sw.label, sw.machine, *curve, f"{r.passed} / {r.total}", ci(r.passed, r.total), *extra(sw),
                     " / ".join(tok(c.get(k)) for k in ("prompt_tokens", "prefill_tokens", "completion_tokens")),
                     *(f"{c[k]:.0f}" if k in c else "-" for k in ("model_calls", "sandbox_runs")), minutes(sw.wall_s),
                     " / ".join(x.short for x in sw.runs), link(sw.file)])
    out = table(["configuration", "machine", "r0", "r1", "r2", "r3", "passed", "95% CI", *extra_head,
                 "tokens sent / prefilled / completion", "model calls", "sandbox runs", "sweep wall",
                 "MLflow runs (by budget)", "results file"], body)
    return out + [""] + [f"- {sw.label}: no sweep wall ({sw.spec['wall_note']})." for sw in rows
                         if sw.spec.get("wall_note")]


def budget_lines(rows: list[Sweep]) -> list[str]:
    out = []
    for sw in rows:
        p = budget_pair(sw)
        if p is not None:
            first = sw.runs[0].iters if len(sw.runs) > 1 else 0
            out.append(f"- {sw.label} ({sw.machine}): {p.verdict(f'iters={sw.last.iters}', f'iters={first}')}.")
    return out


READ_BACKS = {  # an overfit record's read-backs (flows/analysis/run_record.py): the same recorded answers under another rule
    "without_self_check": "believing the first answer that passes what the agent saw",
    "held_handed_in": "handing in the best held answer, labelled unsure, when the budget ends",
}


def readback_lines(rows: list[Sweep]) -> list[str]:
    """What each run's own answers score under another rule, read back exactly at its budget (no new answers)."""
    out = []
    for sw in rows:
        g = sw.last.overfit or {}
        for key, words in READ_BACKS.items():
            if key in g:
                w = g[key]
                out.append(f"- {sw.label}, {rounds(sw.last.iters)}, {words}: {w['hidden_passed']}/{g['total']} "
                           f"({ci(w['hidden_passed'], g['total'])}), overfit gap {pts(w['gap'])} points"
                           + (f" ({pts(w['ci95'][0])} to {pts(w['ci95'][1])})" if "ci95" in w else "") + ".")
    return (["", "Read-backs: the same recorded answers under another rule, exact at the run's budget (the rule "
             "changes no answer drawn before it ends; flows/analysis/run_record.py):", "", *out] if out else [])


def best_of(sweeps: dict[str, Sweep], cur: dict) -> Sweep:
    rows = [sweeps[k] for k in cur["tables"]["strategies"] + cur["tables"].get("grid", [])]
    full = max(sw.last.total for sw in rows)
    return max((sw for sw in rows if sw.last.total == full),
               key=lambda sw: (sw.last.passed, -(sw.last.cost.get("completion_tokens") or float("inf"))))


def command_of(sw: Sweep) -> str:
    m = re.match(r"(python -m flows\.evaluate\s[^(]*?)\s*(\(|$)", sw.about.get("command", ""))
    return " ".join(t for t in m.group(1).split() if not t.startswith("cache_dir=")) if m else ""


def headline(sweeps: dict[str, Sweep], cur: dict, frontier_words: str) -> list[str]:
    best, default = best_of(sweeps, cur), sweeps[cur["default"]]
    b, d = best.last, default.last
    out = [f"**Best measured: {best.label}, {rounds(b.iters)}: pass@1 {rate(b.passed, b.total)} ({b.passed}/{b.total} "
           f"tasks, 95% Wilson interval {ci(b.passed, b.total)}).** Every HumanEvalFix task, 1.5B pack, protocol "
           f"`tests`, on {best.about['machine'].get('cpu')}: `{command_of(best)}`."
           + (f" The tuning sample (Python/0-23) is {b.tuning[0]}/{b.tuning[1]} of it; the other {b.other[1]} tasks "
              f"score {b.other[0]}/{b.other[1]} ({ci(*b.other)})." if b.tuning else "")]
    pr = pair_runs(b, d) if best is not default else None
    out.append(f"`make eval`'s job scores {rate(d.passed, d.total)} ({d.passed}/{d.total}, "
               f"{ci(d.passed, d.total)}); its sweep over every budget took {minutes(default.wall_s)}."
               + (f" Paired on the same tasks, {pr.result.verdict(best.label, '`make eval`')}." if pr else ""))
    hidden = [sweeps[k] for k in cur["tables"]["protocols"] if sweeps[k].last.params.get("protocol") == "hidden"
              and sweeps[k].last.overfit]
    if hidden:
        sw = max(hidden, key=lambda sw: (sw.last.passed, -sw.last.overfit["gap"]))
        r, g = sw.last, sw.last.overfit
        out.append(f"Under protocol `hidden` (the agent sees the docstring's examples; the full test is never shown) "
                   f"the best is {sw.label}, {rounds(r.iters)}: pass@1 {rate(r.passed, r.total)} ({r.passed}/{r.total}, "
                   f"{ci(r.passed, r.total)}) with an overfit gap of {pts(g['gap'])} points ({pts(g['ci95'][0])} to "
                   f"{pts(g['ci95'][1])}; run {r.short}).")
    return out + [f"**The frontier** ({FRONTIER_MODEL}, protocol `{FRONTIER_PROTOCOL}`): {frontier_words}"]


def section_sweeps(sweeps: dict[str, Sweep], cur: dict) -> list[str]:
    t = {k: [sweeps[x] for x in v] for k, v in cur["tables"].items()}

    def seen(sw: Sweep) -> list[str]:
        g = sw.last.overfit
        return [f"{g['visible_passed']} / {g['total']}", f"**{pts(g['gap'])}** ({pts(g['ci95'][0])} to "
                f"{pts(g['ci95'][1])})"] if g else ["(= verdict)", "-"]

    out = ["## 1. What a strategy and a budget buy (1.5B pack, protocol `tests`)", "",
           "One row per sweep over budgets: pass@1 after each round of the largest budget (r0-r3), its 95% Wilson "
           "interval, that run's cost, and the whole sweep's wall time. The budget inside each sweep, largest against "
           "smallest, paired on the same tasks (Newcombe interval; exact McNemar p):", "",
           *sweep_table(t["strategies"]), *budget_lines(t["strategies"]), "",
           "## 2. What the agent sees: protocols and the overfit gap", "",
           "Under `hidden` the agent sees only the docstring's examples; under `docs` no tests. The verdict is always "
           "the full test, never shown. The overfit gap: how often the agent stopped satisfied minus how often its "
           "answer passed the verdict, on the same tasks.", "",
           *sweep_table(t["protocols"], ["passed what it saw", "overfit gap, points (95% CI)"], seen),
           *pairs_table(sweeps, cur["pairs"]["protocols"]), *readback_lines(t["protocols"]), "", *budget_lines(
               [sw for sw in t["protocols"] if sw.last.params.get("protocol", "tests") != "tests"]), "",
           "## 3. The small model: the 0.5B pack (`model=qwen0.5b-coder-q4`)", "", *sweep_table(t["small"]),
           *pairs_table(sweeps, cur["pairs"]["small"]), "", *budget_lines(t["small"][1:]), "",
           "## 4. What each technique buys (paired on the same tasks)", "",
           "Each row: two runs on the tasks both have, what differs between their resolved configs, the difference "
           "with its Newcombe 95% interval, the tasks only one fixed, the exact McNemar p, and the difference after "
           "each round where both ran the same budget.", "", *pairs_table(sweeps, cur["pairs"]["techniques"]), "",
           "How far two runs of the same job move (greedy answers are not bit-stable across batch shapes):", "",
           *pairs_table(sweeps, cur["pairs"]["noise"]), ""]
    grid = t.get("grid", [])
    if grid:
        n = max(int(sw.last.params.get("strategy.candidates", 1)) * (sw.last.iters + 1) for sw in grid)
        body = []
        for sw in grid:
            k, cells = int(sw.last.params.get("strategy.candidates", 1)), [""] * n
            for rnd, p in enumerate(sw.last.by_round):
                cells[k * (rnd + 1) - 1] = f"{rate(p, sw.last.total)} ({p})"
            body.append([sw.label, *cells, tok(sw.last.cost.get("completion_tokens")), minutes(sw.wall_s), link(sw.file)])
        out += ["## 5. single_shot's grid: candidates a round x answers a task, cut from one run", "",
                *table(["candidates", *(f"{a} answers" for a in range(1, n + 1)), "completion tokens", "job wall",
                        "results file"], body), ""]
    bug_cols = [best_of(sweeps, cur)] + [sw for sw in t["bug_types"] if sw is not best_of(sweeps, cur)]
    bugs = sorted(set().union(*(sw.last.by_bug for sw in bug_cols)))
    out += ["## 6. By bug type and on the tuning sample", "",
            *table(["bug type", "tasks", *(f"{sw.label}: r0 / last" for sw in bug_cols)],
                   [[b, bug_cols[0].last.by_bug[b][1], *(f"{sw.runs[0].by_bug.get(b, (0, 0))[0]} / "
                                                         f"{sw.last.by_bug.get(b, (0, 0))[0]}" for sw in bug_cols)]
                    for b in bugs]), "",
            "Prompts and knobs were shaped on the tuning sample (Python/0-23), so its figures are not the product's "
            "number:", "",
            *table(["configuration", "machine", "tuning sample", "other tasks", "other tasks 95% CI", "results file"],
                   [[sw.label, sw.machine, f"{sw.last.tuning[0]} / {sw.last.tuning[1]}",
                     f"{sw.last.other[0]} / {sw.last.other[1]}", ci(*sw.last.other), link(sw.file)]
                    for sw in sweeps.values() if sw.last.tuning])]
    return out


def section_runs_speed(sweeps: dict[str, Sweep], cur: dict, files: dict) -> list[str]:
    t = {k: [sweeps[x] for x in v] for k, v in cur["tables"].items()}
    hist = sorted(t["speed_history"], key=lambda sw: -(sw.wall_s or 0))
    ratios = [f"- {sweeps[a].label} took {sweeps[a].wall_s / sweeps[b].wall_s:.2f}x the wall time of {sweeps[b].label}."
              for a, b in ((p[0].split("@")[0], p[1].split("@")[0]) for p in cur["pairs"]["llamacpp"])
              if sweeps[a].wall_s and sweeps[b].wall_s]
    harness = [[f"`model={r['params']['model.name']} sandbox={r['params'].get('sandbox.backend', 'local')}`",
                f"{r['overall']['passed']} / {r['overall']['total']}", int(r["cost"].get("errors", 0)),
                minutes(r["cost"].get("wall_s")), r["run_id"][:8], link(name)]
               for name, d in files.items() if d["about"]["kind"] == "fullsize"
               for r in d.get("runs", []) if r["params"].get("model.name") in ("canonical", "buggy")]
    return ["## 7. Whole jobs: llama.cpp, sweep walls, how the default job got faster, the harness", "",
            *sweep_table(t["llamacpp"]), *ratios, "", *pairs_table(sweeps, cur["pairs"]["llamacpp"]), "",
            *table(["change", "machine", "passed", "sweep wall", "speed-up over the first row", "results file"],
                   [[sw.spec.get("change", sw.label), sw.machine, f"{sw.last.passed} / {sw.last.total}",
                     minutes(sw.wall_s), f"{hist[0].wall_s / sw.wall_s:.2f}x", link(sw.file)] for sw in hist]), "",
            "The oracle doubles through the whole path on every task (canonical must all pass, buggy all fail):", "",
            *table(["job", "passed", "errors", "wall", "run", "results file"], harness)]


# --- speed: generic over each file's records ------------------------------------------------------------------
def columns(d: dict) -> list[list[str]]:
    """A file's columns: its about.table's, else every scalar field of its records (a nested dict's as "a.b")."""
    spec = d["about"].get("table", {})
    if spec.get("columns"):
        return spec["columns"]
    out: dict[str, None] = {}
    for _, rec in records(d, spec):
        for k, v in rec.items():
            for path, x in ([(f"{k}.{k2}", x2) for k2, x2 in v.items()] if isinstance(v, dict) else [(k, v)]):
                if isinstance(x, (str, int, float, bool)) and k != "about":
                    out.setdefault(path)
    return [[k, k] for k in out]


# A speed table shows the rows of its kind's newest files; the older ones stay in benchmarks/results/ (every one is
# still read, so a damaged file is still named) and are counted under the table, which kept the document at a size a
# person reads (it had grown past 300 KB, most of it superseded timings).
SHOWN_FILES = 3


def newest_files(named: list[tuple[str, dict]]) -> set[str]:
    """The SHOWN_FILES newest files of each sort of file of a kind, the sort being the values of the table's first key
    its rows carry (memory's parts: a run of the conversion alone must not hide the job's peak)."""
    sorts: dict[frozenset, list[str]] = {}
    for name, d in named:
        sort = frozenset(str(keys[0]) for keys, _ in records(d, d["about"].get("table", {})) if keys)
        sorts.setdefault(sort, []).append(name)
    return {n for names in sorts.values() for n in names[-SHOWN_FILES:]}


def speed_kind(kind: str, named: list[tuple[str, dict]]) -> list[str]:
    newest, heads, rows = named[-1][1]["about"], [], []
    shown = newest_files(named)
    for _, d in named:
        heads += [c[0] for c in columns(d) if c[0] not in heads]
    configs = {n: d["about"].get("config") or {} for n, d in named}
    for name, d in named:
        cols = dict(map(tuple, columns(d)))
        diff = ", ".join(f"{k}={v}" for k, v in configs[name].items() if configs[named[-1][0]].get(k) != v) or "-"
        for keys, rec in records(d, d["about"].get("table", {})):
            vals = [field(d, keys, rec, cols[h]) if h in cols else None for h in heads]
            if name in shown and any(v not in (None, "", []) for h, v in zip(heads, vals)
                                     if h in cols and not cols[h].startswith("$.")):
                rows.append([link(name), machine_words(d["about"]["machine"]), *keys, diff, *map(cell, vals)])
    keyheads, reruns = newest.get("table", {}).get("keys", []), rerun_lines(named)
    head = ["results file", "machine", *keyheads, "settings unlike the newest file's", *heads]
    keep = [i for i in range(len(head)) if i < 2 + len(keyheads) or any(r[i] != "-" for r in rows)]  # no empty column
    head, rows = [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
    older = len(named) - len(shown)
    prefix = named[-1][0].split("-20")[0]
    return [f"### {newest['title']}", "", wrap(newest.get("text", "")), "", *table(head, rows),
            *(["", wrap(f"{older} older file{'s' * (older != 1)} of this kind in benchmarks/results/ "
                        f"(`{prefix}-*.json`), not shown.")] if older else []),
            *([""] + reruns if reruns else [])]


def rerun_lines(named: list[tuple[str, dict]]) -> list[str]:
    """Jobs run more than once with the same config (only result-neutral changes between): how far answers moved."""
    groups: dict[str, list] = {}
    for name, d in named:
        job = ((d.get("parts") or {}).get("job") or {}).get("answers")
        if job and d["about"].get("config"):
            groups.setdefault(json.dumps(d["about"]["config"], sort_keys=True), []).append((name, job))
    out = []
    for runs in (g for g in groups.values() if len(g) > 1):
        tasks = set.intersection(*(set(a) for _, a in runs))
        differ = sum(len({a[t]["code_sha"] for _, a in runs}) > 1 for t in tasks)
        first, last = runs[0][1], runs[-1][1]
        b = sum(first[t]["passed"] and not last[t]["passed"] for t in tasks)
        c = sum(last[t]["passed"] and not first[t]["passed"] for t in tasks)
        out.append(wrap(f"- The same job ran {len(runs)} times ({', '.join(n for n, _ in runs)}): {differ} of its "
                        f"{len(tasks)} tasks got different code in at least two runs; "
                        f"{' / '.join(str(sum(a[t]['passed'] for t in tasks)) for _, a in runs)} passed; first against "
                        f"last, {b} vs {c} tasks passed by one only (exact McNemar p = {sign_test_p(b, c):.2g}).", "  "))
    return out


def section_speed(files: dict) -> list[str]:
    by_kind: dict[str, list] = {}
    for name, d in files.items():
        if d["about"]["kind"] != "fullsize":
            by_kind.setdefault(d["about"]["kind"], []).append((name, d))
    fams: dict[str, list] = {}
    for kind, named in by_kind.items():
        for name, d in named:
            fams.setdefault(family(d["about"]["machine"]), []).append(name)
    out = ["## 8. Speed", "", "Timings from benchmark scripts on shared 2-core machines (the CPU of each row is named; "
           "compare within a CPU family). Each table is one script's files, its rows as the files give them.", "",
           *table(["CPU family", "results files", "newest"], [[f, len(ns), ", ".join(link(n) for n in sorted(ns)[-3:])]
                                                              for f, ns in sorted(fams.items())]), ""]
    for kind, named in sorted(by_kind.items(), key=lambda kv: kv[1][-1][1]["about"]["utc"], reverse=True):
        out += speed_kind(kind, named) + [""]
    return out


# --- the documents --------------------------------------------------------------------------------------------
def frontier_of(results: Path, protocol: str = FRONTIER_PROTOCOL):
    from .analysis.pareto import frontier
    from .analysis.records import records_from_files

    return frontier(records_from_files(sorted(results.glob("fullsize-*.json"))), model=FRONTIER_MODEL,
                    protocol=protocol, paired_only=True, language="python")


def section_frontier(results: Path, protocol: str) -> list[str]:
    """The configurations on the frontier with their costs and paired verdicts; the rest (dozens of rows, most of this
    document's size before) are one command away."""
    from .analysis.render import markdown

    command = f"python -m flows.frontier --model {FRONTIER_MODEL} --protocol {protocol} --paired-only"
    return [f"## The frontier under protocol `{protocol}`", "",
            f"The configurations of {FRONTIER_MODEL} recorded on every task under `{protocol}` that are on the Pareto "
            f"set, their cost per task and a paired verdict for each step along it (`{command}`).", "",
            *markdown(frontier_of(results, protocol), off_frontier=command).rstrip("\n").split("\n")]


def machines_once(sweeps: dict[str, Sweep]) -> list[str]:
    """Each machine of the full-size runs once: its short name and, where the name does not already say it, its CPU."""
    out = {}
    for sw in sweeps.values():
        cpu = sw.about["machine"].get("cpu", "")
        out[sw.machine] = sw.machine if not cpu or cpu in sw.machine else f"{sw.machine}: {cpu}"
    return sorted(out.values())


def at_a_glance(results: Path) -> list[str]:
    """The opening screen: the frontier's points (configuration, pass@1 with its interval, tokens and seconds per
    task) and the picture; the detail follows."""
    fr = frontier_of(results)
    on = [c for c in fr.configs if c.on_token_frontier]
    rows = [[c.label, f"{c.pass_at_1:.3f} ({c.ci95[0]:.3f}-{c.ci95[1]:.3f})", f"{c.cost['completion_tokens']:.0f}",
             "-" if c.seconds is None else f"{c.seconds:.0f}"] for c in sorted(on, key=lambda c: c.cost["completion_tokens"])]
    return ["## At a glance", "",
            f"The cost-accuracy frontier of {fr.model} on all {fr.tasks} tasks under protocol `{fr.protocol}`: every "
            "configuration no other beats on both pass@1 and completion tokens per task (seconds per task where they "
            f"compare: {fr.time_where or 'not recorded'}). Paired verdicts for every step, the protocol `hidden` "
            "frontier, sweeps and speed follow.", "",
            *table(["configuration", "pass@1 (95% interval)", "completion tokens / task", "seconds / task"], rows),
            "", f"![pass@1 against completion tokens per task]({PICTURE.name})"]


def results_document(results: Path) -> str:
    from .analysis.render import verdict_words

    files, sweeps, cur = load_all(results)
    lines = ["# fixlab results", "", f"<!-- Generated by `{COMMAND}` from benchmarks/results/ (each file describes "
             "itself; report.yaml picks what each table shows). Never edit this file. -->", "",
             "pass@1 is one sample per task after each round, with its 95% Wilson interval; MLflow run ids are their "
             "first 8 characters. Machines of the full-size runs: " + "; ".join(machines_once(sweeps)) + ".", "",
             *at_a_glance(results), "", "## Headline", "",
             *(x for p in headline(sweeps, cur, verdict_words(frontier_of(results))) for x in (p, "")),
             *section_languages(sweeps, cur, results), *section_checks(sweeps, cur), *section_leaderboard(results, cur),
             *section_pass_at_k(files), *section_rescores(files),
             *section_frontier(results, "tests"), "", *section_frontier(results, "hidden"), "",
             *section_sweeps(sweeps, cur), "", *section_runs_speed(sweeps, cur, files), "", *section_speed(files)]
    out = [x if not x or x.startswith(("|", "#", "  ")) else wrap(x, "  " if x.startswith("- ") else "") for x in lines]
    return "\n".join(out).rstrip("\n") + "\n"


def readme_with_headline(text: str, results: Path) -> str:
    """The README's generated sentence: the best result with its interval."""
    _, sweeps, cur = load_all(results)
    best = best_of(sweeps, cur)
    b = best.last
    block = wrap(f"**Best measured:** {best.label}, {rounds(b.iters)}: pass@1 {rate(b.passed, b.total)} ({b.passed}/"
                 f"{b.total} HumanEvalFix tasks, 95% interval {ci(b.passed, b.total)}), 1.5B pack, protocol `tests`. "
                 f"Every figure: [docs/RESULTS.md](docs/RESULTS.md), generated by `{COMMAND}`.")
    start, end = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if start < 0 or end < start:
        raise ReportError(f"README.md has no {HEADLINE_START} ... {HEADLINE_END} block: add the two marker lines")
    return text[:start] + HEADLINE_START + "\n" + block + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a document differs from the files")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder (default benchmarks/results)")
    ap.add_argument("--doc", type=Path, default=DOC, help="results document (default docs/RESULTS.md)")
    ap.add_argument("--readme", type=Path, default=README, help="README with the headline block (default README.md)")
    args = ap.parse_args(argv)
    try:
        outputs = ((args.doc, results_document(args.results)),
                   (args.readme, readme_with_headline(args.readme.read_text(), args.results)),
                   (args.doc.parent / PICTURE.name, png_bytes(frontier_of(args.results))))
    except ReportError as e:  # the frontier's FrontierError is the same class
        print(f"flows.report: {e}", file=sys.stderr)
        return 2
    read = lambda p, c: p.read_bytes() if isinstance(c, bytes) else p.read_text()  # noqa: E731
    stale = [(p, c) for p, c in outputs if not p.exists() or read(p, c) != c]
    if args.check:
        if stale:
            print(f"flows.report: {' and '.join(str(p) for p, _ in stale)} differ from what {args.results} says: run "
                  f"`{COMMAND}` and commit the result", file=sys.stderr)
            return 1
        print(f"flows.report: {args.doc}, {args.readme}'s headline and the picture match {args.results}")
        return 0
    for p, c in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(c) if isinstance(c, bytes) else p.write_text(c)
        print(f"flows.report: wrote {p}")
    print("flows.report: nothing to change") if not stale else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
