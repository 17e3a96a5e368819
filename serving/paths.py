"""Which path a local model takes on this machine, chosen by measuring the machine, not by assuming.

Three choices, each measured where `auto` (weights' default in make eval's model; `runtime: auto` there too, the
record's default being the engine) and each obeyed when set:
- the int8 kernel: which kernel multiplies int8 weights at how many rows: torch._int_mm or fixlab's own
  (native.PackedInt8); always measured (EngineTuning.int8_kernel forces one for tests and benchmarks: tuning.py).
  Both give the same values, so this one never changes an answer.
- `weights` (with `dtype`): int8 weights, or the model's dtype (float32; bf16 where the CPU multiplies it).
- `runtime`: fixlab's engine, or llama.cpp on the same GGUF where the model is a registry pack.

How (first use of a model on a machine, then cached per CPU model and flags, torch version, kernel source and model
shapes under FIXLAB_CACHE/paths/):
1. Matmuls (`calibrate_matmuls`, a few seconds): every path the CPU can run multiplies the model's real shapes
   (one decoder layer's seven matrices, times the layers, plus the output layer) with synthetic weights, at 1 to
   512 rows. A path already CUT times slower than the best at one row is not timed further (on an AVX2-only CPU
   torch._int_mm is a reference loop: its 32-row figure alone would take seconds).
2. Runtime (runtime.py `build_local`, only for packs, where llama.cpp can serve the same GGUF): the engine on the
   chosen weights and llama.cpp each decode the same 32 requests and prefill one long prompt; the one that would
   decode and prefill make eval's job (its recorded token counts) sooner serves the job.
The decision is a recorded parameter of the run (`serving`: runtime, weights, dtype, and the int8 kernels, which do
not change answers): runs that took different paths are different configurations (flows/cache.py, flows/frontier.py).

On ARM (not tested here: no such machine) int8 runs fixlab's portable loops and is timed like every path, beside
float32, bf16 and llama.cpp's NEON kernels. Nothing assumes x86: a path that cannot run is not timed, and no path is
chosen without a figure.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agents.models.config import TransformersModelConf
from . import machine

CACHE_VERSION = 5  # 2: weights streamed as a model's; 3: the cut's probe warm; 4: runtime by job time; 5: oneDNN timed
ROWS = (1, 8, 16, 32, 64, 128, 512)  # decode steps span 1-128 rows (tokens, drafts included); prefill 512+
OTHER_ROWS = (1, 32, 128, 512)  # the paths other than int8 are ranked at 32 rows; one kernel serves every width
DECODE_ROWS = 32  # the width the paths are ranked at: the default job decodes 32 rows most of the time
PREFILL_ROWS = 512
CUT = 5.0  # a path this many times slower than the best at one row is not timed at more rows
SLOW_WARNING = 5.0  # an explicit choice measured this many times slower than the best gets one warning line


@dataclass
class Choice:
    """What a local model runs on, and why (the figures that decided it)."""

    weights: str  # int8 | dtype
    dtype: str  # float32 | bfloat16: the dtype of everything that is not an int8 matmul
    int8: dict | None  # the Int8Plan's fields (weights int8)
    runtime: str = "engine"  # engine | llamacpp | continuous | static (transformers' own batching: hf_batching.py)
    reason: str = ""
    matmul_ms: dict = field(default_factory=dict)  # path -> {rows: ms of a decode step's matmuls}
    decode_tok_s: dict = field(default_factory=dict)  # runtime -> decode tokens/s of 32 real requests (step 2)
    # whether a row's answer depends only on its own prompt, seed and temperature (set by the model once loaded:
    # TransformersModel._why_not_repeatable; llama.cpp's does not, measured: serving/README.md)
    deterministic: bool = False
    why_not: str = ""  # what keeps it from repeating, when it does not

    def plan(self):
        from .int8 import Int8Plan

        return Int8Plan(**self.int8) if self.int8 else None

    def label(self) -> str:
        """`int8 (fixlab avx2)`, `float32`, `llama.cpp`: the first words of the job's path line."""
        if self.runtime == "llamacpp":
            return "llama.cpp (the pack's GGUF)"
        if self.runtime in ("continuous", "static"):
            return (f"transformers {'continuous batching' if self.runtime == 'continuous' else 'static cache'} "
                    f"({self.dtype})")
        if self.weights == "int8":
            return f"int8 ({self.plan().describe()})"
        return self.dtype

    def record(self) -> dict:
        """The run's `serving` parameter: what changes answers (runtime, weights, dtype) and the int8 kernels."""
        gguf = self.runtime == "llamacpp"
        out = {"runtime": self.runtime, "weights": "gguf" if gguf else self.weights,
               "dtype": "gguf" if gguf else self.dtype}
        if self.runtime == "engine" and self.weights == "int8":
            out["int8_kernel"] = self.plan().describe()
        out["deterministic"] = bool(self.deterministic)
        return out

    def repeat_words(self) -> str:
        """The path line's last words: whether a rerun gives the same answers."""
        return ("answers repeat bit for bit (batch-invariant kernels)" if self.deterministic
                else f"answers may differ between reruns ({self.why_not or 'not batch-invariant'})")


