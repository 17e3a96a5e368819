"""The layout a newcomer relies on: no import cycle between fixlab's modules (top-level or inside functions),
and an evaluation core that imports no orchestration (Prefect, Hydra, MLflow)."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import REPO

PACKAGES = ("agents", "flows", "sandboxes")


def _module(path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path) -> set[str]:
    """fixlab modules this file imports anywhere in it (relative imports resolved)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] in PACKAGES}
    return out


def test_no_import_cycles():
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    modules = {_module(p): p for p in files}
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    # a package's __init__ importing its own submodules is how packages are made, not a cycle
    graph = {m: {i for i in deps if not (modules[m].name == "__init__.py" and i.startswith(m + "."))}
             for m, deps in graph.items()}
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(graph[m]):
            visit(d)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles)


def test_the_core_imports_no_orchestration():
    code = "import sys, flows.core; print(sorted(m for m in ('prefect', 'hydra', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
