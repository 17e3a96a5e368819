"""The agent loop: draft a fix, run it, feed the verdict back, for up to `iters` more rounds.

Strategies (AgentConfig.strategy):
  single_shot - every round is an independent fresh attempt (the resampling baseline);
  reflection  - every round revises the previous code from the test feedback;
  react       - thought -> tool call (run_tests / submit) -> observation, see agents/react.py.
Protocols (AgentConfig.protocol): what the agent sees and what its feedback runs on, see `visibility`.
A round is at most one test run (react: exactly one), so budgets compare across strategies.

Invariant the sweep cache relies on: round r never depends on the budget `iters` (no prompt mentions it,
seeds depend on task/sample/round only, feedback is computed on every round). So `truncate` cuts a longer
trajectory to a budget, and `run_agent(prior=...)` continues a shorter one, both equal to a fresh run.
Each round is produced from the loop state (`produce`) and then folded into it (`absorb`); continuing a
prior folds in its recorded attempts instead of producing them again.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from sandboxes import build_program
from sandboxes.audit import audit_program, suspicion
from sandboxes.base import Sandbox

from .extract import extract_candidate, normalise
from .feedback import STYLES as FEEDBACK_STYLES
from .feedback import raw_feedback, shape_feedback
from .models.base import GenRequest, Model
from .types import Attempt, ModelCall, Task, Trajectory

PROMPTS = Path(__file__).parent / "prompts"
# A closing fence followed by a newline. An opening fence carries a language tag (```python) in practice, so it
# does not match; a bare opening fence after prose would end the answer early (it then counts as no_code).
CODE_STOP = ("\n```\n",)
STRATEGIES = ("single_shot", "reflection", "react")
PROTOCOLS = ("tests", "docs", "hidden")
SCHEDULES = ("auto", "constant", "resample", "rising", "falling")


@dataclass
class AgentConfig:
    strategy: str = "reflection"
    iters: int = 0  # feedback rounds after round 0
    protocol: str = "tests"
    # Temperature per round (seeded per task, sample and round). auto: resample for single_shot, else constant.
    temperature: float = 0.0  # round 0 (constant: every round); 0 = greedy
    temperature_schedule: str = "auto"
    resample_temperature: float = 0.8  # resample: rounds >= 1 (greedy would only repeat round 0)
    temperature_step: float = 0.2  # rising: added per round ...
    temperature_max: float = 1.0  # ... up to this
    temperatures: tuple = (0.7, 0.5, 0.3)  # falling: round r uses temperatures[min(r, last)]
    max_new_tokens: int = 512
    seed: int = 0
    sample: int = 0  # index of an independent trajectory for the same task (pass@k)
    timeout_s: float = 10.0
    audit_passes: bool = True  # re-run a pass with its return values checked (sandboxes/audit.py); flags only
    strict: bool = False  # a pass the audit flags counts as a failure
    # techniques
    keep_task_context: bool = True  # add back the task's imports/helpers the answer leaves out
    check_signature: bool = True  # a renamed/reshaped entry point takes the syntax path
    syntax_path: bool = True  # invalid code gets a short prompt instead of a test run (off: it is run)
    detect_repeats: bool = True  # a candidate equal to an earlier one is not run again
    flag_unchanged: bool = True  # say so when the answer is the buggy code unchanged (it is still run)
    feedback_style: str = "shaped"  # shaped | raw (traceback tail) | verdict (pass/fail only)
    feedback_chars: int = 1200  # budget for one feedback text (about 4 characters per token)
    compute_actual: bool = True  # re-run the failing call to show the value it actually returned
    edge_case_hint: bool = False  # say when the failing input is an edge case (empty, zero, negative...)
    show_diff: bool = False  # show the candidate's diff against the buggy code in the feedback
    few_shot: int = 0  # worked bug-fix examples (agents/prompts/few_shot/) before the task; not for react
    stop_after_code: bool = True  # end generation at the answer's closing ``` (the prose after it is thrown away)
    # reflection
    history_rounds: int = 1  # earlier (answer, feedback) pairs kept in the prompt (at least the last one)
    diagnose: bool = False  # ask for a one- or two-sentence diagnosis of the failing input before the code
    rewrite_when_stuck: bool = False  # after the unchanged bug or a repeat: a fresh prompt to write it from scratch
    # react
    max_turns: int = 12  # model turns per task (thoughts, invalid calls and repeats cost turns, not rounds)
    tool_format: str = "auto"  # auto (native when the chat template has tools) | native | text
    extra: dict = field(default_factory=dict)


def agent_key(cfg: AgentConfig) -> str:
    """Digest of everything that shapes a trajectory except the budget."""
    d = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "iters"}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def round_seed(cfg: AgentConfig, task_id: str, rnd: int, turn: int = 0) -> int:
    """Seed per task, sample, round (and react turn): reproducible runs, independent rounds and samples."""
    return zlib.crc32(f"{cfg.seed}|{task_id}|{cfg.sample}|{rnd}|{turn}".encode()) % (2**31)


def round_temperature(cfg: AgentConfig, rnd: int) -> float:
    sched = cfg.temperature_schedule
    if sched == "auto":
        sched = "resample" if cfg.strategy == "single_shot" else "constant"
    if sched == "constant":
        return cfg.temperature
    if sched == "resample":
        return cfg.temperature if rnd == 0 else cfg.resample_temperature
    if sched == "rising":
        return round(min(cfg.temperature_max, cfg.temperature + cfg.temperature_step * rnd), 6)
    if sched == "falling":
        temps = list(cfg.temperatures)
        return float(temps[min(rnd, len(temps) - 1)])
    raise ValueError(f"unknown temperature_schedule {sched!r}: use one of {', '.join(SCHEDULES)}")


_env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=False)


def render(name: str, **kw) -> str:
    return _env.get_template(name).render(**kw).strip() + "\n"


def few_shot_messages(n: int) -> list[dict]:
    """The first n worked examples as (user, assistant) turns."""
    out = []
    for p in sorted((PROMPTS / "few_shot").glob("*.txt"))[:n]:
        user, _, answer = p.read_text().partition("=== ANSWER ===")
        out += [{"role": "user", "content": user.strip() + "\n"}, {"role": "assistant", "content": answer.strip() + "\n"}]
    return out


@dataclass(frozen=True)
class View:
    """What the agent is shown and what its feedback runs on, for one protocol."""

    code: str  # the buggy code as shown
    tests: str | None  # test code shown in the prompt
    feedback_test: str  # test code the visible runs use (the verdict always uses task.test)


def visibility(task: Task, protocol: str) -> View:
    if protocol == "tests":  # the published HumanEvalFix setting
        return View(task.buggy_code, task.test.strip(), task.test)
    if protocol == "docs":  # the docstring instead of tests; feedback from the docstring's examples only
        return View((task.prompt.strip("\n") + "\n" + task.buggy_solution), None, task.example_test)
    if protocol == "hidden":  # examples shown and used for feedback; verdict from the full test, never shown
        return View(task.buggy_code, task.example_test.strip() or None, task.example_test)
    raise ValueError(f"unknown protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")


def check_config(cfg: AgentConfig) -> None:
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}: use one of {', '.join(STRATEGIES)}")
    if cfg.feedback_style not in FEEDBACK_STYLES:
        raise ValueError(f"unknown feedback_style {cfg.feedback_style!r}: use one of {', '.join(FEEDBACK_STYLES)}")
    if cfg.tool_format not in ("auto", "native", "text"):
        raise ValueError(f"unknown tool_format {cfg.tool_format!r}: use auto, native or text")
    round_temperature(cfg, 0)
    if cfg.sample > 0 and round_temperature(cfg, 0) == 0:
        warnings.warn("samples > 1 with a greedy round 0 (temperature=0) gives identical samples: set temperature > 0",
                      stacklevel=3)


# ------------------------------------------------------------------------------------------------ the loop
class Context:
    """What one task's run needs, shared by every round."""

    def __init__(self, task: Task, model: Model, sandbox: Sandbox, cfg: AgentConfig):
        self.task, self.model, self.sandbox, self.cfg = task, model, sandbox, cfg
        self.view = visibility(task, cfg.protocol)
        # The buggy code as shown, keyed as a candidate would be: an answer equal to it is "unchanged".
        self.buggy_keys = set()
        for shown in {task.buggy_code, self.view.code}:
            ex = extract_candidate("```python\n" + shown + "\n```", task, cfg.keep_task_context, False)
            self.buggy_keys.add(normalise(ex.code or shown))

    def call(self, messages: list[dict], rnd: int, turn: int = 0, tools=None, stop: tuple = ()) -> ModelCall:
        cfg = self.cfg
        temperature = round_temperature(cfg, rnd)
        seed = round_seed(cfg, self.task.task_id, rnd, turn)
        req = GenRequest(messages=[dict(m) for m in messages], max_new_tokens=cfg.max_new_tokens,
                         temperature=temperature, seed=seed, tools=tools,
                         stop=tuple(stop))
        t0 = time.perf_counter()
        try:
            gen = self.model.generate(req)
        except Exception as e:  # one failed request fails this round, not the run
            return ModelCall(messages=req.messages, output="", seconds=round(time.perf_counter() - t0, 3),
                             temperature=temperature, seed=seed, error=f"{type(e).__name__}: {e}")
        text = gen.text
        if CODE_STOP[0] in stop and gen.finish_reason == "stop" and text.count("```") % 2 == 1:
            text += "\n```"  # put back the closing fence the stop string cut, so the answer reads whole
        return ModelCall(messages=req.messages, output=text, prompt_tokens=gen.prompt_tokens,
                         completion_tokens=gen.completion_tokens,
                         seconds=round(gen.seconds or time.perf_counter() - t0, 3), temperature=temperature,
                         seed=seed, tool_calls=list(getattr(gen, "tool_calls", None) or []),
                         prefill_tokens=gen.prefill_tokens, finish_reason=gen.finish_reason,
                         draft_tokens=gen.draft_tokens, draft_accepted=gen.draft_accepted)

    def execute(self, attempt: Attempt) -> None:
        """Run the visible tests (what the agent learns) and, when they differ, the full test (the verdict)."""
        task, cfg = self.task, self.cfg
        visible = self.sandbox.run(build_program(attempt.code, self.view.feedback_test), cfg.timeout_s)
        attempt.visible_result = visible
        if self.view.feedback_test == task.test:
            attempt.result = visible
        else:
            attempt.result = self.sandbox.run(build_program(attempt.code, task.test), cfg.timeout_s)
        if attempt.result.passed and cfg.audit_passes:
            self.audit(attempt)
        attempt.notes["visible"] = attempt.visible_result.status
        attempt.notes["verdict"] = attempt.result.status
        self.ensure_feedback(attempt)

    def audit(self, attempt: Attempt) -> None:
        """A pass whose returned values are not plain builtins (a lying __eq__) is flagged; strict fails it."""
        task, cfg = self.task, self.cfg
        audit = self.sandbox.run(audit_program(attempt.code, task.test, task.entry_point), cfg.timeout_s)
        attempt.suspicious = suspicion(audit)
        if attempt.suspicious and cfg.strict:
            failed = dataclasses.replace(attempt.result, status="failed", error_type="SuspiciousReturn",
                                         failing_line=None, stderr=f"strict: {attempt.suspicious}",
                                         details={**attempt.result.details, "suspicious": attempt.suspicious})
            if attempt.visible_result is attempt.result:
                attempt.visible_result = failed
            attempt.result = failed

    def ensure_feedback(self, attempt: Attempt) -> None:
        """Feedback on a failed visible run; computed on every round (also the last: a continuation reads it)."""
        visible = attempt.visible_result or attempt.result
        if attempt.feedback is not None or visible is None or visible.passed or attempt.code is None:
            return
        cfg = self.cfg
        if attempt.notes.get("unchanged"):
            attempt.feedback = render("unchanged.txt").strip()
            if cfg.feedback_style == "verdict":
                return
            attempt.feedback += "\n"
        else:
            attempt.feedback = ""
        if cfg.feedback_style == "raw":
            attempt.feedback += raw_feedback(visible, cfg.timeout_s, cfg.feedback_chars)
        elif cfg.feedback_style == "verdict":
            attempt.feedback += "The tests failed." if visible.status != "timeout" else "The tests timed out."
        else:
            attempt.feedback += shape_feedback(
                visible, attempt.code, self.view.feedback_test, self.sandbox, cfg.timeout_s, cfg.feedback_chars,
                cfg.compute_actual, entry_point=self.task.entry_point, edge_case_hint=cfg.edge_case_hint,
                buggy_code=self.view.code if cfg.show_diff else None)

    def judge(self, attempt: Attempt, text: str, state: "State", run: bool = True) -> str:
        """Extract a candidate from `text` into `attempt` and decide: no_code | syntax_error | repeat | tested."""
        cfg, task = self.cfg, self.task
        ex = extract_candidate(text, task, keep_context=cfg.keep_task_context, check_signature=cfg.check_signature)
        attempt.code = ex.code
        if ex.problem == "no_code" or (ex.problem and cfg.syntax_path):
            attempt.decision = "no_code" if ex.problem == "no_code" else "syntax_error"
            attempt.notes["problem"] = ex.detail
            attempt.feedback = ex.detail
            return attempt.decision
        if ex.problem:
            attempt.notes["problem"] = ex.detail  # syntax path off: the sandbox reports it
        key = normalise(ex.code)
        if cfg.flag_unchanged and key in self.buggy_keys:
            attempt.notes["unchanged"] = True  # still run (it fails by construction), but the feedback says so
        if cfg.detect_repeats and key in state.seen:
            attempt.decision = "repeat"
            attempt.notes["same_as_round"] = state.seen[key]
            return "repeat"
        attempt.decision = "tested"
        if run:
            self.execute(attempt)
        return "tested"


