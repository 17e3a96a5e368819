"""Go (HumanEvalPack `go`): the task's testify tests, as bigcode-evaluation-harness runs them (`go test` on one
main_test.go: test_setup + an import for each helper package the code uses + the candidate + the test), built here
without the go command: `go tool compile` twice and `go tool link`, against archives prepared once per machine.

The candidate is a package of its own (fixlab/candidate): its package and import lines are blanked and it imports
what the reference's import helper adds for the code it has, so it reaches no os, syscall, unsafe, reflect or testing
(nor //go:linkname, which needs unsafe). The tests are package main with test_setup's imports; of the candidate they
see the entry point alone (so no declaration of its can shadow a universe name, `assert` or a package they use), and
they call the prompt's own copy of a helper. Their main calls harness/go_harness.go (fixlab/harness), which runs
them with the testing package's own runner and writes the proof after the last one returned. Every program links
testify's assert without its HTTP assertions, which no task calls (so no net/http), and std with CGO_ENABLED=0.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from .base import Failure, Language, Program, Step, Toolchain, cut_block, tail

GO = "/usr/bin/go"
GOPATH = "/usr/share/gocode"  # Debian's golang-*-dev sources, GOPATH mode (GO111MODULE=off)
# bigcode-evaluation-harness humanevalpack.py IMPORT_HELPER["go"], in its order.
IMPORT_HELPER = ("math", "strings", "fmt", "strconv", "time", "bytes", "regexp", "sort", "math/rand", "crypto/md5")
# One name of each, used once in a file that imports it: an import added for a word that only looks like a use
# ("xmath." in a string) is then not an "imported and not used" error.
_USE = {"math": "Abs", "strings": "Compare", "fmt": "Sprint", "strconv": "Itoa", "time": "Now", "bytes": "Compare",
        "regexp": "MustCompile", "sort": "Ints", "math/rand": "Intn", "crypto/md5": "Sum"}
ASSERT = "github.com/stretchr/testify/assert"
CANDIDATE, HARNESS_PKG = "fixlab/candidate", "fixlab/harness"
_BUILD_ENV = {"GO111MODULE": "off", "GOPATH": GOPATH, "CGO_ENABLED": "0", "GOFLAGS": "", "GOTOOLCHAIN": "local"}
_FUNC = re.compile(r"^func\s+(\w+)\s*[\[(]", re.M)
_PACKAGE, _IMPORT, _SEMI = re.compile(r"package\s+\w+[ \t]*;?"), re.compile(r"import\b\s*"), re.compile(r"[ \t]*;")
_SPEC = re.compile(r"(?:[\w.]+\s+)?(\"(?:\\.|[^\"\\\n])*\"|`[^`]*`)")  # [name] "path"


def _uses(code: str, pkg: str) -> bool:
    """The reference's rule: `p.` (p the path's last part) on a line that does not start with //."""
    p = pkg.split("/")[-1] + "."
    return any(p in line and not line.strip().startswith("//") for line in code.split("\n"))


def _skip_space(code: str, i: int) -> int:
    while i < len(code):
        if code[i].isspace() or code[i] == ";":
            i += 1
        elif code.startswith("//", i):
            i = code.find("\n", i)
            i = len(code) if i < 0 else i
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            i = len(code) if j < 0 else j + 2
        else:
            return i
    return i


def _blank(code: str, start: int, end: int) -> str:
    return code[:start] + re.sub(r"[^\n]", " ", code[start:end]) + code[end:]


def strip_header(code: str) -> str:
    """The code with its package clause and leading import declarations blanked (the lines kept, so that line
    numbers stay the answer's). An import after a declaration stays: the compiler refuses it, as go test does."""
    i = _skip_space(code, 0)
    m = _PACKAGE.match(code, i)
    if m:
        code = _blank(code, m.start(), m.end())
        i = m.end()
    while True:
        i = _skip_space(code, i)
        m = _IMPORT.match(code, i)
        if not m:
            return code
        j = m.end()
        if code.startswith("(", j):
            end = cut_block(code.replace("(", "{").replace(")", "}"), j)
        else:
            spec = _SPEC.match(code, j)
            end = spec.end() if spec else j
        semi = _SEMI.match(code, end)
        end = semi.end() if semi else end
        code = _blank(code, i, end)
        i = end


def _imports(pkgs) -> str:
    return "import (" + "; ".join(f'"{p}"' for p in pkgs) + "); " if pkgs else ""


def _setup_imports(test_setup: str) -> list[str]:
    return re.findall(r'^\s*"([^"]+)"', test_setup, re.M)


