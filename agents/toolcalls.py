"""Hermes/Qwen-style <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks in model text.

Two readers: `parse_tool_calls` (strict JSON, OpenAI's shape) is what the transformers backend returns as
Generation.tool_calls; `from_tool_json` is ReAct's fallback for one body the strict reader rejected.
Imports nothing from agents.models or agents.strategies: both import this.
"""
from __future__ import annotations

import json
import re

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
# Any body, closed or not (the answer may have hit max_new_tokens): for the tolerant reader.
TOOL_CALL_TEXT = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_NAME = re.compile(r'"name"\s*:\s*"(\w+)"')
_CODE_ARG = re.compile(r'"code"\s*:\s*"((?:[^"\\]|\\.)*)', re.S)


def parse_tool_calls(text: str) -> list[dict]:
    """Hermes/Qwen-style <tool_call>{"name":..., "arguments":...}</tool_call> blocks, in OpenAI's shape."""
    calls = []
    for i, m in enumerate(_TOOL_CALL.finditer(text)):
        try:
            d = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(d, dict) or "name" not in d:
            continue
        args = d.get("arguments", {})
        calls.append({"id": f"call_{i}", "type": "function",
                      "function": {"name": d["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return calls


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
