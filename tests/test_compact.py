"""Compact indexes (indexer/compact.py): 8-bit impacts and scalar-quantised dense channels.

The float32 path stays the reference: the uint8 kernels must score exactly as the float32
kernels on the dequantised weights, and a compact index must rank nearly as its float32 source.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import reseal, save_tiny_sentence_encoder, toy_docs, write_corpus
from test_kernels import dense_scores, random_index, random_query

from indexer import kernels
from indexer.build import build_index
from indexer.codec import PostingsCodec
from indexer.compact import COMPACT_DENSE_KIND, compact_copy
from indexer.corpus import document_from_object
from indexer.inverted_index import InvertedIndex, quantise_weights
from indexer.manifest import (
    COMPACT_FORMAT_VERSION,
    FORMAT_VERSION,
    MANIFEST,
    STREAM_FORMAT_VERSION,
    IndexFormatError,
    Manifest,
)
from indexer.reader import open_index
from indexer.updates import update_index
from indexer.verify import verify
from retriever.retriever import Retriever

pytest.importorskip("sentence_transformers")

QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow", "river bank money"]


# ------------------------------------------------------------------ quantisation
@pytest.mark.parametrize("per_list", [True, False])
def test_quantisation_round_trip_is_within_half_a_step(per_list):
    rng = np.random.default_rng(0)
    lengths = np.array([0, 1, 5, 0, 300, 2, 1000, 1])
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    weights = (rng.normal(size=indptr[-1]) * rng.choice([0.1, 3.0, 30.0], size=indptr[-1])).astype(np.float32)
    weights[indptr[2]:indptr[3]] = 7.25  # a constant list: exact
    codes, scale, offset = quantise_weights(indptr, weights, per_list)
    assert codes.dtype == np.uint8 and scale.shape == offset.shape == (len(lengths),)
    back = kernels.dequantise(indptr, codes, scale, offset)
    bound = np.repeat(scale, lengths) / 2 * (1 + 1e-5) + 1e-6 * np.abs(weights)
    assert (np.abs(back - weights) <= bound).all()
    if per_list:
        assert back[indptr[1]] == weights[indptr[1]]  # a list of one value is exact
        np.testing.assert_array_equal(back[indptr[2]:indptr[3]], 7.25)
        for t in np.flatnonzero(lengths > 1)[1:]:  # each list's extremes are levels 0 and 255 (but the constant list 2)
            a, b = indptr[t], indptr[t + 1]
            assert codes[a:b].min() == 0 and codes[a:b].max() == 255
    else:
        assert len(set(scale.tolist())) == 1 and len(set(offset.tolist())) == 1
    # quantising the dequantised weights again changes nothing (what an update of a compact index does)
    again = quantise_weights(indptr, back, per_list)
    np.testing.assert_array_equal(again[0], codes)


@pytest.mark.parametrize("levels", [16, 2])
@pytest.mark.parametrize("per_list", [True, False])
def test_fewer_impact_levels_round_trip_within_half_their_coarser_step(per_list, levels):
    """Spread over ``levels`` codes, a list's weights come back within half of its (coarser) step,
    the codes stay below ``levels``, each list's extremes are exact, and quantising the
    dequantised weights again at the same levels changes nothing (an update)."""
    rng = np.random.default_rng(2)
    lengths = np.array([3, 0, 400, 1, 17])
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    weights = (rng.normal(size=indptr[-1]) * 5).astype(np.float32)
    codes, scale, offset = quantise_weights(indptr, weights, per_list, levels)
    fine = quantise_weights(indptr, weights, per_list)[1]
    assert codes.max() == levels - 1
    back = kernels.dequantise(indptr, codes, scale, offset)
    assert (np.abs(back - weights) <= np.repeat(scale, lengths) / 2 * (1 + 1e-5) + 1e-6 * np.abs(weights)).all()
    used = lengths > 1
    np.testing.assert_allclose(scale[used], fine[used] * 255 / (levels - 1), rtol=1e-6)
    if per_list:
        a, b = indptr[2], indptr[3]
        assert np.isclose(back[a:b].min(), weights[a:b].min()) and np.isclose(back[a:b].max(), weights[a:b].max(), rtol=1e-6)
    np.testing.assert_array_equal(quantise_weights(indptr, back, per_list, levels)[0], codes)
    for bad in (1, 257, 16.0, True):
        with pytest.raises(ValueError, match="impact levels"):
            quantise_weights(indptr, weights, per_list, bad)


def test_quantise_saved_equals_quantise_in_memory(tmp_path):
    rng = np.random.default_rng(1)
    index = random_index(rng, "float")
    index.save(tmp_path)
    InvertedIndex.quantise_saved(tmp_path)
    got = InvertedIndex.load(tmp_path, index.n_docs, codec=PostingsCodec.named("int32", 8))
    want = index.quantise()
    for name in ("indptr", "docs", "weights", "scale", "offset"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(want, name), err_msg=name)


# ------------------------------------------------------------------ kernels
def assert_same_top_k(got, want, exact: np.ndarray, k: int, tol: float = 1e-4) -> None:
    """The uint8 kernel's top-k against the float32 kernel's on the dequantised weights: the
    same scores up to float32 rounding (the scale is folded into the query weight), and the same
    documents but where scores tie within that rounding (``exact``: every document's score, float64)."""
    (gd, gs), (wd, ws) = got, want
    assert gd.shape == wd.shape
    np.testing.assert_allclose(gs, ws, rtol=tol, atol=tol)
    np.testing.assert_allclose(gs, exact[gd], rtol=tol, atol=tol)  # each hit carries its own score
    differ = gd != wd
    if differ.any():  # only ties (within rounding) may come out in another order or choice
        assert np.allclose(exact[gd[differ]], exact[wd[differ]], rtol=tol, atol=tol)


@pytest.mark.parametrize("seed", range(40))
def test_uint8_kernels_score_as_float32_kernels_on_the_dequantised_weights(seed):
    rng = np.random.default_rng(seed)
    index = random_index(rng, "float" if seed % 2 else "int")
    q8 = index.quantise(per_list=seed % 3 != 0)
    deq = InvertedIndex(index.indptr, index.docs, q8.float_weights(), index.n_docs)
    queries = [random_query(rng, index.vocab_size, "float") for _ in range(4)]
    for k in (1, 5, 100):
        for tokens, w in queries:
            assert_same_top_k(q8.search(tokens, w, k), deq.search(tokens, w, k), dense_scores(deq, tokens, w), k)
            doc = int(rng.integers(0, index.n_docs))
            # a document's weights are the dequantised ones exactly
            np.testing.assert_array_equal(q8.contributions(tokens, doc), deq.contributions(tokens, doc))
        got, want = q8.batch_search(queries, k), deq.batch_search(queries, k)
        for i, (tokens, w) in enumerate(queries):
            keep = got[0][i] >= 0
            assert (keep == (want[0][i] >= 0)).all()
            assert_same_top_k((got[0][i][keep], got[1][i][keep]), (want[0][i][keep], want[1][i][keep]), dense_scores(deq, tokens, w), k)
    np.testing.assert_array_equal(q8.doc_vectors().toarray(), deq.doc_vectors().toarray())


# ------------------------------------------------------------------ indexes
@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from embedder.sentence_encoder import SentenceEncoder

    return SentenceEncoder.load(save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st"), seed=0))


def build(corpus: Path, index: Path, embedder, encoder, **kw) -> Manifest:
    return build_index(corpus, index, embedder, top_k=16, dense=True, lexical="words", encoder=encoder, progress=False, **kw)


def top(index: Path, embedder, mode: str, k: int = 10) -> list[list[str]]:
    with Retriever.load(index, embedder=embedder, query_encoder="llm", profile=None) as r:
        return [[h.doc_id for h in hits] for hits in r.batch_search(QUERIES, k=k, mode=mode)]


def overlap(a: list[list[str]], b: list[list[str]]) -> float:
    return float(np.mean([len(set(x) & set(y)) / max(len(x), 1) for x, y in zip(a, b)]))


@pytest.fixture
def pair(tmp_path, tiny_embedder, encoder) -> tuple[Path, Path]:
    corpus = write_corpus(tmp_path / "c", toy_docs(40, seed=3), "beir")
    build(corpus, tmp_path / "plain", tiny_embedder, encoder)
    m = build(corpus, tmp_path / "compact", tiny_embedder, encoder, compact=True)
    assert m.format_version == COMPACT_FORMAT_VERSION and m.compact
    return tmp_path / "plain", tmp_path / "compact"


def test_a_compact_build_loads_verifies_and_ranks_as_float32(pair, tiny_embedder):
    plain, compact = pair
    mp, mc = Manifest.read(plain), Manifest.read(compact)
    # the plain index is what it was: format 1, float32, Flat, no impacts recorded
    assert mp.format_version == FORMAT_VERSION and "impacts" not in mp.record("sparse") and "impacts" not in mp.record("lexical")
    assert mp.record("dense")["kind"] == mp.record("encoder")["kind"] == "Flat"
    assert mc.record("sparse")["impacts"] == mc.record("lexical")["impacts"] == "uint8"
    assert mc.record("dense")["kind"] == mc.record("encoder")["kind"] == COMPACT_DENSE_KIND
    assert verify(compact).ok, verify(compact).problems
    opened = open_index(compact)
    try:
        assert opened.channels["sparse"].weights.dtype == np.uint8
        assert opened.channels["bm25"].postings.weights.dtype == np.uint8
    finally:
        opened.close()
    sizes = {p.name: p.stat().st_size for p in compact.resolve().iterdir()}
    plain_sizes = {p.name: p.stat().st_size for p in plain.resolve().iterdir()}
    assert sizes["postings_weights.npy"] < plain_sizes["postings_weights.npy"] / 3
    assert sizes["dense.faiss"] < plain_sizes["dense.faiss"] / 2
    for mode in ("sparse", "dense", "encoder", "bm25", "hybrid"):
        assert overlap(top(plain, tiny_embedder, mode), top(compact, tiny_embedder, mode)) >= 0.8, mode


def test_compact_copy_writes_what_a_compact_build_writes(pair, tmp_path):
    plain, compact = pair
    m = compact_copy(plain, tmp_path / "copy")
    assert m.format_version == COMPACT_FORMAT_VERSION and m.build["compacted"]["dense_kind"] == {"dense": COMPACT_DENSE_KIND, "encoder": COMPACT_DENSE_KIND}
    assert verify(tmp_path / "copy").ok
    a, b = compact.resolve(), (tmp_path / "copy").resolve()
    for rel in ("postings_weights.npy", "postings_scale.npy", "postings_offset.npy", "postings_docs.npy",
                "lexical/postings_weights.npy", "lexical/postings_scale.npy", "doc_ids.json", "documents.jsonl"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    with pytest.raises(ValueError, match="already compact"):
        compact_copy(compact, tmp_path / "again")
    with pytest.raises(FileExistsError):
        compact_copy(plain, tmp_path / "copy")


def test_a_compact_index_stays_compact_through_an_update(pair, tiny_embedder, encoder, tmp_path):
    _, compact = pair
    added = [document_from_object(d, "test", i) for i, d in enumerate(toy_docs(50, seed=9)[40:], start=1)]
    first = open_index(compact)
    deleted = first.doc_ids[:3]
    first.close()
    report = update_index(compact, add=added, delete=deleted, embedder=tiny_embedder, encoder=encoder, progress=False)
    assert report.added == 10 and report.deleted == 3
    m = Manifest.read(compact.resolve())
    assert m.format_version == COMPACT_FORMAT_VERSION and m.compact and m.record("lexical")["impacts"] == "uint8"
    assert m.record("dense")["kind"] == m.record("encoder")["kind"] == COMPACT_DENSE_KIND
    assert verify(compact).ok, verify(compact).problems
    # against a compact rebuild of the final corpus: the same documents, nearly the same ranking
    opened = open_index(compact)
    try:
        assert opened.channels["sparse"].quantised
        final_ids = opened.doc_ids
    finally:
        opened.close()
    docs = {d["_id"]: d for d in toy_docs(50, seed=3)[:40] + toy_docs(50, seed=9)[40:]}
    rebuilt = build(write_corpus(tmp_path / "final", [docs[i] for i in final_ids], "beir"), tmp_path / "rebuilt", tiny_embedder, encoder,
                    compact=True)
    assert rebuilt.n_docs == len(final_ids)
    for mode in ("sparse", "dense", "bm25", "hybrid"):
        assert overlap(top(compact, tiny_embedder, mode), top(tmp_path / "rebuilt", tiny_embedder, mode)) >= 0.8, mode


# ------------------------------------------------------------------ damage and versions


@pytest.mark.parametrize("rel, value, says", [
    ("postings_scale.npy", np.nan, "not finite"),
    ("postings_scale.npy", -1.0, "negative"),
    ("postings_offset.npy", np.inf, "not finite"),
    ("lexical/postings_offset.npy", -2.0, "not positive"),
])  # fmt: skip
def test_damaged_dequantisation_is_refused_by_name(pair, tmp_path, rel, value, says):
    index = tmp_path / "damaged"
    shutil.copytree(pair[1].resolve(), index)
    arr = np.load(index / rel)
    used = np.flatnonzero(np.diff(np.load(index / Path(rel).with_name("postings_indptr.npy"))) > 0)
    arr[used[0]] = value
    np.save(index / rel, arr)
    reseal(index)  # only the structural checks can see it now
    with pytest.raises(IndexFormatError, match=says) as err:
        open_index(index)
    assert Path(rel).name in str(err.value)
    report = verify(index)
    assert not report.ok and any(Path(rel).name in p for p in report.problems)


def test_a_flipped_code_is_found_by_its_checksum(pair, tmp_path):
    index = tmp_path / "flipped"
    shutil.copytree(pair[1].resolve(), index)
    data = bytearray((index / "postings_weights.npy").read_bytes())
    data[-3] ^= 0xFF
    (index / "postings_weights.npy").write_bytes(bytes(data))
    report = verify(index)
    assert not report.ok and any("postings_weights.npy" in p and "checksum" in p for p in report.problems)


def test_format_and_impacts_must_agree(pair, tmp_path):
    for rel, change, says in (
        ("compact-as-1", lambda m: m.update(format_version=FORMAT_VERSION), "8-bit impacts in an index of format 1"),
        ("plain-as-3", None, "format 3 needs"),
        ("unknown", lambda m: m["channels"]["sparse"].update(impacts="int4"), "is not 'uint8'"),
    ):
        src = pair[0] if change is None else pair[1]
        index = tmp_path / rel
        shutil.copytree(src.resolve(), index)
        data = json.loads((index / MANIFEST).read_text())
        if change is None:
            data["format_version"] = COMPACT_FORMAT_VERSION
        else:
            change(data)
        (index / MANIFEST).write_text(json.dumps(data))
        with pytest.raises(IndexFormatError, match=says):
            Manifest.read(index)


def test_a_reader_of_formats_1_and_2_refuses_a_compact_index(pair, monkeypatch):
    from indexer import manifest

    monkeypatch.setattr(manifest, "READABLE_VERSIONS", (1, 2))
    with pytest.raises(IndexFormatError, match="index format 3"):
        Manifest.read(pair[1].resolve())
    Manifest.read(pair[0].resolve())  # a plain index is still format 1


def test_build_index_cli_compact(tmp_path, tiny_model_dir):
    from indexer import cli as build_cli

    corpus = write_corpus(tmp_path / "c", toy_docs(20), "beir")
    argv = ["--corpus", str(corpus), "--index", str(tmp_path / "i"), "--model", str(tiny_model_dir), "--adapter", "none",
            "--top-k", "16", "--channels", "sparse,dense,bm25", "--compact", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    m = Manifest.read((tmp_path / "i").resolve())
    # --profile fast's layout (--channels does not change it): 4-bit impacts, bit-packed doc numbers, format 7
    assert m.compact and m.record("dense")["kind"] == COMPACT_DENSE_KIND and m.format_version == STREAM_FORMAT_VERSION and m.packed
    assert verify(tmp_path / "i").ok


def test_a_compact_index_of_multi_vector_documents(tmp_path, make_embedder, encoder):
    from embedder.encoder import EmbedderConfig

    embedder = make_embedder(EmbedderConfig(max_length=8, batch_size=4))
    corpus = write_corpus(tmp_path / "c", toy_docs(20, seed=5), "beir")
    m = build(corpus, tmp_path / "i", embedder, encoder, compact=True, segments=True)
    assert m.format_version == COMPACT_FORMAT_VERSION and m.segments["max_per_doc"] > 1
    assert verify(tmp_path / "i").ok
    added = [document_from_object(d, "test", i) for i, d in enumerate(toy_docs(25, seed=6)[20:], start=1)]
    update_index(tmp_path / "i", add=added, embedder=embedder, encoder=encoder, progress=False)
    m = Manifest.read((tmp_path / "i").resolve())
    assert m.compact and m.segments is not None and m.n_docs == 25
    assert verify(tmp_path / "i").ok
    assert top(tmp_path / "i", embedder, "dense")[0]


@pytest.mark.parametrize("kind", ["SQ8", "SQ6", "SQ4", "SQfp16"])
def test_scalar_quantisers_built_chunk_by_chunk_equal_one_build(kind):
    """A build's dense channel comes in shards: an SQ8 index is trained on the shards' per-dimension
    minima and maxima (one more pass, one shard in memory), which gives the index training on all
    of them gives, byte for byte."""
    import faiss

    from indexer.dense import DenseIndex

    x = np.random.default_rng(0).normal(size=(700, 24)).astype(np.float32)
    whole = DenseIndex.build(x, kind)
    passes = []

    def chunks():
        passes.append(1)
        return iter([x[:100], x[100:450], x[450:]])

    parts = DenseIndex.build_from_chunks(chunks, kind)
    assert faiss.serialize_index(whole.index).tobytes() == faiss.serialize_index(parts.index).tobytes()
    assert len(passes) == (2 if kind != "SQfp16" else 1)  # SQfp16 needs no training


def test_compact_command_converts_a_plain_index(pair, tmp_path, capsys):
    from indexer.compact import main

    plain, compact = pair
    assert main([str(plain), str(tmp_path / "out"), "--dense-kind", "SQfp16"]) == 0
    assert "bytes per document" in capsys.readouterr().out
    m = Manifest.read((tmp_path / "out").resolve())
    assert m.compact and m.record("dense")["kind"] == "SQfp16" and verify(tmp_path / "out").ok
    assert main([str(compact), str(tmp_path / "again")]) == 2
    assert "already compact" in capsys.readouterr().err
    assert main([str(plain), str(tmp_path / "out")]) == 2  # exists
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2


def test_compact_copy_with_fewer_tokens_writes_what_a_build_with_that_top_k_writes(tmp_path, tiny_embedder, encoder):
    """The postings keep the LM head's logits, and a build keeps each document's top-K of them:
    cutting a top-16 index down to 8 tokens a document is the top-8 build, without the model."""
    corpus = write_corpus(tmp_path / "c", toy_docs(40, seed=3), "beir")
    build(corpus, tmp_path / "k16", tiny_embedder, encoder)
    build_index(corpus, tmp_path / "k8", tiny_embedder, top_k=8, dense=True, lexical="words", encoder=encoder, progress=False, compact=True)
    m = compact_copy(tmp_path / "k16", tmp_path / "cut", top_k=8)
    assert m.record("sparse")["top_k"] == 8 and m.build["compacted"]["top_k"] == {"from": 16, "to": 8} and verify(tmp_path / "cut").ok
    a, b = (tmp_path / "k8").resolve(), (tmp_path / "cut").resolve()
    for rel in ("postings_indptr.npy", "postings_docs.npy", "postings_weights.npy", "postings_scale.npy", "postings_offset.npy"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    assert top(tmp_path / "k8", tiny_embedder, "sparse") == top(tmp_path / "cut", tiny_embedder, "sparse")
    for bad in (16, 0, 2.5, True):
        with pytest.raises(ValueError, match="top_k must be an integer from 1 to 15"):
            compact_copy(tmp_path / "k16", tmp_path / f"bad-{bad}", top_k=bad)


def test_cutting_tokens_keeps_each_documents_largest_weights(tmp_path):
    """Documents holding different numbers of tokens (the loop path) and equal ones (the vectorised
    path) keep the same largest weights."""
    from indexer.compact import truncate_channel_files

    rng = np.random.default_rng(0)
    vocab, n_docs = 50, 6
    rows = [rng.choice(vocab, size=n, replace=False) for n in (5, 7, 5, 9, 6, 5)]
    weights = [rng.normal(size=len(r)).astype(np.float32) for r in rows]
    for uneven in (True, False):
        cut = [r[:5] for r in rows] if not uneven else rows
        w = [x[:5] for x in weights] if not uneven else weights
        tokens = np.concatenate(cut)
        docs = np.repeat(np.arange(n_docs), [len(r) for r in cut])
        order = np.lexsort((docs, tokens))
        indptr = np.zeros(vocab + 1, np.int64)
        np.cumsum(np.bincount(tokens, minlength=vocab), out=indptr[1:])
        directory = tmp_path / f"uneven-{uneven}"
        directory.mkdir()
        InvertedIndex(indptr, docs[order].astype(np.int32), np.concatenate(w)[order], n_docs).save(directory)
        truncate_channel_files(directory, n_docs, 3)
        by_doc = InvertedIndex.load(directory, n_docs, mmap=False).doc_vectors()
        for d in range(n_docs):
            held = dict(zip(by_doc.indices[by_doc.indptr[d]:by_doc.indptr[d + 1]].tolist(), by_doc.data[by_doc.indptr[d]:by_doc.indptr[d + 1]].tolist()))
            best = np.argsort(-w[d])[:3]
            assert held == pytest.approx(dict(zip(cut[d][best].tolist(), w[d][best].tolist())))


def test_each_dense_channel_has_its_compact_kind():
    from indexer.compact import COMPACT_DENSE_KINDS, compact_dense_kind, dense_kinds

    assert compact_dense_kind("Flat", True, "encoder2") == COMPACT_DENSE_KINDS["encoder2"] != COMPACT_DENSE_KIND
    assert compact_dense_kind("Flat", True, "encoder") == compact_dense_kind("Flat", True, "dense") == COMPACT_DENSE_KIND
    assert compact_dense_kind("Flat", True) == COMPACT_DENSE_KIND
    assert compact_dense_kind("Flat", False, "encoder2") == "Flat" and compact_dense_kind("HNSW32", True, "encoder2") == "HNSW32"
    assert dense_kinds()["encoder2"] == COMPACT_DENSE_KINDS["encoder2"] and set(dense_kinds("SQ8").values()) == {"SQ8"}
    assert dense_kinds({"encoder": "SQ4"})["encoder"] == "SQ4" and dense_kinds({"encoder": "SQ4"})["encoder2"] == COMPACT_DENSE_KINDS["encoder2"]


def test_the_compact_study_reads_its_variants():
    from experiments.compact_index import Variant, parse_variants, variant_name

    got = parse_variants("per-list:SQ8,per-list:SQ8:packed:k256,global:SQ4:k128,per-list:SQ8:range16:encoder2=SQ4:-dense,per-list:SQ8:l16:-encoder2,"
                         "per-list:SQ8:packed:b4:-encoder2")
    assert got == [Variant("per-list", "SQ8"), Variant("per-list", "SQ8", "packed", 256), Variant("global", "SQ4", "int32", 128),
                   Variant("per-list", "SQ8", "range16", None, (("encoder2", "SQ4"),), ("dense",)),
                   Variant("per-list", "SQ8", drop=("encoder2",), levels=16), Variant("per-list", "SQ8", "packed", drop=("encoder2",), bits=4)]
    assert [v.name for v in got] == ["compact-per-list-SQ8", "compact-per-list-SQ8-packed-k256", "compact-global-SQ4-k128",
                                     "compact-per-list-SQ8-range16-encoder2=SQ4-no-dense", "compact-per-list-SQ8-l16-no-encoder2",
                                     "compact-per-list-SQ8-packed-b4-no-encoder2"]
    assert variant_name("per-list", "SQ8", True, 256) == "compact-per-list-SQ8-packed-k256"  # the older results' names
    for bad in ("per-list:SQ8:k0", "per-list:SQ8:foo", "per-list:SQ8:packed:packed", "median:SQ8", "per-list:SQ8:k12:k13", "per-list",
                "per-list:SQ8:packed:range16", "per-list:SQ8:-", "per-list:SQ8:l1", "per-list:SQ8:l257", "per-list:SQ8:l16:l32", "per-list:SQ8:b2", "per-list:SQ8:b4:b4"):
        with pytest.raises(ValueError, match="QUANTISATION:DENSE_KIND"):
            parse_variants(bad)


def test_compact_copy_drops_channels_and_quantises_each_dense_channel_its_own_way(pair, tiny_embedder, tmp_path):
    """A copy without the LLM dense channel and with the encoder at 4 bits: the dense files are
    gone and its record is None, the encoder's vectors are SQ4, every other file is what the
    plain copy writes, and the channels kept rank as they do in the full copy."""
    plain, _ = pair
    full = compact_copy(plain, tmp_path / "full")
    m = compact_copy(plain, tmp_path / "slim", dense_kind={"encoder": "SQ4"}, drop=["dense"])
    assert m.record("dense") is None and full.record("dense") is not None and m.record("encoder")["kind"] == "SQ4" and full.record("encoder")["kind"] == COMPACT_DENSE_KIND
    assert m.build["compacted"]["dropped"] == ["dense"] and m.build["compacted"]["dense_kind"]["encoder"] == "SQ4"
    assert verify(tmp_path / "slim").ok, verify(tmp_path / "slim").problems
    slim, whole = (tmp_path / "slim").resolve(), (tmp_path / "full").resolve()
    files = {p.relative_to(slim).as_posix() for p in slim.rglob("*") if p.is_file()}
    assert not any(f.startswith("dense") for f in files)
    assert (slim / "encoder.faiss").stat().st_size < (whole / "encoder.faiss").stat().st_size
    for rel in files - {"manifest.json", "encoder.faiss"}:
        assert (slim / rel).read_bytes() == (whole / rel).read_bytes(), rel
    with Retriever.load(tmp_path / "slim", embedder=tiny_embedder, query_encoder="llm", profile=None) as r:
        assert "dense" not in r.modes and "encoder" in r.modes
    for mode in ("sparse", "bm25"):
        assert top(tmp_path / "slim", tiny_embedder, mode) == top(tmp_path / "full", tiny_embedder, mode)
    assert overlap(top(tmp_path / "slim", tiny_embedder, "encoder"), top(tmp_path / "full", tiny_embedder, "encoder")) >= 0.8
    m = compact_copy(plain, tmp_path / "no-bm25", drop=["lexical"])  # by its manifest name
    assert m.record("lexical") is None and not (tmp_path / "no-bm25").resolve().joinpath("lexical").exists() and verify(tmp_path / "no-bm25").ok
    for bad, says in (({"drop": ["sparse"]}, "cannot be dropped"), ({"drop": ["nothing"]}, "unknown channel"),
                      ({"dense_kind": {"bm25": "SQ4"}}, "not a dense channel")):
        with pytest.raises(ValueError, match=says):
            compact_copy(plain, tmp_path / "bad", **bad)


def test_a_copy_without_a_channel_and_with_its_own_kinds_keeps_them_through_an_update(pair, tiny_embedder, encoder, tmp_path):
    """An update of a copy that dropped the dense channel and keeps MiniLM at SQ6 and format 5:
    the channel stays out, the kind and format stay, the index verifies and searches."""
    plain, _ = pair
    compact_copy(plain, tmp_path / "slim", dense_kind={"encoder": "SQ6"}, drop=["dense"], range_doc_ids=True)
    added = [document_from_object(d, "test", i) for i, d in enumerate(toy_docs(46, seed=9)[40:], start=1)]
    update_index(tmp_path / "slim", add=added, embedder=tiny_embedder, encoder=encoder, progress=False)
    m = Manifest.read((tmp_path / "slim").resolve())
    assert m.n_docs == 46 and m.record("dense") is None and m.record("encoder")["kind"] == "SQ6" and m.ranged and verify(tmp_path / "slim").ok
    assert top(tmp_path / "slim", tiny_embedder, "encoder")[0] and top(tmp_path / "slim", tiny_embedder, "hybrid")[0]


def test_compact_command_takes_dense_kinds_per_channel_and_drops(pair, tmp_path):
    from indexer.compact import main, parse_dense_kind

    plain, _ = pair
    assert parse_dense_kind("SQ8") == "SQ8" and parse_dense_kind("encoder=SQ4,dense=SQ8") == {"encoder": "SQ4", "dense": "SQ8"}
    with pytest.raises(ValueError, match="CHANNEL=KIND"):
        parse_dense_kind("encoder=")
    assert main([str(plain), str(tmp_path / "out"), "--dense-kind", "encoder=SQ4", "--drop", "dense"]) == 0
    m = Manifest.read((tmp_path / "out").resolve())
    assert m.record("dense") is None and m.record("encoder")["kind"] == "SQ4" and verify(tmp_path / "out").ok


def test_a_copy_with_fewer_impact_levels_records_them_and_keeps_them_through_an_update(pair, tiny_embedder, encoder, tmp_path):
    """``impact_levels=16`` (4-bit precision): the aligned-token codes use 16 levels and the
    manifest says so, BM25 keeps all 256, the copy ranks as the float32 kernels do on its
    dequantised weights, an update quantises at the same 16 levels, and the command takes it."""
    from indexer.compact import main

    plain, _ = pair
    m = compact_copy(plain, tmp_path / "l16", impact_levels=16, range_doc_ids=True)
    assert m.record("sparse")["levels"] == 16 and "levels" not in m.record("lexical") and m.build["compacted"]["impact_levels"] == 16
    assert "levels" not in compact_copy(plain, tmp_path / "l256").record("sparse")  # the default record is unchanged
    opened = open_index(tmp_path / "l16")
    try:
        sparse, bm25 = opened.channels["sparse"], opened.channels["bm25"]
        assert int(np.max(sparse.weights)) == 15 and int(np.max(bm25.postings.weights)) > 15
    finally:
        opened.close()
    assert verify(tmp_path / "l16").ok
    added = [document_from_object(d, "test", i) for i, d in enumerate(toy_docs(46, seed=9)[40:], start=1)]
    update_index(tmp_path / "l16", add=added, embedder=tiny_embedder, encoder=encoder, progress=False)
    after = Manifest.read((tmp_path / "l16").resolve())
    assert after.n_docs == 46 and after.record("sparse")["levels"] == 16 and after.ranged and verify(tmp_path / "l16").ok
    assert int(np.max(np.load((tmp_path / "l16").resolve() / "postings_weights.npy"))) == 15
    assert main([str(plain), str(tmp_path / "cli"), "--impact-levels", "16"]) == 0
    assert Manifest.read((tmp_path / "cli").resolve()).record("sparse")["levels"] == 16
    assert main([str(plain), str(tmp_path / "bad"), "--impact-levels", "300"]) == 2


def test_impact_levels_in_a_manifest_are_checked(pair, tmp_path):
    for i, (src, levels, says) in enumerate([(1, 300, "is not a count"), (1, "16", "is not a count"), (1, 1, "is not a count"),
                                             (0, 16, "with 'impacts'")]):  # the last: levels in a plain index (no 8-bit impacts)
        index = tmp_path / f"levels-{i}"
        shutil.copytree(pair[src].resolve(), index)
        data = json.loads((index / MANIFEST).read_text())
        data["channels"]["sparse"]["levels"] = levels
        (index / MANIFEST).write_text(json.dumps(data))
        with pytest.raises(IndexFormatError, match=f"sparse.levels.*{says}"):
            Manifest.read(index)
