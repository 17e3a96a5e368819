"""The agent loop: draft a fix, run it, feed the verdict back, for up to `iters` more rounds.

Strategies (AgentConfig.strategy):
  single_shot - every round is an independent fresh attempt (the resampling baseline);
  reflection  - every round revises the previous code from the test feedback.
Protocols (AgentConfig.protocol): what the agent sees and what its feedback runs on, see VISIBILITY.
A round is one model answer and at most one test run, so budgets compare across strategies.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from sandboxes import build_program
from sandboxes.base import Sandbox

from .extract import extract_candidate
from .feedback import shape_feedback
from .models.base import GenRequest, Model
from .types import Attempt, ModelCall, Task, Trajectory

PROMPTS = Path(__file__).parent / "prompts"
STRATEGIES = ("single_shot", "reflection")
PROTOCOLS = ("tests", "docs", "hidden")


@dataclass
class AgentConfig:
    strategy: str = "reflection"
    iters: int = 0  # feedback rounds after round 0
    protocol: str = "tests"
    temperature: float = 0.0  # round 0; 0 = greedy
    resample_temperature: float = 0.8  # single_shot rounds >= 1 (greedy would repeat round 0)
    max_new_tokens: int = 512
    seed: int = 0
    sample: int = 0  # index of an independent trajectory for the same task (pass@k)
    timeout_s: float = 10.0
    history_rounds: int = 1  # reflection: earlier (answer, feedback) pairs kept in the prompt
    feedback_chars: int = 1200
    compute_actual: bool = True  # re-run the failing call to show the actual value
    keep_task_context: bool = True
    extra: dict = field(default_factory=dict)


def round_seed(cfg: AgentConfig, task_id: str, rnd: int) -> int:
    """Seed per task, sample and round: reproducible runs, independent rounds."""
    return (cfg.seed * 1_000_003 + zlib.crc32(task_id.encode()) + 7919 * cfg.sample + rnd) % (2**31)


_env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=False)


def render(name: str, **kw) -> str:
    return _env.get_template(name).render(**kw).strip() + "\n"


def visibility(task: Task, protocol: str) -> tuple[str | None, bool, str]:
    """(tests shown in the prompt, docstring shown, test code that feedback runs on)."""
    if protocol == "tests":
        return task.test.strip(), False, task.test
    if protocol == "docs":
        return None, True, task.example_test
    if protocol == "hidden":
        return task.example_test.strip() or None, False, task.example_test
    raise ValueError(f"unknown protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")


def run_agent(task: Task, model: Model, sandbox: Sandbox, cfg: AgentConfig) -> Trajectory:
    traj = Trajectory(task_id=task.task_id, bug_type=task.bug_type, strategy=cfg.strategy,
                      budget=cfg.iters, sample=cfg.sample)
    shown_tests, show_docs, feedback_test = visibility(task, cfg.protocol)
    first = [{"role": "system", "content": render("system.txt")},
             {"role": "user", "content": render("fix.txt", task=task, code=task.buggy_code,
                                                tests=shown_tests, docs=show_docs)}]
    history: list[dict] = []  # reflection: [assistant, user] pairs
    seen: set[str] = set()
    start = time.perf_counter()
    try:
        for rnd in range(cfg.iters + 1):
            t0 = time.perf_counter()
            if cfg.strategy == "single_shot":
                messages = first
                temperature = cfg.temperature if rnd == 0 else cfg.resample_temperature
            else:
                messages = first + history[-2 * cfg.history_rounds:] if cfg.history_rounds else first
                temperature = cfg.temperature
            call = _call(model, messages, cfg, task, rnd, temperature)
            attempt = Attempt(round=rnd, decision="tested", calls=[call])
            traj.attempts.append(attempt)
            if call.error:
                attempt.decision = "model_error"
                attempt.feedback = None
                attempt.seconds = time.perf_counter() - t0
                continue
            ex = extract_candidate(call.output, task, keep_context=cfg.keep_task_context)
            attempt.code = ex.code
            if ex.problem:
                attempt.decision = "no_code" if ex.problem == "no_code" else "syntax_error"
                attempt.notes["problem"] = ex.detail
                attempt.feedback = render("invalid.txt", task=task, problem=ex.detail)
            else:
                key = _normalise(ex.code)
                if key in seen:
                    attempt.decision = "repeat"
                    attempt.feedback = ("This is the same code as one of your earlier attempts, which failed. "
                                        "Find a different fix.\n")
                else:
                    seen.add(key)
                    _test(attempt, task, sandbox, cfg, feedback_test)
                    if attempt.notes.get("verdict") == "passed":
                        traj.first_pass_round = rnd
                    if attempt.notes.get("visible") == "passed":
                        attempt.seconds = time.perf_counter() - t0
                        break  # the agent believes it is done; under "hidden" the verdict may differ
            attempt.seconds = time.perf_counter() - t0
            if attempt.feedback is not None:
                revise = render("revise.txt", task=task, code=ex.code or "", feedback=attempt.feedback) \
                    if attempt.decision in ("tested", "repeat") else attempt.feedback
                history += [{"role": "assistant", "content": call.output}, {"role": "user", "content": revise}]
    except Exception as e:  # a crash in the harness ends this task, never the run
        traj.error = f"{type(e).__name__}: {e}"
    finally:
        traj.seconds = round(time.perf_counter() - start, 3)
    return traj


def _call(model: Model, messages: list[dict], cfg: AgentConfig, task: Task, rnd: int, temperature: float) -> ModelCall:
    seed = round_seed(cfg, task.task_id, rnd)
    req = GenRequest(messages=[dict(m) for m in messages], max_new_tokens=cfg.max_new_tokens,
                     temperature=temperature, seed=seed, task_id=task.task_id)
    t0 = time.perf_counter()
    try:
        gen = model.generate(req)
    except Exception as e:  # one failed request fails this round, not the run
        return ModelCall(messages=req.messages, output="", seconds=time.perf_counter() - t0,
                         temperature=temperature, seed=seed, error=f"{type(e).__name__}: {e}")
    return ModelCall(messages=req.messages, output=gen.text, prompt_tokens=gen.prompt_tokens,
                     completion_tokens=gen.completion_tokens, seconds=round(gen.seconds or time.perf_counter() - t0, 3),
                     temperature=temperature, seed=seed)


def _test(attempt: Attempt, task: Task, sandbox: Sandbox, cfg: AgentConfig, feedback_test: str) -> None:
    """Run the visible tests (feedback) and, when they differ, the full test (verdict)."""
    visible = sandbox.run(build_program(attempt.code, feedback_test), cfg.timeout_s)
    attempt.notes["visible"] = visible.status
    if feedback_test == task.test:
        attempt.result = visible
    else:
        attempt.result = sandbox.run(build_program(attempt.code, task.test), cfg.timeout_s)
        attempt.notes["visible_result"] = visible.to_dict()
    attempt.notes["verdict"] = attempt.result.status
    if visible.status != "passed" and attempt.round < cfg.iters:  # the last round's feedback has no reader
        attempt.feedback = shape_feedback(visible, attempt.code, sandbox, cfg.timeout_s, cfg.feedback_chars,
                                          cfg.compute_actual)


def _normalise(code: str) -> str:
    """Code without comments and blank-space differences, for repeat detection."""
    import ast

    try:
        return ast.unparse(ast.parse(code))
    except SyntaxError:
        return " ".join(code.split())
