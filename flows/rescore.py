"""`python -m flows.rescore RUN | --answers FILE [--format F] [overrides]`: answers judged again, no model asked.

- RUN, a run id of the store `tracking.uri` names: every attempt its trajectories hold is run again against the full
  test by today's sandbox. The new run keeps the old one's rounds, decisions and costs, with the new verdicts.
- FILE, answers made elsewhere, judged as they are (a fenced answer: the code in its fence):
  - `bigcode`: bigcode-evaluation-harness's generations JSON (`--save_generations`): a list per task, in dataset
    order, of the programs its humanevalfix tasks post-processed (the declaration and the fixed function);
  - `evalplus`: samples JSONL, one answer a line: `task_id` with `solution` (the whole function) or `completion`
    (a body, put after the task's declaration as the dataset's `canonical_solution` is);
  - `fixlab`: a job's own `results.jsonl` (an MLflow artifact), every attempt of every row, as for a RUN.
  `--format auto` (the default) tells them apart by the file.

Either way it is a job: flows/job.py's run_job, with this file's runner judging in place of an agent asking a model.
So it has its own MLflow run (tag `fixlab.rescored`: what it judged again), one trace per task, its results file,
and, as a job ends, one JSON line on stdout with `passed` and `total`, pass@k with its interval where a task has n
answers, the suspicious passes and, for a RUN or a results.jsonl, the agreement, old verdict against new, per
attempt and per task, with the paired test. The job's Hydra overrides choose the dataset, the sandbox and the store
(`dataset.language=go sandbox=docker tracking.uri=...`); a RUN's dataset is its own unless they name one.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agents.context import audit_pass, run_test
from agents.loop import hand_in_held
from agents.types import Attempt, Task, Trajectory

from .answers import FORMATS, RescoreError, Source, answers_for, code_of, read_file, read_run
from .config import ConfigError
from .results import read

USAGE = ("usage: python -m flows.rescore RUN_ID [overrides]  |  python -m flows.rescore --answers FILE "
         "[--format auto|bigcode|evalplus|fixlab] [overrides]")
JUDGED = ("tested", "submitted")  # the decisions whose answer ran against the full test


# ---------------------------------------------------------------- judging
def judge_answer(task: Task, sample: int, answer: str, sandbox, agent) -> Trajectory:
    """One answer as round 0 of sample `sample`: run against the full test (and audited, for Python passes)."""
    code = code_of(answer, task)
    if code is None:
        attempt = Attempt(round=0, decision="no_code", problem="the answer is empty")
    else:
        result = run_test(sandbox, task, code, task.test, agent.timeout_s)
        attempt = Attempt(round=0, decision="tested", code=code, result=result, visible_result=result)
        if result.passed:
            attempt.suspicious, failed = audit_pass(sandbox, task, code, result, agent)
            if failed is not None:
                attempt.result = attempt.visible_result = failed
    traj = Trajectory(task_id=task.task_id, bug_type=task.bug_type, strategy="answers", attempts=[attempt],
                      seconds=attempt.result.duration_s if attempt.result else 0.0, budget=0, sample=sample)
    traj.passed_round = 0 if attempt.passed else None
    return traj


def judge_trajectory(task: Task, old: Trajectory, sandbox, agent) -> tuple[Trajectory, list[dict]]:
    """`old` with each judged attempt run again against the full test, and (round, old status, new status) for each.
    The rounds and decisions stay as recorded: what a round showed the agent is history, only the verdict is new.
    Under protocol `tests` the visible run is the verdict, so it changes with it; under docs/hidden it stays."""
    new = copy.deepcopy(old)
    new.derived_from = f"rescore of {old.task_id}#{old.sample}"
    agreement = []
    for a in new.attempts:
        if a.decision not in JUDGED or not a.code or a.result is None:
            continue
        was = a.result
        result = run_test(sandbox, task, a.code, task.test, agent.timeout_s)
        if result.passed:
            a.suspicious, failed = audit_pass(sandbox, task, a.code, result, agent)
            result = failed or result
        else:
            a.suspicious = None
        if a.visible_result is None or a.visible_result is was or a.visible_result == was:
            a.visible_result = result
        a.result = result
        agreement.append({"round": a.round, "old": was.status, "new": result.status})
    firsts = [a.round for a in new.attempts if a.passed]
    new.passed_round, new.handed_in = (min(firsts) if firsts else None), None
    hand_in_held(new)  # held_at_end=hand_in: what the budget hands in, as the loop decides it
    return new, agreement


class Judge:
    """run_job's runner (flows/job.py): every job (task, sample) judged in a pool of threads as wide as the sandbox's,
    `done` called as each ends. The agreement per attempt is kept for the summary."""

    def __init__(self, source: Source, answers: dict[str, list[str]]):
        self.source, self.answers = source, answers
        self.agreement: dict[tuple[str, int], list[dict]] = {}
        self.old_passed: dict[tuple[str, int], bool] = {}

    def __call__(self, jobs, settings, done) -> None:
        from .workers import model_and_sandbox

        _, sandbox = model_and_sandbox(settings)
        agent = settings.agent
        # the sandbox's pool bounds what runs at once; a program more than the cores keeps them busy while one starts
        width = getattr(settings.sandbox, "workers", None) or (os.cpu_count() or 2) + 1

        def one(job):
            task, sample = job
            try:
                if self.source.replays:
                    old = self.source.trajectories[(task.task_id, sample)]
                    traj, agreement = judge_trajectory(task, old, sandbox, agent)
                    self.agreement[(task.task_id, sample)] = agreement
                    self.old_passed[(task.task_id, sample)] = old.passed
                else:
                    traj = judge_answer(task, sample, self.answers[task.task_id][sample], sandbox, agent)
                done(job, traj)
            except Exception as e:  # one answer that breaks the judge never stops the others
                done(job, e)

        with ThreadPoolExecutor(width, thread_name_prefix="fixlab-rescore") as pool:
            list(pool.map(one, jobs))

    def report(self, trajs: list[Trajectory]) -> dict | None:
        """Old against new: per attempt (same status or not, the differing ones named) and per task (the paired
        test on pass/fail)."""
        if not self.source.replays:
            return None
        from .stats import paired

        new = {(t.task_id, t.sample): t.passed for t in trajs}
        keys = sorted(k for k in new if k in self.old_passed)
        attempts = [(k, a) for k in keys for a in self.agreement.get(k, [])]
        differ = [f"{k[0]}#{k[1]} round {a['round']}: {a['old']} -> {a['new']}" for k, a in attempts
                  if a["old"] != a["new"]]
        p = paired([self.old_passed[k] for k in keys], [new[k] for k in keys])
        return {"attempts": len(attempts), "attempts_same": len(attempts) - len(differ), "attempts_differ": differ,
                "tasks": len(keys), "tasks_same": sum(self.old_passed[k] == new[k] for k in keys),
                "old_passed": p.a_passed, "new_passed": p.b_passed,
                "paired": {"old_only": p.only_a, "new_only": p.only_b, "diff": round(p.diff, 4),
                           "ci95": [round(p.low, 4), round(p.high, 4)], "p_value": round(p.p_value, 6),
                           "verdict": p.verdict("the old verdicts", "today's")}}


# ---------------------------------------------------------------- the command
def parse(argv: list[str]) -> tuple[str | None, str | None, str, list[str]]:
    """(run id, answers file, format, the Hydra overrides)."""
    run_id = path = None
    fmt, overrides, i = "auto", [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--answers", "--format"):
            if i + 1 >= len(argv):
                raise RescoreError(f"{a} needs a value; {USAGE}")
            path, fmt = (argv[i + 1], fmt) if a == "--answers" else (path, argv[i + 1])
            i += 2
            continue
        if a.startswith("--answers="):
            path = a.split("=", 1)[1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a.startswith("-"):
            raise RescoreError(f"unknown option {a}; {USAGE}")
        elif "=" in a:
            overrides.append(a)
        elif run_id is None:
            run_id = a
        else:
            raise RescoreError(f"one run at a time (got {run_id} and {a}); {USAGE}")
        i += 1
    if (run_id is None) == (path is None):
        raise RescoreError(f"give a run id or --answers FILE, not both or neither; {USAGE}")
    if fmt not in FORMATS:
        raise RescoreError(f"--format {fmt}: use one of {', '.join(FORMATS)}")
    return run_id, path, fmt, overrides


def compose(overrides: list[str]):
    """The job's typed settings from conf/ and the overrides (one line for a bad one)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    from . import schema
    from .config import settings_from

    try:
        with initialize_config_dir(config_dir=str(schema.CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=overrides)
        return settings_from(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError:
        raise
    except Exception as e:
        raise RescoreError(schema.describe(e)) from None


def _name(text: str) -> str:
    return re.sub(r"[^\w.+-]+", "-", text).strip("-")[:60] or "answers"


def _kept_params(params: dict) -> list[str]:
    """A RUN's own dataset, strategy, protocol and budget, as overrides (its rows mean nothing on other tasks)."""
    keep = []
    for key in ("dataset.language", "dataset.path", "dataset.limit", "dataset.task_ids"):
        v = params.get(key)
        if v not in (None, "None", "null", ""):
            keep.append(f"{key}={v}" if key != "dataset.task_ids" else f"{key}={v.replace(' ', '')}")
    if params.get("strategy.name"):
        keep.append(f"strategy={params['strategy.name']}")
    for key in ("protocol", "iters", "samples"):
        if params.get(key) not in (None, "None"):
            keep.append(f"{key}={params[key]}")
    return keep


def rescore(argv: list[str]) -> dict:
    """The whole command: read, check, judge as a job, say what agreed. Returns the job's summary."""
    from agents.tasks import load_tasks

    from .core import TaskStore
    from .job import run_job
    from .tracking import RunTracker

    run_id, path, fmt, overrides = parse(argv)
    user_keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    base = compose(overrides)
    if run_id:
        tracker = RunTracker(base.tracking)
        source = read_run(tracker.client, tracker.store_dir, run_id)
        kept = [o for o in _kept_params(source.params)
                if o.split("=", 1)[0] not in user_keys and not (o.startswith("dataset.") and
                                                                any(k.startswith("dataset.") for k in user_keys))]
        name = f"rescored-{source.params.get('model.name', 'run')}"
        extra = kept + [f"model.source={run_id}", "model.format=run"]
    else:
        source = read_file(path, fmt)
        extra = [f"model.source={Path(path).resolve()}", f"model.format={source.kind}"]
        name = f"answers-{_name(Path(path).stem)}"
        if source.kind == "fixlab":
            extra.append(f"iters={max(t.budget for t in source.trajectories.values())}")
    extra = ["model=answers", *extra] + ([] if "model.name" in user_keys else [f"model.name={name}"])
    settings = compose(extra + overrides)
    tasks = load_tasks(settings.dataset)
    selected = bool(settings.dataset.limit or settings.dataset.task_ids)
    known = ({t.task_id for t in load_tasks(dataclasses.replace(settings.dataset, limit=None, task_ids=None))}
             if selected else None)
    answers = answers_for(source, tasks, first_tasks=bool(settings.dataset.limit) and not settings.dataset.task_ids,
                          known=known)
    if source.replays:
        have = {tid for tid, _ in source.trajectories}
        tasks_ids = [t.task_id for t in tasks if t.task_id in have]
        if not tasks_ids:
            raise RescoreError(f"{source.label}: none of its tasks is in the dataset (check dataset.language)")
        samples = 1 + max(s for _, s in source.trajectories)
        settings = compose(extra + [f"samples={samples}"] * ("samples" not in user_keys) + overrides
                           + ([f"dataset.task_ids=[{','.join(json.dumps(t) for t in tasks_ids)}]"]
                              if len(tasks_ids) < len(tasks) else []))
    else:
        n = len(next(iter(answers.values()))) if answers else 0
        if n == 0:
            raise RescoreError(f"--answers {source.label}: no answers for the dataset's tasks")
        settings = compose(extra + [f"samples={n}", "iters=0"] + overrides)
    judge = Judge(source, answers)
    summary = run_job(settings, runner=judge)
    tracker = RunTracker(settings.tracking)
    tracker.run_id = summary["run_id"]
    agreement = judge.report(TaskStore(tracker.store_dir, tracker.run_id).load_all())
    summary["rescored"] = {"source": source.label, "format": source.kind}
    if agreement is not None:
        summary["agreement"] = agreement
    _link(tracker, summary, source, agreement)
    return summary


def _link(tracker, summary: dict, source: Source, agreement: dict | None) -> None:
    """The new run names what it judged again (a tag, and for a RUN a link back), and keeps the agreement."""
    rid = tracker.run_id
    results = Path(summary.get("results_file") or "")
    if results.is_file():  # the results file says what it judged again, and how the verdicts agreed
        data = read(results)
        data["runs"][0]["rescore"] = {"source": source.label, "format": source.kind, "agreement": agreement}
        results.write_text(json.dumps(data, indent=1) + "\n")
    try:
        tracker.client.set_tag(rid, "fixlab.rescored", source.label)
        tracker.client.set_tag(rid, "fixlab.kind", "rescore")
        if source.kind == "run":
            tracker.client.set_tag(rid, "mlflow.note.content",
                                   f"Judged again from run {source.label} by `python -m flows.rescore`.")
        if agreement is not None:
            tracker.log_json(agreement, "rescore/agreement.json")
    except Exception as e:  # the results file and the summary line already hold it
        print(f"fixlab: could not tag the rescore's run ({e})", file=sys.stderr)


def main(argv: list[str]) -> int:
    from agents.models import ModelUnavailable
    from agents.tasks import DatasetError
    from sandboxes import SandboxUnavailable

    if any(a in ("-h", "--help") for a in argv):
        print(__doc__ + "\n" + USAGE)
        return 0
    try:
        summary = rescore(argv)
    except (ConfigError, DatasetError, ModelUnavailable, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        from .workers import close_all

        close_all()
    a = summary.get("agreement")
    if a:
        print(f"fixlab: rescored {a['attempts']} attempts: {a['attempts_same']} the same verdict; tasks "
              f"{a['old_passed']} passed then, {a['new_passed']} now ({a['paired']['verdict']})", file=sys.stderr)
    print(json.dumps(summary, default=str), flush=True)
    return 1 if summary.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