@dataclass
class State:
    """What the next round is built from. Changed only by a strategy's `absorb`."""

    messages: list[dict]  # the conversation so far (reflection: prompt + history; react: whole episode)
    prefix: int = 0  # how many of `messages` are the fixed opening prompt
    seen: dict = field(default_factory=dict)  # normalised candidate -> round it was tested in
    feedback: dict = field(default_factory=dict)  # round -> the feedback its test run gave
    turns: int = 0  # react: model turns used
    last_tested: tuple | None = None  # react: (code, round) of the latest run; `submit` without code hands it in
    done: str | None = None  # stop reason once the episode is over


def run_agent(task: Task, model: Model, sandbox: Sandbox, cfg: AgentConfig,
              prior: Trajectory | None = None) -> Trajectory:
    """Run (or, given a shorter `prior` made with the same config, continue) one task's trajectory."""
    from .react import ReactStrategy

    check_config(cfg)
    key = agent_key(cfg)
    if prior is not None and prior.error is None:
        if prior.agent_key and prior.agent_key != key:
            raise ValueError(f"prior trajectory of {prior.task_id} was made with another agent config")
        if prior.task_id != task.task_id or prior.sample != cfg.sample or prior.strategy != cfg.strategy:
            raise ValueError(f"prior trajectory ({prior.task_id}, sample {prior.sample}, {prior.strategy}) does not "
                             f"match ({task.task_id}, sample {cfg.sample}, {cfg.strategy})")
        if prior.budget >= cfg.iters:
            return truncate(prior, cfg.iters)
        replay = copy.deepcopy(prior.attempts)
        spent = prior.seconds
    else:
        replay, spent = [], 0.0
    ctx = Context(task, model, sandbox, cfg)
    strategy = {"single_shot": SingleShot, "reflection": Reflection, "react": ReactStrategy}[cfg.strategy](ctx)
    traj = Trajectory(task_id=task.task_id, bug_type=task.bug_type, strategy=cfg.strategy, budget=cfg.iters,
                      sample=cfg.sample, agent_key=key)
    state = strategy.initial_state()
    start = time.perf_counter()
    try:
        for rnd in range(cfg.iters + 1):
            if state.done:
                break
            if rnd < len(replay):
                attempt = replay[rnd]
                ctx.ensure_feedback(attempt)  # a prior made before feedback was kept on its last round
            else:
                t0 = time.perf_counter()
                attempt = strategy.produce(state, rnd)
                attempt.seconds = round(time.perf_counter() - t0, 3)
            traj.attempts.append(attempt)
            if attempt.passed and traj.first_pass_round is None:
                traj.first_pass_round = rnd
            strategy.absorb(state, attempt)
        traj.stop_reason = stop_reason(traj.attempts, cfg.iters, state.done)
    except Exception as e:  # a crash in the harness ends this task, never the run
        traj.error = f"{type(e).__name__}: {e}"
    finally:
        traj.seconds = round(spent + time.perf_counter() - start, 3)
    return traj


