"""The path a local model takes, chosen by measuring the machine (serving/paths.py), and fixlab's int8 matmul
(serving/kernels.c section 3). What users rely on: the fastest measured path is taken, torch's int8 is never
taken where it is a reference loop, an explicit setting is obeyed (with one warning line where it was measured much
slower), every int8 kernel gives exactly torch._int_mm's values on every build this CPU runs, the path is a recorded
parameter of the run, and a job that works for minutes without finishing a task still says so."""
from __future__ import annotations

import os
import shutil

import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agents.models.config import TransformersModelConf  # noqa: E402
from serving import EngineTuning, native, paths, runtime  # noqa: E402
from serving.int8 import Int8Linear, Int8Plan  # noqa: E402
from tiny_models import make_random_model, tiny_qwen2  # noqa: E402

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="the compiled kernels need gcc")

# an AVX2-only CPU as measured (the EPYC Zen 3, ms a step): torch._int_mm a reference loop, cut at one row
AVX2_ONLY = {"int8:fixlab": {1: 40.0, 8: 90.0, 32: 360.0, 128: 1400.0, 512: 4600.0},
             "int8:torch": {1: 1800.0},
             "float32": {1: 120.0, 8: 250.0, 32: 1100.0, 128: 4000.0, 512: 12000.0}}
# an AMX machine (this session's Xeon): fixlab's kernel wins at few rows, torch's (AMX) at many
AMX = {"int8:fixlab": {1: 32.0, 4: 34.0, 8: 38.0, 16: 54.0, 32: 93.0, 64: 167.0, 512: 1034.0},
       "int8:torch": {1: 64.0, 4: 64.0, 8: 65.0, 16: 70.0, 32: 84.0, 64: 117.0, 512: 648.0},
       "float32": {1: 121.0, 32: 368.0, 512: 3685.0},
       "bfloat16": {1: 98.0, 32: 132.0, 512: 682.0}}


def test_the_chooser_takes_the_fastest_path_and_never_torchs_int8_where_it_is_a_reference_loop():
    c = paths.choose(AVX2_ONLY)
    assert c.weights == "int8" and c.int8["small"] == c.int8["large"] == "fixlab"
    assert "int8 89" in c.reason and "float32 29" in c.reason  # tokens/s at 32 rows, fastest first
    c = paths.choose(AMX)
    assert c.weights == "int8" and (c.int8["small"], c.int8["large"], c.int8["split"]) == ("fixlab", "torch", 16)
    plan = Int8Plan(**{**c.int8, "isa": None})
    assert [plan.kernel(m) for m in (1, 16, 17, 32, 512)] == ["fixlab", "fixlab", "torch", "torch", "torch"]
    # a kernel that wins at few rows by little is not worth a second copy of the weights: one layout
    close = {"int8:fixlab": {1: 98.5, 8: 161.0, 32: 228.6}, "int8:onednn": {1: 120.1, 8: 121.3, 32: 160.6}}
    assert paths.choose(close).int8 == {"small": "onednn", "large": "onednn", "split": 0, "isa": None}
    # where float32 is the fastest (an ARM machine whose int8 is the portable loops), int8 is not taken
    arm = {"int8:fixlab": {1: 300.0, 32: 2000.0}, "float32": {1: 100.0, 32: 400.0}, "bfloat16": {1: 60.0, 32: 200.0}}
    c = paths.choose(arm)
    # bf16 was faster still, but its answers do not repeat across batches: shown, not chosen
    assert (c.weights, c.dtype, c.int8) == ("dtype", "float32", None)
    assert "bfloat16 (does not repeat) 160" in c.reason
    # only torch's int8 and float32, torch's int8 a reference loop: float32
    c = paths.choose({"int8:torch": {1: 1800.0}, "float32": {1: 120.0, 32: 1100.0}})
    assert (c.weights, c.dtype) == ("dtype", "float32")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_random_model(tiny_qwen2(), tmp_path_factory.mktemp("tiny-paths")))


