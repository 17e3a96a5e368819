"""The results document is generated, so a figure cannot drift from its results file: docs/RESULTS.md and the
README's headline must equal what `python -m flows.report` makes of benchmarks/results/*.json, its paired verdicts
must equal the ones benchmarks/fullsize.py recorded in those files, and a new results file shows up in it without a
line of code (each file describes itself: flows/results.py)."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from conftest import REPO
from agents.types import passed_at
from flows import report, results as results_mod

FIX = "python -m flows.report"


def _generate(tmp_path, results=report.RESULTS_DIR):
    doc, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    shutil.copy(report.README, readme)
    assert report.main(["--results", str(results), "--doc", str(doc), "--readme", str(readme)]) == 0
    return doc.read_text(), readme.read_text()


def test_committed_results_document_and_headline_match_the_results_files(tmp_path):
    doc, readme = _generate(tmp_path)
    assert report.DOC.exists(), f"docs/RESULTS.md is missing: run `{FIX}` and commit it"
    assert report.DOC.read_text() == doc, f"docs/RESULTS.md differs from benchmarks/results/: run `{FIX}` and commit it"
    assert report.README.read_text() == readme, (
        f"README.md's headline block differs from benchmarks/results/: run `{FIX}` and commit it")


def _copy_tree(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS_DIR, results)
    doc, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    shutil.copy(report.DOC, doc)
    shutil.copy(report.README, readme)
    shutil.copy(report.PICTURE, tmp_path / report.PICTURE.name)  # the frontier picture beside the document
    return results, ["--results", str(results), "--doc", str(doc), "--readme", str(readme)]


def test_check_fails_on_a_changed_figure_names_the_fix_and_the_fix_works(tmp_path, capsys):
    results, args = _copy_tree(tmp_path)
    assert report.main(["--check", *args]) == 0
    # the best run gains a task: the headline (README) and the tables (document) must follow
    _, sweeps, curated = report.load_all(results)
    path = results / report.best_of(sweeps, curated).file
    data = json.loads(path.read_text())
    last = max(data["runs"], key=lambda r: int(r["params"]["iters"]))
    rounds = int(last["params"]["iters"])
    task = next(k for k, v in last["verdicts"].items() if not any(v))
    last["verdicts"][task] = [False] * rounds + [True]
    last["by_round"][rounds]["passed"] += 1
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert report.main(["--check", *args]) == 1
    err = capsys.readouterr().err
    assert FIX in err and "RESULTS.md" in err and "README.md" in err and len(err.strip().splitlines()) == 1
    assert report.main(args) == 0
    assert report.main(["--check", *args]) == 0
    passed = last["by_round"][rounds]["passed"]
    readme = " ".join((tmp_path / "README.md").read_text().split())  # the headline is wrapped at 120 columns
    assert f"({passed}/{last['overall']['total']} HumanEvalFix tasks" in readme


def test_a_results_file_that_does_not_describe_itself_stops_the_report_with_one_line(tmp_path, capsys):
    results, args = _copy_tree(tmp_path)
    (results / "weights-29991231T000000Z.json").write_text('{"rows": []}')
    assert report.main(["--check", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "weights-29991231T000000Z.json" in err and "write()" in err and len(err.splitlines()) == 1


def test_a_results_file_of_an_older_schema_is_refused_in_one_line_naming_the_migration(tmp_path, capsys):
    from flows.results import MIGRATED

    results, args = _copy_tree(tmp_path)
    path = results / "fullsize-react-epyc-fp32-20261126.json"
    data = json.loads(path.read_text())
    del data["about"]["schema"]
    path.write_text(json.dumps(data))
    assert report.main(["--check", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and path.name in err and "results schema 1, this fixlab reads 2" in err
    assert f"git show {MIGRATED}:benchmarks/migrate_results.py" in err


def test_a_new_results_file_appears_in_the_document_without_code(tmp_path, monkeypatch):
    """One call of the writer: the file names its kind, time, commit and machine, and the report gives it a table
    of its own, titled and explained by the file, its rows as the file gives them."""
    results, args = _copy_tree(tmp_path)
    monkeypatch.setattr(results_mod, "RESULTS_DIR", results)
    path = results_mod.write("tokenizer", {"rows": [{"model": "tiny", "tokens_per_s": 123456.7}]},
                             title="Tokenizer throughput (a test double of a benchmark)", text="Rows of one run.",
                             config={"threads": 2}, command="python benchmarks/tokenizer.py")
    about = json.loads(path.read_text())["about"]
    assert about["kind"] == "tokenizer" and about["machine"]["cpu"] and len(about["commit"]) == 40
    assert path.name == f"tokenizer-{about['utc']}.json" and about["command"] == "python benchmarks/tokenizer.py"
    assert report.main(["--check", *args]) == 1  # the document has not caught up yet
    assert report.main(args) == 0
    doc = (tmp_path / "RESULTS.md").read_text()
    section = doc[doc.index("### Tokenizer throughput (a test double of a benchmark)"):]
    assert "Rows of one run." in section and "| tiny | 123457 |" in section.split("\n\n")[2]


def test_every_committed_results_file_describes_itself():
    files = results_mod.load_dir(report.RESULTS_DIR)
    assert len(files) >= 100
    for name, data in files.items():
        a = data["about"]
        assert name.startswith(a["kind"].replace("_", "-").split("-")[0]) or a["kind"] in ("fullsize", "sweep_cache")
        assert re.fullmatch(r"\d{8}T\d{6}Z", a["utc"]) and re.fullmatch(r"[0-9a-f]{40}", a["commit"]), name
        assert a["title"] and isinstance(a["machine"], dict), name


@pytest.mark.parametrize("damage", ["missing", "not json", "a field gone", "a speed file's field gone"])
def test_a_damaged_results_file_is_one_line_naming_it(tmp_path, capsys, damage):
    results, args = _copy_tree(tmp_path)
    name = ("sandbox-20261122T050819Z.json" if damage.startswith("a speed")
            else "fullsize-react-epyc-fp32-20261126.json")
    path = results / name
    if damage == "missing":
        path.unlink()
    elif damage == "not json":
        path.write_text(path.read_text()[:100])
    else:
        data = json.loads(path.read_text())
        if "runs" in data:
            del data["runs"][-1]["overall"]
        else:
            del data["about"]["kind"]
        path.write_text(json.dumps(data))
    assert report.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert name in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("marker", [report.HEADLINE_START, report.HEADLINE_END])
def test_readme_without_a_blocks_markers_is_one_line(tmp_path, capsys, marker):
    _, args = _copy_tree(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace(marker, ""))
    assert report.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert marker in err and len(err.splitlines()) == 1


def _stored_pairs():
    """(file, stored pairing, run prefix a, run prefix b) for every pairing benchmarks/fullsize.py recorded."""
    out = []
    for path in sorted(report.RESULTS_DIR.glob("fullsize-*.json")):
        data = json.loads(path.read_text())
        runs = data["runs"]
        for i, p in enumerate(data.get("paired", [])):  # each run against the file's first
            out.append((path.name, p, runs[i + 1]["run_id"][:8], runs[0]["run_id"][:8]))
        for p in data.get("paired_with_earlier", []):  # labels carry "(<run id prefix>[, file])"
            (a,), (b,) = (re.findall(r"\((\w{8})[,)]", p[k]) for k in ("a", "b"))
            out.append((path.name, p, a, b))
    return out


def test_paired_verdicts_equal_the_ones_recorded_in_the_files():
    runs = {}
    for sw in report.load_all(report.RESULTS_DIR)[1].values():
        for r in sw.runs:
            if r.outcomes is not None:
                runs[r.short] = r
    checked = 0
    for name, stored, a, b in _stored_pairs():
        if a not in runs or b not in runs:
            continue
        got = report.pair_runs(runs[a], runs[b]).result
        where = f"{name}: {stored['verdict']}"
        assert (got.only_a, got.only_b) == (stored["only_a"], stored["only_b"]), where
        assert round(got.diff, 4) == stored["diff"], where
        assert [round(got.low, 4), round(got.high, 4)] == stored["ci95"], where
        assert round(got.p_value, 6) == stored["p_value"], where
        checked += 1
    assert checked >= 50  # the files hold this many pairings between runs the report knows


def test_the_report_types_no_figure():
    """Figures come from the files: the module's own prose and labels hold no decimal number (commit hashes, model
    sizes in names and `iters=` settings are not results)."""
    src = (REPO / "flows" / "report.py").read_text()
    strings = re.findall(r'"([^"\n]*)"', src)
    figures = [s for s in strings if re.search(r"(?<![\w.{])\d+\.\d+(?![\w}])", s) and not re.search(r"\d\.\dB", s)]
    assert figures == []


def test_a_budget_cut_from_a_longer_run_agrees_with_the_run():
    """A pair may name a budget a sweep ran only inside a longer run: the cut keeps the outcomes up to that round and
    the cost up to it, so at the run's own budget it is the run, and at each budget its passes are the curve's."""
    for key in ("grid_k1", "grid_k2"):
        run = report.load_all(report.RESULTS_DIR)[1][key].last
        whole = run.cut(run.iters)
        assert whole.outcomes == run.outcomes and whole.by_round == run.by_round
        for k in ("prompt_tokens", "completion_tokens", "model_calls", "sandbox_runs"):
            assert whole.cost[k] == run.cost[k], (key, k)
        spent = []
        for b in range(run.iters + 1):
            cut = run.cut(b)
            assert cut.passed == sum(passed_at(v) for v in cut.outcomes.values()) == run.by_round[b]
            spent.append(cut.cost["completion_tokens"])
        assert spent == sorted(spent) and spent[0] < spent[-1]
    with pytest.raises(report.ReportError, match="cannot be cut"):
        report.load_all(report.RESULTS_DIR)[1]["default"].runs[0].cut(1)


def test_a_runs_read_backs_reach_the_document_from_its_record():
    """The same recorded answers under another rule (benchmarks/fullsize.py: handing the held answer in when the
    budget ends) are printed from the run's record, under the protocols table."""
    doc = (REPO / "docs" / "RESULTS.md").read_text()  # the generated one (the first test holds it equal)
    section = doc[doc.index("Read-backs:"):].replace("\n  ", " ")
    runs = [r for p in (REPO / "benchmarks" / "results").glob("fullsize-*.json")
            for r in json.loads(p.read_text()).get("runs", []) if "held_handed_in" in r.get("overfit_gap", {})]
    assert runs
    for r in runs:
        g = r["overfit_gap"]
        assert f"when the budget ends: {g['held_handed_in']['hidden_passed']}/{g['total']} (" in section
    assert report.readback_lines([]) == []


