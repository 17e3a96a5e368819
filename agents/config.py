"""The agent's typed settings: one record per strategy (its knobs and their defaults, the only place they are
defined) inside AgentConfig (the knobs of one run), and what follows from them per round (seed and temperature).
conf/strategy/<name>.yaml picks a record as its schema (flows/schema.py) and holds only what differs from it.
The strategies live in agents/strategies/ (one module each), the loop that runs them in loop.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
import zlib
from dataclasses import dataclass

from sandboxes.config import SandboxConf

PROTOCOLS = ("tests", "docs", "hidden")
SCHEDULES = ("auto", "constant", "resample", "rising", "falling")
TOOL_FORMATS = ("auto", "native", "text")
ANSWER_FORMATS = ("function", "patch", "line")
SELF_CHECK_SCOPES = ("round", "task")  # DraftsConf.self_check_scope
HELD_AT_END = ("hold", "hand_in")  # DraftsConf.held_at_end


@dataclass
class StrategyConf:
    """What every strategy reads: the temperature schedule. How an answer is checked and how feedback is made are
    fixed (agents/context.py, agents/feedback.py: never varied in a full-size run)."""

    name: str  # single_shot | reflection | react | portfolio: set by each record below
    # Temperature per round, seeded per task, sample and round: constant | resample (round 0 at `temperature`, later
    # rounds at RESAMPLE_TEMPERATURE) | rising (temperature + TEMPERATURE_STEP * round, up to TEMPERATURE_MAX) |
    # falling (FALLING_TEMPERATURES[round]) | auto (resample for single_shot and portfolio, else constant). Rising by
    # default: greedy revisions of a small model tend to hand back the same code round after round.
    temperature_schedule: str = "rising"


@dataclass
class DraftsConf(StrategyConf):
    """Strategies whose round is one prompt answered by one or more drafts (single_shot, reflection)."""

    # Answers drafted per round, decoded as one batch; the first whose visible tests pass is kept, else the first
    # that ran. Each run counts in sandbox_runs and every call in the tokens. single_shot: answer p of a task
    # (p = round * candidates + i) has round p's seed and temperature, so a grid over candidates x iters is cut from
    # one run of its largest point (flows/stream.py).
    candidates: int = 1
    # What an answer is: the whole fixed function (function), or one SEARCH/REPLACE edit of the shown code (patch:
    # a fraction of the tokens; agents/patch.py), or one corrected line, the line chosen by a localisation call
    # first (line: agents/lines.py). patch, line: single_shot only (the revise prompts ask for a function).
    answer_format: str = "function"
    # The fix prompt also shows how the buggy code fails the visible tests: one run of the shown code before the
    # first answer, its shaped feedback (expected vs actual) under the tests. A small
    # model that sees only the code often hands it back unchanged; the failing call says where to look. Costs one
    # sandbox run (counted on round 0) and the feedback's prompt tokens per task, no completion tokens.
    show_failure: bool = False
    # An answer known to fail before it runs (a repeat of a tested one, or the bug handed back) is drawn again from
    # the same prompt at CANDIDATE_TEMPERATURE, up to this many times, before it spends the round. candidates=1 only.
    redraws: int = 0
    # docs/hidden: a round's candidates that pass the visible tests are run on probe inputs and the largest group that
    # agrees is kept; the agent is satisfied only when at least this many agree, else it stops unsure
    # (agents/selfcheck.py). 0 = off (the first passing candidate is kept and believed). Needs candidates >= it.
    self_check: int = 0
    # With self_check: the model first writes this many assertions of its own from the docstring (once a task,
    # greedy; agents/prompts/self_tests.txt), the passing answers run them beside the probes, groups rank by size
    # times assertions passed (CodeT's dual agreement), and the agent is satisfied only when the kept answer also
    # passes more than agents/selfcheck.py's SELF_TESTS_PASS of those it could run. 0 = off.
    self_tests: int = 0
    # With self_check: the model first writes this many inputs of its own (calls of the function, no expected values;
    # once a task, greedy; agents/prompts/self_inputs.txt), and the passing answers are grouped on them too, after
    # the examples' own calls (CodeT's input side: the probes next to the examples often miss the inputs where the
    # bug shows). 0 = off.
    self_inputs: int = 0
    # Whose answers the self-check counts: one round's candidates (round: the round where one passes what the agent
    # sees ends the task, satisfied or unsure), or every answer of the task so far (task, single_shot only:
    # self_check answers in all, any candidates; an answer that passes with too few agreeing is held, not handed
    # in, and the agent keeps looking; a repeat of it is run again as a vote; the buggy code handed back never
    # votes). What a budget that ends before the agent is satisfied does: `held_at_end`.
    self_check_scope: str = "round"
    # self_check_scope=task, a budget that ends before enough answers agree: hold (hand nothing in: the task fails)
    # or hand_in (hand in the best held answer, the first of the last self-check's best group, labelled unsure, as
    # scope round does with an unsure round). Under hand_in the verdict is not monotone in the budget (an answer
    # handed in at budget 4 may give way to a wrong pair that agrees at budget 8), so a trajectory keeps a verdict
    # for every budget (Trajectory.passed_by_budget) and every reader of "passed by budget k" takes it from there.
    held_at_end: str = "hold"


@dataclass
class RevisesConf(StrategyConf):
    """Strategies that build each round on the earlier ones (reflection, react)."""

    # The bug handed back unchanged, or a repeat: a new conversation asks for the function from scratch (header,
    # visible tests, how the old code failed; no buggy body). On by default: a small model shown the buggy body keeps
    # copying it.
    rewrite_when_stuck: bool = True


@dataclass
class SingleShotConf(DraftsConf):
    """Every round an independent fresh attempt (fresh prompt, the round's own seed): the resampling baseline. With
    iters=k it answers: does feedback beat k+1 independent tries?"""

    name: str = "single_shot"
    temperature_schedule: str = "resample"


@dataclass
class ReflectionConf(DraftsConf, RevisesConf):
    """Draft, then each round revises the previous code from its test feedback."""

    name: str = "reflection"
    redraws: int = 2  # a revision known to fail before it runs is drawn again instead of spending the round
    history_rounds: int = 1  # earlier (answer, feedback) pairs kept in the prompt (at least the last one)


@dataclass
class ReactConf(RevisesConf):
    """Thought -> tool call (run_tests / submit) -> observation. A round is one sandbox run, so iters compares with
    the other strategies; max_turns caps model turns (thoughts, bad calls and repeats cost turns, not rounds)."""

    name: str = "react"
    # Model turns per task: one per round at iters=3, so thoughts, bad calls and repeats cannot run the decode
    # cost far past the other strategies' at the same budget.
    max_turns: int = 4
    tool_format: str = "auto"  # auto: the chat template's own tool calls when it has them (Qwen2.5) | native | text


@dataclass
class PortfolioConf(ReflectionConf):
    """Fresh drafts and revisions in turn: a draft (round 0 greedy, later drafts at RESAMPLE_TEMPERATURE, each its
    own seed), then `revisions` rounds revising it from its feedback (at strategies/portfolio.py's
    REVISE_TEMPERATURE), then a fresh draft again: reflection gains most from its first revision and single_shot
    from fresh samples, so the mix takes both."""

    name: str = "portfolio"
    temperature_schedule: str = "resample"  # the drafts' temperatures; revisions use REVISE_TEMPERATURE
    revisions: int = 1  # revisions of each draft before the next fresh draft (0: every round a fresh draft)


# The strategies by name, each named once (its record's `name` default); agents/strategies/<name>.py runs each.
STRATEGY_CONFS: dict[str, type[StrategyConf]] = {c.name: c for c in (SingleShotConf, ReflectionConf, ReactConf,
                                                                     PortfolioConf)}
STRATEGIES = tuple(STRATEGY_CONFS)


@dataclass
class AgentConfig:
    """Every knob of one agent run. The defaults of the run-level fields are the job's (conf/config.yaml takes them
    from here: flows/schema.py); timeout_s, audit_passes and strict come from the sandbox config."""

    strategy: StrategyConf  # which strategy, with its knobs
    iters: int = 3  # feedback rounds after round 0; 0 = single-shot pass@1
    protocol: str = "tests"  # tests | docs | hidden: what the agent sees (agents/README.md)
    temperature: float = 0.0  # round 0's temperature (constant schedule: every round's); 0 = greedy
    max_new_tokens: int = 512
    seed: int = 0  # seeds sampling; on a path that repeats (serving.deterministic) a rerun gives the same answers
    timeout_s: float = SandboxConf.timeout_s  # per program
    audit_passes: bool = SandboxConf.audit  # re-run a pass with its return values checked (sandboxes/audit.py)
    strict: bool = SandboxConf.strict  # a pass the audit flags counts as a failure
    sample: int = 0  # index of an independent trajectory for the same task (pass@k)
    # budget.usd_per_task and the model's list prices (US dollars per million tokens): the loop stops a task whose
    # calls have cost that much (stop reason cost_limit); None: no limit
    usd_per_task: float | None = None
    prices: tuple[float, float] | None = None  # (prompt, completion) per million tokens


def agent_key(cfg: AgentConfig) -> str:
    """Digest of everything that shapes a trajectory except the budget."""
    # the spend limit's fields count only where set: trajectories made before them keep their key
    d = {k: v for k, v in dataclasses.asdict(cfg).items()
         if k != "iters" and not (k in ("usd_per_task", "prices") and v is None)}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def round_seed(cfg: AgentConfig, task_id: str, rnd: int, turn: int = 0) -> int:
    """Seed per task, sample, round (and react turn): reproducible runs, independent rounds and samples."""
    return zlib.crc32(f"{cfg.seed}|{task_id}|{cfg.sample}|{rnd}|{turn}".encode()) % (2**31)


# Settings no full-size run ever varied: constants beside the code that reads them, each with its reason.
RESAMPLE_TEMPERATURE = 0.8  # a resampled round's temperature: greedy would only repeat round 0
TEMPERATURE_STEP = 0.2  # rising: each round this much hotter, so a stuck revision is drawn differently ...
TEMPERATURE_MAX = 1.0  # ... up to this (hotter answers of a small model stop being code)
FALLING_TEMPERATURES = (0.7, 0.5, 0.3)  # falling: explore first, then settle
# Drafts that should differ from the round's own answer: reflection's candidates 2..k, redraws (single_shot,
# reflection), the turn after a repeat (react)
CANDIDATE_TEMPERATURE = 0.8


def round_temperature(cfg: AgentConfig, rnd: int) -> float:
    s = cfg.strategy
    sched = s.temperature_schedule
    if sched == "auto":
        sched = "resample" if s.name in ("single_shot", "portfolio") else "constant"
    if sched == "constant":
        return cfg.temperature
    if sched == "resample":
        return cfg.temperature if rnd == 0 else RESAMPLE_TEMPERATURE
    if sched == "rising":
        return round(min(TEMPERATURE_MAX, cfg.temperature + TEMPERATURE_STEP * rnd), 6)
    if sched == "falling":
        return float(FALLING_TEMPERATURES[min(rnd, len(FALLING_TEMPERATURES) - 1)])
    raise ValueError(f"unknown temperature_schedule {sched!r}: use one of {', '.join(SCHEDULES)}")


def check_config(cfg: AgentConfig) -> None:
    s = cfg.strategy
    if type(s) is not STRATEGY_CONFS.get(s.name):
        raise ValueError(f"unknown strategy {s.name!r} ({type(s).__name__}): use one of {', '.join(STRATEGIES)}")
    if cfg.protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {cfg.protocol!r}: use one of {', '.join(PROTOCOLS)}")
    if isinstance(s, ReactConf) and s.tool_format not in TOOL_FORMATS:
        raise ValueError(f"unknown tool_format {s.tool_format!r}: use {', '.join(TOOL_FORMATS)}")
    if isinstance(s, ReactConf) and s.max_turns < 1:
        raise ValueError(f"max_turns must be >= 1 (a model turn is how react acts), got {s.max_turns}")
    round_temperature(cfg, 0)
    if isinstance(s, PortfolioConf) and s.revisions < 0:
        raise ValueError(f"revisions must be >= 0, got {s.revisions}")
    if isinstance(s, DraftsConf):
        if s.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {s.candidates}")
        if s.redraws < 0:
            raise ValueError(f"redraws must be >= 0, got {s.redraws}")
        if s.self_check_scope not in SELF_CHECK_SCOPES:
            raise ValueError(f"unknown self_check_scope {s.self_check_scope!r}: use one of {', '.join(SELF_CHECK_SCOPES)}")
        if s.self_check < 0 or (s.self_check_scope == "round" and s.self_check > s.candidates):
            raise ValueError(f"self_check={s.self_check} needs 0 <= self_check <= candidates ({s.candidates}): "
                             "agreement is counted among one round's candidates (or set strategy.self_check_scope=task "
                             "to count it among all the task's answers)")
        if s.self_check_scope != "round" and s.name != "single_shot":
            raise ValueError(f"self_check_scope={s.self_check_scope} is for single_shot (its rounds are independent "
                             f"tries; a {s.name} round after a held pass has no failure to revise from): set "
                             "strategy=single_shot or strategy.self_check_scope=round")
        if s.held_at_end not in HELD_AT_END:
            raise ValueError(f"unknown held_at_end {s.held_at_end!r}: use one of {', '.join(HELD_AT_END)}")
        if s.held_at_end != "hold" and s.self_check_scope != "task":
            raise ValueError(f"held_at_end={s.held_at_end} needs self_check_scope=task (only then is an answer held "
                             "past its round): set strategy.self_check_scope=task, or held_at_end=hold")
        if s.self_check_scope != "round" and not s.self_check:
            raise ValueError(f"self_check_scope={s.self_check_scope} needs self_check >= 1 (how many answers must "
                             "agree): set strategy.self_check=2, or self_check_scope=round")
        if s.self_tests < 0 or (s.self_tests and not s.self_check):
            raise ValueError(f"self_tests={s.self_tests} needs self_check >= 1 (the assertions rank and judge the "
                             "answers the self-check groups): set strategy.self_check=1 or more, or self_tests=0")
        if s.self_inputs < 0 or (s.self_inputs and not s.self_check):
            raise ValueError(f"self_inputs={s.self_inputs} needs self_check >= 1 (the inputs group the answers the "
                             "self-check counts): set strategy.self_check=2, or self_inputs=0")
        if s.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"unknown answer_format {s.answer_format!r}: use one of {', '.join(ANSWER_FORMATS)}")
        if s.answer_format != "function" and s.name != "single_shot":
            raise ValueError(f"answer_format={s.answer_format} is for single_shot (the {s.name} prompts ask for the "
                             "whole function): set strategy=single_shot or strategy.answer_format=function")
        if s.redraws and s.candidates > 1:
            raise ValueError("redraws is for one answer per round (candidates=1): set redraws=0 or candidates=1")
    if cfg.sample > 0 and round_temperature(cfg, 0) == 0:
        warnings.warn("samples > 1 with a greedy round 0 (temperature=0) gives identical samples: set temperature > 0",
                      stacklevel=3)
