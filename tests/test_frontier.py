"""flows.frontier: the cost-accuracy frontier of one model on one protocol, checked on a hand-made fixture
(tests/fixtures/fullsize-frontier-toy.json: 20 tasks, 5 configurations) against values worked out by hand, and read
back from a real MLflow store (a sweep parent with its jobs) as from results files.

The fixture, tasks T0..T19 (first passing round per task; - = never):
  A single_shot iters=0             passes T0-T3                    4/20  100 completion tok/task   5 s/task
  B single_shot iters=1             passes T0-T9                   10/20  180                        9
  C single_shot candidates=2 iters=1 passes T0-T8, T10, T11        11/20  360                       11
  D reflection iters=1              passes T0-T13 except T2        13/20  300                       20
  E reflection iters=3              passes T0-T14 except T2        14/20  520                       35
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from flows import frontier as fl
from flows.stats import wilson

FIXTURE = REPO / "tests" / "fixtures" / "fullsize-frontier-toy.json"


def results_doc(runs: list, utc: str = "20261126T000000Z", **top) -> str:
    """A results file of schema 2 holding `runs` (flows/results.py about(); the fields its reader checks)."""
    return json.dumps({"about": {"schema": 2, "kind": "fullsize", "utc": utc, "machine": {}, "title": "t"}, **top,
                       "runs": [{"machine": "unknown", **r} for r in runs]})


def rounds(first):
    """Verdicts per budget of a task whose first passing round is `first` (None: never passed)."""
    return [False] * first + [True] if first is not None else [False]
A, B, C, D, E = ("single_shot iters=0", "single_shot iters=1", "single_shot candidates=2 iters=1", "reflection iters=1",
                 "reflection iters=3")


def test_fixture_pareto_sets_and_paired_verdicts_match_the_hand_computed_ones():
    fr = fl.frontier(fl.records_from_file(FIXTURE))
    # Labels name what differs: candidates only where it is not the usual 1; runner.workers (a speed knob) and
    # reflection's own history_rounds (no other reflection run differs in it) name nothing.
    assert sorted(c.label for c in fr.configs) == sorted([A, B, C, D, E])
    # Tokens: C (360 tok, 0.55) is beaten by D (300 tok, 0.65); every other point is cheapest at its pass@1.
    assert fr.token_frontier == [A, B, D, E]
    # Seconds: C (11 s, 0.55) sits between B (9 s, 0.50) and D (20 s, 0.65), so all five are on it.
    assert fr.time_frontier == [A, B, C, D, E] and fr.time_machine == "Toy CPU, 2 cores"
    assert fr.config(C).on_time_frontier and not fr.config(C).on_token_frontier

    tok = {(s.point, s.against): s for s in fr.steps if s.axis == "completion tokens"}
    assert set(tok) == {(B, A), (D, B), (E, D), (E, B)}  # A is the cheapest: nothing to pair it with
    # B against A, the next cheaper frontier point. Discordant tasks: T4-T9 fixed by B only (6), none by A only.
    # Exact McNemar: 2 * P(X <= 0 | n = 6, 1/2) = 2 / 2^6 = 0.03125 < 0.05, so the step buys something.
    # Difference (10 - 4) / 20 = +0.30. Newcombe (method 10): Wilson 10/20 = (0.2993, 0.7007), 4/20 = (0.0807, 0.4160);
    # phi = (4*10 - 6*0) / sqrt(10*10*4*16) = 0.5;
    # low  = 0.30 - sqrt(0.2007^2 - 2*0.5*0.2007*0.2160 + 0.2160^2) = 0.30 - 0.2088 = 0.0912;
    # high = 0.30 + sqrt(0.2007^2 - 2*0.5*0.2007*0.1193 + 0.1193^2) = 0.30 + 0.1748 = 0.4748.
    ba = tok[(B, A)]
    assert (ba.shared_tasks, ba.only_point, ba.only_against, ba.p_value, ba.diff) == (20, 6, 0, 0.03125, 0.3)
    assert ba.ci95 == pytest.approx((0.0912, 0.4748), abs=2e-4)
    assert ba.buys is True and ba.why == "next cheaper frontier point"
    assert ba.text.startswith(f"{B} against {A} (next cheaper frontier point; 1.8x the completion tokens per task): "
                              "buys something.")
    # D against B: B (0.50) is also the cheapest configuration inside D's interval, Wilson 13/20 = (0.433, 0.819),
    # so one step says both. Discordant: T10-T13 by D only (4), T2 by B only (1): p = 2 * (1 + 5) / 2^5 = 0.375.
    db = tok[(D, B)]
    assert (db.only_point, db.only_against, db.p_value, db.buys) == (4, 1, 0.375, False)
    assert db.why == "next cheaper frontier point, and the cheapest inside its interval"
    assert "buys nothing the paired test can see" in db.text
    # E: next cheaper is D (T14 only: 1 vs 0, p = 1); the cheapest inside E's interval, Wilson 14/20 = (0.481, 0.855),
    # is B at 180 tokens (C at 0.55 and D at 0.65 are inside too, but dearer): T10-T14 vs T2, p = 2 * 7 / 2^6.
    assert wilson(14, 20)[0] < 0.50 < wilson(14, 20)[1]
    assert (tok[(E, D)].only_point, tok[(E, D)].only_against, tok[(E, D)].p_value) == (1, 0, 1.0)
    eb = tok[(E, B)]
    assert (eb.why, eb.only_point, eb.only_against, eb.p_value, eb.buys) == (
        "cheapest configuration inside its interval", 5, 1, 0.21875, False)
    # On the seconds axis C is a frontier point: against B (next cheaper, and cheapest inside its interval),
    # T10, T11 vs T9: p = 1.
    sec = {(s.point, s.against): s for s in fr.steps if s.axis == "seconds"}
    assert (sec[(C, B)].only_point, sec[(C, B)].only_against, sec[(C, B)].p_value) == (2, 1, 1.0)

    md = fr.markdown()
    row = next(l for l in md.splitlines() if l.startswith(f"| {B} |"))
    assert row == (f"| {B} | 0.500 [0.299, 0.701] | 10/20 | 700 | 180 | 1.7 | 1.5 | 9.0 | tokens, seconds | "
                   f"vs {A}: +30.0 (p = 0.031), buys |")
    assert f"| {C} | 0.550 [0.342, 0.742] | 11/20 | 1,000 | 360 | 3.0 | 2.0 | 11.0 | seconds |  |" in md


def test_the_report_table_keeps_the_frontier_rows_and_names_the_command_for_the_rest():
    """docs/RESULTS.md's frontier sections (flows/report.py): configurations on no frontier are left out of the table
    and counted, with the command that lists them; every other row and every verdict stays."""
    from flows.analysis.render import markdown

    from flows import report

    fr = report.frontier_of(REPO / "benchmarks" / "results")  # the committed runs: dozens of configurations
    full = fr.markdown()
    off = [l for l in full.splitlines() if l.startswith("| ") and l.endswith(" | no |  |")]
    assert off and len(off) < len(fr.configs)
    short = markdown(fr, off_frontier="python -m flows.frontier X")
    assert not any(l in short.splitlines() for l in off)
    kept = [l for l in full.splitlines() if l not in off]
    assert all(l in short.splitlines() for l in kept)
    assert f"{len(off)} configurations on no frontier are left out of this table; `python -m flows.frontier X` " \
           "lists every one." in short


def test_the_verdict_in_words_and_a_whole_number_logged_two_ways(tmp_path):
    fr = fl.frontier(fl.records_from_file(FIXTURE))
    # The frontier A < B < D < E spans two strategies; its next-cheaper steps are B/A (buys), D/B and E/D (do not);
    # D/B and E/B are the steps against the cheapest inside the interval; C is single_shot, beaten by D at fewer tokens.
    assert fl.verdict_words(fr) == (
        "On completion tokens the frontier is single_shot at iters=0-1 and reflection at iters=1-3 (4 points, pass@1 "
        f"0.200 to 0.700). Of its 3 steps to the next cheaper point, 1 buys something the paired test sees: {B} over "
        f"{A} (+30.0 points, p = 0.031). Against the cheapest configuration inside its interval, 0 of 2 frontier "
        "points buy something. 1 other single_shot configuration is matched or beaten by a frontier point at fewer "
        "completion tokens.")
    # The typed config logs 10.0 where older runs logged 10: one setting, not a knob that differs.
    doc = json.loads(FIXTURE.read_text())
    for i, run in enumerate(doc["runs"]):
        run["params"]["sandbox.timeout_s"] = "10.0" if i % 2 else 10
    (tmp_path / FIXTURE.name).write_text(json.dumps(doc))
    recs = fl.records_from_file(tmp_path / FIXTURE.name)
    assert {r.params["sandbox.timeout_s"] for r in recs} == {"10"}
    assert sorted(c.label for c in fl.frontier(recs).configs) == sorted([A, B, C, D, E])
    assert fl.param_values({"a": "10.0", "b": "0.5", "c": "1e3", "d": "True", "e": "-2.0"}) == \
        {"a": "10", "b": "0.5", "c": "1e3", "d": "True", "e": "-2"}


def test_command_writes_table_json_picture_and_page(tmp_path, capsys):
    out = tmp_path / "pics" / "frontier.png"
    out.parent.mkdir()
    rc = fl.main([str(FIXTURE), "--no-mlflow", "--md", str(tmp_path / "f.md"), "--json", str(tmp_path / "f.json"),
                  "--out", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert stdout == (tmp_path / "f.md").read_text() == fl.frontier(fl.records_from_file(FIXTURE)).markdown()
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["token_frontier"] == [A, B, D, E] and data["model"] == "toy-coder" and data["tasks"] == 20
    assert {s["point"] for s in data["steps"]} == {B, C, D, E}
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    page = out.with_suffix(".html").read_text()
    # self-contained: the plot inline as SVG, the table, the verdicts; no script, nothing fetched from elsewhere
    assert "<svg" in page and f"<td>{B}</td>" in page and "buys something" in page
    assert "<script" not in page and "src=" not in page and 'href="http' not in page


def test_reruns_partial_runs_unpaired_runs_and_mixes(tmp_path, capsys):
    doc = json.loads(FIXTURE.read_text())
    rerun = json.loads(json.dumps(doc["runs"][1]))  # B run again, recorded earlier: it missed T9
    rerun["run_id"] = "f" * 32
    rerun["verdicts"]["Python/9#0"] = [False]
    rerun["overall"]["passed"] = 9
    partial = json.loads(json.dumps(doc["runs"][4]))  # E stopped half-way: 10 of 20 tasks
    partial["run_id"] = "9" * 32
    partial["overall"]["total"] = 10
    unpaired = json.loads(json.dumps(doc["runs"][3]))  # D with knob changed, recorded before outcomes were kept
    unpaired["run_id"] = "8" * 32
    unpaired["params"]["strategy.history_rounds"] = "2"
    for key in ("verdicts", "task_seconds", "machine_source"):
        del unpaired[key]
    unpaired["machine"] = "Intel Xeon (file text)"  # what the migration gave runs that kept no machine
    grid = json.loads(json.dumps(doc["runs"][0]))  # a second point of A's run (one run, a grid of points)
    grid["params"]["strategy.candidates"] = "2"
    grid["cost"]["completion_tokens"] = 4000  # twice A's, for the same 4 tasks: beaten by A
    older = tmp_path / "fullsize-older.json"
    older.write_text(results_doc([rerun, partial, unpaired, grid], command="rerun on a 2-core Xeon",
                                 recorded="2026-01-01T00:00:00Z"))
    records = fl.records_from_file(FIXTURE) + fl.records_from_file(older, order=1)
    fr = fl.frontier(records)
    assert fr.config(B).run_id == "b" * 32 and fr.config(B).passed == 10  # the newest record of B
    assert any(n.startswith(f"{B}: 2 runs of this configuration; used bbbbbbbb") and "ffffffff" in n for n in fr.notes)
    assert any("99999999" in n and "10 of 20 tasks" in n for n in fr.notes)
    # The unpaired run is its own configuration (history_rounds differs), listed but never on the frontier, and the
    # file's text says where it ran.
    lone = next(c for c in fr.configs if c.run_id == "8" * 32)
    assert lone.label == "reflection history_rounds=2 iters=1" and not lone.on_token_frontier
    assert lone.machine == "Intel Xeon (file text)"
    # the grid point is a configuration of its own, though it shares A's run id
    assert [c.run_id for c in fr.configs if c.label in (A, "single_shot candidates=2 iters=0")] == ["a" * 32] * 2
    assert fr.token_frontier == [A, B, D, E]
    assert f"| {lone.label} |" in fr.markdown() and "not placed (unpaired)" in fr.markdown()
    # --use picks the other rerun; --paired-only drops the unpaired run from the table
    assert fl.frontier(records, use=("ffff",)).config(B).passed == 9
    assert all(c.paired for c in fl.frontier(records, paired_only=True).configs)

    other = json.loads(json.dumps(doc))
    other["runs"][0]["params"]["model.name"] = "toy-coder-xl"
    mixed = tmp_path / "fullsize-mixed.json"
    mixed.write_text(json.dumps(other))
    assert fl.main([str(mixed), "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: the records cover 2 models (toy-coder, toy-coder-xl): one frontier is for one model; pick "
                   "one with --model NAME")
    assert fl.main([str(mixed), "--no-mlflow", "--model", "toy-coder-xl"]) == 0
    assert fl.main([str(tmp_path / "nope.json"), "--no-mlflow"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path / 'nope.json'}: no such results file, and not an "
                                               "MLflow run id (32 hex digits)")


def _log_fixture_as_sweep(client, tmp_path) -> tuple[str, list[str]]:
    """The fixture's five runs as a sweep's jobs in a real MLflow store, in the shape flows.evaluate logs them:
    flat params, totals as metrics, results.jsonl (one row per task, with its seconds), the fixlab.machine tag."""
    exp = client.create_experiment("humanevalfix", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="sweep strategy=single_shot,reflection", tags={"fixlab.kind": "sweep"})
    ids = []
    for r in json.loads(FIXTURE.read_text())["runs"]:
        run = client.create_run(exp, tags={"fixlab.kind": "job", "fixlab.machine": r["machine"],
                                           "mlflow.parentRunId": parent.info.run_id})
        rid = run.info.run_id
        for k, v in r["params"].items():
            client.log_param(rid, k, v)
        for k, v in r["cost"].items():
            client.log_metric(rid, k, v)
        rows = [{"task_id": key.split("#")[0], "sample": 0, "passed": v[-1], "passed_by_budget": v,
                 "seconds": r["task_seconds"] / 20, "attempts": []} for key, v in r["verdicts"].items()]
        client.log_text(rid, "".join(json.dumps(x) + "\n" for x in rows), "results.jsonl")
        client.set_terminated(rid, "FINISHED")
        ids.append(rid)
    client.set_terminated(parent.info.run_id, "FINISHED")
    return parent.info.run_id, ids


def test_frontier_from_a_sweep_in_mlflow_is_the_one_from_results_files_and_is_logged_on_the_parent(tmp_path, capsys):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    parent, ids = _log_fixture_as_sweep(client, tmp_path)
    assert fl.main(["--sweep", parent, "--tracking-uri", uri, "--json", str(tmp_path / "f.json")]) == 0
    from_mlflow = json.loads((tmp_path / "f.json").read_text())
    from_file = fl.frontier(fl.records_from_file(FIXTURE)).to_dict()
    assert from_mlflow["token_frontier"] == from_file["token_frontier"] == [A, B, D, E]
    assert from_mlflow["time_frontier"] == from_file["time_frontier"]
    assert from_mlflow["steps"] == from_file["steps"]
    assert [c["seconds"] for c in from_mlflow["configs"]] == [c["seconds"] for c in from_file["configs"]]

    arts = {a.path for a in client.list_artifacts(parent)}
    assert {"frontier.png", "frontier.html", "frontier.md", "frontier.json"} <= arts
    page = Path(client.download_artifacts(parent, "frontier.html", str(tmp_path))).read_text()
    assert "<svg" in page and "buys something" in page
    assert client.get_run(parent).data.tags["frontier.token_frontier"] == " < ".join([A, B, D, E])

    # Without a sweep parent the picture goes on a run of its own, tagged as a frontier.
    assert fl.main([*ids, "--tracking-uri", uri]) == 0
    runs = client.search_runs([client.get_experiment_by_name("humanevalfix").experiment_id],
                              "tags.`fixlab.kind` = 'frontier'")
    assert len(runs) == 1 and {"frontier.png", "frontier.html"} <= {a.path for a in client.list_artifacts(
        runs[0].info.run_id)}

    # a run's record (what a job writes when it ends) keeps its per-task seconds and machine, which the frontier reads
    from flows.analysis.run_record import from_mlflow
    from flows.compare import load_runs

    rec = from_mlflow(load_runs(client, [ids[1]])[0])
    assert rec["task_seconds"] == 180.0 and rec["machine"] == "Toy CPU, 2 cores" and rec["machine_source"] == "tag"
    (tmp_path / "rec.json").write_text(results_doc([rec], recorded="x"))
    again = fl.records_from_file(tmp_path / "rec.json")[0]
    assert (again.seconds, again.machine, again.passed) == (9.0, "Toy CPU, 2 cores", 10)


def test_a_run_with_per_round_costs_holds_every_smaller_budget(tmp_path):
    """A single_shot run to iters=2 whose rows keep each round's cost gives budgets 0, 1 and 2: outcomes cut at the
    round, costs summed up to it (what a grid cut from the answer stream is recorded as)."""
    from flows.frontier import budgets, cost_by_round, records_from_file

    def row(task, first, rounds, derived=False):
        return {"task_id": task, "passed_by_budget": [False] * 3 if first is None else [k >= first for k in range(3)],
                "passed": first is not None, "seconds": 6.0 * rounds,
                "derived_from": "stream" if derived else None,
                "attempts": [{"round": k, "prompt_tokens": 100, "completion_tokens": 10 * (k + 1), "model_calls": 1,
                              "sandbox_runs": 1, "seconds": 6.0} for k in range(rounds)]}
    rows = [row("T/0", 0, 1), row("T/1", 2, 3), row("T/2", None, 3, derived=True)]
    cost = cost_by_round(rows, 2)
    # round 0: three calls of 10 tokens; round 1 adds 20 for T/1 and T/2; round 2 adds 30 for each
    assert [c["completion_tokens"] for c in cost] == [30, 70, 130]
    assert [c["model_calls"] for c in cost] == [3, 5, 7]
    # T/2 is cut from a stream: its 18 s are spread by completion tokens (10, 30, 60 of 60) instead of per round
    assert [c["task_seconds"] for c in cost] == [6 + 6 + 3, 6 + 12 + 9, 6 + 18 + 18]
    assert cost_by_round([{**rows[0], "attempts": [{"round": 0}]}], 0) is None  # rows from before per-round costs
    rec = {"run_id": "r" * 32, "params": {"model.name": "m", "strategy.name": "single_shot", "iters": "2"},
           "overall": {"passed": 2, "total": 3}, "cost": {"completion_tokens": 130},
           "verdicts": {"T/0#0": rounds(0), "T/1#0": rounds(2), "T/2#0": rounds(None)}, "cost_by_round": cost}
    path = tmp_path / "fullsize-grid.json"
    path.write_text(results_doc([rec], command="x", recorded="2026-11-26T00:00:00Z"))
    recs = records_from_file(path)
    assert [(r.params["iters"], r.passed, round(r.cost["completion_tokens"], 2)) for r in recs] == \
        [("0", 1, 10.0), ("1", 1, 23.33), ("2", 2, 43.33)]
    # an older file's first passing rounds read as verdicts per budget, cut at the round
    assert recs[1].outcomes == {"T/0#0": [True], "T/1#0": [False, False], "T/2#0": [False]}
    assert budgets(recs[0], None) == [recs[0]]


def test_seconds_compare_on_one_machine_at_one_engine_commit(tmp_path):
    """A faster engine must not read as a cheaper configuration: seconds compare only between runs of one machine and
    one engine commit (tag git_commit; results files that keep none are one group, and the output says it mixes)."""
    plain = fl.frontier(fl.records_from_file(FIXTURE))
    assert plain.time_commit is None and "these records keep no git commit" in plain.markdown()
    assert "Frontier on seconds per task (Toy CPU, 2 cores, engine commits not recorded, may mix)" in plain.markdown()
    doc = json.loads(FIXTURE.read_text())
    for run in doc["runs"]:  # A-D at one commit, E at a later one
        run["git_commit"], run["git_dirty"] = ("1" if run["run_id"] != "e" * 32 else "2") * 40, "false"
    (tmp_path / FIXTURE.name).write_text(json.dumps(doc))
    fr = fl.frontier(fl.records_from_file(tmp_path / FIXTURE.name))
    assert (fr.time_machine, fr.time_commit) == ("Toy CPU, 2 cores", "1" * 12)
    assert fr.time_frontier == [A, B, C, D] and fr.token_frontier == [A, B, D, E]
    assert any(n.startswith(f"seconds of {E} left off the time axis: run on another machine or engine commit")
               for n in fr.notes)
    md = fr.markdown()
    assert f"on Toy CPU, 2 cores at engine {'1' * 12} (compared only there)" in md
    assert md.splitlines()[2].split(" | ")[-3] == "engine"  # a column, as the records name two commits
    assert fl.commit_of("abc" * 14, "true") == "abcabcabcabc+dirty" and fl.commit_of("unknown", "false") is None


def test_a_point_that_passes_nothing_is_never_on_the_frontier():
    """Agreement across a task's answers hands nothing in on round 0 (one answer cannot agree with another): that
    point is the cheapest, but handing nothing in costs less still, so the frontier starts at the first that passes."""
    assert fl.pareto([("nothing", 50.0, 0.0), ("one", 100.0, 0.2), ("two", 180.0, 0.5), ("worse", 200.0, 0.4)]) == \
        ["one", "two"]


def test_a_verdict_per_budget_is_cut_and_counted_as_it_is(tmp_path):
    """strategy.held_at_end=hand_in keeps a verdict for each budget (not monotone: an answer handed in at budget 1
    gives way to a wrong pair at budget 2). The frontier's budgets, the report's cut and pairing, and compare's
    per-round verdicts read those, not a first passing round."""
    from flows.compare import first_cell, paired_verdicts
    from flows.frontier import records_from_file
    from flows.analysis.records import Run
    from flows.analysis.sweeps import pair_runs

    outcomes = {"T/0#0": [True, True, False], "T/1#0": [False, True], "T/2#0": [False]}
    cost = [{"completion_tokens": 30 * (k + 1), "task_seconds": 10.0 * (k + 1)} for k in range(3)]
    rec = {"run_id": "h" * 32, "params": {"model.name": "m", "strategy.name": "single_shot", "iters": "2",
                                          "strategy.held_at_end": "hand_in"},
           "overall": {"passed": 1, "total": 3}, "cost": {"completion_tokens": 90}, "verdicts": outcomes,
           "cost_by_round": cost}
    path = tmp_path / "fullsize-hand-in.json"
    path.write_text(results_doc([rec], command="x", recorded="2026-11-28T00:00:00Z"))
    assert [(r.params["iters"], r.passed) for r in records_from_file(path)] == [("0", 1), ("1", 2), ("2", 1)]
    # a list shorter than the budget keeps its last verdict
    run = Run("h" * 32, 2, [1, 2, 1], 3, outcomes, {}, cost_by_round=cost)
    assert run.cut(1).outcomes == {"T/0#0": [True, True], "T/1#0": [False, True], "T/2#0": [False]}
    never = Run("n" * 32, 2, [0, 0, 0], 3, {k: [False] for k in outcomes}, {})
    pr = pair_runs(run, never)
    assert (pr.result.only_a, [p.only_a for p in pr.per_round]) == (1, [1, 2, 1])
    mine = {"label": "hand_in", "iters": 2, "verdicts": outcomes}
    base = {"label": "none", "iters": 2, "verdicts": {k: [False] for k in outcomes}}
    verdict = paired_verdicts([base, mine])[0]
    assert verdict["only_a"] == 1 and [r["only_a"] for r in verdict["by_round"]] == [1, 2, 1]
    assert [first_cell(outcomes[k]) for k in sorted(outcomes)] == ["at 0-1", "1", "-"]
    assert first_cell([True, False, True, True, False, True]) == "at 0,2-3,5" and first_cell([False]) == "-"


def test_a_configurations_label_is_its_difference_from_the_defaults_whatever_else_was_loaded():
    """Each full-size results file loaded alone labels its configurations as it does among all the others: a label
    names what a configuration sets away from its strategy's and model's defaults, not what the other loaded runs
    happen to set (issue #51: "single_shot iters=0" once named two different configurations)."""
    from flows.analysis.pareto import configurations
    from flows.analysis.records import records_from_file

    files = sorted((REPO / "benchmarks" / "results").glob("fullsize-*.json"))
    assert len(files) >= 3
    together, order = [], 0
    for f in files:
        together += records_from_file(f, order)
        order += 1

    def labels(records):
        """Labels as the frontier makes them: among one model's runs under one protocol."""
        groups: dict[tuple, list] = {}
        for r in records:
            groups.setdefault((r.params.get("model.name"), r.params.get("protocol", "tests")), []).append(r)
        out = {}
        for group in groups.values():
            if not any(r.status == "FINISHED" for r in group):
                continue
            for c in configurations(group)[0]:
                for run in [c.run_id] + [r.split(" ")[0] for r in c.reruns]:
                    out[(run, c.iters)] = c.label
        return out

    def knobs(label: str) -> str:
        """The label but the recorded path (serving.*: it has no default to differ from, so it is named where loaded
        runs took different paths)."""
        return " ".join(w for w in label.split() if not w.startswith("serving."))

    everything = labels(together)
    compared = 0
    for i, f in enumerate(files):
        for key, label in labels(records_from_file(f, i)).items():
            if key in everything:
                assert knobs(everything[key]) == knobs(label), (f.name, key, label, everything[key])
                compared += 1
    assert compared > 100


def test_a_rerun_in_a_file_the_job_wrote_itself_is_newer_than_an_older_hand_run_file(tmp_path):
    """A job's own results file keeps its time only in its self-description (about.utc), not in `recorded`: a rerun
    written that way after a hand-run file is the newest record of its configuration, and the frontier uses it."""
    doc = json.loads(FIXTURE.read_text())
    rerun = json.loads(json.dumps(doc["runs"][1]))  # B again, by a later engine: it missed T9
    rerun["run_id"] = "f" * 32
    rerun["verdicts"]["Python/9#0"] = [False]
    rerun["overall"]["passed"] = 9
    later = tmp_path / "fullsize-toy-coder-single_shot-iters1-29991231T235959Z.json"
    later.write_text(results_doc([rerun], utc="29991231T235959Z"))
    fr = fl.frontier(fl.records_from_file(later) + fl.records_from_file(FIXTURE, order=1))
    assert fr.config(B).run_id == "f" * 32 and fr.config(B).passed == 9
    assert any(n.startswith(f"{B}: 2 runs of this configuration; used ffffffff") for n in fr.notes)


def test_the_dollar_axis_prices_prompt_and_completion_tokens_and_can_move_the_frontier(tmp_path, capsys):
    """`--axis usd`: cost per task from the model's list prices. At 10 $/Mtok prompt and 1 $/Mtok completion the
    prompt dominates: A 400/100 tok a task = $0.0041, B 700/180 = $0.00718, C 1000/360 = $0.01036,
    D 1200/300 = $0.0123, E 2600/520 = $0.02652. C (0.55) now costs less than D (0.65), so it joins the frontier
    that tokens keep it off (C 360 > D 300 completion tokens)."""
    doc = json.loads(FIXTURE.read_text())
    for run in doc["runs"]:
        run["params"].update({"model.price_prompt_per_mtok": "10.0", "model.price_completion_per_mtok": "1.0"})
    priced = tmp_path / FIXTURE.name
    priced.write_text(json.dumps(doc))
    recs = fl.records_from_file(priced)
    assert fl.frontier(recs).token_frontier == [A, B, D, E]  # the default axis is unchanged by prices
    fr = fl.frontier(recs, axis="usd")
    assert fr.axis == "US dollars" and fr.token_frontier == [A, B, C, D, E]
    assert [fr.config(x).cost["usd"] for x in (A, B, C, D, E)] == [0.0041, 0.00718, 0.01036, 0.0123, 0.02652]
    cb = next(s for s in fr.steps if (s.point, s.against) == (C, B))
    assert cb.axis == "US dollars" and cb.cost_ratio == 1.443 and "1.4x the US dollars per task" in cb.text
    md = fr.markdown()
    assert "Frontier on US dollars per task (cheapest first): " + " < ".join([A, B, C, D, E]) in md
    row = next(l for l in md.splitlines() if l.startswith(f"| {C} |"))
    assert "| 0.01036 |" in row and "| dollars, seconds |" in row

    # A run with no prices is named and left off the dollar axis; with none priced (a local model) it is one line.
    doc["runs"][2]["params"].pop("model.price_prompt_per_mtok")
    priced.write_text(json.dumps(doc))
    fr = fl.frontier(fl.records_from_file(priced), axis="usd")
    assert C not in fr.token_frontier and any(f"no prices in their config: {C}" in n for n in fr.notes)
    assert fl.main([str(FIXTURE), "--axis", "usd", "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: --axis usd: toy-coder's runs carry no prices (a local model has none); set "
                   "model.price_prompt_per_mtok and model.price_completion_per_mtok, or drop --axis usd")
