"""From a model's answer to a runnable candidate module.

The function named `entry_point` is kept with the imports and helpers it needs; the task's own context
(imports and helper functions from its declaration, e.g. `encode_shift` beside `decode_shift`) is added
back when the answer leaves it out; test code the model echoes back (asserts, check(), prints, a
__main__ block) is dropped, because the harness appends the real tests itself.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .types import Task

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


@dataclass
class Extraction:
    code: str | None
    problem: str | None = None  # None | "no_code" | "syntax" | "signature"
    detail: str = ""


def code_blocks(text: str) -> list[str]:
    """Fenced blocks (an unclosed last fence counts: the answer may have hit max_new_tokens)."""
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in ("", "python", "py", "python3")]
    return [b for b in blocks if b.strip()]


def extract_candidate(text: str, task: Task, keep_context: bool = True) -> Extraction:
    blocks = code_blocks(text)
    if not blocks:
        # Bare code: the whole answer, or from its first def/import line on.
        m = re.search(r"^(from |import |def |@|class )", text, re.M)
        blocks = [text[m.start():]] if m else []
    if not blocks:
        return Extraction(None, "no_code", "the answer contains no Python code")
    defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(task.entry_point)}\s*\(", b, re.M)]
    chosen = defining[-1] if defining else blocks[-1]
    # A model sometimes splits code over several blocks: join the others that parse, before the chosen one.
    try:
        tree = ast.parse(chosen)
    except SyntaxError as e:
        return Extraction(chosen, "syntax", f"SyntaxError: {e.msg} (line {e.lineno})")
    fn = _find_function(tree, task.entry_point)
    if fn is None:
        return Extraction(chosen, "signature", f"no function named `{task.entry_point}` in the code")
    want = _task_params(task)
    got = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if want is not None and len(got) != len(want) and not fn.args.vararg:
        return Extraction(chosen, "signature",
                          f"`{task.entry_point}` takes {len(got)} parameters ({', '.join(got)}); it must take {len(want)} ({', '.join(want)})")
    code = _strip_tests(chosen, tree, task.entry_point)
    if keep_context:
        code = _with_task_context(code, task)
    return Extraction(code)


def _find_function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _task_params(task: Task) -> list[str] | None:
    try:
        tree = ast.parse(task.declaration + "    pass\n")
    except SyntaxError:
        return None
    fn = _find_function(tree, task.entry_point)
    return [a.arg for a in fn.args.posonlyargs + fn.args.args] if fn else None


def _strip_tests(src: str, tree: ast.Module, entry_point: str) -> str:
    """Keep imports, defs, classes and plain assignments; drop echoed tests and demo calls."""
    lines = src.splitlines()
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "check":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            keep.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and not _calls_function(node, entry_point):
            keep.append(node)
    out = []
    for node in keep:
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        out.append("\n".join(lines[start - 1: node.end_lineno]))
    return "\n\n".join(out) + "\n"


def _calls_function(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node))


def _with_task_context(code: str, task: Task) -> str:
    """Prepend the declaration's imports and helper functions that the candidate does not define."""
    try:
        decl = ast.parse(task.declaration + "    pass\n")
        cand = ast.parse(code)
    except SyntaxError:
        return code
    defined = {n.name for n in cand.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    decl_lines = (task.declaration + "    pass\n").splitlines()
    context = []
    for node in decl.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            context.append("\n".join(decl_lines[node.lineno - 1: node.end_lineno]))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name != task.entry_point and node.name not in defined:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                context.append("\n".join(decl_lines[start - 1: node.end_lineno]))
    if not context:
        return code
    return "\n\n".join(context) + "\n\n\n" + code
