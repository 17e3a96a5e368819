"""How waiting requests join the engine's running batch (a mixin of engine.py's BatchEngine; a row `r` is engine.py's
_Row): their prompts prefilled in groups bounded by max_prefill_tokens (similar lengths together, less padding), or
only their rest where the prefix store keeps the start of their prompt (prefix.py), then their KV caches merged into
the batch's, left-padded to one length. A failing group is retried row by row, so only a row that fails alone gets
the error."""
from __future__ import annotations

import logging
import time

import torch

from agents.models.base import RequestError

from .heap import prefill_blocks
from .int8 import only_rows
from .kvcache import _left_pad, _set_kv
from .prefix import _split_copies

log = logging.getLogger("serving.engine")


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}"[:300]


class Admission:
    def _prefill(self, rows: list, prefixes: list[tuple[int, list]] | None = None):
        """One forward over rows' prompts (+ tokens generated so far, when recovering). Returns cache state.
        With `prefixes` [(n, kv)] (one per row), rows whose first n tokens' KV is kept: only the rest is fed (see
        _prefix_layout)."""
        seqs = [r.prompt_ids + r.out_ids for r in rows]
        cache = self._new_cache()
        only = None
        if prefixes:
            if not self._all_growing(cache):
                raise RequestError("prefix reuse needs full-attention layers only")
            ids, mask, pos, only = self._prefix_layout(seqs, prefixes, cache)
        else:
            T = max(len(s) for s in seqs)
            ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), T), dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
                mask[i, T - len(s):] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
        t0 = time.perf_counter()
        with prefill_blocks(self.heap_trim), only_rows(ids.numel(), only):  # activations from the heap (heap.py)
            logits = self._prefill_forward(ids, mask, pos, cache, only)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats["prefill_s"] += time.perf_counter() - t0
        self.stats["prefills"] += 1
        return cache, mask, pos[:, -1] + 1, logits

    def _prefix_layout(self, seqs: list[list[int]], prefixes: list[tuple[int, list]], cache):
        """Rows that reuse kept KV, prefilled together: each row's kept n tokens end at column C (the longest kept
        part; left padding before), and its rest ends at the last column, C + W (W: the longest rest). A row with a
        shorter rest has masked columns between the two (as a rejected draft leaves): attention sums over a row's own
        unmasked columns only, so each row's values are those of its prefill alone. Returns (ids fed (B, W), mask
        (B, C + W), positions of the fed tokens, the fed tokens that are not padding or None)."""
        B, skips = len(seqs), [n for n, _ in prefixes]
        rests = [s[n:] for s, n in zip(seqs, skips)]
        C, W = max(skips), max(len(x) for x in rests)
        ids = torch.full((B, W), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, C + W), dtype=torch.long)
        for i, (n, x) in enumerate(zip(skips, rests)):
            ids[i, W - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[i, C - n:C] = 1
            mask[i, C + W - len(x):] = 1
        for j, layer in enumerate(cache.layers):
            k0, v0 = prefixes[0][1][j]
            if B == 1:  # the kept part as is (no padding)
                k, v = k0[:, :, :C], v0[:, :, :C]
            else:
                k = k0.new_zeros((B, k0.shape[1], C, k0.shape[3]))
                v = v0.new_zeros((B, v0.shape[1], C, v0.shape[3]))
                for i, (n, kv) in enumerate(prefixes):
                    k[i, :, C - n:] = kv[j][0][0, :, :n]
                    v[i, :, C - n:] = kv[j][1][0, :, :n]
            layer.update(k, v)
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)[:, C:]
        real = mask[:, C:].bool().reshape(-1)
        only = None if bool(real.all()) else real.nonzero().squeeze(1)
        return ids, mask, pos, only

    def _prefill_groups(self, rows: list):
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

    def _fail(self, row, e: BaseException) -> None:
        if isinstance(e, torch.OutOfMemoryError) and self.device.type == "cuda":
            torch.cuda.empty_cache()
        if not row.future.done():
            row.future.set_exception(RequestError(f"generation failed: {_first_line(e)}"))

    def _admit(self, new: list) -> None:
        plain, kept = [], []
        for r in new:
            self.stats["prompt_tokens"] += len(r.prompt_ids)
            n, kv = self.prefixes.longest(r.prompt_ids) if self.prefixes is not None else (0, None)
            if kv is None:
                plain.append(r)
            elif not (n == len(r.prompt_ids) - 1 and self._join_kept(r, n, kv)):
                kept.append((r, (n, kv)))
        for group in self._prefix_groups(kept):  # rows that reuse kept KV: prefilled together, only their rest fed
            plain += self._prefill_kept(group)
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

    def _prefix_groups(self, kept: list) -> list[list]:
        """Rows that reuse kept KV, in groups whose fed block (rows x the longest rest) stays within
        max_prefill_tokens; rests of similar length together (less padding)."""
        kept = sorted(kept, key=lambda rp: len(rp[0].prompt_ids) + len(rp[0].out_ids) - rp[1][0])
        groups, cur = [], []
        for r, p in kept:
            rest = len(r.prompt_ids) + len(r.out_ids) - p[0]
            if cur and rest * (len(cur) + 1) > self.max_prefill_tokens:
                groups.append(cur)
                cur = []
            cur.append((r, p))
        return groups + [cur] if cur else groups

    def _prefill_kept(self, group: list) -> list:
        """Prefill rows that reuse kept KV together and merge them; a failing group is retried row by row. Returns the
        rows that failed alone (e.g. a cache layout this model does not allow): their whole prompt is prefilled."""
        try:
            state = self._prefill([r for r, _ in group], prefixes=[p for _, p in group])
        except Exception:
            log.warning("prefix reuse failed for %d rows", len(group), exc_info=True)
            return [group[0][0]] if len(group) == 1 else [r for one in group for r in self._prefill_kept([one])]
        self.stats["kept_grouped"] += len(group) if len(group) > 1 else 0
        self._merge_kept(group, state)
        return []

    def _merge_kept(self, group: list, state) -> None:
        cache, mask, pos, logits = state
        rows = [r for r, _ in group]
        for r, (n, _) in group:
            r.reused = n
            self.stats["reused_tokens"] += n
        self._merge(rows, cache, mask, pos, self._sample(rows, logits))

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
