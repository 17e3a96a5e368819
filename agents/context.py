"""What one task's run works with: the prompt templates, what the protocol shows (`visibility`), the Context
that calls the model, judges an answer and runs it in the sandbox, and the State a strategy builds rounds from.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from sandboxes import build_program
from sandboxes.audit import audit_program, suspicion
from sandboxes.base import Sandbox
from sandboxes.languages import of_task

from . import feedback, multilang, reasoning, selfcheck
from .config import CANDIDATE_TEMPERATURE, PROTOCOLS, AgentConfig, round_seed, round_temperature
from .extract import code_blocks, extract_candidate, normalise
from .feedback import raw_feedback, shape_feedback
from .models.base import GenRequest, Model, ModelUnreachable
from .patch import OPEN, answers_as_patches, apply_patch, closed
from .types import Attempt, ModelCall, Task

PROMPTS = Path(__file__).parent / "prompts"
# A closing fence followed by a newline. An opening fence carries a language tag (```python) in practice, so it
# does not match; a bare opening fence after prose would end the answer early (it then counts as no_code).
CODE_STOP = ("\n```\n",)
# Invalid code (or a wrong signature) gets its own short prompt instead of a test run; off, the sandbox reports it.
# Always on (never varied at full size); a test turns it off to check the other side.
SYNTAX_PATH = True
OWN_TESTS_TURN = 1000  # the own-tests call's seed slot: apart from every candidate's turn (it is greedy anyway)
OWN_INPUTS_TURN = OWN_TESTS_TURN + 2  # the own-inputs call's (+1 is single_shot's localisation call)


_env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=False)


def render(name: str, **kw) -> str:
    """A prompt template, filled; `fence` and `language` name the task's language (Python when no task is given)."""
    task = kw.get("task")
    lang = task.lang if task is not None else None
    kw.setdefault("fence", lang.fence if lang else "python")
    kw.setdefault("language", lang.title if lang else "Python")
    return _env.get_template(name).render(**kw).strip() + "\n"


def program_for(task: Task, code: str, test: str, timeout_s: float):
    """The program a candidate and a test become, in the task's language (Python: its source text)."""
    if of_task(task.task_id).name == "python":
        return build_program(code, test)
    return task.lang.program(code, test, task, run_timeout_s=timeout_s)


def run_test(sandbox: Sandbox, task: Task, code: str, test: str, timeout_s: float):
    """A candidate run against a test in the sandbox: what an agent's round and a rescore (flows/rescore.py) both
    judge by. A test with nothing in it passes at once: Rust's and six other tasks' example tests are empty (docs,
    hidden), and no program of theirs is built for it."""
    if of_task(task.task_id).name != "python" and not test.strip():
        from sandboxes.base import ExecResult

        return ExecResult(status="passed", backend=getattr(sandbox, "name", ""), details={"empty_test": True})
    return sandbox.run(program_for(task, code, test, timeout_s), timeout_s)


def audit_pass(sandbox: Sandbox, task: Task, code: str, result, cfg) -> tuple:
    """(why a Python pass looks gamed or None, the failed result that replaces it under `cfg.strict` or None): its
    returned values are checked to be plain builtins (a lying __eq__; sandboxes/audit.py). The audit reads Python's
    return values, so the other languages' passes are not audited here (their tests compare declared types)."""
    if of_task(task.task_id).name != "python" or not cfg.audit_passes:
        return None, None
    why = suspicion(sandbox.run(audit_program(code, task.test, task.entry_point), cfg.timeout_s))
    if not (why and cfg.strict):
        return why, None
    return why, dataclasses.replace(result, status="failed", error_type="SuspiciousReturn", failing_line=None,
                                    stderr=f"strict: {why}", details={**result.details, "suspicious": why})


@dataclass(frozen=True)
class View:
    """What the agent is shown and what its feedback runs on, for one protocol."""

    code: str  # the buggy code as shown
    tests: str | None  # test code shown in the prompt
    feedback_test: str  # test code the visible runs use (the verdict always uses task.test)


