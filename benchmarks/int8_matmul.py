"""The int8 products alone (torch._int_mm, oneDNN), at M rows, over the default 1.5B pack's decoder matrices: 28
layers of q, k, v, o, gate, up and down (1.31 GB of int8), each layer its own random copy, so that a step reads every
byte from memory as decode does. Per M: ms a step, GB/s of weights read and G multiply-adds a second.

What it tells: where the products are bound. At 1 row they stream the weights at the memory's pace; with many rows
they reach the CPU's int8 peak; in between (decode's 16-64 rows) neither, which is what a small-M kernel would win.

    .venv/bin/python benchmarks/int8_matmul.py                 # M = 1, 8, 16, 32, 64, 128, 256, 896
    .venv/bin/python benchmarks/int8_matmul.py --rows 32 --reps 5

Writes benchmarks/results/int8-matmul-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from agents.serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402

LAYERS = 28
HIDDEN, KV, MLP = 1536, 256, 8960  # Qwen2.5-Coder-1.5B: q and o 1536 x 1536, k and v 256 x 1536, MLP 8960
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "The int8 products alone, by rows (`benchmarks/int8_matmul.py`)"
TEXT = ("torch._int_mm over the 1.5B pack's 28 layers of decoder matrices (every byte from memory), M rows at a time: "
        "at one row the products stream the weights at the memory's pace, with hundreds they near the CPU's int8 peak.")
TABLE = {"rows": "rows", "columns": [["rows", "rows"], ["ms a step", "ms_per_step"],
                                     ["weights GB/s", "weight_gb_per_s"], ["G multiply-adds/s", "g_mac_per_s"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256, 896])
    ap.add_argument("--reps", type=int, default=3, help="steps per M; the fastest is kept")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
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
