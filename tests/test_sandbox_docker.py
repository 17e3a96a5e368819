"""Docker backend: HumanEvalFix verdicts, the container's limits seen from inside, the cgroup layers, config errors,
cleanup of closed and orphaned containers, the CLI. The attack suite runs on it too (test_sandbox_attacks.py)."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import job_settings
from docker_fixtures import docker_unavailable

from sandboxes import SandboxUnavailable, build_program, make_sandbox
from sandboxes.docker import DockerSandbox, docker_problem
from sandboxes.procs import processes_of_uids, sandbox_uids

REPO = Path(__file__).resolve().parent.parent
DATA = (REPO / ".." / "shared" / "data" / "humanevalfix_python.jsonl").resolve()
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"



@pytest.fixture(scope="module")
def docker_ok():
    why = docker_unavailable()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def sbx(docker_ok):
    cfg = job_settings("sandbox=docker").sandbox  # the config's own record (conf/sandbox/docker.yaml)
    s = make_sandbox(dataclasses.replace(cfg, workers=2, uid_base=64100))
    yield s
    s.close()


def containers(label: str = "fixlab.sandbox") -> list[str]:
    r = subprocess.run(["docker", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.split()


@pytest.mark.skipif(not DATA.exists(), reason=f"HumanEvalFix data not found at {DATA}")
def test_humanevalfix_canonical_pass_and_buggy_fail(sbx):
    """A slice of the 164 (the full run: benchmarks/sandbox.py and flows.evaluate sandbox=docker)."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    picked = [r for r in rows if r["task_id"] in {f"Python/{i}" for i in (0, 1, 2, 10, 32, 53, 99, 120, 145, 163)}]
    jobs = [(r["task_id"], kind, build_program(r["declaration"] + r[f"{kind}_solution"], r["test"]))
            for kind in ("canonical", "buggy") for r in picked]
    results = [sbx.run(p, 3.0) for _, _, p in jobs]
    got = {(tid, kind): r.status for (tid, kind, _), r in zip(jobs, results)}
    assert all(got[(r["task_id"], "canonical")] == "passed" for r in picked), got
    assert all(got[(r["task_id"], "buggy")] in ("failed", "timeout") for r in picked), got
    assert got[("Python/10", "buggy")] == "timeout"  # loops forever: stopped by the clock
    assert all(r.backend == "docker" for r in results)


# Per language, a hack of its own table (tests/test_lang_<lang>.py) that fools the reference by leaving early
EARLY_EXITS = {"cpp": "early exit", "js": "early exit (process.exit in the function)", "java": "early exit",
               "go": "early exit (os.Exit in the function)", "rust": "early exit"}


@pytest.mark.parametrize("name", sorted(EARLY_EXITS))
def test_each_compiled_language_runs_in_the_image_with_its_proof(sbx, name):
    """The image carries each toolchain and the host's prepared parts are mounted: a canonical solution passes, the
    buggy one fails, and an early exit fails as it does in the local jail (the full 164: docs/RESULTS.md)."""
    import importlib

    from lang_fixtures import by_id, run, solution
    from sandboxes.languages import language

    lang, row = language(name), by_id(name, 0)
    assert run(sbx, lang, solution(lang, row), row).status == "passed"
    assert run(sbx, lang, solution(lang, row, "buggy"), row).status == "failed"
    hack = importlib.import_module(f"test_lang_{name}").HACKS[EARLY_EXITS[name]]
    res = run(sbx, lang, hack, row)
    assert res.status == "failed" and res.backend == "docker", (res.status, res.stderr[-300:])


def test_result_fields_match_the_local_protocol(sbx):
    ok = sbx.run(build_program(RIGHT, "print('out'); import sys; print('err', file=sys.stderr)\n" + TEST), 10)
    assert (ok.status, ok.exit_code, ok.stdout, ok.stderr, ok.backend) == ("passed", 0, "out\n", "err\n", "docker")
    bad = sbx.run(build_program(WRONG, TEST), 10)
    assert (bad.status, bad.exit_code, bad.error_type) == ("failed", 1, "AssertionError")
    assert bad.failing_line == "assert candidate(2, 3) == 5"
    forged = sbx.run(build_program(WRONG, "print('passed')\nimport os\nos.write(3, b'x' * 32)\nos._exit(0)\n"), 10)
    assert forged.status == "failed" and forged.exit_code == 0 and "passed" in forged.stdout


