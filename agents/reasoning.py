"""A reasoning model's thinking, kept apart from its answer: a `<think>...</think>` block in the text (DeepSeek-R1,
Qwen3, QwQ), or an OpenAI-compatible server's `reasoning_content` (vLLM's and SGLang's reasoning parsers). The
trajectory keeps it and its tokens (ModelCall.reasoning, reasoning_tokens; the MLflow trace shows it); nothing
reads it as the answer. A block still open when the answer ends was cut by the token budget: no answer at all."""
from __future__ import annotations

import re

OPEN, CLOSE = "<think>", "</think>"
_OPEN_AT_START = re.compile(r"^\s*<think>")


def split(text: str) -> tuple[str | None, str, bool]:
    """(the thinking or None, the answer, whether a think block was left open). A chat template may open the block
    itself (the text then holds only its end), so a closing tag alone ends a block that began with the text."""
    if CLOSE in text:
        head, _, answer = text.rpartition(CLOSE)
        return _OPEN_AT_START.sub("", head).strip(), answer.lstrip("\n"), False
    if _OPEN_AT_START.match(text):
        return _OPEN_AT_START.sub("", text).strip(), "", True
    return None, text, False
