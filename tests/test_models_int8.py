"""`weights: int8`: decoder matmuls in int8 with per-row activation scales. What users rely on: a row's answer
does not depend on what it is batched with (as in fp32), the numbers stay close to fp32, and a wrong value is
one line."""
from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from agents.models.base import GenRequest  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from serving import EngineTuning  # noqa: E402
from serving.f32 import PackedLinear  # noqa: E402
from serving.hf import BadModelConfig, TransformersModel  # noqa: E402
from serving.int8 import Int8Group, Int8Linear, Int8Member, quantize_int8, quantize_rows  # noqa: E402
from test_models_engine import assert_batched_answers_equal_alone, msgs  # noqa: E402
from tiny_models import make_random_model, tiny_qwen2  # noqa: E402


def test_int8_linear_rows_are_independent_and_close_to_fp32():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200)
    q = Int8Linear(lin)
    x = torch.randn(37, 96) * torch.linspace(0.1, 10, 37)[:, None]  # rows of very different magnitudes
    together = q(x)
    alone = torch.cat([q(x[i:i + 1]) for i in range(len(x))])
    assert torch.equal(together, alone)  # bit for bit: no row's rounding depends on the others
    assert torch.equal(q(x.reshape(37, 1, 96)).reshape(37, 200), together)
    want = lin(x)
    rel = (together - want).norm(dim=1) / want.norm(dim=1)
    assert rel.max() < 0.03, rel.max()
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (200, 96)


def test_an_lm_head_sized_int8_linear_gives_a_row_the_same_logits_in_every_batch_size():
    # The 1.5B pack's lm_head in int8 (conf/model/qwen1.5b-coder-q4.yaml): a quarter of its vocabulary, its width.
    # fp32 matmuls round a row differently at 1, 2, 4 and 16 rows (MKL, measured here), which made reruns differ.
    torch.manual_seed(0)
    head = Int8Linear(torch.nn.Linear(1536, 151936 // 4, bias=False))
    x = torch.randn(33, 1536)
    alone = head(x[:1])
    for n in (2, 3, 4, 16, 33):
        assert torch.equal(head(x[:n])[:1], alone), n


def test_quantize_skips_lm_head_and_keeps_zero_rows_finite():
    net = torch.nn.Module()
    net.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8, bias=False))
    net.lm_head = torch.nn.Linear(8, 5)
    assert quantize_int8(net) == 2
    assert type(net.lm_head) is torch.nn.Linear and all(isinstance(m, Int8Linear) for m in net.body)
    y = net.body(torch.zeros(3, 8))
    assert torch.isfinite(y).all()


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory):
    path = make_random_model(tiny_qwen2(), tmp_path_factory.mktemp("qwen2-int8"))
    m = TransformersModel(TransformersModelConf(name="tiny-int8", path=str(path), max_batch=3, dtype="float32",
                                                weights="int8"), tuning=EngineTuning(gather_ms=50))
    yield m
    m.close()


def test_int8_model_answers_the_same_batched_and_alone(tiny_int8):
    m = tiny_int8
    # per layer: q, k, v as one int8 matmul, o, gate and up as one, down
    assert sum(isinstance(x, Int8Linear) for x in m.model.modules()) == 2 * 4
    assert sum(isinstance(x, Int8Member) for x in m.model.modules()) == 2 * 5
    assert type(m.model.lm_head) is PackedLinear  # left in float32: fixlab's batch-invariant float32 kernel
    assert_batched_answers_equal_alone(m)
    assert m.engine.stats["max_rows"] == 3


def test_weights_auto_is_int8_on_cpu_only():
    from serving.hf import resolve_weights

    assert resolve_weights("auto", torch.device("cpu")) == "int8"
    assert resolve_weights("auto", torch.device("cuda")) == "dtype"
    assert resolve_weights(None, torch.device("cpu")) == "dtype"
    with pytest.raises(BadModelConfig, match="CPU path"):
        resolve_weights("int8", torch.device("cuda"))


def test_bad_weights_value_is_one_line(tiny_int8):
    with pytest.raises(BadModelConfig) as e:
        TransformersModel(TransformersModelConf(name="bad", path=tiny_int8.cfg.path, weights="int4"))
    assert "unknown weights 'int4'" in str(e.value) and "\n" not in str(e.value)


