"""single_shot's answer stream: a grid over candidates x budgets at the cost of its largest point.

single_shot's rounds are independent fresh tries of one prompt, so a task's answers form one stream: answer p
(p = round * candidates + i) has round p's seed and temperature (greedy at p = 0, resample_temperature after;
agents/context.py `answers`). (candidates=k, iters=r) is then the first k(r+1) answers of the stream, judged k at
a time. One run at (K, R) holds every point with k dividing K and k(r+1) <= K(R+1): its rounds draft every answer
a k-point asks for, the unread rest of a passing round included. A point is cut from it by replaying the recorded
answers through the same strategy code (`RecordedAnswers` stands in for the model; the sandbox runs for real,
milliseconds a program), so it equals the point run alone (tests/test_stream.py), as `truncate` does for budgets.

A sweep plans its stream from its overrides (`stream_plan`): `strategy.candidates=1,2,4,8 answers=8 -m` gives
K = 8 (the lcm of the candidates) and N = 8 answers, so its first job runs (8, iters=0) once and every job cuts
its point from that. What cannot be cut: a point whose k does not divide K or that needs more than N answers,
`redraws` > 0 (its redraws are not stream answers) and `self_tests` or `self_inputs` > 0 (one more model call);
those run alone.

Time: a cut point's task seconds are the stream task's seconds apportioned by completion tokens (an estimate:
the trajectory says `derived_from`); tokens, calls and sandbox runs are exact.
"""
from __future__ import annotations

import dataclasses
import json
import math
import threading

from agents import loop as agent_loop
from agents.config import AgentConfig, SingleShotConf
from agents.models.base import Generation, GenRequest, RequestError
from agents.types import Task, Trajectory

class StreamMiss(RuntimeError):
    """A cut asked for an answer the stream does not hold (a bug, or a stream made with another config)."""


def applies(agent: AgentConfig, plan: tuple[int, int] | None) -> bool:
    """Whether this job's point can be cut from a stream of plan = (K answers a round, N answers)."""
    if plan is None or not isinstance(agent.strategy, SingleShotConf) or agent.strategy.redraws \
            or agent.strategy.self_tests or agent.strategy.self_inputs:  # one more model call, not a stream answer
        return False
    K, N = plan
    k = agent.strategy.candidates
    return K % k == 0 and k * (agent.iters + 1) <= N


def stream_config(agent: AgentConfig, plan: tuple[int, int]) -> AgentConfig:
    K, N = plan
    return dataclasses.replace(agent, strategy=dataclasses.replace(agent.strategy, candidates=K), iters=N // K - 1)


def repair_from_stream(task: Task, cfg: AgentConfig, model, sandbox, cache, plan: tuple[int, int]) -> Trajectory:
    """This point's trajectory, cut from the task's stream (run first when the cache does not hold it yet)."""
    scfg = stream_config(cfg, plan)
    K = scfg.strategy.candidates
    stream = cache.get(task, cfg.sample, candidates=K)
    if stream is None or stream.budget < scfg.iters:
        stream = agent_loop.run_agent(task, model, sandbox, scfg, prior=stream)
        if stream.error is not None:  # the caller turns it into this point's error trajectory
            raise RuntimeError(f"the stream of {task.task_id} failed: {stream.error}")
        cache.put(stream, task, candidates=K)
    if cfg.strategy.candidates == K:
        return agent_loop.truncate(stream, cfg.iters)
    return cut(stream, K, task, cfg, sandbox)


def cut(stream: Trajectory, K: int, task: Task, cfg: AgentConfig, sandbox) -> Trajectory:
    """(cfg.strategy.candidates, cfg.iters) replayed from the recorded answers of a stream drafted K a round."""
    answers = RecordedAnswers(stream)
    traj = agent_loop.run_agent(task, answers, sandbox, cfg)
    if answers.missed:
        raise StreamMiss(f"{task.task_id}: the stream holds no answer for {answers.missed[0]}")
    if traj.error is not None:
        return traj
    share = traj.completion_tokens / stream.completion_tokens if stream.completion_tokens else 0.0
    traj.seconds = round(stream.seconds * share, 3)
    traj.derived_from = f"stream: {K} answers a round, {stream.budget + 1} rounds"
    return traj


class RecordedAnswers:
    """The Model protocol over a stream trajectory's model calls, found by (messages, seed, temperature)."""

    name = "recorded-answers"

    def __init__(self, stream: Trajectory):
        self._calls = {}
        for a in stream.attempts:
            for c in a.calls:
                if c.error is None:
                    self._calls[_key(c.messages, c.seed, c.temperature)] = c
        self.missed: list[str] = []
        self._lock = threading.Lock()

    def generate(self, request: GenRequest) -> Generation:
        c = self._calls.get(_key(request.messages, request.seed, request.temperature))
        if c is None:
            with self._lock:
                self.missed.append(f"seed {request.seed} at temperature {request.temperature}")
            raise RequestError("answer not in the stream")
        return Generation(text=c.output, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
                          seconds=c.seconds, finish_reason=c.finish_reason, tool_calls=list(c.tool_calls),
                          prefill_tokens=c.prefill_tokens, draft_tokens=c.draft_tokens,
                          draft_accepted=c.draft_accepted)

    def close(self) -> None:
        pass


def _key(messages, seed, temperature) -> str:
    return json.dumps([list(messages), seed, float(temperature)], sort_keys=True, default=str)


# ---------------------------------------------------------------- planning a sweep's stream
def stream_plan(points: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(K, N) for a sweep's (candidates, iters) points: K the lcm of the candidates, N the most answers a point
    asks for, rounded up to whole rounds of K. None for fewer than two points."""
    points = sorted(set(points))
    if len(points) < 2:
        return None
    K = math.lcm(*(k for k, _ in points))
    N = max(k * (r + 1) for k, r in points)
    return K, -(-N // K) * K


def iters_for_answers(answers: int, candidates: int) -> int:
    """`answers=N`: the budget that spends N answers a task, `candidates` a round."""
    if answers < 1 or answers % candidates:
        raise ValueError(f"answers={answers} is not a whole number of rounds of {candidates} candidates: "
                         f"use a multiple of strategy.candidates")
    return answers // candidates - 1


def parse_plan(value: list[int] | None) -> tuple[int, int] | None:
    """The job config's `sweep_stream` ([K, N], set by the sweep callback) as a plan; None when absent or not one."""
    if not value or len(value) != 2:
        return None
    K, N = (int(x) for x in value)
    return (K, N) if K >= 1 and N >= K and N % K == 0 else None
