"""The self-check under protocol hidden: a round's answers that pass the examples are grouped by what they return on
probe inputs, the largest group is kept, and the agent is satisfied only when enough agree (agents/selfcheck.py)."""
from __future__ import annotations

import json

import pytest

from agents import selfcheck
from agents.config import check_config
from agents.loop import run_agent
from agents.models.doubles import ScriptedModel
from agents.selfcheck import behaviour, groups, own_assertions, own_inputs, probe_calls, probe_program
from agents_fixtures import agent, fenced, sandbox, task, tuned
from conftest import needs_data
from sandboxes import build_program

pytestmark = needs_data

SIG = "def truncate_number(number: float) -> float:\n"
FIX = SIG + "    return number % 1.0\n"
FIX_TOO = SIG + "    return number - int(number)\n"  # other code, same behaviour on positive numbers
OVERFIT = SIG + "    return 0.5\n"  # passes the example (3.5 -> 0.5) and nothing else
WRONG = SIG + "    return number % 1.0 + 1.0\n"  # fails the example too
OVERFIT_TOO = SIG + "    return 1.0 - 0.5\n"  # agrees with OVERFIT everywhere
# the model's own assertions (self_tests): three right, one wrong, one already among the examples, one not a test
OWN = fenced("assert truncate_number(1.25) == 0.25\nassert truncate_number(2.75) == 0.75\n"
             "assert truncate_number(4.125) == 0.125\nassert truncate_number(7.5) == 0.0\n"
             "assert truncate_number(3.5) == 0.5\nprint('done')")


def run(outputs, **kw):
    model = ScriptedModel(list(outputs))
    kw = {"protocol": "hidden", "strategy": "single_shot", "candidates": 3, "self_check": 2, **kw}
    traj = run_agent(task(2), model, sandbox(), agent(**kw))
    assert traj.error is None, traj.error
    return traj


def test_probes_are_the_examples_calls_then_same_typed_neighbours():
    calls = probe_calls(task(2).example_test, "truncate_number")
    assert calls[0] == "(3.5,)" and len(calls) > 1
    assert all(eval(c)[0] > 0 for c in calls)  # the sign is kept: a negative input may lie outside the task
    calls = probe_calls("assert f([1, 2, 3], 'ab') == 1\nassert f([4], 'c') == 2\nassert g(1) == 1", "f")
    assert calls[:2] == ["([1, 2, 3], 'ab')", "([4], 'c')"] and "(1,)" not in calls
    assert "([1, 2], 'ab')" in calls and not any(c.startswith("([]") for c in calls)
    assert probe_calls("def check(f):\n    assert f(x) ==", "f") == []  # not Python: no probes


def test_the_agreeing_group_is_kept_and_the_agent_is_satisfied():
    traj = run([fenced(OVERFIT), fenced(FIX), fenced(FIX_TOO)])
    a = traj.attempts[0]
    assert a.candidate == 1 and a.code.strip() == FIX.strip()  # the pair that agrees beats the first passing answer
    assert a.self_check["groups"] == [[1, 2], [0]] and a.self_check["satisfied"] and a.self_check["runs"] == 3
    assert traj.stop_reason == "solved" and traj.passed_round == 0  # and the verdict agrees
    assert a.sandbox_runs == 3 + 3  # every visible run and every probe run is counted


def test_without_agreement_the_agent_stops_unsure():
    traj = run([fenced(OVERFIT), fenced(FIX), fenced(WRONG)])
    a = traj.attempts[0]
    assert a.self_check["groups"] == [[0], [1]] and not a.self_check["satisfied"]
    assert a.passed_visible and a.unsure and traj.stop_reason == "unsure"
    assert traj.passed_round is None  # the earliest of the tied answers was kept: it overfits


def test_off_or_under_protocol_tests_the_first_passing_answer_is_kept_without_probes():
    traj = run([fenced(OVERFIT), fenced(FIX), fenced(FIX_TOO)], self_check=0)
    assert traj.attempts[0].candidate == 0 and traj.attempts[0].self_check is None and traj.stop_reason == "solved"
    traj = run([fenced(WRONG), fenced(FIX), fenced(FIX_TOO)], protocol="tests")
    assert traj.attempts[0].candidate == 1 and traj.attempts[0].self_check is None