# ---- the model's shapes ---------------------------------------------------------------------------------------------
def model_shapes(config) -> dict:
    """{"layer": [(out, in) of q, k, v, o, gate, up, down], "int8_layer": the same as the engine's int8 weights
    multiply them (q, k and v stacked, o, gate and up stacked, down: int8.Int8Group), "layers": n, "head": (vocab,
    hidden)} of a transformers decoder config (Qwen2, Llama, Mistral... share these names)."""
    h = config.hidden_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    inter = config.intermediate_size
    layer = [(heads * hd, h), (kv * hd, h), (kv * hd, h), (h, heads * hd), (inter, h), (inter, h), (h, inter)]
    grouped = [((heads + 2 * kv) * hd, h), (h, heads * hd), (2 * inter, h), (h, inter)]
    return {"layer": layer, "int8_layer": grouped, "layers": int(config.num_hidden_layers),
            "head": (int(config.vocab_size), h)}


def layer_shapes(shapes: dict, path: str) -> list[tuple[int, int]]:
    """A layer's matrices as `path` multiplies them: the int8 paths one call per Int8Group (int8_groups, on in every
    job: one call where there were three and two), the others one per linear."""
    key = "int8_layer" if path.startswith("int8:") and shapes.get("int8_layer") else "layer"
    return [tuple(s) for s in shapes[key]]


# ---- step 1: matmuls ---------------------------------------------------------------------------------------------
# Timed for the record by benchmarks/paths.py, never chosen: FBGEMM's dynamic int8 linear rounds each input tensor
# with one scale and zero point (and 7-bit activations on x86), so a row's answer would depend on what shares its batch.
REFERENCE_PATHS = ("int8:fbgemm",)
UNREPEATABLE_PATHS = ("bfloat16",)


def matmul_paths(cpu: dict | None = None) -> list[str]:
    """The matmul paths this CPU can run, in the order they are timed: fixlab's int8 kernel first (it runs
    everywhere the compiled kernels build), torch's int8, float32, then bf16 where the CPU multiplies it."""
    from . import native

    cpu = cpu or machine.cpu()
    flags = set(cpu["flags"])
    forced = native.FORCED_ISA not in (None, "native")
    out = []
    if native.available():
        out.append("int8:fixlab")
    if not forced:  # an AVX2-only CPU's torch._int_mm is a reference loop: as forced, it is left out
        out.append("int8:torch")
        from .int8 import onednn_available

        if onednn_available():  # oneDNN's own packed weights (AMX or VNNI): held to AVX2 like torch's, as forced
            out.append("int8:onednn")
    out.append("float32")
    if not forced and flags & {"avx512_bf16", "amx_bf16", "bf16"}:
        out.append("bfloat16")
    return out


