"""A registry pack's GGUF turned into a plain transformers folder, once (serving/packs.py runs it in a child process):
the weights dequantized to float32 and written to safetensors tensor by tensor (read with pread, never the whole
file mapped), the tokenizer with its chat template."""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.models.base import ModelUnavailable


def _chat_template_from_gguf(path: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return field.contents() if field is not None else None


def convert(pack, gguf_dir: Path, out: Path, streamed: bool = True) -> str:  # pack: a packs.Pack
    """Dequantize the GGUF into a plain float32 transformers folder (float32 keeps the dequantized values exact;
    the loader casts to the run's dtype). Tensor by tensor where the architecture allows (write_weights_streamed):
    transformers' own conversion holds the whole float32 model, and saving it copied it again (the 1.5B pack's
    peak: benchmarks/memory.py, `convert`). Returns how: "streamed" or "whole-model"."""
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
    answer. Each parse walks the whole vocabulary, string by string, and one conversion asked for it three times
    (what that cost: benchmarks/memory.py --parts convert); the file is read with HeaderFields, not gguf's reader.
    Left, the answers go."""

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
                answers[key] = _parse_with_header_fields(original, path)
            return copy.deepcopy(answers[key])  # callers pop from the config they get

        hf_gguf.load_gguf_checkpoint = load_gguf_checkpoint
        return self

    def __exit__(self, *exc):
        self._module.load_gguf_checkpoint = self._original


def _parse_with_header_fields(parse, path):
    """transformers' metadata parse of `path` with gguf's GGUFReader swapped for HeaderFields where it reads the
    file (little-endian, version 2 or 3): the same answer (tested), without a numpy view made for every string."""
    import gguf as gguf_py

    try:
        fields = HeaderFields(path)
    except ValueError:
        return parse(path, return_tensors=False)
    reader = gguf_py.GGUFReader
    gguf_py.GGUFReader = lambda _path, *a, **k: fields
    try:
        return parse(path, return_tensors=False)
    finally:
        gguf_py.GGUFReader = reader


@dataclass
class _Field:  # what transformers' metadata parse reads of gguf's ReaderField
    name: str
    types: list  # [type], or [ARRAY, item type]
    parts: list  # values as transformers' _gguf_parse_value takes them: bytes for a string, (number,) else
    data: list  # the indices into parts of the field's values


@dataclass
class _TensorName:
    name: str


class HeaderFields:
    """A GGUF file's key-value fields and tensor names, read with struct from a mapping of the header, standing in
    for gguf's GGUFReader in transformers' metadata parse (`fields`, `tensors`' names). GGUFReader makes numpy
    views of every part of every field, two for each of the vocabulary's strings: most of a conversion's tokenizer
    time (benchmarks/memory.py --parts convert). ValueError for a file it does not read (big-endian, another
    version, a nested array): the caller uses GGUFReader."""

    _SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    STRING, ARRAY = 8, 9

    def __init__(self, path):
        import mmap
        import struct

        self._struct = struct
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"GGUF" or struct.unpack_from("<I", m, 4)[0] not in (2, 3):
                raise ValueError("not a little-endian GGUF of version 2 or 3")
            version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
            self.fields = {name: _Field(name, [t], [(v,)], [0]) for name, t, v in
                           (("GGUF.version", 4, version), ("GGUF.tensor_count", 10, n_tensors),
                            ("GGUF.kv_count", 10, n_kv))}
            at = 24
            for _ in range(n_kv):
                name, at = self._string(m, at)
                (vtype,), at = struct.unpack_from("<I", m, at), at + 4
                field, at = self._value(m, at, name.decode(), vtype)
                self.fields[field.name] = field
            self.tensors = []
            for _ in range(n_tensors):
                name, at = self._string(m, at)
                (dims,) = struct.unpack_from("<I", m, at)
                at += 4 + 8 * dims + 4 + 8  # the dimensions, the type, the data offset
                self.tensors.append(_TensorName(name.decode()))

    def _string(self, m, at: int) -> tuple[bytes, int]:
        (n,) = self._struct.unpack_from("<Q", m, at)
        return m[at + 8:at + 8 + n], at + 8 + n

    def _value(self, m, at: int, name: str, vtype: int) -> tuple[_Field, int]:
        unpack_from, calcsize = self._struct.unpack_from, self._struct.calcsize
        if vtype == self.STRING:
            text, at = self._string(m, at)
            return _Field(name, [vtype], [text], [0]), at
        if vtype in self._SCALARS:
            code = "<" + self._SCALARS[vtype]
            return _Field(name, [vtype], [unpack_from(code, m, at)], [0]), at + calcsize(code)
        if vtype != self.ARRAY:
            raise ValueError(f"field {name}: value type {vtype}")
        itype, count = unpack_from("<IQ", m, at)
        at += 12
        if itype == self.STRING:
            parts = []
            for _ in range(count):
                text, at = self._string(m, at)
                parts.append(text)
        elif itype in self._SCALARS:
            code = f"<{count}{self._SCALARS[itype]}"
            parts = [(v,) for v in unpack_from(code, m, at)]
            at += calcsize(code)
        else:
            raise ValueError(f"field {name}: an array of type {itype}")
        return _Field(name, [vtype, itype], parts, list(range(count))), at


def load_tokenizer(pack, gguf_dir: Path):  # pack: a packs.Pack
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
    with _tensor_name_map_built_once():
        names = hf_gguf.get_gguf_hf_weights_map(model, processor)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    chosen = {name: names[name] for name, *_ in tensors if name in names}
    if sorted(chosen.values()) != sorted(set(shapes) - tied) or any(shapes[k] == () for k in chosen.values()):
        return None  # a tensor the model wants that the file lacks (or a duplicate): let transformers decide
    return _StreamPlan(model, processor, names, shapes, tensors, chosen)


@contextmanager
def _tensor_name_map_built_once():
    """Within it, gguf's get_tensor_name_map builds the map of an (architecture, layers) once: transformers'
    get_gguf_hf_weights_map asks for it anew for every submodule of the model, and each build walks every name pattern
    of every layer (the map is only read afterwards)."""
    import functools

    import gguf as gguf_py

    original = gguf_py.get_tensor_name_map
    gguf_py.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf_py.get_tensor_name_map = original


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

        header = GgufHeader.from_file(str(gguf))
    except (ImportError, ValueError):
        # older transformers, or a quantization its header reader does not size (the 0.5B pack's Q5_0 tensors):
        # gguf's own reader (it parses the whole vocabulary, so its metadata is larger)
        from transformers.modeling_gguf_pytorch_utils import read_field

        reader = GGUFReader(str(gguf))
        arch = read_field(reader, "general.architecture")[0]
        return arch, [(t.name, t.tensor_type, tuple(t.data.shape), t.data.dtype, int(t.data_offset))
                      for t in reader.tensors]
    # the types GGUFReader views as values (gguf_reader.py, _build_tensors); every other one as bytes
    values = {T.F16: np.float16, T.F32: np.float32, T.F64: np.float64, T.I8: np.int8, T.I16: np.int16,
              T.I32: np.int32, T.I64: np.int64}
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
    ones a single call gives, without its temporaries for the whole tensor (several times the output for k-quants).
    Q4_K and Q6_K, most of a Q4_K_M pack's weights, go to the compiled kernels where they build: the same values."""
    import numpy as np

    native = _dequantize_natively(raw, qtype)
    if native is not None:
        return native

    if raw.ndim < 2:
        return np.array(dequantize(raw, qtype), dtype=np.float32, copy=True)
    first = dequantize(raw[:1], qtype)
    out = np.empty((raw.shape[0], *first.shape[1:]), dtype=np.float32)
    from .cores import usable_cores

    threads = usable_cores()
    # chunks small enough that every core has one: numpy's array operations, gguf's dequantize is made of, let go of
    # the GIL, so the chunks are dequantized side by side (each into its own rows: the same values)
    step = max(1, min(_DEQUANT_CHUNK // max(1, first.nbytes), -(-raw.shape[0] // threads)))

    def chunk(i: int) -> None:
        out[i:i + step] = dequantize(raw[i:i + step], qtype)

    starts = range(0, raw.shape[0], step)
    if threads == 1 or len(starts) == 1:
        for i in starts:
            chunk(i)
        return out
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(chunk, starts))
    return out


def _dequantize_natively(raw, qtype):
    """`raw`'s blocks dequantized by kernels.c (fixlab_dequant_q4_k, _q6_k: gguf's numpy dequantize value for value,
    tested), or None for another type, a non-contiguous array, or no compiled kernels (gguf's numpy then)."""
    import ctypes

    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    kernel = {T.Q4_K: "fixlab_dequant_q4_k", T.Q6_K: "fixlab_dequant_q6_k"}.get(qtype)
    if kernel is None:
        return None
    block, size = GGML_QUANT_SIZES[qtype]
    if raw.dtype != np.uint8 or raw.ndim < 1 or raw.shape[-1] % size or not raw.flags.c_contiguous:
        return None
    from . import native
    from .cores import usable_cores

    lib = native.library()
    if lib is None:
        return None
    out = np.empty((*raw.shape[:-1], raw.shape[-1] // size * block), dtype=np.float32)
    getattr(lib, kernel)(raw.ctypes.data_as(ctypes.c_void_p), raw.size // size, out.ctypes.data_as(ctypes.c_void_p),
                         usable_cores())
    return out
