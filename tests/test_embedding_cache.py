"""CachedEmbedder: document embeddings reused across index builds, never stale."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedder.cache import CachedEmbedder, embedder_key
from indexer.build import DOC_IDS, build_index
from indexer.dense import DenseIndex
from indexer.inverted_index import InvertedIndex
from indexer.manifest import Manifest


def doc_texts(docs: list[dict]) -> list[str]:
    return [f"{d['title']} {d['text']}" for d in docs]  # what the BEIR reader indexes


def build(corpus: Path, index_dir: Path, embedder) -> Manifest:
    return build_index(corpus, index_dir, embedder, top_k=16, dense=True, progress=False)


def forbid_encoding(embedder, monkeypatch) -> None:
    """Make any forward pass of ``embedder`` fail: what it returns must come from the cache."""

    def no_forward(batch_ids):
        raise AssertionError("the model was run on texts the cache holds")

    monkeypatch.setattr(embedder, "_forward_pooled", no_forward)


def spy_on_encoded_texts(embedder, monkeypatch) -> list[str]:
    """The texts the wrapped embedder is asked to encode, collected as they are asked."""
    encoded: list[str] = []
    real_iter_batches = embedder.iter_batches

    def iter_batches(texts, role="document"):
        encoded.extend(texts)
        return real_iter_batches(texts, role)

    monkeypatch.setattr(embedder, "iter_batches", iter_batches)
    return encoded


@pytest.fixture
def texts(docs_factory) -> list[str]:
    return doc_texts(docs_factory(40))


def test_first_build_encodes_every_text_and_writes_the_cache(toy_corpus, tiny_embedder, tmp_path):
    cached = CachedEmbedder(tiny_embedder, tmp_path / "cache")
    build(toy_corpus, tmp_path / "index", cached)
    assert (cached.misses, cached.hits) == (40, 0)
    assert cached.directory == tmp_path / "cache" / embedder_key(tiny_embedder)
    n_stored = 0
    for path in cached.directory.glob("*.npz"):
        with np.load(path) as z:
            assert z["h"].shape == (len(z["keys"]), tiny_embedder.dim) == (len(z["n_tokens"]), tiny_embedder.dim)
            n_stored += len(z["keys"])
    assert n_stored == 40


def test_rebuild_from_the_cache_encodes_nothing_and_gives_the_same_index(toy_corpus, make_embedder, tmp_path, monkeypatch):
    first = build(toy_corpus, tmp_path / "first", CachedEmbedder(make_embedder(), tmp_path / "cache"))
    inner = make_embedder()
    forbid_encoding(inner, monkeypatch)
    cached = CachedEmbedder(inner, tmp_path / "cache")
    second = build(toy_corpus, tmp_path / "second", cached)
    assert (cached.hits, cached.misses) == (40, 0)

    a, b = tmp_path / "first", tmp_path / "second"
    assert json.loads((a / DOC_IDS).read_text()) == json.loads((b / DOC_IDS).read_text())
    assert second.build["n_tokens"] == first.build["n_tokens"]
    pa, pb = InvertedIndex.load(a, 40, mmap=False), InvertedIndex.load(b, 40, mmap=False)
    np.testing.assert_array_equal(pa.indptr, pb.indptr)
    np.testing.assert_array_equal(pa.docs, pb.docs)
    np.testing.assert_allclose(pa.weights, pb.weights, atol=1e-5)
    da, db = DenseIndex.load(a).index, DenseIndex.load(b).index
    np.testing.assert_allclose(da.reconstruct_n(0, 40), db.reconstruct_n(0, 40), atol=1e-5)


def test_a_changed_text_is_the_only_miss(texts, make_embedder, tmp_path, monkeypatch):
    CachedEmbedder(make_embedder(), tmp_path / "cache").embed_texts(texts)
    changed = list(texts)
    changed[3] = "a zebra and a lion near the lake"
    inner = make_embedder()
    encoded = spy_on_encoded_texts(inner, monkeypatch)
    cached = CachedEmbedder(inner, tmp_path / "cache")
    out = cached.embed_texts(changed)
    assert (cached.misses, cached.hits) == (1, 39)
    assert encoded == [changed[3]]
    np.testing.assert_allclose(out[3], inner.embed([changed[3]])[0], atol=1e-5)


@pytest.mark.parametrize(
    "other",
    [
        {"pooling": "mean"},
        {"prompt": 'Text: "[text]" in a word:"'},
        {"max_length": 8},
        {"fold_all_caps": False},
        {"seed": 1},  # another model: other weights, other identity
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_other_embedding_settings_use_another_key_directory(texts, make_embedder, tmp_path, other):
    base = CachedEmbedder(make_embedder(), tmp_path / "cache")
    base.embed_texts(texts)
    inner = make_embedder(**other)
    cached = CachedEmbedder(inner, tmp_path / "cache")
    assert cached.directory != base.directory
    out = cached.embed_texts(texts)
    assert (cached.misses, cached.hits) == (len(texts), 0)
    np.testing.assert_allclose(out, inner.embed(texts), atol=1e-5)


def test_batch_size_does_not_change_the_key(texts, make_embedder, tmp_path, monkeypatch):
    assert embedder_key(make_embedder(batch_size=4)) == embedder_key(make_embedder(batch_size=7))
    CachedEmbedder(make_embedder(batch_size=4), tmp_path / "cache").embed_texts(texts)
    inner = make_embedder(batch_size=7)
    forbid_encoding(inner, monkeypatch)
    cached = CachedEmbedder(inner, tmp_path / "cache")
    cached.embed_texts(texts)
    assert (cached.hits, cached.misses) == (len(texts), 0)


def test_embed_texts_equals_embed_on_misses_and_on_hits(texts, tiny_embedder, tmp_path):
    want = tiny_embedder.embed(texts)
    cached = CachedEmbedder(tiny_embedder, tmp_path / "cache")
    np.testing.assert_allclose(cached.embed_texts(texts), want, atol=1e-5)  # all encoded
    np.testing.assert_allclose(cached.embed_texts(texts), want, atol=1e-5)  # all from the cache
    assert (cached.misses, cached.hits) == (len(texts), len(texts))


def _texts_whose_key_ends_with_nul(n: int) -> list[str]:
    from embedder.cache import text_key

    found = [t for t in (f"a text numbered {i}" for i in range(20000)) if text_key(t).endswith(b"\0")]
    assert len(found) >= n  # about one text in 256
    return found[:n]


def test_a_key_ending_with_a_nul_byte_is_found_again(tiny_embedder, tmp_path):
    # NumPy's "S16" strips trailing NUL bytes on read: such keys used to miss for ever
    from embedder.cache import ArrayCache

    texts = _texts_whose_key_ends_with_nul(3) + ["a plain text"]
    values = np.arange(len(texts) * 2, dtype=np.float32).reshape(len(texts), 2)
    ArrayCache(tmp_path / "arrays").put(texts, values)
    found, missing = ArrayCache(tmp_path / "arrays").get(texts)
    assert missing == [] and all(np.array_equal(found[i], values[i]) for i in range(len(texts)))

    CachedEmbedder(tiny_embedder, tmp_path / "emb").embed_texts(texts)
    again = CachedEmbedder(tiny_embedder, tmp_path / "emb")
    again.embed_texts(texts)
    assert (again.hits, again.misses) == (len(texts), 0)


def test_a_second_cache_on_the_same_folder_sees_what_the_first_wrote_after_it_was_read(texts, tiny_embedder, tmp_path, monkeypatch):
    """Two systems of one beir-eval run each wrap the embedder: texts one of them encodes after
    the other has read the folder are hits for the other, not a second encoding."""
    first, second = CachedEmbedder(tiny_embedder, tmp_path / "cache"), CachedEmbedder(tiny_embedder, tmp_path / "cache")
    second.embed_texts(texts[:5])  # the second has read the folder (and written its own five)
    expected = first.embed_texts(texts)  # the first encodes all 40 after that
    assert (first.misses, second.misses) == (35, 5)
    forbid_encoding(tiny_embedder, monkeypatch)
    got = second.embed_texts(texts)
    assert second.hits == 40
    np.testing.assert_array_equal(got, expected)