# ---- quantizing a model loaded from a mapped safetensors file (issue #25: memory) ---------------------------------
def _mapped_rss(path) -> int:
    """Resident bytes of `path`'s mappings in this process (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                inside = line.rstrip("\n").endswith(str(path))
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def _reference_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Int8Linear's rounding as first written (before quantize_rows): the values every int8 run so far used."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


@pytest.fixture(scope="module")
def mapped_model_dir(tmp_path_factory):
    return make_random_model(tiny_qwen2(hidden_size=512, intermediate_size=2048),
                             tmp_path_factory.mktemp("qwen2-mapped"))


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux /proc")
def test_int8_from_a_mapped_file_is_bit_equal_and_leaves_float_pages_unread(mapped_model_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
    linear_bytes = sum(m.weight.numel() * 4 for n, m in model.named_modules()
                       if type(m) is torch.nn.Linear and not n.endswith("lm_head"))
    loaded = _mapped_rss(mapped_model_dir / "model.safetensors")
    assert loaded < linear_bytes / 2  # transformers maps the file and reads it lazily
    assert quantize_int8(model) == 2 * 7
    # the float32 weights were read with pread: their pages of the mapping stay unread (before: all resident)
    assert _mapped_rss(mapped_model_dir / "model.safetensors") - loaded < linear_bytes / 10
    want = load_file(mapped_model_dir / "model.safetensors")  # a plain copy, the reference's source
    seen = 0
    for name, mod in model.named_modules():
        if isinstance(mod, (Int8Linear, Int8Member)) and name + ".weight" in want:
            seen += 1
            qw, sc, bias = mod.weights() if isinstance(mod, Int8Member) else (mod.qweight, mod.scale, mod.bias)
            q, scale = _reference_int8(want[name + ".weight"])
            assert torch.equal(qw, q) and torch.equal(sc, scale), name
            assert (bias is None) == (name + ".bias" not in want) and (bias is None or torch.equal(
                bias, want[name + ".bias"])), name
    assert seen == 2 * 7
    assert type(model.lm_head) is torch.nn.Linear and torch.equal(model.lm_head.weight, want["lm_head.weight"])


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux /proc")
def test_int8_quantizes_a_weight_changed_in_memory_not_the_file(mapped_model_dir):
    """A weight written after loading (its pages are then private copies) must be quantized from memory."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
    w = model.model.layers[1].mlp.up_proj.weight
    with torch.no_grad():
        w[3, :7] = 5.0  # one page of the mapping becomes an anonymous copy
    changed = w.detach().clone()
    quantize_int8(model)
    q, scale = _reference_int8(changed)
    qw, sc, _ = model.model.layers[1].mlp.up_proj.weights()  # its rows of the gate and up group
    assert torch.equal(qw, q) and torch.equal(sc, scale)


def test_quantize_rows_equals_the_first_rounding_on_hard_rows():
    torch.manual_seed(1)
    w = torch.randn(9, 64) * 3
    w[1] = 0.0  # all zero: scale clamped
    w[2] = -w[2].abs()  # only negative: absmax from the minimum
    w[3, 5] = -0.0
    w[4] = torch.linspace(-1, 1, 64) * 1e-30  # tiny
    w[5, :] = 127 * 0.5  # exact halves round to even
    w[6, ::2] = torch.arange(32) - 15.5  # x.5 after scaling: halves of both parities
    want_q, want_scale = _reference_int8(w)
    for native in (True, False):  # the compiled loop (weights load through it) and the eager steps
        scale, q = quantize_rows(w.clone(), native=native)
        assert torch.equal(q, want_q) and torch.equal(scale, want_scale), native


def test_weights_rounded_by_the_compiled_loop_on_every_thread_equal_the_first_rounding():
    """A matrix large enough that the loop splits its rows across threads, with rows of every scale."""
    torch.manual_seed(2)
    w = torch.randn(1536, 256) * torch.logspace(-8, 2, 1536)[:, None]
    w[7] = 0.0
    want_q, want_scale = _reference_int8(w)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the suite's workers run on one
    try:
        scale, q = quantize_rows(w, native=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="fixlab's kernels need gcc")
def test_fixlab_int8_matmul_on_two_threads_taking_panels_as_they_free_up_gives_the_int_mm_values():
    """The threads take chunks of panels as they free up (kernels.c chunk_of): whichever thread computes a panel,
    and whatever the chunking (few panels, rows split too, the 1.5B's 43-panel q/k/v group), each output equals
    torch._int_mm's (Int8Linear's torch plan)."""
    from serving.int8 import Int8Plan

    torch.manual_seed(7)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the suite's workers run on one
    try:
        for n, k in ((240, 96), (2048, 160), (4000, 64)):
            lin = torch.nn.Linear(k, n)
            ref = Int8Linear(lin, native=True, plan=Int8Plan("torch", "torch"))
            fixlab = Int8Linear(lin, native=True, plan=Int8Plan("fixlab", "fixlab"))
            for m in (1, 3, 24, 65, 200):
                x = torch.randn(m, k)
                want = ref(x)
                for _ in range(3):  # chunks go to whichever thread is free: every run the same values
                    assert torch.equal(fixlab(x), want), (n, k, m)
    finally:
        torch.set_num_threads(threads)


