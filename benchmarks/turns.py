"""Two settings of the default 1.5B pack, each in a live process of its own, strictly taking turns: each turn one
decode step's forward as the engine runs it (ROWS rows over a made-up float16 cache of CONTEXT columns, the engine's cache layer) and one prefill
forward (PROMPT_ROWS prompts of PROMPT_TOKENS tokens into a fresh cache), timed inside the worker. The order flips
every turn (A B B A ...), and each turn's ratio is paired, so the machine's drift (this VM's speed moved 1.5x within
minutes while one process ran) falls on both sides alike. Use it for what one process cannot switch: an environment
variable read once (THP_MEM_ALLOC_ENABLE), or a setting of the model's build (int8_groups).

    .venv/bin/python benchmarks/turns.py --a THP_MEM_ALLOC_ENABLE=1 --b THP_MEM_ALLOC_ENABLE=0
    .venv/bin/python benchmarks/turns.py --a int8_groups=true --b int8_groups=false --turns 12

    .venv/bin/python benchmarks/turns.py --a "" --b "" --b-tree /tmp/before   # this tree against an older checkout
    .venv/bin/python benchmarks/turns.py --a "" --b "" --b-tree /tmp/before --load 2,8   # beside a load of one
        process busy 2 ms of every 10, as a job's sandbox runs and Python take bursts of a core from the engine

A side is comma-separated KEY=VALUE pairs: upper-case keys are environment variables of its process, the others model
config or EngineTuning settings (as decode_profile.py --set). The two workers never run at once.
Writes benchmarks/results/turns-<UTC time>.json and prints the medians and paired ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
# The environment as launched: importing serving (below, through startup) sets THP_MEM_ALLOC_ENABLE in this
# process, and a worker of an older tree must not inherit it. Each worker's own imports set what its tree sets.
LAUNCHED_ENV = dict(os.environ)

from startup import commit  # noqa: E402

TITLE = "Two settings taking turns (`benchmarks/turns.py`)"
TEXT = ("Two live processes of the 1.5B pack, one per setting, alternating turn by turn (A B B A): a decode forward of "
        "`rows` rows over `context` cached tokens and a prefill forward of `prompt_rows` x `prompt_tokens`, each timed "
        "in its worker; the ratio is A over B per turn, its median over the turns.")
TABLE = {"rows": ".", "columns": [["A", "a"], ["B", "b"], ["beside", "load"], ["rows x context", "decode_shape"],
                                  ["prefill rows x tokens", "prefill_shape"], ["turns", "turns"],
                                  ["decode ms A", "decode.a_ms"], ["decode ms B", "decode.b_ms"],
                                  ["decode A/B", "decode.ratio"], ["prefill ms A", "prefill.a_ms"],
                                  ["prefill ms B", "prefill.b_ms"], ["prefill A/B", "prefill.ratio"]]}

WORKER = r'''
import json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import serving  # noqa: F401  (its import-time settings, as in a job)
import torch
from transformers import DynamicCache
from serving.heap import map_large_blocks, prefill_blocks
from serving.hf import TransformersModel
from serving.kvcache import _GrowingLayer
from decode_profile import default_model
from weights import split_settings

B, C, R, P = (int(x) for x in sys.argv[2:6])
model_set, tuning = split_settings({"prefix_cache_mib": 0, **json.loads(sys.argv[6])})
m = TransformersModel(default_model(model_set), tuning=tuning)
model = m.model


def new_cache():
    cache = DynamicCache(config=model.config)
    cache.layers = [_GrowingLayer() for _ in cache.layers]
    for layer in cache.layers:
        layer.store_dtype = torch.float16  # the engine's cache on this path (EngineTuning.kv_dtype auto)
    return cache


g = torch.Generator().manual_seed(0)
cfg = model.config
KV, D = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
cache = new_cache()
for layer in cache.layers:
    layer.update(torch.randn(B, KV, C, D, generator=g), torch.randn(B, KV, C, D, generator=g))
ids = torch.randint(0, 1000, (B, 1), generator=g)
prompt = torch.randint(0, 1000, (R, P), generator=g)
map_large_blocks()  # decode's heap setting, as the engine runs
# a decode step's forward as the engine runs it: its own method where the tree has one (the compiled decoder layers,
# serving/decoder.py), else transformers' forward with the last position's logits (_forward)
step = getattr(m.engine, "_decode_forward", None) or m.engine._forward
print("ready", torch.get_num_threads(), flush=True)
turn = 0
with torch.inference_mode():
    for _ in sys.stdin:
        t0 = time.perf_counter()
        step(ids, torch.ones(B, C + turn + 1, dtype=torch.long), torch.full((B, 1), C + turn), cache)
        t1 = time.perf_counter()
        fresh = new_cache()
        with prefill_blocks():
            model(input_ids=prompt, attention_mask=torch.ones(R, P, dtype=torch.long), past_key_values=fresh,
                  use_cache=True, logits_to_keep=1)
        t2 = time.perf_counter()
        del fresh
        turn += 1
        print(json.dumps([(t1 - t0) * 1000, (t2 - t1) * 1000]), flush=True)
m.close()
'''


LOAD = r'''
import sys, time
busy, idle = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    time.sleep(idle)
'''


def load_spec(spec: str) -> tuple[float, float]:
    """--load's BUSY_MS,IDLE_MS (argparse's type: a bad value is one line before any worker starts)."""
    try:
        busy, idle = (float(x) for x in spec.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not BUSY_MS,IDLE_MS (e.g. --load 2,8)") from None
    return busy, idle


def background_load(spec: tuple[float, float] | None) -> subprocess.Popen | None:
    """A process busy BUSY ms then asleep IDLE ms, over and over, for the turns' whole length."""
    return subprocess.Popen([sys.executable, "-c", LOAD, *(str(x) for x in spec)]) if spec else None


