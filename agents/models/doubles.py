"""Test doubles, named for what they are.

OracleModel answers each task with its reference fix (solution="canonical") or the original bug
(solution="buggy"): a harness check that must score 164/164 and 0/164 through the whole path.
ScriptedModel replays chosen outputs in order, to drive each branch of an agent in tests.
"""
from __future__ import annotations

import threading
import time
from typing import Iterable

from .base import Generation, GenRequest, ModelUnavailable


class OracleModel:
    def __init__(self, tasks: Iterable, solution: str = "canonical", name: str = "oracle"):
        if solution not in ("canonical", "buggy"):
            raise ModelUnavailable(f"oracle solution must be 'canonical' or 'buggy', got {solution!r}")
        self.name = name
        self.solution = solution
        self._code = {
            t.task_id: t.declaration + (t.canonical_solution if solution == "canonical" else t.buggy_solution)
            for t in tasks
        }

    def generate(self, request: GenRequest) -> Generation:
        if request.task_id not in self._code:
            raise ModelUnavailable(f"oracle model has no answer for task {request.task_id!r}")
        text = "```python\n" + self._code[request.task_id] + "```"
        return Generation(text=text, prompt_tokens=0, completion_tokens=0, seconds=0.0)

    def close(self) -> None:
        pass


class ScriptedModel:
    """Replays `outputs` one per call (shared across threads; use one task per scripted run)."""

    def __init__(self, outputs: list[str], name: str = "scripted"):
        self.name = name
        self.outputs = list(outputs)
        self.requests: list[GenRequest] = []
        self._lock = threading.Lock()

    def generate(self, request: GenRequest) -> Generation:
        with self._lock:
            self.requests.append(request)
            i = len(self.requests) - 1
        if i >= len(self.outputs):
            raise ModelUnavailable(f"scripted model ran out of outputs after {len(self.outputs)} calls")
        t0 = time.perf_counter()
        text = self.outputs[i]
        return Generation(text=text, prompt_tokens=sum(len(m["content"].split()) for m in request.messages),
                          completion_tokens=len(text.split()), seconds=time.perf_counter() - t0)

    def close(self) -> None:
        pass