def test_a_probe_that_raises_or_hangs_is_reported_where_it_happened():
    calls = ["(3.5,)", "(-1.0,)", "(5.25,)", "(1.75,)"]
    code = SIG + "    if number > 5:\n        while True:\n            pass\n    if number < 0:\n        raise ValueError\n" \
                 "    return number % 1.0\n"
    res = sandbox().run(build_program(code, probe_program("truncate_number", calls)), 1)
    assert res.status == "timeout"
    assert behaviour(res.stdout, 4) == ("0.5", "!ValueError", "!stopped", "!skipped")
    assert behaviour("no report", 3) is None and groups([("1",), None, ("1",)]) == [[0, 2], [1]]


def test_self_check_needs_as_many_candidates():
    with pytest.raises(ValueError, match="self_check=3 needs"):
        check_config(agent(strategy="single_shot", candidates=2, self_check=3))


def _fullsize():
    """The read-backs a job's results file keeps (flows/analysis/run_record.py)."""
    from flows.analysis import run_record

    return run_record


def test_the_record_reads_back_what_the_same_answers_scored_without_the_self_check():
    fullsize = _fullsize()
    picked = run([fenced(OVERFIT), fenced(FIX), fenced(FIX_TOO)])  # the check keeps FIX: passes; the first overfits
    unsure = run([fenced(OVERFIT), fenced(FIX), fenced(WRONG)])  # no agreement: OVERFIT kept, unsure
    trajs = [json.loads(json.dumps(t.to_dict(), default=str)) for t in (picked, unsure)]
    hid = [t["passed_round"] is not None for t in trajs]
    vis = [fullsize.passed_what_it_saw(t) for t in trajs]
    off = fullsize.without_self_check(trajs, hid, vis)
    assert hid == [True, False] and off["hidden_passed"] == 0 and off["satisfied"] == 2
    assert off["self_check_vs_none"]["only_with"] == 1 and off["self_check_vs_none"]["only_without"] == 0


def test_own_assertions_outvote_a_pair_of_answers_that_agree_on_an_overfit():
    """Two answers that special-case the example agree with each other on every probe; the model's own assertions
    (asked for once, after the candidates) rank the lone right answer above them (CodeT: size x (1 + passed))."""
    traj = run([fenced(OVERFIT), fenced(OVERFIT_TOO), fenced(FIX), OWN], self_check=1, self_tests=6)
    a = traj.attempts[0]
    assert a.code.strip() == FIX.strip() and a.candidate == 2
    assert a.self_check["own_tests"] == 4 and a.self_check["own_passed"] == [3, 0]  # the wrong one fails FIX too
    assert a.self_check["groups"] == [[2], [0, 1]] and a.self_check["satisfied"] and traj.passed_round == 0
    assert traj.model_calls == 4 and a.calls[0].output == OWN and a.calls[0].temperature == 0.0  # its tokens count
    asked = a.calls[0].messages[-1]["content"]
    assert "1.33" not in asked and "truncate_number(3.5)" in asked  # what the agent sees, never the full test
    # without them the overfit pair is kept and believed
    plain = run([fenced(OVERFIT), fenced(OVERFIT_TOO), fenced(FIX)], self_check=1)
    assert plain.attempts[0].candidate == 0 and plain.attempts[0].self_check["satisfied"]
    assert plain.passed_round is None and plain.stop_reason == "solved"


def test_an_answer_that_passes_none_of_its_own_assertions_leaves_the_agent_unsure():
    traj = run([fenced(OVERFIT), fenced(OVERFIT_TOO), fenced(WRONG), OWN], self_check=2, self_tests=6)
    a = traj.attempts[0]
    assert a.candidate == 0 and a.self_check["own_passed"] == [0] and not a.self_check["satisfied"]
    assert traj.stop_reason == "unsure"  # the pair agrees, but passes none of the model's own assertions


