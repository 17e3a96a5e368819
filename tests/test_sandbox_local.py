"""Local backend: verdicts on HumanEvalFix, result fields, concurrency, config errors, fallback, cleanup, CLI."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import sandboxes.local as local_mod
from sandboxes import ExecResult, SandboxConf, SandboxUnavailable, build_program, make_sandbox
from sandboxes.local import LocalSandbox, probe_bwrap
from sandboxes.procs import processes_of_uids, sandbox_uids
from conftest import job_settings

REPO = Path(__file__).resolve().parent.parent
DATA = (REPO / ".." / "shared" / "data" / "humanevalfix_python.jsonl").resolve()
LOOPING = {"Python/10", "Python/156", "Python/160"}
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"

jailed = pytest.mark.skipif(probe_bwrap() is not None, reason=f"bubblewrap jail unavailable: {probe_bwrap()}")


@pytest.fixture(scope="module")
def sbx():
    s = LocalSandbox(workers=2, uid_base=62500)
    yield s
    s.close()


@pytest.mark.skipif(not DATA.exists(), reason=f"HumanEvalFix data not found at {DATA}")
def test_humanevalfix_canonical_pass_and_buggy_fail(sbx):
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert len(rows) == 164
    jobs = [(r["task_id"], kind, build_program(r["declaration"] + r[f"{kind}_solution"], r["test"]))
            for kind in ("canonical", "buggy") for r in rows]
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda j: sbx.run(j[2], 3.0), jobs))
    wrong = [(tid, kind, r.status, r.stderr[-300:]) for (tid, kind, _), r in zip(jobs, results)
             if (r.status == "passed") != (kind == "canonical")]
    assert wrong == []
    timeouts = {tid for (tid, kind, _), r in zip(jobs, results) if r.status == "timeout"}
    assert timeouts == LOOPING
    assert all(r.status in ("failed", "timeout") for (_, kind, _), r in zip(jobs, results) if kind == "buggy")
    assert sum(r.error_type == "AssertionError" for r in results) >= 150


def test_result_fields(sbx):
    ok = sbx.run(build_program(RIGHT, "print('out'); import sys; print('err', file=sys.stderr)\n" + TEST), 10)
    assert ok == ExecResult.from_dict(ok.to_dict())
    assert (ok.status, ok.exit_code, ok.stdout, ok.stderr, ok.failing_line, ok.error_type) == \
        ("passed", 0, "out\n", "err\n", None, None)
    assert ok.passed and ok.backend == "local" and ok.duration_s > 0
    bad = sbx.run(build_program(WRONG, TEST), 10)
    assert (bad.status, bad.exit_code, bad.error_type) == ("failed", 1, "AssertionError")
    assert bad.failing_line == "assert candidate(2, 3) == 5"
    name = sbx.run(build_program("def add(a, b):\n    return a + c\n", TEST), 10)
    assert name.error_type == "NameError" and name.failing_line == "return a + c"
    syn = sbx.run(build_program("def add(a, b)\n    return a + b\n", TEST), 10)
    assert syn.status == "failed" and syn.error_type == "SyntaxError"
    assert syn.failing_line == "def add(a, b)"  # a SyntaxError's frame has no `in func`: still read


def test_stderr_is_capped_with_a_note(sbx):
    r = sbx.run(build_program(WRONG + "import sys\nsys.stderr.write('e' * 200000)\n", TEST), 10)
    assert r.status == "failed" and r.stderr_truncated and not r.stdout_truncated
    assert r.stderr.startswith("[... output cut") and len(r.stderr) < 66 * 1024
    assert r.error_type == "AssertionError"  # the traceback at the end is kept


def test_bad_arguments_are_clear_errors(sbx):
    with pytest.raises(TypeError, match="program must be Python source or a Program"):
        sbx.run(b"print(1)", 5)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        sbx.run("print(1)", 0)


@pytest.mark.parametrize("cfg,msg", [
    ({"workers": 0}, "workers must be a positive integer"),
    ({"mode": "spawn"}, "mode must be 'fork' or 'fresh'"),
    ({"memory_mb": -1}, "memory_mb must be a positive number"),
    ({"wrkers": 2}, "unknown local sandbox option"),
])
def test_bad_config_is_a_one_line_error(cfg, msg):
    with pytest.raises(SandboxUnavailable, match=msg) as e:
        LocalSandbox(**cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(SandboxUnavailable, match="unknown sandbox backend 'podman'"):
        make_sandbox(SandboxConf(backend="podman"))


def test_conf_files_build_sandboxes(monkeypatch):
    cfg = job_settings("sandbox=local").sandbox
    s = make_sandbox(cfg)
    try:
        assert isinstance(s, LocalSandbox) and s.mode == "fork"
        assert s.run(build_program(RIGHT, TEST), cfg.timeout_s).passed
    finally:
        s.close()
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    with pytest.raises(SandboxUnavailable, match="E2B_API_KEY"):
        make_sandbox(job_settings("sandbox=e2b").sandbox)


@jailed
def test_concurrent_runs_from_many_threads(sbx):
    def one(i):
        r = sbx.run(build_program(RIGHT, f"print({i})\n" + TEST), 20)
        return r.status, r.stdout

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(one, range(40)))
    assert got == [("passed", f"{i}\n") for i in range(40)]


@jailed
def test_fresh_mode_same_verdicts():
    s = LocalSandbox(mode="fresh", workers=1, uid_base=62600)
    try:
        assert s.run(build_program(RIGHT, TEST), 10).status == "passed"
        assert s.run(build_program(WRONG, TEST), 10).status == "failed"
        assert s.run(build_program(RIGHT, "import sys\nsys.exit(0)\n" + TEST), 10).status == "failed"
    finally:
        s.close()
    assert processes_of_uids(sandbox_uids(s)) == []


def test_missing_bwrap_with_require_isolation_refuses(monkeypatch):
    with pytest.raises(SandboxUnavailable, match="isolation required but unavailable") as e:
        LocalSandbox(bwrap="/nonexistent/bwrap", require_isolation=True)
    assert "\n" not in str(e.value) and "bubblewrap" in str(e.value)


def test_fallback_without_bwrap_warns_once_and_still_judges(monkeypatch, caplog):
    monkeypatch.setattr(local_mod, "_warned", False)
    caplog.set_level(logging.WARNING, logger="sandboxes.local")
    s1 = LocalSandbox(bwrap="/nonexistent/bwrap", workers=1, uid_base=62700)
    s2 = LocalSandbox(bwrap="/nonexistent/bwrap", workers=1, uid_base=62700)
    try:
        assert not s1.isolated
        assert [r.message for r in caplog.records].count(
            caplog.records[0].message) == 1 and "rlimits only" in caplog.records[0].message
        assert s1.run(build_program(RIGHT, TEST), 10).status == "passed"
        assert s1.run(build_program(WRONG, TEST), 10).status == "failed"
        assert s1.run(build_program(RIGHT, "import os\nos._exit(0)\n" + TEST), 10).status == "failed"
        assert s1.run(build_program(RIGHT, "while True:\n    pass\n"), 2).status == "timeout"
        env = s1.run(build_program(RIGHT, "import os\nprint(sorted(os.environ))\n" + TEST), 10)
        assert env.passed and "E2B" not in env.stdout and "PYTEST" not in env.stdout
    finally:
        s1.close()
        s2.close()
    assert processes_of_uids(sandbox_uids(s1)) == []


@jailed
def test_close_and_interpreter_exit_leave_no_worker(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from sandboxes.local import LocalSandbox
        from sandboxes import build_program
        s = LocalSandbox(workers=2, uid_base=62800)
        r = s.run(build_program({RIGHT!r}, "import time\\n" + {TEST!r}), 10)
        print(r.status, *[w.proc.pid for w in s._idle])
        # no close(): the atexit hook must stop the workers
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    status, *pids = out.stdout.split()
    assert status == "passed" and pids, out.stderr
    alive = [p for p in map(int, pids) if os.path.exists(f"/proc/{p}") and
             not open(f"/proc/{p}/status").read().count("State:\tZ")]
    assert alive == []
    assert processes_of_uids(range(62800, 62802)) == []

    s = LocalSandbox(workers=2, uid_base=62900)
    s.warm_up()
    pids = [w.proc.pid for w in s._idle]
    s.close()
    assert all(not os.path.exists(f"/proc/{p}") for p in pids)
    with pytest.raises(SandboxUnavailable, match="closed"):
        s.run("print(1)", 5)


def test_cli(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(build_program(RIGHT, TEST))
    bad.write_text(build_program(WRONG, TEST))
    env = {k: v for k, v in os.environ.items()}
    cmd = [sys.executable, "-m", "sandboxes", "run"]
    r = subprocess.run(cmd + [str(good), "--timeout", "5"], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["status"] == "passed" and len(r.stdout.strip().splitlines()) == 1
    r = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode == 1 and json.loads(r.stdout)["error_type"] == "AssertionError"
    r = subprocess.run(cmd + [str(tmp_path / "missing.py")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot read" in r.stderr
    env.pop("E2B_API_KEY", None)
    env.pop("E2B_DEBUG", None)
    r = subprocess.run(cmd + [str(good), "--backend", "e2b"], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=60)
    assert r.returncode == 2 and "E2B_API_KEY" in r.stderr and r.stderr.count("\n") == 1


LEGIT = {
    "namedtuple": "from collections import namedtuple\nP = namedtuple('P', 'x y')\nassert P(1, 2).x == 1",
    "NamedTuple": "from typing import NamedTuple\nclass P(NamedTuple):\n    x: int\nassert P(1).x == 1",
    "dataclass": "from dataclasses import dataclass\n@dataclass\nclass A:\n    x: int = 1\nassert A().x == 1",
    "enum": "from enum import Enum\nclass C(Enum):\n    A = 1\nE = Enum('E', 'X Y')\nassert C.A.value == E.X.value == 1",
    "deep recursion": "import sys\nsys.setrecursionlimit(20000)\ndef d(n):\n    return 0 if n == 0 else 1 + d(n - 1)\n"
                      "assert d(15000) == 15000",
    "new imports": "import fractions, decimal, random, bisect, json, textwrap\n"
                   "assert fractions.Fraction(1, 2) * 2 == 1\nrandom.seed(1)\nrandom.random()",
    "strptime": "import datetime\nassert datetime.datetime.strptime('2020-01-02', '%Y-%m-%d').day == 2",
    "numpy": "import numpy as np\nassert np.allclose(np.linalg.inv(np.eye(3)), np.eye(3))",
    "warnings": "import warnings\nwarnings.warn('x')",
    "scratch files": "import tempfile\nwith tempfile.NamedTemporaryFile('w', delete=False) as f:\n    f.write('x')\n"
                     "assert open(f.name).read() == 'x'",
    "traceback text": "import traceback\ntry:\n    1 / 0\nexcept Exception as e:\n"
                      "    assert 'ZeroDivision' in ''.join(traceback.format_exception_only(type(e), e))",
}


@jailed
@pytest.mark.parametrize("name", list(LEGIT))
def test_legitimate_idioms_pass_under_the_defences(sbx, name):
    r = sbx.run(LEGIT[name], 20)
    assert r.status == "passed", r.stderr


def test_the_jail_preloads_every_module_of_the_import_helper():
    """The jail is stdlib-only and cannot import sandboxes.program, so it names the helper's modules itself; a module
    the helper gains must be preloaded (and guarded) there too, or programs start cold and may rebind it unseen."""
    import ast

    from sandboxes.program import IMPORT_HELPER

    def modules(tree):
        return {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names} | \
            {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}

    jail = modules(ast.parse((Path(local_mod.__file__).parent / "_jail.py").read_text()))
    assert modules(ast.parse(IMPORT_HELPER)) <= jail


def test_a_run_step_still_going_after_ten_seconds_yields_the_cpu_but_keeps_its_time_limit(sbx):
    """A compiled language's limits are the reference's (rust 300 s): a loop past them held a core the model needed.
    After 10 s a run step's processes get niceness 19 (sandboxes/_jail.py) and its session's autogroup nice 19
    (sandboxes/procs.py: each session gets an equal CPU share whatever its processes' nice), and it runs to its end."""
    from sandboxes.languages.base import Program, Step

    step = Step("run", ("/bin/sh", "-c", "nice; sleep 13; nice"), 20.0, processes=4)  # nice prints its niceness
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(sbx.run, Program("cpp", (("x", ""),), (step,), "x"), 20)
        import time

        time.sleep(12)
        groups = []
        for pid, _, cmd in processes_of_uids(sandbox_uids(sbx)):
            if cmd.startswith("sleep"):
                with open(f"/proc/{pid}/autogroup") as f:
                    groups.append(f.read().split()[-1])
        res = running.result()
    nice = [int(x) for x in res.stdout.split()]
    assert len(nice) == 2 and nice[1] == 19 and nice[0] < 19, res.stdout + res.stderr
    if os.path.exists("/proc/sys/kernel/sched_autogroup_enabled"):
        assert groups == ["19"], groups
    assert res.status != "timeout" and res.duration_s > 13
