"""Where a row's numbers depend on its batch: each module's output for one target row, computed alone and inside
batches, by the engine's own prefill and decode steps (issue: the same job twice gives the same answers).

For every layout (batch size, the target's position, its padding, a prefix hit, a draft step) the script hooks every
module of the model, records the target row's inputs and outputs, and names as a *source* each module whose input was
bit-identical to the alone run's and whose output was not, with the largest absolute difference it made. The final
logits' largest difference and whether the greedy token changed are reported per layout.

    python -m benchmarks.invariance --pack smollm2-135m [--weights int8|dtype] [--save]

Writes benchmarks/results/invariance-<pack>-<weights>-<time>.json with --save.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch

sys.path.insert(0, ".")

PROMPTS = [
    "Fix the bug in this Python function and reply with the corrected function only.\n\n```python\n"
    "def add(a, b):\n    return a - b\n```",
    "Write a Python function that returns the square of x.",
    "Say hello.",
    "def has_close_elements(numbers, threshold):\n    for idx, elem in enumerate(numbers):\n"
    "        for idx2, elem2 in enumerate(numbers):\n            if idx != idx2:\n"
    "                distance = elem - elem2\n                if distance < threshold:\n"
    "                    return True\n    return False\n\nFix the bug above." * 2,
]


TEXT = ("One row's numbers computed alone and inside batches by the engine's own prefill and decode steps (every module "
        "hooked: a source is a module whose input was bit-identical to the alone run's and whose output was not, with "
        "the largest difference it made; modules after the first source see moved inputs, so a later source can hide), "
        "then whole answers through the engine, greedy and seeded, with drafts and the prefix store on.")
TABLE = {"rows": "rows", "columns": [["pack", "$.about.config.pack"], ["weights", "$.about.config.weights"],
                                     ["label", "$.about.config.label"], ["layout", "layout"],
                                     ["logits max |diff|", "logits_max_abs"], ["tokens equal", "tokens_equal"],
                                     ["sources (max |diff| each)", "sources"],
                                     ["same answers", "same_first"], ["same follow-ups", "same_follow_up"],
                                     ["of", "requests"], ["same (llama.cpp)", "same"]]}


class Recorder:
    """Forward hooks on every named module: the target row's (input, output) per call, in call order."""

    def __init__(self, model):
        self.calls: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = []
        self.row = 0
        self.cols: slice | None = None
        self.handles = [m.register_forward_hook(self._hook(name), with_kwargs=True)
                        for name, m in model.named_modules() if name]

    def _pick(self, t):
        if isinstance(t, (tuple, list)):
            t = t[0] if t else None
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
            return None
        r = t[self.row]
        if self.cols is not None and r.dim() >= 2:
            r = r[self.cols]
        return r.detach().float().clone()

    def _hook(self, name):
        def hook(_mod, args, kwargs, out):
            first = args[0] if args else kwargs.get("hidden_states", kwargs.get("input_ids"))
            self.calls.append((name, self._pick(first), self._pick(out)))
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def _same(a, b) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def _diff(a, b) -> float:
    if a is None or b is None or a.shape != b.shape:
        return float("nan")
    return float((a - b).abs().max())


def compare(alone: list, other: list) -> list[dict]:
    """Modules whose input matched the alone run's bit for bit and whose output did not."""
    out = []
    for (name, ia, oa), (name2, ib, ob) in zip(alone, other):
        if name != name2 or oa is None or not kind(name):  # a whole decoder layer: its parts say which
            continue
        in_same = ia is None or _same(ia, ib)
        if in_same and not _same(oa, ob):
            out.append({"module": name, "max_abs": _diff(oa, ob)})
    return out


def kind(name: str) -> str:
    """layers.3.self_attn.q_proj -> self_attn.q_proj"""
    parts = name.split(".")
    return ".".join(p for p in parts if not p.isdigit() and p not in ("model", "layers"))


