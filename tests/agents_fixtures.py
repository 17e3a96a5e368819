"""Shared helpers for the agent tests: real HumanEvalFix tasks and a warm local sandbox."""
from __future__ import annotations

import functools

from conftest import DATA, REPO  # noqa: F401  (REPO re-exported for tests)


@functools.lru_cache(maxsize=1)
def all_tasks():
    from agents.tasks import load_tasks

    return {t.task_id: t for t in load_tasks({"local_fallback": str(DATA)})}


def task(n: int):
    return all_tasks()[f"Python/{n}"]


@functools.lru_cache(maxsize=1)
def sandbox():
    from sandboxes import make_sandbox

    return make_sandbox({"backend": "local"})


def fenced(code: str, prose: str = "Here is the fix:") -> str:
    return f"{prose}\n\n```python\n{code}```\n"
