"""A request's tokens depend only on its own prompt, seed and temperature: not on the batch size, the other rows in
flight, their order or arrival, a prefix-store hit or drafts (issue: the same job twice gives the same answers).

Tiny randomly initialised real architectures through the engine's default CPU path (float32 activations, the
float16 KV cache read by fixlab's attention kernel, float32 linears in fixlab's packed kernel or int8 weights), and
the kernels themselves on every build this CPU runs."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from serving import EngineTuning, native  # noqa: E402
from serving.hf import TransformersModel  # noqa: E402
from tiny_models import make_random_model, tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="fixlab's compiled kernels need gcc")

TOPICS = ["def add(a, b):\n    return a - b\n", "def has_close_elements(numbers, threshold):\n",
          "assert candidate([1.0, 2.0], 0.5) == False\n", "import math\nfrom typing import List\n"]


def requests() -> list[GenRequest]:
    """Prompts of different lengths (so rows carry different left padding), greedy and seeded sampling."""
    out = []
    for i in range(10):
        body = "".join(TOPICS[(i + j) % len(TOPICS)] for j in range(1 + i % 5))
        out.append(GenRequest(messages=[{"role": "user", "content": body}], max_new_tokens=12 + 3 * (i % 4),
                              temperature=0.0 if i % 2 == 0 else 0.9, seed=None if i % 2 == 0 else 100 + i))
    return out


def follow_ups(reqs, answers) -> list[GenRequest]:
    """Each conversation one turn on: its prompt starts with a finished row's tokens (a prefix-store hit)."""
    return [GenRequest(messages=[*r.messages, {"role": "assistant", "content": a},
                                 {"role": "user", "content": "The tests failed. Try again."}],
                       max_new_tokens=10, temperature=r.temperature, seed=r.seed) for r, a in zip(reqs, answers)]


def together(model, reqs, order, delays) -> list[str]:
    out: list = [None] * len(reqs)

    def go(i, delay):
        time.sleep(delay)
        out[i] = model.generate(reqs[i]).text

    ts = [threading.Thread(target=go, args=(i, d)) for i, d in zip(order, delays)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return out


@pytest.fixture(scope="module", params=["float32", "int8"])
def folder(request, tmp_path_factory):
    # hidden 128, head_dim 32 (the kernels' vector paths), 4 query heads over 2 K/V heads (grouped attention)
    cfg = tiny_qwen2(hidden_size=128, intermediate_size=256, initializer_range=0.02)  # close logits: any bit counts
    return make_random_model(cfg, tmp_path_factory.mktemp("det")), request.param


def load(folder, draft_ngram: int = 3, **kw) -> TransformersModel:
    path, weights = folder
    return TransformersModel(TransformersModelConf(name="tiny", path=str(path), dtype="float32",
                                                   weights="int8" if weights == "int8" else "dtype", **kw),
                             tuning=EngineTuning(int8_kernel="fixlab", gather_ms=20, draft_ngram=draft_ngram))


def test_answers_do_not_depend_on_batch_order_arrival_prefix_hits_or_drafts(folder):
    reqs = requests()
    ref = load(folder, max_batch=1, draft_tokens=0, prefix_cache_mib=0)
    try:
        assert ref.choice.deterministic, ref.choice.why_not
        alone = [ref.generate(r).text for r in reqs]
        alone_next = [ref.generate(r).text for r in follow_ups(reqs, alone)]
    finally:
        ref.close()
    rng = random.Random(0)
    for max_batch in (3, 8):
        # drafts and the prefix store on; 1-token lookups so that a random model's rows draft often
        m = load(folder, max_batch=max_batch, draft_ngram=1)
        try:
            for trial in range(2):
                order = list(range(len(reqs)))
                rng.shuffle(order)
                delays = [0.0 if trial == 0 else rng.random() * 0.2 for _ in order]  # together, or trickling in
                assert together(m, reqs, order, delays) == alone, (max_batch, trial)
                assert together(m, follow_ups(reqs, alone), order, delays) == alone_next, (max_batch, trial)
            st = m.engine.stats
            # drafts checked, and prefix hits prefilled together (each row's rest beside others, engine._prefix_layout)
            assert st["max_rows"] >= 3 and st["reused_tokens"] > 0 and st["draft_steps"] > 0, st
            assert st["kept_grouped"] > 0, st
            # the same prompts again: each is a kept sequence and one token, so it joins the batch without a prefill
            assert st["kept_joined"] > 0, st
        finally:
            m.close()


def _attention(query, key, value, mask):
    return native.decode_attention(query, key, value, mask, mask is None, query.shape[-1] ** -0.5)


def test_one_query_gets_the_same_attention_alone_padded_in_a_batch_and_inside_a_prefill():
    torch.manual_seed(0)
    H, KV, D, n = 4, 2, 64, 40
    q = torch.randn(1, H, n, D)
    k, v = torch.randn(1, KV, n, D).half(), torch.randn(1, KV, n, D).half()
    prefill = _attention(q, k, v, None)  # all n positions at once, causal
    for p in (0, 7, 16, 17, 39):  # the query at position p, alone over its p + 1 keys
        alone = _attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], None)
        assert torch.equal(alone[:, 0], prefill[:, p])
        for pad in (1, 5, 16, 33):  # the same row left-padded beside a longer one, and rejected-draft holes
            L = p + 1 + pad + 2
            kb, vb = torch.zeros(2, KV, L, D).half(), torch.zeros(2, KV, L, D).half()
            kb[1, :, pad:pad + p + 1], vb[1, :, pad:pad + p + 1] = k[0, :, :p + 1], v[0, :, :p + 1]
            kb[1, :, -2:], vb[1, :, -2:] = torch.randn(KV, 2, D).half(), torch.randn(KV, 2, D).half()
            kb[0], vb[0] = torch.randn(KV, L, D).half(), torch.randn(KV, L, D).half()
            mask = torch.zeros(2, 1, 1, L, dtype=torch.bool)
            mask[0] = True
            mask[1, 0, 0, pad:pad + p + 1] = True  # the last two columns: masked-out drafts
            qb = torch.randn(2, H, 1, D)
            qb[1] = q[0, :, p:p + 1]
            assert torch.equal(_attention(qb, kb, vb, mask)[1, 0], alone[0, 0]), (p, pad)