def side(spec: str) -> tuple[dict, dict]:
    """(environment, settings) of one side's KEY=VALUE pairs."""
    import yaml

    from serving.cores import usable_cores

    # Every core for each worker: both live at once, and a model's default threads are a fair share among the live
    # fixlab processes, so the second worker would take one core of two (every turns-* file before this line was
    # such a 2-against-1 comparison; issue #52's session-40 note)
    env, sets = {**LAUNCHED_ENV, "FIXLAB_THREADS": str(usable_cores())}, {}
    for pair in filter(None, spec.split(",")):
        if "=" not in pair:
            raise SystemExit(f"turns.py: {pair!r} is not KEY=VALUE")
        k, v = pair.split("=", 1)
        if k.isupper():
            env[k] = v
        else:
            sets[k] = yaml.safe_load(v)
    return env, sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="side A: KEY=VALUE,...")
    ap.add_argument("--b", required=True, help="side B: KEY=VALUE,...")
    ap.add_argument("--b-tree", default=None, help="run side B from another checkout (e.g. a worktree of an older "
                    "commit: this tree against it)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--prompt-rows", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=896, help="896: the 1.5B pack's prefill width")
    ap.add_argument("--turns", type=int, default=10, help="timed turns a side, after one warm-up turn")
    ap.add_argument("--load", default=None, type=load_spec, metavar="BUSY_MS,IDLE_MS",
                    help="a process beside the workers, busy BUSY ms of every BUSY + IDLE, during the turns")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    from serving.machine import describe
    from flows.results import write

    workers, threads, load = [], [], None
    try:
        for spec, tree in ((args.a, REPO), (args.b, Path(args.b_tree or REPO).resolve())):  # one at a time: two
            env, sets = side(spec)                                                             # builds would starve
            w = subprocess.Popen([sys.executable, "-c", WORKER, str(tree), str(args.rows), str(args.context),
                                  str(args.prompt_rows), str(args.prompt_tokens), json.dumps(sets)],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for line in w.stdout:
                if line.startswith("ready"):
                    threads.append(int(line.split()[1]))
                    break
            else:
                raise SystemExit(f"turns.py: the worker for {spec!r} ended before it was ready (exit {w.wait()})")
            workers.append(w)
        if threads[0] != threads[1] and not any("threads" in s.lower() for s in (args.a, args.b)):
            raise SystemExit(f"turns.py: the workers run {threads[0]} and {threads[1]} threads; a comparison needs "
                             "the same (set threads=N on both sides)")
        got: list[list] = [[], []]
        load = background_load(args.load)
        for turn in range(args.turns + 1):
            for j in ((0, 1) if turn % 2 == 0 else (1, 0)):
                workers[j].stdin.write("go\n")
                workers[j].stdin.flush()
                r = json.loads(workers[j].stdout.readline())
                if turn:  # the first turn warms both up
                    got[j].append(r)
            if turn:
                print(f"turn {turn}: A {got[0][-1][0]:.0f} / {got[0][-1][1]:.0f} ms, "
                      f"B {got[1][-1][0]:.0f} / {got[1][-1][1]:.0f} ms (decode / prefill)", flush=True)
    finally:
        if load:
            load.kill()
            load.wait()
        for w in workers:
            if w.stdin and not w.stdin.closed:
                w.stdin.close()
            w.wait(timeout=120)

    def part(k: int) -> dict:
        a, b = [r[k] for r in got[0]], [r[k] for r in got[1]]
        return {"a_ms": round(statistics.median(a), 1), "b_ms": round(statistics.median(b), 1),
                "ratio": round(statistics.median(x / y for x, y in zip(a, b)), 3),
                "a_all_ms": [round(x, 1) for x in a], "b_all_ms": [round(x, 1) for x in b]}

    out = {"a": args.a, "b": args.b + (f" at {commit(Path(args.b_tree))}" if args.b_tree else ""),
           "load": "one process busy {:g} ms, asleep {:g} ms".format(*args.load) if args.load else None,
           "threads": {"a": threads[0], "b": threads[1]}, "decode_shape": f"{args.rows} x {args.context}",
           "prefill_shape": f"{args.prompt_rows} x {args.prompt_tokens}", "turns": args.turns,
           "decode": part(0), "prefill": part(1)}
    dest = write("turns", out, title=TITLE, text=TEXT, table=TABLE, out=args.out, config=vars(args),
                 machine=describe(threads=torch.get_num_threads(), load_avg_start=os.getloadavg()))
    for name in ("decode", "prefill"):
        p = out[name]
        print(f"{name}: A {p['a_ms']} ms, B {p['b_ms']} ms, A/B {p['ratio']} (median of paired turns)")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
