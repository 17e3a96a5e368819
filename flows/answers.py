"""The answers flows/rescore.py judges again, read and checked: a run's trajectories (from this machine's task store or
the run's `tasks/` artifacts), fixlab's results.jsonl rows as trajectories, bigcode-evaluation-harness's generations
JSON and EvalPlus samples JSONL as n answers a task. A malformed row, an unknown task or a count that differs is one
line naming it (RescoreError)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from agents.types import Attempt, Task, Trajectory

from .config import ConfigError

FORMATS = ("auto", "bigcode", "evalplus", "fixlab")


class RescoreError(ConfigError):
    """Bad input to a rescore: one line naming the file, row or task, and the fix."""


@dataclass
class Source:
    """What is judged again: trajectories (a RUN, a results.jsonl) or answers (n a task, by task id)."""

    label: str  # the run id or the file, as given
    kind: str  # run | bigcode | evalplus | fixlab
    trajectories: dict[tuple[str, int], Trajectory] = field(default_factory=dict)
    answers: dict[str, list[str]] = field(default_factory=dict)
    rows: list = field(default_factory=list)  # a file's rows as read (bigcode's lists are matched to tasks later)
    params: dict = field(default_factory=dict)  # a RUN's params

    @property
    def replays(self) -> bool:
        return self.kind in ("run", "fixlab")


# ---------------------------------------------------------------- reading what is judged
def read_file(path: str, fmt: str = "auto") -> Source:
    """An answers file, its format told or found; any malformed row is one line naming it."""
    p = Path(path)
    if not p.is_file():
        raise RescoreError(f"--answers {path}: no such file")
    text = p.read_text(encoding="utf-8", errors="replace")
    if fmt == "auto":
        fmt = "bigcode" if text.lstrip().startswith("[") else _jsonl_format(text, path)
    if fmt == "bigcode":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RescoreError(f"--answers {path}: not JSON ({e.msg} at line {e.lineno}); bigcode's generations "
                               f"file is a JSON list of lists of strings") from None
        if not isinstance(data, list):
            raise RescoreError(f"--answers {path}: a bigcode generations file is a list of lists of strings")
        for i, gens in enumerate(data):
            if not isinstance(gens, list) or not all(isinstance(g, str) for g in gens):
                raise RescoreError(f"--answers {path}: entry {i} is not a list of strings (bigcode's generations "
                                   f"are one list per task, in dataset order)")
        return Source(path, "bigcode", rows=data)
    rows = _jsonl_rows(text, path)
    if fmt == "evalplus":
        answers: dict[str, list[str]] = {}
        for n, row in rows:
            if not isinstance(row.get("task_id"), str):
                raise RescoreError(f"--answers {path}: line {n} has no task_id")
            answer = row.get("solution", row.get("completion"))
            if not isinstance(answer, str):
                raise RescoreError(f"--answers {path}: line {n} ({row['task_id']}) has neither a `solution` nor a "
                                   f"`completion` string")
            answers.setdefault(row["task_id"], []).append(("solution" if "solution" in row else "completion", answer))
        return Source(path, "evalplus", rows=[(tid, a) for tid, a in answers.items()])
    if fmt == "fixlab":
        trajs = {}
        for n, row in rows:
            try:
                t = _row_trajectory(row)
            except (KeyError, TypeError, ValueError) as e:
                raise RescoreError(f"--answers {path}: line {n} is not a fixlab results row ({e})") from None
            trajs[(t.task_id, t.sample)] = t
        return Source(path, "fixlab", trajectories=trajs)
    raise RescoreError(f"--format {fmt}: use one of {', '.join(FORMATS)}")


def _jsonl_rows(text: str, path: str) -> list[tuple[int, dict]]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RescoreError(f"--answers {path}: line {n} is not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise RescoreError(f"--answers {path}: line {n} is not a JSON object")
        rows.append((n, row))
    if not rows:
        raise RescoreError(f"--answers {path}: the file holds no answers")
    return rows


def _jsonl_format(text: str, path: str) -> str:
    first = _jsonl_rows(text, path)[0][1]
    if "attempts" in first and "passed_by_budget" in first:
        return "fixlab"
    if "solution" in first or "completion" in first:
        return "evalplus"
    raise RescoreError(f"--answers {path}: line 1 is neither an EvalPlus sample (task_id + solution or completion) "
                       f"nor a fixlab results row; say which with --format")


def _row_trajectory(row: dict) -> Trajectory:
    """A results.jsonl row as a trajectory: its attempts' code, decisions and costs (what was judged and what it cost)."""
    from sandboxes.base import ExecResult

    from agents.types import ModelCall

    attempts = []
    for a in row["attempts"]:
        calls = [ModelCall(messages=[], output="", prompt_tokens=int(a.get("prompt_tokens") or 0),
                           completion_tokens=int(a.get("completion_tokens") or 0))]
        result = ExecResult(status=a["status"]) if a.get("status") else None
        attempts.append(Attempt(round=int(a["round"]), decision=a["decision"], code=a.get("code"), result=result,
                                visible_result=result, calls=calls, seconds=float(a.get("seconds") or 0.0)))
    budget = len(row.get("passed_by_budget") or [0]) - 1
    return Trajectory(task_id=row["task_id"], bug_type=row.get("bug_type") or "", strategy="recorded",
                      attempts=attempts, passed_round=row.get("passed_round") if row.get("passed") else None,
                      seconds=float(row.get("seconds") or 0.0), budget=budget, sample=int(row.get("sample", 0)))


