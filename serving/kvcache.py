"""The engine's KV cache layer (GrowingLayer: a transformers DynamicLayer over buffers with room to grow, so the
batch changes with as little copying as possible), the bytes one token of a model's cache takes, and the helpers that
set or left-pad a layer's keys and values (any layer: transformers' own too)."""
from __future__ import annotations

import torch


class _GrowingKV:
    """GrowingLayer's methods (_GrowingLayer below makes the class): a DynamicLayer whose keys/values are the view
    buf[:b, :, s:n] of a buffer with spare rows and columns, so the batch changes with as little copying as possible
    (each copy of the whole cache costs about what a decode step does at real contexts; py-spy on a react job: a
    large share of the engine's time before):
    - a decode step writes one column in place (DynamicLayer's torch.cat copies the whole cache every step:
      a large cost in every layer every step for deepseek-1.3b's 16x128 KV heads at batch 16 x 900 tokens here);
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
        (a copy costs about one decode step's attention read: a small share of decode at 64+ steps apart)."""
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
        self.make_room(B, T, like=k)
        self._kbuf[:B, :, self._n: self._n + T] = k
        self._vbuf[:B, :, self._n: self._n + T] = v
        self.took(B, T)

    def make_room(self, B: int, T: int, like=None) -> None:
        """Room for T new columns of B rows at columns [_n, _n + T) of the buffers (then `took`): decoder.py writes
        them itself. `like`: a tensor of the new keys' kind (default: the held keys)."""
        like = self.keys if like is None else like
        if self._kbuf is None or self._n == self._s:  # nothing held yet (a prefill: exact rows, most are merged)
            self._kbuf, self._vbuf = self._alloc(like, B, T, spare_rows=False)
            self._s = self._n = 0
        elif B != self._b:
            raise RuntimeError(f"cache holds {self._b} rows, step brings {B}")
        elif self._n + T > self._kbuf.shape[-2]:  # out of columns: move to a bigger buffer
            held = self._n - self._s
            left = self._room(held)  # room on the left for longer rows joining (append_rows)
            kb, vb = self._alloc(like, B, held + T, left)  # rows that left are not carried over
            kb[:B, :, left:left + held] = self.keys
            vb[:B, :, left:left + held] = self.values
            self._kbuf, self._vbuf, self._s, self._n = kb, vb, left, left + held
            self._view()  # keys and values read the new buffers: the old ones go now, not when the step is written

    def took(self, B: int, T: int) -> None:
        """The T columns make_room made room for now hold the step's keys and values."""
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
