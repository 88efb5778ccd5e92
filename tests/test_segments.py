"""Multi-vector documents (indexer/segments.py): max-over-segments sparse vectors and best-segment
dense scores against brute-force references, and an index built with segments end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest

from indexer.build import build_index
from indexer.manifest import SEGMENTS_FORMAT_VERSION, Manifest
from indexer.segments import best_per_document, max_over_segments, split_segments
from retriever.retriever import Retriever


def test_max_over_segments_matches_the_dense_maximum():
    rng = np.random.default_rng(0)
    vocab, k, n_docs = 40, 6, 7
    owner = np.array([0, 1, 1, 2, 3, 3, 3, 4, 5, 6, 6])
    logits = rng.normal(size=(len(owner), vocab)).astype(np.float32)
    top = np.argsort(-logits, axis=1)[:, :k].astype(np.int32)
    tokens, weights = max_over_segments(top, np.take_along_axis(logits, top, 1), owner, n_docs, k)
    for d in range(n_docs):
        full = logits[owner == d].max(0)  # brute force: the whole-vocabulary maximum
        want = np.argsort(-full, kind="stable")[:k]
        assert tokens[d].tolist() == want.tolist()
        np.testing.assert_array_equal(weights[d], full[want])


def test_max_over_segments_refuses_a_document_without_segments():
    with pytest.raises(ValueError, match="document 1 has no segment"):
        max_over_segments(np.zeros((2, 3), np.int32), np.zeros((2, 3), np.float32), np.array([0, 2]), 3, 3)


def test_best_per_document_matches_brute_force():
    rng = np.random.default_rng(1)
    row_doc = np.array([0, 0, 1, 2, 2, 2, 3, 4, 4])
    sims = rng.normal(size=(5, len(row_doc))).astype(np.float32)
    rows = np.argsort(-sims, axis=1)
    docs, scores = best_per_document(rows, np.take_along_axis(sims, rows, 1), row_doc, 3)
    for q in range(len(sims)):
        best = {d: sims[q][row_doc == d].max() for d in range(5)}
        want = sorted(best, key=lambda d: -best[d])[:3]
        assert docs[q].tolist() == want
        np.testing.assert_allclose(scores[q], [best[d] for d in want])


def test_split_segments_reads_whole_documents(make_embedder):
    emb = make_embedder(max_length=8)
    short, long = "cat dog", " ".join(["river sea mountain forest"] * 6)
    segs, owner = split_segments(emb, [short, long, short])
    n_long = -(-len(emb.tokenizer(long, add_special_tokens=False)["input_ids"]) // 8)
    assert n_long > 1
    assert owner.tolist() == [0] + [1] * n_long + [2]
    assert segs[0] == short and segs[1] == long  # window 0 is the text itself (the embedder truncates it)
    assert split_segments(emb, [long], max_segments=2)[1].tolist() == [0, 0]


def test_index_with_segments(make_corpus, docs_factory, make_embedder, tmp_path):
    docs = docs_factory(12)
    docs[3]["text"] = " ".join([docs[3]["text"]] * 6)  # several windows of 16 tokens
    corpus = make_corpus("beir", docs=docs)
    emb = make_embedder(max_length=16)
    m = build_index(corpus, tmp_path / "multi", emb, top_k=8, dense=True, embedfilter_tau=2, progress=False, segments=True)
    assert m.format_version == SEGMENTS_FORMAT_VERSION
    assert m.segments["max_per_doc"] > 1 and m.segments["docs_with_several"] >= 1
    assert m.record("dense")["n_vectors"] == m.segments["n_segments"] > m.n_docs
    assert Manifest.read(tmp_path / "multi").segments == m.segments
    r = Retriever.load(tmp_path / "multi", embedder=emb)
    # dense: a document scores as its best segment (brute force over the segment embeddings)
    texts = [f"{d['title']} {d['text']}" for d in docs]
    segs, owner = split_segments(emb, texts)
    seg_h = emb.embed(segs)
    seg_h /= np.linalg.norm(seg_h, axis=1, keepdims=True)
    q = emb.embed(["river and sea"])[0]
    q /= np.linalg.norm(q)
    best = {d: float((seg_h[owner == d] @ q).max()) for d in range(len(docs))}
    hits = r.search("river and sea", k=5, mode="dense")
    assert [h.doc_id for h in hits] == [docs[d]["_id"] for d in sorted(best, key=lambda d: -best[d])[:5]]
    np.testing.assert_allclose([h.score for h in hits], sorted(best.values(), reverse=True)[:5], rtol=1e-4)
    assert r.search("river and sea", k=5, mode="sparse")
    assert r.search("river and sea", k=5, mode="dense-ef")
    # the same index when the windows are encoded in several shards (the long document in the second)
    build_index(corpus, tmp_path / "sharded", emb, top_k=8, dense=True, embedfilter_tau=2, progress=False, segments=True, chunk_size=3)
    for name in ("dense_rows.npy", "dense_ef_rows.npy", "doc_ids.json"):
        assert (tmp_path / "sharded" / name).read_bytes() == (tmp_path / "multi" / name).read_bytes(), name
    sharded = Retriever.load(tmp_path / "sharded", embedder=emb)
    for mode in ("sparse", "dense"):  # other batches, so float noise in the last digits
        a, b = sharded.search("river and sea", k=5, mode=mode), r.search("river and sea", k=5, mode=mode)
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)


def test_an_unknown_format_version_is_refused(make_corpus, tiny_embedder, tmp_path):
    build_index(make_corpus("beir", n=5), tmp_path / "idx", tiny_embedder, top_k=8, progress=False)
    path = tmp_path / "idx" / "manifest.json"
    data = json.loads(path.read_text())
    data["format_version"] = 2  # format 2 without a segments object
    path.write_text(json.dumps(data))
    from indexer.manifest import IndexFormatError

    with pytest.raises(IndexFormatError, match="segments"):
        Manifest.read(tmp_path / "idx")
