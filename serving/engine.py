"""Batching engine: many threads call `generate` one request each; one worker thread runs them through the
model together.

Why: decoding one sequence is memory-bound (every token re-reads all weights), so decoding 16 rows per step
costs little more than 1. Agents stay simple (one task per thread, blocking call) and the engine does the
batching underneath.

How (continuous batching over a left-padded KV cache):
- requests wait in a queue; an idle engine waits up to `gather_ms` for more before starting, up to `max_batch`;
- new requests are prefilled (left padding, attention mask, position ids from the mask; prefills are split to
  at most `max_prefill_tokens` padded tokens per forward) and their KV caches merged into the running batch;
- each step feeds one token per row through the cached model (`logits_to_keep=1`);
- sampling is per row: greedy, or temperature with the row's own seeded torch.Generator, so a request's output
  does not depend on what it was batched with;
- rows that hit EOS, a stop string or their max_new_tokens leave the batch at once (cache rows dropped,
  all-padding columns trimmed) and waiting requests fill the freed slots;
- a failing forward (OOM...) is retried row by row so only the request that cannot run gets the error;
- prefix reuse (`prefix_cache_mib` > 0, prefix.py): a finished row's KV cache is kept, keyed by its tokens, in an
  LRU under a memory budget; a new request whose prompt starts with a kept sequence (a reflection round or react
  turn that extends its conversation, a shared system prompt) prefills only the rest. In float32 the answer is the
  same with reuse on and off (test); `Generation.prefill_tokens` says what was computed;
- prompt-lookup drafts (`draft_tokens` > 0): each row proposes the tokens that followed the latest earlier occurrence
  of its last `draft_ngram` tokens, as many as the match earns, one forward checks them all, and a row keeps those its
  own sampling agrees with, so the answer is the one decoding without drafts gives (drafts.py).
The KV cache's layers are kvcache.py's GrowingLayer; the prefix store and copies of identical rows are prefix.py's; how
requests join the batch (prefill in groups, merge) is admission.py's.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from agents.models.base import Generation, GenRequest, RequestError, cut_at_stop, too_long  # noqa: F401 (re-exported)
from . import decoder, unpadded
from .admission import Admission, _first_line
from .batching import gather
from .drafts import Drafts
from .heap import map_large_blocks, release_free_heap
from .int8 import OutputPool, only_rows, reuse_output
from .kvcache import _GrowingLayer, _set_kv, kv_token_bytes
from .native import argmax
from .prefix import PrefixStore, Reuse
from .sampling import multinomial, row_generator

log = logging.getLogger(__name__)


@dataclass
class _Row:
    req: GenRequest
    prompt_ids: list[int]
    max_new: int
    future: Future
    t_submit: float
    generator: object = None  # sampled rows: sampling.row_generator's stream
    out_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_window: int = 0  # how many trailing tokens can contain a stop string
    error: BaseException | None = None
    reused: int = 0  # prompt tokens whose KV came from the prefix store
    drafted: int = 0  # prompt-lookup draft tokens proposed ...
    accepted: int = 0  # ... and kept


# Sampled rows whose probabilities one softmax call makes (_sampled): 4 rows of a 151,936-token vocabulary are 2.4 MB,
# under the heap's mmap threshold while decoding (heap.py), so the buffers are reused and not faulted in afresh.
SAMPLED_ROWS = 4


class BatchEngine(Admission, Drafts, Reuse):
    def __init__(self, model, tokenizer, *, eos_ids: set[int], max_context: int, max_batch: int = 16,
                 gather_ms: float = 30.0, max_prefill_tokens: int = 8192, pad_id: int = 0,
                 name: str = "engine", prefix_cache_mib: float = 0, draft_tokens: int = 0,
                 draft_ngram: int = 3, draft_step_tokens: int = 16, kv_cache_mib: float = 0, heap_trim: bool = True,
                 kv_dtype: torch.dtype | None = None):
        self.model = model
        # the output layer's logits go to one buffer, reused step after step (int8.reuse_output: no fresh pages)
        self._head, self._logits = model.get_output_embeddings(), OutputPool()
        self.tok = tokenizer
        self.eos_ids = set(eos_ids)
        self.max_context = max_context
        self.max_batch = max(1, int(max_batch))
        self.gather_s = max(0.0, gather_ms / 1000.0)
        self.max_prefill_tokens = max(1, int(max_prefill_tokens))
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self._queue: deque[_Row] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._name = name
        # state of the running batch (touched only by the worker thread)
        self._rows: list[_Row] = []
        self._packs = unpadded.can_pack(model)  # draft steps' decoder layers over their real positions (unpadded.py)
        self._cache = None
        self._mask: torch.Tensor | None = None  # [B, T] 1 = real token
        self._pos: torch.Tensor | None = None  # [B] position id of the next token fed
        self._last: torch.Tensor | None = None  # [B] token to feed next
        self.draft_tokens, self.draft_ngram = max(0, int(draft_tokens)), max(1, int(draft_ngram))
        self.draft_step_tokens = max(2, int(draft_step_tokens))  # tokens fed per step, all rows together
        self.prefixes = PrefixStore(int(prefix_cache_mib * 2**20)) if prefix_cache_mib > 0 else None
        # the KV cache's dtype (None = the model's): float16 halves what decode attention reads (cpu_attention.py)
        self.kv_dtype = kv_dtype
        # KV budget of the running batch (rows x padded length x kv_token_bytes); 0 = none. See _take_new.
        self.kv_budget, self.kv_token_bytes = int(kv_cache_mib * 2**20), kv_token_bytes(model, kv_dtype)
        self.heap_trim = bool(heap_trim)  # hand free heap memory back to the OS (serving/heap.py)
        if self.heap_trim:
            map_large_blocks()  # process-wide: freed KV buffers and activations leave at once, not at the next trim
        self.stats = {"steps": 0, "prefills": 0, "row_steps": 0, "max_rows": 0, "recoveries": 0,
                      "prefill_s": 0.0, "decode_s": 0.0, "idle_s": 0.0, "queued_row_steps": 0,
                      "prompt_tokens": 0, "reused_tokens": 0,
                      "kept_grouped": 0,  # rows that reuse kept KV, prefilled in a group of 2 or more
                      "kept_joined": 0,  # rows whose prompt is a kept sequence and one token: no prefill (prefix.py)
                      "draft_steps": 0, "draft_tokens": 0, "draft_accepted": 0, "compactions": 0,
                      # decode attention reads every row's whole padded width: kv_slots (rows x width, summed over
                      # steps) against kv_tokens (the real tokens among them) is the share spent on left padding
                      "kv_slots": 0, "kv_tokens": 0}

    # ---- caller side -------------------------------------------------------------------------------------------
    def submit(self, req: GenRequest, prompt_ids: list[int]) -> Future:
        fut: Future = Future()
        n = len(prompt_ids)
        if n == 0:
            fut.set_exception(RequestError("empty prompt"))
            return fut
        if too_long(n, self.max_context):
            fut.set_exception(too_long(n, self.max_context))
            return fut
        # Clamp rather than fail: the caller sees finish_reason="length".
        max_new = max(1, min(int(req.max_new_tokens), self.max_context - n))
        gen = None
        if req.temperature and req.temperature > 0:  # torch's seeded generator's draws (sampling.py)
            gen = row_generator(req.seed if req.seed is not None else random.SystemRandom().randrange(2**63),
                                self.device)
        stop_window = max((len(s) for s in req.stop), default=0) + 2 if req.stop else 0
        row = _Row(req, list(prompt_ids), max_new, fut, time.perf_counter(), gen, stop_window=stop_window)
        with self._cv:
            if self._closed:
                fut.set_exception(RequestError("model is closed"))
                return fut
            self._queue.append(row)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()
        return fut

    def generate(self, req: GenRequest, prompt_ids: list[int]) -> Generation:
        return self.submit(req, prompt_ids).result()

    def activity(self) -> dict:
        """What the engine is doing now, for a job's heartbeat: rows being decoded, requests waiting, tokens generated
        so far (decode steps' tokens plus accepted drafts) and prompt tokens prefilled (not served from the prefix
        store). Read from any thread; approximate."""
        return {"rows": len(self._rows), "waiting": len(self._queue),
                "tokens": self.stats["row_steps"] + self.stats["draft_accepted"],
                "prefilled": self.stats["prompt_tokens"] - self.stats["reused_tokens"]}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    # ---- worker ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                new = self._take_new()
                if new is None:
                    break
                try:
                    if new:
                        self._admit(new)
                        if self.heap_trim:
                            release_free_heap()  # the prefill's caches and activations, freed into the heap
                    if self._rows:
                        self._step()
                except BaseException as e:  # never let the worker die with callers blocked
                    log.exception("batch engine failure")
                    for r in self._rows + new:
                        if not r.future.done():
                            r.future.set_exception(RequestError(f"engine failure: {_first_line(e)}"))
                    self._reset_batch()
        err = RequestError("model is closed")
        for r in self._rows + list(self._queue):
            if not r.future.done():
                r.future.set_exception(err)

    def _take_new(self) -> list[_Row] | None:
        """Requests to admit now: while a batch runs, whatever is waiting (up to free slots); when idle, block
        until something arrives, then gather for up to gather_ms so concurrent callers start together.
        With a KV budget, in order, while the batch's cache (rows x longest row, left padding) fits it; the first
        request that does not fit waits for rows to leave (a lone request always runs). Rows are independent, so
        this changes when a request runs, not its answer."""
        with self._cv:
            if not self._rows:  # nothing to decode: the engine waits for callers (idle_s: a job's usage, flows/usage.py)
                t0 = time.perf_counter()
                gather(self._cv, self._queue, self.max_batch, self.gather_s, lambda: self._closed)
                self.stats["idle_s"] += time.perf_counter() - t0
            if self._closed:
                return None
            free = self.max_batch - len(self._rows)
            new = []
            width = self._mask.shape[1] if self._rows else 0
            while self._queue and len(new) < free:
                r = self._queue[0]
                w = max(width, len(r.prompt_ids) + len(r.out_ids))
                held = len(self._rows) + len(new)
                if held and self.kv_budget and (held + 1) * w * self.kv_token_bytes > self.kv_budget:
                    break
                self._queue.popleft()
                if r.future.set_running_or_notify_cancel():
                    new.append(r)
                    width = w
            return new

    # ---- batch state -------------------------------------------------------------------------------------------
    def _reset_batch(self) -> None:
        self._rows, self._cache, self._mask, self._pos, self._last = [], None, None, None, None

    def _new_cache(self):
        """An empty cache whose full-attention layers grow in place (see _GrowingLayer); others keep their own logic."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=self.model.config)
        cache.layers = [_GrowingLayer(self.kv_dtype) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
        return cache

    @staticmethod
    def _all_growing(cache) -> bool:
        growing = type(_GrowingLayer())  # the class is made on first use (kvcache.py)
        return all(type(layer) is growing for layer in cache.layers)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _decode_forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        """A decode step's logits (rows, vocab): where unpadded.py runs the model, its layers (one compiled call where
        decoder.py applies) and then the output layer, the values transformers' forward gives; else that forward."""
        if self._packs:
            return self._head(unpadded.forward(self.model, ids, mask, pos, cache, None)).float()
        return self._forward(ids, mask, pos, cache)

    def _prefill_forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache,
                         only: torch.Tensor | None) -> torch.Tensor:
        """A prefill's logits at each row's last position (rows, vocab). Rows that reuse kept KV (the cache already
        holds it) go through decoder.py's compiled layers where they apply, over the fed real positions, then the
        output layer at each row's last one (always real: prompts end at the last column): the values transformers'
        forward gives, which serves every other prefill."""
        if self._packs:
            h = decoder.forward(self.model, ids, mask, pos, cache, only)  # None for an empty cache (a plain prefill)
            if h is not None:
                B, W = ids.shape
                last = torch.arange(B) * W + W - 1
                at = last if only is None else torch.searchsorted(only, last)
                with only_rows(B, None):
                    return self._head(h[at]).float()
        return self._forward(ids, mask, pos, cache)

    def _step(self) -> None:
        B = len(self._rows)
        self.stats["queued_row_steps"] += len(self._queue)  # requests waiting for a slot or KV room (flows/usage.py)
        drafts = self._drafts()
        if any(drafts):
            return self._draft_step(drafts)
        self._mask = torch.cat([self._mask, self._mask.new_ones((B, 1))], dim=1)
        self._count_kv()
        t0 = time.perf_counter()
        try:
            with reuse_output(self._head, self._logits):  # read by _sample before the next forward
                logits = self._decode_forward(self._last[:, None], self._mask, self._pos[:, None], self._cache)
        except Exception as e:
            self._recover(e)
            return
        self._pos = self._pos + 1
        self._last = self._sample(self._rows, logits)  # .tolist() inside syncs CUDA, so the timing is real
        self.stats["decode_s"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        self.stats["row_steps"] += B
        self.stats["max_rows"] = max(self.stats["max_rows"], B)
        self._retire()

    def _count_kv(self) -> None:
        self.stats["kv_slots"] += self._mask.numel()
        self.stats["kv_tokens"] += int(self._mask.sum())

    def _recover(self, e: BaseException) -> None:
        """A batched decode step failed; the cache may be half-updated. Rebuild each row from its tokens so far
        (prompt + generated), alone; rows that fail alone get the error, the others go on where they were."""
        log.warning("batched step failed (%s); retrying %d rows one by one", _first_line(e), len(self._rows))
        self.stats["recoveries"] += 1
        rows = self._rows
        self._reset_batch()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        for r in rows:
            # out_ids already holds the pending token, so this prefill yields the logits of the next one; the
            # row's generator simply continues its stream.
            try:
                cache, mask, pos, logits = self._prefill([r])
            except Exception as e1:
                self._fail(r, e1)
                continue
            self._merge([r], cache, mask, pos, self._sample([r], logits))
        self._retire()

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        """Next token per row: greedy argmax, or the row's own seeded generator (so rows never share RNG)."""
        nxt = argmax(logits)  # torch's indices, compiled on CPU (native.argmax: torch's own was slow at many rows)
        probs = self._sampled(logits, [(r, i) for i, r in enumerate(rows) if r.generator is not None])
        for i, r in enumerate(rows):
            if r.generator is not None:
                t = self._pick(r, logits[i], probs.get(i))
                if t is not None:
                    nxt[i] = t
        for r, t in zip(rows, nxt.tolist()):
            if r.error is None:
                self._append(r, t)
        return nxt

    @staticmethod
    def _sampled(logits: torch.Tensor, picks: list) -> dict:
        """{i: probabilities} for the sampled rows' logits rows i (picks: [(row, i)]), one division and one softmax for
        all of them: both work element by element and row by row, so each row's numbers are those of its own
        `softmax(logits[i] / temperature)` (the same bits, tested), and torch shares the rows between its threads
        where one row a call kept one thread busy (a noticeable cost for a step's sampled positions on 2 cores)."""
        out = {}
        for c in range(0, len(picks), SAMPLED_ROWS):
            chunk = picks[c:c + SAMPLED_ROWS]
            rows = logits.index_select(0, torch.tensor([i for _, i in chunk], device=logits.device))
            rows.div_(torch.tensor([[float(r.req.temperature)] for r, _ in chunk], dtype=rows.dtype, device=rows.device))
            probs = torch.softmax(rows, dim=-1)
            out.update((i, probs[k]) for k, (_, i) in enumerate(chunk))
        return out

    def _pick(self, r: _Row, logits: torch.Tensor, probs: torch.Tensor | None = None) -> int | None:
        """One row's next token from its logits [V] (or the probabilities _sampled gave for them); None when they cannot
        be sampled (the row then fails)."""
        if r.generator is None:
            return int(argmax(logits))
        try:
            if probs is None:
                probs = torch.softmax(logits / float(r.req.temperature), dim=-1)
            return multinomial(probs, r.generator)
        except RuntimeError as e:  # e.g. NaN/inf logits: this row fails, not the batch
            r.error, r.finish = e, "error"
            return None

    def _append(self, r: _Row, t: int) -> bool:
        """Add a generated token; True when it ends the row (EOS, a stop string, max_new_tokens)."""
        r.out_ids.append(t)
        if t in self.eos_ids:
            r.finish = "stop"
        elif r.stop_window and self._hit_stop(r):
            r.finish = "stop"
        elif len(r.out_ids) >= r.max_new:
            r.finish = "length"
        return r.finish is not None

    def _hit_stop(self, r: _Row) -> bool:
        tail = self.tok.decode(r.out_ids[-r.stop_window:], skip_special_tokens=True)
        return any(s in tail for s in r.req.stop)

    def _retire(self) -> None:
        """Complete finished rows and drop them (and all-padding cache columns) from the batch."""
        if not any(r.finish for r in self._rows):
            return
        keep = [i for i, r in enumerate(self._rows) if not r.finish]
        for i, r in enumerate(self._rows):
            if r.error is not None:
                self._fail(r, r.error)
            elif r.finish:
                self._keep_prefix(i, r)
                self._complete(r)
        if not keep:
            self._reset_batch()
            if self.heap_trim:
                release_free_heap()  # the batch's KV buffers
            return
        if len(keep) < len(self._rows):
            # rows beyond the new batch size fill the holes: the cache moves only those rows (rows are independent,
            # so their order changes nothing)
            tail = [i for i in keep if i >= len(keep)]
            keep = [i if not self._rows[i].finish else tail.pop(0) for i in range(len(keep))]
            idx = torch.tensor(keep, device=self.device)
            self._cache.batch_select_indices(idx)
            self._mask, self._pos, self._last = self._mask[idx], self._pos[idx], self._last[idx]
            self._rows = [self._rows[i] for i in keep]
            # columns that are padding in every remaining row cost attention time for nothing
            cols = self._mask.any(dim=0).nonzero()
            cut = int(cols[0]) if len(cols) else 0
            if cut > 0:
                for layer in self._cache.layers:
                    if hasattr(layer, "drop_left"):
                        layer.drop_left(cut)
                    else:
                        _set_kv(layer, layer.keys[..., cut:, :], layer.values[..., cut:, :])
                self._mask = self._mask[:, cut:]

    def _complete(self, r: _Row) -> None:
        ids = r.out_ids
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        text = self.tok.decode(ids, skip_special_tokens=True)
        text, hit = cut_at_stop(text, r.req.stop)
        if hit:
            r.finish = "stop"
        if not r.future.done():
            r.future.set_result(Generation(
                text=text, prompt_tokens=len(r.prompt_ids), completion_tokens=len(r.out_ids),
                seconds=time.perf_counter() - r.t_submit, finish_reason=r.finish or "length",
                prefill_tokens=len(r.prompt_ids) - r.reused, draft_tokens=r.drafted, draft_accepted=r.accepted))
