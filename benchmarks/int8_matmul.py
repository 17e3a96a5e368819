"""The int8 products alone (torch._int_mm, oneDNN), at M rows, over the default 1.5B pack's decoder matrices: 28
layers of q, k, v, o, gate, up and down (1.31 GB of int8), each layer its own random copy, so that a step reads every
byte from memory as decode does. Per M: ms a step, GB/s of weights read and G multiply-adds a second.

What it tells: where the products are bound. At 1 row they stream the weights at the memory's pace; with many rows
they reach the CPU's int8 peak; in between (decode's 16-64 rows) neither, which is what a small-M kernel would win.

    .venv/bin/python benchmarks/int8_matmul.py                 # M = 1, 8, 16, 32, 64, 128, 256, 896
    .venv/bin/python benchmarks/int8_matmul.py --rows 32 --reps 5

With --against REV...: fixlab's own int8 kernel (serving/kernels.c section 3) of this tree against the same file
at those git revisions, over the matrices the engine multiplies a layer (q, k and v stacked as one group, o, gate and up
stacked, down), each build packing its own copy of the weights. The builds take turns step by step (A B, then B A), so
the machine's drift falls on both alike; each M gives each build's fastest and median step, the median of the paired
ratios, and whether every output was bit-equal to this tree's.

    .venv/bin/python benchmarks/int8_matmul.py --against a75b1ec --rows 1 8 16 32 64 128 --reps 12

Writes benchmarks/results/int8-matmul-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

import kernels_at  # noqa: E402
from serving import native  # noqa: E402
from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402

LAYERS = 28
HIDDEN, KV, MLP = 1536, 256, 8960  # Qwen2.5-Coder-1.5B: q and o 1536 x 1536, k and v 256 x 1536, MLP 8960
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]
# the engine's int8 calls a layer (int8.Int8Group): q, k, v stacked, o, gate and up stacked, down
GROUPED = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * MLP, HIDDEN), (HIDDEN, MLP)]
KERNEL_FUNCTIONS = ("fixlab_int8_packed_size", "fixlab_int8_pack", "fixlab_int8_matmul")


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "The int8 products alone, by rows (`benchmarks/int8_matmul.py`)"
TEXT = ("torch._int_mm over the 1.5B pack's 28 layers of decoder matrices (every byte from memory), M rows at a time: "
        "at one row the products stream the weights at the memory's pace, with hundreds they near the CPU's int8 peak.")
TABLE = {"rows": "rows", "columns": [["rows", "rows"], ["ms a step", "ms_per_step"],
                                     ["weights GB/s", "weight_gb_per_s"], ["G multiply-adds/s", "g_mac_per_s"]]}

KERNEL_TITLE = "fixlab's int8 kernel, build against build (`benchmarks/int8_matmul.py --against`)"
KERNEL_TEXT = ("kernels.c section 3 of the tree that ran the benchmark against the same file at other commits, over the "
               "1.5B pack's 28 layers as the engine calls them (q, k, v stacked; o; gate and up stacked; down: 1.31 GB "
               "of int8, every byte from memory), the builds taking turns step by step; `over this tree` is the median "
               "of the paired ratios (above 1: slower than this tree).")
KERNEL_TABLE = {"rows": "rows", "columns": [["ISA", "$.isa"], ["rows", "rows"], ["kernels", "kernels"],
                                            ["fastest ms a step", "ms_per_step"], ["median ms", "median_ms"],
                                            ["G multiply-adds/s", "g_mac_per_s"], ["over this tree", "over_this_tree"],
                                            ["bit-equal", "equal"]]}


def against(args) -> None:
    """This tree's int8 kernel against other revisions' (module docstring)."""
    if not native.available():
        sys.exit("error: the compiled kernels do not build here (gcc missing?): nothing to time")
    revs = [".", *args.against]
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    per_layer = sum(n * k for n, k in GROUPED)
    with tempfile.TemporaryDirectory(prefix="int8-kernel-") as tmp:
        libs = {rev: kernels_at.build(rev, Path(tmp), "fixlab_int8_matmul", "fixlab's int8 kernel", KERNEL_FUNCTIONS)
                for rev in revs}
        packed = {rev: [] for rev in revs}  # rev -> layer -> [(packed, colsum, scales)]
        for _ in range(args.layers):
            raw = [torch.randint(-127, 128, s, dtype=torch.int8, generator=g) for s in GROUPED]
            scales = [torch.rand(n, generator=g) * 1e-3 for n, _ in GROUPED]  # one per output channel, every build's
            for rev, lib in libs.items():
                mats = []
                for (n, k), w, ws in zip(GROUPED, raw, scales):
                    p = torch.empty(lib.fixlab_int8_packed_size(n, k), dtype=torch.int8)
                    colsum = torch.empty(n, dtype=torch.int32)
                    lib.fixlab_int8_pack(w.data_ptr(), n, k, k, p.data_ptr(), colsum.data_ptr(), threads)
                    mats.append((p, colsum, ws))
                packed[rev].append(mats)
        rows = []
        for m in args.rows:
            x = {k: torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g) for k in (HIDDEN, MLP)}
            xs = torch.rand(m, generator=g) * 1e-2
            ys = {rev: [torch.empty(m, n) for n, _ in GROUPED] for rev in revs}

            def step(rev):
                lib, t = libs[rev], time.perf_counter()
                for mats in packed[rev]:
                    for (n, k), (p, colsum, ws), y in zip(GROUPED, mats, ys[rev]):
                        lib.fixlab_int8_matmul(x[k].data_ptr(), m, k, k, p.data_ptr(), colsum.data_ptr(), n,
                                               xs.data_ptr(), ws.data_ptr(), None, y.data_ptr(), n, threads)
                return time.perf_counter() - t

            for rev in revs:  # warm: first touch of the outputs, the builds' thread teams
                step(rev)
            times = {rev: [] for rev in revs}
            for rep in range(args.reps):
                for rev in (revs if rep % 2 == 0 else revs[::-1]):
                    times[rev].append(step(rev))
            for rev in revs:
                best, med = min(times[rev]), statistics.median(times[rev])
                ratio = statistics.median(a / b for a, b in zip(times[rev], times["."]))
                rows.append({"rows": m, "kernels": "this tree" if rev == "." else rev,
                             "ms_per_step": round(best * 1e3, 1), "median_ms": round(med * 1e3, 1),
                             "g_mac_per_s": round(m * per_layer * args.layers / best / 1e9),
                             "over_this_tree": round(ratio, 3),
                             "equal": all(torch.equal(a, b) for a, b in zip(ys[rev], ys["."]))})
                r = rows[-1]
                print(f"M={m} {r['kernels']}: fastest {r['ms_per_step']} ms, median {r['median_ms']} ms, "
                      f"{r['g_mac_per_s']} G multiply-adds/s, over this tree {r['over_this_tree']}, "
                      f"bit-equal {r['equal']}", flush=True)
    result = {"weight_gb": round(per_layer * args.layers / 1e9, 2), "layers": args.layers, "shapes": GROUPED,
              "isa": native.gemm_isa(), "reps": args.reps, "rows": rows}
    out = write("int8_kernel", result, title=KERNEL_TITLE, text=KERNEL_TEXT, table=KERNEL_TABLE, out=args.out,
                config=vars(args), machine=describe(threads=threads, load_avg_start=os.getloadavg()))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256, 896])
    ap.add_argument("--reps", type=int, default=3, help="steps per M; the fastest is kept")
    ap.add_argument("--against", nargs="+", default=[], metavar="REV",
                    help="time fixlab's int8 kernel of this tree against kernels.c at these git revisions")
    ap.add_argument("--layers", type=int, default=LAYERS, help="with --against: layers a step (28: the 1.5B pack)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.against:
        return against(args)
    g = torch.Generator().manual_seed(0)
    weights = [[torch.randint(-127, 128, s, dtype=torch.int8, generator=g) for s in SHAPES] for _ in range(LAYERS)]
    total = sum(w.numel() for layer in weights for w in layer)
    rows = []
    for m in args.rows:
        x = {k: torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g) for k in (HIDDEN, MLP)}
        best = float("inf")
        for _ in range(args.reps):
            t = time.perf_counter()
            for layer in weights:
                for w in layer:
                    torch._int_mm(x[w.shape[1]], w.t())  # as Int8Linear calls it: the N x K weight, transposed
            best = min(best, time.perf_counter() - t)
        rows.append({"rows": m, "ms_per_step": round(best * 1e3, 1), "weight_gb_per_s": round(total / best / 1e9, 1),
                     "g_mac_per_s": round(m * total / best / 1e9)})
        print(f"M={m}: {rows[-1]['ms_per_step']} ms a step, {rows[-1]['weight_gb_per_s']} GB/s of weights, "
              f"{rows[-1]['g_mac_per_s']} G multiply-adds/s", flush=True)
    result = {"weight_gb": round(total / 1e9, 2), "layers": LAYERS, "reps": args.reps, "rows": rows}
    out = write("int8_matmul", result, title=TITLE, text=TEXT, table=TABLE, out=args.out, config=vars(args),
                machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
