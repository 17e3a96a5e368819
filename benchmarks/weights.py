"""Weights in memory, side by side in one run: the real 1.5B pack with `weights: dtype` (float32 here, or bf16 where
the CPU has it) against `weights: int8`, through fixlab's batching engine, and the same GGUF through llama.cpp.

Per row: prefill tokens/s (one HumanEvalFix-sized prompt), decode tokens/s at batch 1, 8 and 16 (32 new tokens
per row, fixed length, no EOS; the prompts come from the prefix store, so this is decode), resident weight bytes, and how many of the first 48 greedy tokens agree with the first row on
8 real task prompts (Python/0-7, the tuning sample). Quality proper is measured by pass@1 on Python/0-23
(README), not here.

    .venv/bin/python benchmarks/weights.py                 # rows: dtype, int8, int8+head (lm_head too), llamacpp
    .venv/bin/python benchmarks/weights.py --rows int8 --batches 1 16
    .venv/bin/python benchmarks/weights.py --rows int8-fp32,int8-bf16 --batches 1 16 32   # on a CPU with bf16
    .venv/bin/python benchmarks/weights.py --rows int8-bf16-sdpa,int8-fp32-sdpa,int8 --batches 1 16 32 --context 1000
    .venv/bin/python benchmarks/weights.py --rows int8+head-eager,int8+head --batches 1 32 --context 700  # compiled loops
    .venv/bin/python benchmarks/weights.py --rows int8+head-eager-kv32,int8+head-kv32,int8+head --batches 1 32 --context 700
    .venv/bin/python benchmarks/weights.py --rows int8@a577d8e,int8+head,int8@a577d8e,int8+head --batches 32 --context 700
    .venv/bin/python benchmarks/weights.py --rows default,llamacpp,int8+head@1cc9ea3 --batches 1 32 --context 700
    # as an AVX2-only CPU would run (fixlab's kernels built for AVX2; MKL and oneDNN held to AVX2):
    FIXLAB_CPU_ISA=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        .venv/bin/python benchmarks/weights.py --rows default,llamacpp --batches 1 32 --context 700

A row named NAME@REV is row NAME of this script as it was at git revision REV (run from a temporary worktree of
this repository in a child process): the engine as it stood then, measured beside today's in one run.

Writes benchmarks/results/weights-<UTC time>.json and prints a table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from agents.context import Context  # noqa: E402
from agents.config import AgentConfig, ReflectionConf  # noqa: E402
from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import LlamaCppModelConf, TransformersModelConf  # noqa: E402
from serving import EngineTuning  # noqa: E402
from serving.hf import TransformersModel  # noqa: E402
from serving.machine import describe  # noqa: E402
from agents.strategies import REGISTRY  # noqa: E402
from agents.tasks import DatasetConf, load_tasks  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "humanevalfix_python.jsonl"


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "Prefill and decode tokens/s, 1.5B pack (`benchmarks/weights.py`)"
TEXT = ("Rows of one file ran side by side; a decode context is the tokens of context each row decodes at. A row "
        "NAME@REV is row NAME of the script as it stood at commit REV (the engine then).")
TABLE = {"rows": "rows", "columns": [["decode context", "$.decode_context"], ["weights", "weights"], ["path", "path"],
                                     ["dtype", "dtype"], ["GiB", "weight_gib"],
                                     ["prefill tokens/s", "prefill_tok_s"]]}  # + a column per batch: batch_columns


def batch_columns(rows: list[dict]) -> list[list[str]]:
    """One column per batch the rows decoded at (batch<B>_tok_s)."""
    batches = sorted({int(k[5:-6]) for r in rows for k in r if k.startswith("batch") and k.endswith("_tok_s")})
    return [[f"decode tokens/s at {b} rows", f"batch{b}_tok_s"] for b in batches]


def prompts(n: int) -> list[list[dict]]:
    tasks = load_tasks(DatasetConf(local_fallback=str(DATA)))[:n]
    agent = AgentConfig(ReflectionConf())
    return [REGISTRY["reflection"](Context(t, None, None, agent)).first_messages() for t in tasks]


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


# a row's settings: model knobs (TransformersModelConf) and the engine's own (EngineTuning: int8_native, kv_dtype,
# cpu_attention, int8_kernel), told apart by split_settings
ROWS = {"dtype": {"weights": "dtype"}, "int8": {"weights": "int8"},
        "int8+head": {"weights": "int8", "int8_skip": []},  # int8+head: lm_head in int8 too
        # int8's input rounding and output scaling: compiled loops (serving/native.py, the default) or eager
        "int8+head-eager": {"weights": "int8", "int8_skip": [], "int8_native": False},
        # the KV cache: float16 read by the compiled decode attention (the default where it builds) or float32
        "int8+head-kv32": {"weights": "int8", "int8_skip": [], "kv_dtype": "float32"},
        "int8+head-eager-kv32": {"weights": "int8", "int8_skip": [], "int8_native": False, "kv_dtype": "float32"},
        # int8 with the rest (activations, norms, attention, lm_head) in fp32 or bf16, whatever `dtype: auto` picks here
        "int8-fp32": {"weights": "int8", "dtype": "float32"}, "int8-bf16": {"weights": "int8", "dtype": "bfloat16"},
        # decode attention: fixlab's grouped fp32 path (serving/cpu_attention.py, the default) against SDPA
        "int8-fp32-sdpa": {"weights": "int8", "dtype": "float32", "cpu_attention": False},
        "int8-bf16-sdpa": {"weights": "int8", "dtype": "bfloat16", "cpu_attention": False},
        # the int8 matmuls by one kernel at every width (the default, int8_kernel auto, is measured per width here)
        "int8+head-torch": {"weights": "int8", "int8_skip": [], "int8_kernel": "torch"},
        "int8+head-fixlab": {"weights": "int8", "int8_skip": [], "int8_kernel": "fixlab"},
        # make eval's model exactly as it resolves on this machine (conf/model/qwen1.5b-coder-q4.yaml: runtime,
        # weights and int8 kernels measured here, serving/paths.py), under this script's batch and no drafts
        "default": "default",
        "llamacpp": None}  # the same GGUF served by llama.cpp (xllamacpp, Q4_K_M as is), slots = largest batch


def default_conf(batches: list[int]):
    from omegaconf import OmegaConf

    from flows.schema import typed

    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "qwen1.5b-coder-q4.yaml"), resolve=True)
    cfg.pop("defaults", None)
    return typed(TransformersModelConf, {**cfg, **HARNESS, "max_batch": max(batches)}, "model")


HARNESS = {"prefix_cache_mib": 4096, "draft_tokens": 0}  # every engine row: one batch (HARNESS_TUNING), no drafts
HARNESS_TUNING = {"gather_ms": 200}
TUNING = {f.name for f in dataclasses.fields(EngineTuning)}


def split_settings(settings: dict) -> tuple[dict, EngineTuning]:
    """KEY=VALUE settings as (model config overrides, the engine's tuning): EngineTuning's fields go to the tuning
    (serving/tuning.py), the rest to the model's record."""
    return ({k: v for k, v in settings.items() if k not in TUNING},
            EngineTuning(**{k: v for k, v in settings.items() if k in TUNING}))


def llamacpp_row(batches: list[int], msgs: list[list[dict]], context: int = 200, m=None) -> dict:
    """The peer: fixlab's llamacpp backend (embedded server, OpenAI API), same chat prompts (the GGUF carries the
    same tokenizer and template) and the same measurements; with `context` other than 200, each row's prompt is
    the engine rows' token prompt of about that length, as text."""
    from serving.llamacpp import LlamaCppModel

    per_slot = max(1024, context + 256)
    m = m or LlamaCppModel(LlamaCppModelConf(name="qwen1.5b-llamacpp", pack="qwen1.5b-coder-q4", slots=max(batches),
                                             context_per_slot=per_slot))
    out = {"weights": "llamacpp", "dtype": "q4_k_m", "weight_gib": None}
    if context != 200:
        from transformers import AutoTokenizer

        from serving.packs import ensure_pack

        tok = AutoTokenizer.from_pretrained(str(ensure_pack("qwen1.5b-coder-q4")))
        ids = [tok(tok.apply_chat_template(mm, add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for mm in msgs]
        texts = [tok.decode(decode_ids(list(ids[i % len(ids)]), i, context), skip_special_tokens=True)
                 for i in range(max(batches))]
        msgs = [[{"role": "user", "content": t}] for t in texts]
    try:
        m.api.extra_body["ignore_eos"] = True  # fixed-length answers, as the engine rows
        first = GenRequest(messages=msgs[0], max_new_tokens=1)
        m.generate(GenRequest(messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}],
                              max_new_tokens=1))  # warm-up that shares no prefix with the timed prompt
        t0 = time.perf_counter()
        g = m.generate(first)
        out["prefill_tokens"] = g.prompt_tokens
        out["prefill_tok_s"] = round(g.prompt_tokens / (time.perf_counter() - t0), 1)
        for b in batches:
            reqs = [GenRequest(messages=msgs[i % len(msgs)], max_new_tokens=32, seed=1) for i in range(b)]
            _concurrently(m, reqs)  # fills the slots' prompt caches: the timed pass decodes
            t0 = time.perf_counter()
            gens = _concurrently(m, reqs)
            out[f"batch{b}_tok_s"] = round(sum(g.completion_tokens for g in gens) / (time.perf_counter() - t0), 1)
        return out
    finally:
        m.close()


def _concurrently(m, reqs):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(m.generate, reqs))


