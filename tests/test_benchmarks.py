"""Benchmarks that compare this tree with other git revisions. benchmarks/weights.py rows at another revision
(NAME@REV): a bad revision or a row that fails there is one line, and the temporary worktree is gone afterwards (a
stale worktree would block the next `git worktree add`). benchmarks/attention.py: this tree's decode attention
kernel against a commit's, each checked against exact attention; a bad revision is one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, needs_data


def worktrees() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "worktree", "list", "--porcelain"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.startswith("worktree ")]


def weights(*rows: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "weights.py"), "--rows", ",".join(rows),
                           "--batches", "1", "--out", "/dev/null"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@needs_data
def test_a_row_at_a_revision_that_is_not_a_commit_is_one_line():
    before = worktrees()
    done = weights("int8@not-a-commit-anywhere")
    assert done.returncode != 0
    assert done.stderr.strip() == ("error: row int8@not-a-commit-anywhere: 'not-a-commit-anywhere' is not a commit "
                                   "of this repository (git log shows them)")
    assert worktrees() == before


@needs_data
def test_a_row_that_fails_at_its_revision_is_one_line_and_leaves_no_worktree():
    before = worktrees()
    done = weights("no-such-row@HEAD")
    assert done.returncode != 0
    err = done.stderr.strip()
    assert err.startswith("error: row no-such-row@HEAD failed at that revision: error: unknown row 'no-such-row'")
    assert "\n" not in err
    assert worktrees() == before


def attention(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "attention.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the compiled kernels need gcc")
def test_attention_times_this_tree_against_a_commit_and_checks_both_against_exact(tmp_path):
    out = tmp_path / "attention.json"
    done = attention("--against", "HEAD", "--rows", "3", "--context", "40", "--queries", "2", "--reps", "1",
                     "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["kernels"] for r in rows] == ["this tree", "HEAD"]
    assert all(r["ms_per_step"] > 0 and r["max_abs_diff_vs_exact"] < 1e-5 for r in rows)
    bad = attention("--against", "not-a-commit-anywhere", "--rows", "2", "--context", "20", "--reps", "1",
                    "--out", str(tmp_path / "bad.json"))
    assert bad.returncode != 0 and "\n" not in bad.stderr.strip()
    assert bad.stderr.strip().startswith("error: --against not-a-commit-anywhere:")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the compiled kernels need gcc")
def test_int8_kernel_times_this_tree_against_a_commit_and_checks_the_bits(tmp_path):
    out = tmp_path / "int8.json"
    run = [sys.executable, str(REPO / "benchmarks" / "int8_matmul.py"), "--layers", "1", "--reps", "1"]
    done = subprocess.run([*run, "--against", "HEAD", "--rows", "3", "9", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rows"], r["kernels"]) for r in rows] == [(3, "this tree"), (3, "HEAD"), (9, "this tree"), (9, "HEAD")]
    assert all(r["equal"] and r["ms_per_step"] > 0 for r in rows)  # HEAD's kernel gives this tree's bits
    bad = subprocess.run([*run, "--against", "not-a-commit-anywhere", "--rows", "2", "--out", str(tmp_path / "b.json")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "\n" not in bad.stderr.strip()
    assert bad.stderr.strip().startswith("error: --against not-a-commit-anywhere:")