def truncate(traj: Trajectory, iters: int) -> Trajectory:
    """The trajectory a fresh run with budget `iters` would have made (rounds 0..iters of a longer one)."""
    if iters > traj.budget:
        raise ValueError(f"cannot truncate a budget-{traj.budget} trajectory to {iters}: continue it with run_agent(prior=...)")
    out = copy.deepcopy(traj)
    out.attempts = [a for a in out.attempts if a.round <= iters]
    out.budget = iters
    if out.first_pass_round is not None and out.first_pass_round > iters:
        out.first_pass_round = None
    out.stop_reason = stop_reason(out.attempts, iters, traj.stop_reason)
    out.seconds = round(sum(a.seconds for a in out.attempts), 3)
    return out


def stop_reason(attempts: list[Attempt], iters: int, fallback: str | None) -> str:
    """Why an episode ended, from its attempts alone (so a truncated and a fresh run agree)."""
    last = attempts[-1] if attempts else None
    if last is not None:
        visible = last.visible_result or last.result
        if last.decision == "submitted":
            return "submitted"
        if last.decision == "tested" and visible is not None and visible.passed:
            return "solved"
        if last.decision == "out_of_turns":
            return "out_of_turns"
        if last.round >= iters:
            return "budget"
    return fallback or "budget"


