"""single_shot's answer stream (flows/stream.py): every (candidates, iters) point cut from one run of the stream equals
the same point run alone, and a sweep over candidates x budgets runs the stream once."""
from __future__ import annotations

import json
import zlib

import pytest
from mlflow.tracking import MlflowClient

from agents.loop import run_agent
from agents.models.base import Generation, GenRequest
from agents_fixtures import agent, fenced, sandbox, task, tuned
from conftest import needs_data
from flows.stream import RecordedAnswers, StreamMiss, applies, cut, iters_for_answers, stream_config, stream_plan

SIG = "def truncate_number(number: float) -> float:\n"
FIX = SIG + "    return number % 1.0\n"
BUGGY = SIG + "    return number % 1.0 + 1.0\n"
WRONG = [SIG + "    return number % 1.0 - 1.0\n", SIG + "    return number - int(number) + 0.5\n",
         SIG + "    return 0.5\n", "def truncate(number):\n    return number % 1.0\n"]


class SeededAnswersModel:
    """Test double: its answer is a fixed function of the request's seed and temperature (as a real sampler's is),
    so the same request gets the same answer in any run. Greedy hands the bug back; a sampled answer is the fix,
    one of four wrong ones, prose without code, or a wrong one again in other words (a repeat)."""

    name = "seeded-answers"

    def __init__(self, fix_weight: int = 1):
        self.requests: list[GenRequest] = []
        self.fix_weight = fix_weight

    def generate(self, request: GenRequest) -> Generation:
        self.requests.append(request)
        if not request.temperature:
            text = fenced(BUGGY)
        else:
            pick = zlib.crc32(f"{request.seed}|{request.temperature}".encode()) % (6 + self.fix_weight)
            text = (fenced(WRONG[pick]) if pick < 4 else "I would look at the modulo." if pick == 4
                    else fenced("# again\n" + WRONG[0]) if pick == 5 else fenced(FIX))
        return Generation(text=text, prompt_tokens=sum(len(m["content"].split()) for m in request.messages),
                          completion_tokens=len(text.split()), seconds=0.001)

    def close(self) -> None:
        pass