def helpers(task) -> list[tuple[str, str]]:
    """Functions the prompt defines before the entry point and the declaration leaves out (Go/10, 32, 38 and 50:
    IsPalindrome, Poly, EncodeCyclic, EncodeShift): (name, source with the comment above it)."""
    declared = set(_FUNC.findall(task.declaration))
    out = []
    for m in _FUNC.finditer(task.prompt):
        if m.group(1) in declared:
            continue
        end = cut_block(task.prompt, m.end())
        if end >= len(task.prompt):
            continue
        start = m.start()
        while True:  # the comment lines right above it
            prev = task.prompt.rfind("\n", 0, max(start - 1, 0))
            line = task.prompt[prev + 1:start - 1] if start else ""
            if not line.lstrip().startswith("//"):
                break
            start = prev + 1
        out.append((m.group(1), task.prompt[start:end].strip()))
    return out


def _trim_assert(src: Path, dest: Path) -> None:
    """testify's assert without its HTTP assertions (http_assertions.go and the methods forwarding to them), which
    no HumanEvalPack test calls: the rest is Debian's source as it is, and net/http, TLS and x509 stay out of every
    link (about half the packages the linker would read)."""
    dest.mkdir(parents=True)
    for f in sorted(src.glob("*.go")):
        if f.name.endswith("_test.go") or f.name == "http_assertions.go":
            continue
        text = f.read_text()
        if f.name in ("assertion_format.go", "assertion_forward.go"):  # generated: one function a paragraph
            kept = [c for c in text.split("\n\n") if not re.search(r"^func (\(a \*Assertions\) )?HTTP\w*\(", c, re.M)]
            text = "\n\n".join(kept)
            for name, path in (("http", "net/http"), ("url", "net/url")):
                if not re.search(rf"\b{name}\.", text):
                    text = re.sub(rf'^\s*(?:{name}\s+)?"{path}"\n', "", text, flags=re.M)
        (dest / f.name).write_text(text)