def test_padding_query_positions_are_skipped_and_the_real_ones_keep_their_numbers():
    """A draft step feeds every row as many positions as the longest draft: a shorter row's extra positions (named
    padding by the engine, int8.only_rows) come out as zeros, not computed, and the real ones get what they get alone."""
    torch.manual_seed(1)
    H, KV, D, ctx, Q = 4, 2, 64, 30, 4
    k, v = torch.randn(2, KV, ctx + Q, D).half(), torch.randn(2, KV, ctx + Q, D).half()
    q = torch.randn(2, H, Q, D)
    mask = torch.ones(2, 1, Q, ctx + Q, dtype=torch.bool).tril(ctx)  # each fed position sees the cache and itself
    mask[1, :, :, ctx + 2:] = False  # row 1 drafted one token: its last two positions are padding
    real = torch.ones(2 * Q, dtype=torch.bool)
    real[Q + 2:] = False
    out = native.decode_attention(q, k, v, mask, False, D ** -0.5, real)
    assert torch.count_nonzero(out[1, 2:]) == 0 and torch.count_nonzero(out[1, :2]) > 0
    assert torch.count_nonzero(_attention(q, k, v, mask)[1, 2:]) > 0  # unnamed, they are computed
    for b, n in ((0, 4), (1, 2)):
        for p in range(n):
            alone = _attention(q[b:b + 1, :, p:p + 1], k[b:b + 1, :, :ctx + p + 1], v[b:b + 1, :, :ctx + p + 1], None)
            assert torch.equal(alone[0, 0], out[b, p]), (b, p)


def test_float32_matmul_rows_are_the_same_at_any_batch_and_on_every_build():
    torch.manual_seed(0)
    w, bias = torch.randn(200, 96), torch.randn(200)
    x = torch.randn(40, 96)
    builds = native.runnable_isas()
    ref = native.PackedF32(w, builds[0]).matmul(x[:1].contiguous(), bias)
    for isa in builds:
        packed = native.PackedF32(w, isa)
        for m in (1, 2, 3, 13, 40):
            y = packed.matmul(x[:m].contiguous(), bias)
            assert torch.equal(y[:1], ref), (isa, m)
        assert torch.allclose(packed.matmul(x, bias), x @ w.T + bias, atol=1e-4)  # and it is the product


