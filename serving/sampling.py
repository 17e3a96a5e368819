"""A sampled row's draws (engine.py's temperature rows): torch.multinomial(probs, 1, generator) with the row's own
seeded generator, or the same draws from fixlab's compiled loop (kernels.c section 7) where it is checked to be torch's.

Why: a sampled token's multinomial spends most of its time in exponential_, one element at a time (over a
151,936-token vocabulary: benchmarks/sampling.py), a noticeable share of a job's decode steps. The compiled draw
advances the same MT19937 stream as torch's CPU generator and finds the same argmax without the logarithm of elements
that cannot win, so a row's tokens are the ones torch's generator gives (tests/test_sampling.py; make eval's answers:
the results files).

`Draws.check()` compares the loop with torch at first use (exponential_ values bit for bit, then multinomial picks);
where they differ (another torch's generator) or the loop is not built, rows keep a torch.Generator."""
from __future__ import annotations

import threading

import torch

from . import native

_STATE_WORDS = 626  # MT19937's 624 words, then `left` and `next` (kernels.c)
_checked: dict[str, bool] = {}
_lock = threading.Lock()


class Draws:
    """One row's stream: the state torch.Generator(device="cpu").manual_seed(seed) makes, advanced by the loop."""

    def __init__(self, seed: int):
        self.state = torch.empty(_STATE_WORDS, dtype=torch.int32)
        native.library().fixlab_mt_seed(self.state.data_ptr(), seed & (2**64 - 1))

    def multinomial(self, probs: torch.Tensor) -> int:
        """torch.multinomial(probs, 1, generator)[0] for 1-D float32 probs; its errors as RuntimeError."""
        probs = probs.contiguous()
        i = native.library().fixlab_multinomial1(self.state.data_ptr(), probs.data_ptr(), probs.numel())
        if i == -1:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        if i == -2:
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        return int(i)

    def exponential(self, n: int) -> torch.Tensor:
        out = torch.empty(n, dtype=torch.float32)
        native.library().fixlab_exponential(self.state.data_ptr(), out.data_ptr(), n)
        return out

    @staticmethod
    def check() -> bool:
        """Whether the loop draws what this torch draws (once a process)."""
        with _lock:
            if "cpu" not in _checked:
                _checked["cpu"] = _agrees()
            return _checked["cpu"]


def _agrees() -> bool:
    if not native.available():
        return False
    try:
        for seed in (0, 7, 2**40 + 3):
            g, d = torch.Generator().manual_seed(seed), Draws(seed)
            for n in (1, 5, 700, 2000):  # crosses the 624-word refills
                if not torch.equal(torch.empty(n).exponential_(1, generator=g), d.exponential(n)):
                    return False
            gen = torch.Generator().manual_seed(seed + 1)
            probs = torch.softmax(torch.randn(3000, generator=gen) * 3, dim=-1)
            g, d = torch.Generator().manual_seed(seed), Draws(seed)
            for _ in range(20):
                if int(torch.multinomial(probs, 1, generator=g)[0]) != d.multinomial(probs):
                    return False
        return True
    except Exception:  # noqa: BLE001 - any doubt: torch's generator
        return False


def row_generator(seed: int, device: torch.device):
    """A sampled row's stream: Draws on CPU where it agrees with torch, else a seeded torch.Generator."""
    if device.type == "cpu" and Draws.check():
        return Draws(seed)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def multinomial(probs: torch.Tensor, generator) -> int:
    """One draw from probs with a row_generator."""
    if isinstance(generator, Draws):
        return generator.multinomial(probs)
    return int(torch.multinomial(probs, 1, generator=generator)[0])