# ------------------------------------------------------------------------------------------------ strategies
class Strategy:
    def __init__(self, ctx: Context):
        self.ctx = ctx

    def first_messages(self) -> list[dict]:
        ctx = self.ctx
        return ([{"role": "system", "content": render("system.txt")}] + few_shot_messages(ctx.cfg.few_shot)
                + [{"role": "user", "content": render("fix.txt", task=ctx.task, code=ctx.view.code.strip("\n"),
                                                      tests=ctx.view.tests)}])

    def initial_state(self) -> State:
        first = self.first_messages()
        return State(messages=first, prefix=len(first))

    def produce(self, state: State, rnd: int) -> Attempt:
        call = self.ctx.call(self.messages(state), rnd, stop=CODE_STOP if self.ctx.cfg.stop_after_code else ())
        attempt = Attempt(round=rnd, decision="tested", calls=[call])
        if call.error:
            attempt.decision = "model_error"
            return attempt
        self.ctx.judge(attempt, call.output, state)
        return attempt

    def messages(self, state: State) -> list[dict]:
        return state.messages

    def absorb(self, state: State, attempt: Attempt) -> None:
        if attempt.decision == "tested" and attempt.code is not None:
            state.seen[normalise(attempt.code)] = attempt.round
            state.feedback[attempt.round] = attempt.feedback
            visible = attempt.visible_result or attempt.result
            if visible is not None and visible.passed:
                state.done = "solved"  # the agent believes it is done; under "hidden" the verdict may differ


