"""experiments.ten_million and the Numba corpus generator it draws from (benchmarks/synthetic.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.synthetic import CHUNK, LOGIT_RANGE, alias_table, synthetic_shard, zipf_documents, zipf_table
from experiments import ten_million
from indexer.codec import PostingsCodec
from indexer.inverted_index import InvertedIndex


def test_the_alias_table_holds_the_distribution_exactly():
    rng = np.random.default_rng(0)
    p = rng.gamma(0.3, 1.0, 500)
    prob, alias = alias_table(p)
    # each cell i gives prob[i] / n to i and the rest to alias[i]: summed back, the distribution
    n = p.shape[0]
    back = prob / n + np.bincount(alias, weights=(1.0 - prob) / n, minlength=n)
    np.testing.assert_allclose(back, p / p.sum(), rtol=1e-9, atol=1e-12)
    assert ((prob >= 0) & (prob <= 1 + 1e-12)).all()


def test_documents_are_distinct_tokens_with_sorted_logits_and_do_not_depend_on_the_shard():
    prob, alias = zipf_table(2000, 1.0)
    perm = np.random.default_rng(1).permutation(2000).astype(np.int32)
    tokens, weights = zipf_documents(0, 3 * CHUNK, 20, prob, alias, perm, seed=4)
    assert all(len(set(row)) == 20 for row in tokens.tolist())
    assert (np.diff(weights, axis=1) <= 0).all() and weights.min() >= LOGIT_RANGE[0] and weights.max() <= LOGIT_RANGE[1]
    later, later_w = zipf_documents(CHUNK, CHUNK, 20, prob, alias, perm, seed=4)
    np.testing.assert_array_equal(later, tokens[CHUNK : 2 * CHUNK])
    np.testing.assert_array_equal(later_w, weights[CHUNK : 2 * CHUNK])
    assert not np.array_equal(zipf_documents(0, CHUNK, 20, prob, alias, perm, seed=5)[0], tokens[:CHUNK])
    # the distribution synthetic_shard draws: the most common tokens in as many documents (within sampling noise)
    cdf = np.cumsum(1.0 / np.arange(1, 2001)) / np.sum(1.0 / np.arange(1, 2001))
    reference = synthetic_shard(3 * CHUNK, 20, cdf, perm, seed=4)[0]
    df, df_ref = (np.bincount(t.ravel(), minlength=2000)[perm] for t in (tokens, reference))
    groups = [slice(0, 5), slice(5, 20), slice(20, 100), slice(100, 400)]  # summed: the noise of a few hundred documents averages out
    np.testing.assert_allclose([df[g].sum() for g in groups], [df_ref[g].sum() for g in groups], rtol=0.05)
    assert df[:10].sum() > 10 * max(1, df[1000:1010].sum())
    with pytest.raises(ValueError, match="multiple"):
        zipf_documents(5, 10, 20, prob, alias, perm, 0)
    with pytest.raises(ValueError, match="distinct"):
        zipf_documents(0, 10, 1500, prob, alias, perm, 0)  # 1,500 distinct of 2,000 tokens: not in 6,000 Zipfian draws


def test_build_then_measure_a_small_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(ten_million, "SHARD", 2 * CHUNK)  # several shards, across a range boundary
    info = ten_million.build(tmp_path, 70_000, 16, 1.0, 3)
    assert info["n_docs"] == 70_000 and sorted(info["files"]) == sorted(
        f"postings_{n}.npy" for n in ("indptr", "low", "offset", "rangestart", "scale", "weights"))
    index = InvertedIndex.load(tmp_path / "index", 70_000, codec=PostingsCodec.named("range16", 8))
    assert int(index.indptr[-1]) == 70_000 * 16 and index.ranges.starts.shape[1] == 3
    with pytest.raises(FileExistsError):
        ten_million.build(tmp_path, 10, 16, 1.0, 3)
    out = tmp_path / "r.json"
    ten_million.measure(tmp_path, out, n_queries=4, query_tokens=8, rounds=1, keep_masses=[0.9], depths=[50], threads=[1], command="test",
                        format_3=True, four_bit=True)
    table = json.loads(out.read_text())
    rows = {(r[0], r[3], r[4]): r for r in table["rows"]}
    assert rows["exact", 10, 1][5] == rows["exact", 100, 1][5] == 1.0  # recall against itself
    pruned = rows["pruned 0.9", 10, 1]
    assert 0 < pruned[2] < 1 and 0 <= pruned[5] <= 1
    assert table["details"]["exact_same_on_every_thread_count"] is True
    assert table["details"]["format_3_same_as_format_5"] is True and rows["exact, format 3", 10, 1][5] == 1.0
    assert 0 <= rows["exact, 4-bit impacts", 10, 1][5] <= 1 and 0 <= rows["pruned 0.9, 4-bit impacts", 10, 1][5] <= 1
    assert table["details"]["four_bit_impact_bytes"] == (70_000 * 16 + 1) // 2
    # the 4-bit copy scores as the same 16-level codes one a byte would
    nib = ten_million.four_bit_copy(index)
    one = InvertedIndex(index.indptr, index.numbers, np.rint(np.asarray(index.weights) / 17).astype(np.uint8), index.n_docs,
                        (index.scale * 17).astype(np.float32), index.offset)
    tokens, weights = np.arange(0, 40, 3, dtype=np.int64), np.linspace(0.5, 2.0, 14).astype(np.float32)
    for got, want in zip(nib.search(tokens, weights, 10), one.search(tokens, weights, 10)):
        np.testing.assert_array_equal(got, want)
