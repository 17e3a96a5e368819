"""Strategy: how a round is produced from the loop state (`produce`) and folded back into it (`absorb`).
The default opening prompt is the system prompt and the fix prompt."""
from __future__ import annotations

from ..config import CANDIDATE_TEMPERATURE
from ..context import CODE_STOP, Context, State, render
from ..patch import STOP as PATCH_STOP, answers_as_patches
from ..types import Attempt


class Strategy:
    def __init__(self, ctx: Context):
        self.ctx = ctx

    def first_messages(self) -> list[dict]:
        ctx = self.ctx
        patch = answers_as_patches(ctx.cfg.strategy)
        failure = ctx.buggy_failure() if getattr(ctx.cfg.strategy, "show_failure", False) else None
        return [{"role": "system", "content": render("system.txt", task=ctx.task, patch=patch)},
                {"role": "user", "content": render("fix.txt", task=ctx.task, code=ctx.view.code.strip("\n"),
                                                   tests=ctx.view.tests, patch=patch, failure=failure)}]

    def initial_state(self) -> State:
        first = self.first_messages()
        return State(messages=first, prefix=len(first))

    def produce(self, state: State, rnd: int) -> Attempt:
        knobs = self.ctx.cfg.strategy
        stop = CODE_STOP
        if answers_as_patches(knobs):
            stop += PATCH_STOP  # an edit ends at its REPLACE marker
        messages = self.messages(state)
        calls = self.draw(messages, rnd, stop)
        if len(calls) > 1 or self.checking():
            return self._pick(calls, rnd, state)
        if knobs.redraws:
            return self._redrawn(calls[0], messages, rnd, state, stop)
        return self._judged(calls[0], rnd, state)

    def checking(self) -> bool:
        """Whether a round's answers that pass what the agent sees go through the self-check (docs/hidden only: under
        `tests` the visible verdict is the full one)."""
        return bool(getattr(self.ctx.cfg.strategy, "self_check", 0)) and self.ctx.view.feedback_test != self.ctx.task.test

    def draw(self, messages: list[dict], rnd: int, stop: tuple) -> list:
        """This round's answers: `candidates` of them, the first at the round's temperature."""
        return self.ctx.calls(messages, rnd, self.ctx.cfg.strategy.candidates, stop=stop)

    def _redrawn(self, call, messages: list[dict], rnd: int, state: State, stop: tuple) -> Attempt:
        """`redraws`: an answer known to fail before it runs (a repeat, the bug handed back) teaches nothing and
        would spend the round: draw again from the same prompt (CANDIDATE_TEMPERATURE, its own seed; the prompt's
        KV is reused) and keep the first other answer. Every call counts in the tokens; calls[-1] is the kept one."""
        cfg, drawn = self.ctx.cfg.strategy, []
        while True:
            attempt = self._judged(call, rnd, state, run=False)
            known = attempt.decision == "repeat" or (attempt.decision == "tested" and attempt.unchanged)
            if not known or len(drawn) == cfg.redraws:
                break
            drawn.append(attempt)
            call = self.ctx.call(messages, rnd, turn=len(drawn), stop=stop, temperature=CANDIDATE_TEMPERATURE)
        if attempt.decision == "tested":
            self.ctx.execute(attempt)
        if drawn:
            attempt.calls = [a.calls[0] for a in drawn] + attempt.calls
            attempt.candidate = len(drawn)
            attempt.rejected = [{"call": i, "decision": "repeat" if a.decision == "repeat" else "unchanged",
                                 "code": a.code, "status": None, "same_as": a.same_as_round}
                                for i, a in enumerate(drawn)]
        return attempt

    def _judged(self, call, rnd: int, state: State, run: bool = True) -> Attempt:
        attempt = Attempt(round=rnd, decision="tested", calls=[call])
        if call.error:
            attempt.decision = "model_error"
            return attempt
        self.ctx.judge(attempt, call.output, state, run=run)
        return attempt

    def _pick(self, calls: list, rnd: int, state: State) -> Attempt:
        """Judge the candidates in order and keep the first whose visible tests pass; else the first that ran
        (its feedback drives the next round), else the first. A candidate equal to one already run this round
        is not run again. With `self_check` under docs/hidden every candidate is judged and the passing ones are
        grouped by what they return on probe inputs: the largest group's first is kept (agents/selfcheck.py)."""
        ctx = self.ctx
        check = self.checking()
        judged, ran = [], {}
        for i, call in enumerate(calls):
            a = self._judged(call, rnd, state, run=False)
            if a.decision == "tested":
                key = ctx.key(a.code)
                if key in ran:
                    a.decision, a.same_as_candidate = "repeat", ran[key]
                else:
                    ran[key] = i
                    self.ctx.execute(a)
            judged.append(a)
            if a.passed_visible and not check:
                break  # only the last judged candidate can have passed
        passing = [i for i, a in enumerate(judged) if a.passed_visible or (
            a.decision == "repeat" and a.same_as_candidate is not None and judged[a.same_as_candidate].passed_visible)]
        report = ctx.self_check(judged, passing, state, rnd) if check and passing else None
        if report is not None:
            keep = report.pop("kept")
        elif judged[-1].passed_visible:
            keep = len(judged) - 1
        else:
            keep = next((i for i, a in enumerate(judged) if a.decision == "tested"), 0)
        kept = judged[keep]
        kept.self_check = report
        # calls[-1] is the kept answer; the own-tests call (self_tests), when this round made it, comes first
        kept.calls = ctx.take_side_calls() + [c for i, c in enumerate(calls) if i != keep] + [calls[keep]]
        kept.candidate = keep
        # "verdict": the full test's status where it differs from what the agent saw (docs/hidden), so what another
        # choice among the same candidates would have scored can be read back (flows/analysis/run_record.py)
        kept.rejected = [{"call": i, "decision": a.decision, "code": a.code,
                          "status": a.visible.status if a.visible is not None else None,
                          "same_as": a.same_as_candidate if a.same_as_candidate is not None else a.same_as_round,
                          **({"verdict": a.result.status} if a.visible_result is not None and a.result is not None
                             and a.result is not a.visible_result else {})}
                         for i, a in enumerate(judged) if i != keep]
        kept.rejected += [{"call": i, "decision": "not_read", "code": None, "status": None, "same_as": None}  # a pass came first
                          for i in range(len(judged), len(calls))]
        return kept

    def messages(self, state: State) -> list[dict]:
        return state.messages

    def absorb(self, state: State, attempt: Attempt) -> None:
        if attempt.decision == "tested" and attempt.code is not None:
            state.seen[self.ctx.key(attempt.code)] = attempt.round
            state.feedback[attempt.round] = attempt.feedback
            check = attempt.self_check or {}
            if check.get("scope") == "task":  # its passing answers join the pool later answers must agree with
                state.pool += check["behaviours"]
            if attempt.held:  # passed what it saw, nobody agrees yet: not handed in, and a repeat of it is a vote
                if not attempt.unchanged:  # (the buggy code handed back never votes: its repeats are not run again)
                    del state.seen[self.ctx.key(attempt.code)]
            elif attempt.visible is not None and attempt.visible.passed:
                # the agent is done; under docs/hidden the verdict may differ, and a failed self-check says so
                state.done = "unsure" if attempt.unsure else "solved"


def header(ctx: Context) -> str:
    """What precedes the buggy body in the agent's view (imports, signature, docstring): kept in a rewrite."""
    view, task = ctx.view, ctx.task
    head = view.code[: len(view.code) - len(task.buggy_solution)] if view.code.endswith(task.buggy_solution) \
        else task.declaration
    return head.strip("\n")


def without_unchanged_note(feedback: str | None) -> str | None:
    """The rewrite and repeat prompts say 'unchanged' themselves; keep only what the tests showed."""
    note = render("unchanged.txt").strip()
    return feedback[len(note):].strip() if feedback and feedback.startswith(note) else feedback