def _linears(path: str, shapes: list[tuple[int, int]], copies: int) -> list[list]:
    """`copies` sets of modules, one per (out, in) shape, each multiplying (M, in) float32 inputs by its own synthetic
    weight the way `path` does in the engine (the int8 ones with the engine's Int8Linear)."""
    import torch

    from . import native
    from .skinny_matmul import _skinny_linear
    from .int8 import Int8Linear, Int8Plan

    out = []
    first: list = []  # the first set's values; the other sets are copies of them (a matmul's speed does not depend
    # on the values, and drawing a gigabyte of random numbers took longer than the timing)
    if path == "int8:fbgemm":
        from torch.ao.quantization import quantize_dynamic

        torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "qnnpack"
        for c in range(copies):
            mods = []
            for i, (n, k) in enumerate(shapes):
                if c == 0:
                    first.append(torch.empty(n, k).uniform_(-0.05, 0.05))
                lin = torch.nn.Linear(k, n, bias=False)
                lin.weight = torch.nn.Parameter(first[i], requires_grad=False)
                mods.append(quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)[0])
            out.append(mods)
        return out
    for c in range(copies):
        mods = []
        for i, (n, k) in enumerate(shapes):
            lin = torch.nn.Linear(k, n, bias=False, device="meta")
            if path.startswith("int8:"):  # int8 values drawn directly: rounding a float32 copy first took seconds
                kernel = path.split(":", 1)[1]
                if c == 0:
                    first.append(torch.randint(-127, 128, (n, k), dtype=torch.int8))
                mods.append(Int8Linear(lin, native=True, plan=Int8Plan(small=kernel, large=kernel),
                                       quantized=(torch.full((n,), 1e-3), first[i].clone())))
                continue
            if c == 0:
                first.append(torch.empty(n, k).uniform_(-0.05, 0.05))
            lin.weight = torch.nn.Parameter(first[i].clone(), requires_grad=False)
            if path == "bfloat16":
                mods.append((lambda m: lambda x: m(x.to(torch.bfloat16)))(lin.to(torch.bfloat16)))
            elif native.available():  # the engine's float32 linears: fixlab's packed, batch-invariant kernel (f32.py)
                from .f32 import PackedLinear

                mods.append(PackedLinear(lin, first[i]))
            else:
                mods.append((lambda m: lambda x: _skinny_linear(m, x))(lin))
            del lin
        out.append(mods)
    return out


def _weight_bytes(path: str, shapes: list[tuple[int, int]]) -> int:
    per = 1 if path.startswith("int8:") else 2 if path == "bfloat16" else 4
    return sum(n * k for n, k in shapes) * per


