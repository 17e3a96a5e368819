"""Where a decode step's time goes: the default 1.5B pack (conf/model/qwen1.5b-coder-q4.yaml as is) through fixlab's
engine, B rows decoding at about C tokens of context, each step split into the decoder's int8 matmuls (with their
activation rounding; `of which torch._int_mm` is the integer products alone, the lm_head's included), the lm_head,
decode attention, the rest of the forward (norms, rotary, residuals, MLP activation, KV cache writes, transformers'
Python) and the engine outside the forward (sampling, stop checks, retiring rows). Where the decoder's layers run as
one compiled call (serving/decoder.py: the default 1.5B pack's decode steps, draft steps and prefix-hit
prefills), that call is its own part, "compiled decoder layers", with their matmuls and attention inside it.

Each part is timed by wrapping its Python entry point (CPU ops are synchronous, so wall time is the cost), over the
steps after a few warm-up steps; no profiler overhead. The prefill of the same prompts (in groups of the model's
max_prefill_tokens) is split the same way, per prompt token.

    .venv/bin/python benchmarks/decode_profile.py                      # B=32, C=700, 48 new tokens a row
    .venv/bin/python benchmarks/decode_profile.py --rows 16 --context 300 --set cpu_attention=false
    .venv/bin/python benchmarks/decode_profile.py --drafts --rows 24 --new 400   # a job's steps: real repair
        prompts, the pack's drafts, every other row sampled at temperature 0.8, rows ending at their EOS

--set KEY=VALUE sets a model knob (TransformersModelConf) or one of the engine's own settings (EngineTuning,
serving/tuning.py: cpu_attention, kv_dtype, int8_kernel...).

Writes benchmarks/results/decode-profile-<UTC time>.json and prints the split.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from agents.models.base import GenRequest  # noqa: E402
try:  # a tree from before the compiled decoder layers has none (a benchmark run against an older revision)
    from serving import decoder  # noqa: E402
except ImportError:
    decoder = None
from serving.hf import TransformersModel  # noqa: E402
from serving.int8 import Int8Linear  # noqa: E402
from serving.paths import calibrate_matmuls, model_shapes  # noqa: E402
from serving.machine import describe  # noqa: E402
from flows.results import write  # noqa: E402
from weights import decode_ids, prompts, split_settings  # noqa: E402

# the compiled decoder layers (serving/decoder.py): the layers' int8 matmuls, attention and float work in one
# call, where it applies; those parts then count only what runs outside it
LAYERS = "compiled decoder layers"
PARTS = ("int8 matmuls", "lm_head", "attention", LAYERS, "rest of the forward", "engine outside the forward",
         "sampling")
# inside "int8 matmuls": torch._int_mm itself; the rest is rounding each input row and scaling the product back
MM = "of which torch._int_mm"


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
DECODE = ("int8 matmuls", "of which torch._int_mm", "lm_head", "attention", LAYERS, "rest of the forward",
          "engine outside the forward", "of which sampling")
PREFILL = ("int8 matmuls", "of which torch._int_mm", "attention", LAYERS, "rest of the forward")
TITLE = "Where a decode step and a prefill go (`benchmarks/decode_profile.py`)"
TEXT = ("The 1.5B pack in fixlab's engine, each part timed at its Python entry point: decode over the steps after a "
        "warm-up, the prefill of the same prompts per prompt token. `torch._int_mm` is the integer products inside the "
        "int8 matmuls.")
TABLE = {"rows": ".", "columns": [["rows", "rows"], ["context", "context"], ["drafts", "drafts"],
                                  ["tokens a step", "tokens_a_step"], ["steps", "steps_timed"],
                                  ["step ms", "step_ms"], ["tokens/s", "decode_tok_s"],
                                  ["matmuls alone tokens/s", "matmuls_alone.tok_s"],
                                  ["share of the matmuls' rate", "engine_share_of_matmuls_alone_rate"],
                                  *([f"{k} ms", f"ms_per_step.{k}"] for k in DECODE),
                                  ["prefill tokens/s", "prefill.tok_s"],
                                  *([f"prefill {k} ms a token", f"prefill.ms_per_token.{k}"] for k in PREFILL)]}


def default_model(overrides: dict):
    """The default model's record (conf/model/qwen1.5b-coder-q4.yaml over TransformersModelConf) with `overrides`."""
    from omegaconf import OmegaConf

    from agents.models.config import TransformersModelConf
    from flows.schema import typed

    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "qwen1.5b-coder-q4.yaml"), resolve=True)
    cfg.pop("defaults", None)
    return typed(TransformersModelConf, {**cfg, **overrides}, "model")