def test_a_rows_logits_are_bit_identical_alone_and_in_padded_batches(folder):
    """The engine's own prefill and decode steps: the first row's logits alone, then beside longer and shorter rows
    (left padding), at other positions, in batches of 2 to 8. Tokens of tiny models rarely flip on a last-bit
    difference; the logits show every one (before: 2e-7 from attention over padding, 3e-5 from BLAS's lm_head)."""
    from serving.engine import _Row

    m = load(folder, max_batch=8)
    try:
        ids = [m.prompt_ids(r) for r in requests()[:4]]

        def logits(order: list[int], at: int, steps: int = 4) -> list[torch.Tensor]:
            rows = [_Row(GenRequest(messages=[]), list(ids[i]), 64, None, 0.0, None) for i in order]
            with torch.inference_mode():
                cache, mask, pos, lg = m.engine._prefill(rows)
                out = [lg[at].clone()]
                last = lg.argmax(-1)
                for _ in range(steps):
                    mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                    lg = m.engine._forward(last[:, None], mask, pos[:, None], cache)
                    pos, last = pos + 1, lg.argmax(-1)
                    out.append(lg[at].clone())
            return out

        alone = logits([0], 0)
        for order, at in (([0, 1], 0), ([3, 0], 1), ([2, 3, 0], 2), ([1, 2, 3, 0, 1, 2, 3, 0], 3)):
            assert all(torch.equal(a, b) for a, b in zip(alone, logits(order, at))), (order, at)
        # nor on how many threads share the work (a job's fair share of the cores depends on what else runs)
        threads = torch.get_num_threads()
        try:
            for n in {1, 2, 3} - {threads}:
                torch.set_num_threads(n)
                assert all(torch.equal(a, b) for a, b in zip(alone, logits([2, 3, 0], 2))), n
        finally:
            torch.set_num_threads(threads)
    finally:
        m.close()


def test_runtime_auto_neither_races_nor_picks_llamacpp_when_the_engine_repeats(folder, monkeypatch):
    """llama.cpp's answers depend on which slots share a batch: auto serves the engine that repeats, and spends no
    first-use minute racing a runtime it would not pick."""
    from serving import llamacpp, runtime

    if folder[1] != "float32":
        pytest.skip("one weights kind is enough")
    monkeypatch.setattr(runtime, "runtime_eligible", lambda cfg: True)  # as a registry pack with xllamacpp is

    def started(*a, **k):
        raise AssertionError("llama.cpp was started")

    monkeypatch.setattr(llamacpp, "LlamaCppModel", started)
    m = runtime.build_local(TransformersModelConf(name="tiny", path=str(folder[0]), runtime="auto",
                                                  weights="dtype", dtype="float32"))
    try:
        assert m.choice.runtime == "engine" and m.choice.deterministic and "llama.cpp not raced" in m.choice.reason
        assert m.choice.record()["deterministic"] is True
    finally:
        m.close()


@pytest.mark.parametrize("D,n", [(128, 37), (128, 100), (64, 100)])
def test_attention_gives_the_same_bits_on_every_build(D, n):
    """AVX-512, AVX2 and the portable loops: one order of sums, so a results file re-verifies on any x86 machine. The
    vector builds take whole blocks of columns at once (16 or 8, D 64 and 128) and a column at a time elsewhere: left
    padding, holes, the tail."""
    torch.manual_seed(1)
    H, KV = 6, 2
    q = torch.randn(2, H, n, D)
    k, v = torch.randn(2, KV, n + 3, D).half(), torch.randn(2, KV, n + 3, D).half()
    mask = torch.ones(2, 1, n, n + 3, dtype=torch.bool).tril(3)
    mask[0, :, :, :5] = False  # row 0 left-padded
    mask[1, :, :, 40:43] = False  # row 1: rejected drafts' columns inside a block
    outs = {}
    for isa in native.runnable_isas():
        try:
            native.FORCED_ISA, was = isa, native.FORCED_ISA
            outs[isa] = [native.decode_attention(q, k, v, mask, False, D ** -0.5),
                         native.decode_attention(q[:, :, -1:], k, v, mask[:, :, -1:], False, D ** -0.5)]
        finally:
            native.FORCED_ISA = was
    first = next(iter(outs.values()))
    for isa, o in outs.items():
        assert torch.equal(o[0], first[0]) and torch.equal(o[1], first[1]), isa
        assert torch.equal(o[1][:, 0], o[0][:, -1])  # decode = the prefill's last position
