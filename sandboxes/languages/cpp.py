"""C++ (HumanEvalPack `cpp`): g++ -std=c++11 with the reference's include helper and OpenSSL, as
bigcode-evaluation-harness builds it (one file: helper + candidate cut at its own `int main` + test; -lcrypto -lssl).

fixlab compiles the tests apart from the candidate, so no macro or declaration of the candidate's reaches them: the
candidate's file is the helper + the declaration's helpers it leaves out + the candidate; the tests' file is the helper
+ the declaration's prototypes + the test, its `main` renamed for the harness (harness/cpp_harness.cpp), which writes
the proof after it returns. Before linking, harness/objcheck.py holds the candidate's object to its rules (no symbol
the tests or a library define, no call that reaches a file descriptor, process or signal, no system-call
instruction). The helper is a precompiled header and each test's object is built once, so a program costs the
candidate's compile, the check and the link.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

from .base import SYSTEM_PYTHON, Failure, Language, Program, Step, Toolchain, cut_block, tail

# bigcode-evaluation-harness humanevalpack.py IMPORT_HELPER["cpp"], in its order.
INCLUDE_HELPER = "\n".join([
    "using namespace std;", "#include<stdlib.h>", "#include<algorithm>", "#include<cmath>", "#include<math.h>",
    "#include<numeric>", "#include<stdio.h>", "#include<vector>", "#include<set>", "#include<map>",
    "#include<queue>", "#include<stack>", "#include<list>", "#include<deque>", "#include<boost/any.hpp>",
    "#include<string>", "#include<climits>", "#include<cstring>", "#include<iostream>", "#include<sstream>",
    "#include<fstream>",
])
GXX = "/usr/bin/g++"
STD = "-std=c++11"  # the reference's flags: no optimisation, C++11
LIBS = ("-lcrypto", "-lssl")
NM = "/usr/bin/nm"
# gold links these small programs in a fraction of ld.bfd's time, with the same first-definition rule for COMDATs
LINKER = ("-fuse-ld=gold",) if os.path.exists("/usr/bin/ld.gold") else ()
TESTS_MAIN = "fixlab_tests"
_PP = re.compile(r"^\s*(#.*|using\s+namespace\s+\w+\s*;)\s*$", re.M)


def _functions(code: str) -> list[tuple[str, str, str]]:
    """Top-level function definitions of a declaration-like text: (name, header, whole definition); the last may be
    open (the declaration ends at the entry point's opening brace)."""
    body = _PP.sub(lambda m: " " * len(m.group(0)), code)
    out, i = [], 0
    while True:
        brace = body.find("{", i)
        if brace < 0:
            return out
        header = body[i:brace].strip()
        end = cut_block(body, brace)
        m = re.search(r"(\w+)\s*\([^()]*\)\s*$", header)
        if m:
            out.append((m.group(1), header, code[i:end].strip()))
        i = end


class Cpp(Language):
    name, title, task_prefix = "cpp", "C++", "CPP"
    fences = ("cpp", "c++", "cc", "cxx", "c", "")
    run_timeout_s = 60.0  # the reference's 60 s (its compile and run each had it)
    compile_timeout_s = 60.0
    toolchain = Toolchain(commands=(GXX, "/usr/bin/nm", "/usr/bin/objdump", "/usr/bin/objcopy", "/usr/bin/c++filt"),
                          packages=("g++", "binutils", "libboost-dev", "libssl-dev"),
                          files=("/usr/include/boost/any.hpp", "/usr/include/openssl/md5.h"))
    entry_pattern = r"\b{name}\s*\("
    harness_files = ("cpp_harness.cpp", "objcheck.py")

    def __init__(self):
        self._tests_lock = threading.Lock()

    def version_commands(self):
        return [[GXX, "--version"], ["/usr/bin/ld", "--version"]]

    def prepare(self, into: Path) -> None:
        from ..toolchains import HARNESS, run

        (into / "helper.h").write_text(INCLUDE_HELPER + "\n")
        run([GXX, STD, "-x", "c++-header", into / "helper.h", "-o", into / "helper.h.gch"])
        run([GXX, STD, "-c", HARNESS / "cpp_harness.cpp", "-o", into / "harness.o"])
        (into / "harness.syms").write_text(run([NM, "-P", "-g", into / "harness.o"]))
        # every symbol the linked libraries export: a candidate may not define one (objcheck.py)
        probe = into / "probe"
        (into / "probe.cpp").write_text('#include "helper.h"\nint main(){return 0;}\n')
        run([GXX, STD, "-include", into / "helper.h", into / "probe.cpp", "-o", probe, *LIBS])
        libs = re.findall(r"=>\s*(\S+)", run(["/usr/bin/ldd", probe]))
        names = set()
        for lib in libs:
            for line in run(["/usr/bin/nm", "-D", "--defined-only", "-P", lib]).splitlines():
                names.add(line.split()[0].split("@")[0])
        (into / "exports.txt").write_text("\n".join(sorted(names)) + "\n")
        for p in (probe, into / "probe.cpp"):
            p.unlink()
        (into / "tests").mkdir()

    def _prepared(self) -> Path:
        from ..toolchains import prepared

        return prepared(self)

    def context(self, task) -> str:
        """The declaration; where HumanEvalPack's declaration holds part of the body (CPP/38: it and the canonical body
        do not balance), the prompt, which does."""
        code = task.declaration + task.canonical_solution
        balanced = code.count("{") == code.count("}")
        return task.declaration if balanced else task.prompt

    def candidate_source(self, candidate: str, task) -> str:
        """The candidate's file: cut at its own `int main` (the reference's rule), with the declaration's includes and
        the helper functions it leaves out put back in front."""
        code = candidate.split("int main")[0]
        defined = {name for name, _, _ in _functions(code)}
        decl = self.context(task)
        includes = "\n".join(m.group(0).strip() for m in _PP.finditer(decl))
        helpers = [whole for name, _, whole in _functions(decl)[:-1] if name not in defined]
        return "\n".join([includes, *helpers, code])

    def tests_source(self, test: str, task) -> str:
        """The tests' file: the declaration's prototypes, then the test with its main renamed (returning 0 at its end,
        as main does)."""
        decl = self.context(task)
        protos = [header + ";" for _, header, _ in _functions(decl)]
        includes = "\n".join(m.group(0).strip() for m in _PP.finditer(decl))
        m = re.search(r"\bint\s+main\s*\(\s*(void)?\s*\)", test)
        if m is None:
            raise ValueError(f"{task.task_id}: the test has no `int main()`")
        end = cut_block(test, m.end())
        body = test[:m.start()] + f"int {TESTS_MAIN}()" + test[m.end():end - 1] + "\nreturn 0;\n}" + test[end:]
        return "\n".join([includes, *protos, body])

    def _tests_object(self, source: str, prep: Path) -> Path:
        """The tests' object, built once per test text (trusted input: the dataset's tests), outside any run."""
        key = hashlib.sha256(source.encode()).hexdigest()[:20]
        obj = prep / "tests" / f"{key}.o"
        if obj.exists():
            return obj
        with self._tests_lock:
            if not obj.exists():
                work = prep / "tests" / f"{key}.{os.getpid()}"
                work.mkdir(exist_ok=True)
                (work / "tests.cpp").write_text(source)  # compiled by this name: assertions say tests.cpp:LINE
                tmp = obj.with_suffix(f".{os.getpid()}.o")
                r = subprocess.run([GXX, STD, "-include", str(prep / "helper.h"), "-c", "tests.cpp", "-o", str(tmp)],
                                   capture_output=True, text=True, cwd=work)
                shutil.rmtree(work, ignore_errors=True)
                if r.returncode != 0:
                    raise ValueError(f"the task's test does not compile: {r.stderr.strip()[-300:]}")
                listing = subprocess.run([NM, "-P", "-g", str(tmp)], capture_output=True, text=True, check=True).stdout
                syms = obj.with_suffix(f".{os.getpid()}.syms")
                syms.write_text(listing)  # objcheck.py reads it instead of running nm on every program
                for f in (tmp, syms):
                    os.chmod(f, 0o644)
                os.replace(syms, obj.with_suffix(".syms"))
                os.replace(tmp, obj)
        return obj

    def program(self, candidate: str, test: str, task, run_timeout_s: float | None = None) -> Program:
        prep = self._prepared()
        tests_obj = self._tests_object(self.tests_source(test, task), prep)
        helper = str(prep / "helper.h")
        check = (SYSTEM_PYTHON, "-I", "-S", str(Path(__file__).parent / "harness" / "objcheck.py"),
                 "candidate.o", str(prep / "exports.txt"), str(tests_obj.with_suffix(".syms")),
                 str(prep / "harness.syms"))
        steps = (
            Step("compile", (GXX, STD, "-include", helper, "-c", "candidate.cpp", "-o", "candidate.o"),
                 self.compile_timeout_s, processes=16),
            Step("compile", check, 30.0, processes=8),
            Step("compile", (GXX, *LINKER, "-o", "prog", str(prep / "harness.o"), str(tests_obj), "candidate.o", *LIBS),
                 self.compile_timeout_s, processes=16),
            Step("run", ("./prog",), max(run_timeout_s or 0, self.run_timeout_s), processes=1, secret="fd"),
        )
        files = (("candidate.cpp", self.candidate_source(candidate, task)), ("tests.cpp", self.tests_source(test, task)))
        return Program(self.name, files, steps, shown_file="tests.cpp")

    def reference_program(self, candidate: str, test: str, task):
        program = (INCLUDE_HELPER + "\n" + candidate.split("int main")[0]).strip() + "\n" + test
        return {"test.cpp": program}, [[GXX, STD, "test.cpp", *LIBS], ["./a.out"]]

    def failure(self, stdout: str, stderr: str, program, stage: str) -> Failure:
        if stage == "compile":
            errors = [ln for ln in stderr.splitlines() if " error: " in ln or ln.startswith("sandbox: ")
                      or "undefined reference" in ln]
            first = errors[0] if errors else (stderr.strip().splitlines() or [""])[-1]
            kind = "PolicyError" if first.startswith("sandbox: ") else (
                "LinkError" if "undefined reference" in first or "ld returned" in stderr else "CompileError")
            return Failure(line=None, kind=kind, message=tail(stderr.strip(), 1500))
        m = re.search(r"tests\.cpp:(\d+): .*Assertion `(.*)' failed", stderr)
        if m:
            return Failure(line=m.group(2).strip(), kind="AssertionError", message=tail(stderr.strip(), 1500),
                           extra={"failing_lineno": int(m.group(1))})
        kind = "Crash" if stderr.strip() or stdout.strip() else None
        return Failure(line=None, kind=kind, message=tail((stderr or stdout).strip(), 1500))


LANGUAGE = Cpp()
