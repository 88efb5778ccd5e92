"""Smoke tests of the studies that had none (experiments/): each study's ``main`` run end to end on the
tiny model and toy data, and what it writes checked: a results table with a row per system, variant or
collection it was asked for, and finite numbers in the cells that hold measurements.

What the numbers are worth is not judged here (a tiny random model); that the study runs against
today's code, and writes what ``beir-eval report`` renders, is.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny_sentence_encoder


def test_every_study_is_imported_by_a_test():
    """A study no test imports may stop running against today's code unseen: each module of experiments/
    is named by a test file (this one runs most of them end to end; the others have tests of their own)."""
    from conftest import REPO

    tests = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "tests").glob("test_*.py"))
    studies = sorted(p.stem for p in (REPO / "experiments").glob("*.py") if p.name != "__init__.py")
    untested = [s for s in studies if f"experiments.{s}" not in tests and f"experiments import {s}" not in tests]
    assert len(studies) > 20 and untested == []


def _table(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["kind"] == "table" and data["command"].startswith("python -m experiments.")
    assert all(len(row) == len(data["columns"]) for row in data["rows"])
    return data


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _write_beir(root: Path, docs: list[dict], queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()), encoding="utf-8")
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, rel in qrels.items() for d, s in rel.items()]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _sts_pairs(path: Path) -> Path:
    """An STS-B style TSV file of four scored pairs over the toy words."""
    rows = [("a cat and a dog", "a dog and a cat", 5.0), ("computer memory", "snow on the mountain", 0.0),
            ("ski on snow", "snow for skiing", 4.0), ("software bug", "a pet cat", 0.5)]  # fmt: skip
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows), encoding="utf-8")
    return path


@pytest.fixture
def toy_beir(tmp_path) -> Path:
    """A judged BEIR collection of the conftest's toy documents (three topics' words)."""
    from conftest import toy_docs

    docs = toy_docs(24)
    queries = {"q1": "cat dog pet", "q2": "computer memory software", "q3": "snow mountain ski"}
    qrels = {q: {docs[i]["_id"]: 1 for i in range(j, 24, 8)} for j, q in enumerate(queries)}
    return _write_beir(tmp_path / "toy", docs, queries, qrels)


# ------------------------------------------------------------------ milvus_rankers
def test_milvus_rankers_reads_each_channels_runs_and_writes_a_row_per_collection(tmp_path):
    from experiments import milvus_rankers

    for collection, scale in (("adi", 1.0), ("cisi", 30.0)):
        folder = tmp_path / "run" / "runs" / collection
        folder.mkdir(parents=True)
        for channel in milvus_rankers.CHANNELS:
            lines = [f"q{q} Q0 d{r} {r + 1} {scale * (10 - r) / 10:.4f} {channel}-milvus" for q in range(3) for r in range(10)]
            (folder / f"{channel}-milvus.trec").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "rankers.json"
    assert milvus_rankers.main(["--runs", str(tmp_path / "run"), "--out", str(out)]) == 0
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["adi", "cisi"]
    for row in data["rows"]:
        assert _finite(*row[1:]) and all(0 <= spread <= 1 for spread in row[2::2])
    # large scores are squashed by arctan: cisi's spread (scores up to 30) is far below adi's (up to 1)
    assert data["rows"][1][2] < data["rows"][0][2]


# ------------------------------------------------------------------ text2token_table
def test_text2token_table_scores_sts_per_variant(tmp_path, tiny_model_dir):
    from experiments import text2token_table

    pairs = _sts_pairs(tmp_path / "sts.tsv")
    out = tmp_path / "t2t.json"
    assert text2token_table.main(["--pairs", str(pairs), "--variant", "raw=none", "--model", str(tiny_model_dir), "--out", str(out)]) == 0
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["raw"]
    row = data["rows"][0]
    assert _finite(row[2]) and -1 <= row[2] <= 1  # STS-B Spearman
    assert row[3:] == ["–"] * (len(data["columns"]) - 3)  # no beir-eval run named: no nDCG cells


# ------------------------------------------------------------------ segments_study
def test_segments_study_writes_a_single_and_a_multi_row_per_collection(toy_beir, tmp_path, tiny_embedder, monkeypatch):
    from embedder.encoder import Embedder
    from experiments import segments_study

    monkeypatch.setattr(Embedder, "load", classmethod(lambda cls, *a, **kw: tiny_embedder))
    out = tmp_path / "segments.json"
    assert segments_study.main(["--data", str(toy_beir), "--out", str(out)]) == 0
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["toy (single)", "toy (multi)"]
    for row in data["rows"]:
        docs, vectors, _split, sparse, dense, hybrid = row[1:7]
        assert docs == 24 and vectors >= docs and _finite(sparse, dense, hybrid) and all(0 <= v <= 1 for v in (sparse, dense, hybrid))


# ------------------------------------------------------------------ update_cost
def test_update_cost_updates_and_rebuilds_to_the_same_index(toy_beir, tmp_path, tiny_embedder, monkeypatch):
    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import update_cost

    encoder_dir = save_tiny_sentence_encoder(tmp_path / "encoder")
    tiny_encoder = SentenceEncoder.load(str(encoder_dir))
    monkeypatch.setattr(Embedder, "load", classmethod(lambda cls, *a, **kw: tiny_embedder))
    monkeypatch.setattr(SentenceEncoder, "load", classmethod(lambda cls, *a, **kw: tiny_encoder))
    out = tmp_path / "update.json"
    assert update_cost.main(["--data", str(toy_beir), "--replace", "2", "--delete", "2", "--out", str(out)]) == 0
    data = _table(out)
    assert len(data["rows"]) >= 1 and data["rows"][0][0] == "toy"
    result = data["details"]["toy"]
    assert result["documents"] == {"initial": 22, "added": 2, "replaced": 2, "deleted": 2, "final": 22}
    assert _finite(*result["seconds"].values())
    for mode, same in result["same_as_rebuild"].items():
        assert same["queries"] == 3 and same["top10_ids_differ"] == 0, mode  # the update gives the rebuild's index


# ------------------------------------------------------------------ server_load
def test_server_load_serves_unique_queries_without_errors(toy_corpus, tiny_model_dir, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
    pytest.importorskip("httpx", reason="httpx is not installed: pip install '.[serve]'")
    from experiments import server_load
    from indexer import cli as build_cli

    index = tmp_path / "index"
    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--top-k", "16", "--quiet", "--channels", "sparse,bm25"]) == 0  # fmt: skip
    queries = tmp_path / "queries.txt"
    queries.write_text("cat and dog\ncomputer memory\nsnow on the mountain\n", encoding="utf-8")
    out = tmp_path / "server-load.json"
    rc = server_load.main(["--index", str(index), "--queries", str(queries), "--clients", "1,2", "--concurrency", "1",
                           "--seconds", "1", "--out", str(out)])  # fmt: skip
    assert rc == 0
    data = _table(out)
    assert [(row[0], row[1]) for row in data["rows"]] == [(1, 1), (1, 2)]  # a row per (max concurrency, clients)
    for _conc, _clients, requests, seconds, qps, p50, p99, errors, _per_forward in data["rows"]:
        assert requests > 0 and errors == 0 and _finite(seconds, qps, p50, p99) and p50 <= p99


# ------------------------------------------------------------------ fusion studies over stored runs
@pytest.fixture
def stored_runs(tmp_path, monkeypatch) -> Path:
    """Three judged toy collections (the shared-collection names resolve to them through
    ALIGNED_TOKENS_DATA) and a beir-eval output folder with a TREC run of each channel on each:
    bm25 and sparse find the judged documents at different ranks, dense is noise."""
    import numpy as np
    from conftest import toy_docs

    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    for c, name in enumerate(("adi", "cisi", "medline")):
        docs = toy_docs(20, seed=c)
        queries = {f"q{i}": f"query {i}" for i in range(6)}
        qrels = {q: {docs[(3 * i + j) % 20]["_id"]: 1 for j in range(2)} for i, q in enumerate(queries)}
        _write_beir(data / name, docs, queries, qrels)
        folder = tmp_path / "run" / "runs" / name
        folder.mkdir(parents=True)
        for system, hit_rank in (("bm25", 0), ("sparse", 3), ("dense", None)):
            lines = []
            for q, rel in qrels.items():
                ids = [d["_id"] for d in docs if d["_id"] not in rel]
                rng.shuffle(ids)
                if hit_rank is not None:
                    ids[hit_rank:hit_rank] = list(rel)
                else:
                    ids += list(rel)
                lines += [f"{q} Q0 {d} {r + 1} {20 - r + rng.random():.4f} {system}" for r, d in enumerate(ids)]
            (folder / f"{system}.trec").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setenv("ALIGNED_TOKENS_DATA", str(data))
    return tmp_path / "run"


def test_fusion_cv_scores_every_collection_held_out(stored_runs, tmp_path):
    from experiments import fusion_cv

    out, subsets_out = tmp_path / "cv.json", tmp_path / "subsets.json"
    assert fusion_cv.main(["--runs", str(stored_runs), "--channels", "sparse,dense,bm25", "--baseline-runs", str(stored_runs),
                           "--baseline", "bm25", "--folds", "2", "--step", "0.5", "--subsets", "bm25+sparse,bm25+dense",
                           "--subsets-out", str(subsets_out), "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["adi", "cisi", "medline", "mean"]
    assert all(_finite(*row[1:]) for row in data["rows"])
    loco = data["columns"].index("hybrid LOCO")
    assert all(0 <= row[loco] <= 1 for row in data["rows"])
    # the judged documents top bm25: fused or alone, nothing held out beats 1.0, and bm25 alone is perfect
    assert data["rows"][-1][data["columns"].index("bm25")] == 1.0
    subsets = _table(subsets_out)
    assert {row[0] for row in subsets["rows"]} == {"bm25+sparse", "bm25+dense"}
    assert all(_finite(row[3]) for row in subsets["rows"])  # nDCG@10 of each subset, per collection and mean


def test_operating_points_judges_each_rule_leaving_one_collection_out(stored_runs, tmp_path):
    from experiments import operating_points

    out = tmp_path / "points.json"
    results = stored_runs.parent
    assert operating_points.main(["--results", str(results), "--collections", "adi,cisi,medline", "--step", "0.5",
                                  "--point", "p=bm25@run/bm25,sparse@run/sparse,dense@run/dense", "--baseline", "bm25@run/bm25",
                                  "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    rules = [row[1] for row in data["rows"]]
    assert rules == ["baseline", *operating_points.RULES]  # a row per rule, after the baseline's
    for row in data["rows"]:
        assert _finite(*row[2:6]) and all(0 <= v <= 1 for v in row[2:6])  # adi, cisi, medline, mean


# ------------------------------------------------------------------ studies over beir-eval's default indexes
@pytest.fixture
def default_indexes(tmp_path, tiny_model_dir) -> tuple[Path, Path]:
    """(a folder of two judged toy collections, an --index-dir holding each one's default index
    where ``beir-eval --index-dir`` puts it: default/NAME/aligned-tokens)."""
    from conftest import toy_docs

    from indexer import cli as build_cli

    data, index_dir = tmp_path / "data", tmp_path / "indexes"
    for c, name in enumerate(("adi", "cisi")):
        docs = toy_docs(16, seed=c)
        queries = {"q1": "cat dog pet", "q2": "computer memory software", "q3": "snow mountain ski"}
        qrels = {q: {docs[i]["_id"]: 1 for i in range(j, 16, 5)} for j, q in enumerate(queries)}
        folder = _write_beir(data / name, docs, queries, qrels)
        assert build_cli.main(["--corpus", str(folder), "--index", str(index_dir / "default" / name / "aligned-tokens"),
                               "--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "16", "--quiet",
                               "--channels", "sparse,bm25"]) == 0  # fmt: skip (no dense: query encoder none gives it no query)
    return data, index_dir


def test_feedback_scores_its_grid_and_a_held_out_row_per_query_encoder(default_indexes, tmp_path):
    from experiments import feedback

    data, index_dir = default_indexes
    out = tmp_path / "feedback.json"
    assert feedback.main(["--index-dir", str(index_dir), "--data", str(data), "--query-encoders", "llm,none",
                          "--docs", "1,2", "--tokens", "8", "--weights", "0.5", "--out", str(out)]) == 0  # fmt: skip
    data_ = _table(out)
    settings = [row[1].split(":")[0] for row in data_["rows"]]
    assert settings == ["no feedback", "best on all", "held out"] * 2  # per query encoder: llm, none
    for row in data_["rows"]:
        assert _finite(*row[2:5]) and all(0 <= v <= 1 for v in row[2:5])  # adi, cisi, mean


def test_expansion_depth_scores_each_m_and_holds_one_out(default_indexes, tmp_path):
    from experiments import expansion_depth

    data, index_dir = default_indexes
    out = tmp_path / "depth.json"
    assert expansion_depth.main(["--index-dir", str(index_dir), "--data", str(data), "--query-encoders", "llm",
                                 "--m", "0,8", "--out", str(out)]) == 0  # fmt: skip
    rows = _table(out)["rows"]
    assert [(row[1], row[2]) for row in rows[:4]] == [(0, "hybrid"), (0, "sparse"), (8, "hybrid"), (8, "sparse")]
    assert rows[4][1].startswith("held out: ") and len(rows) == 5
    for row in rows:
        assert _finite(*row[3:6]) and all(0 <= v <= 1 for v in row[3:6])  # adi, cisi, mean


# ------------------------------------------------------------------ embedfilter_sweep
def test_embedfilter_sweep_writes_a_row_per_tau(toy_beir, tmp_path, tiny_model_dir):
    from experiments import embedfilter_sweep

    out = tmp_path / "embedfilter.json"
    assert embedfilter_sweep.main(["--pairs", str(_sts_pairs(tmp_path / "sts.tsv")), "--data", str(toy_beir), "--variant", "raw=none",
                                   "--taus", "1,2", "--model", str(tiny_model_dir), "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    assert [(row[0], row[1]) for row in data["rows"]] == [("raw", 1), ("raw", 2)]
    full, halved = data["rows"]
    assert full[2] == 2 * halved[2]  # tau 2 keeps half the dimensions
    for row in data["rows"]:
        rho, ndcg, mean = row[4:7]
        assert _finite(rho, ndcg, mean) and -1 <= rho <= 1 and 0 <= ndcg <= 1 and mean == ndcg  # one collection: its mean is itself


# ------------------------------------------------------------------ query_pruning (its synthetic part: no index, no model)
def test_query_pruning_synthetic_part_writes_a_row_per_setting_and_impacts(tmp_path):
    from experiments import query_pruning

    out = tmp_path / "pruning.json"
    assert query_pruning.main(["--synthetic-docs", "3000", "--synthetic-queries", "5", "--rounds", "1", "--keep-mass", "0.9",
                               "--query-tokens", "40", "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    rows = data["rows"]
    assert {row[1] for row in rows} == {"float32", "uint8"} and len(rows) == 10  # exact + 4 pruned settings, per impacts
    cols = data["columns"]
    for row in rows:
        kept, recall, p50 = row[cols.index("postings kept")], row[cols.index("recall@10 vs exact")], row[cols.index("p50 ms")]
        assert _finite(kept, recall, p50) and 0 < kept <= 1 and 0 <= recall <= 1
        if row[2] == "exact":
            assert kept == 1.0 and recall == 1.0



# ------------------------------------------------------------------ calibration
def test_calibration_writes_a_row_per_collection_encoder_and_analyser(toy_beir, tmp_path, monkeypatch):
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import calibration, calibration_agreement, calibration_noise

    tiny_encoder = SentenceEncoder.load(str(save_tiny_sentence_encoder(tmp_path / "encoder")))
    monkeypatch.setattr(SentenceEncoder, "load", classmethod(lambda cls, *a, **kw: tiny_encoder))
    out, matrices = tmp_path / "calibration.json", tmp_path / "matrices.npz"
    assert calibration.main(["--data", str(toy_beir), "--encoders", "minilm,minilm-8", "--analyzers", "words,plain", "--queries", "8",
                             "--tilt", "--cache", str(tmp_path / "cache"), "--matrices", str(matrices), "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    pairs = [("toy", e, a) for e in ("minilm", "minilm-8") for a in ("words", "plain")]
    assert [tuple(row[:3]) for row in data["rows"]] == pairs
    cols = data["columns"]
    for row in data["rows"]:
        oracle, calibrated, tilted = (row[cols.index(c)] for c in ("oracle nDCG@10", "calibrated nDCG@10", "tilted nDCG@10"))
        assert _finite(oracle, calibrated, tilted) and 0 <= calibrated <= oracle <= 1 and 0 <= tilted <= 1  # the oracle is the grid's best
    stored = np.load(matrices)
    assert stored["toy|minilm|words|tilt|0"].shape == (3,)  # a tilted nDCG@10 per real query
    cols = data["columns"]
    for row in data["rows"]:  # B+E's per-query rows average to the table's B+E columns
        user = stored[f"toy|{row[1]}|{row[2]}|user"]
        assert user.shape == (2, 3) and np.allclose(user.mean(axis=1), [row[cols.index("B+E 0.6/0.4")], row[cols.index("B+E 0.5/0.5")]], atol=1e-4)
        agree = stored[f"toy|{row[1]}|{row[2]}|agree"]
        assert agree.shape == (2, 3) and (agree >= 1).all()  # 1-based ranks
    # experiments.calibration_noise, the noise floor read off the same matrices: a row per pair, then the mean,
    # the count within 0.005, and how many pairs fall below the better B+E in one halving
    noise = tmp_path / "noise.json"
    assert calibration_noise.main(["--matrices", str(matrices), "--splits", "20", "--out", str(noise)]) == 0
    rows = _table(noise)["rows"]
    assert sorted(tuple(r[:3]) for r in rows[:-4]) == sorted(pairs)
    assert [r[0] for r in rows[-4:-2]] == ["mean", "within 0.005 (pairs)"]
    for row in rows[:-4]:
        assert row[3] == 3 and all(_finite(v) and v >= 0 for v in row[4:6])  # regrets against the held-out half's best
        assert all(_finite(v) and 0 <= v <= 1 for v in row[6:8])  # shares of the halvings below the better B+E
    per_halving, none_below = rows[-2][6:8], rows[-1][6:8]
    assert all(0 <= v <= len(pairs) for v in per_halving) and all(0 <= v <= 1 for v in none_below)
    # experiments.calibration_agreement, corroboration as a signal, on the same matrices: the shipped pick as the
    # calibration table records it, then each rule fitted on all and left out
    agreement = tmp_path / "agreement.json"
    assert calibration_agreement.main(["--matrices", str(matrices), "--out", str(agreement)]) == 0
    data = _table(agreement)
    cols, agreed = data["columns"], data["rows"]
    assert [r[0] for r in agreed] == ["shipped pick (shift 0.1)"] + [r for r in ("pick, shift nudged by d", "d alone, max-normalised") for _ in (0, 1)]
    calibrated = {f"toy|{r[1]}|{r[2]}": r[_table(out)["columns"].index("calibrated setting")] for r in _table(out)["rows"]}
    assert {k: v["pick"] for k, v in data["details"]["shipped"].items()} == calibrated
    for row in agreed:
        regret, within = row[cols.index("mean regret")], row[cols.index("within 0.005")]
        assert _finite(regret) and 0 <= regret <= 1 and 0 <= within <= len(pairs)
    # with one collection nothing is left to choose on: the left-out nudge is the shipped shift
    assert data["details"]["pick, shift nudged by d|left out"] == data["details"]["shipped"]


def test_corroboration_ranks_each_channels_first_document_in_the_other_list():
    from experiments.calibration import corroboration

    bm25 = [(np.array([4, 2, -1]), np.array([3.0, 1.0, 0.0])), (np.array([-1, -1, -1]), np.zeros(3))]
    dense = [(np.array([2, 7, 4]), np.array([0.9, 0.8, 0.7])), (np.array([5, 1, 0]), np.array([0.5, 0.4, 0.3]))]
    # query 1: BM25's first (4) is the encoder's 3rd, the encoder's first (2) BM25's 2nd; query 2: BM25 found
    # nothing, so neither first is corroborated: each ranks one past the other list's depth
    assert corroboration([bm25, dense]).tolist() == [[3, 4], [2, 4]]


def test_calibration_also_reads_written_queries_and_compares_the_sources(toy_beir, tiny_model_dir, tmp_path, monkeypatch):
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import calibration, calibration_sources, generated_queries

    # experiments.generated_queries: one query per sampled document, the documents calibration samples
    written = tmp_path / "written"
    assert generated_queries.main(["--data", str(toy_beir), "--model", str(tiny_model_dir), "--queries", "8", "--new-tokens", "4",
                                   "--threads", "1", "--out", str(written)]) == 0  # fmt: skip
    from benchmarks.datasets import resolve
    from indexer import calibration as cal

    texts = [d.text for d in resolve(str(toy_beir))[0].docs]
    lines = [json.loads(line) for line in (written / "toy.jsonl").read_text().splitlines()]
    assert [r["doc"] for r in lines] == [q.doc for q in cal.pseudo_queries(texts, 8, 0)]
    assert all(isinstance(r["query"], str) for r in lines)
    if not any(r["query"].strip() for r in lines):  # a random tiny model may write only blanks: give the study words to read
        (written / "toy.jsonl").write_text("".join(json.dumps({**r, "query": texts[r["doc"]][:20]}) + "\n" for r in lines))

    tiny_encoder = SentenceEncoder.load(str(save_tiny_sentence_encoder(tmp_path / "encoder")))
    monkeypatch.setattr(SentenceEncoder, "load", classmethod(lambda cls, *a, **kw: tiny_encoder))
    out, matrices = tmp_path / "calibration.json", tmp_path / "matrices.npz"
    assert calibration.main(["--data", str(toy_beir), "--encoders", "minilm", "--analyzers", "words,plain", "--queries", "8",
                             "--pseudo-from", str(written), "--cache", str(tmp_path / "cache"), "--matrices", str(matrices),
                             "--out", str(out)]) == 0  # fmt: skip
    rows = _table(out)["rows"]
    assert [tuple(r[:4]) for r in rows] == [("toy", "minilm", a, s) for a in ("words", "plain") for s in (0, "gen")]
    assert {"toy|minilm|words|pseudo|gen", "toy|minilm|plain|pseudo|gen"} <= set(np.load(matrices).files)

    # experiments.calibration_sources: a row per source and shift, then a left-out row per source
    sources = tmp_path / "sources.json"
    assert calibration_sources.main(["--matrices", str(matrices), "--table", str(out), "--out", str(sources)]) == 0
    data = _table(sources)
    rows, cols = data["rows"], data["columns"]
    # a row per selection, source and shift, then a left-out row per selection and source
    n_fixed = 2 * len(calibration_sources.SOURCES) * len(calibration_sources.SHIFTS)
    assert len(rows) == n_fixed + 2 * len(calibration_sources.SOURCES)
    assert [(r[0], r[1]) for r in rows[n_fixed:]] == [(src, sel) for sel in ("argmax", "smoothed") for src in calibration_sources.SOURCES]
    assert all(r[2].startswith("left out: toy") for r in rows[n_fixed:])
    for row in rows:
        regret, worst, within = row[cols.index("mean regret")], row[cols.index("worst regret")], row[cols.index("within 0.005")]
        assert _finite(regret, worst) and 0 <= regret <= worst <= 1 and 0 <= within <= 2
    # the held-out rule with the shipped shift is the calibration the table's seed-0 rows record
    shipped = data["details"][f"held-out|argmax|{cal.SHIFT:g}"]
    table_cols = _table(out)["columns"]
    for r in rows_of(out, seed=0):
        assert shipped[f"toy|minilm|{r[2]}"]["pick"] == r[table_cols.index("calibrated setting")]
    # a written file that names no document of the corpus is refused with its file, line and field
    (written / "toy.jsonl").write_text(json.dumps({"doc": 10**6, "query": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"toy.jsonl, line 1: field 'doc'"):
        calibration.written_queries(written, "toy", texts)
    (written / "toy.jsonl").write_text(json.dumps({"doc": 0, "query": "x"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"toy.jsonl, line 2: not a JSON object"):
        calibration.written_queries(written, "toy", texts)


def test_title_queries_are_the_documents_titles_scored_against_their_bodies(toy_beir, tmp_path):
    from benchmarks.datasets import resolve
    from experiments import calibration, generated_queries
    from indexer import calibration as cal

    out = tmp_path / "titles"
    assert generated_queries.main(["--data", str(toy_beir), "--source", "title", "--queries", "40", "--out", str(out)]) == 0
    docs = resolve(str(toy_beir))[0].docs
    texts = [d.text for d in docs]
    rows = [json.loads(line) for line in (out / "toy.jsonl").read_text().splitlines()]
    sampled = [q.doc for q in cal.pseudo_queries(texts, 40, 0)]
    # the sampled documents whose body can stand as the rest, in sampling order, each titled by its own title
    assert [r["doc"] for r in rows] == [d for d in sampled if len(docs[d].body.split()) >= cal.REST_WORDS] and rows
    assert all(r["query"] == docs[r["doc"]].title and r["rest"] == docs[r["doc"]].body for r in rows)
    assert json.loads((out / "toy.meta.json").read_text())["model"] is None
    pqs = calibration.written_queries(out, "toy", texts)
    assert [(p.doc, p.query, p.rest) for p in pqs] == [(r["doc"], r["query"], r["rest"]) for r in rows]


def test_smoothing_averages_each_setting_with_its_grid_neighbours_of_the_same_method():
    from experiments.calibration_sources import smoothed
    from indexer import calibration as cal

    settings = cal.grid(2)
    at = {(s.method, s.weights): i for i, s in enumerate(settings)}
    scores = np.zeros(len(settings))
    scores[at[("minmax", (0.5, 0.5))]] = 0.9
    scores[at[("minmax", (0.0, 1.0))]] = 0.6
    out = smoothed(scores, settings)
    assert out[at[("minmax", (0.5, 0.5))]] == pytest.approx(0.3)  # itself and two neighbours
    assert out[at[("minmax", (0.4, 0.6))]] == out[at[("minmax", (0.6, 0.4))]] == pytest.approx(0.3)
    assert out[at[("minmax", (0.0, 1.0))]] == pytest.approx(0.3)  # an end of the grid: itself and one neighbour
    assert out[at[("minmax", (0.1, 0.9))]] == pytest.approx(0.2)
    assert out[at[("minmax", (0.3, 0.7))]] == 0 and not out[[i for i, s in enumerate(settings) if s.method == "max"]].any()


def test_peakedness_is_the_top_gap_as_a_share_of_the_lists_spread():
    from experiments.calibration import peakedness

    flat_top = np.r_[np.full(10, 5.0), np.linspace(5, 1, 90)]
    one_peak = np.r_[9.0, np.linspace(2, 1, 99)]
    assert peakedness(flat_top) == 0 and peakedness(np.full(100, 3.0)) == 0  # no gap, or no spread at all
    assert peakedness(one_peak) == pytest.approx((9 - one_peak[9]) / 8)
    assert peakedness(one_peak[:10]) == 0  # too short to have a tenth and a tail


def rows_of(table: Path, seed) -> list:
    return [r for r in _table(table)["rows"] if r[3] == seed]


# ------------------------------------------------------------------ channel_ablation
def test_channel_ablation_scores_the_hybrid_and_each_channel_removed(toy_beir, tiny_model_dir, tmp_path):
    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import channel_ablation
    from indexer.build import build_index

    embedder = Embedder.load(tiny_model_dir, adapter="none", device="cpu")
    encoder = SentenceEncoder.load(str(save_tiny_sentence_encoder(tmp_path / "encoder")))
    index = tmp_path / "indexes" / "default-fast" / "toy" / "aligned-tokens"
    build_index(toy_beir / "corpus.jsonl", index, embedder, top_k=16, lexical="words", encoder=encoder, progress=False)
    out = tmp_path / "ablation.json"
    assert channel_ablation.main(["--indexes", str(tmp_path / "indexes"), "--data", str(toy_beir), "--points", "fast,best",
                                  "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    cols = data["columns"]
    # fast weighs bm25 and the encoder: a row each; best has no index here and is skipped
    assert [(r[0], r[1], r[cols.index("channel")]) for r in data["rows"]] == [("fast", "toy", "bm25"), ("fast", "toy", "encoder")]
    details = data["details"]["fast"]["toy"]
    assert set(details["configs"]) == {"hybrid", "without bm25", "without encoder"}
    for name, c in details["configs"].items():
        assert 0 <= c["ndcg@10"] <= 1 and 0 <= c["recall@100"] <= 1 and c["e2e_p50_ms"] > 0, name
    for row in data["rows"]:  # the gain is the hybrid minus the configuration without the channel
        without = details["configs"][f"without {row[cols.index('channel')]}"]["ndcg@10"]
        assert row[cols.index("gain nDCG@10")] == pytest.approx(details["configs"]["hybrid"]["ndcg@10"] - without, abs=1e-4)


# ------------------------------------------------------------------ query_stages (the fast profile: no query model)
def test_query_stages_times_each_stage_of_the_fast_profile(toy_corpus, tiny_model_dir, tmp_path):
    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import query_stages
    from indexer.build import build_index

    embedder = Embedder.load(tiny_model_dir, adapter="none", device="cpu")
    encoder = SentenceEncoder.load(str(save_tiny_sentence_encoder(tmp_path / "encoder")))
    build_index(toy_corpus, tmp_path / "index", embedder, top_k=16, lexical="words", encoder=encoder, progress=False)
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n"
                               for i, t in enumerate(["cat and dog", "computer memory", "snow on the mountain"] * 3)), encoding="utf-8")
    out = tmp_path / "stages.json"
    query_stages.main(["--index", str(tmp_path / "index"), "--queries", str(queries), "--profile", "fast", "--k", "10", "--out", str(out)])
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["profile"] == "fast" and result["n_queries"] == 9 and result["stages"]
    for stats in [result["whole_query"], result["sum_of_stages"], *result["stages"].values()]:
        assert _finite(stats["p50_ms"], stats["mean_ms"]) and stats["p50_ms"] >= 0


# ------------------------------------------------------------------ encoder_speed (--auto-only: the naive loop and the engine's choice)
def test_encoder_speed_times_the_naive_loop_and_the_engines_choice(toy_beir, tiny_model_dir, tmp_path, monkeypatch):
    from experiments import encoder_speed

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))  # the speed probe's verdicts and exported runtimes
    out = tmp_path / "speed.json"
    assert encoder_speed.main(["--corpus", str(toy_beir), "--docs", "8", "--queries", "3", "--model", str(tiny_model_dir),
                               "--adapter", "none", "--auto-only", "--threads", "1", "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    assert [row[0].split(" ")[0] for row in data["rows"]] == ["naive", "engine:"]
    cols = data["columns"]
    for row in data["rows"]:
        docs_s, p50, cos_min = row[cols.index("docs/s")], row[cols.index("query p50 ms")], row[cols.index("cos min")]
        assert _finite(docs_s, p50, cos_min) and docs_s > 0 and p50 > 0 and cos_min > 0.99  # the engine's runtime is faithful


# ------------------------------------------------------------------ ray_build (a Ray head on loopback, started by the study)
def test_ray_build_builds_locally_and_on_ray_and_writes_a_row_each(toy_beir, tiny_model_dir, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make installs it)")
    from experiments import ray_build

    out = tmp_path / "ray.json"
    assert ray_build.main(["--corpus", str(toy_beir), "--docs", "16", "--shard-size", "8", "--workers", "1",
                           "--model", str(tiny_model_dir), "--adapter", "none", "--out", str(out)]) == 0  # fmt: skip
    data = _table(out)
    assert [(row[0], row[1], row[2], row[3]) for row in data["rows"]] == [("local", 1, 16, 2), ("ray (local head)", 1, 16, 2)]
    for row in data["rows"]:
        wall, docs_s = float(row[4]), float(row[5])  # the table's cells are formatted text
        assert math.isfinite(wall) and wall > 0 and docs_s > 0


# ------------------------------------------------------------------ state_faithfulness (a tiny distilled student)
def test_state_faithfulness_scores_each_mix_of_student_and_llm_states(default_indexes, tiny_model_dir, tmp_path):
    from conftest import toy_docs

    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import state_faithfulness
    from training.query_encoder.recipe import DistillRecipe
    from training.query_encoder.trainer import distill

    embedder = Embedder.load(tiny_model_dir, adapter="none", device="cpu")  # the indexes' model, by its weights
    encoder = SentenceEncoder.load(str(save_tiny_sentence_encoder(tmp_path / "encoder")))
    recipe = DistillRecipe(kind="pooled", hidden=16, epochs=2, batch_size=32, kl_top=16, holdout=0.2)
    texts = [d["text"] for d in toy_docs(80, seed=4)]
    distill(embedder, encoder, texts, tmp_path / "cache", recipe, "toy", m=8, progress=False).save(tmp_path / "student")
    data, index_dir = default_indexes
    out = tmp_path / "faithfulness.json"
    assert state_faithfulness.main(["--index-dir", str(index_dir), "--data", str(data), "--student", str(tmp_path / "student"),
                                    "--alphas", "0,0.5,1", "--out", str(out)]) == 0  # fmt: skip
    data_ = _table(out)
    scored = [row for row in data_["rows"] if row[0] == "LLM queries" or row[0].startswith("mix a=")]
    assert [row[0] for row in scored] == ["LLM queries", "mix a=0", "mix a=0.5", "mix a=1"]  # a row per weight of the LLM's state
    cols = data_["columns"]
    for row in scored:
        ndcg = [row[cols.index(c)] for c in ("adi", "cisi", "mean")]
        assert _finite(*ndcg) and all(0 <= v <= 1 for v in ndcg)
    assert scored[-1][cols.index("mean")] == scored[0][cols.index("mean")]  # a = 1: the LLM's own states
