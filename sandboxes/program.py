"""The program a sandbox runs: the reference harness's layout, exactly.

bigcode-evaluation-harness (task humanevalfixtests-python) runs IMPORT_HELPER + candidate + "\\n\\n" + test,
where every HumanEvalFix `test` already ends with `check(<entry_point>)`. numpy must be installed.
"""
from __future__ import annotations

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


def build_program(candidate: str, test: str) -> str:
    """Complete program for one candidate: import helper, candidate code, test (which calls check)."""
    return IMPORT_HELPER + "\n" + candidate + "\n\n" + test