def decode_ids(ids: list[int], i: int, context: int) -> list[int]:
    """Row i's decode prompt: its task prompt repeated or cut to about `context` tokens, rows 0-199 tokens apart
    (a real batch is padded to its longest row)."""
    n = max(16, context - (i * 37) % min(200, context))
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def row(name: str, batches: list[int], msgs: list[list[dict]], ref: list[list[int]] | None,
        context: int = 200) -> tuple[dict, list]:
    if name == "default":
        from serving.runtime import build_local

        m = build_local(default_conf(batches), EngineTuning(**HARNESS_TUNING))
        if m.choice.runtime == "llamacpp":
            out = llamacpp_row(batches, msgs, context, m)
            return {**out, "weights": "default", "path": m.choice.label(), "serving": m.choice.record()}, None
    else:
        knobs, tuning = split_settings({**ROWS[name], **HARNESS_TUNING})
        m = TransformersModel(TransformersModelConf(name=f"qwen1.5b-{name}", pack="qwen1.5b-coder-q4", **knobs,
                                                    max_batch=max(batches), **HARNESS), tuning=tuning)
    out = {"weights": name, "dtype": str(m.dtype).replace("torch.", ""), "weight_gib": round(weight_bytes(m.model) / 2**30, 2),
           "path": m.choice.label(), "serving": m.choice.record()}
    try:
        eng = m.engine
        ids = m.prompt_ids(GenRequest(messages=msgs[0]))
        warm = m.prompt_ids(GenRequest(messages=msgs[1]))[-64:]  # shares no prefix with `ids`
        eng.submit(GenRequest(messages=(), max_new_tokens=1), warm).result()
        t0 = time.perf_counter()
        eng.submit(GenRequest(messages=(), max_new_tokens=1), ids).result()
        out["prefill_tokens"] = len(ids)
        out["prefill_tok_s"] = round(len(ids) / (time.perf_counter() - t0), 1)
        new = 32
        for b in batches:
            eng.eos_ids = set()  # fixed-length answers
            reqs = [(GenRequest(messages=(), max_new_tokens=new),
                     m.prompt_ids(GenRequest(messages=msgs[i % len(msgs)]))[:200] if context == 200 else
                     decode_ids(m.prompt_ids(GenRequest(messages=msgs[i % len(msgs)])), i, context))
                    for i in range(b)]
            futs = [eng.submit(r, i) for r, i in reqs]
            [f.result() for f in futs]  # prefills the prompts into the prefix store: the timed pass decodes
            t0 = time.perf_counter()
            futs = [eng.submit(GenRequest(messages=(), max_new_tokens=new, seed=1), i) for _, i in reqs]
            gens = [f.result() for f in futs]
            wall = time.perf_counter() - t0
            out[f"batch{b}_tok_s"] = round(sum(g.completion_tokens for g in gens) / wall, 1)
        eng.eos_ids = set(m.eos_ids)
        greedy = []
        for mm in msgs:
            g = eng.submit(GenRequest(messages=(), max_new_tokens=48), m.prompt_ids(GenRequest(messages=mm))).result()
            greedy.append(m.tokenizer(g.text, add_special_tokens=False)["input_ids"][:48])
        if ref is not None:
            agree = []
            for a, b in zip(greedy, ref):
                n = 0
                while n < min(len(a), len(b)) and a[n] == b[n]:
                    n += 1
                agree.append(n)
            out["greedy_prefix_agree"] = agree
        return out, greedy
    finally:
        m.close()


