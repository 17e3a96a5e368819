"""The program a sandbox runs: the reference harness's layout, exactly.

bigcode-evaluation-harness (task humanevalfixtests-python) runs IMPORT_HELPER + candidate + "\\n\\n" + test,
where every HumanEvalFix `test` already ends with `check(<entry_point>)`. numpy must be installed.
"""
from __future__ import annotations

import ast
import importlib

IMPORT_HELPER = "\n".join(
    [
        "import math",
        "import re",
        "import sys",
        "import copy",
        "import datetime",
        "import itertools",
        "import collections",
        "import heapq",
        "import statistics",
        "import functools",
        "import hashlib",
        "import numpy",
        "import numpy as np",
        "import string",
        "from typing import *",
        "from collections import *",
    ]
)


def _bound_names(helper: str) -> frozenset[str]:
    """Names these import lines bind (a star import binds its module's public names)."""
    names = set()
    for node in ast.parse(helper).body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            mod = importlib.import_module(node.module)
            names.update(getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")])
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


# What every candidate may use without importing it (agents/extract.py needs this).
HELPER_NAMES = _bound_names(IMPORT_HELPER)


def build_program(candidate: str, test: str) -> str:
    """Complete program for one candidate: import helper, candidate code, test (which calls check)."""
    return IMPORT_HELPER + "\n" + candidate + "\n\n" + test
