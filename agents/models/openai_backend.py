"""OpenAI-compatible chat backend (OpenAI, vLLM, llama.cpp server, `transformers serve`, ...).

Thread-safe: agents call generate() from many threads; a semaphore caps requests in flight. Keys come from
env API_KEYS=k1,k2,... (used in turn, so load spreads over keys and a rate-limited key is skipped for the next
try) or from one env var (api_key_env, default OPENAI_API_KEY); local servers need none, hosted presets set
api_key_required so a missing key is one ModelUnavailable line up front. 429, 5xx, timeouts and connection
errors are retried with exponential backoff and jitter (honouring Retry-After); other errors fail at once with
the server's message.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import random
import threading
import time

import httpx

from .base import Generation, GenRequest, ModelUnavailable, ModelUnreachable, cut_at_stop
from .config import OpenAIModelConf

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}


class OpenAIError(RuntimeError):
    """The endpoint refused or kept failing this request. One line."""


class OpenAIUnreachable(OpenAIError, ModelUnreachable):
    """The endpoint kept failing (transport errors or retryable statuses) through every retry."""


class OpenAIModel:
    def __init__(self, cfg: OpenAIModelConf):
        self.cfg = cfg
        self.name = cfg.name
        self.model = cfg.model
        if not self.model:
            raise ModelUnavailable(f"openai model config {self.name!r} has no `model` (the server's model name)")
        self.base_url = str(cfg.base_url or os.environ.get("OPENAI_BASE_URL") or
                            "https://api.openai.com/v1").rstrip("/")
        keys_env, key_env = cfg.api_keys_env, cfg.api_key_env
        keys = [k.strip() for k in os.environ.get(keys_env, "").split(",") if k.strip()]
        if not keys and os.environ.get(key_env):
            keys = [os.environ[key_env]]
        if not keys and cfg.api_key_required:  # hosted presets; local servers need no key
            raise ModelUnavailable(f"model {self.name} needs an API key: set {key_env} "
                                   f"(or {keys_env}=k1,k2 for several)")
        self._keys = itertools.cycle(keys) if keys else None
        self._key_lock = threading.Lock()
        self.max_retries = int(cfg.max_retries)
        self.backoff_s = float(cfg.backoff_s)
        self.backoff_max_s = float(cfg.backoff_max_s)
        self.timeout_s = float(cfg.timeout_s)
        self.max_tokens_param = cfg.max_tokens_param
        self.extra_body = dict(cfg.extra_body)
        self._sem = threading.BoundedSemaphore(int(cfg.max_concurrency))
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
                                    limits=httpx.Limits(max_connections=int(cfg.max_concurrency) + 2))
        self.stats = {"requests": 0, "retries": 0}
        self._reached = False  # whether any call has reached the server

    def _next_key(self) -> str | None:
        if self._keys is None:
            return None
        with self._key_lock:
            return next(self._keys)

    def _body(self, req: GenRequest) -> dict:
        body = {"model": self.model, "messages": list(req.messages), self.max_tokens_param: int(req.max_new_tokens),
                "temperature": float(req.temperature)}
        if req.seed is not None:
            body["seed"] = int(req.seed)
        if req.stop:
            body["stop"] = list(req.stop)[:4]  # the OpenAI API takes at most 4; the rest are cut locally
        if req.tools:
            body["tools"] = list(req.tools)
        body.update(self.extra_body)
        return body

    def generate(self, request: GenRequest) -> Generation:
        body = self._body(request)
        url = f"{self.base_url}/chat/completions"
        t0 = time.perf_counter()
        last = ""
        # Hand-written on purpose rather than openai.OpenAI(max_retries=...) (installed, but as `transformers serve`'s
        # dependency), because the client's policy differs from the one the configs promise:
        # - backoff: the client's is fixed (0.5 s doubling to 8 s, minus 0-25% jitter; module constants); ours is
        #   per model config (backoff_s doubling up to backoff_max_s, times 0.5-1 jitter; conf/model/*.yaml);
        # - codes: the client retries 408/409/429/every 5xx and obeys x-should-retry; we retry exactly RETRY_STATUS
        #   (adds 425, Cloudflare's 520/522/524 and 529; leaves out 501/505...), plus timeouts and connection errors;
        # - Retry-After: the client waits it only up to 120 s and otherwise does not retry at all; we honour it
        #   (seconds form), capped at backoff_max_s, and still retry;
        # - keys: every attempt takes the next API_KEYS key, so the retry after a 429 goes out on another key (the
        #   client could do this only through a callable api_key); stats counts requests/retries, and _parse reads
        #   llama.cpp's non-standard `timings` from the raw JSON.
        with self._sem:
            for attempt in range(self.max_retries + 1):
                key = self._next_key()
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                wait = None
                try:
                    self.stats["requests"] += 1
                    r = self._client.post(url, json=body, headers=headers)
                except (httpx.TimeoutException, httpx.TransportError) as e:
                    last = f"{type(e).__name__}: {e}"
                    if isinstance(e, httpx.ConnectError) and not self._reached and "refused" in str(e).lower():
                        # nothing listens there and nothing ever did for this job: retrying only delays the one line
                        raise OpenAIUnreachable(f"{url} refused the connection: is the server up? (start it, or fix "
                                                "model.base_url)") from None
                else:
                    if r.status_code == 200:
                        self._reached = True
                        return self._parse(r, request, time.perf_counter() - t0)
                    last = f"HTTP {r.status_code}: {_error_text(r)}"
                    if r.status_code not in RETRY_STATUS:
                        raise OpenAIError(f"{url} refused the request ({last})")
                    wait = _retry_after(r)
                if attempt == self.max_retries:
                    break
                if wait is None:
                    wait = min(self.backoff_max_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random() / 2)
                self.stats["retries"] += 1
                log.warning("%s: %s; retry %d/%d in %.1fs", self.name, last, attempt + 1, self.max_retries, wait)
                time.sleep(min(wait, self.backoff_max_s))
        raise OpenAIUnreachable(f"{url} failed after {self.max_retries + 1} attempts (last: {last})")

    def _parse(self, r: httpx.Response, req: GenRequest, seconds: float) -> Generation:
        try:
            d = r.json()
            choice = d["choices"][0]
            msg = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError):
            raise OpenAIError(f"unexpected response from {self.base_url}: {r.text[:200]!r}") from None
        text = msg.get("content") or ""
        finish = choice.get("finish_reason") or "stop"
        text, cut = cut_at_stop(text, req.stop[4:])  # stops beyond the API's 4
        finish = "stop" if cut else finish
        usage = d.get("usage") or {}
        calls = [c for c in (msg.get("tool_calls") or []) if isinstance(c, dict)]
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        timings = d.get("timings") or {}  # llama.cpp: prompt_n = tokens it prefilled, draft_n = drafted tokens
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        prefill = (int(timings["prompt_n"]) if "prompt_n" in timings
                   else prompt_tokens - int(cached) if cached is not None else None)
        # a reasoning parser's output (vLLM, SGLang: reasoning_content; some servers: reasoning) and its count
        thought = msg.get("reasoning_content") or msg.get("reasoning") or None
        spent = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        return Generation(text=text, prompt_tokens=prompt_tokens, reasoning=thought if isinstance(thought, str) else None,
                          reasoning_tokens=int(spent) if spent is not None else None,
                          completion_tokens=int(usage.get("completion_tokens") or 0), seconds=seconds,
                          finish_reason="length" if finish == "length" else "stop", tool_calls=calls,
                          prefill_tokens=prefill, draft_tokens=int(timings.get("draft_n") or 0),
                          draft_accepted=int(timings.get("draft_n_accepted") or 0))

    def close(self) -> None:
        self._client.close()


def _retry_after(r: httpx.Response) -> float | None:
    v = r.headers.get("retry-after")
    try:
        return max(0.0, float(v)) if v is not None else None
    except ValueError:
        return None


def _error_text(r: httpx.Response) -> str:
    try:
        d = r.json()
        e = d.get("error", d) if isinstance(d, dict) else d
        msg = e.get("message", e) if isinstance(e, dict) else e
        s = msg if isinstance(msg, str) else json.dumps(msg)
    except ValueError:
        s = r.text
    return " ".join(s.split())[:200]
