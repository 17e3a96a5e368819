"""New tokens per second: one prompt at a time (transformers generate) vs the batching engine at batch 1/4/16/64.

Models are the real architectures of deepseek-coder-1.3b-instruct and Qwen2.5-Coder-0.5B-Instruct (config.json
files in benchmarks/configs/) with randomly initialised weights: speed depends on shapes, not on weight values.
Prompts are random token ids of HumanEvalFix-like lengths (default 400-900 tokens); every request generates
exactly --new-tokens tokens (no EOS), greedy.

Columns: `decode tok/s` = new tokens / time in decode steps (the part batching speeds up);
`e2e tok/s` = new tokens / wall time including prefill (what a run sees; prefill is compute-bound on CPU, so
with short answers and long prompts it caps the end-to-end gain). `exact` = greedy tokens
equal transformers' one-at-a-time output, for every prompt both answered (`agree_prefix`: the mean share of leading
tokens equal; with bf16 and random weights near-ties are common, so a batched kernel may flip one).

    python benchmarks/generation.py                                # CPU default: 2 layers, 32 new tokens
    python benchmarks/generation.py --layers 0 --new-tokens 64     # full depth (slow on CPU)
    python benchmarks/generation.py --device cuda --dtype bfloat16 --layers 0 --new-tokens 128
    python benchmarks/generation.py --arch Qwen2.5-Coder-0.5B-Instruct --batches 1 16 --hf-cb   # + transformers CB
    bash benchmarks/gpu_check.sh        # on a lent GPU machine: 1.5B architecture, bf16, batch 1/32/128 (issue #27)

Flags: --arch (repeatable; default both), --layers N (0 = the real depth), --new-tokens, --prompt-len MIN MAX,
--batches, --seq-prompts (prompts for the one-at-a-time baseline and batch 1), --threads, --hf-cb (also time
transformers' own continuous batching `generate_batch`), --hf-batched (also time plain `generate` on each batch,
left-padded), --no-skinny (CPU: engine runs without the skinny_matmul and
sdpa_gqa settings TransformersModel uses on CPU; the baseline is always stock transformers),
--out (JSON path). Results are noisy when other
processes share the CPU: note the load average printed in the table header.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast  # noqa: E402

from agents.models.base import GenRequest  # noqa: E402
from serving.cores import usable_cores  # noqa: E402
from serving.engine import BatchEngine  # noqa: E402
from serving.hf import resolve_device, resolve_dtype  # noqa: E402
from serving.machine import describe  # noqa: E402
from serving.skinny_matmul import use_skinny_matmul  # noqa: E402

CONFIGS = ROOT / "benchmarks" / "configs"


def id_tokenizer(vocab_size: int):
    """Every id decodes to its own word 't<id>': generated texts compare exactly like token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def build(arch: str, layers: int, device, dtype):
    d = json.loads((CONFIGS / f"{arch}.json").read_text())
    cfg = AutoConfig.for_model(d.pop("model_type"), **{k: v for k, v in d.items() if not k.startswith("_")})
    if layers:
        cfg.num_hidden_layers = layers
        if hasattr(cfg, "max_window_layers"):
            cfg.max_window_layers = layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:layers]
    torch.manual_seed(0)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:  # transformers before 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model.eval(), cfg


def _greedy(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                            top_k=None, top_p=None, temperature=None)


def baseline(model, prompts, new_tokens, device):
    """transformers generate, one prompt at a time; prefill timed separately (max_new_tokens=1)."""
    return hf_batched(model, [[p] for p in prompts], new_tokens, device)