def _same(traj) -> dict:
    """A trajectory without what differs between a replay and a run: times, the sandbox worker's run count, the note."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "derived_from", "duration_s", "worker_runs")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(traj.to_dict())


POINTS = [(1, 0), (1, 3), (1, 7), (2, 0), (2, 1), (2, 3), (4, 0), (4, 1)]


@needs_data
@pytest.mark.parametrize("knobs", [{"answer_format": "function"}, {"answer_format": "line"},
                                   # hidden, agreement among all the task's answers: "return 0.5" passes the example
                                   {"answer_format": "line", "protocol": "hidden", "self_check": 2,
                                    "self_check_scope": "task"}], ids=["function", "line", "line-agree"])
@pytest.mark.parametrize("seed", range(6))
def test_every_point_cut_from_the_stream_equals_the_point_run_alone(seed, knobs):
    base = agent("single_shot", seed=seed, **knobs)
    plan = (4, 8)
    stream = run_agent(task(2), SeededAnswersModel(), sandbox(), stream_config(base, plan))
    assert stream.error is None and stream.budget == 1
    for k, r in POINTS:
        cfg = tuned(base, candidates=k, iters=r)
        assert applies(cfg, plan)
        alone = run_agent(task(2), SeededAnswersModel(), sandbox(), cfg)
        got = cut(stream, 4, task(2), cfg, sandbox()) if k != 4 else None
        if got is not None:
            assert _same(got) == _same(alone), (k, r)
            assert got.derived_from == "stream: 4 answers a round, 2 rounds"
        # what the frontier reads: outcome and cost
        ref = got or alone
        assert (ref.passed_round, ref.completion_tokens, ref.model_calls) == \
               (alone.passed_round, alone.completion_tokens, alone.model_calls)


@needs_data
def test_a_pass_late_in_the_stream_is_found_at_every_grouping():
    """With the fix rare, different groupings pass at different rounds of the same answer."""
    base = agent("single_shot", seed=3)
    seen = set()
    for seed in range(24):
        base = tuned(base, seed=seed)
        stream = run_agent(task(2), SeededAnswersModel(fix_weight=0 if seed % 2 else 1), sandbox(),
                           stream_config(base, (4, 8)))
        for k, r in ((1, 7), (2, 3)):
            cfg = tuned(base, candidates=k, iters=r)
            traj = cut(stream, 4, task(2), cfg, sandbox())
            alone = run_agent(task(2), SeededAnswersModel(fix_weight=0 if seed % 2 else 1), sandbox(), cfg)
            assert _same(traj) == _same(alone)
            seen.add((k, traj.passed_round))
    # the same answer p passes at round p with one candidate and at round p // 2 with two: both occurred
    assert {(1, 5), (2, 2)} <= seen or {(1, 3), (2, 1)} <= seen, seen


@needs_data
def test_an_answer_missing_from_the_stream_is_an_error_not_a_failure():
    base = agent("single_shot", seed=1)
    stream = run_agent(task(2), SeededAnswersModel(fix_weight=0), sandbox(), stream_config(base, (2, 4)))
    with pytest.raises(StreamMiss):  # 8 answers asked of a stream of 4
        cut(stream, 2, task(2), tuned(base, candidates=1, iters=7), sandbox())


def test_which_points_a_stream_holds():
    ss = agent("single_shot")
    assert stream_plan([(1, 7), (2, 3), (4, 1), (8, 0)]) == (8, 8)
    assert stream_plan([(1, 0), (1, 1), (2, 0), (2, 1)]) == (2, 4)
    assert stream_plan([(1, 3), (3, 0)]) == (3, 6)  # lcm 3; 4 answers rounded up to whole rounds of 3
    assert stream_plan([(2, 3)]) is None  # one point: nothing to share
    assert applies(tuned(ss, candidates=2, iters=3), (8, 8))
    assert not applies(tuned(ss, candidates=2, iters=4), (8, 8))  # 10 answers > 8
    assert not applies(tuned(ss, candidates=3, iters=1), (8, 8))  # 3 does not divide 8
    assert not applies(tuned(ss, candidates=1, redraws=2), (8, 8))  # redraws are not stream answers
    assert not applies(tuned(ss, candidates=2, self_check=1, self_tests=4), (8, 8))  # its own-tests call is no answer
    assert not applies(agent("reflection", candidates=2), (8, 8))  # rounds depend on feedback
    assert iters_for_answers(8, 2) == 3
    with pytest.raises(ValueError, match="multiple of strategy.candidates"):
        iters_for_answers(6, 4)


def test_recorded_answers_serve_only_what_was_recorded():
    from agents.types import Attempt, ModelCall, Trajectory

    msgs = [{"role": "user", "content": "fix it"}]
    t = Trajectory(task_id="x", bug_type="b", strategy="single_shot", attempts=[Attempt(round=0, decision="tested", calls=[
        ModelCall(messages=msgs, output="A", completion_tokens=3, seed=7, temperature=0.8)])])
    m = RecordedAnswers(t)
    assert m.generate(GenRequest(messages=msgs, seed=7, temperature=0.8)).text == "A"
    with pytest.raises(RuntimeError):
        m.generate(GenRequest(messages=msgs, seed=8, temperature=0.8))
    assert m.missed == ["seed 8 at temperature 0.8"]


def _rows(run, run_id, dest):
    path = MlflowClient(run.tracking_uri).download_artifacts(run_id, "results.jsonl", str(dest))
    return {r["task_id"]: (r["passed_round"], r["completion_tokens"],
                           [(a["round"], a["decision"], a["code"], a["status"]) for a in r["attempts"]])
            for r in map(json.loads, open(path))}


# float32: the stream (4 answers a round) and the point alone (2 a round) batch their rows differently, and only
# float32 makes a row's answer independent of its batch.
COMMON = ("model=smollm2-135m", "model.dtype=float32", "strategy=single_shot", "dataset.limit=3",
          "max_new_tokens=48")


@needs_data
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_candidates_by_budget_sweep_runs_the_stream_once(evaluate, tmp_path):
    sweep = evaluate(*COMMON, "strategy.candidates=1,2,4", "answers=4", "-m", timeout=1500)
    assert sweep.rc == 0, sweep.stderr[-3000:]
    jobs = sweep.summaries
    assert [(j["iters"]) for j in jobs] == [3, 1, 0]
    assert all(j.get("stream") == {"candidates": 4, "answers": 4} for j in jobs)
    # one stream per task, in its own cache file; no other trajectories were run
    cached = list((evaluate.tmp / "trajectories").rglob("*__s0__k4.json"))
    assert len(cached) == 3
    alone = evaluate(*COMMON, "strategy.candidates=2", "iters=1", "cache=false", timeout=1500)
    assert alone.rc == 0, alone.stderr[-3000:]
    assert _rows(sweep, jobs[1]["run_id"], tmp_path / "cut") == _rows(alone, alone.summary["run_id"], tmp_path / "alone")
