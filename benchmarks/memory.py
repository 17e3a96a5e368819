"""Peak resident memory of the default job and where it goes (issue #25).

Each part runs in a child process of its own, under `/usr/bin/time -v` (its "Maximum resident set size") and a
sampler: the child samples itself every 0.2 s (VmRSS split into anonymous memory and mapped file pages, the
pages of the model folder's files that are mapped in, and, in the job, the engine's KV buffers and prefix store);
the parent samples the child's whole process tree with psutil (sandbox workers, Prefect's server).

    convert   registry pack -> float32 transformers folder (first use of a pack), into a temporary folder
    load      TransformersModel of conf/model/<model>.yaml (int8 quantization on CPU), then one short answer
    job       the default job, short: python -m flows.evaluate dataset.limit=32 iters=0 (32 tasks in flight) with
              a fresh MLflow store and no trajectory cache, so every answer is computed

    nice -n 19 .venv/bin/python benchmarks/memory.py                      # load + job
    nice -n 19 .venv/bin/python benchmarks/memory.py --parts convert load job
    nice -n 19 .venv/bin/python benchmarks/memory.py --parts job --job-args dataset.limit=32 iters=1
    .venv/bin/python benchmarks/memory.py --parts job --job-args iters=3 --keep /tmp/full   # make eval's job, store kept

Writes benchmarks/results/memory-<UTC time>.json (the machine named) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GiB = 2 ** 30
DEFAULT_JOB = ["dataset.limit=32", "iters=0"]


# ---- measuring a process -----------------------------------------------------------------------------------------
def status(pid: str | int = "self") -> dict:
    """VmRSS and its parts (anonymous memory, mapped file pages), VmHWM (the kernel's peak), in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


# What its results file says of itself (flows/results.py): the title, how to read it, the table the report draws.
TITLE = "Peak resident memory (`benchmarks/memory.py`)"
TEXT = ("Each part in a child process of its own: `/usr/bin/time -v`'s maximum resident set of the process, and the "
        "whole process tree's peak (sandbox workers, Prefect's server) sampled with psutil.")
TABLE = {"rows": "parts.*", "keys": ["part"], "columns": [["label", "$.label"],
                                                          ["peak RSS GiB (time -v)", "time_v_max_rss_gib"],
                                                          ["process tree GiB", "tree_peak.tree"], ["seconds", "seconds"],
                                                          ["passed", "answers.*.passed"]]}


def mapped_rss(under: str, pid: str | int = "self") -> int:
    """Bytes of the files under folder `under` that are mapped into the process and resident (smaps Rss)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                parts = line.split(None, 5)
                inside = len(parts) == 6 and parts[5].strip().startswith(under)
            elif inside and first == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


class Sampler(threading.Thread):
    """Calls probe() every `every` seconds; keeps the sample with the largest "rss" and each field's maximum."""

    def __init__(self, probe, every: float = 0.2):
        super().__init__(daemon=True, name="memory-sampler")
        self.probe, self.every = probe, every
        self.peak: dict = {}
        self.maxima: dict = {}
        self.series: list[dict] = []  # one sample every `keep_every` seconds, in MiB (the shape of the run)
        self.keep_every, self._kept = 5.0, -1e9
        self.t0 = time.monotonic()
        self.phase = "start"
        self._halt = threading.Event()

    def sample(self) -> dict:
        try:
            s = self.probe()
        except Exception as e:  # a probe racing the worker thread (a buffer swapped mid-read): skip one sample
            return {"error": repr(e)}
        s["phase"] = self.phase
        s["t"] = round(time.monotonic() - self.t0, 1)
        if s["t"] - self._kept >= self.keep_every:
            self._kept = s["t"]
            self.series.append({k: (round(v / 2**20) if k not in ("t", "rows") else v) for k, v in s.items()
                                if isinstance(v, (int, float))})
        if s.get("rss", 0) > self.peak.get("rss", -1):
            self.peak = s
        for k, v in s.items():
            if isinstance(v, (int, float)):
                self.maxima[k] = max(self.maxima.get(k, v), v)
        return s

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()


_MALLINFO = None


def malloc_info() -> dict:
    """glibc's allocator, all arenas (mallinfo2): bytes handed out from its heaps, bytes free but kept in them
    (fragmentation: resident, reusable only by this process), bytes in chunks of their own (mmap: large tensors)."""
    global _MALLINFO
    import ctypes

    if _MALLINFO is None:
        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                        "fsmblks", "uordblks", "fordblks", "keepcost")]
        try:
            fn = ctypes.CDLL("libc.so.6").mallinfo2
            fn.restype = MallInfo2
            _MALLINFO = fn
        except (OSError, AttributeError):
            _MALLINFO = False
    if not _MALLINFO:
        return {}
    m = _MALLINFO()
    return {"malloc_heap_used": m.uordblks, "malloc_heap_free": m.fordblks, "malloc_mmapped": m.hblkhd}