class Go(Language):
    name, title, task_prefix = "go", "Go", "Go"
    fences = ("go", "golang", "")
    run_timeout_s = 20.0  # the reference's 20 s (LANGUAGE_TO_TIMEOUT["go"], also go test's -timeout)
    compile_timeout_s = 60.0
    toolchain = Toolchain(commands=(GO,), packages=("golang-go", "golang-github-stretchr-testify-dev"),
                          files=(f"{GOPATH}/src/{ASSERT}/assertions.go",))
    entry_pattern = r"\bfunc\s+{name}\s*[\[(]"
    harness_files = ("go_harness.go",)

    def __init__(self):
        self._cfg: tuple[Path, str, str, str] | None = None

    def version_commands(self):
        return [[GO, "version"], ["/usr/bin/dpkg-query", "-W", *self.toolchain.packages, "golang-gopkg-yaml.v3-dev",
                                  "golang-github-davecgh-go-spew-dev", "golang-github-pmezard-go-difflib-dev"]]

    def prepare(self, into: Path) -> None:
        """Archives of testify's assert and every package the programs link (built with CGO_ENABLED=0 and without
        DWARF), the harness package, an import config naming them, and a warm GOCACHE for the reference's
        own `go test` (its machine keeps one)."""
        from ..toolchains import HARNESS, run, say

        env = {"PATH": "/usr/bin:/bin", "HOME": str(into), "GOCACHE": str(into / "gocache.build"), **_BUILD_ENV}
        goenv = json.loads(run([GO, "env", "-json", "GOROOT", "GOTOOLDIR"], env=env))
        pkgs = [ASSERT, "testing", "os", "io", "errors", "reflect", "time", "encoding/hex", "sync/atomic",
                *IMPORT_HELPER]
        # without DWARF (the links drop it anyway): fewer symbols for each link to read
        listing = [GO, "list", "-deps", "-export", "-gcflags=all=-dwarf=false", "-f", "{{.ImportPath}}={{.Export}}",
                   *pkgs]
        try:
            _trim_assert(Path(GOPATH) / "src" / ASSERT, into / "gopath" / "src" / ASSERT)
            listed = run(listing, env={**env, "GOPATH": f"{into / 'gopath'}:{GOPATH}"})
        except (OSError, subprocess.CalledProcessError):  # another testify: the whole package, as Debian ships it
            say("Go: testify's assert without its HTTP assertions did not build; using the whole package")
            listed = run(listing, env=env)
        shutil.rmtree(into / "gopath", ignore_errors=True)
        lines = []
        for ln in listed.split():
            path, export = ln.split("=", 1)
            if not export:
                continue  # unsafe: built into the compiler
            if not export.startswith(goenv["GOROOT"] + "/"):  # built here (all, without DWARF)
                dest = into / "pkg" / f"{path}.a"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(export, dest)
                export = f"@PREP@/pkg/{path}.a"
            lines.append(f"packagefile {path}={export}")
        (into / "importcfg.in").write_text("\n".join(lines) + "\n")
        tool = Path(goenv["GOTOOLDIR"])
        cfg = into / "importcfg.build"
        cfg.write_text((into / "importcfg.in").read_text().replace("@PREP@", str(into)))
        (into / "pkg" / "fixlab").mkdir(parents=True)
        run([tool / "compile", "-p", HARNESS_PKG, "-complete", "-dwarf=false", "-importcfg", cfg, "-pack",
             "-o", into / "pkg" / "fixlab" / "harness.a", HARNESS / "go_harness.go"], env=env)
        cfg.unlink()
        shutil.rmtree(into / "gocache.build", ignore_errors=True)
        (into / "goenv.json").write_text(json.dumps(goenv))
        # the reference's cache: one go test of its layout, with its environment (cgo as Go's default)
        probe = into / "probe"
        probe.mkdir()
        (probe / "main_test.go").write_text('package main\n\nimport (\n    "testing"\n    "' + ASSERT + '"\n)\n\n'
                                            "func TestProbe(t *testing.T) {\n    assert.New(t).Equal(1, 1)\n}\n")
        run(["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", f"HOME={probe}", f"GOCACHE={into / 'refcache'}",
             *self._reference_env(), GO, "test", "-timeout=20s", "main_test.go"], cwd=probe)
        shutil.rmtree(probe)

    @staticmethod
    def _reference_env() -> list[str]:
        return ["GO111MODULE=off", f"GOPATH={GOPATH}", "GOFLAGS=", "GOTOOLCHAIN=local"]

    def _config(self) -> tuple[Path, str, str, str]:
        """(prepared folder, tool dir, the import config of the tests' compile and the link, the candidate's)."""
        if self._cfg is None:
            from ..toolchains import prepared

            prep = prepared(self)
            goenv = json.loads((prep / "goenv.json").read_text())
            full = (prep / "importcfg.in").read_text().replace("@PREP@", str(prep))
            full += f"packagefile {HARNESS_PKG}={prep}/pkg/fixlab/harness.a\npackagefile {CANDIDATE}=candidate.a\n"
            # the candidate's compile can resolve only the import helper's packages
            own = "".join(ln + "\n" for ln in full.splitlines() if ln.split("=")[0][12:] in IMPORT_HELPER)
            self._cfg = (prep, goenv["GOTOOLDIR"], full, own)
        return self._cfg

    def context(self, task) -> str:
        """The declaration, after the helper functions the prompt defines and the declaration leaves out."""
        found = helpers(task)
        return "".join("\n" + src + "\n" for _, src in found) + task.declaration if found else task.declaration

    def strip_tests(self, code: str, task) -> str:
        """An answer without the Test functions it echoes (the tests' own would clash with them)."""
        for m in reversed(list(re.finditer(r"^func\s+Test\w*\s*\([^)]*\*testing\.T\s*\)", code, re.M))):
            code = code[:m.start()] + code[cut_block(code, m.end()):]
        return code

    def candidate_source(self, candidate: str, task) -> str:
        """package fixlab/candidate: the answer (its package and imports blanked), the helpers it leaves out, and
        the imports its code uses, on the answer's first line so that every line keeps its number."""
        code = strip_header(candidate.lstrip("\ufeff"))
        have = set(_FUNC.findall(code))
        code += "".join("\n\n" + src + "\n" for name, src in helpers(task) if name not in have)
        pkgs = [p for p in IMPORT_HELPER if _uses(code, p)]
        uses = "".join(f"\nvar _ = {p.split('/')[-1]}.{_USE[p]}" for p in pkgs)
        return f"package candidate; {_imports(pkgs)}{code}{uses}\n"

    def tests_source(self, test: str, task) -> str:
        """package main: the test (from the first line on, so that its lines keep their numbers) with test_setup's
        imports that it uses, the entry point bound to the candidate's, the prompt's own copy of each helper the
        test calls (Poly, EncodeCyclic, EncodeShift: an answer's copy cannot bend the check), and a main that hands
        the Test functions to the harness."""
        names = re.findall(r"^func\s+(Test\w*)\s*\(\s*\w+\s+\*testing\.T\s*\)", test, re.M)
        if not names:
            raise ValueError(f"{task.task_id}: the test defines no Test function")
        entry = self.declared_name(task)
        given = "".join(f"\n{src}\n" for name, src in helpers(task) if re.search(rf"\b{name}\s*\(", test))
        # test_setup's, and as in the reference any other of the import helper's that the test uses (Go/44: strconv)
        pkgs = [p for p in dict.fromkeys([*_setup_imports(task.test_setup), *IMPORT_HELPER])
                if p in ("testing", ASSERT) or _uses(test + given, p)]
        uses = "".join(f"\nvar _ = {p.split('/')[-1]}.{_USE[p]}" for p in pkgs if p in _USE)
        head = f'package main; {_imports(pkgs)}import (fixlab "{CANDIDATE}"; "{HARNESS_PKG}"); '
        tests = ", ".join(f'{{Name: "{n}", F: {n}}}' for n in names)
        return (f"{head}{test}\n\nvar {entry} = fixlab.{entry}\n{given}{uses}\n"
                f"func main() {{ harness.Run([]testing.InternalTest{{{tests}}}) }}\n")

    def program(self, candidate: str, test: str, task, run_timeout_s: float | None = None) -> Program:
        prep, tools, cfg, own_cfg = self._config()
        # the compiler's and linker's threads, whatever the machine's cores; no garbage collection in a process this
        # short (RLIMIT_AS still bounds it)
        env = (("GOMAXPROCS", "2"), ("GOGC", "off"))
        compile_ = f"{tools}/compile"
        steps = (
            Step("compile", (compile_, "-p", CANDIDATE, "-complete", "-dwarf=false", "-importcfg",
                             "candidate.importcfg", "-pack", "-o", "candidate.a", "candidate.go"),
                 self.compile_timeout_s, processes=32, env=env),
            Step("compile", (compile_, "-p", "main", "-complete", "-dwarf=false", "-importcfg", "importcfg", "-pack",
                             "-o", "main.a", "tests.go"), self.compile_timeout_s, processes=32, env=env),
            # no symbol table or DWARF: the runtime's own tables still give panics and testify their file:line
            Step("compile", (f"{tools}/link", "-importcfg", "importcfg", "-s", "-w", "-buildid=", "-o", "prog",
                             "main.a"), self.compile_timeout_s, processes=32, env=env),
            Step("run", ("./prog",), max(run_timeout_s or 0, self.run_timeout_s), processes=RUN_PROCESSES,
                 env=(("GOMAXPROCS", "1"),), secret="fd"),
        )
        files = (("candidate.go", self.candidate_source(candidate, task)), ("tests.go", self.tests_source(test, task)),
                 ("candidate.importcfg", own_cfg), ("importcfg", cfg))
        return Program(self.name, files, steps, shown_file="tests.go")

    def reference_source(self, generation: str, test: str, task) -> str:
        """bigcode-evaluation-harness's main_test.go (humanevalpack.py process_results, go), line for line."""
        test_setup_str = task.test_setup + "\n"
        for line in test_setup_str.split("\n"):
            line = line.replace("import", "").replace("(", "").replace(")", "").strip()
            if line.startswith('"') and line in generation:
                test_setup_str = test_setup_str.replace(line, "")
        ref = "\n" + test  # get_reference
        g = test_setup_str + generation + "\n" + ref
        other_pkgs = set()
        for pkg in IMPORT_HELPER:
            if '"' + pkg + '"' not in g:
                p = pkg.split("/")[-1]
                if p + "." in g:
                    for line in g.split("\n"):
                        if (p + ".") in line and not line.strip().startswith("//"):
                            other_pkgs.add('"' + p + '"')
                            break
        other_pkgs_str = ""
        if other_pkgs:
            other_pkgs_str = "import (\n" + "\n".join(["    " + p for p in other_pkgs]) + "\n)\n"
        if "package main" in generation and "package main" in test_setup_str:
            generation = generation.replace("package main", "")
        return test_setup_str + other_pkgs_str + generation + "\n" + ref  # the executor: candidate + "\n" + test

    def reference_program(self, candidate: str, test: str, task):
        prep = self._config()[0]
        # its machine's warm GOCACHE, copied into the run's home (go test writes to it); timed as a step of its own
        warm = ["/bin/sh", "-c", f"mkdir -p .cache && cp -r {prep}/refcache .cache/go-build"]
        cmd = ["/usr/bin/env", *self._reference_env(), GO, "test", "-timeout=20s", "main_test.go"]
        return {"main_test.go": self.reference_source(candidate, test, task)}, [warm, cmd]

    @staticmethod
    def _compile_failure(stderr: str, sources: dict, source) -> Failure:
        """A build that failed: its first errors, the entry point's binding said in the answer's words, and the
        imports an answer here does not choose."""
        out = stderr.strip()
        errors = [ln for ln in out.splitlines() if re.match(r"\S+\.go:\d+(:\d+)?: ", ln)]
        kind = "CompileError"
        if not errors:
            errors = [ln for ln in out.splitlines() if ln.strip()][:1]
            kind = "LinkError" if "relocation target" in out or "link:" in out else kind
        # the tests' binding of the entry point (after the test text), in the answer's words
        errors = [re.sub(r"undefined: (?:candidate|fixlab)\.(\w+)", r"undefined: \1 (the code defines no \1)", ln)
                  for ln in errors]
        errors = [re.sub(r"cannot use generic function (?:candidate|fixlab)\.(\w+) without instantiation",
                         r"the tests call \1 as a function without type parameters", ln) for ln in errors]
        first = errors[0] if errors else ""
        m = re.match(r"(?:.*/)?(\w+\.go):(\d+)", first)
        line = source(m.group(1), int(m.group(2))) if m else None
        shown = errors[:10]
        cand = "\n".join(sources.get("candidate.go", []))
        if any(re.search(rf"\b{re.escape(p)}\.", cand) for p in re.findall(r"undefined: ([a-z]\w*)$", out, re.M)):
            shown.append("(an answer here chooses no imports: its code may use " + ", ".join(IMPORT_HELPER) +
                         ", each imported for it where its code uses it)")
        return Failure(line=line, kind=kind, message=tail("\n".join(shown) or out, 1500))

    def failure(self, stdout: str, stderr: str, program, stage: str) -> Failure:
        sources = {name: text.split("\n") for name, text in program.files} if isinstance(program, Program) else {}

        def source(name: str, n: int) -> str | None:
            lines = sources.get(name, [])
            return lines[n - 1].strip() if 1 <= n <= len(lines) else None

        if stage == "compile":
            return self._compile_failure(stderr, sources, source)
        text = stdout + "\n" + stderr

        def frames(at: str) -> tuple[str | None, list[str]]:
            """The innermost candidate line of the failing goroutine's trace and the test line that called it."""
            g = re.search(r"^goroutine \d+ \[", at, re.M)
            at = at[g.start():].split("\n\n")[0] if g else at
            line, where = None, []
            cand = re.search(r"candidate\.go:(\d+)", at)
            if cand:
                line = source("candidate.go", int(cand.group(1)))
                where.append(f"candidate.go:{cand.group(1)}: {line}")
            test = re.search(r"tests\.go:(\d+)", at)
            if test:
                called = source("tests.go", int(test.group(1)))
                where.append(f"called from tests.go:{test.group(1)}: {called}")
                line = line or called
            return line, where

        panic = re.search(r"^panic: (.*?)(?: \[recovered\])?$", text, re.M)
        if panic:
            line, where = frames(text[panic.end():])
            return Failure(line=line, kind="Panic", message=tail("\n".join(["panic: " + panic.group(1), *where]), 1500))
        fatal = re.search(r"^fatal error: .*$", text, re.M)  # stack overflow, deadlock, out of memory
        if fatal:
            cause = re.findall(r"^runtime: (?!sp=).*$", text[:fatal.start()], re.M)[-1:]
            line, where = frames(text[fatal.end():])
            return Failure(line=line, kind="Crash", message=tail("\n".join([fatal.group(0), *cause, *where]), 1500))
        m = re.search(r"^\s+tests\.go:(\d+): ", text, re.M)  # testing's prefix of a failed assertion's report
        if m:
            n = int(m.group(1))
            line = source("tests.go", n)
            keep = [f"tests.go:{n}: {line}"]
            for ln in text[m.end():].splitlines()[1:]:
                s = ln.strip()
                if s.startswith(("Test:", "Messages:", "Diff:", "--- FAIL", "FAIL")) or re.match(r"tests\.go:\d+: ", s):
                    break
                if s and not s.startswith("Error Trace:"):
                    keep.append(re.sub(r"\s*\t\s*", " ", s))
            return Failure(line=line, kind="AssertionError", message=tail("\n".join(keep[:12]), 1500),
                           extra={"failing_lineno": n})
        body = text.strip()
        return Failure(line=None, kind="Crash" if body else None, message=tail(body, 1500))

# The run step's processes and threads (the jail's supervisor counts as one): the Go runtime starts a few threads of
# its own (sysmon, a spare for a blocked system call) even with GOMAXPROCS=1, and dies when it cannot.
RUN_PROCESSES = 8

LANGUAGE = Go()
