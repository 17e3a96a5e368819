"""`ast.parse` and `ast.literal_eval` behind one lock.

CPython 3.11's AST-to-object conversion keeps its recursion depth in per-interpreter state, so two threads
parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (gh-106905). Agents
run one task per thread, so every parse in agents/ goes through here.
"""
from __future__ import annotations

import ast
import threading

_lock = threading.Lock()


def parse(source: str, *args, **kwargs) -> ast.AST:
    with _lock:
        return ast.parse(source, *args, **kwargs)


def literal_eval(node_or_string):
    with _lock:
        return ast.literal_eval(node_or_string)