def gib(d: dict) -> dict:
    return {k: (round(v / GiB, 3) if isinstance(v, (int, float)) and k not in ("rows", "t") else v)
            for k, v in d.items()}


# ---- the parts, each in its own child process ------------------------------------------------------------------
def model_cfg(name: str):
    """conf/model/<name>.yaml over its schema (a transformers model's record)."""
    from omegaconf import OmegaConf

    from agents.models.config import TransformersModelConf
    from flows.schema import typed

    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml"), resolve=True)
    cfg.pop("defaults", None)
    return typed(TransformersModelConf, cfg, "model", f"conf/model/{name}.yaml")


def tensor_split(model) -> dict:
    """Bytes of the model's tensors by kind: int8 weights (+ their scales), fp32 embedding, lm_head, the rest."""
    from serving.int8 import Int8Linear

    split = {"int8_linears": 0, "embedding": 0, "lm_head": 0, "other_tensors": 0}
    seen = set()
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    for mod in model.modules():
        for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
            if t.data_ptr() in seen or t.device.type == "meta":
                continue
            seen.add(t.data_ptr())
            n = t.numel() * t.element_size()
            key = ("int8_linears" if isinstance(mod, Int8Linear) else "embedding" if mod is emb
                   else "lm_head" if mod is head else "other_tensors")
            split[key] += n
    return split


def child_convert(pack_name: str, out: str) -> dict:
    from serving import packs

    pack = packs.get_pack(pack_name)
    gguf = packs.ensure_gguf(pack_name)  # joined and checked (cached): conversion is what is measured
    sampler = Sampler(lambda: {"rss": status()["VmRSS"], **status()})
    sampler.start()
    t0 = time.perf_counter()
    packs.convert(pack, gguf.parent, Path(out))
    seconds = time.perf_counter() - t0
    sampler.stop()
    return {"seconds": round(seconds, 1), "peak": gib(sampler.peak),
            "folder_gib": round(sum(f.stat().st_size for f in Path(out).iterdir()) / GiB, 3)}


def child_load(model_name: str) -> dict:
    import torch

    from agents.models.base import GenRequest
    from serving.hf import TransformersModel
    from serving.packs import cache_root

    cfg = model_cfg(model_name)
    folder = str(cache_root())

    def probe():
        s = status()
        return {"rss": s["VmRSS"], "anon": s["RssAnon"], "file": s["RssFile"], "model_files": mapped_rss(folder),
                **malloc_info()}

    before = probe()
    sampler = Sampler(probe)
    sampler.start()
    t0 = time.perf_counter()
    m = TransformersModel(cfg)
    load_s = time.perf_counter() - t0
    sampler.phase = "loaded"
    loaded = probe()
    g = m.generate(GenRequest(messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}],
                              max_new_tokens=16))
    answered = probe()
    sampler.stop()
    out = {"load_seconds": round(load_s, 1), "weights": m.weights, "dtype": str(m.dtype).replace("torch.", ""),
           "after_imports": gib(before), "peak_during_load": gib(sampler.peak), "loaded": gib(loaded),
           "after_one_answer": gib(answered), "tensors": gib(tensor_split(m.model)),
           "answer_tokens": g.completion_tokens, "torch_threads": torch.get_num_threads()}
    m.close()
    return out