def hf_batched(model, groups, new_tokens, device):
    """transformers generate over each group of prompts as one left-padded batch (a group of one: no padding);
    prefill timed separately (max_new_tokens=1)."""
    out_ids, total, prefill = [], 0.0, 0.0
    with torch.inference_mode():  # warm-up (allocator, thread pool), not timed
        model.generate(input_ids=torch.tensor([groups[0][0][:16]], device=device), max_new_tokens=2,
                       do_sample=False, pad_token_id=0)
    for group in groups:
        width = max(len(p) for p in group)
        inp = torch.tensor([[0] * (width - len(p)) + p for p in group], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
        if len(group) > 1:  # a batch's first call at its shape pays one-off costs (kernel choice): not timed
            with torch.inference_mode():
                model.generate(input_ids=inp, attention_mask=mask, generation_config=_greedy(1))
        for n in (1, new_tokens):
            _sync(device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                o = model.generate(input_ids=inp, attention_mask=mask, generation_config=_greedy(n))
            _sync(device)
            dt = time.perf_counter() - t0
            if n == 1:
                prefill += dt
            else:
                total += dt
        out_ids += [row[width:].tolist() for row in o]
    toks = len(out_ids) * new_tokens
    return {"tokens": toks, "wall_s": total, "prefill_s": prefill, "decode_s": total - prefill, "ids": out_ids}


def engine_run(model, tok, prompts, new_tokens, batch, max_context, decode_ids=True):
    eng = BatchEngine(model, tok, eos_ids=set(), max_context=max_context, max_batch=batch, gather_ms=2000,
                      max_prefill_tokens=16384)
    req = GenRequest(messages=(), max_new_tokens=new_tokens)
    try:
        eng.generate(req, prompts[0][:16])  # warm-up (threads, allocator), not timed
        eng.stats.update(prefill_s=0.0, decode_s=0.0, steps=0)
        t0 = time.perf_counter()
        if batch == 1:  # one at a time, through the engine
            gens = [eng.generate(req, p) for p in prompts]
        else:
            futs = [eng.submit(req, p) for p in prompts]
            gens = [f.result() for f in futs]
        wall = time.perf_counter() - t0
        stats = dict(eng.stats)
    finally:
        eng.close()
    ids = [[int(w[1:]) for w in g.text.split()] if decode_ids else g.text for g in gens]
    return {"tokens": sum(g.completion_tokens for g in gens), "wall_s": wall, "prefill_s": stats["prefill_s"],
            "decode_s": stats["decode_s"], "steps": stats["steps"], "ids": ids}


def hf_continuous(model, prompts, new_tokens, device, one_at_a_time=False):
    """transformers' continuous batching (generate_batch) over all prompts at once, or one call per prompt."""
    model.generate_batch(inputs=[prompts[0][:16]], generation_config=_greedy(2), progress_bar=False)  # warm-up
    ids, wall = [], 0.0
    for group in ([[p] for p in prompts] if one_at_a_time else [prompts]):
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate_batch(inputs=group, generation_config=_greedy(new_tokens), progress_bar=False)
        _sync(device)
        wall += time.perf_counter() - t0
        outs = sorted(out.values(), key=lambda o: int(str(o.request_id).split("_")[-1]))
        ids += [list(o.generated_tokens) for o in outs]
    return {"tokens": sum(len(i) for i in ids), "wall_s": wall, "prefill_s": None, "decode_s": None, "ids": ids}


def kept_run(kind, model, tok, prompts, new_tokens, batch, max_context, decode_ids=True):
    """What fixlab serves through on a GPU (serving/hf_batching.py): transformers' continuous batching or its static
    cache (compiled on a GPU), fed from `batch` threads at once as a job's workers feed it. Every batch width is run
    once untimed first (a static cache compiles per width)."""
    from concurrent.futures import ThreadPoolExecutor

    from serving.hf_batching import ContinuousServer, StaticServer

    kw = dict(eos_ids=set(), pad_id=0, max_context=max_context, max_batch=batch)
    srv = ContinuousServer(model, tok, **kw) if kind == "continuous" else StaticServer(model, tok, gather_ms=200, **kw)
    req = GenRequest(messages=(), max_new_tokens=new_tokens)
    try:
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(lambda p: srv.generate(GenRequest(messages=(), max_new_tokens=2), p), prompts[:batch]))
            _sync(model.device)
            t0 = time.perf_counter()
            gens = list(pool.map(lambda p: srv.generate(req, p), prompts) if batch > 1 else
                        [srv.generate(req, p) for p in prompts])
            _sync(model.device)
            wall = time.perf_counter() - t0
    finally:
        srv.close()
    ids = [[int(w[1:]) for w in g.text.split()] if decode_ids else g.text for g in gens]
    return {"tokens": sum(g.completion_tokens for g in gens), "wall_s": wall, "prefill_s": None, "decode_s": None,
            "ids": ids}


def vllm_run(model, tok, prompts, new_tokens, batch, dtype):
    """vLLM's offline engine on the same architecture and weights (saved to a folder), where vLLM is installed."""
    import tempfile

    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        tok.save_pretrained(d)
        llm = LLM(model=d, dtype=str(dtype).replace("torch.", ""), max_num_seqs=batch, enforce_eager=False)
        sp = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)
        inputs = [{"prompt_token_ids": p} for p in prompts]
        llm.generate(inputs[:batch], SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0))  # warm
        t0 = time.perf_counter()
        outs = llm.generate(inputs, sp) if batch > 1 else [llm.generate([i], sp)[0] for i in inputs]
        wall = time.perf_counter() - t0
        del llm
    ids = [list(o.outputs[0].token_ids) for o in outs]
    return {"tokens": sum(len(i) for i in ids), "wall_s": wall, "prefill_s": None, "decode_s": None, "ids": ids}


