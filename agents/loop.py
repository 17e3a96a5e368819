"""The agent loop: draft a fix, run it, feed the verdict back, for up to `iters` more rounds.

Strategies (AgentConfig.strategy, a record of agents/config.py):
  single_shot - every round is an independent fresh attempt (the resampling baseline);
  reflection  - every round revises the previous code from the test feedback;
  react       - thought -> tool call (run_tests / submit) -> observation;
  portfolio   - a fresh draft, then revisions of it from the feedback, then a fresh draft again.
Each is a module of agents/strategies/; its knobs are its record's (agents/config.py).
Protocols (AgentConfig.protocol): what the agent sees and what its feedback runs on, see `visibility`.
A round is at most one test run (react: exactly one), so budgets compare across strategies; `candidates` > 1
drafts k answers per round and runs each (reported: sandbox_runs, tokens, and the run name).

Invariant the sweep cache relies on: round r never depends on the budget `iters` (no prompt mentions it,
seeds depend on task/sample/round only, feedback is computed on every round). So `truncate` cuts a longer
trajectory to a budget, and `run_agent(prior=...)` continues a shorter one, both equal to a fresh run.
Each round is produced from the loop state (`produce`) and then folded into it (`absorb`); continuing a
prior folds in its recorded attempts instead of producing them again.
"""
from __future__ import annotations

import copy
import time

from sandboxes.base import Sandbox

from .config import AgentConfig, agent_key, check_config
from .context import Context
from .models.base import Model
from .strategies import REGISTRY
from .types import Attempt, Task, Trajectory


def run_agent(task: Task, model: Model, sandbox: Sandbox, cfg: AgentConfig,
              prior: Trajectory | None = None) -> Trajectory:
    """Run (or, given a shorter `prior` made with the same config, continue) one task's trajectory."""
    check_config(cfg)
    key = agent_key(cfg)
    if prior is not None and prior.error is None:
        if prior.agent_key and prior.agent_key != key:
            raise ValueError(f"prior trajectory of {prior.task_id} was made with another agent config")
        if prior.task_id != task.task_id or prior.sample != cfg.sample or prior.strategy != cfg.strategy.name:
            raise ValueError(f"prior trajectory ({prior.task_id}, sample {prior.sample}, {prior.strategy}) does not "
                             f"match ({task.task_id}, sample {cfg.sample}, {cfg.strategy.name})")
        if prior.budget >= cfg.iters:
            return truncate(prior, cfg.iters)
        replay = copy.deepcopy(prior.attempts)
        spent = prior.seconds
    else:
        replay, spent = [], 0.0
    ctx = Context(task, model, sandbox, cfg)
    strategy = REGISTRY[cfg.strategy.name](ctx)
    traj = Trajectory(task_id=task.task_id, bug_type=task.bug_type, strategy=cfg.strategy.name, budget=cfg.iters,
                      sample=cfg.sample, agent_key=key, held_at_end=getattr(cfg.strategy, "held_at_end", "hold"))
    state = strategy.initial_state()
    start = time.perf_counter()
    over_budget = False
    try:
        for rnd in range(cfg.iters + 1):
            if state.done:
                break
            if cfg.usd_per_task is not None and spent_usd(traj.attempts, cfg.prices) >= cfg.usd_per_task:
                over_budget = True  # checked before a round, never inside one: a round's answer is whole
                break
            if rnd < len(replay):
                attempt = replay[rnd]
                ctx.ensure_feedback(attempt)  # a prior made before feedback was kept on its last round
            else:
                t0 = time.perf_counter()
                attempt = strategy.produce(state, rnd)
                attempt.side_runs, ctx.side_runs = attempt.side_runs + ctx.side_runs, 0
                attempt.seconds = round(time.perf_counter() - t0, 3)
            traj.attempts.append(attempt)
            if attempt.passed and traj.passed_round is None:
                traj.passed_round = rnd
            strategy.absorb(state, attempt)
        traj.stop_reason = "cost_limit" if over_budget else stop_reason(traj.attempts, cfg.iters, state.done)
        hand_in_held(traj)
    except Exception as e:  # a crash in the harness ends this task, never the run
        traj.error = f"{type(e).__name__}: {e}"
    finally:
        traj.seconds = round(spent + time.perf_counter() - start, 3)
    return traj


def truncate(traj: Trajectory, iters: int) -> Trajectory:
    """The trajectory a fresh run with budget `iters` would have made (rounds 0..iters of a longer one)."""
    if iters > traj.budget:
        raise ValueError(f"cannot truncate a budget-{traj.budget} trajectory to {iters}: continue it with run_agent(prior=...)")
    out = copy.deepcopy(traj)
    out.attempts = [a for a in out.attempts if a.round <= iters]
    out.budget = iters
    if out.held_at_end != "hold":  # its passed_round may be a held answer's, handed in at the longer budget
        out.passed_round = next((a.round for a in out.attempts if a.passed), None)
    elif out.passed_round is not None and out.passed_round > iters:
        out.passed_round = None
    out.stop_reason = stop_reason(out.attempts, iters, traj.stop_reason)
    out.handed_in = None
    hand_in_held(out)
    out.seconds = round(sum(a.seconds for a in out.attempts), 3)
    return out


def hand_in_held(traj: Trajectory) -> None:
    """held_at_end=hand_in: a budget that ends with nothing handed in hands in the best held answer, unsure. The
    attempts stay as they were (a longer budget goes on from them); the trajectory says what was handed in."""
    held = traj.held_answer(traj.budget) if traj.held_at_end == "hand_in" and traj.passed_round is None else None
    if held is not None:
        traj.handed_in, traj.stop_reason = [held[0], held[1]], "unsure"
        traj.passed_round = held[0] if held[2] else None


def cost_usd(prompt_tokens: int, completion_tokens: int, prices: tuple[float, float]) -> float:
    """US dollars for these tokens at (prompt, completion) dollars per million: a task's spend, a run's cost."""
    return (prompt_tokens * prices[0] + completion_tokens * prices[1]) / 1e6


def spent_usd(attempts: list[Attempt], prices: tuple[float, float] | None) -> float:
    """What the calls so far cost (budget.usd_per_task); nothing without prices."""
    if prices is None:
        return 0.0
    calls = [c for a in attempts for c in a.calls]
    return cost_usd(sum(c.prompt_tokens for c in calls), sum(c.completion_tokens for c in calls), prices)


def stop_reason(attempts: list[Attempt], iters: int, fallback: str | None) -> str:
    """Why an episode ended, from its attempts alone (so a truncated and a fresh run agree)."""
    last = attempts[-1] if attempts else None
    if last is not None:
        visible = last.visible
        if last.decision == "submitted":
            return "submitted"
        if last.decision == "tested" and visible is not None and visible.passed:
            return "unsure" if last.unsure else "solved"
        if last.decision == "out_of_turns":
            return "out_of_turns"
        if last.round >= iters:
            return "budget"
    return fallback or "budget"
