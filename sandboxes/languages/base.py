"""What every language file gives the sandboxes and the agents: the program a candidate and its tests become, the
commands that build and run it, how its run proves that the tests ran to their end, and how a failure reads.

A compiled program is a `Program`: its files, then its steps (compile steps, then one run step). The sandbox's
worker runs the steps in the jail, each with its own limits, and times them apart; the run step's harness (the
language file's own code, never the candidate's) writes the run's proof after the last assertion. Python keeps its
own path (sandboxes/program.py, the forked interpreter): `Language.program` returns its source text.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

# Lines the run's harness writes on the proof channel: the worker's step reports are JSON lines, the proof is one
# line PROOF_TAG + the secret in hex. Anything else a program writes there makes the run fail, never pass.
PROOF_TAG = "P:"
# The interpreter of a step that runs one of the harness's Python checks: the system's where there is one, as the
# Docker image has it at the same path (this venv's python is not in the image)
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@dataclass(frozen=True)
class Step:
    """One command of a program, run in the jail as the program's uid with these limits."""

    stage: str  # "compile" (its output is the compiler's, kept apart) or "run" (the last step: the tests)
    argv: tuple[str, ...]
    timeout_s: float
    processes: int = 1  # RLIMIT_NPROC: processes and threads the step may have (1: none beyond itself)
    memory_mb: int | None = 2048  # RLIMIT_AS; None where a runtime reserves address space it never uses (JVM, V8)
    env: tuple[tuple[str, str], ...] = ()
    # run step: where its harness reads the run's secret: "fd" (fd 4, read after the last assertion or, where the
    # harness runs before any candidate code, at its start), "stdin" (fd 0), "none" (compile steps)
    secret: str = "none"
    # a compile step a warm service can do in its place (sandboxes/services.py): the language's name, and what the
    # service is told besides the files; argv stays the way the step runs where no service is up
    service: str = ""
    service_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Program:
    """A whole program of a compiled (or non-Python) language: files written into the run's scratch dir, then steps."""

    language: str
    files: tuple[tuple[str, str], ...]
    steps: tuple[Step, ...]
    shown_file: str  # the file whose line numbers a failure names (the tests')

    def source(self, name: str) -> str:
        return dict(self.files)[name]

    @property
    def timeout_s(self) -> float:
        return sum(s.timeout_s for s in self.steps)

    def wire(self) -> dict:
        """What the jailed worker is sent."""
        return {"files": [list(f) for f in self.files],
                "steps": [{"stage": s.stage, "argv": list(s.argv), "timeout_s": s.timeout_s, "processes": s.processes,
                           "memory_mb": s.memory_mb, "env": dict(s.env), "secret": s.secret, "service": s.service,
                           "service_args": list(s.service_args)} for s in self.steps]}


@dataclass(frozen=True)
class Toolchain:
    """What a language needs on the machine: Debian packages (and the commands that show they are there)."""

    commands: tuple[str, ...]  # absolute paths that must exist
    packages: tuple[str, ...]  # Debian packages that provide them
    files: tuple[str, ...] = ()  # other paths that must exist (headers, crates, GOPATH sources)


@dataclass
class Failure:
    """What a failed run says, read from its output: the failing line, the error's kind, and a short message."""

    line: str | None = None
    kind: str | None = None
    message: str = ""
    extra: dict = field(default_factory=dict)


