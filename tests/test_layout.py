"""The layout a newcomer relies on: no import cycle between fixlab's modules (top-level or inside functions),
an evaluation core that imports no orchestration (Prefect, Hydra, MLflow), and the serving stack behind one boundary:
flows/ imports `serving` (its __init__: the public surface) and never a module inside it, serving/
imports no agents module but agents.models', and importing serving loads no torch."""
from __future__ import annotations

import ast
import json
import subprocess
import sys

from conftest import REPO

PACKAGES = ("agents", "serving", "flows", "sandboxes")


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


FOLDER_READMES = ("agents", "agents/models", "serving", "benchmarks", "conf", "flows", "sandboxes", "tests")


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


# ---- the serving boundary --------------------------------------------------------------------------------------------
SERVING = REPO / "serving"


def _import_targets(path):
    """(line, module) for each fixlab or other module a file imports anywhere in it (inside functions too; relative
    imports resolved; `from pkg import name` gives pkg.name where that is a module or package here, else pkg)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                here = REPO.joinpath(*sub.split("."))
                yield node.lineno, sub if here.with_suffix(".py").exists() or here.is_dir() else base
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            yield node.lineno, node.args[0].value


def _where(path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def test_flows_import_the_serving_package_only():
    """flows/ reaches the serving stack through serving/__init__.py (the Model protocol, build, the facts
    the cache and the run records need), never a module inside it, so that the stack's files can change freely."""
    bad = [f"{_where(p, line)} imports {m}: import it from serving (add it to serving/__init__.py)"
           for p in sorted((REPO / "flows").rglob("*.py")) for line, m in _import_targets(p)
           if m.startswith("serving.")]
    assert not bad, "\n".join(bad)


def test_serving_imports_no_agents_module_but_the_models_layer():
    """serving/ sits under agents.models (the protocol, the configs, the shared helpers) and above nothing
    else of fixlab's: no agent strategy, context or parser, so the stack could be a package of its own."""
    allowed = ("agents.models", "serving")
    bad = [f"{_where(p, line)} imports {m}: serving/ may import agents.models and serving only"
           for p in sorted(SERVING.rglob("*.py")) for line, m in _import_targets(p)
           if m.split(".")[0] == "agents" and not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert not bad, "\n".join(bad)


def test_agents_imports_no_serving_module():
    """The agent (loop, strategies, prompts, the Model protocol, the API clients, the doubles) stands without the
    engine: a model that runs here is built by the job through serving.build, never by agents/."""
    bad = [f"{_where(p, line)} imports {m}: agents/ may not reach the serving stack (the job builds local models)"
           for p in sorted((REPO / "agents").rglob("*.py")) for line, m in _import_targets(p)
           if m.split(".")[0] == "serving"]
    assert not bad, "\n".join(bad)


def test_importing_serving_loads_no_torch():
    """`import serving` is cheap (flows/cache.py imports it at the top, hosted-model jobs too): torch and
    transformers load inside its functions only. On failure, the fixlab frames that imported them."""
    code = """if True:
        import json, sys, traceback

        class Spy:
            where = {}

            def find_spec(self, name, path=None, target=None):
                top = name.split(".")[0]
                if top in ("torch", "transformers") and top not in Spy.where:
                    Spy.where[top] = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                                      if "/serving/" in f.filename or "/agents/" in f.filename]
                return None

        sys.meta_path.insert(0, Spy())
        import serving  # noqa: F401
        print(json.dumps(Spy.where))
    """
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {}, "import serving imported " + "; ".join(
        f"{m} from {' <- '.join(reversed(w)).replace(f'{REPO}/', '') or 'outside fixlab'}" for m, w in loaded.items())


def test_the_architecture_walk_is_fifteen_files_that_exist():
    """docs/ARCHITECTURE.md is the walk a newcomer follows through one job: fifteen files or fewer from the command to
    the sandbox's verdict, each one existing, and every other path it names existing too (a file moved or renamed
    without the page is a wrong turn)."""
    import re

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    walk = text.split("## The walk", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^\d+\. `([\w./-]+)`", walk, flags=re.M)
    assert 0 < len(steps) <= 15 and steps[0] == "flows/evaluate.py" and steps[-1] == "sandboxes/verdict.py", steps
    assert len(set(steps)) == len(steps) and all((REPO / p).is_file() for p in steps), steps
    named = {p for p in re.findall(r"`([\w./-]+\.(?:py|c|yaml|md))`", text) if "/" in p}
    assert sorted(p for p in named if not (REPO / p).exists()) == []


def test_no_production_comment_names_an_issue_or_a_session():
    """Comments say why; which issue or session a change came from lives in git, not in the code."""
    import re

    pattern = re.compile(r"issue #?\d+|(?<![\w&])#\d{2,3}\b|session[- ]?\d+", re.I)
    bad = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:80]}"
           for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, "\n".join(bad)


def test_no_function_is_over_60_lines_but_the_jails_runner():
    """A function a reader holds in one screen. The one exception is the jail's `_run` (sandboxes/_jail.py), whose
    order of steps around the candidate's thread is the defence and reads best in one piece."""
    long = []
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > 60 and (p.name, node.name) != ("_jail.py", "_run"):
                        long.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)


def test_no_production_file_is_over_500_lines_but_the_kernels():
    """A file a reader can hold; serving/kernels.c (the C kernels, one translation unit so they inline) is the one
    exception."""
    kinds = ("*.py", "*.c", "*.java", "*.go", "*.rs", "*.cpp", "*.js")
    big = [f"{p.relative_to(REPO)}: {n} lines" for pkg in PACKAGES for kind in kinds
           for p in sorted((REPO / pkg).rglob(kind))
           if (n := len(p.read_text().splitlines())) > 500 and p.name != "kernels.c"]
    assert not big, "\n".join(big)


def test_the_strategy_knob_table_is_the_strategies_records():
    """agents/README.md's knob table names every strategy knob the records have, and no knob they lack (a knob
    retired or renamed without the table, or added without a line, is caught here)."""
    import dataclasses
    import re

    from agents.config import STRATEGY_CONFS

    text = (REPO / "agents" / "README.md").read_text()
    table = text.split("## Strategy knobs", 1)[1].split("\n\n", 1)[0]
    named = {m for m in re.findall(r"^\| ([a-z_]+) \|", table, flags=re.M) if m != "knob"}
    knobs = {f.name for r in STRATEGY_CONFS.values() for f in dataclasses.fields(r)} - {"name"}
    assert named == knobs, (sorted(named - knobs), sorted(knobs - named))