def visibility(task: Task, protocol: str) -> View:
    if protocol == "tests":  # the published HumanEvalFix setting
        return View(task.buggy_code, task.test.strip(), task.test)
    # Rust's example_test is the string "None" in all 164 rows: no visible test under docs and hidden
    example = "" if task.example_test.strip() == "None" else task.example_test
    if protocol == "docs":  # the docstring instead of tests; feedback from the docstring's examples only
        return View((task.prompt.strip("\n") + "\n" + task.buggy_solution), None, example)
    if protocol == "hidden":  # examples shown and used for feedback; verdict from the full test, never shown
        return View(task.buggy_code, example.strip() or None, example)
    raise ValueError(f"unknown protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")


class Context:
    """What one task's run needs, shared by every round."""

    def __init__(self, task: Task, model: Model, sandbox: Sandbox, cfg: AgentConfig):
        self.task, self.model, self.sandbox, self.cfg = task, model, sandbox, cfg
        self.view = visibility(task, cfg.protocol)
        # The buggy code as shown, read as a candidate would be (the program show_failure runs), and keyed: an answer
        # equal to it is "unchanged".
        read = {shown: self.extract(f"```{task.lang.fence}\n" + shown + "\n```", False).code or shown
                for shown in {task.buggy_code, self.view.code}}
        self.shown_code = read[self.view.code]
        self.buggy_keys = {self.key(code) for code in read.values()}
        self.own_tests: list[str] | None = None  # self_tests: the model's own assertions, written once a task
        self.own_inputs: list[str] | None = None  # self_inputs: the model's own probe inputs, written once a task
        self.side_calls: list[ModelCall] = []  # own-tests and own-inputs calls: the next attempt holds them
        self._failure: str | None = None  # show_failure: the buggy code's feedback ("" = it passed), once a task
        self.side_runs = 0  # sandbox runs made outside an answer's judging, not yet counted on an attempt

    def call(self, messages: list[dict], rnd: int, turn: int = 0, tools=None, stop: tuple = (),
             temperature: float | None = None) -> ModelCall:
        cfg = self.cfg
        temperature = round_temperature(cfg, rnd) if temperature is None else temperature
        seed = round_seed(cfg, self.task.task_id, rnd, turn)
        req = GenRequest(messages=[dict(m) for m in messages], max_new_tokens=cfg.max_new_tokens,
                         temperature=temperature, seed=seed, tools=tools,
                         stop=tuple(stop))
        t0 = time.perf_counter()
        try:
            gen = self.model.generate(req)
        except ModelUnreachable:  # no answer at all (the server is down): the task ends in an error, resumable
            raise
        except Exception as e:  # one failed request fails this round, not the run
            return ModelCall(messages=req.messages, output="", seconds=round(time.perf_counter() - t0, 3),
                             temperature=temperature, seed=seed, error=f"{type(e).__name__}: {e}")
        thought, text, still_open = reasoning.split(gen.text)
        if gen.reasoning:  # the server parsed it out itself
            thought = gen.reasoning + ("\n" + thought if thought else "")
        if CODE_STOP[0] in stop and gen.finish_reason == "stop" and text.count("```") % 2 == 1:
            text += "\n```"  # put back the closing fence the stop string cut, so the answer reads whole
        spent = gen.reasoning_tokens
        if spent is None and thought and hasattr(self.model, "count_tokens"):  # counted by the model's tokenizer
            spent = min(self.model.count_tokens(thought), gen.completion_tokens)
        return ModelCall(messages=req.messages, output=text, prompt_tokens=gen.prompt_tokens,
                         completion_tokens=gen.completion_tokens,
                         seconds=round(gen.seconds or time.perf_counter() - t0, 3), temperature=temperature,
                         seed=seed, tool_calls=list(getattr(gen, "tool_calls", None) or []),
                         prefill_tokens=gen.prefill_tokens,
                         # the budget ran out while it was still thinking: no answer came, whatever stopped it
                         finish_reason="length" if still_open else gen.finish_reason,
                         draft_tokens=gen.draft_tokens, draft_accepted=gen.draft_accepted,
                         reasoning=thought or None, reasoning_tokens=spent if thought else None)

    def calls(self, messages: list[dict], rnd: int, k: int, stop: tuple = (),
              temperature: float | None = None) -> list[ModelCall]:
        """k answers to the same prompt, in flight together so a batching backend decodes them as one batch.
        The first follows `temperature` (None: the round's); the others use CANDIDATE_TEMPERATURE, each its own seed."""
        if k == 1:
            return [self.call(messages, rnd, stop=stop, temperature=temperature)]
        from concurrent.futures import ThreadPoolExecutor

        temps = [temperature] + [CANDIDATE_TEMPERATURE] * (k - 1)
        with ThreadPoolExecutor(k) as pool:
            return list(pool.map(lambda i: self.call(messages, rnd, turn=i, stop=stop, temperature=temps[i]),
                                 range(k)))

    def answers(self, messages, positions, stop: tuple = (), temperature=None) -> list[ModelCall]:
        """Answers at these positions of the task's answer stream (single_shot, flows/stream.py): answer p has the
        seed and temperature of round p, whatever round it is drafted in, so (candidates=k, iters=r) draws exactly
        the stream's first k(r+1) answers. Answers of one round are in flight together (one batch). `messages`
        and `temperature` may be functions of p (answer_format=line: each answer its own line and pass)."""
        def one(p: int) -> ModelCall:
            return self.call(messages(p) if callable(messages) else messages, p, stop=stop,
                             temperature=temperature(p) if temperature else None)
        if len(positions) == 1:
            return [one(positions[0])]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(positions)) as pool:
            return list(pool.map(one, positions))

    @property
    def python(self) -> bool:
        """Python's parser-based path; the other languages read answers with agents/multilang.py."""
        return of_task(self.task.task_id).name == "python"

    def extract(self, text: str, check_signature: bool = True):
        """The candidate in an answer (its code, or why there is none)."""
        if self.python:
            return extract_candidate(text, self.task, keep_context=True, check_signature=check_signature)
        return multilang.extract(text, self.task)

    def key(self, code: str) -> str:
        """The code without what does not change its meaning (comments, layout): repeats compare by it."""
        return normalise(code) if self.python else multilang.normalise(code)

    def program(self, code: str, test: str):
        """The program a candidate and a test become, in the task's language (Python: its source text)."""
        return program_for(self.task, code, test, self.cfg.timeout_s)

    def run(self, code: str, test: str):
        """A candidate run against a test in the sandbox (run_test)."""
        return run_test(self.sandbox, self.task, code, test, self.cfg.timeout_s)

    def execute(self, attempt: Attempt) -> None:
        """Run the visible tests (what the agent learns) and, when they differ, the full test (the verdict)."""
        task, cfg = self.task, self.cfg
        visible = self.run(attempt.code, self.view.feedback_test)
        attempt.visible_result = visible
        if self.view.feedback_test == task.test:
            attempt.result = visible
        else:
            attempt.result = self.run(attempt.code, task.test)
        if attempt.result.passed:
            self.audit(attempt)
        self.ensure_feedback(attempt)

    def audit(self, attempt: Attempt) -> None:
        """A pass whose returned values are not plain builtins (a lying __eq__) is flagged; strict fails it."""
        attempt.suspicious, failed = audit_pass(self.sandbox, self.task, attempt.code, attempt.result, self.cfg)
        if failed is not None:
            if attempt.visible_result is attempt.result:
                attempt.visible_result = failed
            attempt.result = failed

    def self_check(self, judged: list[Attempt], passing: list[int], state: "State | None" = None, rnd: int = 0) -> dict:
        """Group a round's candidates that passed the visible tests (call indexes; a repeat goes with the candidate
        it repeats) by what they return on probe inputs and, with `self_tests`, which of the model's own assertions
        they pass; the best group first (agents/selfcheck.py). With self_check_scope=task the groups also hold the
        earlier rounds' passing answers (`state.pool`, as [round, call] pairs) and the report says which of this
        round's answers is kept (`kept`): a member of the best group, else this round's first (held, unsure)."""
        from .selfcheck import PROBE_RUN_S, behaviour, groups, probe_calls, probe_program, satisfied

        task, knobs = self.task, self.cfg.strategy
        across = knobs.self_check_scope == "task" and state is not None
        calls = probe_calls(self.view.feedback_test, task.entry_point,
                            own=self.write_own_inputs() if knobs.self_inputs else ())
        checks = self.write_own_tests() if knobs.self_tests else []
        ran: dict[int, tuple | None] = {}
        if calls or checks:
            test = probe_program(task.entry_point, calls, checks)
            for i in passing:
                if judged[i].decision == "tested":
                    run = self.sandbox.run(build_program(judged[i].code, test), min(PROBE_RUN_S, self.cfg.timeout_s))
                    ran[i] = behaviour(run.stdout, len(calls) + len(checks))
        else:  # nothing to probe with: only answers with the same code agree
            ran = {i: (normalise(judged[i].code),) for i in passing if judged[i].decision == "tested"}
        seen = [ran[i] if i in ran else ran.get(judged[i].same_as_candidate) for i in passing]
        members = [[rnd, i] for i in passing]
        if across:  # the buggy code handed back is no fix, however often it comes back: it never votes
            votes = [j for j, i in enumerate(passing) if not judged[i].unchanged]
            added = [[rnd, passing[j], None if seen[j] is None else list(seen[j])] for j in votes]
            seen = [None if b is None else tuple(b) for _, _, b in state.pool] + [seen[j] for j in votes]
            members = [[r, i] for r, i, _ in state.pool] + [[rnd, passing[j]] for j in votes]

        def own_passed(b: tuple | None) -> int:
            return sum(v == "pass" for v in b[len(calls):]) if b and checks else 0

        order = groups(seen) or [[]]  # [[]]: nothing votes (only the buggy code came back)
        if checks and seen:  # CodeT: answers that agree and assertions they pass vouch for each other
            order.sort(key=lambda g: (-len(g) * (1 + own_passed(seen[g[0]])), -len(g), g[0]))
        grouped = [[members[j] for j in g] for g in order]
        report = {"probes": len(calls), "groups": grouped if across else [[i for _, i in g] for g in grouped],
                  "runs": len(ran) if calls or checks else 0}
        if knobs.self_inputs:
            report["own_inputs"] = len(self.own_inputs)
        if checks:
            report["own_tests"] = len(checks)
            report["own_passed"] = [own_passed(seen[g[0]]) if g else 0 for g in order]
        ok = satisfied(len(grouped[0]), knobs.self_check, (report.get("own_passed") or [0])[0], len(checks),
                       selfcheck.SELF_TESTS_PASS)
        if across:
            mine = [i for r, i in grouped[0] if r == rnd]  # this round's answers in the best group
            report["scope"], report["behaviours"] = "task", added
            report["satisfied"] = ok and bool(mine)
            report["kept"] = mine[0] if mine else next((i for i in passing if not judged[i].unchanged), passing[0])
            report["held"] = not report["satisfied"]
        else:
            report["satisfied"], report["kept"] = ok, grouped[0][0][1]
        return report

    def write_own_tests(self) -> list[str]:
        """self_tests: the model's own assertions about the function (conditions, at most `self_tests`)."""
        from .selfcheck import own_assertions

        if self.own_tests is None:
            self.own_tests = self._ask_once("self_tests.txt", self.cfg.strategy.self_tests, OWN_TESTS_TURN,
                                            own_assertions)
        return self.own_tests

    def write_own_inputs(self) -> list[str]:
        """self_inputs: inputs of the model's own to probe with (argument tuples, at most `self_inputs`)."""
        from .selfcheck import own_inputs

        if self.own_inputs is None:
            self.own_inputs = self._ask_once("self_inputs.txt", self.cfg.strategy.self_inputs, OWN_INPUTS_TURN,
                                             own_inputs)
        return self.own_inputs

    def _ask_once(self, template: str, n: int, turn: int, parse) -> list[str]:
        """A side call the self-check makes once a task, greedy, from what the agent sees (the shown code and the
        visible tests; never the full test), read by `parse`; kept in `side_calls` so its tokens count."""
        task = self.task
        prompt = render(template, task=task, entry_point=task.entry_point, code=self.view.code.strip("\n"), tests=self.view.tests,
                        n=n)
        call = self.call([{"role": "user", "content": prompt}], 0, turn=turn, stop=CODE_STOP, temperature=0.0)
        self.side_calls.append(call)
        return [] if call.error else parse(call.output, task.entry_point, self.view.feedback_test, n)

    def buggy_failure(self) -> str | None:
        """show_failure: how the shown buggy code fails the visible tests (shaped feedback),
        run once a task; None when it passes them (a bug the visible tests do not reach) or cannot be read."""
        if self._failure is None:
            task, code = self.task, self.shown_code
            run = self.run(code, self.view.feedback_test)
            self.side_runs += 1
            if not self.python:
                self._failure = "" if run.passed else multilang.feedback(run, feedback.FEEDBACK_CHARS).strip()
                return self._failure or None
            self._failure = "" if run.passed else shape_feedback(
                run, code, self.view.feedback_test, self.sandbox, timeout_s=self.cfg.timeout_s,
                max_chars=feedback.FEEDBACK_CHARS, compute_actual=True, entry_point=task.entry_point,
                trace_chars=feedback.TRACE_CHARS).strip()
        return self._failure or None

    def take_side_calls(self) -> list[ModelCall]:
        calls, self.side_calls = self.side_calls, []
        return calls

    def ensure_feedback(self, attempt: Attempt) -> None:
        """Feedback on a failed visible run; computed on every round (also the last: a continuation reads it)."""
        visible = attempt.visible
        if attempt.feedback is not None or visible is None or visible.passed or attempt.code is None:
            return
        cfg, style = self.cfg, feedback.FEEDBACK_STYLE
        if attempt.unchanged:
            attempt.feedback = render("unchanged.txt").strip()
            if style == "verdict":
                return
            attempt.feedback += "\n"
        else:
            attempt.feedback = ""
        if style == "shaped" and not self.python:
            attempt.feedback += multilang.feedback(visible, feedback.FEEDBACK_CHARS)
        elif style == "raw":
            attempt.feedback += raw_feedback(visible, cfg.timeout_s, feedback.FEEDBACK_CHARS)
        elif style == "verdict":
            attempt.feedback += "The tests failed." if visible.status != "timeout" else "The tests timed out."
        else:
            attempt.feedback += shape_feedback(
                visible, attempt.code, self.view.feedback_test, self.sandbox, timeout_s=cfg.timeout_s,
                max_chars=feedback.FEEDBACK_CHARS, compute_actual=True, entry_point=self.task.entry_point,
                trace_chars=feedback.TRACE_CHARS)

    def judge(self, attempt: Attempt, text: str, state: "State", run: bool = True) -> str:
        """Extract a candidate from `text` into `attempt` and decide: no_code | syntax_error | repeat | tested."""
        cfg, task = self.cfg.strategy, self.task
        if answers_as_patches(cfg) and (OPEN in text or not code_blocks(text)):
            # an answer without a block but with a code block is the whole function: read as one (small models
            # fall back to the format they know)
            patched = apply_patch(closed(text), self.view.code)
            if patched.problem:
                attempt.decision, attempt.problem = "no_code", patched.problem
                attempt.feedback = patched.problem
                return attempt.decision
            text = f"```{task.lang.fence}\n" + patched.code + "```"
        ex = self.extract(text)
        attempt.code = ex.code
        if ex.problem == "no_code" or (ex.problem and SYNTAX_PATH):
            attempt.decision = "no_code" if ex.problem == "no_code" else "syntax_error"
            attempt.problem = ex.detail
            attempt.feedback = ex.detail
            return attempt.decision
        if ex.problem:
            attempt.problem = ex.detail  # syntax path off: the sandbox reports it
        key = self.key(ex.code)
        if key in self.buggy_keys:
            attempt.unchanged = True  # still run (it fails by construction), but the feedback says so
        if key in state.seen:
            attempt.decision = "repeat"
            attempt.same_as_round = state.seen[key]
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
    # self_check_scope=task: every earlier answer that passed what the agent saw, as [round, call, behaviour on the
    # probes and own assertions] (agents/selfcheck.py); a later answer's agreement is counted against them
    pool: list = field(default_factory=list)
