"""The model interface: a chat request in, a completion out. Backends must be thread-safe.

Agents make one request at a time per task; many tasks run at once, so a backend may gather concurrent
requests into batches (see the transformers backend) without the agent knowing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# The one line for a backend whose pip extra is not installed (agents/extras.py), for the backends in serving/,
# which import the model layer (agents.models) only.
from ..extras import message as extra_message, require as require_extra  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class GenRequest:
    messages: tuple[dict, ...] | list[dict]
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    seed: int | None = None
    stop: tuple[str, ...] = ()
    tools: tuple[dict, ...] | None = None  # JSON-schema tools, for models whose chat template has them


@dataclass
class Generation:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = "stop"  # "stop" | "length"
    tool_calls: list[dict] = field(default_factory=list)
    prefill_tokens: int | None = None  # prompt tokens actually computed (the rest came from a prefix cache)
    draft_tokens: int = 0  # speculative decoding: tokens drafted ...
    draft_accepted: int = 0  # ... and how many of them the model accepted
    reasoning: str | None = None  # a server's reasoning field (reasoning_content), apart from the text
    reasoning_tokens: int | None = None  # the server's count of them (usage.completion_tokens_details), if it gives one


class Model(Protocol):
    name: str

    def generate(self, request: GenRequest) -> Generation: ...

    def close(self) -> None: ...


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here (missing weights, no network...). Message is one line."""


# Shared by every backend: one request's context check and stop-string trimming.
class ModelUnreachable(RuntimeError):
    """The model's server could not be reached, or kept failing through every retry (refused connections, timeouts,
    5xx, rate limits): no answer was given, so the task ends in an error that `resume=last` runs again; it is not a
    wrong answer of the model's (agents/context.py lets it through; other request errors cost the round only)."""


class RequestError(RuntimeError):
    """This request cannot be generated (too long for the context, failed forward). One line."""


def too_long(n: int, max_context: int) -> RequestError | None:
    """The error for a prompt of n tokens that leaves no room to answer in the context, else None."""
    if n >= max_context:
        return RequestError(f"prompt has {n} tokens but the model context is {max_context}: shorten the prompt")
    return None


def answer_budget(request: "GenRequest", n: int, max_context: int) -> int:
    """How many tokens a prompt of n tokens may be answered with: its max_new_tokens within what the context leaves;
    RequestError (one line) when the prompt leaves no room."""
    err = too_long(n, max_context)
    if err:
        raise err
    return max(1, min(int(request.max_new_tokens), max_context - n))


def cut_at_stop(text: str, stops) -> tuple[str, bool]:
    """The text up to the first stop string (not included), and whether one was found."""
    cuts = [text.find(s) for s in stops if s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)