def test_the_container_limits_seen_from_inside(sbx):
    code = textwrap.dedent("""
        import os, glob
        def read(*paths):
            for p in paths:
                try:
                    return open(p).read().strip()
                except OSError:
                    pass
        print(json.dumps({
            "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
            "net": sorted(os.listdir("/sys/class/net")),
            "memory": read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
            "pids": read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
            "cpu": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max"),
            "cwd": os.getcwd(), "hostname": os.uname().nodename,
        }))
        try:
            os.listdir("/run/fixlab")
            print("control dir readable")
        except OSError as e:
            print("control dir:", type(e).__name__)
    """)
    r = sbx.run("import json\n" + code, 10)
    assert r.status == "passed", r.stderr
    info = json.loads(r.stdout.splitlines()[0])
    assert info["uid"] == info["euid"] and info["uid"] in sandbox_uids(sbx) and info["groups"] == []
    assert info["net"] == ["lo"]  # --network none: loopback only
    assert int(info["memory"]) == sbx.container_memory_mb * 1024 * 1024 == (2048 + 256 + 256) * 1024 * 1024
    assert info["pids"] == "64"
    assert info["cpu"].split()[0] == "100000"  # --cpus 1: 100 ms of CPU per 100 ms period
    assert info["cwd"].startswith("/scratch/") and info["hostname"] == "sandbox"
    assert "control dir: PermissionError" in r.stdout


def test_cgroup_memory_limit_kills_what_the_address_space_limit_lets_through(docker_ok):
    s = DockerSandbox(workers=1, memory_mb=16384, container_memory_mb=400, uid_base=64200)
    try:
        r = s.run(build_program(RIGHT, "x = []\nwhile True:\n    x.append(' ' * 10 ** 7)\n"), 60)
        assert r.status == "failed" and r.details.get("signal") == "SIGKILL", r  # the OOM killer, not MemoryError
        assert s.run(build_program(RIGHT, TEST), 10).passed  # a fresh container took the worker's place
    finally:
        s.close()