def test_own_assertions_are_parsed_from_the_answer_and_need_the_self_check():
    shown = "def check(f):\n    assert f(1) == 2\ncheck(f)\n"
    text = "x\n```python\nassert f(1) == 2\nassert f(2) == 3  # c\nassert f(2) == 3\nassert g(1)\nassert f(\n```"
    assert own_assertions(text, "f", shown, 5) == ["f(2) == 3"]
    assert own_assertions("assert f(0) == 0\nassert f(9) == 1", "f", "", 1) == ["f(0) == 0"]
    with pytest.raises(ValueError, match="self_tests=4 needs self_check"):
        check_config(agent(strategy="single_shot", candidates=2, self_tests=4))


def test_the_record_reads_back_what_agreement_alone_would_have_kept():
    fullsize = _fullsize()
    right = run([fenced(OVERFIT), fenced(OVERFIT_TOO), fenced(FIX), OWN], self_check=1, self_tests=6)
    unsure = run([fenced(OVERFIT), fenced(OVERFIT_TOO), fenced(WRONG), OWN], self_check=1, self_tests=6)
    trajs = [json.loads(json.dumps(t.to_dict(), default=str)) for t in (right, unsure)]
    hid = [t["passed_round"] is not None for t in trajs]
    off = fullsize.without_own_tests(trajs, hid, 1)
    # agreement alone keeps the overfit pair both times and believes it; the own tests kept FIX, and doubted the pair
    assert hid == [True, False] and off["hidden_passed"] == 0 and off["satisfied"] == 2
    assert off["satisfied_but_rejected"] == 2 and off["own_tests_vs_none"]["only_with"] == 1


def test_the_share_of_own_assertions_to_pass_moves_the_label_never_the_answer(monkeypatch):
    """FIX passes 3 of the 4 assertions: satisfied when more than half must pass, unsure when more than three quarters
    must; the same answer is kept and scored either way. The record reads the other label back exactly."""
    fullsize = _fullsize()
    def at(share):
        monkeypatch.setattr(selfcheck, "SELF_TESTS_PASS", share)
        return run([fenced(OVERFIT), fenced(OVERFIT_TOO), fenced(FIX), OWN], self_check=1, self_tests=6)

    strict, half = at(0.75), at(0.5)
    for traj in (strict, half):
        assert traj.attempts[0].candidate == 2 and traj.attempts[0].self_check["own_passed"] == [3, 0]
        assert traj.passed_round == 0
    assert strict.stop_reason == "unsure" and half.stop_reason == "solved"
    trajs = [json.loads(json.dumps(strict.to_dict(), default=str))]
    hid = [True]
    assert fullsize.at_own_tests_pass(trajs, hid, 1, 0.75)["satisfied"] == 0  # its own label, read back
    back = fullsize.at_own_tests_pass(trajs, hid, 1, 0.5)
    assert back["satisfied"] == 1 and back["gap"] == 0 and back["satisfied_and_passed"] == 1


# self_check_scope=task: agreement is counted among every answer of the task, one answer a round
def across(outputs, iters=3, **kw):
    return run(outputs, candidates=1, self_check=2, self_check_scope="task", iters=iters, **kw)


def test_across_rounds_an_unsure_pass_is_held_and_a_later_agreeing_answer_is_handed_in():
    traj = across([fenced(OVERFIT), fenced(FIX), fenced(WRONG), fenced(FIX_TOO)])
    a = traj.attempts
    assert [x.held for x in a] == [True, True, False, False] and not any(x.passed for x in a[:2])
    assert a[1].result.passed  # the full test passes FIX, but it is not handed in before anyone agrees with it
    assert a[3].self_check["groups"] == [[[1, 0], [3, 0]], [[0, 0]]] and a[3].self_check["satisfied"]
    assert traj.passed_round == 3 and traj.stop_reason == "solved"
    assert a[3].sandbox_runs == 1 + 1 and a[3].self_check["runs"] == 1  # its run, and only its own probe run


def test_across_rounds_a_repeat_of_a_held_answer_is_run_again_as_a_vote():
    traj = across([fenced(FIX), fenced(WRONG), fenced(FIX)])
    assert [x.decision for x in traj.attempts] == ["tested"] * 3 and traj.passed_round == 2
    # a repeat of a failed answer is still not run again
    traj = across([fenced(WRONG), fenced(WRONG), fenced(FIX), fenced(FIX)])
    assert [x.decision for x in traj.attempts] == ["tested", "repeat", "tested", "tested"] and traj.passed_round == 3


