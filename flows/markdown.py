"""The one markdown table builder (the results document, the frontier, flows.compare, the nightly report, the
leaderboard) and the results document's ways of writing a figure."""
from __future__ import annotations

import textwrap

from .stats import wilson

WIDTH, ALPHA = 116, 0.05  # the document's line width; the paired tests' level


def table(head: list[str], rows: list[list]) -> list[str]:
    """A GitHub markdown table, one line per row; cells are written with str()."""
    out = ["| " + " | ".join(str(c) for c in head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# --- figures, as the results document writes them --------------------------------------------------------------------------------------------------
def ci(p: int, n: int) -> str:
    lo, hi = wilson(p, n)
    return f"{lo:.3f}-{hi:.3f}"


rate = lambda p, n: f"{p / n:.3f}" if n else "-"  # noqa: E731
tok = lambda n: "-" if n is None else f"{n / 1000:.1f}k"  # noqa: E731
minutes = lambda s: "-" if s is None else f"{s / 60:.1f} min"  # noqa: E731
pts = lambda x: f"{x * 100:+.1f}"  # noqa: E731
link = lambda name: f"[{name}](../benchmarks/results/{name})"  # noqa: E731
rounds = lambda n: f"{n} round{'' if n == 1 else 's'}"  # noqa: E731


def pval(p: float) -> str:
    return f"{p:.2f}" if p >= 0.01 else f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"


def wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
