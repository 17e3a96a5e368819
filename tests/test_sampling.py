"""A sampled row's draws (serving/sampling.py): the compiled loop gives torch.multinomial's picks with a
torch.Generator seeded alike, draw after draw, its errors included; so a sampled request's answer is the one torch's
generator gives (issue #52: make eval's answers bit-identical)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from serving import EngineTuning, native, sampling  # noqa: E402
from serving.hf import TransformersModel  # noqa: E402
from tiny_models import make_random_model, tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="needs gcc for fixlab's compiled kernels")


def test_the_loop_is_checked_to_draw_as_torch_does():
    assert sampling.Draws.check()
    assert isinstance(sampling.row_generator(3, torch.device("cpu")), sampling.Draws)


@pytest.mark.parametrize("vocab,temperature", [(151936, 0.8), (151936, 0.2), (32000, 1.5), (7, 1.0), (1000, 0.05),
                                               (257, 1e-3)])
def test_picks_are_torch_multinomials_draw_after_draw(vocab, temperature):
    """A model-sized vocabulary at a job's temperatures (peaked and flat), and a tiny one; seeds past 32 bits."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(vocab, generator=gen) * 4
    logits[::97] += 9  # a few likely tokens scattered over the vocabulary
    probs = torch.softmax(logits / temperature, dim=-1)
    for seed in (0, 12345, 2**40 + 17):
        g, d = torch.Generator().manual_seed(seed), sampling.Draws(seed)
        want = [int(torch.multinomial(probs, 1, generator=g)[0]) for _ in range(30)]
        assert [d.multinomial(probs) for _ in range(30)] == want, seed


def test_probabilities_mostly_zero_draw_as_torch():
    """Zeros around a few tokens (a peaked softmax underflows): the blocks with no candidate still advance the stream."""
    probs = torch.zeros(151936)
    probs[[5, 70000, 151935]] = torch.tensor([0.25, 0.5, 0.25])
    g, d = torch.Generator().manual_seed(9), sampling.Draws(9)
    assert [d.multinomial(probs) for _ in range(40)] == [int(torch.multinomial(probs, 1, generator=g)[0])
                                                         for _ in range(40)]


def test_bad_probabilities_raise_as_torchs_and_draw_nothing():
    g, d = torch.Generator().manual_seed(5), sampling.Draws(5)
    for bad in (torch.tensor([0.5, float("nan"), 0.5]), torch.tensor([0.5, -0.1, 0.6]),
                torch.tensor([0.0, float("inf")]), torch.zeros(4)):
        with pytest.raises(RuntimeError):
            torch.multinomial(bad, 1, generator=g)
        with pytest.raises(RuntimeError):
            d.multinomial(bad)
    probs = torch.softmax(torch.arange(50.0) / 10, dim=-1)
    assert [d.multinomial(probs) for _ in range(10)] == [int(torch.multinomial(probs, 1, generator=g)[0])
                                                         for _ in range(10)]


def test_a_steps_probabilities_in_one_softmax_are_each_rows_own():
    """The engine divides and softmaxes a step's sampled positions together (BatchEngine._sampled, in blocks of
    SAMPLED_ROWS rows): each position's probabilities are those of its own row alone, bit for bit, whatever its
    temperature, its neighbours or a NaN beside it."""
    from types import SimpleNamespace

    from serving.engine import SAMPLED_ROWS, BatchEngine

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(11, 151936, generator=g) * 8
    logits[6, 100] = float("nan")
    temps = [0.8, 0.2, 1.5, 0.7, 0.8, 1e-3, 0.8, 1.0, 0.3]
    picks = [(SimpleNamespace(req=SimpleNamespace(temperature=t)), i) for t, i in zip(temps, [0, 2, 3, 4, 5, 6, 7, 9, 10])]
    assert len(picks) > SAMPLED_ROWS  # more than one block
    probs = BatchEngine._sampled(logits, picks)
    assert sorted(probs) == [i for _, i in picks]
    for r, i in picks:
        alone = torch.softmax(logits[i] / float(r.req.temperature), dim=-1)
        assert torch.equal(probs[i], alone) or (i == 6 and probs[i].isnan().all() and alone.isnan().all()), i


def test_a_sampled_requests_answer_is_the_one_torchs_generator_gives(tmp_path, monkeypatch):
    path = make_random_model(tiny_qwen2(hidden_size=128, intermediate_size=256), tmp_path / "m")
    reqs = [GenRequest(messages=[{"role": "user", "content": f"def f{i}(x):\n    return x"}], max_new_tokens=16,
                       temperature=0.9, seed=40 + i) for i in range(4)]

    def answers():
        m = TransformersModel(TransformersModelConf(name="tiny", path=str(path), dtype="float32", max_batch=1,
                                                    draft_tokens=0), tuning=EngineTuning(gather_ms=0))
        try:
            return [m.generate(r).text for r in reqs]
        finally:
            m.close()

    assert isinstance(sampling.row_generator(1, torch.device("cpu")), sampling.Draws)
    loop = answers()
    monkeypatch.setitem(sampling._checked, "cpu", False)  # rows keep a torch.Generator
    assert isinstance(sampling.row_generator(1, torch.device("cpu")), torch.Generator)
    assert answers() == loop and len(set(loop)) > 1