def test_the_document_opens_with_one_screen_the_frontier_table_the_picture_and_each_machine_once():
    doc = report.results_document(report.RESULTS_DIR)
    opening = doc[: doc.index("## Headline")]
    assert len(opening.splitlines()) <= 60  # one screen
    fr = report.frontier_of(report.RESULTS_DIR)
    for c in (c for c in fr.configs if c.on_token_frontier):
        assert f"| {c.label} | {c.pass_at_1:.3f} ({c.ci95[0]:.3f}-{c.ci95[1]:.3f}) |" in opening, c.label
    assert "![pass@1 against completion tokens per task](frontier.png)" in opening
    machines = opening.split("Machines of the full-size runs: ")[1].split(".\n\n")[0]
    names = [m.split(":")[0].strip() for m in " ".join(machines.split()).split("; ")]
    assert len(names) == len(set(names)) >= 2
    for m in " ".join(machines.split()).split("; "):
        head, _, rest = m.partition(": ")
        assert head != rest, m  # a machine named once, not "X: X"


def test_a_speed_table_keeps_the_newest_files_of_each_sort_so_a_run_of_one_part_hides_no_other():
    """Memory files of the conversion alone, newer than the job's, must not push the job's peak out of the table:
    each sort of file (the values of the table's first key its rows carry) keeps its newest ones, the rest counted."""
    def memory(utc: str, part: str, label: str) -> tuple[str, dict]:
        about = {"kind": "memory", "utc": utc, "title": "Peak memory", "text": "", "machine": {"cpu": "test double"},
                 "table": {"rows": "parts.*", "keys": ["part"], "columns": [["label", "$.label"], ["peak", "peak"]]}}
        return f"memory-{utc}-{label}.json", {"about": about, "label": label, "parts": {part: {"peak": 1.0}}}

    named = [memory(f"2026010{i}T000000Z", "job", f"job{i}") for i in range(1, 6)]
    named += [memory(f"2026020{i}T000000Z", "convert", f"convert{i}") for i in range(1, 5)]
    text = "\n".join(report.speed_kind("memory", named))
    shown = [f"job{i}" for i in (3, 4, 5)] + [f"convert{i}" for i in (2, 3, 4)]
    assert all(f"-{label}.json]" in text for label in shown), text
    assert not any(f"-{label}.json]" in text for label in ("job1", "job2", "convert1")), text
    assert "3 older files of this kind" in text
