"""single_shot and reflection driven by a ScriptedModel through every branch, the protocols, the
temperature/seed schedule, and the budget invariant (truncate / continue == a fresh run)."""
from __future__ import annotations

import dataclasses
import warnings

import pytest

from agents import context
from agents.config import PROTOCOLS, STRATEGIES, round_seed, round_temperature
from agents.loop import run_agent, truncate
from agents.models.doubles import ScriptedModel
from agents_fixtures import agent, fenced, sandbox, task
from conftest import needs_data

pytestmark = needs_data

SIG = "def truncate_number(number: float) -> float:\n"
FIX = SIG + "    return number % 1.0\n"
WRONG_A = SIG + "    return number % 1.0 - 1.0\n"
WRONG_B = SIG + "    return number - int(number) + 0.5\n"
WRONG_C = SIG + "    return 0.5\n"  # passes the example test only
BUGGY = SIG + "    return number % 1.0 + 1.0\n"


def run(outputs, **kw):
    model = ScriptedModel(list(outputs))
    traj = run_agent(task(2), model, sandbox(), agent(**kw))
    assert traj.error is None, traj.error
    return traj, model


def last_user(req) -> str:
    return req.messages[-1]["content"]


def test_answers_end_at_the_closing_fence_which_is_put_back():
    # what a backend returns when the stop string cut the answer: the code without its closing fence
    traj, model = run(["```python\n" + FIX.rstrip("\n")], strategy="single_shot", iters=0)
    assert model.requests[0].stop == ("\n```\n",)
    assert traj.attempts[0].calls[0].output.endswith(FIX.rstrip("\n") + "\n```") and traj.passed


def test_public_names():
    assert STRATEGIES == ("single_shot", "reflection", "react", "portfolio") and PROTOCOLS == ("tests", "docs", "hidden")


def test_reflection_every_branch_then_a_fix():
    outputs = ["I would look at the modulo.",  # prose, no code
               fenced(SIG + "    return number %% 1.0 +\n"),  # syntax error
               fenced("def truncate(number):\n    return number % 1.0\n"),  # wrong name
               fenced(BUGGY),  # the bug handed back unchanged: run, and told so
               fenced("def truncate_number(number: float) -> float:\n    # same code\n    return number % 1.0 + 1.0\n"),
               fenced(FIX)]
    traj, model = run(outputs, strategy="reflection", iters=5)
    assert [a.decision for a in traj.attempts] == ["no_code", "syntax_error", "syntax_error", "tested", "repeat", "tested"]
    assert [a.result is not None for a in traj.attempts] == [False, False, False, True, False, True]
    assert traj.passed_round == 5 and traj.stop_reason == "solved"
    reqs = model.requests
    assert "no Python code" in last_user(reqs[1])
    assert "SyntaxError" in last_user(reqs[2])
    assert "no function named `truncate_number`" in last_user(reqs[3])
    assert "original buggy code, unchanged" in last_user(reqs[4])
    assert "`truncate_number(3.5)` returned 1.5, but the expected value is 0.5." in last_user(reqs[4])
    assert "same code as your attempt in round 3" not in last_user(reqs[5])  # it is the unchanged bug ...
    assert "original buggy code, unchanged" in last_user(reqs[5])  # ... and the model is told so
    # history_rounds=1: the prompt holds the opening turns plus only the last (answer, feedback) pair
    assert len(reqs[5].messages) == 2 + 2


def test_repeat_of_an_earlier_candidate_is_not_run_and_is_named():
    traj, model = run([fenced(WRONG_A), fenced("# again\n" + WRONG_A), fenced(FIX)], strategy="reflection", iters=2)
    assert [a.decision for a in traj.attempts] == ["tested", "repeat", "tested"]
    assert traj.attempts[1].same_as_round == 0
    assert "same code as your attempt in round 0" in last_user(model.requests[2])
    assert traj.passed_round == 2


def test_fix_on_round_two_stops_there():
    traj, model = run([fenced(WRONG_A), fenced(WRONG_B), fenced(FIX), fenced(WRONG_A)], strategy="reflection", iters=3)
    assert traj.passed_round == 2 and len(model.requests) == 3 and traj.stop_reason == "solved"
    assert [traj.passed_by_round(r) for r in range(4)] == [False, False, True, True]
    assert "Your fix did not work" in last_user(model.requests[1])


