"""Answers as corrected lines (`strategy.answer_format: line`, single_shot): localise first, then fix there.

A HumanEvalFix bug is nearly always one wrong line (21 of the 24 tuning tasks: one line replaced), and a small model
shown the whole function often hands it back unchanged: it does not see the bug. So answers 0, n, 2n... of a task's
stream stay whole functions (n = FUNCTION_EVERY), and the others each ask for the corrected version of one line,
the j-th line answer the j-th line of a ranking made once: the lines answer 0 changed, then the lines one greedy
localisation call quotes (`prompts/locate.txt`, most likely first), then the rest in source order; each line once
greedy, then again sampled. A line answer is a line or a few (an insertion), a fraction of a whole function's
tokens; the shown code with that line replaced is the candidate. An answer holding the whole function
(`def <entry point>`) is read as the whole function: a small model falls back to the format it knows.
The strategy side lives in agents/strategies/single_shot.py; this module is the text side.
"""
from __future__ import annotations

import textwrap

from . import extract, multilang


def code_blocks(answer: str, lang=None) -> list[str]:
    """An answer's code blocks in the task's language (None: Python)."""
    return extract.code_blocks(answer) if lang is None or lang.name == "python" else multilang.code_blocks(answer, lang)

# every this-many-th answer of the stream, from answer 0 on, is a whole function: the answer a small model is best
# at, whose changed lines lead the localisation (never varied at full size)
FUNCTION_EVERY = 4
LOCATE_LINES = 3  # lines the localisation call names (a longer list costs tokens and is rarely right past the third)


def fixable_lines(code: str, body: str, lang=None) -> list[int]:
    """Indexes of the lines of `code` an answer may replace: the function body's (the part after the header),
    without blank and comment-only lines (`lang`: the task's language, None: Python)."""
    comment = lang.comment if lang is not None else "#"
    lines = code.rstrip("\n").split("\n")
    start = len(lines) - len(body.rstrip("\n").split("\n")) if body.strip() and code.rstrip("\n").endswith(
        body.rstrip("\n")) else 0
    return [i for i in range(start, len(lines)) if lines[i].strip() and not lines[i].strip().startswith(comment)
            and not (start == 0 and lines[i].lstrip().startswith(("def ", "from ", "import ")))]


def rank_lines(code: str, fixable: list[int], *answers: str, lang=None) -> list[int]:
    """The fixable lines each answer quotes (its first code block, answer by answer, in its order; a quoted line that
    occurs several times names each), then the rest in source order."""
    lines = code.rstrip("\n").split("\n")
    named: list[int] = []
    for answer in answers:
        blocks = code_blocks(answer, lang)
        for quoted in (blocks[0].split("\n") if blocks else []):
            q = quoted.strip()
            named += [i for i in fixable if q and lines[i].strip() == q and i not in named]
    return named + [i for i in fixable if i not in named]


def replace_line(code: str, at: int, answer: str, entry_point: str, lang=None) -> tuple[str | None, str | None]:
    """(the code with line `at` replaced by the answer's first code block, None) or (None, why not). The block keeps
    its own relative indentation and is put at the replaced line's. A block holding `def <entry_point>` is the
    whole function: returned as it is, for the caller to read as one."""
    blocks = code_blocks(answer, lang)
    if not blocks:
        return None, f"no ```{lang.fence if lang else 'python'} block with the corrected line in the answer"
    block = blocks[0].rstrip("\n")
    if f"def {entry_point}" in block if lang is None or lang.name == "python" else \
            multilang.defines(block, lang, entry_point):
        return block + "\n", None
    lines = code.rstrip("\n").split("\n")
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    new = [indent + x if x.strip() else "" for x in textwrap.dedent(block).split("\n")]
    return "\n".join(lines[:at] + new + lines[at + 1:]) + "\n", None
