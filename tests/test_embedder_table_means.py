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
    from experiments.embedder_table import main

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


def test_a_lost_adapter_keeps_its_sts_and_cost_from_the_previous_table(tmp_path):
    # runs/ folders do not survive a machine; the measured runs do, and the table must still be rebuilt from them
    from experiments.embedder_table import main

    _results(tmp_path / "lost", {"adi": (0.3, 0.5), "cisi": (0.5, 0.3)})
    run = json.loads((tmp_path / "lost" / "results.json").read_text())
    for system in run["systems"].values():
        system["params"]["adapter"] = {"path": "runs/gone/adapter", "sha256": "ab" * 32}
    (tmp_path / "lost" / "results.json").write_text(json.dumps(run))
    pairs = tmp_path / "sts.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\na\tb\t1.0\nc\td\t2.0\n")
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps({
        "columns": ["embedder", "adapter / system", "STS-B ρ", "training steps", "seen", "training s"],
        "rows": [["lost run", "runs/gone/adapter", 0.71, 40, "1280 pairs", 1798]],
    }))
    out = tmp_path / "table.json"
    args = ["--pairs", str(pairs), "--variant", f"lost run=runs/gone/adapter:{tmp_path / 'lost'}", "--model", "tiny", "--out", str(out)]
    main(args + ["--carry", str(previous)])
    table = json.loads(out.read_text())
    row = dict(zip(table["columns"], table["rows"][0]))
    assert (row["STS-B ρ"], row["training steps"], row["seen"], row["training s"]) == (0.71, 40, "1280 pairs", 1798)
    assert row["mean sparse"] == pytest.approx(0.4) and row["adi dense"] == pytest.approx(0.5)
    assert "abababababab" in table["description"]
    with pytest.raises(SystemExit, match="no row named 'other'"):
        main(["--pairs", str(pairs), "--variant", f"other=runs/gone/adapter:{tmp_path / 'lost'}", "--model", "tiny",
              "--out", str(out), "--carry", str(previous)])


def _cls_results(folder, accuracy: float, max_rows: int | None, tasks=("mr", "trec")) -> None:
    folder.mkdir()
    record = {"kind": "cls-eval", "tasks": {t: {"accuracy": accuracy} for t in tasks}, "mean_accuracy": accuracy,
              "max_rows": max_rows, "embedder": {"runtime": {"dtype": "fp32"}}}
    (folder / "results.json").write_text(json.dumps(record))


def test_classification_accuracy_joins_its_row_and_mixed_protocols_are_refused(tmp_path):
    from experiments.embedder_table import main

    _results(tmp_path / "a", {"adi": (0.2, 0.4)})
    _results(tmp_path / "b", {"adi": (0.3, 0.5)})
    _cls_results(tmp_path / "cls-a", 0.8123, 2000)
    _cls_results(tmp_path / "cls-full", 0.9, None)
    pairs = tmp_path / "sts.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\na\tb\t1.0\nc\td\t2.0\n")
    out = tmp_path / "table.json"
    base = ["--pairs", str(pairs), "--variant", f"a=none:{tmp_path / 'a'}", "--variant", f"b=none:{tmp_path / 'b'}",
            "--sts", "a=0.5", "--sts", "b=0.6", "--model", "tiny", "--out", str(out)]
    main(base + ["--classification", f"a={tmp_path / 'cls-a'}"])
    table = json.loads(out.read_text())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}
    assert rows["a"]["classification acc %"] == 81.23
    assert rows["b"]["classification acc %"] == "–"  # not measured: no cell invented
    assert "capped at 2000 texts" in table["description"] and "mr, trec" in table["description"]
    with pytest.raises(SystemExit, match="max_rows"):  # a sampled and a full-set mean do not compare
        main(base + ["--classification", f"a={tmp_path / 'cls-a'}", "--classification", f"b={tmp_path / 'cls-full'}"])
    with pytest.raises(SystemExit, match="no row named 'c'"):
        main(base + ["--classification", f"c={tmp_path / 'cls-a'}"])