class Language:
    """One language of HumanEvalPack. Subclasses fill the class attributes and the three methods below."""

    name = ""  # the hub's config name: python, js, java, go, cpp, rust
    title = ""  # how prompts name it
    task_prefix = ""  # task ids look like "<task_prefix>/<n>"
    fences: tuple[str, ...] = ()  # code-fence tags an answer in this language may carry ("" = untagged)
    comment = "//"  # a line comment
    # The reference harness's limit (bigcode-evaluation-harness LANGUAGE_TO_TIMEOUT), which there covers compiling
    # and running together: fixlab gives the run alone this much, and compiling its own limit.
    run_timeout_s = 10.0
    compile_timeout_s = 60.0
    toolchain: Toolchain | None = None
    # the harness sources (globs under harness/) the prepared parts are built from: a change in one rebuilds them
    harness_files: tuple[str, ...] = ()
    # Does the task's declaration define the entry point? The dataset check (agents/tasks.py) asks this.
    entry_pattern = r"{name}"

    @property
    def fence(self) -> str:
        """The tag prompts put on this language's code fences."""
        return next(f for f in self.fences if f)

    def defines_entry_point(self, declaration: str, entry_point: str) -> bool:
        return re.search(self.entry_pattern.format(name=re.escape(entry_point)), declaration) is not None

    def program(self, candidate: str, test: str, task) -> Program | str:
        """The program `candidate` (the whole answer's code) and `test` become; `task` has the hub's fields
        (declaration, prompt, entry_point, imports, test_setup)."""
        raise NotImplementedError

    def reference_program(self, candidate: str, test: str, task) -> tuple[dict[str, str], list[list[str]]]:
        """The reference harness's own way (one file, its own commands), for the verdict benchmark: files, commands."""
        raise NotImplementedError

    def reference_as_program(self, candidate: str, test: str, task) -> Program:
        """The reference harness's own way as a Program the jail runs (no harness, no proof): for the verdict
        benchmark and the hack tests, which read its exit code and output with `reference_pass`."""
        files, commands = self.reference_program(candidate, test, task)
        steps = [Step("compile", tuple(c), self.compile_timeout_s, processes=64, memory_mb=None) for c in commands[:-1]]
        steps.append(Step("run", tuple(commands[-1]), self.run_timeout_s, processes=64, memory_mb=None))
        return Program(self.name, tuple(files.items()), tuple(steps), shown_file=next(iter(files)))

    def reference_pass(self, returncode: int, stdout: str, stderr: str) -> bool:
        """The reference's pass rule on the run step's result (JavaScript's looks at the output, not the exit code)."""
        return returncode == 0

    def failure(self, stdout: str, stderr: str, program: Program | str, stage: str) -> Failure:
        """The failing line, the error's kind and a short message, from a failed run's output."""
        return Failure(message=(stderr or stdout).strip()[-1500:])

    def context(self, task) -> str:
        """The code an agent is shown before the buggy body: the declaration, with what the tests need from the
        prompt where the declaration leaves it out (Go's helpers)."""
        return task.declaration

    def version_commands(self) -> list[list[str]]:
        """Commands whose output names the toolchain's versions (its prepared parts are keyed by them)."""
        return [[c, "--version"] for c in (self.toolchain.commands[:1] if self.toolchain else ())]

    def service_argv(self, prep, socket_path: str) -> list[str] | None:
        """The command of this language's warm compile service listening on `socket_path` (sandboxes/services.py),
        or None where its compile steps always run themselves. `prep`: the prepared parts' folder."""
        return None

    def prepare(self, into) -> None:
        """Build the toolchain's reusable, trusted parts into the folder `into` (sandboxes/toolchains.py), once per
        machine: precompiled headers, crates, archives, the harness."""

    def declared_name(self, task) -> str:
        """The entry point's name as the declaration writes it, which the tests call (a few HumanEvalPack tasks name
        their entry_point otherwise: CPP/121 declares `solutions`, entry_point `solution`)."""
        lines = [ln for ln in self.context(task).splitlines() if "(" in ln]
        if lines:
            m = (re.search(r"\b(?:const|let|var|function)\s+(\w+)", lines[-1])
                 or re.search(r"(\w+)\s*(?:<[^()]*>)?\s*\(", lines[-1]))
            if m:
                return m.group(1)
        return task.entry_point

    def strip_tests(self, code: str, task) -> str:
        """An answer's code without the tests or the `main` it echoes back (the harness adds the real ones)."""
        return code

    def entry_signature(self, task) -> str:
        """The entry point's header as the declaration writes it (for prompts and the signature check)."""
        return task.signature


def tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "[...]\n" + text[-chars:]


def cut_block(code: str, start: int, lifetimes: bool = False) -> int:
    """Index just past the brace block opened at or after `start` (strings, chars and comments skipped); len(code)
    when it never closes. `lifetimes`: a quote may open a Rust lifetime ('a), which has no closing quote."""
    depth, i, n = 0, start, len(code)
    opened = False
    while i < n:
        c = code[i]
        if c == "'" and lifetimes:  # a char literal ('x', '\n'), else a lifetime
            end = code.find("'", i + 1, i + 5)
            if end > 0 and (end == i + 2 or code[i + 1] == "\\"):
                i = end
        elif c in "\"'`":
            q = c
            i += 1
            while i < n and code[i] != q:
                i += 2 if code[i] == "\\" else 1
        elif code.startswith("//", i):
            i = code.find("\n", i)
            if i < 0:
                return n
        elif code.startswith("/*", i):
            i = code.find("*/", i + 2)
            if i < 0:
                return n
            i += 1
        elif c == "{":
            depth += 1
            opened = True
        elif c == "}":
            depth -= 1
            if opened and depth == 0:
                return i + 1
        i += 1
    return n
