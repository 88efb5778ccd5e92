"""experiments.real_vectors: the corpus it draws from the pairs, and the measures it reports."""
from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import real_vectors as rv
from indexer.codec import PostingsCodec
from indexer.inverted_index import InvertedIndex


def write_pairs(folder, name: str, rows: list[tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.tsv").write_text("anchor\tpositive\n" + "".join(f"{a}\t{p}\n" for a, p in rows), encoding="utf-8")


def test_corpus_is_distinct_positives_with_their_anchors_as_queries(tmp_path):
    pairs = tmp_path / "pairs"
    write_pairs(pairs, "a", [(f"question {i}", f"answer {i}") for i in range(30)])
    write_pairs(pairs, "b", [("one title", "shared abstract"), ("another title", "shared abstract"), ("t", "other text")])
    info = rv.write_corpus(pairs, 25, tmp_path / "out")
    docs = [json.loads(x) for x in (tmp_path / "out/corpus/corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(x) for x in (tmp_path / "out/corpus/queries.jsonl").read_text().splitlines()]
    assert len(docs) == 25 and len({d["text"] for d in docs}) == 25  # a positive shared by two rows is one document
    assert [q["_id"] for q in queries] == [d["_id"] for d in docs]
    rows = {f"{f}:{line}": (a, p) for f, rs in (("a", [(f"question {i}", f"answer {i}") for i in range(30)]),) for line, (a, p) in enumerate(rs, 2)}
    for d, q in zip(docs, queries):
        if d["_id"] in rows:  # the query is the anchor of the document's own row
            assert rows[d["_id"]] == (q["text"], d["text"])
    assert sum(info["by_file"].values()) == 25
    again = rv.write_corpus(pairs, 25, tmp_path / "again")  # seeded: the same draw every time
    assert (tmp_path / "again/corpus/corpus.jsonl").read_bytes() == (tmp_path / "out/corpus/corpus.jsonl").read_bytes()
    assert again == info


def test_corpus_errors_name_the_file_line_and_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.tsv"):
        rv.read_pairs(tmp_path)
    (tmp_path / "x.tsv").write_text("anchor\tpositive\nfine\ttext\nlonely\t \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x.tsv:3: field positive"):
        rv.read_pairs(tmp_path)
    (tmp_path / "x.tsv").write_text("query\tdoc\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x.tsv:1: header"):
        rv.read_pairs(tmp_path)
    write_pairs(tmp_path / "small", "s", [("a", "b"), ("c", "b")])
    with pytest.raises(ValueError, match="only 1 distinct positives"):
        rv.choose_documents(rv.read_pairs(tmp_path / "small"), 2)


def test_recall_counts_the_exact_top_k_found():
    exact = np.array([4, 2, 9, -1])
    assert rv.recall_at(exact, [9, 4, 7], 3) == pytest.approx(2 / 3)
    assert rv.recall_at(exact, [2, 4, 9], 3) == 1.0
    assert rv.recall_at(np.array([-1, -1]), [], 2) == 0.0  # nothing to find


def test_distribution_of_a_known_index():
    # 4 documents: token 0 in all of them, token 1 in two, token 2 in one
    tokens = np.array([[0, 1], [0, 1], [0, 2], [0, 3]], np.int32)
    weights = np.array([[4, 1], [3, 2], [2, 5], [1, 6]], np.float32)
    d = rv.distribution(InvertedIndex.from_forward(tokens, weights, 8))
    assert d["docs"] == 4 and d["postings"] == 8 and d["postings_per_doc"] == 2.0 and d["lists"] == 4
    assert d["lists_in_half_the_docs"] == 2  # tokens 0 and 1
    assert d["postings_in_top_100_lists"] == 1.0
    assert d["weight_percentiles"]["50"] == pytest.approx(2.5)  # of 1, 1, 2, 2, 3, 4, 5, 6


def test_pruned_search_keeping_every_token_is_the_exact_search():
    rng = np.random.default_rng(3)
    tokens = np.stack([rng.choice(50, 6, replace=False) for _ in range(300)]).astype(np.int32)
    index = InvertedIndex.from_forward(tokens, rng.uniform(1, 9, tokens.shape).astype(np.float32), 50).quantise()
    from indexer.query_pruning import list_max_weights

    q_tok, q_w = np.array([3, 7, 11, 20], np.int64), np.array([2.0, 1.0, 0.5, 0.1], np.float32)
    docs, _ = index.search(q_tok, q_w, 10)
    got, _ = rv.pruned_search(index, q_tok, q_w, 10, 1.0, list_max_weights(index))
    assert np.array_equal(got, docs)
    # a pruned query whose candidates hold the exact top-10 finds it after the rescore
    got, _ = rv.pruned_search(index, q_tok, q_w, 10, 0.8, list_max_weights(index))
    assert rv.recall_at(docs, got, 10) >= 0.9


def test_fitted_documents_have_the_real_document_frequencies_and_weights():
    from benchmarks.synthetic import fitted_cdf, fitted_shard

    rng = np.random.default_rng(0)
    df = rng.integers(1, 100, 400)
    df[[0, 7, 399]] = 0  # tokens in no document
    cdf, order = fitted_cdf(df)
    assert cdf[-1] == 1.0 and np.array_equal(order, np.arange(len(df)))
    pool = np.array([1.5, 2.5, 7.0], np.float32)
    tokens, weights = fitted_shard(20000, 4, cdf, pool, seed=1)
    assert tokens.shape == weights.shape == (20000, 4)
    assert all(len(set(row)) == 4 for row in tokens[:500].tolist())  # distinct tokens in a document
    assert not np.isin(tokens, [0, 7, 399]).any()
    assert set(np.unique(weights).tolist()) <= set(pool.tolist()) and np.all(np.diff(weights, axis=1) <= 0)  # sorted high to low
    share = np.bincount(tokens.ravel(), minlength=len(df)) / tokens.size
    np.testing.assert_allclose(share, df / df.sum(), atol=0.0015)  # each token's share of the postings is its real one
    with pytest.raises(ValueError, match="no postings"):
        fitted_cdf(np.zeros(4, np.int64))


def test_a_fitted_index_is_a_compact_index_of_the_asked_size(tmp_path):
    rng = np.random.default_rng(2)
    tokens = np.stack([rng.choice(300, 8, replace=False) for _ in range(50)]).astype(np.int32)
    real = InvertedIndex.from_forward(tokens, rng.uniform(1, 9, tokens.shape).astype(np.float32), 300)
    info = rv.write_fitted_index(real, 1000, tmp_path / "fitted")
    assert info["docs"] == 1000 and info["tokens_per_doc"] == 8
    fitted = InvertedIndex.load(tmp_path / "fitted", 1000, n_lists=300, codec=PostingsCodec.named("int32", 8))
    assert int(fitted.indptr[-1]) == 8000
    real_lists = np.diff(real.indptr) > 0
    assert np.all(np.diff(fitted.indptr)[~real_lists] == 0)  # a token in no real document is in no fitted one
    w = fitted.float_weights()
    assert w.min() >= real.weights.min() - 0.05 and w.max() <= real.weights.max() + 0.05  # real weights (8-bit rounding apart)


def test_search_in_any_number_of_ranges_is_the_exact_search():
    rng = np.random.default_rng(5)
    tokens = np.stack([rng.choice(60, 7, replace=False) for _ in range(700)]).astype(np.int32)
    compact = InvertedIndex.from_forward(tokens, rng.uniform(1, 9, tokens.shape).astype(np.float32), 60).quantise()
    q_tok, q_w = np.array([1, 5, 9, 33], np.int64), np.array([1.0, 0.7, 0.2, 2.0], np.float32)
    for index in (compact, compact.pack()):
        want = index.search(q_tok, q_w, 10)
        for parts in (1, 4, 16):
            got = rv.search_in_parts(index, q_tok, q_w, 10, parts)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_a_fitted_index_never_removes_files_it_did_not_write(tmp_path):
    real = InvertedIndex.from_forward(np.array([[0, 1], [1, 2]], np.int32), np.ones((2, 2), np.float32), 4)
    theirs = tmp_path / "fitted"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(FileExistsError, match="did not write"):
        rv.write_fitted_index(real, 10, theirs)
    assert (theirs / "notes.txt").read_text(encoding="utf-8") == "mine"
    mine = tmp_path / "again"
    rv.write_fitted_index(real, 10, mine)
    rv.write_fitted_index(real, 20, mine)  # its own earlier output is replaced
    assert InvertedIndex.load(mine, 20, n_lists=4, codec=PostingsCodec.named("int32", 8)).n_docs == 20
