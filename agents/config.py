"""AgentConfig: every knob of one agent run in a typed record, and what follows from it per round (seed and
temperature). The strategies live in agents/strategies/ (one module each), the loop that runs them in loop.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
import zlib
from dataclasses import dataclass, field

from .feedback import STYLES as FEEDBACK_STYLES

STRATEGIES = ("single_shot", "reflection", "react")  # agents/strategies/<name>.py each
PROTOCOLS = ("tests", "docs", "hidden")
SCHEDULES = ("auto", "constant", "resample", "rising", "falling")


@dataclass
class AgentConfig:
    strategy: str = "reflection"
    iters: int = 0  # feedback rounds after round 0
    protocol: str = "tests"
    # Temperature per round (seeded per task, sample and round). auto: resample for single_shot, else constant.
    temperature: float = 0.0  # round 0 (constant: every round); 0 = greedy
    temperature_schedule: str = "auto"
    resample_temperature: float = 0.8  # resample: rounds >= 1 (greedy would only repeat round 0)
    temperature_step: float = 0.2  # rising: added per round ...
    temperature_max: float = 1.0  # ... up to this
    temperatures: tuple = (0.7, 0.5, 0.3)  # falling: round r uses temperatures[min(r, last)]
    max_new_tokens: int = 512
    seed: int = 0
    sample: int = 0  # index of an independent trajectory for the same task (pass@k)
    timeout_s: float = 10.0
    audit_passes: bool = True  # re-run a pass with its return values checked (sandboxes/audit.py); flags only
    strict: bool = False  # a pass the audit flags counts as a failure
    # techniques
    keep_task_context: bool = True  # add back the task's imports/helpers the answer leaves out
    check_signature: bool = True  # a renamed/reshaped entry point takes the syntax path
    syntax_path: bool = True  # invalid code gets a short prompt instead of a test run (off: it is run)
    detect_repeats: bool = True  # a candidate equal to an earlier one is not run again
    flag_unchanged: bool = True  # say so when the answer is the buggy code unchanged (it is still run)
    feedback_style: str = "shaped"  # shaped | raw (traceback tail) | verdict (pass/fail only)
    feedback_chars: int = 1200  # budget for one feedback text (about 4 characters per token)
    compute_actual: bool = True  # re-run the failing call to show the value it actually returned
    edge_case_hint: bool = False  # say when the failing input is an edge case (empty, zero, negative...)
    show_diff: bool = False  # show the candidate's diff against the buggy code in the feedback
    few_shot: int = 0  # worked bug-fix examples (agents/prompts/few_shot/) before the task; not for react
    stop_after_code: bool = True  # end generation at the answer's closing ``` (the prose after it is thrown away)
    # Answers drafted per round, decoded together (one batch); the first whose visible tests pass is kept, else
    # the first one that ran. Each run counts in sandbox_runs and every call in the tokens. Not for react.
    candidates: int = 1
    candidate_temperature: float = 0.8  # for candidates 2..k (the first follows the round's temperature)
    # An answer already known to fail (a repeat of a tested one, or the buggy code handed back) is drawn again
    # from the same prompt at candidate_temperature, up to this many times, before it spends the round. Not react.
    redraws: int = 0
    # reflection
    history_rounds: int = 1  # earlier (answer, feedback) pairs kept in the prompt (at least the last one)
    diagnose: bool = False  # ask for a one- or two-sentence diagnosis of the failing input before the code
    rewrite_when_stuck: bool = False  # after the unchanged bug or a repeat: a fresh prompt to write it from scratch
    # react
    max_turns: int = 12  # model turns per task (thoughts, invalid calls and repeats cost turns, not rounds)
    tool_format: str = "auto"  # auto (native when the chat template has tools) | native | text
    # A run_tests of code already known to fail is dropped from the conversation and the next turn is drawn at
    # candidate_temperature. Kept in, a small model copies its own answer turn after turn (Python/0-23: 3 of the
    # first 12 tasks repeated one answer 11 times at temperature 0.2, each copy making the next more likely).
    repeat_redraw: bool = True
    extra: dict = field(default_factory=dict)


def agent_key(cfg: AgentConfig) -> str:
    """Digest of everything that shapes a trajectory except the budget."""
    d = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "iters"}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def round_seed(cfg: AgentConfig, task_id: str, rnd: int, turn: int = 0) -> int:
    """Seed per task, sample, round (and react turn): reproducible runs, independent rounds and samples."""
    return zlib.crc32(f"{cfg.seed}|{task_id}|{cfg.sample}|{rnd}|{turn}".encode()) % (2**31)


def round_temperature(cfg: AgentConfig, rnd: int) -> float:
    sched = cfg.temperature_schedule
    if sched == "auto":
        sched = "resample" if cfg.strategy == "single_shot" else "constant"
    if sched == "constant":
        return cfg.temperature
    if sched == "resample":
        return cfg.temperature if rnd == 0 else cfg.resample_temperature
    if sched == "rising":
        return round(min(cfg.temperature_max, cfg.temperature + cfg.temperature_step * rnd), 6)
    if sched == "falling":
        temps = list(cfg.temperatures)
        return float(temps[min(rnd, len(temps) - 1)])
    raise ValueError(f"unknown temperature_schedule {sched!r}: use one of {', '.join(SCHEDULES)}")




def check_config(cfg: AgentConfig) -> None:
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}: use one of {', '.join(STRATEGIES)}")
    if cfg.feedback_style not in FEEDBACK_STYLES:
        raise ValueError(f"unknown feedback_style {cfg.feedback_style!r}: use one of {', '.join(FEEDBACK_STYLES)}")
    if cfg.tool_format not in ("auto", "native", "text"):
        raise ValueError(f"unknown tool_format {cfg.tool_format!r}: use auto, native or text")
    round_temperature(cfg, 0)
    if cfg.candidates < 1:
        raise ValueError(f"candidates must be >= 1, got {cfg.candidates}")
    if cfg.redraws < 0:
        raise ValueError(f"redraws must be >= 0, got {cfg.redraws}")
    if cfg.redraws and (cfg.candidates > 1 or cfg.strategy == "react"):
        raise ValueError("redraws is for one answer per round (candidates=1) and not for react: "
                         "set redraws=0 or candidates=1")
    if cfg.candidates > 1 and cfg.strategy == "react":
        raise ValueError("candidates > 1 is for single_shot and reflection: react makes one call per turn")
    if cfg.sample > 0 and round_temperature(cfg, 0) == 0:
        warnings.warn("samples > 1 with a greedy round 0 (temperature=0) gives identical samples: set temperature > 0",
                      stacklevel=3)