def test_the_paths_timed_follow_the_cpus_capabilities(monkeypatch):
    from serving import int8

    real_onednn = int8.onednn_available
    monkeypatch.setattr(native, "available", lambda: True)
    monkeypatch.setattr(int8, "onednn_available", lambda: False)  # a torch without oneDNN's int8 ops
    plain = {"model": "x", "arch": "x86_64", "flags": ["avx2", "fma"], "cores": 2}
    assert paths.matmul_paths(plain) == ["int8:fixlab", "int8:torch", "float32"]  # no bf16 in hardware: not timed
    monkeypatch.setattr(int8, "onednn_available", lambda: True)  # with them: oneDNN's packed int8 is timed too
    assert paths.matmul_paths(plain) == ["int8:fixlab", "int8:torch", "int8:onednn", "float32"]
    bf16 = {**plain, "flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    assert paths.matmul_paths(bf16)[-1] == "bfloat16"
    arm = {"model": "Neoverse", "arch": "aarch64", "flags": ["asimd", "bf16"], "cores": 2}
    assert "bfloat16" in paths.matmul_paths(arm)
    monkeypatch.setattr(native, "FORCED_ISA", "avx2")  # as an AVX2-only CPU: torch's int8 and bf16 are left out
    assert paths.matmul_paths(bf16) == ["int8:fixlab", "float32"]
    monkeypatch.setattr(native, "available", lambda: False)  # no compiler: fixlab's kernel is not a path
    monkeypatch.setattr(native, "FORCED_ISA", None)
    monkeypatch.setattr(int8, "onednn_available", real_onednn)  # nor oneDNN's (it needs fixlab's scaling loop)
    assert paths.matmul_paths(plain) == ["int8:torch", "float32"]


def _conf(path, **kw) -> TransformersModelConf:
    return TransformersModelConf(name="tiny", path=path, dtype="float32", max_batch=2, **kw)


@needs_gcc
def test_auto_measures_once_then_reads_the_cache_and_an_explicit_setting_is_obeyed_with_a_warning(
        tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIXLAB_CACHE", str(tmp_path / "cache"))
    cpu = torch.device("cpu")
    cfg = _conf(tiny, weights="auto")
    assert paths.will_measure(cfg, 1)  # nothing cached: a job builds it before starting its Prefect server
    capsys.readouterr()
    c = paths.resolve(cfg, cpu, 1)
    err = capsys.readouterr().err
    assert "measuring this machine's matmul paths" in err and "int8:fixlab" in err
    assert c.weights in ("int8", "dtype") and "matmuls alone at 32 rows" in c.reason
    assert list((tmp_path / "cache" / "paths").glob("*.json"))
    again = paths.resolve(cfg, cpu, 1)
    assert capsys.readouterr().err == "" and again.record() == c.record()  # from the cache, same decision
    assert not paths.will_measure(cfg, 1) and paths.will_measure(cfg, 2)  # cached per thread count
    assert not paths.will_measure(_conf(tiny, weights="dtype"), 2)  # nothing measured at all
    # an explicit int8 kernel is obeyed; measured >= 5x slower than the best here, it says so in one line
    key = paths.cache_key(paths.shapes_for(cfg), "matmuls", {"threads": 1})[0]
    slow = {"int8:fixlab": {1: 1.0, 32: 10.0}, "int8:torch": {1: 100.0}, "float32": {1: 2.0, 32: 20.0}}
    paths.write_cached(key, {}, {"matmul_ms": slow})
    c = paths.resolve(_conf(tiny, weights="int8"), cpu, 1, EngineTuning(int8_kernel="torch"))
    assert c.int8["small"] == c.int8["large"] == "torch"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning: int8_kernel=torch" in err[0] and "slower" in err[0], err
    # weights=dtype is not measured at all
    c = paths.resolve(_conf(tiny, weights="dtype"), cpu, 1)
    assert (c.weights, c.dtype) == ("dtype", "float32") and capsys.readouterr().err == ""


def test_a_wrong_int8_kernel_or_runtime_is_one_line(tiny):
    from serving import build as build_model
    from serving.hf import BadModelConfig

    with pytest.raises(BadModelConfig, match="unknown int8_kernel 'fast'"):
        paths.resolve(_conf(tiny, weights="int8"), torch.device("cpu"), 1, EngineTuning(int8_kernel="fast"))
    with pytest.raises(BadModelConfig, match="unknown runtime 'vllm'"):
        build_model(_conf(tiny, runtime="vllm"))
    with pytest.raises(BadModelConfig, match="runtime=llamacpp serves a registry pack"):
        build_model(_conf(tiny, runtime="llamacpp"))


def _runnable_isas() -> list[str]:
    return native.runnable_isas()


# the 1.5B pack's shapes (q, k/v, o, gate/up, down; a slice of the output layer), and remainders in rows, columns
# and K (a panel is 48 columns on AVX-512 VNNI, 24 on AVX2; K is padded to 4)
SHAPES = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (1000, 1536), (1537, 97), (5, 3)]
ROWS = list(range(1, 18)) + [31, 32, 33, 63, 64]


@needs_gcc
@pytest.mark.parametrize("isa", _runnable_isas())
def test_fixlab_int8_matmul_gives_exactly_the_int_mm_values_on_every_build(isa):
    g = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        packed = native.PackedInt8(w, isa)
        ws, bias = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
        big = n * k > 2_000_000
        for m in (ROWS if not big or isa != "portable" else [1, 5, 33]):
            x = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
            xs = torch.rand(m, 1, generator=g) + 0.5
            # exact integer sums (float64 holds them exactly), scaled by the eager ops' order
            acc = (x.double() @ w.double().t()).to(torch.int32)
            want = acc.float().mul_(xs).mul_(ws).add_(bias)
            got = packed.matmul(x, xs, ws, bias)
            assert torch.equal(got, want), (isa, n, k, m)
        assert torch.equal(packed.matmul(x, xs, ws, None), acc.float().mul_(xs).mul_(ws))


def test_the_kernels_build_once_on_their_own_thread_and_library_waits_for_that_build(monkeypatch):
    """A first job compiles the kernels while its weights install and convert (devices.weights_source starts
    build_beside before it installs a pack): one build, on its own thread, which library() waits for."""
    import threading

    started, release, builds = threading.Event(), threading.Event(), []

    def slow_build(isa):
        builds.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return "the one build"

    monkeypatch.setattr(native, "_libs", {})
    monkeypatch.setattr(native, "_build", slow_build)
    monkeypatch.setattr(native, "_beside", None)
    thread = native.build_beside()
    assert thread is not None and started.wait(10)
    assert native.build_beside() is None  # a second ask while the first build compiles starts no other thread
    threading.Timer(0.2, release.set).start()
    assert native.library() == "the one build"  # waited for the thread's build
    thread.join(10)
    assert builds == ["fixlab-kernels-build"]
    assert native.build_beside() is None  # built in this process: nothing to start


@needs_gcc
def test_int8_linear_gives_the_same_values_with_either_kernel_at_any_rows():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200)
    x = torch.randn(40, 96) * torch.linspace(0.1, 10, 40)[:, None]
    ref = Int8Linear(lin, native=True)(x)
    for plan in (Int8Plan("fixlab", "fixlab"), Int8Plan("fixlab", "torch", 8), Int8Plan("torch", "fixlab", 3)):
        q = Int8Linear(lin, native=True, plan=plan)
        assert torch.equal(q(x), ref), plan
        assert torch.equal(torch.cat([q(x[i:i + 5]) for i in range(0, 40, 5)]), ref), plan  # small inputs too
        assert (q.qweight is None) == ("torch" not in plan.kernels)  # only the layouts a plan uses are kept
        assert (q.packed is None) == ("fixlab" not in plan.kernels)


