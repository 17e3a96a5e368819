"""What the per-language tests share: the HumanEvalPack rows of a language, a task record from a row, and one
jailed sandbox per test file (its workers are warm across the file's runs)."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from conftest import REPO

DATA_DIR = (REPO / ".." / "shared" / "data").resolve()


def rows(lang: str) -> list[dict]:
    path = DATA_DIR / f"humanevalfix_{lang}.jsonl"
    if not path.exists():
        pytest.skip(f"HumanEvalFix data not found at {path}")
    return [json.loads(line) for line in path.open()]


def task(row: dict):
    """A task record with the hub's fields, as agents.types.Task names them (`import` is `imports`)."""
    t = types.SimpleNamespace(**row)
    t.imports = row["import"]
    return t


def by_id(lang: str, n: int) -> dict:
    return rows(lang)[n]


def solution(lang, row: dict, kind: str = "canonical") -> str:
    """The code a test double hands in: the language's context (the declaration, with what it lacks) + the body."""
    return lang.context(task(row)) + row[f"{kind}_solution"]


def run(sandbox, lang, code: str, row: dict, test: str | None = None):
    return sandbox.run(lang.program(code, row["test"] if test is None else test, task(row)), 10)


@pytest.fixture(scope="module")
def sandbox():
    from sandboxes.local import LocalSandbox

    sbx = LocalSandbox(workers=2, require_isolation=True)
    yield sbx
    sbx.close()
