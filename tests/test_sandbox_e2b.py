"""E2B backend through the real SDK request path.

E2B_DEBUG=true makes e2b-code-interpreter talk to a code-interpreter at localhost:49999. The fake server
below speaks its /execute protocol (JSON lines: stdout, stderr, result, error) and executes each cell for
real, inside the local jailed sandbox, the way a Jupyter kernel would (the last expression is the result).
"""
from __future__ import annotations

import ast
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandboxes import SandboxUnavailable, build_program, make_sandbox
from sandboxes.config import E2BSandboxConf
from sandboxes.e2b import E2BSandbox
from sandboxes.local import LocalSandbox, probe_bwrap

PORT = 49999
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"
MARK = "@@cell-result@@"


def cell_to_program(code: str) -> str:
    """Like a kernel: run the cell, print the repr of its last expression on a marked line."""
    tree = ast.parse(code)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
        tree.body.append(ast.parse(f"print({MARK!r} + repr(__last__))").body[0])
        tree.body.insert(len(tree.body) - 1, ast.Assign(targets=[ast.Name("__last__", ast.Store())],
                                                        value=last.value, lineno=0))
    return ast.unparse(ast.fix_missing_locations(tree))


class FakeInterpreter(BaseHTTPRequestHandler):
    kernel: LocalSandbox = None
    requests: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        if self.path != "/execute":
            self.send_error(404, "not found")
            return
        res = self.kernel.run(cell_to_program(body["code"]), 120)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        now = time.time()
        lines = []
        for line in res.stdout.splitlines(keepends=True):
            if line.startswith(MARK):
                lines.append({"type": "result", "text": line[len(MARK):].rstrip("\n"), "is_main_result": True})
            else:
                lines.append({"type": "stdout", "text": line, "timestamp": now})
        if res.status != "passed":
            lines.append({"type": "error", "name": res.error_type or res.status, "value": res.failing_line or "",
                          "traceback": res.stderr})
        lines.append({"type": "end_of_execution"})
        for obj in lines:
            try:
                self.wfile.write((json.dumps(obj) + "\n").encode())
                self.wfile.flush()
            except OSError:  # the client gave up (SDK timeout)
                return


@pytest.fixture(scope="module")
def fake_e2b():
    if probe_bwrap() is not None:
        pytest.skip(f"the fake code-interpreter runs cells in the local jail: {probe_bwrap()}")
    try:
        server = ThreadingHTTPServer(("127.0.0.1", PORT), FakeInterpreter)
    except OSError as e:
        pytest.skip(f"port {PORT} (the SDK's debug endpoint) is busy: {e}")
    FakeInterpreter.kernel = LocalSandbox(workers=2, allow_fork=True, uid_base=62400,
                                         output_cap_bytes=4 << 20)  # a kernel streams all it prints
    FakeInterpreter.requests = []
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    old = {k: os.environ.get(k) for k in ("E2B_DEBUG", "E2B_API_KEY")}
    os.environ["E2B_DEBUG"] = "true"
    os.environ.pop("E2B_API_KEY", None)
    sbx = make_sandbox(E2BSandboxConf(timeout_s=10, timeout_margin_s=30))
    yield sbx
    sbx.close()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.shutdown()
    server.server_close()
    FakeInterpreter.kernel.close()


def test_missing_api_key_is_a_one_line_error(monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    with pytest.raises(SandboxUnavailable) as e:
        make_sandbox(E2BSandboxConf(timeout_s=10))
    msg = str(e.value)
    assert "E2B_API_KEY" in msg and "export" in msg and "\n" not in msg


def test_unknown_option_is_refused(monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "e2b_test")
    with pytest.raises(SandboxUnavailable, match="unknown e2b sandbox option"):
        E2BSandbox(worker=3)


def test_pass_and_fail_through_the_sdk(fake_e2b):
    ok = fake_e2b.run(build_program(RIGHT, "print('hello')\n" + TEST), 10)
    assert ok.status == "passed", ok
    assert ok.backend == "e2b" and "hello" in ok.stdout and "@@fixlab-proof" not in ok.stdout
    bad = fake_e2b.run(build_program(WRONG, TEST), 10)
    assert bad.status == "failed", bad.stderr
    assert bad.error_type == "AssertionError" and bad.failing_line == "assert candidate(2, 3) == 5"
    paths = [p for p, _ in FakeInterpreter.requests]
    assert paths.count("/execute") >= 2
    assert all(b["code"].count("__fixlab_run(") == 2 for p, b in FakeInterpreter.requests if p == "/execute")


def test_fake_pass_attempts_remotely(fake_e2b):
    forged = ("import sys\nprint('\\n@@fixlab-proof:' + '0' * 64)\nsys.exit(0)\n")
    r = fake_e2b.run(build_program(WRONG + forged, TEST), 10)
    assert r.status == "failed" and r.exit_code == 0
    r = fake_e2b.run(build_program(WRONG + "import os\nos.write(3, b'x' * 200)\nos._exit(0)\n", TEST), 10)
    assert r.status == "failed"


def test_timeout_in_the_runner(fake_e2b):
    r = fake_e2b.run(build_program(RIGHT + "while True:\n    pass\n", TEST), 2)
    assert r.status == "timeout" and r.details["timeout_s"] == 2


def test_timeout_mapped_onto_the_sdk(fake_e2b, monkeypatch):
    # SDK deadline shorter than the runner's: the SDK's own timeout fires and the sandbox is replaced
    monkeypatch.setattr(fake_e2b, "timeout_margin_s", -2.0)
    r = fake_e2b.run(build_program(RIGHT + "while True:\n    pass\n", TEST), 3)
    assert r.status == "timeout" and "e2b:" in r.stderr
    assert getattr(fake_e2b._local, "sbx", None) is None  # dropped, a new one is made next time
    monkeypatch.undo()
    assert fake_e2b.run(build_program(RIGHT, TEST), 10).status == "passed"


def test_output_is_capped(fake_e2b):
    r = fake_e2b.run(build_program(WRONG + "print('y' * 300000)\n", TEST), 10)
    assert r.status == "failed" and r.stdout_truncated and "output cut" in r.stdout
    assert len(r.stdout) < 70 * 1024


def test_one_remote_sandbox_per_thread(fake_e2b):
    ids = []

    def work():
        for _ in range(2):
            assert fake_e2b.run(build_program(RIGHT, TEST), 10).status == "passed"
            ids.append(id(fake_e2b._local.sbx))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 4 and len(set(ids)) == 2  # reused within a thread, one per thread


@pytest.mark.skipif(not os.environ.get("E2B_API_KEY"), reason="live E2B test: set E2B_API_KEY to run it")
def test_live_e2b(monkeypatch):
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    sbx = make_sandbox(E2BSandboxConf())
    try:
        assert sbx.run(build_program(RIGHT, TEST), 30).status == "passed"
        bad = sbx.run(build_program(WRONG, TEST), 30)
        assert bad.status == "failed" and bad.error_type == "AssertionError"
        assert sbx.run(build_program(RIGHT + "while True:\n    pass\n", TEST), 3).status == "timeout"
    finally:
        sbx.close()