def engine_memory(engine) -> dict:
    """KV bytes of the running batch (buffers allocated, columns in use) and the prefix store, read from another
    thread while the worker runs (a benchmark probe: a sample may see a buffer being replaced)."""
    alloc = used = 0
    cache = engine._cache
    for layer in (cache.layers if cache is not None else []):
        for buf in (getattr(layer, "_kbuf", None), getattr(layer, "_vbuf", None)):
            if buf is not None:
                alloc += buf.numel() * buf.element_size()
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and hasattr(t, "numel"):
                used += t.numel() * t.element_size()
    prefix = engine.prefixes.bytes if engine.prefixes is not None else 0
    return {"kv_buffers": alloc, "kv_in_use": used, "prefix_store": prefix, "rows": len(engine._rows)}


def child_job(args: list[str]) -> dict:
    import runpy

    from serving.packs import cache_root

    folder = str(cache_root())
    import flows.workers as workers

    def engines():
        for held in list(workers._held.values()):
            for part in (held if isinstance(held, tuple) else ()):
                if getattr(part, "engine", None) is not None:
                    yield part.engine

    seen: dict = {}

    def probe():
        s = status()
        out = {"rss": s["VmRSS"], "anon": s["RssAnon"], "file": s["RssFile"], "model_files": mapped_rss(folder),
               **malloc_info()}
        for e in engines():
            seen["engine"] = e  # kept: the job closes and forgets its model before it returns
            out.update(engine_memory(e))
        return out

    sampler = Sampler(probe, every=0.5)
    sampler.start()
    sys.argv = ["flows.evaluate", *args]
    t0 = time.perf_counter()
    rc = 0
    try:
        runpy.run_module("flows.evaluate", run_name="__main__")
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    sampler.stop()
    e = seen.get("engine")
    eng = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in e.stats.items()} if e is not None else {}
    return {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "peak": gib(sampler.peak),
            "maxima": gib(sampler.maxima), "engine_stats": eng, "series_mib": sampler.series,
            "model_ready_s": model_ready(sampler.series)}


def model_ready(series: list[dict]) -> float | None:
    """Seconds until the job held its model (the first sample with an engine): the model's load and, on a machine's
    first use, the path check (serving/paths.py) with it."""
    return next((x["t"] for x in series if "rows" in x), None)


