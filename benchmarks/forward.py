"""One decode forward of the default 1.5B pack over a made-up KV cache, split into int8 matmuls and attention:
B rows, C cache columns of which a share is left padding (rows of different lengths, as in a job's batches), Q new
tokens a row, with decode attention's per-row path (each row reads its own columns) forced off and on.

No prefill is needed (the cache holds random keys and values: timing does not depend on them), so a row costs
seconds, and the padding of a real job can be set exactly (a job's decode batches carry 40-45% at 1200 columns:
the engine's kv_slots / kv_tokens).

    .venv/bin/python benchmarks/forward.py                       # the default grid
    .venv/bin/python benchmarks/forward.py --shapes 32x1200x1 --padding 0.44

Writes benchmarks/results/forward-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
from transformers import AttentionInterface, DynamicCache  # noqa: E402

from serving import cpu_attention  # noqa: E402
from serving.kvcache import _GrowingLayer  # noqa: E402
from serving.hf import TransformersModel  # noqa: E402
from serving.int8 import Int8Linear  # noqa: E402
from decode_profile import default_model  # noqa: E402
from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402

PARTS = {"int8": 0.0, "attention": 0.0}


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "Decode attention over left padding (`benchmarks/forward.py`)"
TEXT = ("One forward of the 1.5B pack over a made-up KV cache (rows x cache columns x new tokens a row, a share of the "
        "slots left padding): decode attention batched over every row's whole width against per row.")
TABLE = {"rows": "rows", "columns": [["rows", "rows"], ["columns", "columns"], ["new tokens", "new_tokens"],
                                     ["padding", "padding"], ["forward ms batched", "batched.forward_ms"],
                                     ["attention ms batched", "batched.attention_ms"],
                                     ["forward ms per-row gate", "per_row.forward_ms"],
                                     ["attention ms per-row gate", "per_row.attention_ms"], ["speedup", "speedup"]]}


def timed(part: str, fn):
    def f(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            PARTS[part] += time.perf_counter() - t0
    return f


def forward_ms(model, B: int, C: int, Q: int, padding: float, reps: int) -> dict:
    cfg = model.config
    KV, D = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=cfg)
    cache.layers = [_GrowingLayer() for _ in cache.layers]
    for layer in cache.layers:
        layer.update(torch.randn(B, KV, C, D, generator=g), torch.randn(B, KV, C, D, generator=g))
    mask = torch.ones(B, C, dtype=torch.long)
    for b in range(B):  # row b padded by b/B of twice the share: the batch's padding is `padding` of its slots
        mask[b, : int(padding * 2 * C * b / B)] = 0
    ids = torch.randint(0, 1000, (B, Q), generator=g)
    with torch.inference_mode():
        for i in range(reps + 1):
            if i == 1:  # the first forward warms up
                PARTS.update(int8=0.0, attention=0.0)
                t0 = time.perf_counter()
            full = torch.cat([mask, torch.ones(B, Q * (i + 1), dtype=torch.long)], 1)
            pos = full.sum(1, keepdim=True) - Q + torch.arange(Q)[None]
            model(input_ids=ids, attention_mask=full, position_ids=pos, past_key_values=cache, use_cache=True,
                  logits_to_keep=Q)
        wall = (time.perf_counter() - t0) / reps
    return {"forward_ms": round(wall * 1000, 1), "int8_ms": round(PARTS["int8"] / reps * 1000, 1),
            "attention_ms": round(PARTS["attention"] / reps * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x1200x1,24x1200x1,32x700x1,32x1200x4", help="BxCxQ, comma-separated")
    ap.add_argument("--padding", default="0.44,0.27,0.1", help="left padding shares, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    m = TransformersModel(default_model({"prefix_cache_mib": 0}))
    Int8Linear.forward = timed("int8", Int8Linear.forward)
    impl = m.model.config._attn_implementation
    AttentionInterface.register(impl, timed("attention", AttentionInterface._global_mapping[impl]))
    rows = []
    try:
        for shape in args.shapes.split(","):
            B, C, Q = (int(x) for x in shape.split("x"))
            for pad in (float(p) for p in args.padding.split(",")):
                row = {"rows": B, "columns": C, "new_tokens": Q, "padding": pad}
                for name, share in (("batched", 2.0), ("per_row", cpu_attention.PADDING_SHARE)):
                    saved = cpu_attention.PADDING_SHARE
                    cpu_attention.PADDING_SHARE = share
                    try:
                        row[name] = forward_ms(m.model, B, C, Q, pad, args.reps)
                    finally:
                        cpu_attention.PADDING_SHARE = saved
                row["speedup"] = round(row["batched"]["forward_ms"] / row["per_row"]["forward_ms"], 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        m.close()
    out = write("forward", {"per_row_gate": {"share": cpu_attention.PADDING_SHARE, "slots": cpu_attention.PADDING_SLOTS},
                      "rows": rows}, title=TITLE, text=TEXT, table=TABLE, config=vars(args),
          machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    print("| rows x columns x new | padding | forward ms batched / per-row (attention) | speedup |")
    print("|---|---|---|---|")
    for r in rows:
        b, p = r["batched"], r["per_row"]
        print(f"| {r['rows']}x{r['columns']}x{r['new_tokens']} | {r['padding']} | {b['forward_ms']} ({b['attention_ms']}) "
              f"/ {p['forward_ms']} ({p['attention_ms']}) | {r['speedup']} |")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
