"""Rust (HumanEvalPack `rust`): rustc 1.63 and the crates rand, regex and md5, as bigcode-evaluation-harness runs it
(one file: `fn main(){}` + the declaration's lines the answer lacks + the answer + the test, as src/bin/test.rs of a
cargo project with rand = "0.4", regex = "1", md5 = "0.7.0"; `cargo check --bin test`, then `cargo test --bin test`).

The crates are Debian's (librust-*-dev), offline. Debian has only rand 0.8.5, whose gen_range takes a range, while
the reference pinned rand 0.4 and Rust/32's and /50's tests call `rng.gen_range(low, high)`. So prepare() copies
Debian's registry (/usr/share/cargo/registry) into the prepared folder as a cargo directory source, adds
harness/rust_rand04 to it as rand-0.4.6 (rand 0.4's API over rand 0.8.5, a dependency renamed rand08; an empty
.cargo-checksum.json), and replaces crates-io with that source, so the reference's own `rand = "0.4"` resolves to
it. There it builds the reference's cargo project once (`cargo check`, `cargo test --no-run`: the dev profile, debug
assertions and overflow checks on); its target dir is the reference's, shared by its runs as on its machine.

fixlab compiles a program with one rustc against those rlibs: edition 2021, the dev profile's semantics (opt-level 0,
overflow checks and debug assertions on) without debuginfo, std linked as a shared library (gold). The crate forbids
`unsafe`. main.rs puts the answer (candidate.rs, after the declaration's `use` lines and helpers it lacks) in `mod
candidate`, and in a module inside it the tests (tests.rs), which see only the declaration's names: its `use` lines,
trusted copies of its helpers, and the entry point as a wrapper with the declared signature that calls the answer's
(so a type whose `==` always holds cannot stand in for `bool`; the C++ tests compile against the declared prototypes
likewise). Each macro the tests call is a path (`::std::assert_eq!`), which no `macro_rules!` of the answer's
replaces. main hands the test functions to the harness crate (harness/rust_proof.rs), which runs them on the main
thread (libtest runs each in a thread of its own, with a 2 MiB stack: deeper recursion fails there, not here) and
writes the proof after the last; before the run, harness/rust_objcheck.py holds the program's object to its rules,
as safe Rust has soundness holes (no file, socket, fd, process or thread API, no constructor section, only main may
call the harness). rustc and cargo find their sysroot through /proc/self/exe, which the jail hides: a preloaded
readlink (harness/rust_procexe.c) answers for it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from .base import SYSTEM_PYTHON, Failure, Language, Program, Step, Toolchain, cut_block, tail

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
    # rustc depends on gcc (its linker driver) and binutils (nm, objdump, ld.gold)
    toolchain = Toolchain(commands=(RUSTC, CARGO, "/usr/bin/cc", "/usr/bin/ld.gold", "/usr/bin/nm", "/usr/bin/objdump"),
                          packages=("rustc", "cargo", "librust-rand-dev", "librust-regex-dev", "librust-md5-dev"),
                          files=(f"{REGISTRY}/rand-0.8.5", f"{REGISTRY}/regex-1.7.1", f"{REGISTRY}/md5-0.7.0"))
    entry_pattern = r"\bfn\s+{name}\s*[<(]"
    harness_files = ("rust_proof.rs", "rust_objcheck.py", "objcheck.py", "rust_procexe.c", "rust_rand04")

    def version_commands(self):
        return [[RUSTC, "-vV"], [CARGO, "--version"], ["/bin/ls", REGISTRY]]

    # -- the prepared parts ---------------------------------------------------------------------------------------

    def prepare(self, into: Path) -> None:
        """Debian's registry + the rand 0.4 crate; the reference's cargo project with its crates built (check and
        test builds), whose rlibs fixlab's programs link; the harness crate and the jail's /proc/self/exe stand-in.
        Cargo keeps the registry's path in the target dir's fingerprints, so it is built through the folder's final
        path (toolchains.prepared renames the folder when this returns): a symlink to it for the while."""
        final = into.with_name(into.name.split(".build-")[0])
        if final.is_symlink():
            final.unlink()
        shutil.rmtree(final, ignore_errors=True)
        final.symlink_to(into)
        try:
            self._build(final)
        finally:
            final.unlink()

    def _build(self, final: Path) -> None:
        from ..toolchains import HARNESS, run

        registry = final / "registry"
        shutil.copytree(REGISTRY, registry, symlinks=False)
        shim = registry / "rand-0.4.6"
        shutil.copytree(HARNESS / "rust_rand04", shim)
        (shim / ".cargo-checksum.json").write_text('{"package":"","files":{}}')
        ref = final / "ref"
        (ref / "src" / "bin").mkdir(parents=True)
        (ref / "Cargo.toml").write_text(CARGO_TOML)
        (ref / "src" / "bin" / "test.rs").write_text("fn main(){}\n#[cfg(test)]\nmod tests {\n#[test]\nfn t() {}\n}\n")
        home = final / "cargo-home"
        home.mkdir()
        (home / "config.toml").write_text(CARGO_CONFIG.format(registry=registry))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(final), "CARGO_HOME": str(home), "RUSTC": RUSTC}
        run([CARGO, "check", "--bin", "test"], cwd=ref, env=env)
        out = run([CARGO, "test", "--bin", "test", "--no-run", "--message-format=json"], cwd=ref, env=env)
        rlibs = {}
        for line in out.splitlines():
            msg = json.loads(line) if line.startswith("{") else {}
            pid = msg.get("package_id", "")
            for want in ("rand 0.4.", "regex 1.", "md5 0."):
                if msg.get("reason") == "compiler-artifact" and pid.startswith(want):
                    rlib = Path(next(f for f in msg["filenames"] if f.endswith(".rlib")))
                    rlibs[want.split()[0]] = str(final / "ref" / "target" / "debug" / "deps" / rlib.name)
        target = ref / "target"
        shutil.rmtree(home)
        # the reference's runs copy this target dir as symlinks: what cargo writes there must not be one
        for p in [target / ".rustc_info.json", target / "debug" / ".cargo-lock", target / "debug" / "test",
                  target / "debug" / "test.d", target / "debug" / "incremental", *target.glob("debug/deps/test-*"),
                  *target.glob("debug/.fingerprint/rust-*")]:
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        sysroot = run([RUSTC, "--print", "sysroot"]).strip()
        host = re.search(r"host: (\S+)", run([RUSTC, "-vV"])).group(1)
        run(["/usr/bin/cc", "-shared", "-fPIC", "-O2", HARNESS / "rust_procexe.c", "-o", final / "procexe.so", "-ldl"])
        run([RUSTC, "--edition", "2021", "--crate-type", "rlib", "--crate-name", "fixlab_proof", *DEV_PROFILE,
             HARNESS / "rust_proof.rs", "-o", final / "libfixlab_proof.rlib"])
        (final / "rust.json").write_text(json.dumps({
            "deps": str(target / "debug" / "deps"), "extern": rlibs, "proof": str(final / "libfixlab_proof.rlib"),
            "preload": str(final / "procexe.so"), "registry": str(registry), "target": str(target),
            "stdlib": f"{sysroot}/lib/rustlib/{host}/lib"}))

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
        added = [f"#[allow(unused_imports, deprecated)] {u}" for u in uses if u not in candidate]
        added += [f"#[allow(dead_code)]\n{whole}" for name, whole in helpers
                  if not re.search(rf"\bfn\s+{name}\b", code)]
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
                 "-C", "prefer-dynamic", "-C", f"link-arg=-Wl,-rpath,{info['stdlib']}", "-C", "strip=debuginfo",
                 "-C", "link-arg=-fuse-ld=gold",
                 "-L", f"dependency={info['deps']}", *externs, "--extern", f"fixlab_proof={info['proof']}",
                 "--emit=link,obj", "main.rs", "-o", "prog")
        check = (SYSTEM_PYTHON, "-I", "-S", str(Path(__file__).parent / "harness" / "rust_objcheck.py"), "prog.o",
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
        lock = (Path(info["target"]).parent / "Cargo.lock").read_text()
        files = {"src/bin/test.rs": program, "Cargo.toml": CARGO_TOML, "Cargo.lock": lock,
                 ".cargo/config.toml": CARGO_CONFIG.format(registry=info["registry"])}
        return files, [["/bin/cp", "-rs", info["target"], "target"], [CARGO, "check", "--bin", "test"],
                       [CARGO, "test", "--bin", "test"]]

    def reference_as_program(self, candidate: str, test: str, task) -> Program:
        """The reference's steps; cargo and rustc get the jail's stand-in for /proc/self/exe (rust_procexe.c)."""
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
            if loc and loc.group(1) == "main.rs":  # fixlab's file: the tests' call of the entry point as declared
                first += "\nnote: main.rs is fixlab's: its tests call the entry point with the declaration's signature"
            return Failure(line=line, kind="CompileError", message=tail(first, 1500), extra=extra)
        m = (re.search(r"panicked at '(.*?)', ([\w./-]+):(\d+):\d+", stderr, re.S)
             or re.search(r"panicked at ([\w./-]+):(\d+):\d+:\n(.*?)(?:\nnote: |\Z)", stderr, re.S))
        if m:
            msg, file, n = (m.group(1), m.group(2), m.group(3)) if m.re.pattern.startswith("panicked at '") \
                else (m.group(3), m.group(1), m.group(2))
            msg = re.sub(r"::\s*std\s*::\s*(\w+)\s*!", r"\1!", msg)  # the tests' macros as the task writes them
            src = files.get(os.path.basename(file), "").splitlines()
            n = int(n)
            line = src[n - 1].strip() if 0 < n <= len(src) else None
            if line and file.endswith("tests.rs"):
                line = re.sub(r"::std::(\w+!)", r"\1", line)
            kind = "AssertionError" if msg.startswith("assertion failed") else "Panic"
            where = f"{os.path.basename(file)}:{n}"
            message = tail(f"{msg.strip()}\n  at {where}: {line or ''}".strip(), 1500)
            return Failure(line=line, kind=kind, message=message,
                           extra={"failing_lineno": n, "failing_file": os.path.basename(file)})
        if "test result:" not in stdout:
            crash = "fatal runtime error" in stderr or "overflowed its stack" in stderr
            return Failure(line=None, kind="Crash" if crash else "EarlyExit", message=tail(
                ("the program ended before its tests did (no test result: it exited, crashed, for instance on a stack "
                 "overflow from endless recursion, or was stopped)\n" + (stderr or stdout)).strip(), 1500))
        return Failure(line=None, kind="TestFailed", message=tail((stderr or stdout).strip(), 1500))


LANGUAGE = Rust()
