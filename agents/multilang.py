"""Answers and feedback in HumanEvalPack's languages other than Python (JavaScript, Java, Go, C++, Rust).

Python keeps its own parser-based path (extract.py, feedback.py). Here an answer's code is the last fenced block of
the task's language that defines the entry point (else the last block, else the code from the entry point's
definition on), with the tests or `main` it echoes cut by the language (sandboxes/languages/<lang>.py strip_tests);
the compiler judges the rest. Repeats are keyed by the code without comments and layout. Feedback is the failure the
language file read from the run: the failing assertion's line, the compiler's first error, or the panic, trimmed.
"""
from __future__ import annotations

import re

from sandboxes.base import ExecResult

from .extract import Extraction

_FENCE = re.compile(r"```[ \t]*([\w+#-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def code_blocks(text: str, lang) -> list[str]:
    """Fenced blocks tagged for `lang` (an unclosed last fence counts: the answer may have hit its token limit); when
    none is, every fenced block (a small model may tag Java as ```js)."""
    found = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    tagged = [b for tag, b in found if tag in lang.fences and b.strip()]
    return tagged or [b for _, b in found if b.strip()]


def defines(code: str, lang, name: str) -> bool:
    return re.search(lang.entry_pattern.format(name=re.escape(name)), code) is not None


def extract(text: str, task) -> Extraction:
    """The candidate in an answer; no_code when there is none, signature when it defines no entry point."""
    lang, name = task.lang, task.lang.declared_name(task)
    blocks = code_blocks(text, lang)
    if not blocks:
        m = re.search(lang.entry_pattern.format(name=re.escape(name)), text)
        if m is None:
            return Extraction(None, "no_code", f"the answer contains no {lang.title} code")
        start = text.rfind("\n", 0, m.start()) + 1
        blocks = [text[start:]]
    defining = [b for b in blocks if defines(b, lang, name)]
    chosen = defining[-1] if defining else blocks[-1]
    code = lang.strip_tests(chosen, task)
    if not defines(code, lang, name):
        return Extraction(code, "signature", f"there is no function named `{name}` in the code")
    return Extraction(code if code.endswith("\n") else code + "\n")


def normalise(code: str) -> str:
    """The code without comments and layout: the key for repeat detection."""
    return " ".join(_COMMENTS.sub(" ", code).split())


def feedback(result: ExecResult, max_chars: int) -> str:
    """What a failed run tells the agent, within `max_chars`."""
    d = result.details or {}
    if result.status == "timeout":
        return f"The tests timed out after {d.get('timeout_s', 0):g} s: the code probably loops forever."
    message = str(d.get("failure") or result.stderr or result.stdout).strip()
    if d.get("stage") == "compile":
        head = "The code did not compile:"
    elif result.failing_line:
        head = f"This test failed:\n{result.failing_line}"
    else:
        head = "The tests failed:"
    text = head + ("\n" + message if message else "")
    return text if len(text) <= max_chars else text[: max_chars - 20].rstrip() + "\n[... cut ...]"
