"""transformers' own batched serving, behind the engine's surface (`generate(request, ids) -> Generation`, `activity`,
`close`): what serves a local model on a GPU, where fixlab's engine lost to both (benchmarks/gpu_check.sh). runtime.py
measures the two here against each other (`runtime: auto` on cuda) and keeps the faster.

- `ContinuousServer`: continuous batching (`model.init_continuous_batching`: paged KV, requests join and leave a
  running batch; CUDA graphs on a GPU). Stop strings end a request as its tokens stream in.
- `StaticServer`: concurrent requests gathered into left-padded batches through `generate` with a static KV cache,
  which transformers compiles (torch.compile) on a GPU. Batch sizes round up to a power of two and the cache is sized
  for the model's context, so a job compiles a few shapes, once each.

Neither promises the same bits at every batch size (the path line says so); per-request seeds are not honoured
(one sampling stream per server), which is why fixlab's engine stays the CPU path.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from agents.models.base import Generation, GenRequest, RequestError, answer_budget, cut_at_stop
from .batching import gather

log = logging.getLogger(__name__)
KEPT_RUNTIMES = ("continuous", "static")
POLL_S = 0.1  # how often the result router looks for a dead generation thread
CPU_CONTEXT = 4096  # tokens a row's paged KV is sized for on a CPU (prompt and answer of a HumanEvalFix round)


def finish(tokenizer, tokens: list[int], eos_ids: set[int], stops) -> tuple[str, str]:
    """(text, finish reason) of an answer's generated tokens: an eos ends it, then the first stop string cuts it. The
    one rule of every path through transformers' generation (hf.py's reference path, both servers here)."""
    reason = "length"
    if tokens and tokens[-1] in eos_ids:
        reason, tokens = "stop", tokens[:-1]
    text, hit = cut_at_stop(tokenizer.decode(tokens, skip_special_tokens=True), stops)
    return text, ("stop" if hit else reason)


class ContinuousServer:
    """Requests from many threads through one continuous-batching manager per sampling mode (greedy, or sampled
    with a per-request temperature)."""

    def __init__(self, model, tokenizer, *, eos_ids: set[int], pad_id: int, max_context: int, max_batch: int):
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids, self.pad_id, self.max_context, self.max_batch = set(eos_ids), pad_id, max_context, max_batch
        self._managers: dict[bool, object] = {}
        self._waiting: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._routers: list[threading.Thread] = []
        self.stats = {"requests": 0, "tokens": 0, "prompt_tokens": 0}

    def _manager(self, sample: bool):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        with self._lock:
            if self._closed:
                raise RequestError("the model was closed")
            if sample in self._managers:
                return self._managers[sample]
            # temperature 0.5 only makes transformers build the per-request temperature processor; each request
            # sets its own. top_k/top_p off: the checkpoint's defaults would make it differ from the engine's sampling
            gc = GenerationConfig(do_sample=sample, temperature=0.5 if sample else None, top_k=None, top_p=None,
                                  eos_token_id=sorted(self.eos_ids) or -1, pad_token_id=self.pad_id, max_new_tokens=256)
            cb = ContinuousBatchingConfig(max_requests_per_batch=self.max_batch, per_request_processors=sample)
            if self.model.device.type == "cpu":
                # transformers sizes the paged cache at 60% of the host's memory there (seconds to allocate, and a
                # second manager would double it): rows x context, in pages of 256 tokens, is what the batch can use
                cb.num_blocks = -(-self.max_batch * min(self.max_context, CPU_CONTEXT) // 256)
            mgr = self.model.init_continuous_batching(generation_config=gc, continuous_batching_config=cb)
            mgr.start()
            self._managers[sample] = mgr
            router = threading.Thread(target=self._route, args=(mgr,), name=f"cb-router-{int(sample)}", daemon=True)
            router.start()
            self._routers.append(router)
            return mgr

    def _route(self, mgr) -> None:
        """Hands each output to the thread waiting on its request; fails them all when the manager dies."""
        while True:
            out = mgr.get_result(timeout=POLL_S)
            if out is not None:
                with self._lock:
                    box = self._waiting.get(out.request_id)
                if box is not None:
                    box.put(out)
                continue
            if self._closed or not mgr.is_running():
                with self._lock:
                    boxes = list(self._waiting.values())
                for box in boxes:
                    box.put(None)
                if self._closed or not mgr.is_running():
                    return

    def generate(self, request: GenRequest, ids: list[int]) -> Generation:
        n = len(ids)
        max_new = answer_budget(request, n, self.max_context)
        sample = bool(request.temperature and request.temperature > 0)
        mgr = self._manager(sample)
        box: queue.Queue = queue.Queue()
        t0 = time.perf_counter()
        kw = {"temperature": float(request.temperature)} if sample else {}
        with self._lock:
            rid = f"fixlab-{self.stats['requests']}"
            self.stats["requests"] += 1
            self._waiting[rid] = box
        try:
            stops = tuple(request.stop)
            # a stop string spans at most this many of the newest tokens (every token decodes to at least one character
            # but for a few bytes of a split character): the check decodes that tail, not the whole answer, each token
            tail = max((len(s) for s in stops), default=0) + 4
            if mgr.add_request(ids, request_id=rid, max_new_tokens=max_new, streaming=bool(stops),
                               eos_token_id=sorted(self.eos_ids) or -1, **kw) is None:
                raise RequestError("transformers' continuous batching refused the request (it is stopping)")
            tokens: list[int] = []
            while True:
                out = box.get()
                if out is None:
                    raise RequestError("transformers' continuous batching stopped before answering")
                if out.error:
                    raise RequestError(f"continuous batching failed this request: {str(out.error)[:200]}")
                tokens = list(out.generated_tokens)
                if out.is_finished():
                    break
                if stops and any(s in self.tokenizer.decode(tokens[-tail:], skip_special_tokens=True) for s in stops):
                    # a stop string: the rest would be cut anyway (the whole answer is cut exactly below; a stop this
                    # check missed only costs the tokens decoded past it)
                    mgr.cancel_request(rid)
                    break
        finally:
            with self._lock:
                self._waiting.pop(rid, None)
        text, why = finish(self.tokenizer, tokens, self.eos_ids, stops)
        with self._lock:
            self.stats["tokens"] += len(tokens)
            self.stats["prompt_tokens"] += n
        return Generation(text=text, prompt_tokens=n, completion_tokens=len(tokens), seconds=time.perf_counter() - t0,
                          finish_reason=why)

    def activity(self) -> dict:
        with self._lock:
            return {"rows": len(self._waiting), "waiting": 0, "tokens": self.stats["tokens"],
                    "prefilled": self.stats["prompt_tokens"]}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            managers = list(self._managers.values())
        for mgr in managers:
            try:
                mgr.stop(block=True, timeout=30)
            except Exception as e:  # noqa: BLE001 - closing: what failed is logged, the rest still closes
                log.warning("continuous batching did not stop cleanly: %s", e)
        for r in self._routers:
            r.join(timeout=5)


@dataclass
class _Pending:
    request: GenRequest
    ids: list[int]
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


class StaticServer:
    """Concurrent requests in left-padded batches through `generate` with a static KV cache (compiled on a GPU)."""

    def __init__(self, model, tokenizer, *, eos_ids: set[int], pad_id: int, max_context: int, max_batch: int,
                 gather_ms: float):
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids, self.pad_id, self.max_context, self.max_batch = set(eos_ids), pad_id, max_context, max_batch
        self.gather_s = gather_ms / 1000.0
        self._queue: list[_Pending] = []
        self._cv = threading.Condition()
        self._closed = False
        self._rows = 0
        self.stats = {"batches": 0, "tokens": 0, "prompt_tokens": 0}
        self._thread = threading.Thread(target=self._run, name="static-server", daemon=True)
        self._thread.start()

    def generate(self, request: GenRequest, ids: list[int]) -> Generation:
        answer_budget(request, len(ids), self.max_context)  # one line now for a prompt the context cannot answer
        p = _Pending(request, list(ids))
        with self._cv:
            if self._closed:
                raise RequestError("the model was closed")
            self._queue.append(p)
            self._cv.notify_all()
        p.done.wait()
        if p.error is not None:
            raise p.error
        return p.result

    @staticmethod
    def _group_key(r: GenRequest):
        """Rows that may share one generate call: the same sampling and the same stop strings (a row stops on its
        own stops only, and transformers' stop criterion is per call)."""
        sample = bool(r.temperature and r.temperature > 0)
        return (round(float(r.temperature), 6) if sample else 0.0, tuple(r.stop))

    def _take(self) -> list[_Pending] | None:
        with self._cv:
            if not gather(self._cv, self._queue, self.max_batch, self.gather_s, lambda: self._closed):
                return None
            key = self._group_key(self._queue[0].request)
            group = [p for p in self._queue if self._group_key(p.request) == key][: self.max_batch]
            for p in group:
                self._queue.remove(p)
            self._rows = len(group)
            return group

    def _run(self) -> None:
        import torch

        while True:
            group = self._take()
            if group is None:
                return
            try:
                with torch.inference_mode():
                    self._batch(group)
            except BaseException as e:  # noqa: BLE001 - one failed batch fails its rows, not the server
                err = e if isinstance(e, RequestError) else RequestError(f"{type(e).__name__}: {str(e)[:200]}")
                for p in group:
                    if not p.done.is_set():
                        p.error = err
                        p.done.set()
            finally:
                self._rows = 0

    def _batch(self, group: list[_Pending]) -> None:
        import torch
        from transformers import CompileConfig, GenerationConfig

        t0 = time.perf_counter()
        width = 1
        while width < len(group):
            width *= 2
        width = min(width, max(self.max_batch, len(group)))
        rows = [p.ids for p in group] + [group[0].ids] * (width - len(group))  # padding rows: copies, then dropped
        longest = max(len(r) for r in rows)
        max_new = max(1, min(max(int(p.request.max_new_tokens) for p in group), self.max_context - longest))
        inp = torch.full((width, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((width, longest), dtype=torch.long)
        for i, r in enumerate(rows):
            inp[i, longest - len(r):] = torch.tensor(r)
            mask[i, longest - len(r):] = 1
        first = group[0].request
        dev = self.model.device
        sample = bool(first.temperature and first.temperature > 0)
        # the cache is sized for the whole context, so every call at this width has the same shapes: one compile
        gc = GenerationConfig(max_new_tokens=max_new, do_sample=sample, temperature=first.temperature or 1.0,
                              top_k=None, top_p=None, eos_token_id=sorted(self.eos_ids) or None,
                              pad_token_id=self.pad_id, cache_implementation="static", max_cache_len=self.max_context,
                              compile_config=CompileConfig() if dev.type == "cuda" else None,
                              stop_strings=list(first.stop) or None)
        if sample and first.seed is not None:
            torch.manual_seed(first.seed)  # one stream for the batch: rows are not seeded one by one
        out = self.model.generate(input_ids=inp.to(dev), attention_mask=mask.to(dev), generation_config=gc,
                                  tokenizer=self.tokenizer if first.stop else None)
        seconds = time.perf_counter() - t0
        self.stats["batches"] += 1
        for i, p in enumerate(group):
            new = out[i, longest:].tolist()
            if any(t in self.eos_ids for t in new):  # a finished row is padded after its eos
                new = new[: next(j for j, t in enumerate(new) if t in self.eos_ids) + 1]
            new = new[: max(1, min(int(p.request.max_new_tokens), self.max_context - len(p.ids)))]
            text, why = finish(self.tokenizer, new, self.eos_ids, p.request.stop)
            self.stats["tokens"] += len(new)
            self.stats["prompt_tokens"] += len(p.ids)
            p.result = Generation(text=text, prompt_tokens=len(p.ids), completion_tokens=len(new), seconds=seconds,
                                  finish_reason=why)
            p.done.set()

    def activity(self) -> dict:
        return {"rows": self._rows, "waiting": len(self._queue), "tokens": self.stats["tokens"],
                "prefilled": self.stats["prompt_tokens"]}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
