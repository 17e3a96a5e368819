"""The compilers and runtimes a language's programs need, and what fixlab builds from them once per machine.

`prepared(lang)` checks the language's toolchain (Debian packages; one line naming them and the command when one is
missing), installs it when allowed (as root with apt-get, one stderr line, as a model pack's first use says what it
does), then builds the language's trusted, reusable parts (precompiled headers, crates, Go archives, the harness
itself) once per machine under $FIXLAB_CACHE/toolchains/<lang>-<key>/, keyed by the toolchain's versions and the
harness sources, so a changed compiler or harness never reuses a stale build. The jail binds that folder read-only.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from .base import SandboxUnavailable

HARNESS = Path(__file__).resolve().parent / "languages" / "harness"
_memo: dict[str, Path] = {}
_memo_lock = threading.Lock()


class ToolchainMissing(SandboxUnavailable):
    """A language's compiler or runtime is not installed here. The message is one line naming the fix."""


def cache_root() -> Path:
    """Where prepared toolchain parts live ($FIXLAB_CACHE, else ~/.cache/fixlab; the packs' root)."""
    return Path(os.environ.get("FIXLAB_CACHE") or Path.home() / ".cache" / "fixlab").expanduser() / "toolchains"


def say(line: str) -> None:
    print(f"fixlab: {line}", file=sys.stderr, flush=True)


def missing(lang) -> list[str]:
    tc = lang.toolchain
    if tc is None:
        return []
    return [p for p in (*tc.commands, *tc.files) if not os.path.exists(p)]


def install_command(lang) -> str:
    return "apt-get install -y " + " ".join(lang.toolchain.packages)


def ensure_installed(lang, *more) -> None:
    """The toolchain (of `lang` and of `more` languages, in one apt-get) is there, or installed now (root with
    apt-get, unless FIXLAB_INSTALL_TOOLCHAINS=0), or a ToolchainMissing naming the packages and the command."""
    wanting = [x for x in (lang, *more) if missing(x)]
    if not wanting:
        return
    packages = sorted({p for x in wanting for p in x.toolchain.packages})
    titles = ", ".join(x.title for x in wanting)
    allowed = os.environ.get("FIXLAB_INSTALL_TOOLCHAINS", "1") != "0"
    if allowed and os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"installing the {titles} toolchain ({' '.join(packages)}) with apt-get, once")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", *packages]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:  # a stale package index: refresh it once
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if not any(missing(x) for x in wanting):
            return
    lang = next(x for x in wanting if missing(x))
    gone = missing(lang)
    raise ToolchainMissing(f"{lang.title} needs {gone[0]} (Debian packages: {' '.join(lang.toolchain.packages)}); "
                           f"fix: `{install_command(lang)}` as root, or `make toolchains`")


def _key(lang) -> str:
    """The toolchain's versions and the harness sources: a change in either builds the parts anew."""
    h = hashlib.sha256()
    for cmd in lang.version_commands():
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=60)
            h.update(r.stdout + r.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            h.update(repr(e).encode())
    for pattern in lang.harness_files:
        for path in sorted(HARNESS.glob(pattern)):
            for f in sorted([path] if path.is_file() else path.rglob("*")):
                if f.is_file():
                    h.update(f.name.encode() + f.read_bytes())
    h.update(Path(sys.modules[type(lang).__module__].__file__).read_bytes())
    return h.hexdigest()[:16]


def prepared(lang) -> Path:
    """The folder of the language's parts built once per machine (built now, under a lock, when it is missing)."""
    with _memo_lock:
        if lang.name in _memo:
            return _memo[lang.name]
    ensure_installed(lang)
    final = cache_root() / f"{lang.name}-{_key(lang)}"
    if not (final / ".done").exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.parent / f".{lang.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / ".done").exists():
                say(f"preparing the {lang.title} toolchain's reusable parts once (into {final})")
                build = final.with_name(final.name + f".build-{os.getpid()}")
                shutil.rmtree(build, ignore_errors=True)
                build.mkdir(parents=True)
                try:
                    lang.prepare(build)
                except subprocess.CalledProcessError as e:
                    out = (e.stderr or e.stdout or b"")
                    out = out.decode(errors="replace") if isinstance(out, bytes) else out
                    raise ToolchainMissing(f"preparing {lang.title} failed: {' '.join(map(str, e.cmd))[:200]}: "
                                           f"{out.strip().splitlines()[-1] if out.strip() else e.returncode}") from None
                for p in [build, *build.rglob("*")]:  # the jail's uids read it; nobody writes it
                    p.chmod(0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
                (build / ".done").write_text("")
                shutil.rmtree(final, ignore_errors=True)
                build.rename(final)
                _prune(final)
    with _memo_lock:
        _memo[lang.name] = final
    return final


def _prune(final: Path, age_s: float = 3600.0) -> None:
    """The language's parts built for other toolchain versions or harnesses, left an hour (a job still running an
    older checkout may use them): removed, so that edits do not pile up folders of a hundred megabytes."""
    import time

    lang = final.name.rsplit("-", 1)[0]
    for old in final.parent.glob(f"{lang}-*"):
        if old != final and old.is_dir() and time.time() - old.stat().st_mtime > age_s:
            shutil.rmtree(old, ignore_errors=True)


def run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    """A preparation step (trusted inputs only); its output, or CalledProcessError."""
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, check=True)
    return r.stdout.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    """`python -m sandboxes.toolchains install [LANG ...]`: install and prepare these languages' toolchains (all
    when none is named), one line each; `packages`: the Debian packages they need."""
    import argparse

    from .languages import NAMES, language

    ap = argparse.ArgumentParser(prog="python -m sandboxes.toolchains", description=main.__doc__.splitlines()[0])
    ap.add_argument("action", choices=["install", "packages"])
    ap.add_argument("languages", nargs="*", choices=[n for n in NAMES if n != "python"] + [[]], default=[])
    args = ap.parse_args(argv)
    langs = [language(n) for n in (args.languages or [n for n in NAMES if n != "python"])]
    if args.action == "packages":
        print(" ".join(sorted({p for lang in langs for p in lang.toolchain.packages})))
        return 0
    try:
        ensure_installed(*langs)
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for lang in langs:
        try:
            path = prepared(lang)
        except SandboxUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        say(f"{lang.title} toolchain ready ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
