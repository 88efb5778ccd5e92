"""benchmarks/scale.py on a few hundred synthetic documents: what it generates, and the table it writes."""
from __future__ import annotations

import json

import numpy as np

from experiments import scale


def test_synthetic_documents_have_k_distinct_zipfian_tokens():
    cdf, perm = scale.zipf_cdf(2000, 1.0, seed=0)
    tokens, weights = scale.synthetic_shard(300, 64, cdf, perm, seed=1)
    assert tokens.shape == weights.shape == (300, 64)
    assert all(len(set(row)) == 64 for row in tokens.tolist())
    assert (np.diff(weights, axis=1) <= 0).all() and weights.min() >= 15 and weights.max() <= 35
    df = np.bincount(tokens.ravel(), minlength=2000)
    assert df[perm[0]] > df[perm[1000]]  # the most probable token is in more documents than a mid-rank one


def test_scale_run_writes_a_report_table(tmp_path):
    results = tmp_path / "scale.json"
    argv = ["--docs", "500", "--top-k", "32", "--shard-size", "200", "--queries", "5", "--query-tokens", "8", "--k", "10",
            "--milvus-docs", "0", "--out", str(tmp_path / "work"), "--results", str(results)]  # fmt: skip
    assert scale.main(argv) == 0
    table = json.loads(results.read_text())
    assert table["kind"] == "table" and table["rows"][0][0].startswith("Numba")
    assert table["details"]["postings"] == 500 * 32 and table["details"]["n_docs"] == 500
