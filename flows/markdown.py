"""The one markdown table builder (the results document, the frontier, flows.compare, the nightly report)."""
from __future__ import annotations


def table(head: list[str], rows: list[list]) -> list[str]:
    """A GitHub markdown table, one line per row; cells are written with str()."""
    out = ["| " + " | ".join(str(c) for c in head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
