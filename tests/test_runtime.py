"""Encoder runtimes (issue 10): the precision chosen from the hardware (capability mocked, never
timed), the template prefix computed once, and the OpenVINO export against the fp32 reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from embedder.encoder import EmbedderConfig
from embedder.hardware import Capability, choose_precision, cpu_capability, speed_candidates
from embedder.prefix_cache import PrefixCachedBody
from embedder.runtime import OpenVINORuntime, TorchRuntime

AVX2 = Capability("cpu", "AMD EPYC", ("avx2", "fma"), native_bf16=False)
AVX512 = Capability("cpu", "Intel Xeon", ("avx2", "fma", "avx512f", "avx512_vnni"), native_bf16=False)
AVX512_BF16 = Capability("cpu", "AMD EPYC 9R14", ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"), native_bf16=True)
AMX = Capability("cpu", "Intel Xeon Sapphire Rapids", ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"), native_bf16=True)
GPU = Capability("cuda", "NVIDIA H100", (), native_bf16=True)
OLD_GPU = Capability("cuda", "Tesla T4", (), native_bf16=False)

TEXTS = [
    "The cat sat on the mat near the river.",
    "Computer memory and the game of chess",
    "a",
    "snow " * 40,
    "A puzzle for the team, solved by the dog and the cat at night in the old library.",
]


# ------------------------------------------------------------------ precision selection
@pytest.mark.parametrize("cap", [AVX2, AVX512])
@pytest.mark.parametrize("have_openvino", [True, False])
@pytest.mark.parametrize("runtime", ["auto", "torch"])
def test_auto_never_considers_bf16_without_native_bf16(cap, have_openvino, runtime):
    candidates, skipped = speed_candidates(cap, runtime, have_openvino)
    assert all(dtype != "bf16" for _, dtype in candidates)  # emulated: ~5x slower, never even timed
    assert any(s.startswith("bf16: emulated") for s in skipped)
    p = choose_precision("auto", runtime, cap, have_openvino)
    # more than one candidate: measured on the machine at first use (tests/test_speed_probe.py)
    assert (p.runtime, p.dtype) == (("auto", "auto") if have_openvino and runtime == "auto" else ("torch", "fp32"))


@pytest.mark.parametrize("cap", [AVX512_BF16, AMX])
@pytest.mark.parametrize("have_openvino", [True, False])
def test_auto_measures_bf16_where_native_rather_than_assuming_it(cap, have_openvino):
    p = choose_precision("auto", "auto", cap, have_openvino)
    assert (p.runtime, p.dtype) == ("auto", "auto") and "speed probe" in p.reason
    candidates, _ = speed_candidates(cap, "auto", have_openvino)
    assert ("torch", "bf16") in candidates and (("openvino", "bf16") in candidates) == have_openvino


def test_gpu_runs_torch_in_bf16_only_where_native():
    assert (choose_precision("auto", "auto", GPU, True).runtime, choose_precision("auto", "auto", GPU, True).dtype) == ("torch", "bf16")
    assert choose_precision("auto", "auto", OLD_GPU, True).dtype == "fp32"
    with pytest.raises(ValueError, match="CPU only"):
        choose_precision("int8", "auto", GPU, True)


def test_explicit_requests_and_their_errors():
    assert choose_precision("fp32", "torch", AVX2, True).dtype == "fp32"
    assert choose_precision("bf16", "torch", AVX2, True).reason.startswith("requested (emulated")  # allowed, but said
    assert choose_precision("int8", "auto", AVX2, True).runtime == "openvino"
    with pytest.raises(ValueError, match="needs runtime openvino"):
        choose_precision("int8", "torch", AVX2, True)
    with pytest.raises(ValueError, match="openvino package"):
        choose_precision("int8", "auto", AVX2, False)
    with pytest.raises(ValueError, match="not installed"):
        choose_precision("fp32", "openvino", AVX2, False)
    with pytest.raises(ValueError, match="dtype must be one of"):
        choose_precision("fp16", "auto", AVX2, True)


def test_cpu_capability_reads_the_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx avx2 fma avx512f\n\nprocessor\t: 1\n")
    cap = cpu_capability(info)
    assert cap.name == "AMD EPYC 9R14" and cap.flags == ("avx2", "fma", "avx512f") and not cap.native_bf16
    info.write_text("model name\t: Intel Xeon\nflags\t\t: avx2 fma avx512f avx512_bf16 amx_bf16 amx_int8\n")
    cap = cpu_capability(info)
    assert cap.native_bf16 and "amx_bf16" in cap.flags and "native bf16: yes" in cap.describe()
    info.write_text("model name\t: AMD EPYC 9R14\nflags\t\t: avx2 fma avx512f avx512_vnni avx512_bf16\n")  # AVX512-BF16 without AMX
    cap = cpu_capability(info)
    assert cap.native_bf16 and "avx512_bf16" in cap.flags and "amx_bf16" not in cap.flags


# ------------------------------------------------------------------ prefix computed once
def _padded(rows, pad=0):
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return ids, mask


def test_prefix_cached_body_equals_the_full_forward(tiny_embedder):
    body = tiny_embedder.causal_lm.base_model
    prefix = tiny_embedder._prefix
    rows = tiny_embedder.prompt_ids(TEXTS)
    assert all(r[: len(prefix)] == prefix for r in rows)
    ids, mask = _padded(rows)
    with torch.no_grad():
        full = body(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
        cached_ids, cached_mask = _padded([r[len(prefix) :] for r in rows])
        part = PrefixCachedBody(body, prefix)(torch.from_numpy(cached_ids), torch.from_numpy(cached_mask))
    for i, r in enumerate(rows):  # every real position after the prefix, padded rows included
        n = len(r) - len(prefix)
        torch.testing.assert_close(part[i, :n], full[i, len(prefix) : len(r)], atol=1e-5, rtol=1e-4)


def test_torch_runtime_embeddings_equal_the_plain_path(tiny_embedder, make_embedder):
    plain = tiny_embedder.embed(TEXTS)
    fast = make_embedder(EmbedderConfig(max_length=64, batch_size=4), runtime="torch", dtype="fp32")
    assert fast.runtime().prefix_len == len(fast._prefix) > 0
    np.testing.assert_allclose(fast.embed(TEXTS), plain, atol=1e-4, rtol=1e-4)
    # one text at a time (the query path) gives the same as batched
    np.testing.assert_allclose(np.concatenate([fast.embed([t]) for t in TEXTS]), plain, atol=1e-4, rtol=1e-4)


def test_no_prefix_cache_where_the_prefix_depends_on_the_text(make_embedder):
    for config in (EmbedderConfig(attention="bidirectional"), EmbedderConfig(pooling="mean")):
        ref = make_embedder(config).embed(TEXTS)
        fast = make_embedder(config, runtime="torch", dtype="fp32")
        assert fast.runtime().prefix_len == 0
        np.testing.assert_allclose(fast.embed(TEXTS), ref, atol=1e-4, rtol=1e-4)


def test_torch_bf16_casts_once_and_stays_close(tiny_embedder, make_embedder):
    fast = make_embedder(EmbedderConfig(max_length=64, batch_size=4), runtime="torch", dtype="bf16")
    rt = fast.runtime()
    assert isinstance(rt, TorchRuntime) and next(rt.module.parameters()).dtype == torch.bfloat16
    assert next(fast.causal_lm.parameters()).dtype == torch.float32  # the model itself is untouched
    a, b = fast.embed(TEXTS), tiny_embedder.embed(TEXTS)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99


# ------------------------------------------------------------------ OpenVINO
@pytest.fixture
def openvino():
    return pytest.importorskip("openvino")


def test_openvino_runtime_matches_the_reference_and_is_exported_once(openvino, tiny_embedder, tmp_path):
    pytest.importorskip("nncf")
    body = tiny_embedder.causal_lm.base_model
    rows = tiny_embedder.prompt_ids(TEXTS)
    ref = tiny_embedder.embed(TEXTS)
    for dtype, floor in (("fp32", 0.99999), ("int8", 0.99)):
        rt = OpenVINORuntime(body, dtype, tiny_embedder.identity, None, tiny_embedder._prefix, threads=1, cache_root=tmp_path)
        ids, mask = _padded([r[rt.prefix_len :] for r in rows])
        h = rt.hidden(ids, mask).numpy()
        pooled = h[np.arange(len(rows)), [len(r) - rt.prefix_len - 1 for r in rows]]
        cos = (pooled * ref).sum(1) / np.linalg.norm(pooled, axis=1) / np.linalg.norm(ref, axis=1)
        assert cos.min() > floor, (dtype, cos)
    exported = sorted(p for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert len(exported) == 2  # one graph per weight precision, nothing half-written beside them
    stamp = {p: (p / "model.xml").stat().st_mtime_ns for p in exported}
    OpenVINORuntime(body, "fp32", tiny_embedder.identity, None, tiny_embedder._prefix, threads=1, cache_root=tmp_path)
    assert {p: (p / "model.xml").stat().st_mtime_ns for p in exported} == stamp  # reused, not re-exported


def test_openvino_graphs_are_keyed_by_weights_and_precision(openvino, make_embedder, tmp_path):
    from embedder.runtime import graph_directory

    a, b = make_embedder(seed=0), make_embedder(seed=1)
    key = lambda e, dtype, prefix: graph_directory(e.causal_lm.base_model, dtype, {"name": "in-memory"}, None, prefix, tmp_path)
    assert key(a, "fp32", a._prefix) != key(b, "fp32", b._prefix)  # other weights
    assert key(a, "fp32", a._prefix) != key(a, "int8", a._prefix)  # other weight precision
    assert key(a, "fp32", a._prefix) != key(a, "fp32", None)  # prefix baked in or not
    assert key(a, "fp32", a._prefix) == key(a, "bf16", a._prefix)  # bf16 is a compile-time hint on the fp32 graph
    assert key(a, "fp32", a._prefix) == key(make_embedder(seed=0), "fp32", a._prefix)  # same weights, same graph


def test_the_int8_recipe_keys_the_graph_and_the_embedding_cache(openvino, make_embedder, tmp_path, monkeypatch):
    from embedder import runtime
    from embedder.cache import embedder_key

    e = make_embedder(seed=0)
    e.dtype, e.runtime_name = "int8", "openvino"
    monkeypatch.setattr(e, "resolve_runtime", lambda: None)
    key = lambda dtype: runtime.graph_directory(e.causal_lm.base_model, dtype, {"name": "in-memory"}, None, e._prefix, tmp_path)
    before = (key("int8"), key("fp32"), embedder_key(e), runtime.int8_recipe_id())
    monkeypatch.setattr(runtime, "INT8_FP32_WEIGHTS", (r".*mlp\.down_proj.*",))  # another int8 graph, other embeddings
    assert runtime.int8_recipe_id() != before[3]
    assert key("int8") != before[0] and embedder_key(e) != before[2]
    assert key("fp32") == before[1]  # the fp32 graph (and bf16 on it) does not depend on int8's recipe


def test_manifest_records_runtime_and_capability(toy_corpus, tiny_model_dir, tmp_path, capsys):
    from indexer import cli as build_cli
    from indexer.manifest import Manifest

    # a channel the LLM encodes (the default index reads none since issue 71)
    args = ["--corpus", str(toy_corpus), "--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "16", "--channels", "sparse,bm25"]
    assert build_cli.main([*args, "--index", str(tmp_path / "a"), "--dtype", "fp32", "--runtime", "torch"]) == 0
    out = capsys.readouterr().out
    assert "encoder: torch fp32 (requested)" in out and "native bf16:" in out
    m = Manifest.read(tmp_path / "a")
    assert m.runtime["name"] == "torch" and m.runtime["dtype"] == "fp32"
    assert m.runtime["capability"]["device"] == "cpu" and "native_bf16" in m.runtime["capability"]


def test_embedding_cache_keys_differ_by_precision(make_embedder):
    from embedder.cache import embedder_key

    fp32 = make_embedder(runtime="torch", dtype="fp32")
    bf16 = make_embedder(runtime="torch", dtype="bf16")
    plain = make_embedder()
    assert len({embedder_key(fp32), embedder_key(bf16), embedder_key(plain)}) == 3


def test_an_int8_export_writes_nothing_on_stdout(openvino, make_embedder, tmp_path, capsys):
    # NNCF's progress bar once landed inside `diagnose --json`'s output (tests/test_llm2comp.py failed
    # whenever that test was the first to export an int8 graph)
    from embedder.runtime import exported_graph

    e = make_embedder(seed=3)
    capsys.readouterr()
    directory = exported_graph(e.causal_lm.base_model, "int8", {"name": "in-memory"}, None, e._prefix, tmp_path)
    assert (directory / "model.xml").is_file()
    assert capsys.readouterr().out == ""
