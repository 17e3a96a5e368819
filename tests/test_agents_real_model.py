"""Every strategy with a real model (the smollm2-135m registry pack) on 2 tasks, through run_agent.

The 135M model rarely fixes anything; this checks that real chat templates, real outputs (prose, half code,
no action lines) and the batching backend go through every strategy without a harness error."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agents.loop import run_agent
from agents_fixtures import agent, sandbox, task
from conftest import job_settings, needs_data

DECISIONS = {"tested", "syntax_error", "no_code", "repeat", "submitted", "out_of_turns"}


@pytest.fixture(scope="module")
def smollm2():
    from agents.models import ModelUnavailable
    from serving import build as build_model

    try:
        model = build_model(job_settings("model=smollm2-135m").model)
    except ModelUnavailable as e:
        pytest.skip(f"smollm2-135m pack unavailable here: {e}")
    yield model
    model.close()


@needs_data
@pytest.mark.slow
def test_every_strategy_with_smollm2_on_two_tasks(smollm2):
    jobs = [(s, n) for s in ("single_shot", "reflection", "react") for n in (0, 2)]
    cfg = dict(iters=1, max_new_tokens=96, protocol="tests")
    turns = {"react": {"max_turns": 3}}  # react's own knob
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:  # concurrent tasks: the backend batches their requests
        trajs = list(pool.map(lambda j: run_agent(task(j[1]), smollm2, sandbox(),
                                                  agent(strategy=j[0], **cfg, **turns.get(j[0], {}))), jobs))
    print(f"6 trajectories in {time.perf_counter() - t0:.1f} s")
    for (strategy, n), traj in zip(jobs, trajs):
        assert traj.error is None, (strategy, n, traj.error)
        assert traj.strategy == strategy and 1 <= len(traj.attempts) <= 2
        for a in traj.attempts:
            assert a.decision in DECISIONS, a.decision
            assert a.calls and all(c.error is None and c.completion_tokens > 0 for c in a.calls)
            if strategy == "react":
                assert len(a.steps) == len(a.calls)
        assert traj.passed_round in (None, 0, 1)
    react = [t for (s, _), t in zip(jobs, trajs) if s == "react"]
    assert all(sum(len(a.calls) for a in t.attempts) <= 3 for t in react)  # the turn cap holds
