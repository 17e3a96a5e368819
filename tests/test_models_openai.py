"""OpenAI-compatible backend against a real `transformers serve` on 127.0.0.1 (tiny random model), plus the
retry/backoff/key-rotation paths against a small local HTTP server."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agents.models.base import GenRequest, ModelUnavailable  # noqa: E402
from agents.models.config import OpenAIModelConf, TransformersModelConf  # noqa: E402
from agents.models.openai_backend import OpenAIError, OpenAIModel, OpenAIUnreachable  # noqa: E402
from conftest import REPO, free_port, job_settings  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_models import make_random_model, tiny_qwen2

    return make_random_model(tiny_qwen2(), tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    """`transformers serve` (OpenAI-compatible) preloading the tiny model."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cli = Path(sys.executable).with_name("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    with open(log, "w") as fh:
        proc = subprocess.Popen([str(cli), "serve", str(tiny_dir), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"transformers serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def bug(k: int = 1) -> list[dict]:
    return [{"role": "user", "content": "def add(a, b):\n    return a - b\n" * k}]


def test_real_server_matches_local_greedy(server, tiny_dir):
    from serving.hf import TransformersModel

    local = TransformersModel(TransformersModelConf(name="tiny", path=str(tiny_dir), batching=False, dtype="float32"))
    remote = OpenAIModel(OpenAIModelConf(name="tiny-remote", base_url=server + "/v1", model=str(tiny_dir),
                                         max_concurrency=2))
    try:
        reqs = [GenRequest(messages=bug(k), max_new_tokens=10) for k in (1, 2, 3)]
        want = [local.generate(r) for r in reqs]
        out: list = [None] * 3
        ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, remote.generate(reqs[i]))) for i in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        for w, g in zip(want, out):
            assert g is not None
            # the server strips surrounding whitespace of the reply; tokens are the same
            assert g.text.strip() == w.text.strip() and g.text.strip()
            assert g.prompt_tokens == w.prompt_tokens and g.completion_tokens == w.completion_tokens
            assert g.finish_reason == w.finish_reason
        assert remote.stats["retries"] == 0
    finally:
        remote.close()
        local.close()


# ---- retries against a scripted local server ---------------------------------------------------------------------
class Script:
    def __init__(self, replies):
        self.replies = list(replies)
        self.seen: list[dict] = []


@pytest.fixture
def scripted():
    state = {"script": None}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            sc = state["script"]
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            sc.seen.append({"auth": self.headers.get("Authorization"), "body": body, "path": self.path})
            status, headers, payload, delay = sc.replies.pop(0) if len(sc.replies) > 1 else sc.replies[0]
            time.sleep(delay)
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client timed out and went away

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def use(replies):
        state["script"] = Script(replies)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1", state["script"]

    yield use
    srv.shutdown()


OK = {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": "{\"code\": \"x\"}"}}]}}],
    "usage": {"prompt_tokens": 31, "completion_tokens": 7}}
