"""Test doubles, named for what they are.

OracleModel answers each task with its reference fix (solution="canonical") or the original bug
(solution="buggy"): a harness check that must score 164/164 and 0/164 through the whole path. It reads the
dataset itself (the job's dataset config) and knows the task by the buggy code the prompt shows, as a model
would; `delay_s` makes each answer take that long (tests stop a job mid-way with it).
ScriptedModel replays chosen outputs in order, to drive each branch of an agent in tests.
RecordedAnswers stands where a model would in a rescore (flows/rescore.py), whose runner judges answers already made:
asking it is an error, so no answer can come from it by mistake.
"""
from __future__ import annotations

import threading
import time
from typing import Iterable

from .base import Generation, GenRequest, ModelUnavailable
from .config import OracleModelConf


class OracleModel:
    def __init__(self, tasks: Iterable, conf: OracleModelConf):
        solution = conf.solution
        if solution not in ("canonical", "buggy"):
            raise ModelUnavailable(f"oracle solution must be 'canonical' or 'buggy', got {solution!r}")
        self.name = conf.name
        self.solution = solution
        self.delay_s = float(conf.delay_s or 0)
        self._tasks = list(tasks)
        # the language's context (the declaration, with what it lacks) + the body: Python's is its declaration
        self._code = {t.task_id: t.fixed_code if solution == "canonical" else t.buggy_code for t in self._tasks}

    def _task_shown(self, shown: str):
        """The task whose code the prompt shows: its buggy body, else (a rewrite prompt shows no body) its
        declaration and tests. Entry points repeat across tasks (158 names for 164 tasks), so they only narrow."""
        def score(t) -> tuple:
            return (t.buggy_solution.strip() in shown, t.declaration.strip() in shown, t.test.strip() in shown,
                    len(t.buggy_solution))
        named = [t for t in self._tasks if f"def {t.entry_point}(" in shown or f"`{t.entry_point}`" in shown
                 or f"{t.entry_point}(" in shown]
        best = max(named, key=score, default=None)
        return best if best is not None and any(score(best)[:3]) else None

    def generate(self, request: GenRequest) -> Generation:
        shown = "\n".join(m["content"] for m in request.messages if m.get("role") == "user")
        task = self._task_shown(shown)
        if task is None:
            raise ModelUnavailable("oracle model: the prompt shows no task of its dataset")
        code = self._code[task.task_id]
        if self.delay_s:
            time.sleep(self.delay_s)
        return Generation(text=f"```{task.lang.fence}\n" + code + "```", prompt_tokens=0, completion_tokens=0,
                          seconds=self.delay_s)

    def close(self) -> None:
        pass


class ScriptedModel:
    """Replays `outputs` one per call (shared across threads; use one task per scripted run); its tokens are words.
    An output given as (text, "length") comes back as an answer cut at the token budget."""

    def __init__(self, outputs: list, name: str = "scripted"):
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
        text, finish = self.outputs[i] if isinstance(self.outputs[i], tuple) else (self.outputs[i], "stop")
        return Generation(text=text, prompt_tokens=sum(len(m["content"].split()) for m in request.messages),
                          completion_tokens=len(text.split()), seconds=time.perf_counter() - t0, finish_reason=finish)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        pass


class RecordedAnswers:
    """model=answers: flows/rescore.py judges `conf.source`'s answers itself; an agent that asks this model errs."""

    def __init__(self, conf):
        self.name = conf.name
        self.source = conf.source

    def generate(self, request: GenRequest) -> Generation:
        raise ModelUnavailable(f"model=answers holds recorded answers ({self.source}): score them with "
                               f"`python -m flows.rescore`, not flows.evaluate")

    def close(self) -> None:
        pass
