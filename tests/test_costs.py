"""What a run costs (issue #71): a hosted model's list prices make a cost per task; budget.usd_per_task stops a
task's loop once its calls have cost that much, recorded as its stop reason; a local model has no price."""
from __future__ import annotations

import pytest

from agents.loop import run_agent, spent_usd
from agents.models.doubles import ScriptedModel
from flows.config import ConfigError

from agents_fixtures import agent, fenced, sandbox, task
from conftest import job_settings

PRICES = (2.5, 10.0)  # US dollars per million prompt and completion tokens


def test_a_spend_limit_stops_the_loop_before_the_round_that_would_pass_it():
    t = task(0)
    model = ScriptedModel([fenced(t.buggy_code)] * 8)  # never fixed: only the budget or the limit ends it
    free = run_agent(t, model, sandbox(), agent(strategy="reflection", iters=5))
    per_round = [spent_usd([a], PRICES) for a in free.attempts]
    limit = sum(per_round[:2]) + per_round[2] / 2  # reached during round 2: round 3 is never asked for
    model = ScriptedModel([fenced(t.buggy_code)] * 8)
    capped = run_agent(t, model, sandbox(), agent(strategy="reflection", iters=5, usd_per_task=limit, prices=PRICES))
    assert capped.stop_reason == "cost_limit" and len(capped.attempts) == 3 and len(model.requests) == 3
    assert spent_usd(capped.attempts, PRICES) >= limit > spent_usd(capped.attempts[:2], PRICES)
    assert free.stop_reason == "budget" and len(free.attempts) == 6


def test_a_limit_the_task_never_reaches_changes_nothing_and_keeps_the_cache_key():
    t = task(0)
    outputs = [fenced(t.buggy_code), fenced(t.fixed_code)]
    plain = run_agent(t, ScriptedModel(outputs), sandbox(), agent(strategy="reflection", iters=3))
    rich = run_agent(t, ScriptedModel(outputs), sandbox(), agent(strategy="reflection", iters=3, usd_per_task=100.0,
                                                                  prices=PRICES))
    assert plain.passed and rich.passed and plain.stop_reason == rich.stop_reason == "solved"
    # no limit: the key it had before the limit existed (the digest of the config without the two new fields), so
    # cached trajectories and resumed runs from then still match; a limit makes another key
    import dataclasses
    import hashlib
    import json

    before = {k: v for k, v in dataclasses.asdict(agent(strategy="reflection", iters=3)).items()
              if k not in ("iters", "usd_per_task", "prices")}
    assert plain.agent_key == hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert rich.agent_key != plain.agent_key


def test_prices_come_from_the_model_and_a_local_model_cannot_be_held_to_a_limit():
    s = job_settings("model=openai-gpt-4o", "budget.usd_per_task=0.05")
    assert s.agent.prices == PRICES and s.agent.usd_per_task == 0.05
    assert job_settings("model=openai-gpt-4o").agent.prices is None  # no limit: the loop never counts
    with pytest.raises(ConfigError, match="model=qwen1.5b-coder-q4 has none .a transformers model has no price"):
        job_settings("budget.usd_per_task=0.05")
    with pytest.raises(ConfigError, match="budget.usd_per_task"):
        job_settings("model=openai-gpt-4o", "budget.usd_per_task=-1")


def test_a_priced_jobs_summary_and_results_record_carry_its_cost_and_a_local_ones_say_none(tmp_path):
    from agents.loop import cost_usd
    from flows.analysis.run_record import run_record
    from flows.config import model_prices

    p = model_prices(job_settings("model=openai-gpt-4o").model)
    assert cost_usd(1_000_000, 200_000, p) == pytest.approx(4.5)  # 2.50 $ the million sent, 10 $ the million back
    t = task(0)
    traj = run_agent(t, ScriptedModel([fenced(t.buggy_code)] * 3), sandbox(), agent(strategy="reflection", iters=2))
    assert spent_usd(traj.attempts, p) == pytest.approx(cost_usd(traj.prompt_tokens, traj.completion_tokens, p))
    rows = [{"task_id": "Python/0", "sample": 0, "passed_by_budget": [True], "attempts": []}]
    rec = run_record("r", "FINISHED", {"iters": "0"}, rows, {"prompt_tokens": 1, "cost_usd": 4.5}, machine="m",
                     machine_source="job")
    assert rec["cost"]["cost_usd"] == 4.5 and rec["per_task_mean"]["cost_usd"] == 4.5
    local = run_record("r", "FINISHED", {"iters": "0"}, rows, {"prompt_tokens": 1, "cost_usd": None}, machine="m",
                       machine_source="job")
    assert local["cost"]["cost_usd"] is None and "cost_usd" not in local["per_task_mean"]
    assert model_prices(job_settings().model) is None
