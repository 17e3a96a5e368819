"""Decode attention alone, side by side: the compiled kernel (serving/kernels.c) of this working tree against
the same file at other git revisions, on the default 1.5B pack's shapes (28 layers, 12 query heads over 2 K/V heads,
head size 128) over a made-up float16 KV cache: B rows of about C columns, rows up to 199 columns apart (left
padding, as in a job's batches), Q query tokens a row (1: decode; more: prompt-lookup drafts).

Each revision's kernels.c is built with this tree's compiler flags (serving/native.py) into a temporary
folder; the kernels then take turns, step after step, and each keeps its fastest of `--reps` steps, so that a
passing load touches every row alike. Each row also gives its largest difference from exact attention (SDPA in
float32 over the same widened values).

    .venv/bin/python benchmarks/attention.py --against 0995f0a          # this tree's kernel and 0995f0a's
    .venv/bin/python benchmarks/attention.py --against 0995f0a --rows 32 --context 1500 --queries 4

Writes benchmarks/results/attention-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels_at  # noqa: E402
from serving import native  # noqa: E402
from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402

LAYERS, HEADS, KV_HEADS, HEAD_SIZE = 28, 12, 2, 128  # Qwen2.5-Coder-1.5B


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "Decode attention alone, kernel against kernel (`benchmarks/attention.py`)"
TEXT = ("The compiled decode attention (serving/kernels.c) of the tree that ran the benchmark against the same "
        "file at earlier commits, taking turns step after step over a made-up float16 KV cache of the 1.5B pack's "
        "shapes; the largest difference from exact float32 attention over the same values.")
TABLE = {"rows": "rows", "columns": [["rows", "$.shape.rows"], ["context", "$.shape.context"],
                                     ["queries", "$.shape.queries"], ["K/V MB a step", "$.shape.kv_mb_read"],
                                     ["kernels", "kernels"], ["ms a step", "ms_per_step"], ["K/V GB/s", "kv_gb_per_s"],
                                     ["max diff vs exact", "max_abs_diff_vs_exact"],
                                     ["time over the tree's", "this_tree_faster"]]}


def build(rev: str, into: Path):
    return kernels_at.build(rev, into, "fixlab_decode_attention", "the float16 KV cache", ("fixlab_decode_attention",))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", nargs="+", default=[], metavar="REV", help="git revisions whose kernels.c to time")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--context", type=int, default=700, help="the longest row's columns; rows up to 199 fewer")
    ap.add_argument("--queries", type=int, default=1)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not native.available():
        sys.exit("error: the compiled kernels do not build here (gcc missing?): nothing to time")
    B, L, Q, D = args.rows, args.context, args.queries, HEAD_SIZE
    g = torch.Generator().manual_seed(0)
    cache = [((torch.randn(B, KV_HEADS, L + 64, D, generator=g) * 3).half()[:, :, :L],
              torch.randn(B, KV_HEADS, L + 64, D, generator=g).half()[:, :, :L]) for _ in range(LAYERS)]
    starts = torch.randint(0, min(200, L - Q + 1), (B,), generator=g)  # every query sees a column
    mask = (torch.arange(L)[None, :] >= starts[:, None]).view(B, 1, 1, L).expand(B, 1, Q, L)
    mask = mask & torch.ones(Q, L, dtype=torch.bool).tril(L - Q)  # the drafts see each other causally
    query = torch.randn(B, Q, HEADS, D, generator=g).transpose(1, 2)  # as transformers hands it over
    scale = D ** -0.5
    k0, v0 = cache[0]
    exact = F.scaled_dot_product_attention(query, k0.float().repeat_interleave(HEADS // KV_HEADS, 1),
                                           v0.float().repeat_interleave(HEADS // KV_HEADS, 1),
                                           attn_mask=mask).transpose(1, 2)
    revs = [".", *args.against]
    with tempfile.TemporaryDirectory(prefix="attention-") as tmp:
        libs = {rev: build(rev, Path(tmp)) for rev in revs}
        best = {rev: float("inf") for rev in revs}
        diff = {}
        key = native.default_isa()
        saved = native._libs.get(key)
        try:
            for rep in range(args.reps + 1):  # the first round warms the caches and is not kept
                for rev in revs:
                    native._libs[key] = libs[rev]
                    t = time.perf_counter()
                    outs = [native.decode_attention(query, k, v, mask, False, scale) for k, v in cache]
                    wall = time.perf_counter() - t
                    if rep:
                        best[rev] = min(best[rev], wall)
                    else:  # the warm-up round's answers: the same every round
                        diff[rev] = float((outs[0] - exact).abs().max())
        finally:
            native._libs[key] = saved
    visible = int(mask[:, 0, -1].sum())
    kv_bytes = visible * KV_HEADS * D * 2 * 2 * LAYERS  # K and V, float16
    rows = [{"kernels": "this tree" if rev == "." else rev, "ms_per_step": round(best[rev] * 1e3, 1),
             "kv_gb_per_s": round(kv_bytes / best[rev] / 1e9, 1), "max_abs_diff_vs_exact": diff[rev],
             "this_tree_faster": round(best[rev] / best["."], 2)} for rev in revs]
    result = {"shape": {"rows": B, "context": L, "queries": Q, "visible_columns": visible, "layers": LAYERS,
                        "heads": HEADS, "kv_heads": KV_HEADS, "head_size": D, "kv_mb_read": round(kv_bytes / 1e6)},
              "reps": args.reps, "rows": rows, "note": "this_tree_faster: that row's time over this tree's"}
    out = write("attention", result, title=TITLE, text=TEXT, table=TABLE, out=args.out, config=vars(args),
                machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    print(f"{B} rows x {L} columns ({visible // B} visible a row on average), {Q} quer{'y' if Q == 1 else 'ies'} a row,"
          f" {LAYERS} layers: K/V read {kv_bytes / 1e6:.0f} MB a step")
    print("kernels | ms a step | K/V GB/s | max |diff| vs exact | this tree faster by")
    for r in rows:
        print(f"{r['kernels']} | {r['ms_per_step']} | {r['kv_gb_per_s']} | {r['max_abs_diff_vs_exact']:.2e} | "
              f"{r['this_tree_faster']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