class SingleShot(Strategy):
    """Every round: the same fresh prompt at the round's own seed (and temperature). Feedback is never read."""


class Reflection(Strategy):
    """Every round revises the previous answer: the prompt plus the last `history_rounds` (answer, feedback)."""

    def messages(self, state: State) -> list[dict]:
        keep = 2 * max(1, self.ctx.cfg.history_rounds)
        return state.messages[:state.prefix] + state.messages[state.prefix:][-keep:]

    def absorb(self, state: State, attempt: Attempt) -> None:
        super().absorb(state, attempt)
        if state.done or attempt.decision == "model_error":
            return
        task, diagnose = self.ctx.task, self.ctx.cfg.diagnose
        stuck = attempt.decision == "repeat" or (attempt.decision == "tested" and attempt.notes.get("unchanged"))
        if stuck and self.ctx.cfg.rewrite_when_stuck:
            # A small model that hands the bug back keeps copying what it is shown: start a new conversation
            # without the buggy body, from the signature, the visible tests and how the old code failed.
            seen_fb = attempt.feedback if attempt.decision == "tested" else state.feedback.get(attempt.notes.get("same_as_round"))
            view = self.ctx.view
            header = view.code[: len(view.code) - len(task.buggy_solution)] if view.code.endswith(task.buggy_solution) \
                else task.declaration
            state.messages = [{"role": "system", "content": render("system.txt")},
                              {"role": "user", "content": render("rewrite.txt", task=task, header=header.strip("\n"),
                                                                 tests=view.tests,
                                                                 feedback=_without_unchanged_note(seen_fb))}]
            state.prefix = len(state.messages)
            return
        if attempt.decision in ("no_code", "syntax_error"):
            reply = render("invalid.txt", task=task, problem=attempt.notes.get("problem", "no usable code"))
        elif attempt.decision == "repeat":
            # The same code fails the same way: restate what its run showed (the answer alone taught nothing).
            same = attempt.notes.get("same_as_round")
            reply = render("repeat.txt", task=task, unchanged=bool(attempt.notes.get("unchanged")), same_round=same,
                           feedback=_without_unchanged_note(state.feedback.get(same)), diagnose=diagnose)
        else:
            reply = render("revise.txt", task=task, code=(attempt.code or "").strip("\n"),
                           feedback=attempt.feedback or "The tests failed.", diagnose=diagnose)
        state.messages += [{"role": "assistant", "content": attempt.calls[-1].output},
                           {"role": "user", "content": reply}]


def _without_unchanged_note(feedback: str | None) -> str | None:
    """The repeat prompt says 'unchanged' itself; keep only what the tests showed."""
    note = render("unchanged.txt").strip()
    return feedback[len(note):].strip() if feedback and feedback.startswith(note) else feedback
