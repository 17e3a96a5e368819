"""The frontier's picture (matplotlib, drawn off screen): pass@1 with its interval against cost per task, as a figure,
PNG bytes or SVG text. Each function reads a Frontier's fields (flows/analysis/pareto.py)."""
from __future__ import annotations

import io
import textwrap


def figure(fr):
    """pass@1 with its 95% interval against the cost axis (completion tokens or US dollars per task), and seconds per
    task where they compare:
    one colour per configuration family, points labelled by budget, the frontier drawn as a black line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = [(f"{fr.axis} per task", lambda c: c.cost.get(fr.axis_key), fr.token_frontier)]
    if fr.time_frontier:
        axes_spec.append((f"seconds per task ({fr.time_where})", lambda c: c.seconds
                          if (c.machine, c.commit) == (fr.time_machine, fr.time_commit) else None, fr.time_frontier))
    fig, axes = plt.subplots(1, len(axes_spec), figsize=(6.5 * len(axes_spec) + 3.2, 5.2), dpi=110, squeeze=False)
    families = list(dict.fromkeys(c.family for c in fr.configs))
    colours = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    by = {c.label: c for c in fr.configs}
    for ax, (xlabel, cost_of, front) in zip(axes[0], axes_spec):
        for fam in families:
            pts = sorted(((cost_of(c), c) for c in fr.configs if c.family == fam and cost_of(c) is not None),
                         key=lambda xc: (xc[0], xc[1].iters))
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ys = [c.pass_at_1 for _, c in pts]
            err = [[c.pass_at_1 - c.ci95[0] for _, c in pts], [c.ci95[1] - c.pass_at_1 for _, c in pts]]
            placed = all(c.paired for _, c in pts)  # unpaired runs are shown hollow: never on the frontier
            ax.plot(xs, ys, color=colours[fam], alpha=0.35, linewidth=1)
            ax.errorbar(xs, ys, yerr=err, fmt="o", color=colours[fam], capsize=3, markersize=5,
                        mfc=None if placed else "white", alpha=1.0 if placed else 0.5,
                        label=textwrap.fill(fam if placed else f"{fam} (unpaired)", 44, subsequent_indent="  "))
            for x, c in pts:
                ax.annotate(f"i{c.iters}", (x, c.pass_at_1), textcoords="offset points", xytext=(5, -10), fontsize=7,
                            color=colours[fam], fontweight="bold" if c.label in front else "normal")
        if front:
            ax.plot([cost_of(by[l]) for l in front], [by[l].pass_at_1 for l in front], color="black", linewidth=2,
                    zorder=0, label="frontier")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("pass@1 (bars: 95% Wilson interval)")
        ax.grid(alpha=0.3)
        ax.set_ylim(max(-0.02, min(c.ci95[0] for c in fr.configs) - 0.05),
                    min(1.02, max(c.ci95[1] for c in fr.configs) + 0.05))
    # One legend for both panels, from the token panel: it holds every family (the seconds panel only the timed ones).
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       title="configuration (iN: iters=N)", title_fontsize=7)
    fig.suptitle(f"{fr.model}{'' if fr.language == 'python' else ' on ' + fr.language}, protocol {fr.protocol}: pass@1 against cost per task, {fr.tasks} tasks", fontsize=10)
    fig.tight_layout()
    return fig


def png_bytes(fr) -> bytes:
    import matplotlib.pyplot as plt

    fig = figure(fr)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def svg_text(fr) -> str:
    import matplotlib.pyplot as plt

    fig = figure(fr)
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]