def test_across_rounds_a_budget_that_ends_unsure_hands_nothing_in_and_cuts_like_a_fresh_run():
    from agents.loop import truncate

    long = across([fenced(FIX), fenced(WRONG), fenced(FIX_TOO)], iters=2)
    short = across([fenced(FIX), fenced(WRONG)], iters=1)
    assert long.passed_round == 2 and short.passed_round is None and short.stop_reason == "budget"
    cut = truncate(long, 1)
    assert (cut.passed_round, cut.stop_reason) == (short.passed_round, short.stop_reason)
    assert across([fenced(FIX)], iters=0).stop_reason == "unsure"  # it held a pass nobody agreed with


def test_held_at_end_hand_in_hands_the_best_held_answer_in_unsure():
    """A budget that ends before two answers agree: hold fails the task, hand_in hands in the held answer (here the
    right one, drawn on round 0), labelled unsure; the attempts are the same either way."""
    held = across([fenced(FIX), fenced(WRONG)], iters=1)
    handed = across([fenced(FIX), fenced(WRONG)], iters=1, held_at_end="hand_in")
    assert not held.passed and held.handed_in is None and held.stop_reason == "budget"
    assert handed.passed and handed.handed_in == [0, 0] and handed.passed_round == 0
    assert handed.stop_reason == "unsure"  # never counted as satisfied: the overfit gap sees it as unsure
    same = lambda t: [(a.code, a.decision, a.self_check, a.result.status) for a in t.attempts]  # noqa: E731
    assert same(handed) == same(held)
    # a held wrong answer is handed in too, and fails
    wrong = across([fenced(OVERFIT), fenced(WRONG)], iters=1, held_at_end="hand_in")
    assert wrong.handed_in == [0, 0] and not wrong.passed and wrong.passed_round is None
    # nothing held (no answer passed what the agent saw): nothing to hand in
    none = across([fenced(WRONG), fenced(SIG + "    return -1.0\n")], iters=1, held_at_end="hand_in")
    assert none.handed_in is None and not none.passed and none.stop_reason == "budget"


def test_held_at_end_hand_in_verdicts_are_per_budget_and_a_cut_budget_equals_a_fresh_run():
    """Not monotone: the right answer held at budgets 0 and 1 is handed in, but at budget 2 two wrong answers agree and
    are handed in, satisfied. Each budget cut from the long run (truncate) and each continued from a shorter one
    (prior=) equals a fresh run with that budget, and the outcome keeps the verdict of every budget."""
    from agents.loop import truncate
    from agents.types import cut, passed_at, row_verdicts
    from flows.job import _result_rows

    outputs = [fenced(FIX), fenced(OVERFIT), fenced(OVERFIT_TOO)]
    long = across(outputs, iters=2, held_at_end="hand_in")
    assert long.attempts[2].self_check["satisfied"] and not long.passed and long.stop_reason == "solved"
    assert [long.passed_by_round(k) for k in range(3)] == [True, True, False] and long.passed_by_budget == [True, True, False]
    seen = lambda t: (t.passed, t.passed_round, t.handed_in, t.stop_reason, t.budget, t.passed_by_budget)  # noqa: E731
    for k in range(3):
        fresh = across(outputs[:k + 1], iters=k, held_at_end="hand_in")
        assert seen(truncate(long, k)) == seen(fresh), k
        assert fresh.passed_by_budget == long.passed_by_budget[:k + 1] == cut(long.passed_by_budget, k)
    cfg = agent(strategy="single_shot", protocol="hidden", candidates=1, self_check=2, self_check_scope="task",
                held_at_end="hand_in", iters=1)
    prior = run_agent(task(2), ScriptedModel(outputs[:2]), sandbox(), cfg)
    assert prior.passed and prior.handed_in == [0, 0]
    cont = run_agent(task(2), ScriptedModel(outputs[2:]), sandbox(), tuned(cfg, iters=2), prior=prior)
    assert seen(cont) == seen(long)
    # the results row keeps the per-budget verdicts, and every reader of "passed by budget k" takes them from there
    row = next(_result_rows([long]))
    assert row["passed_by_budget"] == [True, True, False] and row_verdicts(row) == [True, True, False]
    assert [passed_at(row_verdicts(row), k) for k in (0, 1, 2, None)] == [True, True, False, False]
    # hold: monotone, the same record
    held = next(_result_rows([across(outputs, iters=2)]))
    assert held["passed_by_budget"] == [False, False, False] and row_verdicts(held) == [False, False, False]


