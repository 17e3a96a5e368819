"""Giving the C allocator's free heap memory back to the OS (glibc malloc_trim), for the batching engine.

torch's CPU tensors come from glibc malloc. Below its mmap threshold (which glibc raises to 32 MiB once a large block
is freed) they live in the heap, and freed heap memory stays resident until malloc_trim returns it. A prefill leaves
its group caches and activations free in the heap: much of it still resident after the first wave of 32 prompts in
the default job, on top of the KV cache and prefix store that grew next (benchmarks/memory.py, series). A trim that
frees much is cheap beside a prefill; one with little to free, and the free-bytes check, cost next to nothing.

Trimming after admissions still left the free heap of decode steps resident (much free heap at the peak of the
default job, on every task): KV buffers that grow and logits, 4-30 MiB each. So during decode the engine fixes
the mmap threshold at 4 MiB (`map_large_blocks`): a block that large gets its own mapping and goes back to the OS when
freed. Not during a prefill, and not lower: a mapped block's pages fault in afresh (many times slower than memory
from the heap, measured here), and a prefill's activations of 4-30 MiB come and go layer after layer. With 4 MiB
throughout, the default job's prefills took noticeably longer, though with far less free heap at the peak; so a
prefill's forward runs with the threshold at 32 MiB (glibc's own ceiling, `PREFILL_BLOCKS`), and the admission is
trimmed after. Not the whole admission at 32 MiB: its merges copy the batch's KV into new buffers, and the old ones
stayed as free heap (much free heap at the peak of that full job).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from contextlib import contextmanager

# torch's own switch (c10/core/alloc_cpu.cpp): CPU tensors of 2 MiB and more are madvised MADV_HUGEPAGE before first
# touch, so the kernel backs them with 2 MiB pages where transparent huge pages are `madvise` (Debian's and Ubuntu's
# default) or `always`. A decode step streams the whole int8 model and the KV cache through the TLB, and on 4 KiB
# pages that is hundreds of thousands of page translations a step (with and without: benchmarks/turns.py). Such
# tensors are page-aligned, so glibc gives each of at least its mmap threshold a mapping of its own (fused.py keeps a
# prefill's MLP output under PREFILL_BLOCKS). Read once, at torch's first CPU allocation: set when serving is imported.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def use_huge_pages() -> None:
    """Ask torch for huge pages on large CPU tensors (the user's own setting wins: 0 turns it off)."""
    os.environ.setdefault(HUGE_PAGES_ENV, "1")


def huge_pages_mode() -> str | None:
    """The kernel's transparent huge page mode (always, madvise, never); None where unknown (not Linux)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    return next((w[1:-1] for w in text.split() if w.startswith("[")), None)


def huge_page_bytes() -> int | None:
    """This process's anonymous memory on transparent huge pages now; None where unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):  # not glibc (musl, macOS) or glibc < 2.33: nothing to do
        return None


_LIBC = _libc()


def free_heap_bytes() -> int:
    """Bytes free inside the allocator's heaps (all arenas), still resident; 0 where unknown."""
    return int(_LIBC.mallinfo2().fordblks) if _LIBC is not None else 0


M_MMAP_THRESHOLD = -3  # mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
# Free heap at the top that free() leaves in place. Setting the mmap threshold also freezes glibc's trim threshold at
# its 128 KiB default (no more dynamic thresholds), so every freed activation over 128 KiB at the heap's top went back
# to the OS and the next op faulted fresh pages in: each small decode op (a norm's, the MLP's) ran many times slower
# than from a warm heap (benchmarks/decode_profile.py). The engine trims explicitly after each admission
# (release_free_heap), so this bounds only what sits free between trims.
KEEP_TOP = 64 << 20
DECODE_BLOCKS = 4 << 20  # mmap threshold while decoding
PREFILL_BLOCKS = 32 << 20  # while prefilling: glibc's own ceiling (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)


def map_large_blocks(threshold: int = DECODE_BLOCKS) -> bool:
    """Blocks of at least `threshold` bytes from now on get a mapping of their own (returned to the OS on free), and
    glibc stops raising the threshold as large blocks are freed. True when set."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, int(threshold))) and bool(_LIBC.mallopt(M_TRIM_THRESHOLD, KEEP_TOP))


@contextmanager
def prefill_blocks(enabled: bool = True):
    """Within: blocks up to PREFILL_BLOCKS come from the heap (a prefill forward's activations); after: decode's
    threshold again. A no-op when not `enabled`."""
    if enabled:
        map_large_blocks(PREFILL_BLOCKS)
    try:
        yield
    finally:
        if enabled:
            map_large_blocks()


def release_free_heap(min_bytes: int = 64 << 20) -> bool:
    """malloc_trim when at least `min_bytes` sit free in the heaps. True when it ran."""
    if _LIBC is None or free_heap_bytes() < min_bytes:
        return False
    _LIBC.malloc_trim(0)
    return True
