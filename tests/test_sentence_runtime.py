"""The sentence encoder compiled by OpenVINO (embedder/sentence_runtime.py): the same embeddings as
sentence-transformers' torch forward, one text or a batch in any order, from many threads; and a
fallback to torch, with the reason, wherever the graph crashes in its probe child, is not
faithful, or is of a layout it does not compile."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import save_tiny_sentence_encoder

from embedder.sentence_encoder import SentenceEncoder

pytest.importorskip("openvino")

TEXTS = [
    "neural retrieval of documents",
    "a",
    "the boundary layer of a heated plate at high speed, measured twice " * 6,  # truncated at max_seq_length 64
    "Schrödinger and naïve tokens",
    "",
]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
    return save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st-runtime"), seed=3)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def torch_embeddings(model, texts: list[str]) -> np.ndarray:
    return np.asarray(model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False), np.float32)


def test_auto_compiles_and_gives_torchs_embeddings(st_dir, cache):
    enc = SentenceEncoder.load(st_dir)
    assert enc.runtime == "openvino", enc.runtime_reason
    assert enc.describe()["runtime"] == "openvino"
    want = torch_embeddings(enc.model, TEXTS)
    for texts in (TEXTS, TEXTS[::-1], TEXTS[2:3]):  # a batch (sorted by length inside, returned in order), reversed, one
        got = enc.encode(texts, batch_size=2)
        expected = want[[TEXTS.index(t) for t in texts]]
        assert got.shape == expected.shape and got.dtype == np.float32
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert (got * expected).sum(1).min() > 0.9999
    assert enc.encode([]).shape == (0, enc.dim)
    assert (cache / "runtimes").is_dir()  # the exported graph and its probe verdict are kept


def test_torch_runtime_is_plain_sentence_transformers(st_dir, cache):
    enc = SentenceEncoder.load(st_dir, runtime="torch")
    assert enc.runtime == "torch" and enc.compiled is None
    assert np.array_equal(enc.encode(TEXTS), torch_embeddings(enc.model, TEXTS))


def test_an_unknown_runtime_is_refused(st_dir):
    with pytest.raises(ValueError, match="runtime must be one of"):
        SentenceEncoder.load(st_dir, runtime="onnx")


def test_a_compile_that_kills_its_process_falls_back_to_torch(st_dir, cache, monkeypatch):
    from embedder.sentence_runtime import CompiledSentenceEncoder, SentenceRuntimeUnusable

    monkeypatch.setattr(CompiledSentenceEncoder, "probe_target", "_runtime_crashes:sentence_compile_that_crashes")
    enc = SentenceEncoder.load(st_dir)
    assert enc.runtime == "torch"
    assert "killed by SIGFPE" in enc.runtime_reason
    assert np.array_equal(enc.encode(TEXTS[:2]), torch_embeddings(enc.model, TEXTS[:2]))
    with pytest.raises(SentenceRuntimeUnusable, match="killed by SIGFPE"):
        SentenceEncoder.load(st_dir, runtime="openvino")


def test_a_graph_that_is_not_faithful_is_not_used(st_dir, cache, monkeypatch):
    import embedder.sentence_runtime as sr

    # what a wrong kernel does to a graph: its embeddings rotate away from torch's
    real = sr.CompiledSentenceEncoder.encode

    def skewed(self, texts, batch_size=32, normalize=True, progress=False):
        out = real(self, texts, batch_size, normalize, progress)
        return np.roll(out, 1, axis=1)

    monkeypatch.setattr(sr.CompiledSentenceEncoder, "encode", skewed)
    enc = SentenceEncoder.load(st_dir)
    assert enc.runtime == "torch"
    assert "cosine to torch's embeddings" in enc.runtime_reason


def test_a_layout_it_does_not_compile_stays_on_torch(tmp_path, cache):
    from sentence_transformers import SentenceTransformer

    from embedder.sentence_runtime import SentenceRuntimeUnusable, graph_parts

    base = SentenceTransformer(str(save_tiny_sentence_encoder(tmp_path / "m", seed=4)), device="cpu")
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:
        from sentence_transformers.models import Pooling
    maxed = SentenceTransformer(modules=[base[0], Pooling(32, "max")], device="cpu")
    with pytest.raises(SentenceRuntimeUnusable, match="pooling 'max'"):
        graph_parts(maxed)
    enc = SentenceEncoder(maxed, {"name": "max-pooled", "sha256": "0" * 64}, runtime="auto")
    assert enc.runtime == "torch" and "pooling 'max'" in enc.runtime_reason


def test_many_threads_get_their_own_requests(st_dir, cache):
    enc = SentenceEncoder.load(st_dir)
    assert enc.runtime == "openvino"
    want = {t: enc.encode([t])[0] for t in TEXTS}
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(25):
            t = TEXTS[int(rng.integers(len(TEXTS)))]
            if not np.allclose(enc.encode([t])[0], want[t], atol=1e-5):
                errors.append(t)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


@pytest.mark.parametrize(
    "flags",
    [("avx2", "fma"), ("avx2", "avx512f", "avx512_bf16"), ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")],
    ids=["avx2", "avx512-bf16", "amx"],
)
def test_fp32_is_asked_for_on_every_cpu(st_dir, cache, monkeypatch, flags):
    """Documents encoded by torch must keep matching: no CPU (an AMX one would pick bf16 by itself) changes the precision."""
    import embedder.sentence_runtime as sr
    from embedder.hardware import Capability

    cap = Capability("cpu", "mocked", flags, native_bf16="avx512_bf16" in flags)
    monkeypatch.setattr(sr, "cpu_capability", lambda: cap)
    enc = SentenceEncoder.load(st_dir)
    assert enc.runtime == "openvino"
    assert enc.compiled.config["INFERENCE_PRECISION_HINT"] == "f32"


def test_token_states_are_torchs_in_both_runtimes(st_dir, cache):
    compiled, plain = SentenceEncoder.load(st_dir), SentenceEncoder.load(st_dir, runtime="torch")
    assert compiled.runtime == "openvino", compiled.runtime_reason
    texts = TEXTS[:4]
    emb_c, states_c, mask_c = compiled.encode_with_tokens(texts)
    emb_t, states_t, mask_t = plain.encode_with_tokens(texts)
    np.testing.assert_array_equal(mask_c, mask_t)
    assert states_c.shape == (len(texts), mask_c.shape[1], compiled.dim)
    real = mask_t.astype(bool)
    np.testing.assert_allclose(states_c[real], states_t[real], rtol=1e-4, atol=1e-4)
    # the embedding is the one encode() gives
    np.testing.assert_allclose(emb_c, compiled.encode(texts), atol=1e-5)
    np.testing.assert_allclose(emb_t, plain.encode(texts), atol=1e-5)
    with pytest.raises(ValueError, match="no texts"):
        plain.encode_with_tokens([])