def test_held_at_end_is_checked():
    check_config(agent(strategy="single_shot", candidates=1, self_check=2, self_check_scope="task", held_at_end="hand_in"))
    with pytest.raises(ValueError, match="held_at_end=hand_in needs self_check_scope=task"):
        check_config(agent(strategy="single_shot", candidates=2, self_check=2, held_at_end="hand_in"))
    with pytest.raises(ValueError, match="unknown held_at_end 'give'"):
        check_config(agent(strategy="single_shot", candidates=1, self_check=2, self_check_scope="task", held_at_end="give"))


def test_across_rounds_a_resumed_run_counts_the_earlier_rounds_votes():
    cfg = agent(strategy="single_shot", protocol="hidden", candidates=1, self_check=2, self_check_scope="task", iters=1)
    prior = run_agent(task(2), ScriptedModel([fenced(FIX), fenced(WRONG)]), sandbox(), cfg)
    cont = run_agent(task(2), ScriptedModel([fenced(FIX_TOO)]), sandbox(), tuned(cfg, iters=3), prior=prior)
    fresh = across([fenced(FIX), fenced(WRONG), fenced(FIX_TOO)])
    assert cont.passed_round == fresh.passed_round == 2
    assert cont.attempts[2].self_check["groups"] == fresh.attempts[2].self_check["groups"]


def test_across_rounds_the_buggy_code_handed_back_never_votes():
    """Python/32: the buggy code passes the docstring's examples, so handing it back twice would agree with itself."""
    t = task(32)
    buggy, fix = t.buggy_code, t.declaration + t.canonical_solution
    model = ScriptedModel([fenced(buggy), fenced(buggy), fenced(fix), fenced(fix)])
    traj = run_agent(t, model, sandbox(), agent(strategy="single_shot", protocol="hidden", candidates=1, self_check=2,
                                                self_check_scope="task", iters=3))
    a = traj.attempts
    assert a[0].unchanged and a[0].held and a[1].decision == "repeat"  # not run again, no vote
    assert a[2].held and a[3].self_check["satisfied"] and traj.passed_round == 3
    assert a[3].self_check["groups"] == [[[2, 0], [3, 0]]]


def test_across_rounds_the_overfit_gap_counts_only_what_was_handed_in():
    fullsize = _fullsize()
    trajs = [json.loads(json.dumps(across(o, iters=i).to_dict(), default=str))
             for o, i in (([fenced(FIX), fenced(WRONG)], 1), ([fenced(OVERFIT), fenced(OVERFIT_TOO)], 1))]
    hid = [t["passed_round"] is not None for t in trajs]
    sat = [fullsize.passed_what_it_saw(t) and t.get("stop_reason") == "solved" for t in trajs]
    assert hid == [False, False] and sat == [False, True]  # held FIX is not handed in; the agreeing overfit pair is
    off = fullsize.without_self_check(trajs, hid, [True, True])
    assert off["hidden_passed"] == 1  # believing the first pass would have handed FIX in
    # handing the held answer in, unsure, when the budget ends: FIX counts, the label (and the gap's satisfied) stays
    back = fullsize.held_handed_in(trajs, hid, sat)
    assert (back["hidden_passed"], back["satisfied"], back["gap"]) == (1, 1, 0.0)
    assert back["vs_holding"]["only_with"] == 1 and back["vs_holding"]["only_without"] == 0


def test_self_check_scope_is_checked():
    check_config(agent(strategy="single_shot", candidates=1, self_check=3, self_check_scope="task"))
    with pytest.raises(ValueError, match="self_check_scope=task needs self_check"):
        check_config(agent(strategy="single_shot", candidates=1, self_check_scope="task"))
    with pytest.raises(ValueError, match="self_check_scope=task is for single_shot"):
        check_config(agent(strategy="reflection", candidates=2, self_check=2, self_check_scope="task"))
    with pytest.raises(ValueError, match="unknown self_check_scope 'tasks'"):
        check_config(agent(strategy="single_shot", candidates=1, self_check=1, self_check_scope="tasks"))


