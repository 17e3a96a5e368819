"""benchmarks/weights.py rows at another git revision (NAME@REV): a bad revision or a row that fails there is one
line, and the temporary worktree is gone afterwards (a stale worktree would block the next `git worktree add`)."""
from __future__ import annotations

import subprocess
import sys

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
