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


FOLDER_READMES = ("agents", "agents/models", "agents/serving", "benchmarks", "conf", "flows", "sandboxes", "tests")


def _named_files(text: str) -> set[str]:
    """Source and config file names a README writes in backticks (`engine.py`, `conf/model/x.yaml`, `kernels.c`)."""
    import re

    names = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.split("::")[0].rstrip(".,:;)")
        if re.fullmatch(r"[\w./-]+\.(py|sh|c|yaml|txt|j2)", token) and "<" not in token and "*" not in token:
            names.add(token)
    return names


def test_the_folder_readmes_name_only_files_that_exist():
    """Each folder's README says what lives there: every file it names in backticks is there (beside the README, or
    as a path from the repository root), so a README cannot drift from a renamed or removed file unseen."""
    missing = []
    for folder in FOLDER_READMES:
        readme = REPO / folder / "README.md"
        for name in sorted(_named_files(readme.read_text())):
            here = [REPO / folder / name, REPO / name] + [p for p in (REPO / folder).rglob(name.split("/")[-1])
                                                          if str(p).endswith(name)]
            if not any(p.exists() for p in here):
                missing.append(f"{folder}/README.md names {name}")
    assert not missing, missing
