"""The frontier (flows/analysis/pareto.py's Frontier) as text: the markdown table with its verdicts and notes, the
paragraph that says it in words, and the self-contained HTML page the MLflow UI shows (the picture inline as SVG:
flows/analysis/figures.py). Each function reads a Frontier's fields (its configs: Config, its steps: Step)."""
from __future__ import annotations

import html

from ..markdown import table
from .figures import svg_text


def _fmt_p(p: float) -> str:
    return f"{p:.2g}"  # 0.052, not 0.05: a p-value just above the line must not read as on it


def _word(s) -> str:
    """A paired step's (a Step's) verdict in a word or three."""
    return "buys" if s.buys else "worse" if s.p_value < 0.05 else "no significant gain"


def _short(s) -> str:
    """One paired step (a Step) in a table cell."""
    return f"vs {s.against}: {s.diff * 100:+.1f} (p = {_fmt_p(s.p_value)}), {_word(s)}"


def _where(c, fr) -> str:
    """Which frontier a configuration (a Config) is on."""
    if not c.paired:
        return "not placed (unpaired)"
    cost = "dollars" if fr.axis == "US dollars" else "tokens"
    return ", ".join(x for x, on in ((cost, c.on_token_frontier), ("seconds", c.on_time_frontier)) if on) or "no"


def table_rows(fr) -> tuple[list[str], list[list[str]]]:
    machines = {c.machine for c in fr.configs}
    commits = {c.commit for c in fr.configs}
    engine = len(commits) > 1  # a column only where the records name more than one commit (or some none)
    dollars = fr.axis == "US dollars"
    head = ["configuration", "pass@1 [95% CI]", "passed", "prompt tok", "completion tok", "model calls",
            "sandbox runs", "seconds"] + (["US$"] if dollars else []) + (["machine"] if len(machines) > 1 else []) \
        + (["engine"] if engine else []) + ["frontier", "paired verdict"]
    rows = []
    for c in fr.configs:
        verdict = "; ".join(_short(s) for s in fr.steps if s.point == c.label and s.axis == fr.axis)
        if c.on_token_frontier and not verdict:
            verdict = "cheapest configuration"
        rows.append([c.label, f"{c.pass_at_1:.3f} [{c.ci95[0]:.3f}, {c.ci95[1]:.3f}]", f"{c.passed}/{c.total}",
                     f"{c.cost.get('prompt_tokens', 0):,.0f}", f"{c.cost.get('completion_tokens', 0):,.0f}",
                     f"{c.cost.get('model_calls', 0):.1f}", f"{c.cost.get('sandbox_runs', 0):.1f}",
                     "-" if c.seconds is None else f"{c.seconds:.1f}"]
                    + ([f"{c.cost['usd']:.5f}" if "usd" in c.cost else "no price"] if dollars else [])
                    + ([c.machine] if len(machines) > 1 else []) + ([c.commit or "-"] if engine else [])
                    + [_where(c, fr), verdict])
    return head, rows


def _time_line(fr) -> str:
    if fr.time_frontier and fr.time_commit:
        return (f"seconds: each task's own seconds cut to the budget, per task, on {fr.time_machine} at engine "
                f"{fr.time_commit} (compared only there); '-' where the record keeps no per-task seconds")
    if fr.time_frontier:
        return (f"seconds: each task's own seconds cut to the budget, per task, on {fr.time_machine} (compared only "
                "there, but across engine versions: these records keep no git commit, so a faster engine reads as a "
                "cheaper configuration); '-' where the record keeps no per-task seconds")
    return ("seconds: not compared (no two configurations with per-task seconds on one machine and engine commit; "
            "records made before benchmarks/fullsize.py kept them have none)")


def verdict_words(fr) -> str:
    """The frontier in one paragraph: which strategies lie on it, which lie off it, and what its steps buy."""
    placed = [c for c in fr.configs if c.paired]
    on = [c for c in placed if c.on_token_frontier]
    if not on:
        return "No configuration keeps per-task outcomes, so none is placed on the frontier."
    fams = list(dict.fromkeys(c.family for c in on))
    off = sorted({c.strategy for c in placed} - {c.strategy for c in on})
    steps = [s for s in fr.steps if s.axis == fr.axis and "next cheaper" in s.why]
    bought = [s for s in steps if s.buys]
    def span(f: str) -> str:
        its = sorted(c.iters for c in on if c.family == f)
        return f"{f} at iters={its[0]}" + (f"-{its[-1]}" if len(its) > 1 else "")
    text = (f"On {fr.axis} the frontier is {' and '.join(span(f) for f in fams)} ({len(on)} point"
            f"{'s' if len(on) > 1 else ''}, pass@1 {on[0].pass_at_1:.3f} to {on[-1].pass_at_1:.3f})")
    text += f"; {', '.join(off)} lie{'s' if len(off) == 1 else ''} off it." if off else "."
    if steps:
        text += (f" Of its {len(steps)} steps to the next cheaper point, {len(bought)} buy{'s' if len(bought) == 1 else ''}"
                 " something the paired test sees" + (": " + "; ".join(
                     f"{s.point} over {s.against} ({s.diff * 100:+.1f} points, p = {_fmt_p(s.p_value)})"
                     for s in bought) if bought else "") + ".")
        inside = [s for s in fr.steps if s.axis == fr.axis and "cheapest" in s.why]
        if inside:
            text += (f" Against the cheapest configuration inside its interval, {sum(s.buys for s in inside)} of "
                     f"{len(inside)} frontier points buy something.")
    dominated = [c for c in placed if not c.on_token_frontier and any(
        o.pass_at_1 >= c.pass_at_1 and o.cost.get(fr.axis_key, 0) < c.cost.get(fr.axis_key, 0)
        and o.family != c.family for o in on) and c.strategy == on[0].strategy]
    if dominated:
        n = len(dominated)
        text += (f" {n} other {on[0].strategy} configuration{'s are' if n > 1 else ' is'} matched or beaten by a "
                 f"frontier point at fewer {fr.axis}.")
    return text


