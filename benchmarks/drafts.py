"""Decode of real repairs through fixlab's engine, one engine setting per row, side by side in one process.

The load is a round of the default job at full batch: the tuning sample's first 8 task prompts (Python/0-7,
single_shot's), each sent greedy and with 3 seeds at temperature 0.8 (32 rows together), answers ending at the
closing fence, as a job's requests do. Every row is a new BatchEngine over the same loaded model (the default pack
as configured), fed the same requests; prefix reuse is off so every row prefills the same prompts.

Per row: decode and prefill seconds from the engine's clocks, completion tokens and decode tokens/s, drafts
proposed and kept, forwards (steps), cache compactions, the share of attention's KV slots that were padding, and
how many of the 32 answers equal the first row's: all of them, since a row's values depend on its own tokens only and
seeded rows draw one number a token, whatever the drafts (a difference is a bug). Each engine is built as the job's
is, float16 KV cache included; before 2026-11-30 this script left it float32, whose padded prefills went to SDPA, and
its seeded answers then differed between rows.

    .venv/bin/python benchmarks/drafts.py                       # every row
    .venv/bin/python benchmarks/drafts.py --rows "drafts below 8 rows,defaults" --prompts 4 --max-new 256

Writes benchmarks/results/drafts-<UTC time>.json and prints a table.
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

from agents.context import CODE_STOP, Context  # noqa: E402
from agents.config import AgentConfig, SingleShotConf  # noqa: E402
from agents.models.base import GenRequest  # noqa: E402
from serving import cpu_attention  # noqa: E402
from serving import drafts as engine_mod  # noqa: E402 (HOLES_SHARE: the draft steps' setting)
from serving.engine import BatchEngine  # noqa: E402
from serving.hf import TransformersModel  # noqa: E402
from agents.strategies import REGISTRY  # noqa: E402
from agents.tasks import DatasetConf, load_tasks  # noqa: E402
from decode_profile import default_model  # noqa: E402
from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402
from weights import DATA  # noqa: E402

# engine keyword arguments, and module settings ("module.NAME") that a row changes for its run
ROWS = {
    "no drafts": {"draft_tokens": 0, "cpu_attention.PADDING_SHARE": 2.0},
    # the defaults before drafts at full batch: drafts only while a step feeds at most 16 tokens (below 8 rows)
    "drafts below 8 rows": {"draft_tokens": 8, "draft_step_tokens": 16, "cpu_attention.PADDING_SHARE": 2.0},
    "defaults": {},  # conf/model/qwen1.5b-coder-q4.yaml over TransformersModelConf
    "drafts 8": {"draft_tokens": 8},
    "step 64": {"draft_step_tokens": 64},
    "step 192": {"draft_step_tokens": 192},
    # every row drafts what the step allows, however short the match it follows (the rule before PER_MATCHED)
    "one length for all": {"engine.PER_MATCHED": None},
    "half the match": {"engine.PER_MATCHED": 1 / 2},
    "a third of the match": {"engine.PER_MATCHED": 1 / 3},
    "a quarter of the match": {"engine.PER_MATCHED": 1 / 4},
    "the whole match": {"engine.PER_MATCHED": 1.0},
    "holes kept": {"engine.HOLES_SHARE": 1e9},  # rejected drafts never compacted out of the cache
    "ngram 2": {"draft_ngram": 2},
    "48 rows": {"max_batch": 48, "kv_cache_mib": 2304},  # with --seeds 5: 48 requests
}
MODULES = {"cpu_attention": cpu_attention, "engine": engine_mod}


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "Prompt-lookup drafts at full batch (`benchmarks/drafts.py`)"
TEXT = ("Real repairs decoding together (the tuning sample's first prompts, greedy and seeded), one engine setting per "
        "row over the same loaded model, built as the job's engine is; every row gives the same answers. Compare "
        "decode: copies of one prompt share a prefill.")
TABLE = {"rows": "rows", "columns": [["row", "row"], ["setting", "setting"], ["wall s", "wall_s"],
                                     ["prefill s", "prefill_s"], ["decode tokens/s", "decode_tok_s"],
                                     ["x first row", "decode_speedup_vs_first"], ["tokens", "completion_tokens"],
                                     ["forwards", "steps"], ["drafts kept", "draft_accepted"],
                                     ["drafts proposed", "draft_tokens"], ["compactions", "compactions"],
                                     ["answers equal to the first row's", "answers_equal_first_row"]]}


def requests(m: TransformersModel, n: int, seeds: int, max_new: int) -> list[tuple[GenRequest, list[int]]]:
    tasks = load_tasks(DatasetConf(local_fallback=str(DATA)))[:n]
    agent = AgentConfig(SingleShotConf())
    out = []
    for t in tasks:
        msgs = REGISTRY["single_shot"](Context(t, None, None, agent)).first_messages()
        ids = m.prompt_ids(GenRequest(messages=msgs))
        out.append((GenRequest(messages=(), max_new_tokens=max_new, stop=CODE_STOP), ids))
        out += [(GenRequest(messages=(), max_new_tokens=max_new, stop=CODE_STOP, temperature=0.8, seed=s), ids)
                for s in range(1, seeds + 1)]
    return out


def run_row(m: TransformersModel, name: str, reqs, base: dict) -> tuple[dict, list[str]]:
    setting = ROWS[name]
    saved = {}
    for key, value in setting.items():
        if "." in key:
            mod, attr = key.split(".")
            saved[key] = getattr(MODULES[mod], attr)
            setattr(MODULES[mod], attr, value)
    kw = {**base, **{k: v for k, v in setting.items() if "." not in k}}
    eng = BatchEngine(m.model, m.tokenizer, **kw)
    try:
        t0 = time.perf_counter()
        futs = [eng.submit(r, ids) for r, ids in reqs]
        outs = [f.result() for f in futs]
        wall = time.perf_counter() - t0
        s = dict(eng.stats)
    finally:
        eng.close()
        for key, value in saved.items():
            mod, attr = key.split(".")
            setattr(MODULES[mod], attr, value)
    tokens = sum(g.completion_tokens for g in outs)
    return {"row": name, "setting": setting, "wall_s": round(wall, 1), "decode_s": round(s["decode_s"], 1),
            "prefill_s": round(s["prefill_s"], 1), "completion_tokens": tokens,
            "decode_tok_s": round(tokens / s["decode_s"], 1), "steps": s["steps"], "draft_steps": s["draft_steps"],
            "draft_tokens": s["draft_tokens"], "draft_accepted": s["draft_accepted"],
            "compactions": s.get("compactions", 0),
            "kv_padding_share": round(1 - s["kv_tokens"] / max(1, s["kv_slots"]), 3)}, [g.text for g in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from: {', '.join(ROWS)}")
    ap.add_argument("--prompts", type=int, default=8, help="task prompts (Python/0-N), each sent 1 + --seeds times")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=512, help="answer length limit (a job's is 512)")
    args = ap.parse_args()
    names = [r for r in args.rows.split(",") if r]
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        sys.exit(f"error: unknown row(s) {', '.join(unknown)}: use {', '.join(ROWS)}")
    m = TransformersModel(default_model({"prefix_cache_mib": 0}))
    try:
        e = m.engine
        base = dict(eos_ids=e.eos_ids, max_context=e.max_context, max_batch=e.max_batch, gather_ms=200,
                    max_prefill_tokens=e.max_prefill_tokens, pad_id=e.pad_id, draft_tokens=e.draft_tokens,
                    draft_ngram=e.draft_ngram, draft_step_tokens=e.draft_step_tokens, kv_cache_mib=e.kv_budget / 2**20,
                    kv_dtype=e.kv_dtype)  # the job's float16 cache: its attention kernel, no SDPA
        reqs = requests(m, args.prompts, args.seeds, args.max_new)
        rows, first = [], None
        for name in names:
            row, texts = run_row(m, name, reqs, base)
            first = first or texts
            row["answers_equal_first_row"] = sum(a == b for a, b in zip(texts, first))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        m.close()
    ref = rows[0]["decode_tok_s"]
    for r in rows:
        r["decode_speedup_vs_first"] = round(r["decode_tok_s"] / ref, 2)
    out = write("drafts", {"requests": len(reqs), "prompts": args.prompts, "seeds": args.seeds,
                     "max_new_tokens": args.max_new, "max_batch": base["max_batch"], "rows": rows},
          title=TITLE, text=TEXT, table=TABLE, config=vars(args),
          machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    print("| row | decode s | tokens | decode tok/s | x first | steps | drafts kept/proposed | compactions | pad share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['row']} | {r['decode_s']} | {r['completion_tokens']} | {r['decode_tok_s']} | "
              f"{r['decode_speedup_vs_first']} | {r['steps']} | {r['draft_accepted']}/{r['draft_tokens']} | "
              f"{r['compactions']} | {r['kv_padding_share']} |")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
