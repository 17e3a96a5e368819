"""flows.leaderboard: the models side by side on one configuration, from results files (issue #71)."""
from __future__ import annotations

import json
import subprocess
import sys

from flows.analysis.records import RESULTS, records_from_files
from flows.leaderboard import default_label, leaderboard, markdown

from conftest import REPO

FILES = sorted(RESULTS.glob("fullsize-*.json"))


def test_make_evals_configuration_puts_the_models_side_by_side_each_paired_with_the_leader():
    rows, _ = leaderboard(records_from_files(FILES))
    assert default_label() == "single_shot iters=3" and {r.label for r in rows} == {"single_shot iters=3"}
    python = [r for r in rows if r.language == "python"]
    assert [r.model for r in python][:1] == ["qwen1.5b-coder-q4"]  # the best first
    assert [r.pass_at_1 for r in python] == sorted((r.pass_at_1 for r in python), reverse=True)
    small = next(r for r in python if r.model == "qwen0.5b-coder-q4")
    assert small.vs_first.startswith("qwen1.5b-coder-q4 beats qwen0.5b-coder-q4 by")  # paired on the same 164 tasks
    assert python[0].vs_first == ""  # the leader is not paired with itself
    assert all(r.total == 164 and r.usd is None for r in rows)  # local packs have no price
    assert "no price (local)" in markdown(rows)
    languages = [r.language for r in rows]
    assert languages == sorted(languages, key=["python", "js", "java", "go", "cpp", "rust"].index)


def test_a_priced_model_shows_its_cost_per_task_and_another_configuration_can_be_picked(tmp_path):
    src = next(p for p in FILES if "qwen1.5b-coder-q4-single_shot-iters3-java" in p.name)
    doc = json.loads(src.read_text())
    run = doc["runs"][0]
    run["run_id"] = "f" * 32
    run["params"].update({"model.name": "hosted-model", "model.price_prompt_per_mtok": "2.5",
                          "model.price_completion_per_mtok": "10"})
    priced = tmp_path / "fullsize-hosted.json"
    priced.write_text(json.dumps(doc))
    rows, _ = leaderboard(records_from_files([src, priced]))
    hosted = next(r for r in rows if r.model == "hosted-model")
    cost = next(r for r in records_from_files([priced]) if r.params["iters"] == "3").cost
    assert hosted.usd == round((cost["prompt_tokens"] * 2.5 + cost["completion_tokens"] * 10) / 1e6, 6) > 0
    assert "no significant difference" in hosted.vs_first or "no significant difference" in \
        next(r for r in rows if r.model != "hosted-model").vs_first  # the same answers: nothing between them
    picked, _ = leaderboard(records_from_files([src]), label="single_shot iters=1")
    assert [r.label for r in picked] == ["single_shot iters=1"]
    # a run of ours judged again (flows.rescore RUN_ID) is its model's check, not a row of its own
    run["params"].update({"model.name": "rescored-x", "model.format": "run"})
    run["run_id"] = "e" * 32
    rescored = tmp_path / "fullsize-rescored.json"
    rescored.write_text(json.dumps(doc))
    assert "rescored-x" not in {r.model for r in leaderboard(records_from_files([src, rescored]))[0]}


def test_the_command_prints_the_table_and_a_bad_input_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "flows.leaderboard", "--json", str(tmp_path / "rows.json")], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("| language | model |"), p.stderr
    assert json.loads((tmp_path / "rows.json").read_text())[0]["model"] == "qwen1.5b-coder-q4"
    p = subprocess.run([sys.executable, "-m", "flows.leaderboard", "--config", "react iters=99"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no finished 164-task run" in p.stderr
