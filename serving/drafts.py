"""Prompt-lookup drafts (engine.py's `draft_tokens` > 0): a repair copies most of the code it was shown, so each row
proposes the tokens that followed the latest earlier occurrence of its last `draft_ngram` tokens, and one forward
checks them all. A row keeps the drafts its own sampling agrees with, so the answer is the one decoding without drafts
gives (same generator draws, one per token). At full batch too: the int8 matmuls are compute-bound there, so a
step costs what its real tokens cost (padding positions of rows with shorter drafts are skipped by
`int8.only_rows`, the output layer runs on real positions only), so a rejected token costs a row of the step: a draft
is as long as the match it follows earns (PER_MATCHED; benchmarks/drafts.py sets the rules side by side). Rejected
columns stay in the cache, masked out, until they are HOLES_SHARE of the held tokens; then the
cache is rebuilt without them. `Generation.draft_tokens` / `draft_accepted` count them. The decoder layers of a draft
step carry its real positions only (unpadded.py).
`Drafts` is a mixin of BatchEngine: its methods run on the engine's batch state (rows, mask, positions, cache, stats)."""
from __future__ import annotations

import time

import torch

from . import unpadded
from .int8 import only_rows, reuse_output
from .kvcache import _set_kv
from .native import argmax

# Causal LMs whose logits are lm_head(model(...).last_hidden_state), nothing more (transformers' modeling files)
PLAIN_HEAD = {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}
# Masked-out columns inside rows (rejected drafts) that trigger a rebuild of the cache, as a share of held tokens.
HOLES_SHARE = 0.25
# A draft runs at most this many tokens per token of the match it follows (its n-gram and as far back as the two
# places go on agreeing): a long match is a copy under way, a bare n-gram is often a coincidence, and a full batch is
# compute-bound, so each rejected token costs a row of the step. None: every row drafts as many as the step allows
# (draft_tokens; twice that when few rows share the step).
PER_MATCHED: float | None = 0.5


class Drafts:
    """BatchEngine's draft steps (mixed into it): its _step calls _drafts, and _draft_step where a row has a draft.
    A row `r` is engine.py's _Row."""

    def _drafts(self) -> list[list[int]]:
        """Each row's draft, all cut to one length so that the step feeds at most draft_step_tokens real tokens
        (a row's pending token and its drafts); [] when no row has room for one."""
        B = len(self._rows)
        budget = self.draft_step_tokens - B  # drafted tokens this step may add, all rows together
        if self.draft_tokens <= 0 or budget <= 0:
            return []
        if PER_MATCHED is None:  # longer drafts when few rows share the step: then memory-bound, a check costs little
            cap = max(self.draft_tokens, min(2 * self.draft_tokens, self.draft_step_tokens // B - 1))
        else:  # each row's own match sets its length
            cap = 2 * self.draft_tokens
        drafts = [self._draft(r, cap) for r in self._rows]
        while cap > 0 and sum(min(len(d), cap) for d in drafts) > budget:
            cap -= 1
        return [d[:cap] for d in drafts] if cap else []

    def _draft(self, r, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the row's last n tokens (prompt lookup),
        fewer where that match is short (PER_MATCHED)."""
        n = self.draft_ngram
        seq = r.prompt_ids + r.out_ids
        k = min(k, r.max_new - len(r.out_ids) - 1, self.max_context - len(seq) - 1)
        if k <= 0 or len(seq) <= n:
            return []
        key = seq[-n:]
        first = key[0]
        for p in range(len(seq) - n - 1, -1, -1):
            if seq[p] == first and seq[p:p + n] == key:
                if PER_MATCHED is not None:  # looked back only as far as k tokens need
                    span = n
                    while span * PER_MATCHED < k and p + n - span > 0 and seq[p + n - span - 1] == seq[-span - 1]:
                        span += 1
                    k = min(k, int(span * PER_MATCHED))
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
            with reuse_output(self._head, self._logits):  # read before the next forward
                logits = self._real_logits(feed, pos, only)  # (real positions, vocab), row by row
        except Exception as e:
            self._recover(e)
            return
        T = self._mask.shape[1]
        greedy = argmax(logits).tolist()  # one call for every greedy row and position
        picks, at = [], 0  # every position of the sampled rows (those after a rejection are not drawn from)
        for r, d in zip(self._rows, drafts):
            if r.generator is not None:
                picks += [(r, at + j) for j in range(len(d) + 1)]
            at += len(d) + 1
        probs = self._sampled(logits, picks)
        last, most, at = [], 0, 0
        for i, (r, d) in enumerate(zip(self._rows, drafts)):
            kept, first = 0, at
            at += len(d) + 1
            for j in range(len(d) + 1):
                t = greedy[first + j] if r.generator is None else self._pick(r, logits[first + j], probs[first + j])
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
        states (over the real positions alone where unpadded.py runs the model), then the output layer on the real
        positions (a full (rows, K+1, vocab) float tensor is tens of MB a step at 32 rows). Models whose logits are
        more than the output layer of the last hidden state (scaled, soft-capped...) take the whole forward."""
        if self._packs:
            h = unpadded.forward(self.model, feed, self._mask, pos, self._cache, only)
            return self.model.lm_head(h).float()
        with only_rows(feed.numel(), only):
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
