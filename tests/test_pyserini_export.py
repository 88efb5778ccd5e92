"""Pyserini export: quantisation, token spellings, the JsonVectorCollection writer (no model,
no Java), then Lucene against our Numba index on the same integers (needs pyserini + Java;
the real-collection test also needs the default model and ../shared/data)."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

from indexer.exports.lucene import (
    COLLECTION_DIR,
    COLLECTION_FILE,
    MAX_TERM_CHARS,
    QUERIES_JSONL,
    QUERIES_TSV,
    export_queries,
    quantise,
    quantise_index,
    quantise_query,
    spell_token,
    token_spellings,
    unspell,
    utf16_len,
    vocabulary_strings,
    write_collection,
)
from indexer.inverted_index import InvertedIndex
from retriever.ties import same_up_to_ties

# Strings a real vocabulary holds (byte-level BPE, SentencePiece, Gemma's whitespace runs)
# and worse ones: every one must come out whitespace-free, short, unique and reversible.
AWKWARD = [
    "Ġgame", "game", "Game", "▁game", "Ċ", "ĠĠ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2028", "\u3000",
    "a b", "%", "%25", "%#3", "%%", "100%", "#", "<|endoftext|>", "<0x0A>", "é", "e\u0301", "\u200d", "\ufeff",
    "😀", "👩\u200d💻", "\x00", "\x7f", "ñ" * 300, "x" * 255, "x" * 256, "😀" * 200, " " * 300, "",
]  # fmt: skip


def index_from_dense(mat: np.ndarray) -> InvertedIndex:
    """Docs x vocab dense matrix (0 = absent) -> InvertedIndex."""
    m = sp.csr_matrix(mat.T.astype(np.float32))
    m.sort_indices()
    return InvertedIndex(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data.astype(np.float32), mat.shape[0])


# ------------------------------------------------------------------ quantisation
def test_quantise_rounds_half_to_even_at_scale():
    w = np.array([15.234, 15.235, 0.004, 0.005, 0.015, -3.2, 35.0])
    assert quantise(w, 100).tolist() == [1523, 1524, 0, 0, 2, -320, 3500]  # 0.005*100 = 0.5 -> 0 (half to even)
    with pytest.raises(ValueError, match="positive"):
        quantise(w, 0)
    with pytest.raises(ValueError, match="int32"):
        quantise(np.array([3e7]), 100)


def test_quantise_index_keeps_integer_postings_and_drops_below_one():
    rng = np.random.default_rng(0)
    mat = np.where(rng.random((30, 40)) < 0.3, rng.normal(5, 4, size=(30, 40)), 0.0)
    mat[mat == 0] = 0.0
    present = mat != 0
    floats = index_from_dense(np.where(present, mat, 0.0))
    q, dropped = quantise_index(floats, 10)
    expected = np.where(present, np.rint(mat * 10), 0)
    expected[expected < 1] = 0
    assert dropped == int((present & (np.rint(mat * 10) < 1)).sum()) > 0
    got = q.doc_vectors().toarray()
    assert np.array_equal(got, expected)
    assert q.weights.dtype == np.float32 and np.all(q.weights >= 1) and np.all(q.weights == np.rint(q.weights))
    for t in range(q.vocab_size):  # posting lists stay sorted by doc number
        assert np.all(np.diff(q.docs[q.indptr[t] : q.indptr[t + 1]]) > 0)


def test_quantise_query_scale_and_drop():
    toks, w = quantise_query(np.array([5, 7, 9]), np.array([1.0, 0.3, 2.6]), scale=1)
    assert toks.tolist() == [5, 9] and w.tolist() == [1, 3]
    toks, w = quantise_query(np.array([5, 7, 9]), np.array([1.0, 0.3, 2.6]), scale=100)
    assert w.tolist() == [100, 30, 260]


# ------------------------------------------------------------------ spellings
def test_spellings_are_lucene_safe_unique_and_reversible():
    spellings = token_spellings(AWKWARD)
    assert len(set(spellings)) == len(AWKWARD)
    for i, (tok, s) in enumerate(zip(AWKWARD, spellings)):
        assert s, tok
        assert not any(c.isspace() for c in s), (tok, s)
        assert s == s.strip() and len(s.split()) == 1
        assert utf16_len(s) <= MAX_TERM_CHARS, (tok, utf16_len(s))
        back = unspell(s)
        if back is None:  # id-carrying form: only for empty or over-long spellings
            assert s.endswith(f"%#{i}")
            assert tok == "" or utf16_len(spell_token(tok, i, max_chars=10**6)) > MAX_TERM_CHARS
        else:
            assert back == tok
    # safe tokenizer strings stay as they are (Pyserini's own tokenizers produce the same)
    assert spellings[:4] == ["Ġgame", "game", "Game", "▁game"]
    assert spell_token("x" * 255, 0) == "x" * 255


def test_spellings_random_strings_round_trip():
    rng = np.random.default_rng(1)
    alphabet = list("ab%# \t\n\u00a0é😀Ġ\u200d") + ["\u2029", "\x1f"]
    toks = list(dict.fromkeys("".join(rng.choice(alphabet, size=int(rng.integers(0, 120)))) for _ in range(2000)))
    spellings = token_spellings(toks)
    assert len(set(spellings)) == len(toks)
    for i, (t, s) in enumerate(zip(toks, spellings)):
        assert not any(c.isspace() for c in s) and utf16_len(s) <= MAX_TERM_CHARS
        assert unspell(s) in (t, None)


def test_vocabulary_strings_pads_past_the_tokenizer(tiny_tokenizer):
    n = len(tiny_tokenizer)
    strings = vocabulary_strings(tiny_tokenizer, n + 3)
    assert strings[:n] == tiny_tokenizer.convert_ids_to_tokens(list(range(n)))
    assert strings[n:] == [None] * 3
    spellings = token_spellings(strings)
    assert spellings[n:] == [f"%#{n}", f"%#{n + 1}", f"%#{n + 2}"]


# ------------------------------------------------------------------ writers
def test_write_collection_jsonl(tmp_path):
    spellings = ["a", "b%20c", "Ġd", "e"]
    mat = np.array([[3, 0, 7, 0], [0, 0, 0, 0], [1, 2, 0, 5]], dtype=np.float32)  # doc 1 has no token left
    path = tmp_path / "coll" / "docs.jsonl"
    n = write_collection(path, ["x1", "x2", "x3"], index_from_dense(mat), spellings, progress=False)
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert n == 2 and [d["id"] for d in lines] == ["x1", "x3"]
    assert lines[0] == {"id": "x1", "contents": "", "vector": {"Ġd": 7, "a": 3}}
    assert lines[1]["vector"] == {"e": 5, "b%20c": 2, "a": 1}
    assert list(lines[1]["vector"].values()) == [5, 2, 1]  # largest first
    assert all(isinstance(v, int) for d in lines for v in d["vector"].values())
    assert [p.name for p in path.parent.iterdir()] == ["docs.jsonl"]  # no temporary left behind
    with pytest.raises(ValueError, match="document ids"):
        write_collection(path, ["x1"], index_from_dense(mat), spellings, progress=False)


def test_export_queries_tsv_repeats_tokens_by_weight(tmp_path):
    spellings = ["a", "b", "Ġc", "d"]
    queries = [
        ("q1", "first query", np.array([2, 0, 3]), np.array([1.0, 1.0, 1.0])),
        ("q2", "second", np.array([1, 3]), np.array([2.0, 0.4])),  # 0.4 rounds to 0: dropped
    ]
    stats = export_queries(queries, spellings, tmp_path, scale=1.0)
    assert stats == {"queries": 2, "query_scale": 1.0, "tokens_dropped": 1, "queries_without_tokens": 0}
    rows = dict(line.split("\t") for line in (tmp_path / QUERIES_TSV).read_text(encoding="utf-8").splitlines())
    # Pyserini's default impact query encoder counts whitespace-split tokens: the vector comes back
    assert Counter(rows["q1"].split()) == {"Ġc": 1, "a": 1, "d": 1}
    assert Counter(rows["q2"].split()) == {"b": 2}
    js = [json.loads(x) for x in (tmp_path / QUERIES_JSONL).read_text(encoding="utf-8").splitlines()]
    assert js[1] == {"id": "q2", "contents": "second", "vector": {"b": 2}}
    with pytest.raises(ValueError, match="query id"):
        export_queries([("q 3", "x", np.array([0]), np.array([1.0]))], spellings, tmp_path)


def test_same_up_to_ties():
    d, s = np.array([4, 2, 7, 1]), np.array([9.0, 5.0, 5.0, 3.0])
    assert same_up_to_ties(d, s, np.array([4, 7, 2, 1]), s) is None  # order inside a tie
    assert same_up_to_ties(d, s, np.array([4, 2, 7, 8]), s) is None  # boundary tie cut differently
    assert same_up_to_ties(d, s, np.array([4, 2, 7, 8]), s, k=5) is not None  # ... unless the list is not full
    assert "score at rank 2" in same_up_to_ties(d, s, d, np.array([9.0, 5.5, 5.0, 3.0]))
    assert "documents with score 5.0" in same_up_to_ties(d, s, np.array([4, 2, 6, 1]), s)


# ------------------------------------------------------------------ against Lucene
@pytest.fixture(scope="module")
def pyserini_ready():
    from indexer.exports.lucene_jvm import PyseriniUnavailable, import_pyserini

    try:
        import_pyserini()
    except PyseriniUnavailable as exc:
        pytest.skip(f"pyserini/Java unavailable: {exc}")


def assert_lucene_equals_numba(backend, queries: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[int, float]:
    """Top-k of Lucene vs the Numba index over the same integers; returns (hits compared,
    largest score)."""
    numba_index = backend.quantised_index()
    q_int = [quantise_query(t, w, backend.query_scale) for t, w in queries]
    n_docs, n_scores = numba_index.batch_search([(t, w.astype(np.float32)) for t, w in q_int], k)
    l_docs, l_scores = backend.batch_search_quantised(queries, k)
    compared = 0
    for i in range(len(queries)):
        problem = same_up_to_ties(n_docs[i], n_scores[i], l_docs[i], l_scores[i], k)
        assert problem is None, f"query {i}: {problem}"
        compared += int((l_docs[i] >= 0).sum())
    return compared, float(np.max(l_scores[l_docs >= 0], initial=0.0))


def test_lucene_matches_numba_on_toy_index(pyserini_ready, tiny_embedder, toy_corpus, tmp_path):
    """Tiny model: logits 0.1-0.6 at scale 20 give impacts 3-12, so ties are everywhere."""
    from indexer.build import build_index
    from indexer.exports.lucene import export_pyserini, read_export, read_token_map
    from retriever.backends.lucene import LuceneBackend
    from retriever.retriever import Retriever

    index = tmp_path / "index"
    build_index(toy_corpus, index, tiny_embedder, top_k=24, progress=False)
    tokens = vocabulary_strings(tiny_embedder.tokenizer, tiny_embedder.vocab_size)
    info = export_pyserini(index, tmp_path / "exp", tokens=tokens, scale=20.0, progress=False)
    assert read_export(tmp_path / "exp") == info
    assert (tmp_path / "exp" / "lucene").is_dir() and info["lucene_build"]["seconds"] > 0
    qz = info["quantisation"]
    assert qz["postings_kept"] + qz["postings_dropped"] == 40 * 24 and qz["postings_dropped"] < 40 * 24
    with pytest.raises(FileExistsError):
        export_pyserini(index, tmp_path / "exp", tokens=tokens, progress=False)

    backend = LuceneBackend(index, tmp_path / "exp")
    retriever = Retriever.load(index, embedder=tiny_embedder)
    texts = ["cat dog parrot", "computer memory", "river sea rain", "game player score", "the of in"]
    encoded = retriever.encode(texts)
    queries = [(e.tokens, e.weights) for e in encoded]
    queries.append((np.array([0, 1, 2, 3, 4, 5]), np.array([3.0, 1.0, 2.0, 0.2, 1.0, 4.0])))  # integer weights > 1
    assert assert_lucene_equals_numba(backend, queries, k=10)[0] > 0
    assert assert_lucene_equals_numba(backend, queries, k=100)[0] > 0

    # Retriever(backend="lucene") routes sparse search through Lucene, in weight units.
    with pytest.raises(ValueError, match="lucene_index"):
        Retriever.load(index, embedder=tiny_embedder, backend="lucene")
    via_lucene = Retriever.load(index, embedder=tiny_embedder, backend="lucene", lucene_index=tmp_path / "exp")
    for e in encoded:
        hits = via_lucene.search_encoded([e], k=5)[0]
        docs, scores = backend.search(e.tokens, e.weights, 5)
        assert [h.doc_id for h in hits] == [backend.doc_ids[d] for d in docs]
        assert [h.score for h in hits] == scores.tolist()
        for h in hits:  # explanations: quantised document weights x the query's float weights
            assert sum(h.matched_tokens.values()) == pytest.approx(h.score, rel=0.05)

    # The exported topics, read by Pyserini's own default impact query encoder, give the same runs.
    from pyserini.encode import TokFreqQueryEncoder

    export_queries([(f"q{i}", t, e.tokens, e.weights) for i, (t, e) in enumerate(zip(texts, encoded))], read_token_map(tmp_path / "exp"), tmp_path / "exp")
    rows = [line.split("\t") for line in (tmp_path / "exp" / "queries.tsv").read_text(encoding="utf-8").splitlines()]
    tokfreq = TokFreqQueryEncoder()
    for (qid, text), e in zip(rows, encoded):
        assert tokfreq.encode(text) == backend.query_vector(e.tokens, e.weights)
        hits = backend.searcher.search(tokfreq.encode(text), 10)
        docs, scores = backend.search_quantised(e.tokens, e.weights, 10)
        assert [h.docid for h in hits] == [backend.doc_ids[d] for d in docs]
        assert np.rint([h.score for h in hits]).tolist() == scores.tolist()


@pytest.mark.slow
def test_lucene_equals_numba_on_adi_top100(pyserini_ready, smollm, adi, tmp_path_factory):
    """The real default model on ADI: Lucene and our Numba index over the same quantised
    vectors give the same top-100 rankings and scores, up to ties."""
    from indexer.build import build_index
    from indexer.exports.lucene import export_pyserini
    from retriever.backends.lucene import LuceneBackend
    from retriever.retriever import Retriever

    work = tmp_path_factory.mktemp("adi-lucene")
    build_index(adi, work / "index", smollm, progress=False)
    info = export_pyserini(work / "index", work / "exp", tokens=vocabulary_strings(smollm.tokenizer, smollm.vocab_size), progress=False)
    assert info["quantisation"]["float32_exact_up_to_query_weight"] >= 1
    lines = (work / "exp" / COLLECTION_DIR / COLLECTION_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == info["n_docs"] - info["quantisation"]["docs_without_tokens"]
    assert any("Ġ" in tok for tok in json.loads(lines[0])["vector"])  # byte-level BPE forms kept as is

    backend = LuceneBackend(work / "index", work / "exp")
    retriever = Retriever.load(work / "index", embedder=smollm)
    texts = [json.loads(x)["text"] for x in (adi / "queries.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    encoded = retriever.encode(texts)
    compared, top = assert_lucene_equals_numba(backend, [(e.tokens, e.weights) for e in encoded], k=100)
    assert compared >= 50 * len(texts)  # ADI has 82 docs: the lists are long, not a few hits each
    assert top < 2**24  # the regime where both sides' float32 scores are exact integers


def test_build_index_export_pyserini_and_docs_cli(pyserini_ready, toy_corpus, tiny_model_dir, tmp_path, capsys):
    """``build-index --export-pyserini`` and ``python -m indexer.cli_lucene docs``, tiny model on disk."""
    from indexer import cli as build_cli
    from indexer import cli_lucene
    from indexer.exports import lucene as exp

    index, out = tmp_path / "index", tmp_path / "exp"
    # the aligned tokens are what the export holds (the default index has none since issue 71)
    args = ["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--quiet", "--top-k", "16", "--channels", "sparse,bm25"]
    assert build_cli.main([*args, "--export-pyserini", str(out)]) == 0
    assert "Lucene impact index" in capsys.readouterr().out
    info = exp.read_export(out)
    assert (out / "lucene").is_dir() and info["n_docs"] == 40
    assert info["quantisation"]["doc_scale"] == exp.DOC_SCALE and info["quantisation"]["query_scale"] == exp.QUERY_SCALE
    # an existing export is refused before any indexing work
    assert build_cli.main([*args, "--export-pyserini", str(out)]) == 2
    assert "exists" in capsys.readouterr().err

    # the stand-alone command reads the vocabulary from the index's model; same collection
    assert cli_lucene.main(["docs", "--index", str(index), "--out", str(tmp_path / "exp2"), "--no-lucene", "--quiet", "--scale", "10"]) == 0
    again = exp.read_export(tmp_path / "exp2")
    assert again["lucene_index"] is None and not (tmp_path / "exp2" / "lucene").exists()
    coll = f"{exp.COLLECTION_DIR}/{exp.COLLECTION_FILE}"
    assert (tmp_path / "exp2" / coll).read_text(encoding="utf-8") == (out / coll).read_text(encoding="utf-8")
    assert json.loads((tmp_path / "exp2" / exp.TOKEN_MAP).read_text(encoding="utf-8")) == json.loads((out / exp.TOKEN_MAP).read_text(encoding="utf-8"))
    assert cli_lucene.main(["docs", "--index", str(tmp_path / "nowhere"), "--out", str(tmp_path / "exp3")]) == 2
    assert "not an index" in capsys.readouterr().err