def engine_runs(a, kw) -> list[dict]:
    """Whole answers through the engine (greedy and seeded sampling): alone, then all together with drafts and the
    prefix store on (a follow-up turn extends each first answer), in two arrival orders and batch limits."""
    import random
    import threading

    from agents.models.base import GenRequest
    from agents.models.config import TransformersModelConf
    from serving import EngineTuning
    from serving.hf import TransformersModel

    def reqs():
        out = []
        for i, p in enumerate(PROMPTS):
            for t, seed in ((0.0, None), (0.8, 1000 + i)):
                out.append(GenRequest(messages=[{"role": "user", "content": p}], max_new_tokens=48, temperature=t,
                                      seed=seed))
        return out

    def answers(m, rs, together: bool, order):
        out = [None] * len(rs)
        if not together:
            for i in order:
                out[i] = m.generate(rs[i]).text
            return out

        def go(i, delay):
            import time
            time.sleep(delay)
            out[i] = m.generate(rs[i]).text
        ts = [threading.Thread(target=go, args=(i, 0.05 * n)) for n, i in enumerate(order)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    rows = []
    rs = reqs()
    base = dict(name="probe", weights=a.weights, dtype=a.dtype, runtime="engine", **kw)
    tuning = EngineTuning(int8_kernel="fixlab")
    ref_m = TransformersModel(TransformersModelConf(**base, draft_tokens=0, prefix_cache_mib=0, max_batch=1),
                              tuning=tuning)
    ref = answers(ref_m, rs, False, range(len(rs)))
    follow = [GenRequest(messages=[*r.messages, {"role": "assistant", "content": ref[i]},
                                   {"role": "user", "content": "Now make it shorter."}], max_new_tokens=32,
                         temperature=r.temperature, seed=r.seed) for i, r in enumerate(rs)]
    ref_follow = answers(ref_m, follow, False, range(len(rs)))
    ref_m.close()
    order = list(range(len(rs)))
    for label, extra, shuffle in (("drafts + prefix store, batch 3", dict(max_batch=3), False),
                                  ("drafts + prefix store, batch 8, other order", dict(max_batch=8), True),
                                  ("drafts + prefix store, batch 32", dict(max_batch=32), False)):
        m = TransformersModel(TransformersModelConf(**base, **extra), tuning=tuning)
        o = order[:]
        if shuffle:
            random.Random(0).shuffle(o)
        first = answers(m, rs, True, o)
        second = answers(m, follow, True, o)
        st = m.engine.stats
        rows.append({"layout": label, "same_first": sum(x == y for x, y in zip(first, ref)),
                     "same_follow_up": sum(x == y for x, y in zip(second, ref_follow)), "requests": len(rs),
                     "reused_tokens": st["reused_tokens"], "draft_accepted": st["draft_accepted"],
                     "max_rows": st["max_rows"]})
        print(f"{label:45s} same answers {rows[-1]['same_first']}/{len(rs)}, follow-ups "
              f"{rows[-1]['same_follow_up']}/{len(rs)} (prefix tokens reused {st['reused_tokens']}, drafts kept "
              f"{st['draft_accepted']}, rows up to {st['max_rows']})")
        m.close()
    return rows


def builds(a) -> list[dict]:
    """Run the target alone in a fresh process per build, then compare every module with the native build's."""
    import os
    import subprocess
    import tempfile

    env_of = {"native": {}, "avx2": {"FIXLAB_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2"},
              "portable": {"FIXLAB_CPU_ISA": "portable", "ATEN_CPU_CAPABILITY": "default"}}
    tmp = tempfile.mkdtemp()
    dumps = {}
    for name, env in env_of.items():
        out = f"{tmp}/{name}.pt"
        cmd = [sys.executable, "-m", "benchmarks.invariance", "--pack", a.pack, "--weights", a.weights,
               "--steps", str(a.steps), "--dump", out] + (["--path", a.path] if a.path else [])
        subprocess.run(cmd, check=True, env={**os.environ, **env}, capture_output=True)
        dumps[name] = torch.load(out)
    rows = []
    ref = dumps["native"]
    for name, d in dumps.items():
        agg = defaultdict(float)
        for phase, calls in d["calls"].items():
            for src in compare(ref["calls"][phase], calls):
                agg[kind(src["module"])] = max(agg[kind(src["module"])], src["max_abs"])
        rows.append({"layout": f"build {name} against native", "sources": dict(agg) or "none",
                     "tokens_equal": d["tokens"] == ref["tokens"]})
        print(f"{rows[-1]['layout']:28s} tokens {'same' if rows[-1]['tokens_equal'] else 'DIFFER'}; sources: "
              + ", ".join(f"{k} {v:.2g}" for k, v in sorted(agg.items(), key=lambda kv: -kv[1])))
    return rows


def llamacpp_runs(a) -> list[dict]:
    """The same requests through llama.cpp on the pack's GGUF: one at a time, then all at once over its slots in two
    orders (does llama.cpp repeat across slots?)."""
    import random
    import threading

    from agents.models.base import GenRequest
    from agents.models.config import LlamaCppModelConf
    from serving.llamacpp import LlamaCppModel

    rs = []
    for i, p in enumerate(PROMPTS * 2):
        rs.append(GenRequest(messages=[{"role": "user", "content": p}], max_new_tokens=64,
                             temperature=0.0 if i < len(PROMPTS) else 0.8, seed=None if i < len(PROMPTS) else 7 + i))
    m = LlamaCppModel(LlamaCppModelConf(name="probe-llamacpp", pack=a.pack, slots=8, context_per_slot=2048))
    rows = []
    try:
        alone = [m.generate(r).text for r in rs]
        again = [m.generate(r).text for r in rs]
        rows.append({"layout": "one at a time, again", "same": sum(x == y for x, y in zip(alone, again)),
                     "requests": len(rs)})
        for trial in range(2):
            order = list(range(len(rs)))
            random.Random(trial).shuffle(order)
            out = [None] * len(rs)

            def go(i):
                out[i] = m.generate(rs[i]).text
            ts = [threading.Thread(target=go, args=(i,)) for i in order]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            rows.append({"layout": f"all at once over 8 slots, order {trial}",
                         "same": sum(x == y for x, y in zip(alone, out)), "requests": len(rs)})
    finally:
        m.close()
    for r in rows:
        print(f"llama.cpp {r['layout']:40s} same answers {r['same']}/{r['requests']}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", default="smollm2-135m")
    ap.add_argument("--path", default=None, help="a local model folder instead of a pack")
    ap.add_argument("--weights", default="int8", choices=["int8", "dtype"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=8, help="decode steps compared after the prefill")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--llamacpp", action="store_true", help="only: does llama.cpp repeat across its slots?")
    ap.add_argument("--dump", default=None, help="only: save the target's numbers alone to this file")
    ap.add_argument("--builds", action="store_true",
                    help="only: the target alone under each build (AVX-512, AVX2, portable kernels, with torch's own "
                         "kernels held to the same instruction set), every module compared with the native build")
    ap.add_argument("--label", default="", help="a word for the file name (before, after)")
    a = ap.parse_args()

    from agents.models.config import TransformersModelConf
    from serving import EngineTuning
    from serving.engine import _Row
    from serving.hf import TransformersModel
    from agents.models.base import GenRequest

    only = {"builds": (builds, "builds", "The same answers on every x86 build?",
                       "The target request alone (prefill and decode steps) under fixlab's AVX-512, AVX2 and portable "
                       "kernels (FIXLAB_CPU_ISA) with torch's kernels held to the same instruction set "
                       "(ATEN_CPU_CAPABILITY), each module's output against the native build's."),
            "llamacpp": (llamacpp_runs, "llamacpp", "Does llama.cpp repeat its answers across slots?",
                         "The same requests through llama.cpp (xllamacpp, 8 slots) one at a time, again, and all at "
                         "once in two orders; greedy and seeded sampling.")}
    for flag, (measure, note, title, text) in only.items():
        if getattr(a, flag):
            rows = measure(a)
            if a.save:
                from flows.results import write

                print(write("invariance", {"rows": rows}, note=f"{a.pack}-{a.weights}-{note}" if flag == "builds"
                            else f"{a.pack}-{note}", config=vars(a), table=TABLE, title=title, text=text))
            return
    kw = {"path": a.path} if a.path else {"pack": a.pack}
    m = TransformersModel(TransformersModelConf(name="probe", weights=a.weights, dtype=a.dtype, runtime="engine",
                                                prefix_cache_mib=0, draft_tokens=0, **kw),
                          tuning=EngineTuning(int8_kernel="fixlab"))
    eng = m.engine
    ids = [m.prompt_ids(GenRequest(messages=[{"role": "user", "content": p}])) for p in PROMPTS]
    target = ids[0]

    def rows_for(order):
        return [_Row(GenRequest(messages=[]), list(ids[i]), 64, None, 0.0, None) for i in order]

    rec = Recorder(m.model)
    results = []

    def run(label: str, order: list[int], at: int, decode_from_batch: bool = True) -> dict:
        """Prefill the rows `order` (target = ids[0] at batch position `at`) as one group, then decode --steps
        greedy steps of the whole batch, recording the target row."""
        rows = rows_for(order)
        rec.calls.clear()
        rec.row = at
        T = max(len(r.prompt_ids) for r in rows)
        rec.cols = slice(T - len(target), T)
        with torch.inference_mode():
            cache, mask, pos, logits = eng._prefill(rows)
            toks = [int(logits[at].argmax())]
            pre_logits = logits[at].clone()
            calls = {"prefill": list(rec.calls)}
            rec.cols = None
            last = logits.argmax(-1)
            step_logits = []
            for s in range(a.steps):
                rec.calls.clear()
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                lg = eng._forward(last[:, None], mask, pos[:, None], cache)
                pos = pos + 1
                last = lg.argmax(-1)
                step_logits.append(lg[at].clone())
                toks.append(int(last[at]))
                calls[f"decode{s}"] = list(rec.calls)
        return {"label": label, "calls": calls, "tokens": toks, "pre_logits": pre_logits, "step_logits": step_logits}

    alone = run("alone", [0], 0)
    if a.dump:  # this build's numbers for the target alone, to hold against another build's (--builds)
        torch.save({"calls": alone["calls"], "tokens": alone["tokens"]}, a.dump)
        rec.close()
        m.close()
        return
    layouts = [("batch 2, target first", [0, 2], 0), ("batch 2, target second", [2, 0], 1),
               ("batch 3, longest beside it", [3, 0, 1], 1), ("batch 4", [1, 2, 3, 0], 3),
               ("batch 8", [1, 2, 3, 0, 1, 2, 3, 2], 3), ("batch 16", [1, 2, 3, 2] * 3 + [0, 1, 2, 3], 12),
               ("batch 32", [1, 2, 3, 2] * 7 + [0, 1, 2, 3], 28)]
    for label, order, at in layouts:
        r = run(label, order, at)
        phases = {}
        for phase, calls in r["calls"].items():
            srcs = compare(alone["calls"][phase], calls)
            by = defaultdict(float)
            for s in srcs:
                by[kind(s["module"])] = max(by[kind(s["module"])], s["max_abs"])
            phases[phase] = dict(by)
        agg = defaultdict(float)
        for p in phases.values():
            for k, v in p.items():
                agg[k] = max(agg[k], v)
        logit_diff = max([_diff(alone["pre_logits"], r["pre_logits"])] +
                         [_diff(x, y) for x, y in zip(alone["step_logits"], r["step_logits"])])
        if a.verbose:
            for ph, d in phases.items():
                print("   ", ph, {k: f"{v:.2g}" for k, v in d.items()})
        row = {"layout": label, "batch": len(order), "position": at, "sources": dict(agg) or "none",
               "logits_max_abs": logit_diff, "tokens_equal": r["tokens"] == alone["tokens"]}
        results.append(row)
        print(f"{label:28s} logits max|d| {logit_diff:.3g} tokens {'same' if row['tokens_equal'] else 'DIFFER'}; "
              f"sources: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:8]))
    rec.close()
    m.close()
    engine_rows = engine_runs(a, kw)
    results_engine = engine_rows
    if a.save:
        from flows.results import write

        print(write("invariance", {"rows": results + results_engine}, note=f"{a.pack}-{a.weights}-{a.label}"
                    if a.label else f"{a.pack}-{a.weights}", config=vars(a), table=TABLE,
                    title="Where one row's numbers depend on its batch", text=TEXT))


if __name__ == "__main__":
    main()
