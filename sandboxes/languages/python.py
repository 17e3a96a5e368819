"""Python (HumanEvalPack `python`): bigcode-evaluation-harness's humanevalfixtests-python layout (the import helper +
the candidate + "\\n\\n" + the test, which ends with check(entry_point); sandboxes/program.py), run by a warm worker
that forks an interpreter per program in the jail (sandboxes/_jail.py: the secret sealed in the runner's own frame,
the audit hook, the end-of-run checks). A Python program is its source text, not a Program: it needs no compile step.
The agents' Python-only techniques (the syntax path, shaped feedback with the actual value, the self-check's probes,
the audit of passes) read Python with its own parser (agents/extract.py, agents/feedback.py, sandboxes/audit.py)."""
from __future__ import annotations

from ..program import build_program
from ..verdict import parse_failure
from .base import Failure, Language, tail


class Python(Language):
    name, title, task_prefix = "python", "Python", "Python"
    fences = ("", "python", "py", "python3", "py3")
    comment = "#"
    run_timeout_s = 10.0  # the reference's (the job's sandbox.timeout_s)
    compile_timeout_s = 0.0
    entry_pattern = r"def {name}"

    def program(self, candidate: str, test: str, task, run_timeout_s: float | None = None) -> str:
        return build_program(candidate, test)

    def reference_program(self, candidate: str, test: str, task):
        import sys

        return {"program.py": build_program(candidate, test)}, [[sys.executable, "program.py"]]

    def failure(self, stdout: str, stderr: str, program, stage: str) -> Failure:
        line, kind = parse_failure(stderr, "program.py", program if isinstance(program, str) else "")
        return Failure(line=line, kind=kind, message=tail(stderr.strip(), 1500))


LANGUAGE = Python()