def verdict_rows(steps) -> tuple[list[str], list[list[str]]]:
    """Each paired step (a Step) as a table row: the step's sentence (Step.text) said once per column, not as a
    paragraph that names both configurations twice (the two frontier documents were 60 KB each, mostly that)."""
    head = ["cost", "frontier point", "against", "why", "cost ratio", "tasks", "points [95% CI]",
            "fixed by one only", "p", "verdict"]
    rows = [[s.axis, s.point, s.against, s.why.replace(" frontier point", "").replace("configuration ", ""),
             "-" if s.cost_ratio is None else f"{s.cost_ratio:.1f}x", str(s.shared_tasks),
             f"{s.diff * 100:+.1f} [{s.ci95[0] * 100:+.1f}, {s.ci95[1] * 100:+.1f}]",
             f"{s.only_point} vs {s.only_against}", _fmt_p(s.p_value), _word(s)]
            for s in steps]
    return head, rows


def _in(fr) -> str:
    """The language, named when it is not Python (Python's documents read as before)."""
    return "" if getattr(fr, "language", "python") == "python" else f" on {fr.language}"


def markdown(fr, off_frontier: str | None = None) -> str:
    """The frontier as markdown: every configuration's row, or with `off_frontier` (the command that lists them all)
    only the rows on a frontier or unplaced, and a line saying how many were left out and where they are."""
    head, rows = table_rows(fr)
    machines = sorted({c.machine for c in fr.configs})
    left = [r for r in rows if r[-2] == "no"] if off_frontier else []
    lines = [f"Cost-accuracy frontier: {fr.model}{_in(fr)}, protocol `{fr.protocol}`, {fr.tasks} tasks, {len(fr.configs)} "
             f"configurations; costs per task; machine{'s' if len(machines) > 1 else ''}: {'; '.join(machines)}. "
             + _time_line(fr) + ".", "", *table(head, [r for r in rows if r[-2] != "no"] if left else rows)]
    if left:
        lines += ["", f"{len(left)} configurations on no frontier are left out of this table; `{off_frontier}` lists "
                  "every one."]
    lines += ["", "In words: " + verdict_words(fr), ""]
    lines += [f"Frontier on {fr.axis} per task (cheapest first): " + (" < ".join(fr.token_frontier) or "-")]
    if fr.time_frontier:
        lines.append(f"Frontier on seconds per task ({fr.time_where}): " + " < ".join(fr.time_frontier))
    lines += ["", "Paired verdicts (exact McNemar on the shared tasks, 95% Newcombe interval of the difference):"]
    if fr.steps:
        lines += ["", *table(*verdict_rows(fr.steps))]
    else:
        lines.append("- one frontier point: nothing cheaper to pair it with")
    if fr.notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in fr.notes]
    return "\n".join(lines) + "\n"


def html_page(fr) -> str:
    """One self-contained page (inline SVG, no scripts, no outside links) that the MLflow UI shows as an artifact."""
    e = html.escape
    head, rows = table_rows(fr)
    grid = ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr" + (' class="front"' if r[-2] not in ("no", "not placed (unpaired)") else "") + ">"
                      + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in rows) + "</table>")
    verdicts = "".join(f"<li>[{e(s.axis)}] {e(s.text)}</li>" for s in fr.steps)
    notes = "".join(f"<li>{e(n)}</li>" for n in fr.notes)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>fixlab frontier: {e(fr.model)} {e(fr.protocol)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0; color: #1a1a1a; font-size: 13px; }}
header {{ background: #0b6e4f; color: #fff; padding: 8px 16px; }}
header h1 {{ margin: 0; font-size: 15px; }}
h2 {{ font-size: 14px; }}
main {{ padding: 8px 16px; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; }}
tr.front td {{ background: #e8f4ef; font-weight: 600; }}
li {{ font-size: 13px; margin: 3px 0; }}
svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<header><h1>Cost-accuracy frontier: {e(fr.model)}, protocol {e(fr.protocol)}, {fr.tasks} tasks</h1></header>
<main>
<p>Frontier on {e(fr.axis)} per task: {e(" < ".join(fr.token_frontier))}</p>
{svg_text(fr)}
<p>Costs per task. {e(_time_line(fr))}.</p>
{grid}
<h2>Paired verdicts</h2><p>Exact McNemar on the shared tasks, 95% Newcombe interval of the difference.</p>
<ul>{verdicts}</ul>
{"<h2>Notes</h2><ul>" + notes + "</ul>" if notes else ""}
</main></body></html>
"""