def test_a_job_that_finishes_no_task_for_a_while_prints_a_heartbeat(capsys):
    import time

    from flows.job import Progress

    state = {"rows": 3, "waiting": 1, "tokens": 0, "prefilled": 0}

    def activity():
        state["tokens"] += 20
        state["prefilled"] += 100
        return dict(state)

    p = Progress(10, activity=activity, every=0.2)
    try:
        time.sleep(0.9)
    finally:
        p.close()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "still working" in ln]
    assert len(lines) >= 2, lines
    assert "[   0/10] still working" in lines[0] and "3 rows in flight, 1 waiting" in lines[0]
    assert "tokens/s decoded over the last 0 s" in lines[0] and "prefilled)" in lines[0] and "0 tasks done" in lines[0]


def test_the_path_is_a_recorded_parameter_and_part_of_the_cache_identity(tiny):
    from serving import build as build_model
    from flows.cache import model_identity

    cfg = _conf(tiny, weights="dtype")
    model = build_model(cfg)
    try:
        rec = model.choice.record()
        assert rec == {"runtime": "engine", "weights": "dtype", "dtype": "float32", "deterministic": True}
        # whether the path repeats describes it; it does not make another configuration
        assert runtime.recorded(cfg) == rec
        assert model_identity(cfg)["serving"] == {k: v for k, v in rec.items() if k != "deterministic"}
    finally:
        model.close()