def child(argv: list[str]) -> None:
    part, rest = argv[0], argv[1:]
    if part == "convert":
        res = child_convert(rest[0], rest[1])
    elif part == "load":
        res = child_load(rest[0])
    else:
        res = child_job(rest)
    res["ru_maxrss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB, 3)
    with open(os.environ["FIXLAB_MEMORY_OUT"], "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    os._exit(0)  # threads of the job (Prefect, MLflow) would hold a normal exit


# ---- the parent ------------------------------------------------------------------------------------------------
def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS of the process, RSS of its descendants summed)."""
    import psutil

    try:
        p = psutil.Process(pid)
        own = p.memory_info().rss
        kids = 0
        for c in p.children(recursive=True):
            try:
                kids += c.memory_info().rss
            except psutil.Error:
                pass
        return own, kids
    except psutil.Error:
        return 0, 0


def run_part(name: str, argv: list[str], env: dict, log: Path) -> dict:
    out = Path(tempfile.mkstemp(prefix=f"memory-{name}-", suffix=".json")[1])
    env = dict(env, FIXLAB_MEMORY_OUT=str(out))
    timer = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    cmd = timer + [sys.executable, str(Path(__file__).resolve()), "_child", name, *argv]
    peak = {"tree": 0, "main": 0, "children": 0}
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            # under /usr/bin/time the Python child is time's child
            pids = [c.pid for c in __import__("psutil").Process(proc.pid).children()] if timer else [proc.pid]
            for pid in pids:
                own, kids = tree_rss(pid)
                if own + kids > peak["tree"]:
                    peak = {"tree": own + kids, "main": own, "children": kids}
            time.sleep(0.25)
    text = log.read_text(errors="replace")
    res = json.loads(out.read_text()) if out.stat().st_size else {"error": text[-2000:]}
    if res.get("rc"):
        res["error"] = text[-2000:]
    out.unlink()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    res["time_v_max_rss_gib"] = round(int(m.group(1)) * 1024 / GiB, 3) if m else None
    res["tree_peak"] = gib(peak)
    res["exit_status"] = proc.returncode
    return res


def job_answers(artifacts: Path) -> dict:
    """Per task: passed, and a digest of every attempt's code (before/after runs compare answers, not just counts)."""
    import hashlib

    out = {}
    for f in artifacts.rglob("results.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            code = "\n#--\n".join(a.get("code") or "" for a in r.get("attempts", []))
            out[r["task_id"]] = {"passed": r["passed"], "code_sha": hashlib.sha256(code.encode()).hexdigest()[:16],
                                 "prompt_tokens": r.get("prompt_tokens"), "completion_tokens": r.get("completion_tokens")}
    return dict(sorted(out.items()))


def job_model_config(outputs: Path) -> dict | None:
    """The model group as the job resolved it (Hydra's .hydra/config.yaml), so a file says what it ran with."""
    import yaml

    f = outputs / ".hydra" / "config.yaml"
    return (yaml.safe_load(f.read_text()) or {}).get("model") if f.exists() else None


def machine() -> dict:
    from serving.machine import describe

    with open("/proc/meminfo") as f:
        info = describe(mem_total_gib=round(int(f.readline().split()[1]) * 1024 / GiB, 1))
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["load", "job"], choices=["convert", "load", "job"])
    ap.add_argument("--model", default="qwen1.5b-coder-q4", help="conf/model/<name>.yaml (load part)")
    ap.add_argument("--pack", default="qwen1.5b-coder-q4", help="pack converted by the convert part")
    ap.add_argument("--job-args", nargs="*", default=DEFAULT_JOB, help="overrides of the job part")
    ap.add_argument("--label", default="", help="a word for the results file (e.g. before / after)")
    ap.add_argument("--keep", default=None, help="a folder for the job's MLflow store and logs, kept afterwards "
                    "(its results file beside it); default: a temporary folder, removed")
    args = ap.parse_args()

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="fixlab-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DO_NOT_TRACK="true",
               MLFLOW_DISABLE_TELEMETRY="true", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PREFECT_API_URL", None)
    result = {"machine": machine(), "label": args.label, "utc": stamp, "parts": {}}
    try:
        result["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True).stdout.strip()
    except OSError:
        pass
    try:
        for part in args.parts:
            if part == "convert":
                argv = [args.pack, str(work / "converted")]
            elif part == "load":
                argv = [args.model]
            else:
                argv = [*args.job_args, f"tracking.uri=sqlite:///{work}/mlflow.db",
                        f"tracking.artifacts={work}/artifacts", f"hydra.run.dir={work}/outputs", "cache=false"]
                result["job_args"] = argv
            print(f"memory: {part} ...", file=sys.stderr, flush=True)
            res = run_part(part, argv, dict(env, PREFECT_HOME=str(work / "prefect")), work / f"{part}.log")
            if part == "job":
                res["answers"] = job_answers(work / "artifacts")
                res["model_config"] = job_model_config(work / "outputs")
            result["parts"][part] = res
            print(f"memory: {part}: max RSS {res.get('time_v_max_rss_gib')} GiB (time -v), process tree "
                  f"{res['tree_peak']['tree']} GiB", file=sys.stderr, flush=True)
            if "error" in res:
                print(res["error"], file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if "job" in result["parts"]:
        result["peak_rss_gib"] = result["parts"]["job"]["time_v_max_rss_gib"]
    from flows.results import write

    job = [a for a in result.get("job_args", []) if not a.startswith(("tracking.", "hydra.", "cache="))]
    model = (result["parts"].get("job") or {}).get("model_config") or {}
    out = write("memory", {k: v for k, v in result.items() if k != "machine"}, title=TITLE, text=TEXT, table=TABLE,
                note=args.label, machine=result["machine"],
                config={**{f"model.{k}": v for k, v in model.items()}, **dict(a.split("=", 1) for a in job if "=" in a)})
    print(json.dumps({p: {"max_rss_gib": r.get("time_v_max_rss_gib"), "tree_gib": r["tree_peak"]["tree"]}
                      for p, r in result["parts"].items()}))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
