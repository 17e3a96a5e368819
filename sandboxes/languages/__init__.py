"""HumanEvalPack's six languages, one file each (python.py, js.py, java.py, go.py, cpp.py, rust.py): the program
layout, the compile and run commands, how a run proves its tests ran, and how a failure reads. A seventh language
is one more file here, its name in NAMES, and its tests."""
from __future__ import annotations

import importlib

from .base import Failure, Language, Program, Step, Toolchain

# The hub's config names (bigcode/humanevalpack), in the order tables list them.
NAMES = ("python", "js", "java", "go", "cpp", "rust")

_loaded: dict[str, Language] = {}


def language(name: str) -> Language:
    """The language named by its hub config name; an unknown name is one line naming the known ones."""
    if name not in _loaded:
        if name not in NAMES:
            raise ValueError(f"unknown language {name!r}: use one of {', '.join(NAMES)}")
        _loaded[name] = importlib.import_module(f"{__name__}.{name}").LANGUAGE
    return _loaded[name]


# Task ids' prefixes in the hub's data ("CPP/3"), each a language's `task_prefix`.
PREFIXES = {"Python": "python", "JavaScript": "js", "Java": "java", "Go": "go", "CPP": "cpp", "Rust": "rust"}


def of_task(task_id: str) -> Language:
    """The language a hub task id belongs to ("JavaScript/0" -> js); an id of no language reads as Python's (the
    test doubles' own tasks)."""
    return language(PREFIXES.get(task_id.split("/", 1)[0], "python"))


__all__ = ["Failure", "Language", "NAMES", "Program", "Step", "Toolchain", "language", "of_task"]