BUGGY = '''from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)
    True
    """
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = elem - elem2
                if distance < threshold:
                    return True

    return False
'''


def pack_prompts(tok, n: int) -> list[list[int]]:
    """Real chat prompts (HumanEvalFix style, about 250 tokens), slightly different per request."""
    out = []
    for i in range(n):
        msg = [{"role": "system", "content": "You are an expert Python programmer who fixes bugs."},
               {"role": "user", "content": f"Fix bugs in has_close_elements (attempt {i}).\n\n```python\n{BUGGY}```\n"
                                           "Reply with the whole corrected function in one ```python block."}]
        text = tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def run_pack(name: str, args, results, out: Path) -> None:
    """A real registry pack (real weights and tokenizer): same modes as above, EOS ignored so every request
    makes exactly --new-tokens tokens."""
    from agents.models.config import TransformersModelConf
    from serving import EngineTuning
    from serving.hf import TransformersModel

    t0 = time.perf_counter()
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "0"  # TransformersModel would set it; the baseline runs stock
    m = TransformersModel(TransformersModelConf(name=name, pack=name, batching=False, device=args.device,
                                                dtype=args.dtype), tuning=EngineTuning(skinny_matmul=False))
    print(f"# pack {name}: loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    nmax = max(args.batches + [args.seq_prompts])
    prompts = pack_prompts(m.tokenizer, nmax)
    tok = m.tokenizer
    base_texts: list = []

    def record(label, b, r):
        if "ids" in r:  # transformers answers in token ids, the engine in text: compare texts
            r["ids"] = [tok.decode(i, skip_special_tokens=True) if isinstance(i, list) else i for i in r["ids"]]
        if not base_texts:  # the first row is the one-at-a-time baseline
            base_texts.extend(r["ids"])
        judge(r, base_texts, args.new_tokens, texts=True)
        results["runs"].append({"arch": f"pack:{name}", "mode": label, "batch": b,
                                "layers": m.model.config.num_hidden_layers, "prompt_tokens": len(prompts[0]),
                                **{k: v for k, v in r.items() if k != "ids"}})
        save(results, out)

    measure(m.model, tok, prompts, args, m.device, m.max_context, record, decode_ids=False)
    m.close()


def set_tuning(model, on: bool) -> None:
    """On: the two CPU settings TransformersModel applies (skinny_matmul, sdpa_gqa: serving/tuning.py).
    Off: stock transformers."""
    if on:
        use_skinny_matmul(model)
    else:
        for mod in model.modules():
            mod.__dict__.pop("forward", None)
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1" if on else "0"


def measure(model, tok, prompts, args, device, ctx, record, decode_ids=True):
    """Calls record(label, batch, result) for each row as it is done, the one-at-a-time baseline first. The baseline
    and the engine at batch 1 run interleaved, prompt by prompt, so load drift on a shared machine hits both alike.
    A mode that fails is recorded with its error and the others go on (a GPU check has one try)."""
    tune = device.type == "cpu" and not args.no_skinny
    base_parts, one_parts = [], []
    for p in prompts[: args.seq_prompts]:
        set_tuning(model, False)
        base_parts.append(baseline(model, [p], args.new_tokens, device))
        set_tuning(model, tune)
        one_parts.append(_guarded(engine_run, model, tok, [p], args.new_tokens, 1, ctx, decode_ids))
    record("one at a time (transformers generate)", 1, _merge(base_parts))
    record("engine batch 1", 1, _merge(one_parts))
    print("  done one at a time", flush=True)
    set_tuning(model, False)
    if args.hf_cb:
        record("transformers generate_batch 1", 1, _guarded(hf_continuous, model, prompts[: args.seq_prompts],
                                                             args.new_tokens, device, one_at_a_time=True))
    kept = [("static", "fixlab's static cache + compile server"), ("continuous", "fixlab's continuous batching server")]
    for b in (args.batches if args.kept or args.vllm else []):
        group = prompts[: args.seq_prompts] if b == 1 else prompts[:b]
        for kind, label in (kept if args.kept else []):
            record(f"{label} {b}", b, _guarded(kept_run, kind, model, tok, group, args.new_tokens, b, ctx,
                                               decode_ids))
        if args.vllm:
            record(f"vLLM {b}", b, _guarded(vllm_run, model, tok, group, args.new_tokens, b, model.dtype))
    for b in [b for b in args.batches if b > 1]:
        set_tuning(model, tune)
        record(f"engine batch {b}", b, _guarded(engine_run, model, tok, prompts[:b], args.new_tokens, b, ctx,
                                                decode_ids))
        set_tuning(model, False)
        if args.hf_batched:
            record(f"transformers generate batch {b}", b, _guarded(hf_batched, model, [prompts[:b]], args.new_tokens,
                                                                   device))
        if args.hf_cb:
            record(f"transformers generate_batch {b}", b, _guarded(hf_continuous, model, prompts[:b], args.new_tokens,
                                                                   device))
        print(f"  done batch {b}", flush=True)


def _guarded(fn, *a, **kw) -> dict:
    try:
        return fn(*a, **kw)
    except Exception as e:  # report, don't hide
        print(f"  {fn.__name__} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _merge(parts):
    bad = [p for p in parts if "error" in p]
    if bad:
        return bad[0]
    out = {k: sum(p[k] for p in parts) for k in ("tokens", "wall_s", "prefill_s", "decode_s")}
    out["ids"] = [i for p in parts for i in p["ids"]]
    return out


def judge(r: dict, base_ids: list, new_tokens: int, texts: bool = False) -> None:
    """Greedy agreement with the one-at-a-time baseline over the prompts both answered: `exact` when all are equal;
    `exact_prompts` how many; `agree_prefix` the mean share of leading tokens equal (bf16 and random weights give
    near-ties, so batched kernels may flip one: the prefix says how far answers agree before that)."""
    if "error" in r:
        return
    pairs = list(zip(r["ids"], base_ids))
    eq = [a == b for a, b in pairs]
    r.update(exact=all(eq), exact_prompts=f"{sum(eq)}/{len(eq)}")
    if not texts:  # token ids (texts, a pack's engine answers, are compared whole)
        def prefix(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n
        r["agree_prefix"] = round(sum(prefix(a, b) for a, b in pairs) / (len(pairs) * new_tokens), 3)
    r["e2e_tps"] = r["tokens"] / r["wall_s"]
    r["decode_tps"] = r["tokens"] / r["decode_s"] if r.get("decode_s") else None


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "The batching engine against one prompt at a time (`benchmarks/generation.py`)"
TEXT = "Real architectures with random weights (`pack:` rows: the real packs), cut to the layers given."
TABLE = {"rows": "runs", "columns": [["architecture", "arch"], ["layers", "layers"], ["dtype", "$.meta.dtype"],
                                     ["mode", "mode"], ["batch", "batch"], ["tokens/s with prefill", "e2e_tps"],
                                     ["decode tokens/s", "decode_tps"], ["greedy identical to one at a time", "exact"],
                                     ["greedy equal to one at a time (prompts)", "exact_prompts"],
                                     ["leading tokens equal", "agree_prefix"], ["error", "error"]]}


def save(results: dict, out: Path) -> None:
    """Written after every row: a run cut short (a GPU lease ends) keeps what it measured."""
    from flows.results import write

    gpu = results["meta"].get("gpu")
    write("generation_gpu" if gpu else "generation", results, title=TITLE, text=TEXT, table=TABLE, out=out,
          machine=describe(gpu=gpu) if gpu else describe(), config=results["meta"])


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", choices=sorted(p.stem for p in CONFIGS.glob("*.json")) + ["none"])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (0 = the real depth)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(400, 900), metavar=("MIN", "MAX"))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64], help="1 is always run")
    ap.add_argument("--seq-prompts", type=int, default=3, help="prompts for the one-at-a-time runs")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = the cores we may use)")
    ap.add_argument("--hf-cb", action="store_true", help="also time transformers' generate_batch")
    ap.add_argument("--kept", action="store_true", help="also time fixlab's servers on transformers' static cache "
                    "(+ compile on a GPU) and continuous batching (serving/hf_batching.py), at every --batches width")
    ap.add_argument("--vllm", action="store_true", help="also time vLLM's offline engine, where it is installed")
    ap.add_argument("--hf-batched", action="store_true", help="also time transformers generate on each batch as "
                    "one left-padded batch")
    ap.add_argument("--no-skinny", action="store_true", help="CPU: engine runs without skinny_matmul/sdpa_gqa")
    ap.add_argument("--pack", action="append", default=[], help="also (or, with --arch none, only) time a real "
                    "registry pack, e.g. smollm2-135m, qwen0.5b-coder-q4")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = _args(argv)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads or usable_cores())
    archs = [a for a in (args.arch or ["deepseek-coder-1.3b-instruct", "Qwen2.5-Coder-0.5B-Instruct"]) if a != "none"]
    rng = random.Random(0)
    from flows.results import stamp

    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        f"generation{'-gpu' if device.type == 'cuda' else ''}-{stamp()}.json")
    results = {"meta": {"device": str(device), "cpu_tuning": device.type == "cpu" and not args.no_skinny,
                        "dtype": str(dtype).replace("torch.", ""), "layers": args.layers,
                        "new_tokens": args.new_tokens, "prompt_len": list(args.prompt_len),
                        "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "transformers": transformers.__version__,
                        **describe(), "loadavg_start": os.getloadavg(),
                        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S")}, "runs": []}
    for arch in archs:
        os.environ.pop("TRANSFORMERS_SDPA_FORCE_GQA", None)  # the baseline runs stock transformers
        t0 = time.perf_counter()
        model, cfg = build(arch, args.layers, device, dtype)
        tok = id_tokenizer(cfg.vocab_size)
        print(f"# {arch}: {cfg.num_hidden_layers} layers, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
              f"params, built in {time.perf_counter() - t0:.1f}s", flush=True)
        nmax = max(args.batches + [args.seq_prompts])
        prompts = [[rng.randrange(100, cfg.vocab_size) for _ in range(rng.randint(*args.prompt_len))]
                   for _ in range(nmax)]
        base_ids: list = []

        def record(label, b, r, arch=arch, layers=cfg.num_hidden_layers):
            if not base_ids:
                base_ids.extend(r["ids"])
            judge(r, base_ids, args.new_tokens)
            results["runs"].append({"arch": arch, "mode": label, "batch": b, "layers": layers,
                                    **{k: v for k, v in r.items() if k != "ids"}})
            save(results, out)

        measure(model, tok, prompts, args, device, cfg.max_position_embeddings, record)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for name in args.pack:
        run_pack(name, args, results, out)
    results["meta"]["loadavg_end"] = os.getloadavg()
    _table(results)
    save(results, out)
    print(f"wrote {out}")


def _table(results) -> None:
    m = results["meta"]
    print(f"\ndevice={m['device']} dtype={m['dtype']} threads={m['threads']} new_tokens={m['new_tokens']} "
          f"prompt_len={m['prompt_len']} load avg at start {m['loadavg_start'][0]:.1f}")
    print("| arch | layers | mode | requests | decode tok/s | vs one-at-a-time | vs engine b1 | e2e tok/s "
          "| vs one-at-a-time | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base, one = {}, {}
    for r in results["runs"]:
        if "error" in r:
            print(f"| {r['arch']} | | {r['mode']} | | error: {r['error'][:80]} | | | | | |")
            continue
        if r["mode"].startswith("one at a time"):
            base[r["arch"]] = r
        if r["mode"] == "engine batch 1":
            one[r["arch"]] = r
        b, o = base[r["arch"]], one.get(r["arch"])
        dec = r.get("decode_tps")
        cells = [f"{dec:.1f}" if dec else "-", f"{dec / b['decode_tps']:.2f}x" if dec else "-",
                 f"{dec / o['decode_tps']:.2f}x" if dec and o and o.get("decode_tps") else "-"]
        exact = ("yes" if r["exact"] else "NO") + f" ({r.get('exact_prompts', '')}" + (
            f", prefix {r['agree_prefix']:.2f})" if "agree_prefix" in r else ")")
        print(f"| {r['arch']} | {r['layers']} | {r['mode']} | {r['tokens'] // m['new_tokens']} | {' | '.join(cells)} | "
              f"{r['e2e_tps']:.1f} | {r['e2e_tps'] / b['e2e_tps']:.2f}x | {exact} |")


if __name__ == "__main__":
    main()
