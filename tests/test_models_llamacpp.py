"""The embedded llama.cpp server (backend llamacpp) for real, on the smollm2-135m registry pack's GGUF:
greedy answers, stop strings, prefix reuse counted, the server gone with close(), and the whole evaluate path."""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
from urllib.parse import urlparse

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from serving import build as build_model  # noqa: E402
from agents.models.config import LlamaCppModelConf  # noqa: E402
from agents.models.base import GenRequest, ModelUnavailable  # noqa: E402
from conftest import needs_data  # noqa: E402

CFG = LlamaCppModelConf(name="smollm2-llamacpp-test", pack="smollm2-135m", slots=2, context_per_slot=2048, threads=1)
SYSTEM = {"role": "system", "content": "You are a helpful assistant who answers with Python code. " * 8}


def ask(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


@pytest.fixture(scope="module")
def model():
    m = build_model(CFG)
    yield m
    m.close()


@pytest.mark.slow
def test_greedy_answers_repeat_and_concurrent_requests_agree(model):
    req = GenRequest(messages=ask("Write a Python function add(a, b) that returns a + b."), max_new_tokens=40)
    first = model.generate(req)
    assert first.text.strip() and first.completion_tokens > 0 and first.prompt_tokens > 50
    # the same prompt again: llama.cpp reuses the slot's cached prompt, and says how much it prefilled
    again = model.generate(req)
    assert again.text == first.text
    assert again.prefill_tokens is not None and again.prefill_tokens < again.prompt_tokens
    # two at once are served side by side, each its own answer. Unlike fixlab's engine, llama.cpp's output may
    # depend on what else is in the batch (seen here: the same code, then other prose), so only that is checked.
    other = GenRequest(messages=ask("Write a Python function mul(a, b) that returns a * b."), max_new_tokens=40)
    out = {}
    threads = [threading.Thread(target=lambda k, r: out.__setitem__(k, model.generate(r).text), args=(k, r))
               for k, r in (("add", req), ("mul", other))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert "def add(" in out["add"] and "def mul(" in out["mul"]


@pytest.mark.slow
def test_stop_strings_and_length_are_reported(model):
    req = GenRequest(messages=ask("Count from 1 to 30, one number per line."), max_new_tokens=200, stop=("\n5",))
    g = model.generate(req)
    assert "\n5" not in g.text and g.finish_reason == "stop"
    short = model.generate(GenRequest(messages=ask("Tell a long story about a robot."), max_new_tokens=8))
    assert short.finish_reason == "length" and short.completion_tokens == 8


@pytest.mark.slow
def test_close_stops_the_server():
    m = build_model(dataclasses.replace(CFG, slots=1))
    addr = urlparse(m.base_url)
    with socket.create_connection((addr.hostname, addr.port), timeout=5):
        pass
    m.close()
    with pytest.raises(OSError):
        socket.create_connection((addr.hostname, addr.port), timeout=2).close()


def test_bad_config_is_one_line():
    with pytest.raises(ModelUnavailable, match="needs `pack` or `gguf`"):
        build_model(LlamaCppModelConf(name="x"))
    with pytest.raises(ModelUnavailable, match="no such file") as e:
        build_model(LlamaCppModelConf(name="x", gguf="/nonexistent/model.gguf"))
    assert "\n" not in str(e.value)
    with pytest.raises(ModelUnavailable, match="model.slots must be an integer"):
        build_model(dataclasses.replace(CFG, slots=0))


@pytest.mark.slow
@needs_data
def test_evaluate_through_llamacpp(evaluate):
    run = evaluate("model=smollm2-135m-llamacpp", "model.slots=2", "runner.workers=2", "strategy=reflection",
                   "iters=1", "dataset.limit=2", "max_new_tokens=128", timeout=900)
    assert run.rc == 0, run.stderr[-3000:]
    s = run.summary
    assert s["total"] == 2 and s["errors"] == 0 and s["model"] == "smollm2-135m-llamacpp"
    assert s["completion_tokens"] > 0 and 0 < s["prefill_tokens"] <= s["prompt_tokens"]
    assert s["model_calls"] >= 2 and len(s["pass@1_ci95"]) == 2


@pytest.mark.slow
@needs_data
def test_evaluate_through_a_server_of_ones_own(model, evaluate):
    """model=openai-server: any OpenAI-compatible server (vLLM, SGLang on a GPU); here llama.cpp's, started by the
    fixture, reached by base_url and model name only, as a user with such a server would."""
    run = evaluate("model=openai-server", f"model.base_url={model.base_url}", f"model.model={CFG.name}",
                   "model.max_concurrency=2", "runner.workers=2", "iters=0", "dataset.limit=2", "max_new_tokens=64",
                   timeout=600)
    assert run.rc == 0, run.stderr[-3000:]
    s = run.summary
    assert s["total"] == 2 and s["errors"] == 0 and s["model"] == "openai-server" and s["completion_tokens"] > 0
    missing = evaluate("model=openai-server", "dataset.limit=1")  # no model name: one line that says what to set
    assert missing.rc != 0 and "Traceback" not in missing.stderr and "model" in missing.stderr.splitlines()[-1]
