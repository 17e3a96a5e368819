"""single_shot: every round an independent fresh attempt (the resampling baseline feedback must beat)."""
from __future__ import annotations

import difflib

from ..context import CODE_STOP, OWN_TESTS_TURN, State, render
from .. import lines as line_answers  # FUNCTION_EVERY read at call time (a test changes it)
from ..lines import LOCATE_LINES, fixable_lines, rank_lines, replace_line
from ..types import Attempt
from .base import Strategy

LOCATE_TURN = OWN_TESTS_TURN + 1  # the localisation call's seed slot (greedy anyway)


class SingleShot(Strategy):
    """Every round: the same fresh prompt. Feedback is never read. Its answers form one stream per task (answer p =
    round * candidates + candidate, with round p's seed and temperature), so every (candidates, iters) point is a
    prefix of one stream, judged `candidates` at a time (flows/stream.py cuts them from one run).

    answer_format=line (agents/lines.py): answers 0, F, 2F... (F = FUNCTION_EVERY) are whole functions as above; the
    others each correct one line, the j-th line answer the j-th line of the task's ranking (greedy the first time
    round, then at the round's temperature). The ranking is made once, before the first line answer: lines the
    earlier whole-function answers changed, then those a localisation call quotes, then the rest in source order."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.ranking: list[int] | None = None  # line format: indexes of the shown code's lines, most suspect first
        code = ctx.view.code.strip("\n")
        self.fixable = fixable_lines(code, ctx.task.buggy_solution, ctx.task.lang)  # line format: the lines an answer may correct
        self._first: str | None = None  # line format: answer 0's code (a whole function), the ranking's lead
        self._made: dict[int, tuple[int, str]] = {}  # id(call) -> (line, candidate text) for line answers

    def draw(self, messages: list[dict], rnd: int, stop: tuple) -> list:
        k = self.ctx.cfg.strategy.candidates
        return self.ctx.answers(messages, range(rnd * k, rnd * k + k), stop=stop)

    def produce(self, state: State, rnd: int) -> Attempt:
        knobs, ctx = self.ctx.cfg.strategy, self.ctx
        if knobs.answer_format != "line":
            return super().produce(state, rnd)
        k, code = knobs.candidates, ctx.view.code.strip("\n")
        positions = range(rnd * k, rnd * k + k)
        whole = [p for p in positions if self._line_index(p) is None]
        lines = [p for p in positions if p not in whole]
        calls = dict(zip(whole, ctx.answers(state.messages, whole, stop=CODE_STOP))) if whole else {}
        if 0 in calls and not calls[0].error:  # answer 0 leads the ranking whether or not it is judged yet
            self._first = ctx.extract(calls[0].output, False).code
        side, located = [], None
        if lines and self.ranking is None:
            side = [self._locate(code)]
            located = [i + 1 for i in self.ranking]
        if lines:
            at = {p: self._line_at(p) for p in lines}
            made = ctx.answers(lambda p: self._line_messages(code, at[p][0]), lines, stop=CODE_STOP,
                               temperature=lambda p: 0.0 if at[p][1] else None)
            for p, call in zip(lines, made):  # the candidate each line answer makes (the call keeps its own text)
                calls[p] = call
                if not call.error:
                    new, problem = replace_line(code, at[p][0], call.output, ctx.task.lang.declared_name(ctx.task),
                                                 ctx.task.lang)
                    self._made[id(call)] = (at[p][0] + 1, problem or f"```{ctx.task.lang.fence}\n" + new + "```")
        ordered = [calls[p] for p in positions]
        attempt = self._pick(ordered, rnd, state) if k > 1 or self.checking() else self._judged(ordered[0], rnd, state)
        attempt.calls = side + attempt.calls
        attempt.located = located
        return attempt

    def _line_index(self, p: int) -> int | None:
        """Which line answer stream position p is (0, 1, ...), or None for a whole-function answer."""
        f = line_answers.FUNCTION_EVERY
        if (f and p % f == 0) or not self.fixable:  # no line to correct: whole functions only
            return None
        return p - (p // f + 1) if f else p

    def _line_at(self, p: int) -> tuple[int, bool]:
        """(index of the shown code's line line answer p corrects, whether greedy: the ranking's first time round)."""
        j = self._line_index(p)
        return self.ranking[j % len(self.ranking)], j < len(self.ranking)

    def _locate(self, code: str):
        """One greedy call quoting the lines most likely wrong; with the lines answer 0 changed ahead of them, it
        ranks the shown code's lines (agents/lines.py)."""
        ctx = self.ctx
        call = ctx.call(self._line_messages(code, None), 0, turn=LOCATE_TURN, stop=CODE_STOP, temperature=0.0)
        changed = f"```{ctx.task.lang.fence}\n" + "\n".join(self._changed(code)) + "\n```"
        self.ranking = rank_lines(code, self.fixable, changed, "" if call.error else call.output,
                                  lang=ctx.task.lang)
        return call

    def _changed(self, code: str) -> list[str]:
        """The shown code's lines that answer 0 (a whole function) replaced or removed; blank lines are layout."""
        if not self._first:
            return []
        lines = code.split("\n")
        shown = [i for i, x in enumerate(lines) if x.strip()]
        ops = difflib.SequenceMatcher(a=[lines[i].strip() for i in shown], autojunk=False,
                                      b=[x.strip() for x in self._first.split("\n") if x.strip()]).get_opcodes()
        return [lines[shown[i]] for tag, i1, i2, _, _ in ops if tag in ("replace", "delete") for i in range(i1, i2)]

    def _line_messages(self, code: str, at: int | None) -> list[dict]:
        ctx = self.ctx
        failure = ctx.buggy_failure() if ctx.cfg.strategy.show_failure else None
        line = None if at is None else code.split("\n")[at].strip()
        return [{"role": "system", "content": render("system.txt", task=ctx.task, patch=False, line=True)},
                {"role": "user", "content": render("locate.txt", task=ctx.task, code=code, tests=ctx.view.tests,
                                                   failure=failure, line=line, n=LOCATE_LINES)}]

    def _judged(self, call, rnd: int, state: State, run: bool = True) -> Attempt:
        made = self._made.pop(id(call), None)
        if made is None:
            return super()._judged(call, rnd, state, run)
        attempt = Attempt(round=rnd, decision="tested", calls=[call], line=made[0])
        self.ctx.judge(attempt, made[1], state, run=run)
        return attempt

    def absorb(self, state: State, attempt: Attempt) -> None:
        if attempt.located is not None and self.ranking is None:  # a replayed round: the ranking it made
            self.ranking = [i - 1 for i in attempt.located]
        if attempt.round == 0 and attempt.line is None and self._first is None:  # a replayed answer 0
            self._first = attempt.code
        super().absorb(state, attempt)
