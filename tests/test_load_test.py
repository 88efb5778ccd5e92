"""experiments/load_test.py: a bounded loopback load test of ``serve`` on a tiny index."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
pytest.importorskip("httpx", reason="httpx is not installed: pip install '.[serve]'")


def test_load_test_measures_without_errors_and_writes_a_table(toy_corpus, tiny_model_dir, tmp_path):
    from benchmarks.report import render_table_section
    from experiments import load_test
    from indexer import cli as build_cli

    index = tmp_path / "index"
    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--top-k", "16", "--quiet", "--channels", "sparse,bm25,dense"]) == 0
    queries = tmp_path / "queries.txt"
    queries.write_text("cat and dog\ncomputer memory\nsnow on the mountain\n", encoding="utf-8")
    out = tmp_path / "load.json"
    rc = load_test.main(["--index", str(index), "--queries", str(queries), "--clients", "1,3", "--seconds", "1.5",
                         "--max-requests", "40", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "table" and data["columns"] == load_test.COLUMNS and len(data["rows"]) == 3
    levels = data["details"]["levels"]
    assert [lv["clients"] for lv in levels] == [1, 3]
    for lv in levels:
        assert lv["errors"] == 0 and 0 < lv["requests"] <= 40 and lv["seconds"] < 60  # bounded: stopped by itself
        assert lv["p50_ms"] <= lv["p95_ms"] <= lv["p99_ms"]
    assert data["details"]["in_process"]["requests"] == 9  # 3 queries, 3 measured passes
    assert data["details"]["rss_before_mib"] > 0 and data["details"]["rss_after_mib"] > 0
    assert data["machine"]["cpu"] in data["description"]  # the CPU is named beside the numbers
    assert "HTTP POST /search, 3 client(s)" in render_table_section(out, data, tmp_path)


def test_load_test_is_bounded_and_loopback_only():
    from experiments import load_test

    assert load_test.HOST == "127.0.0.1"
    for bad in (["--seconds", "0"], ["--seconds", "601"], ["--clients", "0"], ["--clients", "65"], ["--max-requests", "0"]):
        with pytest.raises(SystemExit):
            load_test.main(["--index", "x", "--out", "y.json", *bad])