def test_int8_model_loaded_from_a_mapped_file_answers_as_before(mapped_model_dir):
    """Same logits as before: the weights in anonymous memory, rounded as first written."""
    from transformers import AutoModelForCausalLM

    mapped = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
    quantize_int8(mapped)
    before = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
    for p in list(before.parameters()) + list(before.buffers()):
        p.data = p.data.clone()  # off the mapping: what a cast or an older loader gives
    quantize_int8(before, group=False)  # one Int8Linear a linear, each rounded as first written
    for name, mod in before.named_modules():
        if isinstance(mod, Int8Linear):
            mod.qweight, mod.scale = _reference_int8(
                mapped_reference_weight(mapped_model_dir, name))
    ids = torch.randint(0, 512, (3, 21), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(mapped(input_ids=ids).logits, before(input_ids=ids).logits)


def test_siblings_as_one_int8_group_give_the_same_logits_as_one_linear_each(mapped_model_dir, monkeypatch):
    """q, k, v and gate, up multiplied as one matrix each (Int8Group): every logit bit-equal to a linear each, in a
    padded batch, with the fused MLP (which reads the group's columns in place, a prefill's rows in blocks) and
    without."""
    from transformers import AutoModelForCausalLM

    from serving import heap
    from serving.fused import _block_rows, use_fused_ops

    models = {}
    for group in (True, False):
        for fused in (True, False):
            m = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
            quantize_int8(m, group=group)
            if fused:
                assert use_fused_ops(m) > 0
            models[group, fused] = m
    grouped = models[True, True]
    assert sum(isinstance(x, Int8Group) for x in grouped.modules()) == 2 * 2
    assert type(grouped.model.layers[0].self_attn.k_proj) is Int8Member
    assert type(models[False, True].model.layers[0].self_attn.k_proj) is Int8Linear
    mlp = grouped.model.layers[0].mlp
    assert _block_rows(mlp) >= 63  # the whole input in one block at the real heap limit
    monkeypatch.setattr(heap, "PREFILL_BLOCKS", (64 << 10) + 16 * 2 * 2048 * 4)
    assert _block_rows(mlp) == 16  # 63 rows in four blocks
    ids = torch.randint(0, 512, (3, 21), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    with torch.no_grad():
        for fused in (True, False):
            a = models[True, fused](input_ids=ids, attention_mask=mask).logits
            b = models[False, fused](input_ids=ids, attention_mask=mask).logits
            assert torch.equal(a, b), fused
            one = models[True, fused](input_ids=ids[2:3]).logits  # a row alone: the group holds nothing stale
            assert torch.equal(one, b[2:3]), fused
        eager = models[False, False](input_ids=ids, attention_mask=mask).logits  # no blocks, no fused loops
        assert torch.equal(models[True, True](input_ids=ids, attention_mask=mask).logits, eager)


def test_an_int8_group_member_called_again_or_with_another_input_computes_again():
    torch.manual_seed(4)
    parent = torch.nn.Module()
    parent.q_proj, parent.k_proj, parent.v_proj = (torch.nn.Linear(32, n) for n in (32, 8, 8))
    alone = {n: Int8Linear(getattr(parent, n)) for n in ("q_proj", "k_proj", "v_proj")}
    quantize_int8(parent)
    x, y = torch.randn(5, 32), torch.randn(5, 32)
    assert torch.equal(parent.q_proj(x), alone["q_proj"](x))
    assert torch.equal(parent.k_proj(y), alone["k_proj"](y))  # another input than the held one
    assert torch.equal(parent.k_proj(y), alone["k_proj"](y))  # the same member twice
    assert torch.equal(parent.v_proj(x), alone["v_proj"](x))


def mapped_reference_weight(folder, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name + ".weight").clone()


def test_only_rows_computes_the_chosen_rows_bit_equal_and_zeros_the_rest():
    from serving.int8 import only_rows

    torch.manual_seed(0)
    q = Int8Linear(torch.nn.Linear(64, 48))
    x = torch.randn(4, 3, 64)  # 4 rows x 3 positions, as a draft step feeds them
    full = q(x)
    keep = torch.tensor([0, 1, 3, 4, 6, 9])
    with only_rows(12, keep):
        part = q(x).reshape(12, 48)
        other = q(torch.randn(5, 64))  # an input of another size is computed whole
    assert torch.equal(part[keep], full.reshape(12, 48)[keep])
    dropped = torch.ones(12, dtype=torch.bool)
    dropped[keep] = False
    assert not part[dropped].any() and other.abs().sum() > 0
    assert torch.equal(q(x), full)  # outside the block: whole again


def test_int8_draft_steps_of_uneven_lengths_keep_greedy_answers(tiny_int8, monkeypatch):
    """Drafts of different lengths per row in one step (padding positions the int8 matmuls skip), rejected drafts
    compacted out of the cache after every step: the tokens equal plain greedy decoding of the same engine."""
    from serving import drafts as engine_mod  # HOLES_SHARE: the draft steps' setting
    from serving.engine import BatchEngine

    m = tiny_int8
    prompts = [m.prompt_ids(GenRequest(messages=msgs(k))) for k in (1, 2, 3)]

    def run(draft_tokens, oracle=None):
        eng = BatchEngine(m.model, m.tokenizer, eos_ids=set(), max_context=256, max_batch=3, gather_ms=200,
                          draft_tokens=draft_tokens, draft_step_tokens=64)
        if oracle:
            eng._draft = oracle
        try:
            futs = [eng.submit(GenRequest(messages=(), max_new_tokens=24), p) for p in prompts]
            return [f.result(120) for f in futs], dict(eng.stats)
        finally:
            eng.close()

    plain, _ = run(0)
    want = [m.tokenizer(g.text, add_special_tokens=False)["input_ids"] for g in plain]
    calls = []

    def oracle(r, k):  # a test double: row i drafts i + 1 tokens of its true continuation, every other one wrong
        i = prompts.index(r.prompt_ids)
        true = want[i][len(r.out_ids):][:min(k, i + 1)]
        calls.append(i)
        if len(calls) % 2 and true:
            true = true[:-1] + [(true[-1] + 1) % 256]
        return true

    monkeypatch.setattr(engine_mod, "HOLES_SHARE", 0.0)
    drafted, stats = run(4, oracle)
    assert [g.text for g in drafted] == [g.text for g in plain]
    assert stats["draft_steps"] > 0 and stats["compactions"] > 0 and stats["steps"] < 24
    assert 0 < sum(g.draft_accepted for g in drafted) < sum(g.draft_tokens for g in drafted)


def _eager_rows(lin: Int8Linear, rows: torch.Tensor) -> torch.Tensor:
    saved, lin.native = lin.native, False
    try:
        return lin._rows(rows)
    finally:
        lin.native = saved


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the compiled int8 loops need gcc")
@pytest.mark.parametrize("bias", [True, False])
def test_compiled_int8_loops_are_bit_equal_to_the_eager_ops(bias):
    # EngineTuning.int8_native (on by default) must change no answer: every value equal to the eager rounding and
    # scaling, on rows that make rounding hard, at sizes the threads split (prefill) and do not (decode), odd widths
    # included.
    from serving import native

    assert native.available()
    torch.manual_seed(3)
    for k, n, m in ((96, 200, 37), (1536, 1000, 300), (77, 13, 1), (1536, 151936 // 8, 2)):
        lin = Int8Linear(torch.nn.Linear(k, n, bias=bias), native=True)
        assert lin.native
        x = torch.randn(m, k) * torch.logspace(-3, 3, m)[:, None]
        x[0, :] = 0.0  # all zero: the scale is clamped
        if m > 2:
            x[1, :] = 127.0 * torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5]).repeat(k)[:k]  # halves: round to even
            x[1, 0] = 127.0  # absmax 127: scale 1.0, so the halves stay halves
            x[2] = -x[2].abs()  # absmax from the minimum
        got, want = lin._rows(x), _eager_rows(lin, x)
        assert got.dtype == torch.float32 and got.shape == (m, n)
        assert torch.equal(got, want), (k, n, m)
        wide = torch.randn(m, k + 9)[:, 4:4 + k]  # a row stride wider than its length
        assert torch.equal(lin._rows(wide), _eager_rows(lin, wide.contiguous()))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the compiled int8 loops need gcc")
def test_a_model_gives_the_same_logits_with_and_without_the_compiled_loops(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = tiny_qwen2(vocab_size=256, intermediate_size=96, max_position_embeddings=128)
    path = make_random_model(cfg, tmp_path / "m")
    eager, native = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval() for _ in range(2))
    quantize_int8(eager, skip=(), native=False)
    quantize_int8(native, skip=())
    assert all(m.native for m in native.modules() if isinstance(m, Int8Linear))
    assert not any(m.native for m in eager.modules() if isinstance(m, Int8Linear))
    ids = torch.randint(0, 256, (3, 17))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row
    with torch.no_grad():
        assert torch.equal(eager(input_ids=ids, attention_mask=mask).logits,
                           native(input_ids=ids, attention_mask=mask).logits)


def test_without_a_compiler_int8_keeps_the_eager_ops_and_says_so(monkeypatch, capsys, tmp_path):
    from serving import native

    monkeypatch.setattr(native, "_libs", {})
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("FIXLAB_CACHE", str(tmp_path))  # no kernel built earlier is found
    lin = Int8Linear(torch.nn.Linear(32, 8), native=True)
    assert not lin.native and not native.available()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compiled kernels" in err[0] and "eager" in err[0], err
    x = torch.randn(4, 32)
    assert torch.equal(lin(x), _eager_rows(lin, x))


def test_the_output_layer_writes_into_one_reused_buffer_with_the_same_values_on_every_kernel():
    """int8.reuse_output (the engine's logits): inside it the lent module's large output goes to the pool's buffer,
    call after call, with the values a fresh tensor gets; another module and a small output are left alone."""
    from serving import native
    from serving.int8 import Int8Plan, OutputPool, onednn_available, reuse_output

    torch.manual_seed(5)
    lin = torch.nn.Linear(16, 131072, bias=True)  # 8 rows x 131072 float32s: 4 MiB, the pool's threshold
    kernels = ["torch"] + (["fixlab"] if native.available() else []) + (["onednn"] if onednn_available() else [])
    for kernel in kernels:
        head = Int8Linear(lin, native=native.available(), plan=Int8Plan(kernel, kernel))
        other = Int8Linear(lin, native=native.available(), plan=Int8Plan(kernel, kernel))
        pool = OutputPool()
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        want_x, want_y = head(x), head(y)
        with reuse_output(head, pool):
            got_x = head(x)
            assert torch.equal(got_x, want_x), kernel
            assert not torch.equal(other(y), got_x) and torch.equal(got_x, want_x)  # not lent: its own tensor
            small = head(x[:1])  # under the threshold: a tensor of its own
            got_y = head(y)
            assert torch.equal(got_y, want_y) and torch.equal(small, want_x[:1]), kernel
        if kernel != "onednn":  # oneDNN gives its own output tensor: the pool serves fixlab's and torch's kernels
            assert got_x.data_ptr() == got_y.data_ptr() == pool.buffer.data_ptr(), kernel


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux /proc")
def test_the_embedding_read_from_its_file_gives_the_same_rows_and_pages_none_in(mapped_model_dir):
    """The input embedding's rows by pread (embedding.py): the same values as torch's gather, bit for bit, and the
    mapping's pages stay unread however many tokens are embedded (read through the mapping they all became resident)."""
    from transformers import AutoModelForCausalLM

    from serving.embedding import FileRowsEmbedding, read_embedding_rows

    model = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
    table = model.get_input_embeddings().weight
    before = _mapped_rss(mapped_model_dir / "model.safetensors")
    assert read_embedding_rows(model)
    emb = model.get_input_embeddings()
    assert isinstance(emb, FileRowsEmbedding) and emb.weight.data_ptr() == table.data_ptr()
    ids = torch.arange(table.shape[0]).flip(0).reshape(4, -1)  # every row, in an order the file does not have
    got = emb(ids)
    assert _mapped_rss(mapped_model_dir / "model.safetensors") - before < table.numel() * 4 / 20
    assert torch.equal(got, torch.nn.functional.embedding(ids, table.detach().clone()))
    with pytest.raises(IndexError):
        emb(torch.tensor([table.shape[0]]))
    logits = model(torch.tensor([[5, 9, 300, 7]])).logits  # the model runs through it as before
    plain = AutoModelForCausalLM.from_pretrained(mapped_model_dir, dtype=torch.float32).eval()
    assert torch.equal(logits, plain(torch.tensor([[5, 9, 300, 7]])).logits)
    assert not read_embedding_rows(plain.to(torch.float64))  # a copy in memory, not a view of the file: left as is
    with torch.no_grad():
        emb.weight[7] = 2.0  # written in memory after the swap: the file no longer holds the table, the gather does
    assert torch.equal(emb(torch.tensor([7, 8])), torch.nn.functional.embedding(torch.tensor([7, 8]), emb.weight))