def test_pids_limit_stops_a_fork_bomb_the_rlimit_lets_through(docker_ok):
    s = DockerSandbox(workers=1, allow_fork=True, max_processes=10000, pids_limit=24, uid_base=64300)
    code = textwrap.dedent("""
        import os, time
        n = 0
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
            except OSError as e:
                print("forks:", n, type(e).__name__, flush=True)
                break
        os._exit(0)
    """)
    try:
        r = s.run(build_program(WRONG, code), 30)
        assert r.status == "failed" and "forks:" in r.stdout, r
        assert int(r.stdout.split()[1]) < 24
        deadline = time.monotonic() + 10
        while processes_of_uids(sandbox_uids(s)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_of_uids(sandbox_uids(s)) == []  # the sleepers died with the program
        assert s.run(build_program(RIGHT, TEST), 10).passed
    finally:
        s.close()


def test_two_sandboxes_in_one_process_and_the_callers_niceness(docker_ok):
    a, b = DockerSandbox(workers=1, uid_base=64800), DockerSandbox(workers=1, uid_base=64900)
    try:
        prog = build_program(RIGHT, "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))\n" + TEST)
        ra, rb = a.run(prog, 30), b.run(prog, 30)
        assert ra.passed and rb.passed, (ra, rb)
        # dockerd starts containers at niceness 0: programs keep the caller's (`nice -n 19 python -m ...`)
        assert int(ra.stdout) == int(rb.stdout) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        a.close()
        b.close()


def test_fresh_mode_runs_a_container_per_program(docker_ok):
    s = DockerSandbox(mode="fresh", workers=1, uid_base=64400)
    try:
        assert s.run(build_program(RIGHT, TEST), 30).status == "passed"
        assert s.run(build_program(WRONG, TEST), 30).status == "failed"
        r = s.run(build_program(RIGHT, "import sys\nsys.exit(0)\n" + TEST), 30)
        assert r.status == "failed" and r.details["worker_runs"] == 0  # a new container each time
    finally:
        s.close()


@pytest.mark.parametrize("cfg,msg", [
    ({"wrkers": 2}, "unknown docker sandbox option"),
    ({"cpus": 0}, "cpus must be a positive number"),
    ({"pids_limit": 2}, "pids_limit must be an integer of at least 8"),
    ({"mode": "spawn"}, "mode must be 'fork' or 'fresh'"),
    ({"docker": "/nonexistent/docker"}, "docker CLI ('/nonexistent/docker') is not installed: `make setup`"),
])
def test_bad_config_is_a_one_line_error(cfg, msg):
    with pytest.raises(SandboxUnavailable, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
        DockerSandbox(**cfg)
    assert "\n" not in str(e.value)


def test_missing_image_and_daemon_name_the_fix(docker_ok, monkeypatch):
    with pytest.raises(SandboxUnavailable, match="image 'fixlab-sandbox:no-such-tag' not found: build it with "
                                                 "`make docker-image`") as e:
        DockerSandbox(image="fixlab-sandbox:no-such-tag")
    assert "\n" not in str(e.value)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    why = docker_problem()
    assert why is not None and "daemon is not reachable" in why and "dockerd" in why and "\n" not in why


def test_close_exit_and_a_killed_owner_leave_no_container(docker_ok, tmp_path):
    s = DockerSandbox(workers=2, uid_base=64500)
    s.warm_up()
    names = [w.name for w in s._idle]
    assert set(names) <= set(containers())
    s.close()
    assert not set(names) & set(containers())
    with pytest.raises(SandboxUnavailable, match="closed"):
        s.run("print(1)", 5)

    # An owner killed while a program sleeps: its worker waits on the program, so the container stays up
    # until the next sandbox on this machine removes it; idle containers end when their socket closes.
    script = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(REPO)!r})
        from sandboxes.docker import DockerSandbox
        s = DockerSandbox(workers=2, uid_base=64600)
        s.warm_up()
        print(*[w.name for w in s._idle], flush=True)
        threading.Thread(target=s.run, args=("import time\\ntime.sleep(600)", 900), daemon=True).start()
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    owner_dirs = lambda: glob.glob(os.path.join(tempfile.gettempdir(), f"fixlab-docker-{owner.pid}-*"))  # noqa: E731
    try:
        names = owner.stdout.readline().split()
        assert len(names) == 2
        time.sleep(2.0)  # the program is asleep in one container
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    deadline = time.monotonic() + 20
    while len(set(names) & set(containers())) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(set(names) & set(containers())) == 1  # the idle one ended by itself, the busy one is stuck
    assert len(owner_dirs()) == 2  # their socket directories
    DockerSandbox(workers=1, uid_base=64700).close()  # removes what dead owners left
    assert not set(names) & set(containers()) and owner_dirs() == []
    assert processes_of_uids(range(64600, 64602)) == []


def test_cli_docker_backend(docker_ok, tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(build_program(RIGHT, TEST))
    bad.write_text(build_program(WRONG, TEST))
    cmd = [sys.executable, "-m", "sandboxes", "run", "--backend", "docker"]
    r = subprocess.run(cmd + [str(good)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["backend"] == "docker", r.stderr
    r = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 1 and json.loads(r.stdout)["error_type"] == "AssertionError"


def test_first_use_builds_the_missing_default_image_once(monkeypatch):
    """A fresh machine after `make setup`: the first sandbox=docker job runs sandboxes/image/build.sh (which starts
    dockerd and builds the image) instead of stopping; another image name is the user's to build."""
    import subprocess

    import sandboxes.docker as sd

    state = {"built": False, "calls": []}
    monkeypatch.setattr(sd, "docker_problem", lambda docker="docker", image=sd.DEFAULT_IMAGE: None if state["built"]
                        else f"sandbox=docker: image {image!r} not found: build it with `make docker-image`")

    def fake_run(cmd, env=None, **kw):
        state["calls"].append((cmd, env.get("IMAGE")))
        state["built"] = True
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(sd.subprocess, "run", fake_run)
    assert sd.build_once("docker", sd.DEFAULT_IMAGE) is None
    assert sd.build_once("docker", sd.DEFAULT_IMAGE) is None  # already there: no second build
    assert len(state["calls"]) == 1 and state["calls"][0][0][-1].endswith("sandboxes/image/build.sh")
    assert state["calls"][0][1] == sd.DEFAULT_IMAGE
    state["built"] = False
    with pytest.raises(SandboxUnavailable, match="not found: build it"):
        sd.DockerSandbox(image="someone-else:tag")
    assert len(state["calls"]) == 1
