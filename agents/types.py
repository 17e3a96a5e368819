"""Typed records that flow between layers: Task -> (agent) -> Trajectory of Attempts and ModelCalls.

Everything here round-trips through JSON (to_dict / from_dict): trajectories are what MLflow stores per
task, what resume reads back, and what the sweep cache keeps.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, get_args

from sandboxes.base import ExecResult
from sandboxes.languages import of_task

# The hub's 15 fields of bigcode/humanevalpack (python config, test split), in the hub's order.
TASK_FIELDS = (
    "task_id", "prompt", "declaration", "canonical_solution", "buggy_solution", "bug_type",
    "failure_symptoms", "entry_point", "import", "test_setup", "test", "example_test", "signature",
    "docstring", "instruction",
)


@dataclass(frozen=True)
class Task:
    """One HumanEvalFix problem."""

    task_id: str
    prompt: str
    declaration: str
    canonical_solution: str
    buggy_solution: str
    bug_type: str
    failure_symptoms: str
    entry_point: str
    imports: str  # the hub's "import" field ("" for Python)
    test_setup: str
    test: str
    example_test: str
    signature: str
    docstring: str
    instruction: str

    @classmethod
    def from_row(cls, row: dict) -> "Task":
        kw = {("imports" if k == "import" else k): row[k] for k in TASK_FIELDS}
        return cls(**kw)

    @property
    def lang(self):
        """The task's language (sandboxes/languages), from its id's prefix ("CPP/3": C++)."""
        return of_task(self.task_id)

    @property
    def buggy_code(self) -> str:
        """The whole buggy function as a person reads it: the language's context (the declaration, with helpers) +
        the buggy body."""
        return self.lang.context(self) + self.buggy_solution

    @property
    def fixed_code(self) -> str:
        return self.lang.context(self) + self.canonical_solution


@dataclass
class ModelCall:
    """One request to the model and its answer."""

    messages: list[dict]
    output: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    temperature: float = 0.0
    seed: int | None = None
    error: str | None = None
    tool_calls: list[dict] = field(default_factory=list)  # parsed native tool calls (react)
    prefill_tokens: int | None = None  # prompt tokens the backend computed (None: it does not say; = prompt_tokens)
    finish_reason: str = "stop"  # "length": the answer hit max_new_tokens
    draft_tokens: int = 0
    draft_accepted: int = 0
    # a reasoning model's thinking (agents/reasoning.py), never read as the answer, and its tokens (part of
    # completion_tokens; None: the backend could not count them)
    reasoning: str | None = None
    reasoning_tokens: int | None = None


# What became of a round's answer (see Attempt) and why an episode ended (see Trajectory).
Decision = Literal["tested", "syntax_error", "no_code", "repeat", "model_error", "submitted", "out_of_turns"]
StopReason = Literal["solved", "unsure", "submitted", "out_of_turns", "budget", "cost_limit"]
DECISIONS: tuple[str, ...] = get_args(Decision)
STOP_REASONS: tuple[str, ...] = get_args(StopReason)


@dataclass
class Attempt:
    """One round: the model call(s) that produced a candidate and what became of it.

    decision: "tested"       - the candidate ran in the sandbox (see result);
              "syntax_error" - not valid Python or wrong/missing signature; not run;
              "no_code"      - no code could be extracted from the answer;
              "repeat"       - same as an earlier candidate (or the unchanged buggy code); not run again;
              "model_error"  - the model call failed;
              "submitted"    - react: the agent submitted this candidate (run unless it was tested before);
              "out_of_turns" - react: the model-turn cap ran out before this round's test run.
    result is the verdict on the full `test`; visible_result is the run on the tests the agent sees (the same
    object under protocol=tests). `steps` lists react's turns (action, decision, observation).
    unchanged / same_as_round / problem say why a candidate was flagged, repeated or refused.
    With `candidates` > 1 a round drafts several answers: calls[-1] is the one kept (`candidate` its index),
    `rejected` says what became of the others (call index, decision, visible status when it was run, code, and
    the candidate or round it repeats).
    """

    round: int
    decision: Decision
    code: str | None = None
    result: ExecResult | None = None
    feedback: str | None = None
    visible_result: ExecResult | None = None
    calls: list[ModelCall] = field(default_factory=list)
    seconds: float = 0.0
    suspicious: str | None = None  # why the pass looks gamed (sandboxes/audit.py); None = clean or not a pass
    rejected: list[dict] = field(default_factory=list)  # candidates drafted this round and not kept
    unchanged: bool = False  # the candidate is the buggy code handed back (still run; the feedback says so)
    same_as_round: int | None = None  # repeat / react resubmission: the round that already ran this code
    same_as_candidate: int | None = None  # a repeat of an earlier candidate of the same round (its call index)
    problem: str | None = None  # why the answer's code is unusable (no_code, syntax_error; syntax path off: run)
    steps: list[dict] = field(default_factory=list)  # react: one dict per model turn (action, decision, ...)
    candidate: int | None = None  # candidates > 1: index of the kept answer among the round's drafts
    # answer_format=line (agents/lines.py): the shown code's lines (1-based) ranked most suspect first, on the round
    # that located them, and the line this round's kept answer corrected (None: a whole-function answer)
    located: list[int] | None = None
    line: int | None = None
    side_runs: int = 0  # sandbox runs the round made besides its answers' (show_failure: the buggy code's run)
    # self_check (agents/selfcheck.py): probes, the passing candidates' call indexes grouped by what they returned
    # (kept group first), probe runs, and whether enough agreed for the agent to be satisfied
    self_check: dict | None = None

    @property
    def visible(self) -> ExecResult | None:
        """The run the agent sees: the visible tests' run under docs/hidden, else the full verdict."""
        return self.visible_result or self.result

    @property
    def passed_visible(self) -> bool:
        """A tested run of what the agent sees passed (it stops here; believed unless its self-check disagrees)."""
        return self.decision == "tested" and self.visible is not None and self.visible.passed

    @property
    def unsure(self) -> bool:
        """It passed what the agent sees, but too few of the round's passing answers agreed on the probes."""
        return self.passed_visible and self.self_check is not None and not self.self_check["satisfied"]

    @property
    def held(self) -> bool:
        """self_check_scope=task: it passed what the agent sees but too few answers of the task agree yet, so the
        agent keeps looking instead of handing it in (it never counts as passed, whatever the full test says)."""
        return self.unsure and bool(self.self_check.get("held"))

    def candidate_passed(self, call: int) -> bool:
        """Whether this round's candidate `call` passed the full test: the kept one's result, a rejected one's
        recorded verdict (else its status: the same run under protocol tests), a repeat's that of the one it repeats."""
        if call == (self.candidate or 0):
            return self.result is not None and self.result.passed
        r = next(r for r in self.rejected if r["call"] == call)
        if "verdict" not in r and r.get("same_as") is not None and r.get("decision") == "repeat":
            return self.candidate_passed(r["same_as"])
        return r.get("verdict", r.get("status")) == "passed"

    @classmethod
    def from_dict(cls, d: dict) -> "Attempt":
        a = dict(d)
        a["calls"] = [ModelCall(**c) for c in a.get("calls", [])]
        a["result"] = ExecResult.from_dict(a["result"]) if a.get("result") else None
        a["visible_result"] = ExecResult.from_dict(a["visible_result"]) if a.get("visible_result") else None
        return cls(**a)

    @property
    def sandbox_runs(self) -> int:
        """Visible-test runs this round made: the kept answer's (when run) and each run rejected candidate's."""
        kept = self.decision in ("tested", "submitted") and self.result is not None
        probes = (self.self_check or {}).get("runs", 0)
        return int(kept) + sum(1 for r in self.rejected if r.get("status")) + probes + self.side_runs

    @property
    def passed(self) -> bool:
        """Handed in and the full test passed (a held answer is not handed in)."""
        return self.result is not None and self.result.passed and not self.held