TOOLS = ({"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}},)


def test_retries_429_and_5xx_rotating_keys(scripted, monkeypatch):
    monkeypatch.setenv("API_KEYS", "k1, k2")
    url, sc = scripted([(429, {"Retry-After": "0"}, {"error": {"message": "rate limited"}}, 0),
                        (503, {}, {"error": "busy"}, 0), (200, {}, OK, 0)])
    m = OpenAIModel(OpenAIModelConf(name="x", base_url=url, model="m", backoff_s=0.2))
    t0 = time.perf_counter()
    g = m.generate(GenRequest(messages=bug(), max_new_tokens=5, seed=3, stop=("a", "b", "c", "d", "e"), tools=TOOLS))
    dt = time.perf_counter() - t0
    assert [s["auth"] for s in sc.seen] == ["Bearer k1", "Bearer k2", "Bearer k1"]
    assert dt >= 0.2  # 429 honoured Retry-After: 0; the 503 waited backoff_s * 2 * jitter(0.5..1)
    assert m.stats["retries"] == 2
    b = sc.seen[0]["body"]
    assert b["tools"] == list(TOOLS) and b["seed"] == 3 and b["stop"] == ["a", "b", "c", "d"] and b["max_tokens"] == 5
    assert sc.seen[0]["path"] == "/v1/chat/completions"
    assert g.text == "" and g.tool_calls[0]["function"]["name"] == "run_tests"
    assert (g.prompt_tokens, g.completion_tokens) == (31, 7)


def test_client_errors_fail_at_once_and_retries_are_bounded(scripted, monkeypatch):
    monkeypatch.delenv("API_KEYS", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "solo")
    url, sc = scripted([(400, {}, {"error": {"message": "model 'm' does not exist"}}, 0)])
    m = OpenAIModel(OpenAIModelConf(name="x", base_url=url, model="m", backoff_s=0.01))
    with pytest.raises(OpenAIError, match="HTTP 400: model 'm' does not exist"):
        m.generate(GenRequest(messages=bug()))
    assert len(sc.seen) == 1 and sc.seen[0]["auth"] == "Bearer solo"
    url, sc = scripted([(500, {}, {"error": "boom"}, 0)])
    m = OpenAIModel(OpenAIModelConf(name="x", base_url=url, model="m", backoff_s=0.01, max_retries=2))
    with pytest.raises(OpenAIError, match="after 3 attempts .*HTTP 500: boom"):
        m.generate(GenRequest(messages=bug()))
    assert len(sc.seen) == 3


def test_a_refused_first_call_fails_at_once_and_a_server_that_answered_once_is_retried(scripted):
    """Nothing listening where no call of this model ever got through: one line at once (retrying only delays it).
    A server that answered before and then refuses (a restart) is retried as any transport error."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = OpenAIModel(OpenAIModelConf(name="x", base_url=f"http://127.0.0.1:{port}/v1", model="m", backoff_s=0.5,
                                    max_retries=6))
    t0 = time.monotonic()
    with pytest.raises(OpenAIUnreachable, match=r"refused the connection: is the server up\? \(start it, or "
                                                  r"fix model.base_url\)"):
        m.generate(GenRequest(messages=bug()))
    assert time.monotonic() - t0 < 2 and m.stats["retries"] == 0
    url, sc = scripted([(200, {}, OK, 0)])
    m = OpenAIModel(OpenAIModelConf(name="x", base_url=url, model="m", backoff_s=0.01, max_retries=2))
    m.generate(GenRequest(messages=bug()))
    m.base_url = f"http://127.0.0.1:{port}/v1"  # the same model, its server gone since
    with pytest.raises(OpenAIUnreachable, match="after 3 attempts"):
        m.generate(GenRequest(messages=bug()))
    assert m.stats["retries"] == 2


def test_timeout_is_retried(scripted):
    url, sc = scripted([(200, {}, OK, 1.5), (200, {}, OK, 0)])
    m = OpenAIModel(OpenAIModelConf(name="x", base_url=url, model="m", backoff_s=0.01, timeout_s=0.5))
    g = m.generate(GenRequest(messages=bug()))
    assert g.completion_tokens == 7 and len(sc.seen) == 2 and m.stats["retries"] == 1


def test_a_servers_reasoning_content_and_its_token_count_come_apart_from_the_answer(scripted):
    """vLLM's and SGLang's reasoning parsers put the thinking in `reasoning_content` and count its tokens in
    usage.completion_tokens_details: both are kept, and the answer is the content alone."""
    reply = {"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "```python\nx\n```",
                                                               "reasoning_content": "first, the loop"}}],
             "usage": {"prompt_tokens": 9, "completion_tokens": 20, "completion_tokens_details": {"reasoning_tokens": 12}}}
    url, _ = scripted([(200, {}, reply, 0)])
    g = OpenAIModel(OpenAIModelConf(name="x", base_url=url, model="m")).generate(GenRequest(messages=bug()))
    assert (g.text, g.reasoning, g.reasoning_tokens, g.completion_tokens) == ("```python\nx\n```", "first, the loop",
                                                                              12, 20)


def test_config_needs_model_name():
    with pytest.raises(ModelUnavailable, match="has no `model`"):
        OpenAIModel(OpenAIModelConf(name="x", base_url="http://127.0.0.1:9/v1"))


# ---- hosted presets (conf/model/*.yaml with api_key_required) ------------------------------------------------------
def _preset(path: Path) -> OpenAIModelConf:
    return job_settings(f"model={path.stem}").model


HOSTED = [p for p in sorted((REPO / "conf" / "model").glob("*.yaml"))
          if isinstance(m := _preset(p), OpenAIModelConf) and m.api_key_required]


def test_hosted_presets_listed():
    assert {p.stem for p in HOSTED} >= {"together-llama3.3-70b", "hf-router-llama3.3-70b", "openai-gpt-4o",
                                        "openai-gpt-4o-mini"}
    for p in HOSTED:
        cfg = _preset(p)
        assert cfg.name == p.stem and cfg.base_url.startswith("https://") and cfg.api_key_env


@pytest.mark.parametrize("preset", HOSTED, ids=lambda p: p.stem)
def test_hosted_preset_missing_key_is_one_line(preset, monkeypatch):
    from agents.models import build_model

    cfg = _preset(preset)
    var = cfg.api_key_env
    monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(cfg.api_keys_env, raising=False)
    with pytest.raises(ModelUnavailable) as e:
        build_model(cfg)
    msg = str(e.value)
    assert var in msg and cfg.name in msg and "\n" not in msg


@pytest.mark.parametrize("preset", HOSTED, ids=lambda p: p.stem)
def test_hosted_preset_request_path(preset, server, tiny_dir, monkeypatch):
    """The preset's own settings (concurrency, timeout, retries, key variable) against the local server."""
    from agents.models import build_model

    cfg = _preset(preset)
    key = f"dummy-{preset.stem}"
    monkeypatch.delenv(cfg.api_keys_env, raising=False)
    monkeypatch.setenv(cfg.api_key_env, key)
    m = build_model(dataclasses.replace(cfg, base_url=server + "/v1", model=str(tiny_dir)))
    try:
        assert isinstance(m, OpenAIModel) and m._next_key() == key
        sent: list = []
        m._client.event_hooks = {"request": [lambda r: sent.append(r.headers.get("authorization"))], "response": []}
        g = m.generate(GenRequest(messages=bug(), max_new_tokens=10))
        assert g.text.strip() and g.completion_tokens > 0
        assert sent == [f"Bearer {key}"] and m.stats["retries"] == 0
    finally:
        m.close()


@pytest.mark.parametrize("preset", HOSTED, ids=lambda p: p.stem)
def test_hosted_preset_passes_config_check(preset):
    """`python -m flows.evaluate model=<preset> model.max_concurrency=16` composes and passes settings_from."""
    settings = job_settings(f"model={preset.stem}", "model.max_concurrency=16")
    assert settings.model == dataclasses.replace(_preset(preset), max_concurrency=16)
