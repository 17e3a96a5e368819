"""From a model's answer to a runnable candidate module.

The function named `entry_point` is kept with the imports and helpers it needs; the task's own context
(imports and helper functions from its declaration, e.g. `encode_shift` beside `decode_shift`) is added
back when the answer leaves it out; test code the model echoes back (asserts, check(), prints, a
__main__ block) is dropped, because the harness appends the real tests itself. The signature is checked
against the task's, so a renamed or reshaped function takes the short syntax-error path instead of a test run.
"""
from __future__ import annotations

import ast
import builtins
import re
import textwrap
from dataclasses import dataclass

from sandboxes.program import HELPER_NAMES
from .types import Task
from . import pyast

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_CODE_START = re.compile(r"^(from |import |def |async def |@|class )", re.M)
_PY_TAGS = ("", "python", "py", "python3", "py3")


@dataclass
class Extraction:
    code: str | None
    problem: str | None = None  # None | "no_code" | "syntax" | "signature"
    detail: str = ""


def code_blocks(text: str) -> list[str]:
    """Fenced Python blocks (an unclosed last fence counts: the answer may have hit max_new_tokens)."""
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PY_TAGS]
    return [b for b in blocks if b.strip()]


def bare_code(text: str) -> str | None:
    """Unfenced code: from the first def/import line on, with trailing prose cut until it parses."""
    m = _CODE_START.search(text)
    if not m:
        return None
    lines = text[m.start():].rstrip().splitlines()
    for end in range(len(lines), max(0, len(lines) - 60), -1):
        chunk = "\n".join(lines[:end]) + "\n"
        if _parses(chunk):
            return chunk
    return "\n".join(lines) + "\n"  # nothing parses: keep it all, the syntax path explains the error


def extract_candidate(text: str, task: Task, keep_context: bool = True, check_signature: bool = True) -> Extraction:
    blocks = code_blocks(text)
    if not blocks:
        bare = bare_code(text)
        blocks = [bare] if bare else []
    if not blocks:
        return Extraction(None, "no_code", "the answer contains no Python code")
    defining = [b for b in blocks if re.search(rf"^\s*(async\s+)?def\s+{re.escape(task.entry_point)}\s*\(", b, re.M)]
    if defining:
        chosen = defining[-1]
    else:
        body = _as_body(blocks[-1], task)
        if body is None:
            chosen = blocks[-1]
            if _parses(chosen) or not check_signature:
                return Extraction(chosen, "signature", f"there is no function named `{task.entry_point}` in the code")
            # fall through: a syntax error is the more useful message
        else:
            chosen = body  # the answer gave only the function body: put it under the task's signature
    try:
        tree = pyast.parse(chosen)
        compile(chosen, "<candidate>", "exec")  # catches what the parser lets through ('return' outside function...)
    except SyntaxError as e:
        return Extraction(chosen, "syntax", f"SyntaxError: {e.msg} (line {e.lineno})")
    except ValueError as e:  # e.g. null bytes
        return Extraction(chosen, "syntax", f"invalid source: {e}")
    fn = _find_function(tree, task.entry_point)
    if fn is None:
        return Extraction(chosen, "signature", f"there is no function named `{task.entry_point}` in the code")
    if check_signature:
        problem = _signature_problem(fn, task)
        if problem:
            return Extraction(chosen, "signature", problem)
    code = _strip_tests(chosen, tree, task.entry_point)
    code = _with_helpers_from_other_blocks(code, blocks, chosen, task)
    if keep_context:
        code = _with_task_context(code, task)
    return Extraction(code)


def _parses(src: str) -> bool:
    try:
        pyast.parse(src)
        return True
    except (SyntaxError, ValueError):
        return False


def _as_body(block: str, task: Task) -> str | None:
    """A block that is only an indented or bare function body (it has a `return`) becomes a whole function."""
    body = textwrap.dedent(block).strip("\n")
    try:
        tree = pyast.parse(body)
    except SyntaxError:
        return None
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body):
        return None
    if not any(isinstance(n, ast.Return) for n in ast.walk(tree)):
        return None
    return task.declaration.rstrip("\n") + "\n" + textwrap.indent(body, "    ") + "\n"


def _find_function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def task_params(task: Task) -> list[str] | None:
    try:
        tree = pyast.parse(task.declaration + "    pass\n")
    except SyntaxError:
        return None
    fn = _find_function(tree, task.entry_point)
    return [a.arg for a in fn.args.posonlyargs + fn.args.args] if fn else None


def _signature_problem(fn: ast.FunctionDef, task: Task) -> str | None:
    want = task_params(task)
    if want is None:
        return None
    if isinstance(fn, ast.AsyncFunctionDef):
        return f"`{task.entry_point}` must be a plain function, not `async def`"
    params = fn.args.posonlyargs + fn.args.args
    required = len(params) - len(fn.args.defaults)
    if fn.args.vararg:  # *args accepts any count above the required ones
        ok = required <= len(want)
    else:
        ok = required <= len(want) <= len(params)
    if ok:
        return None
    got = ", ".join(a.arg for a in params) or "no parameters"
    return (f"`{task.entry_point}` takes ({got}) but the tests call it with {len(want)} argument(s): "
            f"it must be `def {task.entry_point}({', '.join(want)})`")


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


def _defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
    return names


def _with_helpers_from_other_blocks(code: str, blocks: list[str], chosen: str, task: Task) -> str:
    """A model sometimes puts a helper (or an import) in another code block: bring in what the code calls."""
    tree = pyast.parse(code)
    have = _defined_names(tree) | HELPER_NAMES | set(dir(builtins)) | _task_context_names(task)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    missing = used - have
    if not missing:
        return code
    extra = []
    for b in blocks:
        if b is chosen or not _parses(b):
            continue
        btree = pyast.parse(b)
        blines = b.splitlines()
        for n in btree.body:
            names = _defined_names(ast.Module(body=[n], type_ignores=[]))
            if names & missing and not isinstance(n, ast.Assign):
                start = min([d.lineno for d in getattr(n, "decorator_list", [])] + [n.lineno])
                extra.append("\n".join(blines[start - 1: n.end_lineno]))
                missing -= names
    return ("\n\n".join(extra) + "\n\n\n" + code) if extra else code


def _task_context_names(task: Task) -> set[str]:
    try:
        return _defined_names(pyast.parse(task.declaration + "    pass\n")) - {task.entry_point}
    except SyntaxError:
        return set()


def _with_task_context(code: str, task: Task) -> str:
    """Prepend the declaration's imports and helper functions that the candidate does not define."""
    try:
        decl = pyast.parse(task.declaration + "    pass\n")
        cand = pyast.parse(code)
    except SyntaxError:
        return code
    defined = {n.name for n in cand.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    imported = {ast.unparse(n) for n in cand.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    decl_lines = (task.declaration + "    pass\n").splitlines()
    context = []
    for node in decl.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if ast.unparse(node) not in imported:
                context.append("\n".join(decl_lines[node.lineno - 1: node.end_lineno]))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name != task.entry_point and node.name not in defined:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                context.append("\n".join(decl_lines[start - 1: node.end_lineno]))
    if not context:
        return code
    return "\n\n".join(context) + "\n\n\n" + code


def normalise(code: str) -> str:
    """Code without comments, docstrings and layout differences: the key for repeat detection."""
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return " ".join(code.split())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)