def read_run(client, store_dir: Path, run_id: str) -> Source:
    """A run's trajectories: this machine's task store when it has them (exact, no download), else the run's
    `tasks/` artifacts (a remote store)."""
    from mlflow.exceptions import MlflowException

    from .core import TaskStore

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise RescoreError(f"{run_id}: no such run in this store (name the store with tracking.uri=...)") from None
    local = store_dir / "state" / run_id / "tasks"
    trajs = TaskStore(store_dir, run_id).load_all() if local.is_dir() else []
    if not trajs:
        with tempfile.TemporaryDirectory(prefix="fixlab-rescore-") as tmp:
            try:
                folder = Path(client.download_artifacts(run_id, "tasks", tmp))
            except (MlflowException, OSError):
                folder = Path(tmp) / "none"
            for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
                trajs.append(Trajectory.from_dict(json.loads(p.read_text())))
    if not trajs:
        raise RescoreError(f"{run_id}: the run keeps no trajectories (neither {local} nor its tasks/ artifacts)")
    return Source(run_id, "run", trajectories={(t.task_id, t.sample): t for t in trajs if t.error is None},
                  params=dict(run.data.params))


def answers_for(source: Source, tasks: list[Task], first_tasks: bool = False,
                known: set[str] | None = None) -> dict[str, list[str]]:
    """The answers of each task of the dataset, n for every task; a task id the dataset lacks, or a task with
    another count, is one line naming it. `first_tasks`: the tasks are the dataset's first (dataset.limit), so a
    bigcode file of the whole dataset gives its first lists. `known`: every task id of the language's dataset (answers
    to tasks outside the selection are left out; an id outside it is an error)."""
    from .core import task_order

    ids = {t.task_id for t in tasks}
    known = known if known is not None else ids
    by_id = {t.task_id: t for t in tasks}
    out: dict[str, list[str]] = {}
    if source.kind == "bigcode":
        if len(source.rows) != len(tasks) and not (first_tasks and len(source.rows) > len(tasks)):
            raise RescoreError(f"--answers {source.label}: {len(source.rows)} task lists for a dataset of {len(tasks)} "
                               f"tasks (bigcode's lists follow the dataset's order: select the same tasks with "
                               f"dataset.limit=, or give the whole file)")
        out = {t.task_id: list(gens) for t, gens in zip(tasks, source.rows)}
    elif source.kind == "evalplus":
        for tid, answers in source.rows:
            if tid not in known:
                raise RescoreError(f"--answers {source.label}: task {tid} is not a task of the dataset (check "
                                   f"dataset.language)")
            if tid not in ids:
                continue
            task = by_id[tid]
            out[tid] = [a if kind == "solution" else task.lang.context(task) + a for kind, a in answers]
    else:
        for (tid, _s) in source.trajectories:
            if tid not in known:
                raise RescoreError(f"{source.label}: task {tid} is not a task of the dataset (check dataset.language)")
        return {}
    counts = {tid: len(out.get(tid, [])) for tid in ids}
    n = max(counts.values(), default=0)
    short = sorted((tid for tid, c in counts.items() if c != n), key=task_order)
    if short:
        raise RescoreError(f"--answers {source.label}: task {short[0]} has {counts[short[0]]} answer(s) where others "
                           f"have {n} (every task needs the same count: pass@k is over n answers a task; select "
                           f"tasks with dataset.limit= or dataset.task_ids=)")
    return out


def code_of(answer: str, task: Task) -> str | None:
    """An answer's code: a fenced answer's block in the task's language (the agent's reader), else the text."""
    if "```" not in answer:
        return answer if answer.strip() else None
    from agents import multilang
    from agents.extract import extract_candidate

    if task.lang.name == "python":
        got = extract_candidate(answer, task, keep_context=True, check_signature=False)
    else:
        got = multilang.extract(answer, task)
    code = getattr(got, "code", got if isinstance(got, str) else None)
    return code or None