class Revisions:
    """Rows of this script as it was at other git revisions: one temporary worktree per revision, removed on exit."""

    def __init__(self) -> None:
        self.trees: dict[str, tuple[str, Path]] = {}

    def row(self, name: str, rev: str, batches: list[int], context: int) -> dict:
        if rev not in self.trees:
            git = ["git", "-C", str(REPO)]
            sha = subprocess.run(git + ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                                 capture_output=True, text=True).stdout.strip()
            if not sha:
                sys.exit(f"error: row {name}@{rev}: {rev!r} is not a commit of this repository (git log shows them)")
            tree = Path(tempfile.mkdtemp(prefix=f"weights-{rev}-")) / "tree"
            self.trees[rev] = (sha, tree)  # before the add: close() removes whatever part of it exists
            if (REPO.parent / "shared").is_dir():  # what the repository finds beside it (the offline dataset)
                (tree.parent / "shared").symlink_to(REPO.parent / "shared")
            added = subprocess.run(git + ["worktree", "add", "--detach", "--quiet", str(tree), sha],
                                   capture_output=True, text=True)
            if added.returncode:
                sys.exit(f"error: row {name}@{rev}: git worktree add failed: {added.stderr.strip()[-200:]}")
        sha, tree = self.trees[rev]
        out = tree.parent / f"{name}.json"
        cmd = [sys.executable, str(tree / "benchmarks" / "weights.py"), "--rows", name, "--context", str(context),
               "--out", str(out), "--batches", *map(str, batches)]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)  # relative settings (the dataset) as here
        if done.returncode or not out.exists():
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            sys.exit(f"error: row {name}@{rev} failed at that revision: {last[0]}")
        r = json.loads(out.read_text())["rows"][0]
        return {**r, "weights": f"{name}@{rev}", "revision": sha}

    def close(self) -> None:
        for _, tree in self.trees.values():
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
            shutil.rmtree(tree.parent, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="dtype,int8,int8+head,llamacpp")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--context", type=int, default=200,
                    help="decode rows' context in tokens (200: every row the same 200; else rows up to 199 apart)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    msgs = prompts(8)
    rows, ref, then = [], None, Revisions()
    names = args.rows.split(",")
    for w in names:
        if "@" not in w and w not in ROWS:
            sys.exit(f"error: unknown row {w!r}: use {', '.join(ROWS)}, or NAME@REV for a row at a git revision")
    try:
        for w in names:
            if "@" in w:
                r = then.row(*w.split("@", 1), args.batches, args.context)
            elif w == "llamacpp":
                r = llamacpp_row(args.batches, msgs, args.context)
            else:
                r, greedy = row(w, args.batches, msgs, ref, args.context)
                ref = ref if ref is not None or greedy is None else greedy
            rows.append(r)
            print(json.dumps(r), flush=True)
    finally:
        then.close()
    base = rows[0]
    for r in rows[1:]:
        r["speedup_vs_first"] = {k: round(r[k] / base[k], 2) for k in r if k.endswith("_tok_s") and base.get(k)}
    from flows.results import write

    out = write("weights", {"decode_context": args.context, "rows": rows}, title=TITLE, text=TEXT, out=args.out,
                table={**TABLE, "columns": TABLE["columns"] + batch_columns(rows)}, config=vars(args),
                machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    cols = ["weights", "dtype", "weight_gib", "prefill_tok_s"] + [f"batch{b}_tok_s" for b in args.batches]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