def test_single_shot_rounds_are_independent():
    traj, model = run([fenced(WRONG_A), fenced(WRONG_A), fenced(WRONG_B), fenced(FIX)], strategy="single_shot", iters=3)
    assert [a.decision for a in traj.attempts] == ["tested", "repeat", "tested", "tested"]
    first = model.requests[0].messages
    assert all(r.messages == first for r in model.requests)  # fresh prompt, no feedback
    assert [r.temperature for r in model.requests] == [0.0, 0.8, 0.8, 0.8]
    assert len({r.seed for r in model.requests}) == 4
    assert traj.passed_round == 3


def test_portfolio_takes_turns_between_fresh_drafts_and_revisions():
    traj, model = run([fenced(WRONG_A), fenced(WRONG_B), fenced(WRONG_C), fenced(FIX)], strategy="portfolio", iters=3)
    assert traj.passed_round == 3 and [a.decision for a in traj.attempts] == ["tested"] * 4
    opening = model.requests[0].messages
    r1, r2, r3 = model.requests[1:]
    assert r1.messages[:len(opening)] == opening and "Your fix did not work" in last_user(r1)
    assert WRONG_A.strip() in last_user(r1)  # round 1 revises round 0's draft ...
    assert r2.messages == opening  # ... round 2 is a fresh draft ...
    assert WRONG_C.strip() in last_user(r3) and WRONG_B.strip() not in str(r3.messages)  # ... and round 3 revises it
    assert [r.temperature for r in model.requests] == [0.0, 0.2, 0.8, 0.2]
    assert len({r.seed for r in model.requests}) == 4
    # two revisions of each draft: fresh again on round 3; none: every round a fresh draft
    _, model = run([fenced(WRONG_A), fenced(WRONG_B), fenced(WRONG_C), fenced(FIX)], strategy="portfolio", iters=3,
                   revisions=2)
    assert [r.messages == opening for r in model.requests] == [True, False, False, True]
    _, model = run([fenced(WRONG_A), fenced(WRONG_B), fenced(FIX)], strategy="portfolio", iters=2, revisions=0)
    assert all(r.messages == opening for r in model.requests)
    assert [r.temperature for r in model.requests] == [0.0, 0.8, 0.8]


def test_model_error_costs_the_round_only():
    traj, _ = run([fenced(WRONG_A)], strategy="reflection", iters=1)  # the script runs out on round 1
    assert [a.decision for a in traj.attempts] == ["tested", "model_error"]
    assert "ran out" in traj.attempts[1].calls[0].error and traj.error is None


def test_a_model_that_cannot_be_reached_ends_the_task_in_an_error_not_a_wrong_answer():
    """A server that died gave no answer: the task is an error (resume runs it again), not a failed round."""
    from agents.models.base import ModelUnreachable

    class DiesAfterOne(ScriptedModel):
        def generate(self, request):
            if self.requests:
                raise ModelUnreachable("http://127.0.0.1:8000/v1/chat/completions failed after 2 attempts")
            return super().generate(request)

    traj = run_agent(task(2), DiesAfterOne([fenced(WRONG_A)]), sandbox(), agent(strategy="reflection", iters=1))
    assert traj.error is not None and "ModelUnreachable" in traj.error and len(traj.attempts) == 1


def test_syntax_path_off_runs_the_code_and_shows_the_error(monkeypatch):
    monkeypatch.setattr(context, "SYNTAX_PATH", False)
    traj, model = run([fenced(SIG + "    return number %% 1.0 +\n"), fenced(FIX)], strategy="reflection", iters=1)
    assert traj.attempts[0].decision == "tested" and traj.attempts[0].result.status == "failed"
    assert "SyntaxError" in last_user(model.requests[1])


