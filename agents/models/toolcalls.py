"""The strict reader of Hermes/Qwen-style <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks: what a local
backend (serving/hf.py) returns as Generation.tool_calls, in OpenAI's shape. ReAct's tolerant reader of the
same blocks is agents/toolcalls.py.
"""
from __future__ import annotations

import json
import re

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


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
