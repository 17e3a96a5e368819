"""Answers as edits (`strategy.answer_format: patch`): one SEARCH/REPLACE block, applied strictly to the code the
agent was shown. A HumanEvalFix bug is one small edit, so an answer that names only the lines that change costs a
fraction of the tokens of the whole function, and more answers fit in the same spend.

    <<<<<<< SEARCH
        if balance == 0:
    =======
        if balance < 0:
    >>>>>>> REPLACE

An answer with no block but a ```python block is read as the whole function (agents/context.py): a small model
falls back to the format it knows. Strict: the SEARCH text must occur exactly once in the code (lines compared without trailing spaces; a block copied
with its indentation shifted by one amount everywhere is found, and its REPLACE lines shifted back); anything else is
a malformed patch, named in one line, and the answer counts as no code.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

OPEN, MID, CLOSE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
STOP = (CLOSE,)  # the answer ends with its block: what a model adds after it is never read
BLOCK = re.compile(r"^<{5,9} ?SEARCH[ \t]*\n(.*?)^={5,9}[ \t]*\n(.*?)^>{5,9} ?REPLACE", re.S | re.M)


def answers_as_patches(strategy) -> bool:
    """Whether a strategy's record asks for edits (only the drafting strategies have the knob)."""
    return getattr(strategy, "answer_format", "function") == "patch"


@dataclass(frozen=True)
class Patched:
    code: str | None  # the shown code with the edits made
    problem: str | None  # why the answer is not a patch that applies ("malformed patch: ...")


def closed(text: str) -> str:
    """An answer that stopped at the REPLACE marker (the stop string is cut) with the marker put back."""
    body = text.rstrip()
    return body + "\n" + CLOSE if OPEN in body and MID in body and not body.endswith(CLOSE) else text


def _lines(s: str) -> list[str]:
    return [x.rstrip() for x in s.rstrip("\n").split("\n")]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _find(lines: list[str], want: list[str]) -> tuple[list[int], int]:
    """Where `want` occurs in `lines`: exactly (trailing spaces aside), else with every line's indentation shifted by
    one amount (small models often copy a block without its leading indentation). Returns (starts, the shift)."""
    n = len(want)
    exact = [i for i in range(len(lines) - n + 1) if lines[i:i + n] == want]
    if exact:
        return exact, 0
    found = []
    for i in range(len(lines) - n + 1):
        shift = _indent(lines[i]) - _indent(want[0])
        if all((got.strip() == w.strip()) and (not w.strip() or _indent(got) - _indent(w) == shift)
               for got, w in zip(lines[i:i + n], want)):
            found.append((i, shift))
    return [i for i, _ in found], (found[0][1] if len(found) == 1 else 0)


def _shifted(lines: list[str], shift: int) -> list[str]:
    if shift >= 0:
        return [" " * shift + x if x.strip() else x for x in lines]
    return [x[min(-shift, _indent(x)):] for x in lines]


def apply_patch(answer: str, code: str) -> Patched:
    blocks = BLOCK.findall(answer)
    if not blocks:
        return Patched(None, f"malformed patch: no {OPEN} ... {MID} ... {CLOSE} block in the answer")
    lines = _lines(code)
    for search, replace in blocks:
        want, new = _lines(search), _lines(replace) if replace.strip("\n") else []
        if not any(x.strip() for x in want):
            return Patched(None, "malformed patch: the SEARCH part is empty; copy the lines to change into it")
        at, shift = _find(lines, want)
        if len(at) != 1:
            why = "is not in the code: copy the lines to change exactly" if not at else \
                f"occurs {len(at)} times in the code: include more lines to make it unique"
            return Patched(None, f"malformed patch: the SEARCH text {why}")
        lines[at[0]:at[0] + len(want)] = _shifted(new, shift)
    return Patched("\n".join(lines) + "\n", None)
