"""The input embedding read from the weights file, row by row (pread), so that its pages never count in the job's
memory.

Why: transformers maps a float32 safetensors file into the process and the embedding stays a view of that mapping
(int8.py reads the linears apart; the embedding is used as it is). Each token a job embeds pages its row in through
the mapping, and the kernel maps the file's neighbouring pages with it where they are in the page cache
(fault-around): mapped file pages count in the process's resident memory until unmapped. A job that had just
converted its pack (the whole file cached) thus held a large part of the 1.5B pack's 0.93 GB float32 table at its
peak, one that found the pack converted much less (benchmarks/memory.py, `model_files`; docs/RESULTS.md).
Read with pread the rows are the same bytes, from the page cache, which the kernel may reclaim and which is not the
process's. Cost: one pread per token from the page cache, tiny beside a decode step.
"""
from __future__ import annotations

import os
import weakref

import torch

from .int8 import MappedFiles, read_fully


class FileRowsEmbedding(torch.nn.Embedding):
    """An nn.Embedding whose forward reads the asked rows from the file its weight maps (the same values as the
    gather, bit for bit); the weight stays as it was, a view whose pages are never read."""

    def __init__(self, emb: torch.nn.Embedding, fd: int, offset: int):
        super().__init__(emb.num_embeddings, emb.embedding_dim, padding_idx=emb.padding_idx, _weight=emb.weight,
                         _freeze=True)
        self._fd, self._offset = fd, offset
        self._row_bytes = emb.embedding_dim * emb.weight.element_size()
        self._version = emb.weight._version  # torch counts in-place writes: once written, the file is not the table
        weakref.finalize(self, os.close, fd)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight._version != self._version:  # written in memory since (a fine-tune, a test): gather from it
            return super().forward(ids)
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError("index out of range in self")  # torch's own words for an id outside the table
        out = torch.empty(flat.numel(), self.embedding_dim, dtype=self.weight.dtype)
        view = memoryview(out.view(torch.uint8).numpy()).cast("B")
        size = self._row_bytes
        for i, t in enumerate(flat.tolist()):
            if not read_fully(self._fd, view[i * size:(i + 1) * size], self._offset + t * size):
                raise OSError(f"the weights file ended inside row {t} of the embedding")
        return out.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rows read from the weights file"


def read_embedding_rows(model) -> bool:
    """Swap the model's input embedding for a FileRowsEmbedding where it is a plain nn.Embedding whose weight is an
    untouched view of a mapped file (CPU, loaded from safetensors); True when swapped."""
    emb = model.get_input_embeddings()
    if type(emb) is not torch.nn.Embedding or emb.max_norm is not None:
        return False  # scaled or renormed embeddings compute more than a gather
    with MappedFiles() as files:
        at = files.locate(emb.weight)
        if at is None:
            return False
        fd, offset = at
        model.set_input_embeddings(FileRowsEmbedding(emb, os.dup(fd), offset))
    return True