class Clock:
    """Wall seconds per part while `on`, kept apart for decode steps (after the warm-up) and prefills."""

    def __init__(self):
        self.on = False
        self.phase = "decode"
        self.by_phase = {ph: dict.fromkeys(PARTS + (MM, "forward", "step"), 0.0) for ph in ("decode", "prefill")}
        self.inside: set = set()

    @property
    def s(self) -> dict:
        return self.by_phase["decode"]

    def wrap(self, part: str, fn):
        def timed(*a, **kw):
            if not self.on or part in self.inside:  # a part inside itself (forward -> quantized) counts once
                return fn(*a, **kw)
            self.inside.add(part)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.inside.discard(part)
                self.by_phase[self.phase][part] += time.perf_counter() - t0
        return timed


def instrument(m: TransformersModel, clock: Clock) -> None:
    from transformers import AttentionInterface

    from serving.int8 import Int8Linear

    Int8Linear.forward = clock.wrap("int8 matmuls", Int8Linear.forward)
    Int8Linear.quantized = clock.wrap("int8 matmuls", Int8Linear.quantized)  # the fused MLP's down projection
    torch._int_mm = clock.wrap(MM, torch._int_mm)  # looked up on every call by Int8Linear.forward
    head = m.model.get_output_embeddings()
    head.forward = clock.wrap("lm_head", head.forward)
    clock.head_int8 = isinstance(head, Int8Linear)  # then its time is inside "int8 matmuls" too: taken out there
    impl = m.model.config._attn_implementation
    fn = AttentionInterface._global_mapping.get(impl) if impl != "eager" else None
    if fn is not None:
        AttentionInterface.register(impl, clock.wrap("attention", fn))
    eng = m.engine
    eng._forward = clock.wrap("forward", eng._forward)
    if hasattr(eng, "_decode_forward"):
        eng._decode_forward = clock.wrap("forward", eng._decode_forward)  # a plain decode step's forward
    if hasattr(eng, "_prefill_forward"):
        eng._prefill_forward = clock.wrap("forward", eng._prefill_forward)  # a prefill's, around _forward
    if decoder is not None:
        decoder.Stack.forward = clock.wrap(LAYERS, decoder.Stack.forward)  # its int8 matmuls and attention inside
    eng._real_logits = clock.wrap("forward", eng._real_logits)  # a draft step's forward
    eng._pick = clock.wrap("sampling", eng._pick)
    eng._sampled = clock.wrap("sampling", eng._sampled)
    step = eng._step

    def timed_step():
        clock.on = eng.stats["steps"] >= 4  # warm-up steps not counted
        live = list(eng._rows)
        rows, before = len(live), sum(len(r.out_ids) for r in live)
        t0 = time.perf_counter()
        step()
        if clock.on:
            clock.s["step"] += time.perf_counter() - t0
            clock.steps += 1
            clock.rows += rows
            clock.tokens += sum(len(r.out_ids) for r in live) - before  # rows that finished included
        clock.on = False
    prefill = eng._prefill

    def timed_prefill(rows, *a, **kw):
        clock.on, clock.phase = True, "prefill"
        t0 = time.perf_counter()
        try:
            return prefill(rows, *a, **kw)
        finally:
            clock.by_phase["prefill"]["step"] += time.perf_counter() - t0
            clock.prefill_tokens += sum(len(r.prompt_ids) + len(r.out_ids) for r in rows)
            clock.prefill_padded += len(rows) * max(len(r.prompt_ids) + len(r.out_ids) for r in rows)
            clock.on, clock.phase = False, "decode"
    clock.steps = clock.rows = clock.tokens = clock.prefill_tokens = clock.prefill_padded = 0
    eng._step = timed_step
    eng._prefill = timed_prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--new", type=int, default=48, help="new tokens a row (fixed length, no EOS)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="model config or EngineTuning override (yaml value)")
    ap.add_argument("--drafts", action="store_true",
                    help="a job's steps: real repair prompts (context ignored), the pack's drafts, every other row "
                         "sampled at temperature 0.8, rows ending at their EOS or --new")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import yaml

    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    model_set, tuning = split_settings({"max_batch": args.rows, "gather_ms": 1000, "prefix_cache_mib": 0,
                                        **({} if args.drafts else {"draft_tokens": 0}), **overrides})
    m = TransformersModel(default_model(model_set), tuning=tuning)
    clock = Clock()
    try:
        if args.drafts:
            msgs = prompts(args.rows)
            reqs = [GenRequest(messages=msgs[i], max_new_tokens=args.new, temperature=0.8 if i % 2 else 0.0,
                               seed=i if i % 2 else None) for i in range(args.rows)]
            ids = [m.prompt_ids(r) for r in reqs]
        else:
            msgs = prompts(8)
            ids = [decode_ids(m.prompt_ids(GenRequest(messages=msgs[i % 8])), i, args.context)
                   for i in range(args.rows)]
            reqs = [GenRequest(messages=(), max_new_tokens=args.new)] * args.rows
            m.engine.eos_ids = set()
        instrument(m, clock)
        t0 = time.perf_counter()
        futs = [m.engine.submit(r, i) for r, i in zip(reqs, ids)]
        [f.result() for f in futs]
        wall = time.perf_counter() - t0
        kernel = next((mod.plan.kernel(args.rows) for mod in m.model.modules() if isinstance(mod, Int8Linear)), None)
    finally:
        m.close()
    # the yardstick, in the same process: the step's int8 matmuls alone (input rounding included), at these
    # rows, as the path calibration times them (serving/paths.py), right after the steps above
    alone = None
    if kernel is not None:
        alone = calibrate_matmuls(model_shapes(m.model.config), paths=[f"int8:{kernel}"], rows=(args.rows,))
        alone = {"kernel": kernel, "ms": alone[f"int8:{kernel}"][args.rows]}
    s = clock.s
    split = _split(s, clock.head_int8)
    per_step = {k: round(v / clock.steps * 1000, 1) for k, v in split.items()}
    p = clock.by_phase["prefill"]
    pre = _split(p, clock.head_int8)
    prefill = {"seconds": round(p["step"], 2), "tokens": clock.prefill_tokens, "padded_tokens": clock.prefill_padded,
               "tok_s": round(clock.prefill_tokens / p["step"], 1) if p["step"] else None,
               "ms_per_token": {k: round(v / max(1, clock.prefill_tokens) * 1000, 2) for k, v in pre.items()},
               "share": {k: round(v / p["step"], 3) for k, v in pre.items()} if p["step"] else {}}
    # the model's knobs and the engine settings that shape a step (the prefill width: what the engine took)
    model_set, tuning = split_settings(overrides)
    setting = {**dataclasses.asdict(default_model(model_set)), **dataclasses.asdict(tuning),
               "max_prefill_tokens": m.max_prefill_tokens}
    out = {"model": {k: v for k, v in setting.items() if k in (
               "name", "pack", "weights", "dtype", "cpu_attention", "int8_skip", "skinny_matmul", "max_prefill_tokens",
               *overrides)},
           "rows": args.rows, "context": "repair prompts" if args.drafts else args.context, "new_tokens": args.new,
           "drafts": bool(args.drafts), "steps_timed": clock.steps,
           "rows_a_step": round(clock.rows / clock.steps, 1), "tokens_a_step": round(clock.tokens / clock.steps, 1),
           "step_ms": round(s["step"] / clock.steps * 1000, 1), "decode_tok_s": round(clock.tokens / s["step"], 1),
           "ms_per_step": per_step, "share": {k: round(v / s["step"], 3) for k, v in split.items()},
           "prefill": prefill, "wall_s_with_prefill": round(wall, 1)}
    if alone is not None:  # a plain step feeds one token a row: the engine's rate over the matmuls' own at B rows
        out["matmuls_alone"] = {**alone, "tok_s": round(args.rows / alone["ms"] * 1000, 1)}
        if not args.drafts:
            out["engine_share_of_matmuls_alone_rate"] = round(out["decode_tok_s"] / out["matmuls_alone"]["tok_s"], 3)
    dest = write("decode_profile", out, title=TITLE, text=TEXT, table=TABLE, out=args.out,
                 config={f"model.{k}": v for k, v in out["model"].items()},
                 machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    print(f"{out['rows_a_step']} rows a step at ~{out['context']} tokens, {out['tokens_a_step']} tokens a step: "
          f"{out['step_ms']} ms a step, {out['decode_tok_s']} tokens/s")
    for k in split:
        print(f"  {k:<28} {per_step[k]:>7.1f} ms  {out['share'][k] * 100:5.1f}%")
    if alone is not None:
        print(f"int8 matmuls alone at {args.rows} rows ({alone['kernel']}): {alone['ms']:.1f} ms, "
              f"{out['matmuls_alone']['tok_s']} tokens/s"
              + (f"; the engine decodes at {out['engine_share_of_matmuls_alone_rate']:.1%} of that rate"
                 if not args.drafts else ""))
    if p["step"]:
        print(f"prefill: {clock.prefill_tokens} tokens ({clock.prefill_padded} with padding) in {p['step']:.1f} s, "
              f"{prefill['tok_s']} tokens/s")
        for k in pre:
            print(f"  {k:<28} {prefill['ms_per_token'][k]:>7.2f} ms a token  {prefill['share'][k] * 100:5.1f}%")
    print(f"wrote {dest}")


def _split(s: dict, head_int8: bool) -> dict:
    """Parts that add up to the step; MM (torch._int_mm, the lm_head's included) is a part of the int8 time."""
    int8 = s["int8 matmuls"] - (s["lm_head"] if head_int8 else 0.0)  # the decoder's linears
    return {"int8 matmuls": int8, MM: s[MM], "lm_head": s["lm_head"], "attention": s["attention"], LAYERS: s[LAYERS],
            "rest of the forward": s["forward"] - int8 - s["lm_head"] - s["attention"] - s[LAYERS],
            "engine outside the forward": s["step"] - s["forward"], "of which sampling": s["sampling"]}


if __name__ == "__main__":
    main()