TRAJECTORY_SCHEMA = 2  # the stored trajectory's shape (to_dict); a file of another is refused, not misread


@dataclass
class Trajectory:
    """Everything an agent did on one task. The pass@1 curve over rounds is derived from it."""

    task_id: str
    bug_type: str
    strategy: str
    attempts: list[Attempt] = field(default_factory=list)
    passed_round: int | None = None  # the round of the answer handed in, when it passed
    error: str | None = None  # the task crashed (harness problem, not a wrong answer)
    seconds: float = 0.0
    budget: int = 0  # iters: feedback rounds allowed after round 0
    sample: int = 0
    stop_reason: StopReason | None = None
    agent_key: str = ""  # digest of the agent config minus iters: continuation refuses a mismatched prior
    derived_from: str | None = None  # cut from single_shot's answer stream (flows/stream.py): seconds are apportioned
    # strategy.held_at_end (agents/config.py): "hand_in" hands the best held answer in when the budget ends, and
    # `handed_in` says which ([round, candidate]); then passed_round is that answer's round when it passed
    held_at_end: str = "hold"
    handed_in: list[int] | None = None

    @property
    def passed(self) -> bool:
        """The answer handed in at the trajectory's own budget passed the full test."""
        return self.passed_round is not None

    def passed_by_round(self, r: int) -> bool:
        """What a fresh run with budget `r` scores (r <= budget)."""
        if self.held_at_end == "hold":
            return self.passed_round is not None and self.passed_round <= r
        if any(a.passed for a in self.attempts if a.round <= r):
            return True
        held = self.held_answer(r)
        return held is not None and held[2]

    def held_answer(self, r: int) -> tuple[int, int, bool] | None:
        """held_at_end=hand_in: the answer a budget of `r` hands in when it ends with nothing handed in ([round,
        candidate] of the first of the last self-check's best group, and whether it passed the full test), else None.
        Rounds never depend on the budget, so this reads the same on a longer trajectory as on a fresh run."""
        upto = [a for a in self.attempts if a.round <= r]
        if any(a.passed_visible and not a.held for a in upto):
            return None  # something was handed in: that answer's verdict stands
        checks = [a for a in upto if a.self_check and a.self_check.get("groups") and a.self_check["groups"][0]]
        if not checks:
            return None
        rnd, call = checks[-1].self_check["groups"][0][0]
        return rnd, call, next(a for a in upto if a.round == rnd).candidate_passed(call)

    @property
    def passed_by_budget(self) -> list[bool]:
        """The verdict at each budget 0..budget: what a results row keeps to score every smaller budget, whatever the
        strategy (under held_at_end=hand_in it is not monotone in the budget, so no single round could say it)."""
        return [self.passed_by_round(r) for r in range(self.budget + 1)]

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for a in self.attempts for c in a.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for a in self.attempts for c in a.calls)

    @property
    def suspicious(self) -> str | None:
        """Why the passing attempt looks gamed (a returned value whose == cannot be trusted), else None."""
        for a in self.attempts:
            if a.passed:
                return a.suspicious
        return None

    @property
    def prefill_tokens(self) -> int:
        return sum(c.prompt_tokens if c.prefill_tokens is None else c.prefill_tokens
                   for a in self.attempts for c in a.calls)

    @property
    def model_calls(self) -> int:
        return sum(len(a.calls) for a in self.attempts)

    @property
    def reasoning_tokens(self) -> int:
        """Tokens spent thinking (a reasoning model's think blocks), counted apart; part of completion_tokens."""
        return sum(c.reasoning_tokens or 0 for a in self.attempts for c in a.calls)

    @property
    def length_stops(self) -> int:
        """Answers cut at max_new_tokens (rambling)."""
        return sum(c.finish_reason == "length" for a in self.attempts for c in a.calls)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        d["prompt_tokens"] = self.prompt_tokens
        d["completion_tokens"] = self.completion_tokens
        d["prefill_tokens"] = self.prefill_tokens
        d["suspicious"] = self.suspicious
        d["schema"] = TRAJECTORY_SCHEMA
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        if d.get("schema") != TRAJECTORY_SCHEMA:  # an older shape names its fields otherwise: it would read wrong
            raise ValueError(f"trajectory of {d.get('task_id', '?')} is schema {d.get('schema', 1)}, this fixlab "
                             f"reads {TRAJECTORY_SCHEMA}: run the task again")
        attempts = [Attempt.from_dict(a) for a in d.get("attempts", [])]
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and k != "attempts"}
        return cls(attempts=attempts, **kw)


# A task's verdict at each budget 0..n, as trajectories (Trajectory.passed_by_budget), results rows and results files
# keep it. A budget past the list's end keeps the last verdict.
Verdicts = list[bool]


def verdicts(stored: list) -> Verdicts:
    """A stored verdict list as verdicts per budget."""
    return [bool(v) for v in stored]


def passed_at(v: Verdicts, k: int | None = None) -> bool:
    """Passed with budget k (None: the run's own budget, the last verdict)."""
    return bool(v) and v[-1 if k is None else min(k, len(v) - 1)]


def cut(v: Verdicts, k: int) -> Verdicts:
    """The verdicts a run with budget k keeps: the one cut every reader of a budget uses (the frontier, compare, the
    report, resume). Round r never depends on the budget (agents/loop.py), so a prefix is a fresh run's record."""
    return v[: k + 1]


def first_pass(v: Verdicts) -> int | None:
    """The first budget whose answer passed (None: none did)."""
    return next((k for k, ok in enumerate(v) if ok), None)


def row_verdicts(row: dict) -> Verdicts:
    """A results row's verdicts per budget."""
    return verdicts(row["passed_by_budget"])
