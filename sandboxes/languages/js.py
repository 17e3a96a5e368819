"""JavaScript (HumanEvalPack `js`): node, as bigcode-evaluation-harness runs it (one test.js: the candidate + "\\n" +
the test; `node test.js`; a pass is a run that printed nothing: console.assert only prints, it never throws).

fixlab runs node on its own harness (harness/js_harness.js), which starts before any candidate code: it takes the
run's secret from fd 4 and closes it, swaps process, console and require for stand-ins that reach none of node's
internals, runs the candidate as a script, then the test as a function whose parameters bind the globals it uses
(console, JSON, Math...) to the values they had before the candidate ran, and writes the proof after the test returned
with no failed assertion. Node's own flags hold the rest: frozen intrinsics (no prototype, JSON or Math is patched),
the permission model (no file read but the harness's, js-md5's and the two scripts, no write, no child process, worker
or inspector), no native addons.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from .base import Failure, Language, Program, Step, Toolchain, cut_block, tail

NODE, NPM = "/usr/bin/node", "/usr/bin/npm"
MD5 = ("js-md5", "0.7.3")  # JavaScript/162's canonical solution requires it; the reference's version
# frozen intrinsics and the permission model announce themselves with an ExperimentalWarning, which would fail every
# run (the reference fails any stderr); other warnings (deprecations) still print, as in the reference.
HEAP_MB = 512
FLAGS = ("--frozen-intrinsics", "--experimental-permission", "--disable-warning=ExperimentalWarning", "--no-addons",
         "--zero-fill-buffers", "--v8-pool-size=1", f"--max-old-space-size={HEAP_MB}")
# Node's threads with one V8 worker (the main one, the worker, its delayed-task scheduler) + the jail's supervisor.
RUN_PROCESSES = 4
# V8 reserves address space it never touches (its code range); this caps ArrayBuffers too. WebAssembly memories,
# which reserve more, do not fit: no HumanEval answer needs one.
RUN_MEMORY_MB = 4096
_DECL = re.compile(r"^(?:const|let|var|function\s*\*?|class|async\s+function)\s*([A-Za-z_$][\w$]*)", re.M)
_DECLARED = re.compile(r"\b(?:const|let|var|function\s*\*?|class)\s+([A-Za-z_$][\w$]*)")
_WORD = re.compile(r"(?<![\w$.])[A-Za-z_$][\w$]*")
_KEYWORDS = frozenset("""break case catch class const continue debugger default delete do else export extends false
finally for function if import in instanceof let new null of return static super switch this throw true try typeof var
void while with yield async await arguments eval""".split())


def _code_only(src: str) -> str:
    """The source with comments, strings and template literals blanked (their line breaks kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i) or src.startswith("/*", i):
            end = src.find("\n" if src[i + 1] == "/" else "*/", i + 2)
            end = n if end < 0 else end + (0 if src[i + 1] == "/" else 2)
        elif c in "'\"`":
            end = i + 1
            while end < n and src[end] != c and (c == "`" or src[end] != "\n"):
                end += 2 if src[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", src[i:end]))
        i = end
    return "".join(out)


def helpers(decl: str) -> list[tuple[str, str]]:
    """(name, source) of each top-level definition of a declaration before the entry point's open header."""
    code = _code_only(decl)
    found = []
    for m in _DECL.finditer(code):
        brace = code.find("{", m.end())
        end = cut_block(code, brace) if brace >= 0 else len(code)
        if end >= len(code):
            break  # the entry point's header, whose body is the candidate's
        found.append((m.group(1), decl[m.start():end].strip()))
    return found


def _defines(code: str, name: str) -> bool:
    """Does (blanked) code declare `name`, or assign it at all?"""
    n = re.escape(name)
    return re.search(rf"\b(?:const|let|var|function\s*\*?|class)\s+{n}\b|(?<![\w$.]){n}\s*=(?![=>])", code) is not None


def tested_globals(test: str, decl: str) -> list[str]:
    """The identifiers the test uses that neither it nor the declaration defines: the harness binds those that are
    globals (console, JSON, Math...) to their values from before the candidate ran. `eval` stays itself."""
    code = _code_only(test)
    own = set(_DECLARED.findall(code)) | set(_DECLARED.findall(_code_only(decl))) | _KEYWORDS
    return sorted({w for w in _WORD.findall(code) if w not in own})


class JavaScript(Language):
    name, title, task_prefix = "js", "JavaScript", "JavaScript"
    fences = ("javascript", "js", "node", "")
    run_timeout_s = 10.0  # the reference's (LANGUAGE_TO_TIMEOUT["js"])
    compile_timeout_s = 0.0  # no compile step: the harness compiles both scripts before running either
    # npm only prepares (js-md5, once); node 20.11 or later runs (Debian trixie's nodejs, or NodeSource's, which
    # provides npm itself and conflicts with Debian's npm package)
    toolchain = Toolchain(commands=(NODE,), packages=("nodejs", "npm"))
    harness_files = ("js_harness.js",)
    entry_pattern = r"\b(?:(?:const|let|var)\s+{name}\s*=|function\s*\*?\s*{name}\s*\()"

    def prepare(self, into: Path) -> None:
        """The harness, and js-md5 from the npm registry into node_modules beside it (the harness resolves it)."""
        from ..toolchains import HARNESS, ToolchainMissing

        probe = subprocess.run([NODE, *FLAGS, "-e", "0"], capture_output=True, text=True, timeout=60)
        if probe.returncode != 0 or probe.stderr:  # the permission model and --disable-warning: node 20.11 and later
            said = (probe.stderr.strip().splitlines() or [str(probe.returncode)])[0][:200]
            raise ToolchainMissing(f"JavaScript needs node 20.11 or later (Debian trixie's nodejs or newer) for its "
                                   f"flags: `{NODE} {' '.join(FLAGS)}` says: {said}")
        if not Path(NPM).exists():
            raise ToolchainMissing(f"JavaScript needs {NPM} once, to install {'@'.join(MD5)} (JavaScript/162): "
                                   f"`apt-get install npm`, or NodeSource's nodejs, which ships it")
        shutil.copyfile(HARNESS / "js_harness.js", into / "js_harness.js")
        (into / "package.json").write_text('{"name": "fixlab-js", "private": true}\n')
        spec = "@".join(MD5)
        env = dict(os.environ, npm_config_cache=str(into / ".npm-cache"), npm_config_update_notifier="false")
        r = subprocess.run([NPM, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-save", spec],
                           cwd=into, capture_output=True, text=True, timeout=300, env=env)
        shutil.rmtree(into / ".npm-cache", ignore_errors=True)
        got = into / "node_modules" / MD5[0] / "package.json"
        if r.returncode != 0 or not got.exists() or json.loads(got.read_text()).get("version") != MD5[1]:
            said = (r.stderr + r.stdout).splitlines()
            why = [ln for ln in said if re.match(r"npm (?:error|ERR!)", ln)] or [ln for ln in said if ln.strip()]
            raise ToolchainMissing(f"JavaScript needs {spec} (JavaScript/162) from the npm registry, once per machine: "
                                   f"`npm install {spec}` failed: {why[0].strip()[:200] if why else r.returncode}")

    def _prepared(self) -> Path:
        from ..toolchains import prepared

        return prepared(self)

    def candidate_source(self, candidate: str, task) -> str:
        """The candidate, then the declaration's helpers it does not define itself (the reference's generation starts
        with the prompt, which holds them); after it, so that its lines keep their numbers."""
        code = _code_only(candidate)
        missing = [src for name, src in helpers(self.context(task)) if not _defines(code, name)]
        return candidate + "".join("\n\n" + src + "\n" for src in missing)

    def strip_tests(self, code: str, task) -> str:
        """An answer without the test functions it echoes and their calls (the task's test runs apart)."""
        names = set(_DECL.findall(_code_only(task.test)))
        for name in sorted(names, key=len, reverse=True):
            blank = _code_only(code)
            for m in reversed(list(re.finditer(rf"^(?:(?:const|let|var)\s+{re.escape(name)}\s*=|function\s+"
                                               rf"{re.escape(name)}\s*\()", blank, re.M))):
                end = cut_block(blank, blank.find("{", m.end()))
                code = code[:m.start()] + code[end:].lstrip(";")
            code = re.sub(rf"^[ \t]*{re.escape(name)}\s*\(\s*\)\s*;?[ \t]*$\n?", "", code, flags=re.M)
        return code

    def program(self, candidate: str, test: str, task, run_timeout_s: float | None = None) -> Program:
        prep = self._prepared()
        harness = str(prep / "js_harness.js")
        reads = tuple(f"--allow-fs-read={p}" for p in (harness, f"{prep}/node_modules/", "candidate.js", "test.js"))
        names = ",".join(tested_globals(test, self.context(task)))
        argv = (NODE, *FLAGS, *reads, harness, "candidate.js", "test.js", names)
        step = Step("run", argv, max(run_timeout_s or 0, self.run_timeout_s), processes=RUN_PROCESSES,
                    memory_mb=RUN_MEMORY_MB, secret="fd")
        files = (("candidate.js", self.candidate_source(candidate, task)), ("test.js", test))
        return Program(self.name, files, (step,), shown_file="test.js")

    def reference_program(self, candidate: str, test: str, task):
        """bigcode's test.js (the generation + "\\n" + the test) and `node test.js`, with js-md5 in node_modules."""
        pkg = self._prepared() / "node_modules" / MD5[0]
        files = {"test.js": candidate + "\n" + test}
        for f in ("package.json", "src/md5.js"):
            files[f"node_modules/{MD5[0]}/{f}"] = (pkg / f).read_text()
        return files, [[NODE, "test.js"]]

    def reference_pass(self, returncode: int, stdout: str, stderr: str) -> bool:
        """code_eval_octopack's rule for JavaScript: nothing on stderr, nothing on stdout; the exit code is not read."""
        return stdout == "" and stderr == ""

    def failure(self, stdout: str, stderr: str, program, stage: str) -> Failure:
        sources = {name: text.split("\n") for name, text in program.files} if isinstance(program, Program) else {}

        def source(name: str, n: int) -> str:
            lines = sources.get(name, [])
            return lines[n - 1].strip() if 1 <= n <= len(lines) else ""

        asserted = re.search(r"^Assertion failed.*\n\s+at (test\.js|candidate\.js):(\d+):(\d+)$", stderr, re.M)
        # an exception's first line: "Uncaught <value>", "<Name>Error: ...", or any "<name>: ..." its frames follow
        error = re.search(r"^(?:Uncaught .*|[A-Z][\w$]*(?:Error|Exception)\b.*|[\w$]+(?: \[\w+\])?:.*(?=\n\s+at ))$",
                          stderr, re.M)
        if asserted and (error is None or asserted.start() < error.start()):
            f, n = asserted.group(1), int(asserted.group(2))
            expr = self._asserted(sources.get(f, []), n, int(asserted.group(3)))
            more = len(re.findall(r"^Assertion failed", stderr, re.M)) - 1
            msg = f"{f}:{n}: console.assert({expr}) failed" + (f" ({more} more failed)" if more else "")
            return Failure(line=expr, kind="AssertionError", message=msg,
                           extra={"failing_lineno": n} if f == "test.js" else {})
        if error:
            head = error.group(0)
            kind = "Uncaught" if head.startswith("Uncaught") else re.match(r"[\w$]+", head).group(0)
            header = re.findall(r"^(candidate\.js|test\.js):(\d+)$", stderr[:error.start()], re.M)  # a SyntaxError's
            frames = [(f, int(n)) for f, n in re.findall(r"\b(candidate\.js|test\.js):(\d+):\d+\)?$",
                                                        stderr[error.end():], re.M)]
            where = [(f, int(n)) for f, n in header[-1:]] or frames[:1]
            if where and where[0][0] == "candidate.js":  # and where the test called into the candidate
                where += [fr for fr in frames if fr[0] == "test.js"][:1]
            lines = [head] + [f"  {'called from' if i else 'at'} {f}:{n}: {source(f, n)}"
                              for i, (f, n) in enumerate(where)]
            line = source(*where[0]) if where else None
            return Failure(line=line or None, kind=kind, message="\n".join(lines)[-1500:])
        fatal = re.search(r"^(?:FATAL ERROR: .*|node\[\d+\]: .*|# Fatal .*)$", stderr, re.M)
        if fatal:  # V8 or node itself gave up (the heap's limit, a thread it could not start)
            oom = "out of memory" in fatal.group(0)
            return Failure(line=None, kind="OutOfMemory" if oom else "Crash", message=fatal.group(0).strip() + (
                f" (the heap is limited to {HEAP_MB} MB)" if oom else ""))
        printed = (stdout + stderr).strip()
        if printed:
            return Failure(line=None, kind="UnexpectedOutput",
                           message=tail("the program printed (the reference fails a run with any output):\n"
                                        + printed, 1500))
        return Failure(line=None, kind="EarlyExit", message="the program printed nothing, and its tests did not all "
                                                           "run to their end (process.exit, or a crash: see the exit "
                                                           "code)")

    @staticmethod
    def _asserted(lines: list[str], n: int, col: int) -> str:
        """The argument of the console.assert call at test.js line n, column col, on one line."""
        text = "\n".join(lines[n - 1:n + 20])
        start = text.find("(", max(col - 1, 0))
        if start < 0:
            return lines[n - 1].strip() if 1 <= n <= len(lines) else ""
        code, depth = _code_only(text), 0
        for i in range(start, len(code)):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            if depth == 0:
                return " ".join(text[start + 1:i].split())
        return " ".join(text[start + 1:].split())


LANGUAGE = JavaScript()
