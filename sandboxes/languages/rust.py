"""Rust (HumanEvalPack `rust`): rustc 1.63 and the crates rand, regex and md5, as bigcode-evaluation-harness runs it
(one file: `fn main(){}` + the declaration's lines the answer lacks + the answer + the test, as src/bin/test.rs of a
cargo project with rand = "0.4", regex = "1", md5 = "0.7.0"; `cargo check`, then `cargo test`).

The crates come from Debian (librust-*-dev) through an offline cargo directory source. Debian has only rand 0.8.5,
whose `gen_range` takes a range, while the reference pinned rand 0.4 and Rust/32's and Rust/50's tests call
`rng.gen_range(low, high)`: so prepare() adds a crate of its own named rand, version 0.4.6
(harness/rust_rand04: 0.4's API implemented over rand 0.8.5, a renamed dependency) to a copy of Debian's registry,
and cargo resolves the reference's `rand = "0.4"` to it. prepare() builds that registry's crates once in the
reference's own cargo project (dev profile: debug assertions and overflow checks on, as `cargo test` has them), which
also serves as the reference's target dir, shared across its runs as on the reference's machine.

fixlab compiles each program with one rustc (no cargo) against those rlibs, with the dev profile's semantics
(opt-level 0, overflow checks and debug assertions on; no debuginfo; std linked as a shared library). The crate
forbids `unsafe`. main.rs puts the answer (candidate.rs, with the declaration's `use` lines and helper functions it
lacks) in `mod candidate`, and the tests (tests.rs) in a module inside it that sees only the declaration's names:
its `use` lines, trusted copies of its helpers, and the entry point as a wrapper with the declared signature that
calls the candidate's (so a candidate type whose `==` always holds cannot stand in for `bool`, as the C++ tests
compile against the declaration's prototypes). Every macro the tests call is a path (`::std::assert_eq!`), so no
`macro_rules!` of the candidate's replaces it. Its `main` hands the test functions to the harness crate
(harness/rust_proof.rs), which runs them on the main thread and writes the proof after the last one; before the run,
harness/rust_objcheck.py holds the program's object to its rules (safe Rust has soundness holes: no file, socket,
fd or process API, no constructor section, and only `main` may call the harness).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .base import Failure, Language, Program, Step, Toolchain, cut_block, tail

RUSTC, CARGO = "/usr/bin/rustc", "/usr/bin/cargo"
REGISTRY = "/usr/share/cargo/registry"
CRATE = "prog"
# The reference's project (CodeGeeX's humaneval-x Rust environment, which bigcode's executor runs).
CARGO_TOML = ('[package]\nname = "rust"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n'
              'rand = "0.4"\nregex = "1"\nmd5 = "0.7.0"\n')
CARGO_CONFIG = '[source.crates-io]\nreplace-with = "fixlab"\n\n[source.fixlab]\ndirectory = "{registry}"\n\n' \
               '[net]\noffline = true\n'
DEV_PROFILE = ("-C", "opt-level=0", "-C", "debug-assertions=on", "-C", "overflow-checks=on", "-C", "debuginfo=0")
STD_MACROS = frozenset("""assert assert_eq assert_ne debug_assert debug_assert_eq debug_assert_ne vec format print
println eprint eprintln panic unreachable unimplemented todo write writeln matches concat stringify format_args dbg
""".split())
# The tests' macro calls, skipping strings, chars and comments.
_MACRO = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'|//[^\n]*|/\*.*?\*/|(?<![\w:])(\w+)!(?=\s*[(\[{])', re.S)
_FN = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?fn\s+(\w+)", re.M)
_HEADER = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?fn\s+(\w+)\s*(<[^(]*>)?\s*\((.*)\)\s*(->\s*[^{]*?)?\s*\{?\s*$", re.S)
_PARAM = re.compile(r"^\s*(?:mut\s+)?(\w+)\s*:(?!:)\s*(.+?)\s*$", re.S)
# A type the declared signature names but the candidate defines (Rust/137's return type): the tests compare values
# of a trusted copy, which the wrapper builds from the candidate's by variant, so its `==` is not the candidate's.
MIRRORS = {"RtnType": (
    "#[derive(Debug, PartialEq)]\npub enum RtnType<S, F, I> { Empty(), String(S), Float(F), Int(I) }",
    "match {call} {{ super::RtnType::String(v) => RtnType::String(v), super::RtnType::Float(v) => RtnType::Float(v), "
    "super::RtnType::Int(v) => RtnType::Int(v), #[allow(unreachable_patterns)] _ => RtnType::Empty() }}")}
_ALLOW = "#[allow(unused_imports, deprecated, dead_code, non_snake_case, unused_variables, unused_mut)]"


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for c in text:
        depth += c in "<([" 
        depth -= c in ">)]"
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur] if cur.strip() else out


class Rust(Language):
    name, title, task_prefix = "rust", "Rust", "Rust"
    fences = ("rust", "rs", "")
    run_timeout_s = 300.0  # the reference's 300 s (for cargo's first build and the run together)
    compile_timeout_s = 120.0
    toolchain = Toolchain(commands=(RUSTC, CARGO, "/usr/bin/cc", "/usr/bin/nm", "/usr/bin/objdump"),
                          packages=("rustc", "cargo", "librust-rand-dev", "librust-regex-dev", "librust-md5-dev"),
                          files=(f"{REGISTRY}/rand-0.8.5", f"{REGISTRY}/regex-1.7.1", f"{REGISTRY}/md5-0.7.0"))
    entry_pattern = r"\bfn\s+{name}\s*[<(]"

    def version_commands(self):
        return [[RUSTC, "-vV"], [CARGO, "--version"], ["/bin/ls", REGISTRY]]

    # -- the prepared parts ---------------------------------------------------------------------------------------

    def prepare(self, into: Path) -> None:
        """Debian's registry + the rand 0.4 crate; the reference's cargo project with its crates built (check and
        test builds), whose rlibs fixlab's programs link; the harness crate."""
        from ..toolchains import HARNESS, run

        final = into.with_name(into.name.split(".build-")[0])  # toolchains.prepared renames the folder when done
        registry = into / "registry"
        shutil.copytree(REGISTRY, registry, symlinks=False)
        shim = registry / "rand-0.4.6"
        shutil.copytree(HARNESS / "rust_rand04", shim)
        (shim / ".cargo-checksum.json").write_text('{"package":"","files":{}}')
        ref = into / "ref"
        (ref / "src" / "bin").mkdir(parents=True)
        (ref / "Cargo.toml").write_text(CARGO_TOML)
        (ref / "src" / "bin" / "test.rs").write_text("fn main(){}\n#[cfg(test)]\nmod tests {\n#[test]\nfn t() {}\n}\n")
        home = into / "cargo-home"
        home.mkdir()
        (home / "config.toml").write_text(CARGO_CONFIG.format(registry=registry))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(into), "CARGO_HOME": str(home), "RUSTC": RUSTC}
        run([CARGO, "check", "--bin", "test"], cwd=ref, env=env)
        out = run([CARGO, "test", "--bin", "test", "--no-run", "--message-format=json"], cwd=ref, env=env)
        rlibs = {}
        for line in out.splitlines():
            msg = json.loads(line) if line.startswith("{") else {}
            pid = msg.get("package_id", "")
            for want in ("rand 0.4.", "regex 1.", "md5 0."):
                if msg.get("reason") == "compiler-artifact" and pid.startswith(want):
                    rlibs[want.split()[0]] = next(f for f in msg["filenames"] if f.endswith(".rlib"))
        target = ref / "target"
        shutil.rmtree(home)
        # the reference's runs copy this target dir as symlinks: what cargo writes there must not be one
        for p in [target / ".rustc_info.json", target / "debug" / ".cargo-lock", target / "debug" / "test",
                  target / "debug" / "test.d", target / "debug" / "incremental", *target.glob("debug/deps/test-*"),
                  *target.glob("debug/.fingerprint/rust-*")]:
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        sysroot = run([RUSTC, "--print", "sysroot"]).strip()
        host = re.search(r"host: (\S+)", run([RUSTC, "-vV"])).group(1)
        run(["/usr/bin/cc", "-shared", "-fPIC", "-O2", HARNESS / "rust_procexe.c", "-o", into / "procexe.so", "-ldl"])
        proof = into / "libfixlab_proof.rlib"
        run([RUSTC, "--edition", "2021", "--crate-type", "rlib", "--crate-name", "fixlab_proof", *DEV_PROFILE,
             HARNESS / "rust_proof.rs", "-o", proof])
        rel = {k: str(final / Path(v).relative_to(into)) for k, v in rlibs.items()}
        (into / "rust.json").write_text(json.dumps({
            "deps": str(final / "ref" / "target" / "debug" / "deps"), "extern": rel,
            "proof": str(final / proof.name), "preload": str(final / "procexe.so"), "registry": str(final / "registry"),
            "target": str(final / "ref" / "target"), "stdlib": f"{sysroot}/lib/rustlib/{host}/lib"}))

    def _info(self) -> dict:
        from ..toolchains import prepared

        return json.loads((prepared(self) / "rust.json").read_text())

    # -- the program -----------------------------------------------------------------------------------------------

    def strip_tests(self, code: str, task) -> str:
        """An answer without the `#[cfg(test)] mod tests` it echoes."""
        m = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests\s*\{", code)
        return code if m is None else code[:m.start()] + code[cut_block(code, m.start(), lifetimes=True):]

    def _declaration(self, task):
        """The declaration's `use` lines, its helper functions (whole) and the entry point's header."""
        decl = self.context(task)
        uses = [ln.strip() for ln in decl.splitlines() if ln.strip().startswith("use ")]
        starts = [m.start() for m in _FN.finditer(decl)]
        helpers = [(m.group(1), decl[m.start():cut_block(decl, m.start(), lifetimes=True)].strip())
                   for m in list(_FN.finditer(decl))[:-1]]
        if not starts:
            raise ValueError(f"{task.task_id}: the declaration has no fn")
        return uses, helpers, decl[starts[-1]:].strip()

    def candidate_parts(self, candidate: str, task) -> tuple[list[str], str]:
        """The answer cut before a second `fn main()` (the reference's rule); and what main.rs puts before it: the
        declaration's `use` lines it lacks (the reference's test: the stripped line is not in the answer) and the
        helpers it does not define. candidate.rs is the answer alone, so its line numbers are the answer's."""
        code = "fn main()".join(candidate.split("fn main()")[0:2])
        uses, helpers, _ = self._declaration(task)
        added = [f"#[allow(unused_imports, deprecated)] {u}" for u in uses if u not in code]
        added += [f"#[allow(dead_code)]\n{whole}" for name, whole in helpers if not re.search(rf"\bfn\s+{name}\b", code)]
        if "global_asm" in code:  # module-level assembly: the unsafe_code lint does not see it
            added.insert(0, 'compile_error!("sandbox: programs here may not use global_asm!");')
        return added, code

    def tests_source(self, test: str, task) -> tuple[str, list[str]]:
        """The test with `#[cfg(test)]` and `#[test]` dropped, its test functions pub(crate), every macro call a
        std path; and the test functions' names. Line numbers are the test's."""
        names = []

        def mark(m):
            names.append(m.group(2))
            return m.group(1) + "pub(crate) fn " + m.group(2)

        text = test.replace("#[cfg(test)]", "")
        text = re.sub(r"#\[test\]((?:\s|//[^\n]*)*)fn\s+(\w+)", mark, text)
        text = re.sub(r"\bmod\s+tests\s*\{", "pub(crate) mod tests {", text, count=1)

        def qualify(m):
            if m.group(1) is None:
                return m.group(0)
            if m.group(1) not in STD_MACROS:
                raise ValueError(f"{task.task_id}: the test calls a macro fixlab does not know: {m.group(1)}!")
            return f"::std::{m.group(1)}!"

        text = _MACRO.sub(qualify, text)
        if not names:
            raise ValueError(f"{task.task_id}: the test has no #[test] function")
        return text, names

    def _wrapper(self, header: str, task) -> tuple[str, str]:
        """The entry point with the declared signature, calling the candidate's; and the mirror types it needs."""
        m = _HEADER.match(header)
        if m is None:
            raise ValueError(f"{task.task_id}: cannot read the entry point's header {header!r}")
        name, generics, params, ret = m.group(1), m.group(2) or "", m.group(3), (m.group(4) or "").strip()
        args = []
        for p in _split_top(params):
            pm = _PARAM.match(p)
            if pm is None:
                raise ValueError(f"{task.task_id}: cannot read the parameter {p!r}")
            args.append(pm.group(1))
        call = f"super::{name}({', '.join(args)})"
        mirrors = [t for t in MIRRORS if re.search(rf"\b{t}\b", ret)]
        body = MIRRORS[mirrors[0]][1].format(call=call) if mirrors else call
        fn = f"pub(crate) fn {name}{generics}({params.strip()}) {ret} {{ {body} }}"
        return fn, "\n".join(MIRRORS[t][0] for t in mirrors)

    def main_source(self, added: list[str], task, names: list[str]) -> str:
        uses, helpers, header = self._declaration(task)
        wrapper, mirrors = self._wrapper(header, task)
        calls = ", ".join(f'("tests::{n}", candidate::__fixlab_tests::tests::{n} as fn())' for n in names)
        return "\n".join([
            "// fixlab (sandboxes/languages/rust.py): the answer and the tests in a crate that may not use unsafe.",
            "#![forbid(unsafe_code)]",
            "mod candidate {",
            *added,
            'include!("candidate.rs");',
            "// the tests see the declaration's names only; the entry point is the candidate's, as declared",
            _ALLOW,
            "pub(crate) mod __fixlab_tests {",
            *uses, *(whole for _, whole in helpers), mirrors, wrapper,
            'include!("tests.rs");',
            "}",
            "}",
            f"fn main() {{ ::fixlab_proof::run(&[{calls}]) }}",
            ""])

    def program(self, candidate: str, test: str, task, run_timeout_s: float | None = None) -> Program:
        info = self._info()
        tests, names = self.tests_source(test, task)
        added, code = self.candidate_parts(candidate, task)
        files = (("main.rs", self.main_source(added, task, names)), ("candidate.rs", code), ("tests.rs", tests))
        externs = [a for k, v in info["extern"].items() for a in ("--extern", f"{k}={v}")]
        rustc = (RUSTC, "--edition", "2021", "--crate-type", "bin", "--crate-name", CRATE, *DEV_PROFILE,
                 "-C", "prefer-dynamic", "-C", f"link-arg=-Wl,-rpath,{info['stdlib']}",
                 "-L", f"dependency={info['deps']}", *externs, "--extern", f"fixlab_proof={info['proof']}",
                 "--emit=link,obj", "main.rs", "-o", "prog")
        check = (sys.executable, "-I", "-S", str(Path(__file__).parent / "harness" / "rust_objcheck.py"), "prog.o",
                 CRATE)
        steps = (
            Step("compile", rustc, self.compile_timeout_s, processes=64, memory_mb=4096,
                 env=(("LD_PRELOAD", info["preload"]),)),
            Step("compile", check, 30.0, processes=8),
            Step("run", ("./prog",), max(run_timeout_s or 0, self.run_timeout_s), processes=1, secret="fd"),
        )
        return Program(self.name, files, steps, shown_file="tests.rs")

    def reference_program(self, candidate: str, test: str, task):
        """bigcode's program (humanevalpack.py process_results) as src/bin/test.rs of the reference's project, its
        target dir the prepared one (copied as symlinks: cargo writes only the new binary's files)."""
        g = candidate
        new_gen = "" if "fn main()" in g else "fn main(){}\n"
        for line in task.declaration.split("\n"):
            if line.strip() not in g:
                if line.strip().startswith("fn") and line.strip().split("(")[0] in g:
                    continue
                new_gen += line.strip() + "\n"
        g = "fn main()".join(g.split("fn main()")[0:2])
        program = new_gen + g + "\n" + test
        info = self._info()
        files = {"src/bin/test.rs": program, "Cargo.toml": CARGO_TOML, "Cargo.lock": Path(info["target"]).parent
                 .joinpath("Cargo.lock").read_text(), ".cargo/config.toml": CARGO_CONFIG.format(registry=info["registry"])}
        return files, [["/bin/cp", "-rs", info["target"], "target"], [CARGO, "check", "--bin", "test"],
                       [CARGO, "test", "--bin", "test"]]

    def reference_as_program(self, candidate: str, test: str, task) -> Program:
        """The reference's steps; cargo and rustc get the jail's stand-in for /proc/self/exe (harness/rust_procexe.c)."""
        prog = super().reference_as_program(candidate, test, task)
        env = (("LD_PRELOAD", self._info()["preload"]),)
        return Program(prog.language, prog.files, tuple(Step(**{**s.__dict__, "env": env}) for s in prog.steps),
                       prog.shown_file)

    # -- reading a failure -----------------------------------------------------------------------------------------

    def failure(self, stdout: str, stderr: str, program, stage: str) -> Failure:
        files = dict(program.files) if isinstance(program, Program) else {}
        if stage == "compile":
            if "sandbox: " in stderr:
                line = next(ln for ln in stderr.splitlines() if "sandbox: " in ln)
                return Failure(line=None, kind="PolicyError", message=line[line.index("sandbox: "):].strip())
            blocks = re.split(r"\n(?=(?:error|warning)(?:\[\w+\])?: )", "\n" + stderr)
            errors = [b.strip() for b in blocks if re.match(r"error(\[\w+\])?: ", b.strip())
                      and not b.strip().startswith("error: aborting")]
            if not errors:
                return Failure(line=None, kind="CompileError", message=tail(stderr.strip(), 1500))
            first = errors[0]
            loc = re.search(r"--> ([\w.]+):(\d+):\d+", first)
            line = None
            if loc and loc.group(1) in files:
                src = files[loc.group(1)].splitlines()
                n = int(loc.group(2))
                line = src[n - 1].strip() if 0 < n <= len(src) else None
            extra = {"failing_lineno": int(loc.group(2)), "failing_file": loc.group(1)} if loc else {}
            return Failure(line=line, kind="CompileError", message=tail(first, 1500), extra=extra)
        m = (re.search(r"panicked at '(.*?)', ([\w./-]+):(\d+):\d+", stderr, re.S)
             or re.search(r"panicked at ([\w./-]+):(\d+):\d+:\n(.*?)(?:\nnote: |\Z)", stderr, re.S))
        if m:
            msg, file, n = (m.group(1), m.group(2), m.group(3)) if m.re.pattern.startswith("panicked at '") \
                else (m.group(3), m.group(1), m.group(2))
            src = files.get(os.path.basename(file), "").splitlines()
            n = int(n)
            line = src[n - 1].strip() if 0 < n <= len(src) else None
            if line and file.endswith("tests.rs"):
                line = re.sub(r"::std::(\w+!)", r"\1", line)
            kind = "AssertionError" if msg.startswith("assertion failed") else "Panic"
            where = f"{os.path.basename(file)}:{n}"
            return Failure(line=line, kind=kind, message=tail(f"{msg.strip()}\n  at {where}: {line or ''}".strip(), 1500),
                           extra={"failing_lineno": n, "failing_file": os.path.basename(file)})
        if "test result:" not in stdout:
            return Failure(line=None, kind="EarlyExit", message=tail(
                ("the program ended before its tests did (no test result)\n" + (stderr or stdout)).strip(), 1500))
        return Failure(line=None, kind=None, message=tail((stderr or stdout).strip(), 1500))


LANGUAGE = Rust()