def test_the_races_token_mix_is_a_parameter_not_the_newest_file():
    """The runtime races weigh decode and prefill by a job's token mix: make eval's as recorded by default, any other
    as a parameter; a fresh clone (every file the same age) or a new results file changes nothing."""
    rates = {"decode": 100.0, "prefill": 1000.0}
    assert runtime.job_seconds(rates, mix=(100, 1000, "a test job")) == 2.0
    completion, prefill, where = runtime.JOB_MIX
    assert (completion, prefill) == (43434, 54842) and "2026-11-28" in where
    assert runtime.job_seconds(rates) == completion / 100 + prefill / 1000


@needs_gcc
def test_onednn_packed_int8_matmul_gives_exactly_the_int_mm_values():
    """oneDNN's int8 matmul over its own packing of the weights (Int8Plan kernel "onednn"): the same values as the
    other kernels at every width the engine feeds it (1 row, decode, draft steps, prefill groups), with and without
    bias, so a plan that takes it changes no answer."""
    from serving.int8 import Int8Linear, Int8Plan, onednn_available

    if not onednn_available():
        pytest.skip("this torch has no oneDNN int8 ops, or their sums are not exact on this CPU")
    g = torch.Generator().manual_seed(1)
    shapes = SHAPES
    probe = Int8Linear(torch.nn.Linear(1536, 1536), native=True, plan=Int8Plan("onednn", "onednn"))
    x = torch.randn(1, 1536, generator=g)
    probe(x)
    t0 = time.perf_counter()
    probe(x)
    if time.perf_counter() - t0 > 0.05:  # a reference loop here (the 2-core Zen 4: 38 s where fixlab's took 0.07):
        shapes = [(96, 64), (256, 1536)]  # the same calls on small matrices, or the suite would run for hours
    for n, k in shapes:
        for bias in (True, False):
            lin = torch.nn.Linear(k, n, bias=bias)
            ref = Int8Linear(lin, native=True, plan=Int8Plan("torch", "torch"))
            one = Int8Linear(lin, native=True, plan=Int8Plan("onednn", "onednn"))
            mixed = Int8Linear(lin, native=True, plan=Int8Plan("fixlab", "onednn", 32))
            for m in (1, 7, 32, 33, 130, 896 if n * k < 20_000_000 else 300):
                x = torch.randn(m, k, generator=g) * 3
                want = ref(x)
                assert torch.equal(one(x), want), (n, k, m, bias)
                assert torch.equal(mixed(x), want), (n, k, m, bias)


def test_onednn_is_an_int8_kernel_only_where_its_sums_are_exact():
    """On a CPU that multiplies bytes into int32 lanes (VNNI, AMX) oneDNN's int8 sums are exact and it is a kernel;
    on an AVX2-only one its 16-bit pair sums saturate (a Zen 3: outputs off by about 1 against torch._int_mm), so it
    is neither timed nor chosen there."""
    from serving import int8, machine

    if not hasattr(torch.ops.onednn, "qlinear_prepack") or not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN int8 ops")
    flags = set(machine.cpu()["flags"])
    assert int8._onednn_exact() == bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    if not int8._onednn_exact() and native.available():
        assert "int8:onednn" not in paths.matmul_paths()


