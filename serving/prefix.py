"""KV reuse, engine.py's prompt tokens it does not compute: the prefix store (`prefix_cache_mib` > 0) keeps finished
rows' KV caches keyed by their tokens, so that a new request whose prompt starts with a kept sequence (a reflection
round or react turn that extends its conversation, a shared system prompt) prefills only the rest; and rows whose
sequence equals another's (candidates of one prompt, sent together) take a copy of its prefill. `Reuse` is a mixin of
BatchEngine: its methods run on the engine's batch state; a row `r` is engine.py's _Row."""
from __future__ import annotations

from collections import OrderedDict

import torch

from .kvcache import _set_kv


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


class Reuse:
    """BatchEngine's KV reuse (mixed into it): copies for identical rows, and finished rows kept in its PrefixStore."""

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

    def _join_kept(self, r, n: int, kv) -> bool:
        """A request whose prompt is a kept sequence and one token more (a round that resamples the same prompt,
        a retry) takes no prefill of its own: its kept KV joins the running batch and its last prompt token becomes
        its pending token, so the next decode step gives its first token, from the same kernels over the same columns
        as a prefill of that one token (each row's values depend on its own columns only: tests/test_determinism.py).
        A prefill of one token is costly (a whole forward, the batch waiting), the extra row a step a small share
        of it. False where the cache cannot take it (layers other than full attention): then prefilled."""
        if r.out_ids:  # a recovered row: its generated tokens must be fed too
            return False
        cache = self._new_cache()
        if not self._all_growing(cache):
            return False
        for layer, (k, v) in zip(cache.layers, kv):
            layer.update(k[:, :, :n], v[:, :, :n])  # a copy: the store's entry stays as it is
        mask = torch.ones((1, n), dtype=torch.long, device=self.device)
        pos = torch.tensor([n], dtype=torch.long, device=self.device)
        last = torch.tensor([r.prompt_ids[-1]], dtype=torch.long, device=self.device)
        r.reused = n
        self.stats["reused_tokens"] += n
        self.stats["kept_joined"] += 1
        self._merge([r], cache, mask, pos, last)
        return True

    def _keep_prefix(self, i: int, r) -> None:
        """Copy row i's KV (its prompt and all but the last generated token: the last was never fed) into the
        prefix store, so a follow-up turn that repeats this conversation prefills only what is new."""
        if self.prefixes is None:
            return
        ids = r.prompt_ids + r.out_ids[:-1]
        cols = self._mask[i].nonzero().squeeze(1)  # left padding and rejected drafts are masked out
        if len(cols) != len(ids) or any(not hasattr(layer, "set") for layer in self._cache.layers):
            return
        layers = self._cache.layers
        if len(cols) and int(cols[-1]) - int(cols[0]) + 1 == len(cols):  # no hole (most rows): a slice, copied once
            at = slice(int(cols[0]), int(cols[0]) + len(ids))  # (a gather then a clone copies twice)
            kv = [(layer.keys[i:i + 1, :, at].clone(), layer.values[i:i + 1, :, at].clone()) for layer in layers]
        else:  # a gather is a copy already
            kv = [(layer.keys[i:i + 1, :, cols], layer.values[i:i + 1, :, cols]) for layer in layers]
        self.prefixes.put(ids, kv)


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
