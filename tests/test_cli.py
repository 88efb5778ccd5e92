"""``build-index`` and ``search-index`` through their ``main(argv)``, with the tiny model on disk."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from indexer import cli as build_cli
from indexer.manifest import MANIFEST, Manifest
from retriever import cli as search_cli
from retriever.retriever import Retriever


def build(corpus: Path, index: Path, model: Path, *extra: str) -> int:
    return build_cli.main(
        ["--corpus", str(corpus), "--index", str(index), "--model", str(model), "--adapter", "none", "--top-k", "16", "--quiet", *extra]
    )


@pytest.fixture
def index(toy_corpus, tiny_model_dir, tmp_path, capsys) -> Path:
    path = tmp_path / "index"
    assert build(toy_corpus, path, tiny_model_dir, "--dense") == 0
    capsys.readouterr()
    return path


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_build_index_reports_what_it_did(toy_corpus, tiny_model_dir, tmp_path, capsys):
    from indexer.channel_set import default_channels

    # the LLM's settings are recorded where a channel reads it (the default, fast, reads none: issue 71)
    assert build(toy_corpus, tmp_path / "index", tiny_model_dir, "--pooling", "mean", "--max-length", "32", "--batch-size", "8",
                 "--channels", "sparse,bm25") == 0
    out = capsys.readouterr().out
    assert f"indexed 40 documents into {tmp_path / 'index'}" in out and "skipped 0 empty" in out
    m = Manifest.read(tmp_path / "index")
    assert m.n_docs == 40 and m.record("sparse")["top_k"] == 16 and m.record("dense") is None and "sparse" not in default_channels("fast")
    assert m.model["name"] == str(tiny_model_dir.resolve())
    assert (m.embedding["pooling"], m.embedding["max_length"], m.embedding["batch_size"]) == ("mean", 32, 8)
    assert m.embedding["fold_all_caps"] is True


def test_build_index_keep_case_is_recorded_and_reloaded(toy_corpus, tiny_model_dir, tmp_path, capsys):
    assert build(toy_corpus, tmp_path / "index", tiny_model_dir, "--keep-case") == 0
    assert Manifest.read(tmp_path / "index").embedding["fold_all_caps"] is False
    from retriever.retriever import Retriever

    assert Retriever.load(tmp_path / "index").embedder.config.fold_all_caps is False


def test_build_index_without_flags_builds_the_fast_profiles_index(toy_corpus, tiny_model_dir, tmp_path, capsys, caplog):
    from indexer.channel_set import default_channels

    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(tmp_path / "i"), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--top-k", "16"]) == 0
    out = capsys.readouterr().out
    want = default_channels()  # fast's: BM25 and MiniLM where it is installed (make installs it), no LLM
    assert want == default_channels("fast") and "encoder2" not in want
    assert out.startswith(f"channels: {want[0]}") and "(--profile fast's" in out
    r = Retriever.load(tmp_path / "i", profile=None, query_encoder="llm")  # the LLM encodes queries: every channel can be searched
    assert [m for m in r.modes if m != "hybrid"] == list(want)
    r = Retriever.load(tmp_path / "i")
    assert r.default_mode == "hybrid"
    if "encoder" in want:  # the fast profile: its channels fused, no LLM per query
        from retriever.profiles import PROFILES

        assert r.profile is PROFILES["fast"] and set(r.channels_of("hybrid")) == set(PROFILES["fast"].channels)
        with caplog.at_level("WARNING"):  # best on fast's index: what it lacks, and how to build it, said
            Retriever.load(tmp_path / "i", profile="best")
        assert "encoder2" in caplog.text and "build-index --profile best" in caplog.text
    else:  # no profile fits an index without the encoder: every channel built is fused
        assert r.profile is None and set(r.channels_of("hybrid")) == set(want)
    assert search_cli.main(["--index", str(tmp_path / "i"), "--json", "-k", "2", "cat"]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert row["mode"] == "hybrid" and row["hits"] and set(row["hits"][0]["channels"]) <= set(want)
    # compact as measured for fast (issue 53): 4-bit impacts, bit-packed doc numbers (format 7), MiniLM at its compact kind
    from indexer.compact import compact_dense_kind
    from indexer.layout import UINT4_IMPACTS
    from indexer.manifest import STREAM_FORMAT_VERSION

    m = Manifest.read(tmp_path / "i")
    # no aligned tokens in fast since issue 71: BM25's 8-bit postings carry the layout
    assert m.format_version == STREAM_FORMAT_VERSION and m.packed and m.record("sparse") is None and m.record("lexical")["impacts"] != UINT4_IMPACTS
    for mode in ("dense", "encoder", "encoder2"):
        assert (m.record(mode) or {}).get("kind") == (compact_dense_kind("Flat", True, mode) if mode in want else None), mode


@pytest.mark.parametrize("profile", ["best", "both"])
def test_build_index_profile_best_or_both(toy_corpus, tiny_model_dir, tmp_path, capsys, profile):
    from indexer.channel_set import default_channels
    from indexer.manifest import RANGE_FORMAT_VERSION
    from retriever.profiles import PROFILES

    assert build(toy_corpus, tmp_path / "i", tiny_model_dir, "--profile", profile) == 0
    want = default_channels(profile)
    m = Manifest.read(tmp_path / "i")
    # best's layout: 8 bits, range16 (on BM25's postings: no aligned tokens in best or both since issue 71)
    assert m.format_version == RANGE_FORMAT_VERSION and m.ranged and m.record("sparse") is None and m.record("lexical")["impacts"] == "uint8"
    from indexer.channels import CHANNEL_SPECS

    assert [c.mode for c in CHANNEL_SPECS if c.record(m)] == list(want)
    if "encoder2" not in want:
        pytest.skip("mpnet is not installed here: best falls back to the LLM's dense channel and MiniLM (checked above)")
    best = PROFILES["best"]
    assert Retriever.load(tmp_path / "i", profile="best").profile is best
    # with no --profile: fast where the index holds MiniLM (both), else the profile it was built for (best)
    assert Retriever.load(tmp_path / "i").profile is PROFILES["fast" if profile == "both" else "best"]


def test_build_index_is_compact_unless_no_compact(toy_corpus, tiny_model_dir, tmp_path):
    from indexer.compact import COMPACT_DENSE_KIND
    from indexer.manifest import COMPACT_FORMAT_VERSION, FORMAT_VERSION, RANGE_FORMAT_VERSION

    assert build(toy_corpus, tmp_path / "c", tiny_model_dir, "--dense", "--profile", "both") == 0
    m = Manifest.read(tmp_path / "c")
    assert m.compact and m.format_version == RANGE_FORMAT_VERSION and m.ranged and m.record("dense")["kind"] == COMPACT_DENSE_KIND
    assert build(toy_corpus, tmp_path / "i32", tiny_model_dir, "--dense", "--doc-ids", "int32", "--impact-bits", "8") == 0
    m = Manifest.read(tmp_path / "i32")
    assert m.compact and m.format_version == COMPACT_FORMAT_VERSION and not m.ranged
    assert build(toy_corpus, tmp_path / "f", tiny_model_dir, "--dense", "--no-compact") == 0
    m = Manifest.read(tmp_path / "f")
    assert not m.compact and m.format_version == FORMAT_VERSION and m.record("dense")["kind"] == "Flat" and "impacts" not in m.record("sparse")


def test_build_index_doc_ids(toy_corpus, tiny_model_dir, tmp_path, capsys):
    from indexer.manifest import RANGE_FORMAT_VERSION, STREAM_FORMAT_VERSION

    for flag, version, attr in (("range16", RANGE_FORMAT_VERSION, "ranged"), ("bitpacked", STREAM_FORMAT_VERSION, "packed")):
        assert build(toy_corpus, tmp_path / flag, tiny_model_dir, "--doc-ids", flag, "--impact-bits", "8") == 0
        m = Manifest.read(tmp_path / flag)
        assert m.compact and m.format_version == version and getattr(m, attr)
    assert build(toy_corpus, tmp_path / "bad", tiny_model_dir, "--doc-ids", "range16", "--no-compact") == 2
    assert "compact" in capsys.readouterr().err


@pytest.mark.parametrize("flags, channels", [
    (["--channels", "sparse"], ["sparse"]),
    (["--channels", "bm25,dense"], ["sparse", "dense", "bm25"]),
    (["--dense"], ["sparse", "dense"]),  # the older flags keep their meaning
    (["--lexical", "tokens"], ["sparse", "bm25"]),
    (["--channels", "bm25", "--lexical", "tokens"], ["sparse", "bm25"]),
])
def test_build_index_channels(toy_corpus, tiny_model_dir, tmp_path, capsys, flags, channels):
    assert build(toy_corpus, tmp_path / "i", tiny_model_dir, *flags) == 0
    m = Manifest.read(tmp_path / "i")
    assert bool(m.record("dense")) == ("dense" in channels) and bool(m.record("lexical")) == ("bm25" in channels) and not m.record("encoder")
    if "--lexical" in flags:
        assert m.record("lexical")["analyzer"] == "tokens"


def test_build_index_unknown_channel(toy_corpus, tiny_model_dir, tmp_path, capsys):
    expect_error(capsys, build(toy_corpus, tmp_path / "i", tiny_model_dir, "--channels", "sparse,telepathy"),
                 "build-index: error:", "unknown channel 'telepathy'", "sparse, dense, dense-ef, bm25, encoder")
    assert not (tmp_path / "i").exists()


def test_search_index_json(index, capsys):
    assert search_cli.main(["--index", str(index), "--json", "-k", "3", "cat and dog", "computer memory"]) == 0
    out = capsys.readouterr()
    rows = json_lines(out.out)
    assert [r["query"] for r in rows] == ["cat and dog", "computer memory"]
    assert all(r["mode"] == "hybrid" for r in rows) and out.err == ""  # sparse + dense: hybrid by default, silently
    expected = Retriever.load(index).batch_search(["cat and dog", "computer memory"], k=3)
    for row, hits in zip(rows, expected):
        assert 0 < len(row["hits"]) <= 3
        assert [h["doc_id"] for h in row["hits"]] == [h.doc_id for h in hits]
        for h in row["hits"]:
            assert {"doc_id", "score", "matched_tokens", "matched_ids", "channels"} <= set(h)
            assert sum(h["channels"].values()) == pytest.approx(h["score"], rel=1e-5)
    assert search_cli.main(["--index", str(index), "--json", "--mode", "sparse", "-k", "3", "cat and dog"]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    for h in row["hits"]:  # sparse: the words and the raw token ids each add up to the score
        assert sum(h["matched_tokens"].values()) == pytest.approx(h["score"], rel=1e-5)
        assert sum(h["matched_ids"].values()) == pytest.approx(h["score"], rel=1e-5)
        assert all(key.isdigit() for key in h["matched_ids"])  # token ids, for tools


def test_search_index_text_output(index, capsys):
    assert search_cli.main(["--index", str(index), "-k", "2", "--tokens", "3", "parrot"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "query: parrot"
    assert len(lines) == 3 and lines[1].lstrip().startswith("1. ") and lines[2].lstrip().startswith("2. ")
    hit = Retriever.load(index).search("parrot", k=1)[0]
    assert hit.doc_id in lines[1] and "[" in lines[1]  # hybrid: the channels' shares


def test_search_index_says_which_mode_an_index_without_channels_to_fuse_gets(toy_corpus, tiny_model_dir, tmp_path, capsys):
    assert build(toy_corpus, tmp_path / "sparse", tiny_model_dir, "--channels", "sparse") == 0
    capsys.readouterr()
    assert search_cli.main(["--index", str(tmp_path / "sparse"), "--json", "cat"]) == 0
    out = capsys.readouterr()
    assert json_lines(out.out)[0]["mode"] == "sparse"
    assert "mode sparse" in out.err and "no other channel" in out.err


def test_search_index_reads_queries_from_stdin(index, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("cat\n\n  \nsnow on the mountain\n"))
    assert search_cli.main(["--index", str(index), "--json"]) == 0
    assert [r["query"] for r in json_lines(capsys.readouterr().out)] == ["cat", "snow on the mountain"]
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert search_cli.main(["--index", str(index), "--json"]) == 0
    assert capsys.readouterr().out == ""


def test_search_index_dense_mode(index, capsys):
    assert search_cli.main(["--index", str(index), "--json", "--mode", "dense", "-k", "4", "lake"]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert len(row["hits"]) == 4 and all(h["matched_tokens"] == {} for h in row["hits"])


# ------------------------------------------------------------------ errors
def expect_error(capsys, rc: int, *phrases: str) -> str:
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    for p in phrases:
        assert p in captured.err, (p, captured.err)
    return captured.err


def test_build_index_bad_corpus(tmp_path, tiny_model_dir, capsys):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"_id": "1", "text": "fine"}\n{"_id": "2", "text": "fine too"}\n{"_id": "3"}\n', encoding="utf-8")
    rc = build(corpus, tmp_path / "index", tiny_model_dir)
    expect_error(capsys, rc, "build-index: error:", f"{corpus}:3:", "'text/contents'", "missing text")
    assert not (tmp_path / "index").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_build_index_missing_corpus(tmp_path, tiny_model_dir, capsys):
    rc = build(tmp_path / "nowhere.jsonl", tmp_path / "index", tiny_model_dir)
    expect_error(capsys, rc, "build-index: error:", "nowhere.jsonl", "no such file")


def test_build_index_refuses_to_overwrite(index, toy_corpus, tiny_model_dir, capsys):
    before = (index / MANIFEST).read_bytes()
    expect_error(capsys, build(toy_corpus, index, tiny_model_dir), "build-index: error:", "exists; pass --overwrite")
    assert (index / MANIFEST).read_bytes() == before
    assert build(toy_corpus, index, tiny_model_dir, "--overwrite") == 0


def test_build_index_unknown_model(toy_corpus, tmp_path, capsys):
    rc = build_cli.main(["--corpus", str(toy_corpus), "--index", str(tmp_path / "i"), "--model", "no-such-model", "--quiet"])
    expect_error(capsys, rc, "build-index: error:", "no-such-model", "smollm2-135m")
    assert not (tmp_path / "i").exists()


def test_build_index_bad_adapter(toy_corpus, tiny_model_dir, tmp_path, capsys):
    rc = build_cli.main(
        ["--corpus", str(toy_corpus), "--index", str(tmp_path / "i"), "--model", str(tiny_model_dir), "--adapter", str(tmp_path)]
    )
    expect_error(capsys, rc, "build-index: error:", "adapter_config.json")


def test_search_index_not_an_index(tmp_path, capsys):
    expect_error(capsys, search_cli.main(["--index", str(tmp_path), "q"]), "search-index: error:", "not an index")


def test_search_index_dense_without_dense_vectors(toy_corpus, tiny_model_dir, tmp_path, capsys):
    assert build(toy_corpus, tmp_path / "sparse-only", tiny_model_dir, "--channels", "sparse") == 0
    capsys.readouterr()
    rc = search_cli.main(["--index", str(tmp_path / "sparse-only"), "--mode", "dense", "q"])
    expect_error(capsys, rc, "search-index: error:", "sparse-only: mode 'dense' needs an index built with --dense")


def test_search_index_other_model_refused(index, other_model_dir, capsys):
    rc = search_cli.main(["--index", str(index), "--model", str(other_model_dir), "q"])
    expect_error(capsys, rc, "search-index: error:", "index built with model")


def test_search_index_other_format_version(index, capsys):
    data = json.loads((index / MANIFEST).read_text())
    data["format_version"] = 0
    (index / MANIFEST).write_text(json.dumps(data))
    expect_error(capsys, search_cli.main(["--index", str(index), "q"]), "search-index: error:", "format_version")


@pytest.mark.parametrize(
    "main, argv",
    [
        (build_cli.main, ["--index", "x"]),  # --corpus missing
        (build_cli.main, ["--corpus", "c", "--index", "x", "--pooling", "max"]),
        (search_cli.main, ["q"]),  # --index missing
        (search_cli.main, ["--index", "x", "--mode", "telepathy", "q"]),
    ],
)
def test_usage_errors_exit_2(main, argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err