def _stream_bytes() -> int:
    """How many bytes of weights a timing pass reads, so that they come from memory as a whole model's do, not from
    the last-level cache: twice its size (from /sys), at least 256 MiB, at most 1 GiB."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        llc = int(text[:-1]) * {"K": 2**10, "M": 2**20}.get(text[-1], 1) if text[-1] in "KM" else int(text)
    except (OSError, ValueError, IndexError):
        llc = 32 * 2**20
    return min(max(2 * llc, 256 * 2**20), 2**30)


def _pass(mod_sets: list[list], xs: dict, reps: int) -> float:
    """ms for one pass over one set (every set once per round, the best round's mean)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for mods in mod_sets:
            for mod, x in zip(mods, xs):
                mod(x)
        best = min(best, (time.perf_counter() - t0) / len(mod_sets))
    return best * 1000


def calibrate_matmuls(shapes: dict, paths: list[str] | None = None, rows: tuple[int, ...] = ROWS,
                      head_slices: int = 8, log=None) -> dict:
    """{path: {rows: ms}}: the matmuls of one step of the whole model at that many rows (tokens): the layer's
    matrices as the path multiplies them (layer_shapes: the int8 ones stacked as the engine's groups) times the layers,
    plus the output layer for decode widths (at PREFILL_ROWS and above only the last position of each prompt reaches
    it, so it is left out there). Weights come from memory as in the model: the layer is timed over as many distinct
    copies as make _stream_bytes(), the output layer in head_slices distinct slices."""
    import torch

    paths = paths or matmul_paths()
    vocab, hidden = shapes["head"]
    head_shapes = [(vocab // head_slices + (i < vocab % head_slices), hidden) for i in range(head_slices)]
    out: dict[str, dict[int, float]] = {}
    best1 = None
    for path in paths:
        t0 = time.perf_counter()
        mats = layer_shapes(shapes, path)
        copies = max(1, min(32, -(-_stream_bytes() // _weight_bytes(path, mats))))
        # later paths: probed on one copy before the rest and the head are made (making them outlasts a probe)
        layers, head = _linears(path, mats, 1 if best1 is not None else copies), None
        out[path] = {}
        for m in (rows if path.startswith("int8:") else [r for r in rows if r in OTHER_ROWS] or rows):
            xs = [torch.randn(m, k) for _, k in mats]
            if m == rows[0] and best1 is not None:  # one warm pass over one copy first: a reference loop stops here
                _pass(layers[:1], xs, 1)  # first calls: kernel set-up, the weights' first touch
                probe = _pass(layers[:1], xs, 1) * shapes["layers"]
                if probe > CUT * best1:
                    out[path][m] = round(probe, 2)
                    break
                layers += _linears(path, mats, copies - 1)
            head = head or _linears(path, head_shapes, 1)
            few = layers if m < 128 else layers[:2]  # many rows: bound by arithmetic, not by memory
            _pass(few, xs, 1)  # warm: first-call packing, page faults
            ms = _pass(few, xs, 2 if m < 128 else 1) * shapes["layers"]
            if m < PREFILL_ROWS:
                hx = [torch.randn(m, hidden)] * head_slices
                _pass(head, hx, 1)
                ms += _pass(head, hx, 2 if m < 128 else 1)
            out[path][m] = round(ms, 2)
            if m == rows[0]:
                if best1 is not None and ms > CUT * best1:
                    break  # hopeless here: not timed at more rows
                best1 = ms if best1 is None else min(best1, ms)
        if log:
            log(f"  {path}: " + ", ".join(f"{ms:.1f} ms at {m}" for m, ms in out[path].items())
                + f" ({copies} copies of a layer; {time.perf_counter() - t0:.1f} s)")
        del layers, head
    return out


# Two int8 kernels mean two copies of the weights in memory (each packs its own layout). The kernel that wins at few
# rows is kept beside the other only where it is at least this much faster there: a small gain does not pay for a
# second copy of the weights (the memory benchmark's results files hold the figures).
SECOND_LAYOUT_GAIN = 1.5


def choose(table: dict, decode_rows: int = DECODE_ROWS, prefill_rows: int = PREFILL_ROWS) -> Choice:
    """The weights, dtype and int8 plan from a calibration table ({path: {rows: ms}}): pure, so tests give it faked
    timings. A path with no figure at the ranking width (cut as hopeless) is never chosen."""
    from .native import FORCED_ISA

    table = {p: t for p, t in table.items() if p not in REFERENCE_PATHS}
    int8 = {p.split(":", 1)[1]: t for p, t in table.items() if p.startswith("int8:")}
    plan = None
    if int8:
        def best(m):  # the int8 kernel fastest at m rows, among those timed there
            timed = {k: t[m] for k, t in int8.items() if m in t}
            return min(timed, key=timed.get) if timed else None

        widths = sorted({m for t in int8.values() for m in t})
        winners = [(m, best(m)) for m in widths]
        small = winners[0][1]
        large = next((k for m, k in reversed(winners) if len(int8) == 1 or all(m in t for t in int8.values())),
                     small)
        split = 0
        if small != large:
            for m, k in winners:
                if k != small:
                    break
                split = m
            first = widths[0]
            if int8[large].get(first, float("inf")) < SECOND_LAYOUT_GAIN * int8[small][first]:
                small, split = large, 0  # one layout: the second copy of the weights would buy too little
        plan = {"small": small, "large": large, "split": split, "isa": FORCED_ISA}

    def step_ms(path, m):
        if path == "int8":
            k = plan["small"] if m <= plan["split"] else plan["large"]
            return int8[k].get(m)
        return table[path].get(m)

    timed = {p: step_ms(p, decode_rows) for p in (["int8"] if int8 else []) + [p for p in table
                                                                             if not p.startswith("int8:")]}
    timed = {p: ms for p, ms in timed.items() if ms is not None}
    # bf16's answers do not repeat across batches (a row's last bits depend on its batch): timed and shown, chosen
    # only when asked for (dtype=bfloat16)
    ranked = {p: ms for p, ms in timed.items() if p not in UNREPEATABLE_PATHS}
    if not ranked:
        raise ValueError(f"no matmul path was timed at {decode_rows} rows")
    win = min(ranked, key=ranked.get)
    figures = ", ".join(f"{p}{' (does not repeat)' if p in UNREPEATABLE_PATHS else ''} {decode_rows * 1000 / ms:.0f}"
                        for p, ms in sorted(timed.items(), key=lambda kv: kv[1]))
    reason = f"matmuls alone at {decode_rows} rows, tokens/s: {figures}"
    return Choice(weights="int8" if win == "int8" else "dtype", dtype="float32" if win in ("int8", "float32")
                  else win, int8=plan if win == "int8" else None, reason=reason, matmul_ms=table)


# ---- the cache ------------------------------------------------------------------------------------------------------
def cache_key(shapes: dict, what: str, extra: dict | None = None) -> tuple[str, dict]:
    from importlib import metadata

    from . import native

    ident = {"version": CACHE_VERSION, "what": what, "cpu": machine.cpu(), "torch": metadata.version("torch"),
             "forced": native.FORCED_ISA, "kernels": hashlib.sha256(native.SOURCE.read_bytes()).hexdigest()[:16],
             "shapes": shapes, **(extra or {})}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20], ident


def cache_file(key: str) -> Path:
    from .machine import cache_root

    return cache_root() / "paths" / f"{key}.json"


def read_cached(key: str) -> dict | None:
    try:
        return json.loads(cache_file(key).read_text())
    except (OSError, ValueError):
        return None


def write_cached(key: str, ident: dict, data: dict) -> None:
    p = cache_file(key)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": ident, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               **data}, indent=1))
    os.replace(tmp, p)


def say(msg: str) -> None:
    print(f"fixlab: {msg}", file=sys.stderr, flush=True)


# ---- resolving a model config ---------------------------------------------------------------------------------------
def shapes_for(cfg: TransformersModelConf) -> dict:
    from transformers import AutoConfig

    from .devices import weights_source

    src, kw = weights_source(cfg)
    return model_shapes(AutoConfig.from_pretrained(src, trust_remote_code=bool(cfg.trust_remote_code), **kw))


def cached_matmul_choice(cfg: TransformersModelConf, threads: int) -> Choice | None:
    cached = read_cached(cache_key(shapes_for(cfg), "matmuls", {"threads": threads})[0])
    if cached is None:
        return None
    return choose({p: {int(m): ms for m, ms in t.items()} for p, t in cached["matmul_ms"].items()})


def will_measure(cfg: TransformersModelConf, threads: int, tuning=None) -> bool:
    """Whether resolving cfg on this CPU would time its matmul paths first (resolve: `weights: auto` or int8 with the
    kernel left to measure, and no table cached for this model, machine and thread count; a pack not converted yet
    has none). A job then starts nothing beside the build (flows/job.py), so the timings are the paths' alone."""
    import torch

    from .devices import resolve_weights
    from .packs import DONE_MARKER, get_pack, model_dir
    from .tuning import EngineTuning

    tuning = tuning if tuning is not None else EngineTuning()
    if _set_by_config(cfg, resolve_weights(cfg.weights, torch.device("cpu")), tuning):
        return False
    if cfg.pack and not (model_dir(get_pack(cfg.pack)) / DONE_MARKER).exists():
        return True
    return cached_matmul_choice(cfg, threads) is None


def _set_by_config(cfg: TransformersModelConf, weights: str, tuning) -> bool:
    """Whether the config (and tuning) leave the CPU path nothing to measure: the weights explicitly in the dtype, or
    int8 with its kernel set (or without the compiled loops, which leaves torch's). resolve and will_measure both
    ask, so that a job that says it measures first is one that does."""
    kernel = str(tuning.int8_kernel or "auto").strip().lower()
    return ((weights == "dtype" and cfg.weights != "auto")
            or (weights == "int8" and (kernel != "auto" or not tuning.int8_native)))


def matmul_choice(cfg: TransformersModelConf, threads: int) -> Choice:
    """Step 1 for this model on this machine: read from the cache, or measured (and cached) now."""
    import torch

    cached = cached_matmul_choice(cfg, threads)
    if cached is not None:
        return cached
    shapes = shapes_for(cfg)
    key, ident = cache_key(shapes, "matmuls", {"threads": threads})
    say(f"measuring this machine's matmul paths for {cfg.name} (once; cached under {cache_file(key).parent}) on "
         f"{machine.summary()}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            table = calibrate_matmuls(shapes, log=say)
    finally:
        torch.set_num_threads(before)
    write_cached(key, ident, {"matmul_ms": table, "seconds": round(time.perf_counter() - t0, 1)})
    return choose(table)


def resolve(cfg: TransformersModelConf, device, threads: int, tuning=None) -> Choice:
    """The weights, dtype and int8 plan this config runs with on `device`: what it sets, and what `auto` measures.
    Off the CPU nothing is measured: weights in the dtype (bf16 on CUDA). The int8 kernel is measured unless a
    `tuning` (tuning.py EngineTuning; tests and benchmarks) forces one."""
    from .devices import BadModelConfig, resolve_dtype, resolve_weights
    from .int8 import INT8_KERNELS, Int8Plan
    from .tuning import EngineTuning

    tuning = tuning if tuning is not None else EngineTuning()
    kernel = str(tuning.int8_kernel or "auto").strip().lower()
    if kernel not in ("auto",) + INT8_KERNELS:
        raise BadModelConfig(f"unknown int8_kernel {tuning.int8_kernel!r}: use auto, {', '.join(INT8_KERNELS)}")
    weights = resolve_weights(cfg.weights, device)
    if device.type != "cpu":
        return Choice(weights="dtype", dtype=str(resolve_dtype(cfg.dtype, device, "dtype")).replace("torch.", ""),
                      int8=None, reason=f"{device.type}: weights in the model's dtype")
    if _set_by_config(cfg, weights, tuning) and weights == "dtype":  # explicitly the dtype: nothing to measure
        dtype = str(resolve_dtype(cfg.dtype, device, "dtype")).replace("torch.", "")
        cached = cached_matmul_choice(cfg, threads) if cfg.pack else None  # a measured table, where one is at hand
        if cached is not None:
            _warn_if_slow(cached, dtype, f"weights=dtype ({dtype})")
        return Choice(weights="dtype", dtype=dtype, int8=None, reason="weights=dtype as configured")
    if _set_by_config(cfg, weights, tuning):  # int8 with its kernel set: nothing left to measure
        kernel = kernel if tuning.int8_native else "torch"  # fixlab's kernel rounds with the compiled loops
        if kernel == "fixlab":
            from .native import available
            if not available():
                raise BadModelConfig("int8_kernel=fixlab needs fixlab's compiled kernels, which could not be built "
                                     "here (no gcc?); fix: EngineTuning(int8_kernel='auto')")
        from .native import FORCED_ISA

        chosen = Choice(weights="int8", dtype="float32", int8=asdict(Int8Plan(kernel, kernel, 0, FORCED_ISA)),
                        reason=f"weights={cfg.weights}, int8_kernel={kernel} as the tuning sets")
        cached = cached_matmul_choice(cfg, threads)
        if cached is not None:
            _warn_if_slow(cached, f"int8:{kernel}", f"int8_kernel={kernel}")
        return chosen
    measured = matmul_choice(cfg, threads)
    if weights == "int8" and measured.weights != "int8":  # obeyed, with the measured int8 plan
        chosen = choose({p: t for p, t in measured.matmul_ms.items() if p.startswith("int8:")})
        chosen.reason, chosen.matmul_ms = measured.reason, measured.matmul_ms
        _warn_if_slow(measured, "int8", "weights=int8")
        return chosen
    if measured.weights == "dtype" and cfg.dtype not in (None, "auto"):
        measured.dtype = str(resolve_dtype(cfg.dtype, device, "dtype")).replace("torch.", "")
    return measured


def _warn_if_slow(measured: Choice, path: str, setting: str) -> None:
    """One line when an explicit setting was measured SLOW_WARNING times slower than the best path here."""
    table = measured.matmul_ms
    mine_paths = [p for p in table if p.startswith("int8:")] if path == "int8" else [path]
    rows = DECODE_ROWS if any(DECODE_ROWS in table.get(p, {}) for p in mine_paths) else 1  # a cut path: at one row
    best = min((t[rows] for t in table.values() if rows in t), default=None)
    mine = min((table[p][rows] for p in mine_paths if rows in table.get(p, {})), default=None)
    if best and mine and mine >= SLOW_WARNING * best:
        say(f"warning: {setting} as configured, but it was measured {mine / best:.0f}x slower than the best path on "
             f"this machine ({measured.reason})")
