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
- prefix reuse (`prefix_cache_mib` > 0): a finished row's KV cache is kept, keyed by its tokens, in an LRU under a
  memory budget; a new request whose prompt starts with a kept sequence (a reflection round or react turn that
  extends its conversation, a shared system prompt) prefills only the rest. In float32 the answer is the same
  with reuse on and off (test); `Generation.prefill_tokens` says what was computed;
- prompt-lookup drafts (`draft_tokens` > 0): a repair copies most of the code it was shown, so each row proposes
  the tokens that followed the latest earlier occurrence of its last `draft_ngram` tokens, and one forward checks
  them all. A row keeps the drafts its own sampling agrees with, so the answer is the one decoding without drafts
  gives (same generator draws, one per token). At full batch too: the int8 matmuls are compute-bound there, so a
  step costs what its real tokens cost (padding positions of rows with shorter drafts are skipped by
  `int8.only_rows`, the output layer runs on real positions only), and about 7 of 10 drafted tokens are kept on real
  repairs. Rejected columns stay in the cache, masked out, until they are HOLES_SHARE of the held tokens; then the
  cache is rebuilt without them. `Generation.draft_tokens` / `draft_accepted` count them.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ..models.base import Generation, GenRequest, RequestError, cut_at_stop, too_long  # noqa: F401 (re-exported)
from .heap import map_large_blocks, prefill_blocks, release_free_heap
from .int8 import only_rows

log = logging.getLogger(__name__)


@dataclass
class _Row:
    req: GenRequest
    prompt_ids: list[int]
    max_new: int
    future: Future
    t_submit: float
    generator: torch.Generator | None = None
    out_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_window: int = 0  # how many trailing tokens can contain a stop string
    error: BaseException | None = None
    reused: int = 0  # prompt tokens whose KV came from the prefix store
    drafted: int = 0  # prompt-lookup draft tokens proposed ...
    accepted: int = 0  # ... and kept


class PrefixStore:
    """KV caches of finished sequences keyed by their token ids; least recently used out past `max_bytes`.

    A linear scan finds the longest shared prefix: the store holds tens of sequences, and one vectorised
    comparison per entry costs microseconds against a prefill's seconds."""

    def __init__(self, max_bytes: int, min_tokens: int = 16):
        self.max_bytes, self.min_tokens = int(max_bytes), int(min_tokens)
        self._entries: OrderedDict[int, tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], int]] = \
            OrderedDict()
        self._next = 0
        self.bytes = 0

    def put(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if size > self.max_bytes or len(ids) < self.min_tokens:
            return
        self._entries[self._next] = (torch.tensor(ids, dtype=torch.long), kv, size)
        self._next += 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, _, freed) = self._entries.popitem(last=False)
            self.bytes -= freed

    def longest(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(n, kv): the most tokens of `ids` (at most len(ids) - 1: the last one must be fed for logits) that a
        kept sequence starts with, and that sequence's KV; (0, None) below min_tokens."""
        if not self._entries:
            return 0, None
        want = torch.tensor(ids[:-1], dtype=torch.long)
        best, best_key = 0, None
        for key, (have, _, _) in self._entries.items():
            m = min(len(have), len(want))
            if m <= best:
                continue
            diff = (have[:m] != want[:m]).nonzero()
            n = int(diff[0]) if len(diff) else m
            if n > best:
                best, best_key = n, key
        if best < self.min_tokens:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key][1]


# Causal LMs whose logits are lm_head(model(...).last_hidden_state), nothing more (transformers' modeling files)
PLAIN_HEAD = {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}
# Masked-out columns inside rows (rejected drafts) that trigger a rebuild of the cache, as a share of held tokens.
HOLES_SHARE = 0.25


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}"[:300]