# self_inputs: the model's own inputs join the probes (CodeT's input side)
NEAR = SIG + "    return number % 1.0 if number < 10 else 0.0\n"  # right next to the example, wrong past 10
NEAR_TOO = SIG + "    return number % 1.0 if number < 10 else 1.0\n"  # agrees with NEAR on every neighbour probe
INPUTS = fenced("truncate_number(12.5)\ntruncate_number(0.75)\ntruncate_number(3.5)\ntruncate_number(x)")


def test_own_inputs_are_the_literal_calls_the_model_wrote_beyond_the_examples():
    shown = "def check(f):\n    assert f(1, 'a') == 2\ncheck(f)\n"
    text = "x\n```python\nf(2, 'b')\nassert f(3, 'c') == 9\nf(1, 'a')\nf(n, 'd')\nf(2, 'b')\ng(4, 'e')\nf(\n```"
    assert own_inputs(text, "f", shown, 5) == ["(2, 'b')", "(3, 'c')"]  # an assertion's call counts, not its value
    assert own_inputs(text, "f", shown, 1) == ["(2, 'b')"]
    # they follow the examples' own calls, ahead of the mutants, and do not use up the mutants' places
    calls = probe_calls("assert f(1, 'a') == 2", "f", limit=3, own=["(2, 'b')", "(1, 'a')"])
    assert calls == ["(1, 'a')", "(2, 'b')", "(2, 'a')", "(3, 'a')"]
    assert probe_calls("assert f(1, 'a') == 2", "f", limit=3) == ["(1, 'a')", "(2, 'a')", "(3, 'a')"]
    with pytest.raises(ValueError, match="self_inputs=4 needs self_check"):
        check_config(agent(strategy="single_shot", candidates=2, self_inputs=4))


def test_two_different_answers_that_agree_next_to_the_examples_are_split_by_the_models_own_inputs():
    """NEAR and NEAR_TOO return the same on the example and on every neighbour of it (all under 10), so agreement
    alone hands NEAR_TOO in, and the full test fails it; on the model's input 12.5 they differ, so both are held."""
    plain = across([fenced(NEAR), fenced(NEAR_TOO)], iters=1)
    assert plain.attempts[1].self_check["satisfied"] and plain.stop_reason == "solved"
    assert plain.passed_round is None  # satisfied and wrong: what the overfit gap counts
    mine = across([fenced(NEAR), INPUTS, fenced(NEAR_TOO)], iters=1, self_inputs=4)
    a = mine.attempts
    assert [x.held for x in a] == [True, True] and mine.stop_reason == "unsure" and mine.passed_round is None
    assert a[1].self_check["own_inputs"] == 2 and a[1].self_check["groups"] == [[[0, 0]], [[1, 0]]]
    assert a[1].self_check["probes"] == plain.attempts[1].self_check["probes"] + 2
    asked = a[0].calls[0].messages[-1]["content"]  # written once, on the first pass; its tokens count
    assert mine.model_calls == 3 and a[0].calls[0].output == INPUTS and a[0].calls[0].temperature == 0.0
    assert "123.456" not in asked and "truncate_number(3.5)" in asked  # what the agent sees, never the full test
    # a right answer after them agrees with neither, and one more right answer completes its group
    fixed = across([fenced(NEAR), INPUTS, fenced(NEAR_TOO), fenced(FIX), fenced(FIX_TOO)], iters=3, self_inputs=4)
    assert fixed.passed_round == 3 and fixed.stop_reason == "solved"


def test_own_inputs_make_a_point_run_alone_not_cut_from_a_stream():
    from flows.stream import applies

    cfg = agent(strategy="single_shot", protocol="hidden", candidates=1, self_check=2, self_check_scope="task",
                iters=3)
    assert applies(cfg, (1, 8)) and not applies(tuned(cfg, self_inputs=4), (1, 8))
