"""The path chooser's calibration (serving/paths.py) on this machine, and as CPUs this machine can stand in
for would see it, side by side in one run: the matmuls of one decode step of the real 1.5B pack's shapes (synthetic
weights) for every path (fixlab's int8 kernel, torch._int_mm, float32, bf16) at 1-512 rows, and what `auto` picks;
with FBGEMM's dynamic int8 linear beside them for the record (never chosen: it rounds a whole batch with one scale,
so a row's answer would depend on its batch).

Modes, each in a child process (instruction sets are fixed when a library loads):
- `native`: this CPU as it is.
- `avx2`: as an AVX2-only CPU (AMD Zen 2/3, Intel before Ice Lake): fixlab's kernels built for x86-64-v3, MKL and
  oneDNN held to AVX2 (MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY). torch._int_mm and bf16 are
  left out, as there they are a reference loop and emulated (measured on such an EPYC: ../shared/notes/stack.md).
  What cannot be forced: the cores' own speed, ports and memory (an AVX2-only CPU is an older core), so this mode
  predicts, it does not replace, a run on such a CPU. llama.cpp needs no forcing: the xllamacpp wheel is built for
  AVX2 (its library holds no AVX-512 instruction: `objdump -d` finds no zmm register), so it runs the same kernels on
  every x86 CPU here.
- `vnni`: AVX-512 VNNI without AMX (ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI), where this CPU has AMX: as a Zen 4 EPYC or a
  Xeon before Sapphire Rapids would run torch._int_mm.

    .venv/bin/python benchmarks/paths.py                  # every mode this CPU can stand in for
    .venv/bin/python benchmarks/paths.py --modes native avx2

Writes benchmarks/results/paths-<UTC time>.json and prints one table per mode.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

AVX2_ENV = {"FIXLAB_CPU_ISA": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
MODES = {"native": {}, "avx2": AVX2_ENV, "vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}}
PACK = "qwen1.5b-coder-q4"
# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "The path chooser's calibration (`benchmarks/paths.py`)"
TEXT = ("The matmuls of one decode step of the 1.5B pack's shapes (weights streamed from memory, as a whole model's), "
        "ms, for every path the CPU can run, at 1-512 rows; and what `weights: auto` and `int8_kernel: auto` take. A "
        "mode other than native holds the CPU to fewer instruction sets (the environment named): it predicts a CPU of "
        "that family, with this machine's cores.")
TABLE = {"rows": "modes.*.matmul_ms.*", "keys": ["mode", "path"],
         "columns": [["chosen", "$.modes.{0}.choice.label"]]}  # + a column per row count: width_columns


def width_columns(modes: dict) -> list[list[str]]:
    widths = sorted({int(w) for m in modes.values() for t in m["matmul_ms"].values() for w in t})
    return [[f"{w} rows ms", str(w)] for w in widths]


def child(threads: int) -> dict:
    import torch
    from transformers import AutoConfig

    from serving import paths
    from serving.machine import describe
    from serving.packs import ensure_pack

    torch.set_num_threads(threads)
    shapes = paths.model_shapes(AutoConfig.from_pretrained(str(ensure_pack(PACK))))
    t0 = time.perf_counter()
    with torch.inference_mode():
        fbgemm = [p for p in paths.REFERENCE_PATHS if {"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines)]
        table = paths.calibrate_matmuls(shapes, paths.matmul_paths() + fbgemm,
                                        log=lambda s: print(s, file=sys.stderr, flush=True))
    seconds = time.perf_counter() - t0
    c = paths.choose(table)
    return {"machine": describe(threads=threads), "shapes": shapes, "seconds": round(seconds, 1),
            "matmul_ms": table, "choice": {"weights": c.weights, "dtype": c.dtype, "int8": c.int8,
                                           "label": c.label(), "reason": c.reason}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.threads)))
        return
    from serving.machine import cpu

    flags = set(cpu()["flags"])
    modes = args.modes or ["native"] + (["avx2"] if {"avx2", "fma"} <= flags and "avx512f" in flags else []) + \
        (["vnni"] if "amx_int8" in flags else [])
    from flows.results import write

    out, path = {"pack": PACK, "modes": {}}, args.out
    for mode in modes:
        env = {**os.environ, **MODES[mode], "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads)], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"error: mode {mode} failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        out["modes"][mode] = {"env": MODES[mode], **json.loads(done.stdout.strip().splitlines()[-1])}
        path = write("paths", out, title=TITLE, text=TEXT, out=path, config=vars(args),  # saved after every mode
                     table={**TABLE, "columns": TABLE["columns"] + width_columns(out["modes"])})
        r = out["modes"][mode]
        rows = sorted({m for t in r["matmul_ms"].values() for m in t}, key=int)
        print(f"\n{mode}: {r['machine']['cpu']} ({r['machine']['cpu_family']}); chosen: {r['choice']['label']}")
        print("| path | " + " | ".join(f"{m} rows" for m in rows) + " |")
        print("|---|" + "---|" * len(rows))
        for p, t in r["matmul_ms"].items():
            print(f"| {p} | " + " | ".join(f"{t[m]:.1f}" if m in t else "-" for m in rows) + " |")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