def test_the_int8_paths_are_timed_over_the_matrices_the_engine_multiplies():
    """The calibration's int8 figures time the engine's own calls: one matrix per Int8Group (q, k, v stacked; gate, up
    stacked) and the rest one each, the same multiply-adds as the seven linears the float32 path times."""
    from transformers import AutoModelForCausalLM

    from serving.int8 import Int8Group, quantize_int8

    config = tiny_qwen2()
    shapes = paths.model_shapes(config)
    model = AutoModelForCausalLM.from_config(config).eval()
    quantize_int8(model, group=True)
    layer = model.model.layers[0]
    called = []  # (out, in) of each int8 kernel call a layer makes, in order
    for mod in layer.modules():
        if isinstance(mod, Int8Group):
            called.append((mod.linear.out_features, mod.linear.in_features))
        elif isinstance(mod, Int8Linear) and not any(g.linear is mod for g in layer.modules()
                                                     if isinstance(g, Int8Group)):
            called.append((mod.out_features, mod.in_features))
    assert sorted(paths.layer_shapes(shapes, "int8:fixlab")) == sorted(called)
    assert len(called) == 4 and len(paths.layer_shapes(shapes, "float32")) == 7
    assert sum(n * k for n, k in called) == sum(n * k for n, k in paths.layer_shapes(shapes, "float32"))


def test_a_path_cut_at_its_probe_is_made_once_and_a_kept_one_gets_all_its_copies(monkeypatch):
    """A first use must not spend seconds on a reference loop: a path after the first is probed on one copy of the
    layer before its other copies and its output layer are made, and one CUT times slower than the best stops there."""
    shapes = {"layer": [(8, 8)] * 7, "int8_layer": [(8, 8)] * 4, "layers": 2, "head": (16, 8)}
    made = []  # (path, matrices, copies) of each _linears call

    def linears(path, mats, copies):
        made.append((path, len(mats), copies))
        pause = 0.05 if path == "int8:slow" else 0.001  # slow: 50x the others, a reference loop
        return [[(lambda x, pause=pause: time.sleep(pause)) for _ in mats] for _ in range(copies)]

    monkeypatch.setattr(paths, "_linears", linears)
    monkeypatch.setattr(paths, "_stream_bytes", lambda: 4 * 8 * 8 * 4)  # 4 copies of the int8 layer
    table = paths.calibrate_matmuls(shapes, paths=["int8:fast", "int8:slow", "int8:also"], rows=(1, 8))
    assert list(table["int8:slow"]) == [1] and set(table["int8:fast"]) == set(table["int8:also"]) == {1, 8}
    assert made == [("int8:fast", 4, 4), ("int8:fast", 8, 1),  # the first path: its copies, then its output layer
                    ("int8:slow", 4, 1),  # probed on one copy, cut: no more copies, no output layer
                    ("int8:also", 4, 1), ("int8:also", 4, 3), ("int8:also", 8, 1)]  # kept: the rest, the head


@pytest.mark.parametrize("weights", ["auto", "int8", "dtype"])
def test_a_job_is_told_it_measures_first_exactly_when_resolving_times_the_paths(tiny, tmp_path, monkeypatch, weights):
    """flows/job.py starts Prefect's server after the build when will_measure says the build times this machine's
    paths (so the server's start-up does not fall on the timings), beside it otherwise: the two must agree for every
    setting of the weights, the int8 kernel and the compiled loops."""
    from serving.tuning import EngineTuning

    monkeypatch.setenv("FIXLAB_CACHE", str(tmp_path / "cache"))  # nothing cached

    class Timed(Exception):
        pass

    def timing(cfg, threads):
        raise Timed

    monkeypatch.setattr(paths, "matmul_choice", timing)
    for kernel in ("auto", "fixlab", "torch"):
        for native_loops in (True, False):
            tuning = EngineTuning(int8_kernel=kernel, int8_native=native_loops)
            cfg = _conf(tiny, weights=weights)
            try:
                paths.resolve(cfg, torch.device("cpu"), 1, tuning)
                timed = False
            except Timed:
                timed = True
            except Exception:  # a setting resolve refuses (fixlab's kernel without the compiled loops) times nothing
                timed = False
            assert paths.will_measure(cfg, 1, tuning) == timed, (weights, kernel, native_loops)
