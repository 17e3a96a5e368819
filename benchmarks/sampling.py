"""One sampled token's draw, torch against fixlab's compiled loop (serving/sampling.py, kernels.c section 7),
side by side in one run: torch.multinomial(probs, 1, generator) and Draws.multinomial on the same probabilities
(a 151,936-token vocabulary, the 1.5B pack's), at a job's temperatures. The picks are compared too (they must be equal).

    .venv/bin/python benchmarks/sampling.py

Writes benchmarks/results/sampling-<UTC time>.json and prints the table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from serving import sampling  # noqa: E402
from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402

TITLE = "One sampled token's draw: torch.multinomial against the compiled loop (`benchmarks/sampling.py`)"
TEXT = ("torch.multinomial(probs, 1, generator) and fixlab's compiled draw from the same seeded stream, on one vocabulary "
        "row; `same picks` counts the draws where both chose the same token (all of them, or the loop is not used).")
TABLE = {"rows": "rows", "columns": [["vocabulary", "vocab"], ["temperature", "temperature"],
                                    ["torch ms", "torch_ms"], ["compiled ms", "compiled_ms"], ["speed-up", "speedup"],
                                    ["same picks", "same_picks"], ["draws", "draws"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not sampling.Draws.check():
        raise SystemExit("the compiled draw is not torch's here (or not built): nothing to compare")
    logits = torch.randn(args.vocab, generator=torch.Generator().manual_seed(0)) * 4
    rows = []
    for temperature in (0.2, 0.8, 1.2):
        probs = torch.softmax(logits / temperature, dim=-1)
        g, d = torch.Generator().manual_seed(1), sampling.Draws(1)
        t0 = time.perf_counter()
        want = [int(torch.multinomial(probs, 1, generator=g)[0]) for _ in range(args.draws)]
        t1 = time.perf_counter()
        got = [d.multinomial(probs) for _ in range(args.draws)]
        t2 = time.perf_counter()
        a, b = (t1 - t0) / args.draws * 1e3, (t2 - t1) / args.draws * 1e3
        rows.append({"vocab": args.vocab, "temperature": temperature, "torch_ms": round(a, 3),
                     "compiled_ms": round(b, 3), "speedup": round(a / b, 2),
                     "same_picks": sum(x == y for x, y in zip(want, got)), "draws": args.draws})
        print(f"T={temperature}: torch {a:.3f} ms, compiled {b:.3f} ms ({a / b:.1f}x), "
              f"same picks {rows[-1]['same_picks']}/{args.draws}")
    dest = write("sampling", {"rows": rows}, title=TITLE, text=TEXT, table=TABLE, out=args.out, config=vars(args),
                 machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