def test_temperature_schedules_and_seeds():
    rising = agent(temperature_schedule="rising", temperature=0.5)
    assert [round_temperature(rising, r) for r in range(5)] == [0.5, 0.7, 0.9, 1.0, 1.0]
    falling = agent(temperature_schedule="falling")
    assert [round_temperature(falling, r) for r in range(5)] == [0.7, 0.5, 0.3, 0.3, 0.3]
    assert [round_temperature(agent(temperature=0.4), r) for r in range(3)] == [0.4, 0.4, 0.4]
    assert round_temperature(agent(strategy="single_shot"), 1) == 0.8
    cfg = agent()
    assert round_seed(cfg, "Python/2", 1) == round_seed(agent(), "Python/2", 1)  # reproducible
    seeds = {round_seed(dataclasses.replace(cfg, sample=s), t, r) for s in range(3) for t in ("a", "b") for r in range(4)}
    assert len(seeds) == 24  # every (sample, task, round) has its own seed
    _, model = run([fenced(WRONG_A), fenced(WRONG_B), fenced(FIX)], strategy="reflection", iters=2,
                   temperature_schedule="falling")
    assert [r.temperature for r in model.requests] == [0.7, 0.5, 0.3]


def test_samples_with_greedy_round_zero_warn():
    with pytest.warns(UserWarning, match="temperature > 0"):
        run([fenced(FIX)], strategy="reflection", sample=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run([fenced(FIX)], strategy="reflection", sample=1, temperature=0.7)


def test_protocols_show_and_score_what_they_should():
    t = task(2)
    _, m = run([fenced(FIX)], protocol="tests")
    assert "abs(truncate_number(1.33) - 0.33)" in last_user(m.requests[0])
    _, m = run([fenced(FIX)], protocol="docs")
    prompt = last_user(m.requests[0])
    assert "def check" not in prompt and t.docstring.strip().splitlines()[0].strip() in prompt
    # hidden: example shown and used for feedback; the full test decides. `return 0.5` overfits the example.
    traj, m = run([fenced(WRONG_C), fenced(FIX)], protocol="hidden", iters=1)
    prompt = last_user(m.requests[0])
    assert "truncate_number(3.5) == 0.5" in prompt and "1.33" not in prompt
    a = traj.attempts[0]
    assert a.visible_result.passed and not a.result.passed  # both verdicts recorded: the overfitting gap
    assert a.visible_result.status == "passed" and a.result.status == "failed"
    assert traj.stop_reason == "solved" and traj.passed_round is None and len(traj.attempts) == 1


# ---------------------------------------------------------------- the budget invariant
def view(traj):
    """Everything a round is made of, minus timings."""
    return [(a.round, a.decision, a.code, a.feedback, a.result.status if a.result else None,
             [(c.messages, c.output, c.seed, c.temperature) for c in a.calls],
             a.steps, a.unchanged, a.same_as_round, a.problem, a.candidate)
            for a in traj.attempts]


def requests(model):
    return [(list(r.messages), r.seed, r.temperature, r.tools) for r in model.requests]


SCRIPT = [fenced(WRONG_A), fenced(WRONG_B), fenced(SIG + "    return number % 2.0\n"), fenced(FIX)]


@pytest.mark.parametrize("strategy, knobs", [("single_shot", {}), ("reflection", {}),
                                             ("portfolio", {}), ("portfolio", {"revisions": 2})])
def test_budget_does_not_change_rounds_and_continuation_equals_fresh(strategy, knobs):
    kw = dict(strategy=strategy, temperature_schedule="rising", temperature=0.1, **knobs)
    long, m3 = run(SCRIPT, iters=3, **kw)
    short, m1 = run(SCRIPT, iters=1, **kw)
    assert long.passed_round == 3 and short.passed_round is None
    assert requests(m1) == requests(m3)[:2]  # same prompts, seeds, temperatures
    assert view(short) == view(long)[:2]
    assert view(truncate(long, 1)) == view(short) and truncate(long, 1).budget == 1
    assert truncate(long, 1).passed_round is None and truncate(long, 1).stop_reason == "budget"
    # continue the short one: only the missing rounds are asked for, and the result equals the fresh long run
    more = ScriptedModel(SCRIPT[2:])
    cont = run_agent(task(2), more, sandbox(), agent(iters=3, **kw), prior=short)
    assert requests(more) == requests(m3)[2:]
    assert view(cont) == view(long) and cont.passed_round == 3 and cont.budget == 3
    # a prior made before the last round's feedback was kept: it is computed when continuing
    old = truncate(short, 1)
    old.attempts[-1].feedback = None
    more = ScriptedModel(SCRIPT[2:])
    assert view(run_agent(task(2), more, sandbox(), agent(iters=3, **kw), prior=old)) == view(long)


def test_continuing_a_finished_or_longer_prior_runs_nothing():
    solved, _ = run([fenced(FIX)], strategy="reflection", iters=1)
    none = ScriptedModel([])
    again = run_agent(task(2), none, sandbox(), agent(strategy="reflection", iters=3), prior=solved)
    assert none.requests == [] and again.passed_round == 0 and again.budget == 3
    long, _ = run(SCRIPT, strategy="reflection", iters=3)
    cut = run_agent(task(2), none, sandbox(), agent(strategy="reflection", iters=2), prior=long)
    assert none.requests == [] and view(cut) == view(long)[:3]


def test_prior_from_another_config_is_refused():
    short, _ = run(SCRIPT, strategy="reflection", iters=1)
    traj = run_agent(task(2), ScriptedModel(SCRIPT), sandbox(), agent(strategy="reflection", iters=1))
    assert traj.agent_key == short.agent_key
    with pytest.raises(ValueError, match="another agent config"):
        run_agent(task(2), ScriptedModel(SCRIPT), sandbox(), agent(strategy="reflection", iters=3, seed=1),
                  prior=short)


def test_trajectory_round_trips_through_json():
    from agents.types import Trajectory

    traj, _ = run([fenced(WRONG_C), fenced(FIX)], protocol="hidden", iters=1)
    back = Trajectory.from_dict(traj.to_dict())
    assert view(back) == view(traj) and back.attempts[0].visible_result.passed
    assert back.stop_reason == traj.stop_reason and back.agent_key == traj.agent_key


def test_a_trajectory_of_an_older_shape_is_refused_in_one_line_and_a_current_one_round_trips():
    """An older trajectory names its fields otherwise (its verdict lived elsewhere): read as this shape it would
    score a passed task as failed, so it is refused, and the store and the cache run that task again."""
    from agents.types import Trajectory

    traj, _ = run([fenced(WRONG_A), fenced(FIX)], strategy="reflection", iters=1)
    d = traj.to_dict()
    assert d["schema"] == 2 and Trajectory.from_dict(d).to_dict() == d and Trajectory.from_dict(d).passed
    old = {k: v for k, v in d.items() if k != "schema"}
    with pytest.raises(ValueError, match=r"trajectory of Python/\d+ is schema 1, this fixlab reads 2: run the task again"):
        Trajectory.from_dict(old)


def test_a_repeat_is_told_again_what_the_tests_showed():
    # The unchanged bug twice: the second answer is not run, and its prompt restates the first run's
    # failing call (a small model given only "unchanged, fix it" hands the same code back again).
    traj, model = run([fenced(BUGGY), fenced(BUGGY), fenced(FIX)], strategy="reflection", iters=2)
    assert [a.decision for a in traj.attempts] == ["tested", "repeat", "tested"] and traj.passed_round == 2
    repeat_prompt = last_user(model.requests[2])
    assert "original buggy code, unchanged" in repeat_prompt
    assert "`truncate_number(3.5)` returned 1.5, but the expected value is 0.5." in repeat_prompt
    assert repeat_prompt.count("unchanged") == 1  # the restated feedback does not say it twice
    # A repeat of a changed answer restates that answer's own failing run.
    traj, model = run([fenced(WRONG_A), fenced(WRONG_A), fenced(FIX)], strategy="reflection", iters=2)
    assert "same code as your attempt in round 0" in last_user(model.requests[2])
    assert "returned -0.5, but the expected value is 0.5" in last_user(model.requests[2])


def test_rewrite_when_stuck_starts_over_without_the_buggy_body():
    # Round 0 hands the bug back unchanged: round 1 is a new conversation asking for the function from scratch,
    # with the header, the tests and how the old code failed, but not the buggy body to copy.
    traj, model = run([fenced(BUGGY), fenced(WRONG_A), fenced(WRONG_A), fenced(FIX)], strategy="reflection",
                      iters=3, rewrite_when_stuck=True)
    assert [a.decision for a in traj.attempts] == ["tested", "tested", "repeat", "tested"]
    assert traj.passed_round == 3
    fresh = model.requests[1].messages
    assert [m["role"] for m in fresh] == ["system", "user"]
    assert "from scratch" in fresh[1]["content"] and SIG.strip() in fresh[1]["content"]
    assert "number % 1.0 + 1.0" not in fresh[1]["content"]  # the buggy body is not shown again
    assert "assert truncate_number(3.5) == 0.5" in fresh[1]["content"]  # the tests are
    assert "`truncate_number(3.5)` returned 1.5, but the expected value is 0.5." in fresh[1]["content"]
    # round 1's new code is revised as usual; its repeat in round 2 starts over again
    assert "Your fix did not work" in last_user(model.requests[2])
    assert [m["role"] for m in model.requests[3].messages] == ["system", "user"]
    assert "returned -0.5, but the expected value is 0.5" in model.requests[3].messages[1]["content"]


class BySeedModel:
    """Test double: answers each request with the output scripted for its seed, so concurrent candidate calls
    get fixed answers whatever order they arrive in."""

    def __init__(self, by_seed: dict):
        import threading

        self.by_seed, self.requests, self._lock = by_seed, [], threading.Lock()

    def generate(self, request):
        from agents.models.base import Generation

        with self._lock:
            self.requests.append(request)
        text = self.by_seed[request.seed]
        return Generation(text=text, prompt_tokens=10, completion_tokens=len(text.split()), seconds=0.0)


@pytest.mark.parametrize("strategy", ["reflection", "single_shot"])
def test_candidates_keep_the_first_that_passes_and_count_every_run(strategy):
    cfg = agent(strategy=strategy, iters=1, candidates=3)
    t = task(2)
    script = {(0, 0): WRONG_A, (0, 1): "# same\n" + WRONG_A, (0, 2): WRONG_B,
              (1, 0): BUGGY, (1, 1): FIX, (1, 2): WRONG_C}
    # reflection: candidate i of round r has round r's seed with turn i; single_shot: answer p = 3r + i of its stream
    # has round p's seed (flows/stream.py), so every (candidates, iters) point draws a prefix of one stream
    def seed(r, i):
        return round_seed(cfg, t.task_id, r, i) if strategy == "reflection" else round_seed(cfg, t.task_id, 3 * r + i)
    model = BySeedModel({seed(r, i): fenced(code) for (r, i), code in script.items()})
    traj = run_agent(t, model, sandbox(), cfg)
    assert traj.error is None, traj.error
    r0, r1 = traj.attempts
    # round 0: nothing passes; the first candidate that ran is kept, its copy is not run again
    assert r0.decision == "tested" and not r0.passed and r0.code.strip().endswith("% 1.0 - 1.0")
    assert [(x["call"], x["decision"], x["status"]) for x in r0.rejected] == [(1, "repeat", None), (2, "tested", "failed")]
    assert r0.sandbox_runs == 2 and len(r0.calls) == 3 and r0.calls[-1].output == fenced(WRONG_A)
    # round 1: the second candidate passes and is kept; the third is never read
    assert r1.passed and r1.candidate == 1 and r1.calls[-1].output == fenced(FIX)
    assert [(x["call"], x["decision"]) for x in r1.rejected] == [(0, "tested"), (2, "not_read")]
    assert r1.sandbox_runs == 2 and traj.passed_round == 1 and traj.model_calls == 6
    # the first candidate keeps the round's temperature; the others are sampled, each with its own seed
    temps = sorted((r.seed, r.temperature) for r in model.requests)
    assert len({s for s, _ in temps}) == 6
    by_seed = dict(temps)
    assert by_seed[seed(0, 0)] == 0.0
    assert {by_seed[seed(r, i)] for r in (0, 1) for i in (1, 2)} == {0.8}
    if strategy == "single_shot":  # the first answer of a later round is sampled too (it is not the stream's first)
        assert by_seed[seed(1, 0)] == 0.8
    r1_reqs = [r for r in model.requests if r.seed in {seed(1, i) for i in range(3)}]
    if strategy == "reflection":  # the revision prompt carries the kept answer and its feedback
        assert all(r.messages[-2]["content"] == fenced(WRONG_A) for r in r1_reqs)
    else:
        assert all(r.messages == model.requests[0].messages for r in r1_reqs)


def test_candidates_are_refused_for_react_and_below_one():
    from agents.config import ReactConf, check_config

    with pytest.raises(TypeError, match="candidates"):
        ReactConf(candidates=2)  # react makes one call per turn: its record has no such knob
    with pytest.raises(ValueError, match="candidates"):
        check_config(agent(candidates=0))


def test_sweep_runs_each_task_ahead_to_its_largest_budget_once(tmp_path):
    """iters=0,1,2,3 -m: the first job runs the task to budget 3 (one conversation) and reports its round 0; the
    later jobs only cut the cached trajectory, with no model call, and every job equals a fresh run at its budget."""
    from flows.cache import TrajectoryCache
    from flows.core import repair

    kw = dict(strategy="reflection", temperature_schedule="rising", temperature=0.1)
    from agents.models.config import TransformersModelConf
    from sandboxes.config import LocalSandboxConf

    cache = TrajectoryCache(tmp_path, TransformersModelConf(name="m", dtype="float32"), agent(**kw), LocalSandboxConf())
    first = ScriptedModel(SCRIPT)
    job0 = repair(task(2), 0, agent(iters=0, **kw), first, sandbox(), cache, run_ahead=3)
    assert len(first.requests) == 4 and cache.get(task(2), 0).budget == 3
    fresh0, _ = run(SCRIPT, iters=0, **kw)
    assert view(job0) == view(fresh0) and job0.budget == 0 and job0.passed_round is None
    for iters in (1, 2, 3):
        none = ScriptedModel([])
        job = repair(task(2), 0, agent(iters=iters, **kw), none, sandbox(), cache, run_ahead=3)
        fresh, _ = run(SCRIPT, iters=iters, **kw)
        assert none.requests == [] and view(job) == view(fresh) and job.passed_round == fresh.passed_round
    # without a cache there is nothing to run ahead for: the job runs its own budget
    alone = ScriptedModel(SCRIPT)
    repair(task(2), 0, agent(iters=1, **kw), alone, sandbox(), None, run_ahead=3)
    assert len(alone.requests) == 2


def test_sweep_budgets_are_read_from_the_iters_override():
    from flows.sweep import swept_budgets

    assert swept_budgets(["model=x", "iters=0,1,2,3"]) == [0, 1, 2, 3]
    assert swept_budgets(["iters=range(0,4)"]) == [0, 1, 2, 3]
    assert swept_budgets(["iters=3", "strategy=single_shot,reflection"]) == []  # budget not swept: nothing ahead
    assert swept_budgets(["iters=a,b"]) == []  # unreadable: each job runs its own budget (and fails on its own)


def test_redraws_replace_answers_known_to_fail_before_they_spend_the_round():
    # round 0 hands the bug back: drawn again at once (not run), the new answer passes in round 0
    traj, model = run([fenced(BUGGY), fenced(FIX)], strategy="reflection", iters=2, redraws=2)
    a = traj.attempts[0]
    assert traj.passed_round == 0 and len(traj.attempts) == 1 and len(model.requests) == 2
    assert model.requests[1].messages == model.requests[0].messages  # same prompt, another draw
    assert model.requests[1].temperature == 0.8 and model.requests[1].seed != model.requests[0].seed
    assert a.candidate == 1 and a.calls[-1].output == fenced(FIX) and a.sandbox_runs == 1
    assert a.rejected == [{"call": 0, "decision": "unchanged", "code": a.rejected[0]["code"], "status": None,
                           "same_as": None}]
    # round 1 repeats round 0: redrawn; the new answer runs and spends round 1
    traj, model = run([fenced(WRONG_A), fenced(WRONG_A), fenced(WRONG_B), fenced(FIX)], strategy="reflection",
                      iters=2, redraws=1)
    r1 = traj.attempts[1]
    assert r1.decision == "tested" and r1.code.strip() == WRONG_B.strip() and r1.rejected[0]["same_as"] == 0
    assert traj.passed_round == 2 and len(model.requests) == 4
    # redraws used up: the round is a repeat as without them, with every draw counted
    traj, model = run([fenced(WRONG_A)] * 3, strategy="reflection", iters=1, redraws=1)
    assert traj.attempts[1].decision == "repeat" and len(traj.attempts[1].calls) == 2
    with pytest.raises(ValueError, match="redraws"):
        run([fenced(FIX)], strategy="reflection", redraws=1, candidates=2)
