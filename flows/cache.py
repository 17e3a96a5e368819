"""Trajectory cache: a sweep over budgets costs about one budget.

Round r of a trajectory does not depend on the budget (agents/loop.py keeps that invariant), so a job
with budget k cuts a cached longer trajectory (`truncate`) or continues a cached shorter one
(`run_agent(prior=...)`). Entries are keyed by everything that changes a trajectory: the model config
(id, revision, pack, dtype...), the strategy and its knobs, protocol, seed, max_new_tokens, the sandbox
config, the content of the prompt templates and of the agent code, and the task itself. `cache=false`
turns it off. The oracle test doubles are never cached: they cost nothing and a cache would hide
harness changes.

The cache is shared by every job on the machine (a sweep's workers, the nightly flow, someone's run) and written
while they run: an entry is replaced atomically (temp file + rename, so a reader sees a whole trajectory or the old
one), and "keep the longest" (read, compare, replace) runs under a cross-process file lock per cache key, so two
jobs finishing the same task never leave the shorter trajectory in place of the longer one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from pathlib import Path

from agents.models.config import ModelConf, TransformersModelConf
from serving import cache_root
from agents.types import Task, Trajectory
from sandboxes.config import SandboxConf

from .result_neutral import without_neutral

REPO_ROOT = Path(__file__).resolve().parent.parent
AGENTS = REPO_ROOT / "agents"
UNCACHED_BACKENDS = ("oracle", "answers")

def default_cache_dir() -> Path:
    return cache_root() / "trajectories"


def _agent_code_digest() -> str:
    """Prompt templates and agent code (not the model backends or the serving stack) as one digest."""
    h = hashlib.sha256()
    files = sorted(p for p in AGENTS.rglob("*") if p.is_file() and p.suffix in (".py", ".txt", ".md", ".j2")
                   and not {"models", "serving"} & set(p.relative_to(AGENTS).parts) and "__pycache__" not in p.parts)
    for p in files:
        h.update(str(p.relative_to(AGENTS)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def model_identity(model: ModelConf) -> dict:
    """The model config keys that change answers, with `dtype: auto` replaced by what it resolves to here (bf16
    or fp32 on a CPU depends on its instructions, so one config can mean two numerics on two machines)."""
    ident = without_neutral("model", dataclasses.asdict(model))
    if isinstance(model, TransformersModelConf):
        from serving import NUMERICS, auto_dtype, recorded_path

        ident["numerics"] = NUMERICS  # trajectories from an older engine arithmetic are not this one's
        chosen = recorded_path(model)
        if chosen is not None:  # the path this process's model took (weights, dtype, runtime: measured when auto)
            ident["serving"] = without_neutral("serving", chosen)
            return ident
        dtype = auto_dtype(model)  # resolves the device either way (a wrong one raises)
        if dtype is not None:
            ident["dtype"] = dtype
    return ident


class TrajectoryCache:
    def __init__(self, root: Path, model: ModelConf, agent, sandbox: SandboxConf):
        agent_knobs = {k: v for k, v in dataclasses.asdict(agent).items() if k not in ("iters", "sample")}
        ident = {
            "model": model_identity(model),
            "agent": agent_knobs,
            "sandbox": without_neutral("sandbox", dataclasses.asdict(sandbox)),
            "code": _agent_code_digest(),
        }
        self.key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:24]
        self.dir = Path(root) / self.key
        self.dir.mkdir(parents=True, exist_ok=True)
        ident_file = self.dir / "key.json"
        if not ident_file.exists():
            _write_atomic(ident_file, json.dumps(ident, indent=1, sort_keys=True, default=str))
        from filelock import FileLock

        # threads of this process and other processes alike (FileLock is exclusive per thread, re-entrant within one)
        self._lock = FileLock(str(self.dir / ".put.lock"))

    @staticmethod
    def applies(model: ModelConf) -> bool:
        return model.backend not in UNCACHED_BACKENDS

    def _path(self, task: Task, sample: int, candidates: int = 1) -> Path:
        """One file per task and sample; a single_shot stream drafted K > 1 answers a round (flows/stream.py) has its
        own, beside the one-answer stream (which is the plain trajectory)."""
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(task), sort_keys=True).encode()).hexdigest()[:16]
        return self.dir / (f"{digest}__s{sample}.json" if candidates == 1 else f"{digest}__s{sample}__k{candidates}.json")

    def get(self, task: Task, sample: int, candidates: int = 1) -> Trajectory | None:
        p = self._path(task, sample, candidates)
        try:
            return Trajectory.from_dict(json.loads(p.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def put(self, traj: Trajectory, task: Task, candidates: int = 1) -> None:
        """Keep the longest clean trajectory for a task (errors are never cached)."""
        if traj.error is not None:
            return
        p = self._path(task, traj.sample, candidates)
        with self._lock:
            old = self.get(task, traj.sample, candidates)
            if old is not None and old.budget >= traj.budget:
                return
            _write_atomic(p, json.dumps(traj.to_dict(), default=str))


def _write_atomic(path: Path, text: str) -> None:
    """A reader sees the old file or the whole new one, never a part (temp file in the same folder + rename)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)