class BatchEngine:
    def __init__(self, model, tokenizer, *, eos_ids: set[int], max_context: int, max_batch: int = 16,
                 gather_ms: float = 30.0, max_prefill_tokens: int = 8192, pad_id: int = 0,
                 name: str = "engine", prefix_cache_mib: float = 0, draft_tokens: int = 0,
                 draft_ngram: int = 3, draft_step_tokens: int = 16, kv_cache_mib: float = 0, heap_trim: bool = True,
                 kv_dtype: torch.dtype | None = None):
        self.model = model
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
        self.heap_trim = bool(heap_trim)  # hand free heap memory back to the OS (agents/serving/heap.py)
        if self.heap_trim:
            map_large_blocks()  # process-wide: freed KV buffers and activations leave at once, not at the next trim
        self.stats = {"steps": 0, "prefills": 0, "row_steps": 0, "max_rows": 0, "recoveries": 0,
                      "prefill_s": 0.0, "decode_s": 0.0, "prompt_tokens": 0, "reused_tokens": 0,
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
        if req.temperature and req.temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(req.seed if req.seed is not None else random.SystemRandom().randrange(2**63))
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
            if not self._rows:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return None
                deadline = time.monotonic() + self.gather_s
                while len(self._queue) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
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

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _prefill(self, rows: list[_Row], prefix: tuple[int, list] | None = None):
        """One forward over rows' prompts (+ tokens generated so far, when recovering). Returns cache state.
        With `prefix` (n, kv), one row whose first n tokens' KV is kept: only the rest is fed."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        seqs = [r.prompt_ids + r.out_ids for r in rows]
        skip = prefix[0] if prefix else 0
        T = max(len(s) for s in seqs)
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, T - len(s):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = DynamicCache(config=self.model.config)
        # Full-attention layers get room to grow in place (see _GrowingLayer); others keep their own logic.
        cache.layers = [_GrowingLayer(self.kv_dtype) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
        if skip:
            if len(rows) != 1 or any(type(layer) is not type(_GrowingLayer()) for layer in cache.layers):
                raise RequestError("prefix reuse needs one row and full-attention layers only")
            for layer, (k, v) in zip(cache.layers, prefix[1]):
                layer.update(k[:, :, :skip], v[:, :, :skip])
            ids, pos = ids[:, skip:], pos[:, skip:]
        t0 = time.perf_counter()
        with prefill_blocks(self.heap_trim):  # activations from the heap, not mapped afresh (heap.py)
            logits = self._forward(ids, mask, pos, cache)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats["prefill_s"] += time.perf_counter() - t0
        self.stats["prefills"] += 1
        return cache, mask, pos[:, -1] + 1, logits

    def _prefill_groups(self, rows: list[_Row]):
        """Prefill in groups bounded by max_prefill_tokens (padded); a failing group is retried row by row and
        only the rows that fail alone get the error."""
        rows = sorted(rows, key=lambda r: len(r.prompt_ids) + len(r.out_ids))  # similar lengths pad less
        groups, cur = [], []
        for r in rows:
            L = len(r.prompt_ids) + len(r.out_ids)
            if cur and L * (len(cur) + 1) > self.max_prefill_tokens:
                groups.append(cur)
                cur = []
            cur.append(r)
        if cur:
            groups.append(cur)
        # yielded one group at a time: the caller merges a group's cache before the next group is prefilled, so
        # at most one group's prefill cache is held beside the batch (a list held all of them until the last merge)
        for g in groups:
            try:
                state = self._prefill(g)
            except Exception as e:
                if len(g) == 1:
                    self._fail(g[0], e)
                    continue
                self.stats["recoveries"] += 1
                for r in g:
                    try:
                        state = self._prefill([r])
                    except Exception as e1:
                        self._fail(r, e1)
                        continue
                    yield [r], state
                    del state
                continue
            yield g, state
            del state  # not held while the next group is prefilled

    def _fail(self, row: _Row, e: BaseException) -> None:
        if isinstance(e, torch.OutOfMemoryError) and self.device.type == "cuda":
            torch.cuda.empty_cache()
        if not row.future.done():
            row.future.set_exception(RequestError(f"generation failed: {_first_line(e)}"))

    def _admit(self, new: list[_Row]) -> None:
        plain = []
        for r in new:
            self.stats["prompt_tokens"] += len(r.prompt_ids)
            n, kv = self.prefixes.longest(r.prompt_ids) if self.prefixes is not None else (0, None)
            if kv is None:
                plain.append(r)
                continue
            try:  # alone: its cached part is unpadded, so it cannot share a left-padded prefill
                cache, mask, pos, logits = self._prefill([r], prefix=(n, kv))
            except Exception:  # e.g. a cache layout this model does not allow: compute it all
                log.warning("prefix reuse failed; prefilling the whole prompt", exc_info=True)
                plain.append(r)
                continue
            r.reused = n
            self.stats["reused_tokens"] += n
            self._merge([r], cache, mask, pos, self._sample([r], logits))
        plain, copies = _split_copies(plain)
        for rows, (cache, mask, pos, logits) in self._prefill_groups(plain):
            rows, cache, mask, pos, logits = self._add_copies(rows, copies, cache, mask, pos, logits)
            nxt = self._sample(rows, logits)
            self._merge(rows, cache, mask, pos, nxt)
            del cache  # merged (copied into the batch, or the batch itself): not held through the next prefill
        for r in [r for rows in copies.values() for r in rows]:  # their original failed: each tries alone
            for rows, (cache, mask, pos, logits) in self._prefill_groups([r]):
                self._merge(rows, cache, mask, pos, self._sample(rows, logits))
        self._retire()

    def _add_copies(self, rows, copies: dict, cache, mask, pos, logits):
        """Rows whose sequence equals a prefilled row's (candidates of one prompt, sent together) take a copy of
        its KV cache and logits instead of a forward of their own; each still samples with its own seed."""
        src = [(i, c) for i, r in enumerate(rows) for c in copies.pop(id(r), [])]
        if not src:
            return rows, cache, mask, pos, logits
        idx = torch.tensor(list(range(len(rows))) + [i for i, _ in src], device=mask.device)
        for layer in cache.layers:
            _set_kv(layer, layer.keys.index_select(0, idx), layer.values.index_select(0, idx))
        for _, c in src:
            c.reused = len(c.prompt_ids)
            self.stats["reused_tokens"] += c.reused
        return rows + [c for _, c in src], cache, mask[idx], pos[idx], logits[idx]

    def _merge(self, rows, cache, mask, pos, nxt) -> None:
        """Append prefilled rows to the running batch: left-pad the shorter KV cache to a common length."""
        if not self._rows:
            self._rows, self._cache, self._mask, self._pos, self._last = list(rows), cache, mask, pos, nxt
            return
        Ta, Tb = self._mask.shape[1], mask.shape[1]
        T = max(Ta, Tb)
        for la, lb in zip(self._cache.layers, cache.layers):
            if hasattr(la, "append_rows"):
                la.append_rows(lb.keys, lb.values)
                continue
            _set_kv(la, *(torch.cat([_left_pad(a, T - Ta, -2), _left_pad(b, T - Tb, -2)], dim=0)
                          for a, b in ((la.keys, lb.keys), (la.values, lb.values))))
        self._mask = torch.cat([_left_pad(self._mask, T - Ta, -1), _left_pad(mask, T - Tb, -1)], dim=0)
        self._pos = torch.cat([self._pos, pos])
        self._last = torch.cat([self._last, nxt])
        self._rows.extend(rows)

    def _step(self) -> None:
        B = len(self._rows)
        drafts = self._drafts()
        if any(drafts):
            return self._draft_step(drafts)
        self._mask = torch.cat([self._mask, self._mask.new_ones((B, 1))], dim=1)
        self._count_kv()
        t0 = time.perf_counter()
        try:
            logits = self._forward(self._last[:, None], self._mask, self._pos[:, None], self._cache)
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

    def _drafts(self) -> list[list[int]]:
        """Each row's draft, all cut to one length so that the step feeds at most draft_step_tokens real tokens
        (a row's pending token and its drafts); [] when no row has room for one."""
        B = len(self._rows)
        budget = self.draft_step_tokens - B  # drafted tokens this step may add, all rows together
        if self.draft_tokens <= 0 or budget <= 0:
            return []
        # longer drafts when few rows share the step: it is then memory-bound and a longer check costs little
        cap = max(self.draft_tokens, min(2 * self.draft_tokens, self.draft_step_tokens // B - 1))
        drafts = [self._draft(r, cap) for r in self._rows]
        while cap > 0 and sum(min(len(d), cap) for d in drafts) > budget:
            cap -= 1
        return [d[:cap] for d in drafts] if cap else []

    def _draft(self, r: _Row, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the row's last n tokens (prompt lookup)."""
        n = self.draft_ngram
        seq = r.prompt_ids + r.out_ids
        k = min(k, r.max_new - len(r.out_ids) - 1, self.max_context - len(seq) - 1)
        if k <= 0 or len(seq) <= n:
            return []
        key = seq[-n:]
        first = key[0]
        for p in range(len(seq) - n - 1, -1, -1):
            if seq[p] == first and seq[p:p + n] == key:
                return seq[p + n: p + n + k]
        return []

    def _draft_step(self, drafts: list[list[int]]) -> None:
        """Feed each row its pending token and its drafts in one forward; keep, per row, the drafts that its own
        next-token choice agrees with, and mask out the cache columns of the rest."""
        B, K = len(self._rows), max(len(d) for d in drafts)
        feed = torch.full((B, K + 1), self.pad_id, dtype=torch.long, device=self.device)
        new = torch.zeros((B, K + 1), dtype=self._mask.dtype, device=self.device)
        feed[:, 0], new[:, 0] = self._last, 1
        for i, d in enumerate(drafts):
            if d:
                feed[i, 1:1 + len(d)] = torch.tensor(d, dtype=torch.long, device=self.device)
                new[i, 1:1 + len(d)] = 1
        self._mask = torch.cat([self._mask, new], dim=1)
        self._count_kv()
        pos = self._pos[:, None] + torch.arange(K + 1, device=self.device)[None, :]
        real = new.bool().view(-1)  # positions that carry a token: the int8 matmuls skip the others
        only = None if bool(real.all()) else real.nonzero().squeeze(1)
        t0 = time.perf_counter()
        try:
            with only_rows(B * (K + 1), only):
                logits = self._real_logits(feed, pos, only)  # (real positions, vocab), row by row
        except Exception as e:
            self._recover(e)
            return
        T = self._mask.shape[1]
        greedy = logits.argmax(dim=-1).tolist()  # one call for every greedy row and position
        last, most, at = [], 0, 0
        for i, (r, d) in enumerate(zip(self._rows, drafts)):
            kept, first = 0, at
            at += len(d) + 1
            for j in range(len(d) + 1):
                t = greedy[first + j] if r.generator is None else self._pick(r, logits[first + j])
                if t is None or self._append(r, t) or j == len(d) or t != d[j]:
                    break
                kept += 1
            self._mask[i, T - K + kept:] = 0  # columns of drafts after the first disagreement
            self._pos[i] += 1 + kept
            r.drafted, r.accepted = r.drafted + len(d), r.accepted + kept
            self.stats["draft_tokens"] += len(d)
            self.stats["draft_accepted"] += kept
            most = max(most, kept)
            last.append(r.out_ids[-1] if r.out_ids else self.pad_id)
        if most < K:  # the last columns are masked out in every row: forget them (the next step writes there)
            self._drop_right(K - most)
        self._compact_if_holey()
        self._last = torch.tensor(last, dtype=torch.long, device=self.device)
        self.stats["decode_s"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        self.stats["draft_steps"] += 1
        self.stats["row_steps"] += B
        self.stats["max_rows"] = max(self.stats["max_rows"], B)
        self._retire()

    def _compact_if_holey(self) -> None:
        """Rejected drafts leave masked-out columns inside rows, which every later step's attention reads for
        nothing. When they reach HOLES_SHARE of the held tokens, rebuild the cache with each row's tokens only
        (left-padded again): one copy of the cache, about one step's attention read."""
        m = self._mask.bool()
        valid = m.sum(1)
        holes = int((m.shape[1] - m.byte().argmax(1) - valid).sum())
        if holes <= HOLES_SHARE * int(valid.sum()) or not all(hasattr(la, "compact") for la in self._cache.layers):
            return
        cols = [m[i].nonzero().squeeze(1) for i in range(m.shape[0])]
        T = int(valid.max())
        for layer in self._cache.layers:
            layer.compact(cols, T)
        self._mask = torch.zeros((m.shape[0], T), dtype=self._mask.dtype, device=self.device)
        for i, c in enumerate(cols):
            self._mask[i, T - len(c):] = 1
        self.stats["compactions"] += 1

    def _real_logits(self, feed: torch.Tensor, pos: torch.Tensor, only: torch.Tensor | None) -> torch.Tensor:
        """Logits of a draft step's real positions only, (positions, vocab) in row order: the decoder's hidden
        states, then the output layer on the real positions (a full (rows, K+1, vocab) float tensor is tens of MB a
        step at 32 rows). Models whose logits are more than the output layer of the last hidden state (scaled,
        soft-capped...) take the whole forward."""
        if type(self.model).__name__ not in PLAIN_HEAD:
            out = self.model(input_ids=feed, attention_mask=self._mask, position_ids=pos,
                             past_key_values=self._cache, use_cache=True, logits_to_keep=feed.shape[1])
            flat = out.logits.float().reshape(-1, out.logits.shape[-1])
            return flat if only is None else flat[only]
        h = self.model.model(input_ids=feed, attention_mask=self._mask, position_ids=pos,
                             past_key_values=self._cache, use_cache=True).last_hidden_state
        h = h.reshape(-1, h.shape[-1])
        return self.model.lm_head(h if only is None else h[only]).float()

    def _drop_right(self, cut: int) -> None:
        for layer in self._cache.layers:
            if hasattr(layer, "drop_right"):
                layer.drop_right(cut)
            else:
                _set_kv(layer, layer.keys[..., :-cut, :], layer.values[..., :-cut, :])
        self._mask = self._mask[:, :-cut]

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
        nxt = logits.argmax(dim=-1)
        for i, r in enumerate(rows):
            if r.generator is not None:
                t = self._pick(r, logits[i])
                if t is not None:
                    nxt[i] = t
        for r, t in zip(rows, nxt.tolist()):
            if r.error is None:
                self._append(r, t)
        return nxt

    def _pick(self, r: _Row, logits: torch.Tensor) -> int | None:
        """One row's next token from its logits [V]; None when they cannot be sampled (the row then fails)."""
        if r.generator is None:
            return int(logits.argmax())
        try:
            probs = torch.softmax(logits / float(r.req.temperature), dim=-1)
            return int(torch.multinomial(probs, 1, generator=r.generator)[0])
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

    def _keep_prefix(self, i: int, r: _Row) -> None:
        """Copy row i's KV (its prompt and all but the last generated token: the last was never fed) into the
        prefix store, so a follow-up turn that repeats this conversation prefills only what is new."""
        if self.prefixes is None:
            return
        ids = r.prompt_ids + r.out_ids[:-1]
        cols = self._mask[i].nonzero().squeeze(1)  # left padding and rejected drafts are masked out
        if len(cols) != len(ids) or any(not hasattr(layer, "set") for layer in self._cache.layers):
            return
        self.prefixes.put(ids, [(layer.keys[i:i + 1, :, cols].clone(), layer.values[i:i + 1, :, cols].clone())
                                for layer in self._cache.layers])

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


class _GrowingKV:
    """GrowingLayer's methods (_GrowingLayer below makes the class): a DynamicLayer whose keys/values are the view
    buf[:b, :, s:n] of a buffer with spare rows and columns, so the batch changes with as little copying as possible
    (each copy of the whole cache costs about what a decode step does at real contexts; py-spy on a react job: 40%
    of the engine's time before):
    - a decode step writes one column in place (DynamicLayer's torch.cat copies the whole cache every step:
      0.37 s per layer per step for deepseek-1.3b's 16x128 KV heads at batch 16 x 900 tokens here);
    - rows leaving are compacted in place (`batch_select_indices`: only the rows that move are copied);
    - columns that became padding in every row are dropped by moving s (`drop_left`);
    - rows joining are written into spare rows, left-padded with zeros to the batch's length (`append_rows`).
    Padding columns hold zeros (finite: a masked score times a padded value must stay 0)."""

    store_dtype: torch.dtype | None = None  # the buffers' dtype; None = that of the keys first stored

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._empty()

    def _empty(self) -> None:
        self._b = self._s = self._n = 0
        self._kbuf = self._vbuf = None

    def _view(self) -> None:
        self.keys = self._kbuf[: self._b, :, self._s: self._n]
        self.values = self._vbuf[: self._b, :, self._s: self._n]

    @staticmethod
    def _room(n: int) -> int:
        """Spare columns beside n held ones, on the right for growth and on the left for longer rows joining."""
        return max(64, n // 8)

    def _alloc(self, like, rows: int, cols: int, left: int = 0, spare_rows: bool = True) -> tuple:
        """New buffers for `rows` rows (rounded up to 8 with `spare_rows`: room for joining rows) and `cols`
        columns after `left` free ones, with room to grow: amortised, a regrow copies n tokens every n/8 steps
        (a copy costs about one decode step's attention read: under 2% of decode at 64+ steps apart)."""
        rows = -(-rows // 8) * 8 if spare_rows else rows
        cap = left + cols + self._room(cols)
        shape = (rows, like.shape[1], cap, like.shape[-1])
        dtype = self.store_dtype or like.dtype  # a step's new keys are cast as they are written
        return like.new_empty(shape, dtype=dtype), like.new_empty(shape, dtype=dtype)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._append(key_states, value_states)
        return self.keys, self.values

    def _append(self, k, v) -> None:
        """New columns (a step's tokens) for every row."""
        B, T = k.shape[0], k.shape[-2]
        if self._kbuf is None or self._n == self._s:  # nothing held yet (a prefill: exact rows, most are merged)
            self._kbuf, self._vbuf = self._alloc(k, B, T, spare_rows=False)
            self._s = self._n = 0
        elif B != self._b:
            raise RuntimeError(f"cache holds {self._b} rows, step brings {B}")
        elif self._n + T > self._kbuf.shape[-2]:  # out of columns: move to a bigger buffer
            held = self._n - self._s
            left = self._room(held)  # room on the left for longer rows joining (append_rows)
            kb, vb = self._alloc(k, B, held + T, left)  # rows that left are not carried over
            kb[:B, :, left:left + held] = self.keys
            vb[:B, :, left:left + held] = self.values
            self._kbuf, self._vbuf, self._s, self._n = kb, vb, left, left + held
        self._kbuf[:B, :, self._n: self._n + T] = k
        self._vbuf[:B, :, self._n: self._n + T] = v
        self._b, self._n = B, self._n + T
        self._view()

    def set(self, keys, values) -> None:
        """Replace the contents (one copy into a new buffer)."""
        self._empty()
        self._append(keys, values)

    def get_seq_length(self) -> int:
        return self._n - self._s if self.is_initialized else 0

    def batch_select_indices(self, indices) -> None:
        """Keep rows `indices`, in that order. In place when no row is read after it was overwritten (rows
        keeping their place, or moving into a hole from beyond the new batch size); else one copy."""
        if self.get_seq_length() == 0:
            return
        idx = [int(i) for i in indices]
        if not _in_place_order(idx):
            self.set(self.keys[indices], self.values[indices])
            return
        s, n = self._s, self._n
        for i, j in enumerate(idx):
            if i != j:
                self._kbuf[i, :, s:n] = self._kbuf[j, :, s:n]
                self._vbuf[i, :, s:n] = self._vbuf[j, :, s:n]
        self._b = len(idx)
        self._view()

    def drop_left(self, cut: int) -> None:
        """Forget the first `cut` columns of every row (padding everywhere): no copy."""
        self._s = min(self._s + cut, self._n)
        self._view()

    def drop_right(self, cut: int) -> None:
        """Forget the last `cut` columns of every row (rejected drafts everywhere): the next step writes there."""
        self._n = max(self._s, self._n - cut)
        self._view()

    def compact(self, cols: list, length: int) -> None:
        """Keep columns cols[row] of each row, right-aligned in `length` columns (zeros on the left): a new
        buffer, one copy."""
        B, left = len(cols), self._room(length)  # room on the left for longer rows joining, as append_rows
        kb, vb = self._alloc(self.keys, B, length, left)
        for i, c in enumerate(cols):
            pad = left + length - len(c)
            kb[i, :, left:pad], vb[i, :, left:pad] = 0, 0
            kb[i, :, pad:left + length] = self.keys[i][:, c]
            vb[i, :, pad:left + length] = self.values[i][:, c]
        self._kbuf, self._vbuf, self._b, self._s, self._n = kb, vb, B, left, left + length
        self._view()

    def append_rows(self, keys, values) -> None:
        """Add rows after the held ones; the shorter side is left-padded with zeros to the longer's length
        (the engine's mask says the same)."""
        if self.get_seq_length() == 0 or self._kbuf is None:
            self.set(keys, values)
            return
        Ba, Ta = self._b, self._n - self._s
        Bb, Tb = keys.shape[0], keys.shape[-2]
        T = max(Ta, Tb)
        if Ba + Bb > self._kbuf.shape[0] or self._s < T - Ta:  # no spare rows, or no room on the left
            left = self._room(T)  # room for later, longer rows without a copy
            kb, vb = self._alloc(keys, Ba + Bb, T, left)
            kb[:Ba, :, left + T - Ta: left + T] = self.keys
            vb[:Ba, :, left + T - Ta: left + T] = self.values
            self._kbuf, self._vbuf, self._s, self._n = kb, vb, left + T - Ta, left + T
        if Ta < T:  # held rows grow to the left
            self._s -= T - Ta
            self._kbuf[:Ba, :, self._s: self._s + T - Ta] = 0
            self._vbuf[:Ba, :, self._s: self._s + T - Ta] = 0
        s = self._s
        self._kbuf[Ba: Ba + Bb, :, s: s + T - Tb] = 0
        self._vbuf[Ba: Ba + Bb, :, s: s + T - Tb] = 0
        self._kbuf[Ba: Ba + Bb, :, s + T - Tb: s + T] = keys
        self._vbuf[Ba: Ba + Bb, :, s + T - Tb: s + T] = values
        self._b = Ba + Bb
        self._view()

    def reset(self) -> None:
        super().reset()
        self._empty()


# GrowingLayer subclasses transformers' DynamicLayer, so it is made on first use (its methods are _GrowingKV's,
# ahead of DynamicLayer's in its MRO) to keep transformers' cache module out of this module's import.
_GROWING = None


def _GrowingLayer(store_dtype: torch.dtype | None = None):
    global _GROWING
    if _GROWING is None:
        from transformers.cache_utils import DynamicLayer

        _GROWING = type("GrowingLayer", (_GrowingKV, DynamicLayer), {"__doc__": _GrowingKV.__doc__})
    layer = _GROWING()
    layer.store_dtype = store_dtype
    return layer


def kv_token_bytes(model, kv_dtype: torch.dtype | None = None) -> int:
    """Bytes of keys and values one token of one row takes in the cache, all layers; 0 where the config does not say."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    try:
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        dtype = kv_dtype or next(p.dtype for p in model.parameters() if p.is_floating_point())
        return int(cfg.num_hidden_layers) * 2 * int(kv_heads) * int(head_dim) * dtype.itemsize
    except (AttributeError, TypeError, StopIteration):
        return 0


def _in_place_order(idx: list[int]) -> bool:
    """Whether copying row idx[i] to row i, for i in order, never reads a row already overwritten."""
    written: set[int] = set()
    for i, j in enumerate(idx):
        if i != j:
            if j in written:
                return False
            written.add(i)
    return True


def _split_copies(rows: list) -> tuple[list, dict]:
    """(rows with distinct sequences, {id(original): [rows with the same sequence]})."""
    first: dict[tuple, object] = {}
    copies: dict[int, list] = {}
    for r in rows:
        key = tuple(r.prompt_ids + r.out_ids)
        if key in first:
            copies.setdefault(id(first[key]), []).append(r)
        else:
            first[key] = r
    return list(first.values()), copies


def _set_kv(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    if hasattr(layer, "set"):
        layer.set(keys, values)
    else:
        layer.keys, layer.values = keys, values


def _left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _skinny_linear(self, x: torch.Tensor) -> torch.Tensor:
    # W @ x.T instead of x @ W.T for a few rows: MKL's sgemm packs the whole weight matrix for small M,
    # which made decode steps at batch 2-32 up to 3x slower than the matrix-vector speed (measured here).
    rows = x.numel() // x.shape[-1]
    if rows > _SKINNY_MAX_ROWS or x.dtype != self.weight.dtype:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], y.shape[-1]).contiguous()


_SKINNY_MAX_ROWS = 128


def use_skinny_matmul(model) -> int:
    """Route the CPU decode-step matmuls of every nn.Linear through _skinny_linear. Returns how many."""
    import types

    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear:
            mod.forward = types.MethodType(_skinny_linear, mod)
            n += 1
    return n
