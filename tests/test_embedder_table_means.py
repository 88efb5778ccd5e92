"""benchmarks.embedder_table: means over all collections, and over the ones every variant has."""
from __future__ import annotations

import json

import pytest


def _results(folder, ndcg: dict[str, tuple[float, float]]) -> None:
    folder.mkdir()
    run = {
        "kind": "beir-eval",
        "systems": {c: {"params": {"adapter": None}} for c in ("sparse", "dense")},
        "datasets": [
            {"name": d, "results": {"sparse": {"metrics": {"ndcg@10": s}}, "dense": {"metrics": {"ndcg@10": v}}}}
            for d, (s, v) in ndcg.items()
        ],
    }
    (folder / "results.json").write_text(json.dumps(run))


def test_a_variant_on_fewer_collections_gets_means_over_the_common_ones(tmp_path):
    from benchmarks.embedder_table import main

    _results(tmp_path / "full", {"adi": (0.2, 0.4), "cisi": (0.4, 0.6), "npl": (0.1, 0.1)})
    _results(tmp_path / "part", {"adi": (0.3, 0.5), "cisi": (0.5, 0.3)})
    pairs = tmp_path / "sts.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\na\tb\t1.0\nc\td\t2.0\n")
    out = tmp_path / "table.json"
    main(["--pairs", str(pairs), "--variant", f"full=none:{tmp_path / 'full'}", "--variant", f"part=none:{tmp_path / 'part'}",
          "--sts", "full=0.5", "--sts", "part=0.6", "--model", "tiny", "--out", str(out)])
    table = json.loads(out.read_text())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}
    assert rows["full"]["mean sparse"] == pytest.approx((0.2 + 0.4 + 0.1) / 3, abs=1e-4)
    assert rows["part"]["mean sparse"] == "–"  # no npl run: no mean over all three
    assert rows["full"]["mean sparse (adi, cisi)"] == pytest.approx(0.3)
    assert rows["part"]["mean sparse (adi, cisi)"] == pytest.approx(0.4)
    assert rows["part"]["mean dense (adi, cisi)"] == pytest.approx(0.4)
    assert rows["part"]["npl sparse"] == "–"
