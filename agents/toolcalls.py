"""Hermes/Qwen-style <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks in model text: ReAct's tolerant
reader. `from_tool_json` is its fallback for one body the strict reader rejected; the strict reader (strict JSON,
OpenAI's shape), which the transformers backend returns as Generation.tool_calls, is `parse_tool_calls` in
agents/models/toolcalls.py. Imports nothing from agents.models or agents.strategies.
"""
from __future__ import annotations

import json
import re

# Any body, closed or not (the answer may have hit max_new_tokens): for the tolerant reader.
TOOL_CALL_TEXT = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_NAME = re.compile(r'"name"\s*:\s*"(\w+)"')
_CODE_ARG = re.compile(r'"code"\s*:\s*"((?:[^"\\]|\\.)*)', re.S)


def tool_args(raw) -> dict | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            d = json.loads(raw, strict=False)  # strict=False: models put raw newlines inside the code string
            return d if isinstance(d, dict) else None
        except json.JSONDecodeError:
            return None
    return None


def from_tool_json(blob: str) -> tuple[str | None, str | None]:
    """(name, code) from one <tool_call> body; tolerant of the JSON mistakes small models make."""
    try:
        d = json.loads(blob, strict=False)
        if isinstance(d, dict) and d.get("name"):
            args = tool_args(d.get("arguments", d.get("parameters", {}))) or {}
            code = args.get("code")
            return str(d["name"]), code if isinstance(code, str) else None
    except json.JSONDecodeError:
        pass
    m = _NAME.search(blob)
    if not m:
        return None, None
    c = _CODE_ARG.search(blob)
    code = None
    if c:
        try:
            code = json.loads('"' + c.group(1) + '"', strict=False)
        except json.JSONDecodeError:
            code = c.group(1).encode().decode("unicode_escape", "replace")
    return m.group(1), code
