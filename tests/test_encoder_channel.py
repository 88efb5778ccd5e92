"""The encoder channel (issue 16): an external sentence-transformers encoder stored as one more
FAISS channel, its identity checked on load, fused with the other channels, and the benchmark
tooling around it (the bm25+minilm baseline's fusion, fusion_cv's channel subsets).

The encoder is a tiny random BERT (2 layers, 32-d, a WordPiece vocabulary of the toy words)
wrapped as sentence-transformers Transformer + mean Pooling + Normalize, built in-process and
saved with ``save()``, like the tiny Llama of conftest.py.
"""
from __future__ import annotations

import json
import shutil
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import save_tiny_sentence_encoder

from indexer.build import build_index
from indexer.checksums import json_checksum
from indexer.manifest import MANIFEST, IndexFormatError, Manifest
from retriever.profiles import get_profile, profile_fusion
from retriever.retriever import DEFAULT_FUSION, Retriever

pytest.importorskip("sentence_transformers")

QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow"]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> Path:
    return save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st"), seed=0)


@pytest.fixture(scope="module")
def other_st_dir(tmp_path_factory) -> Path:
    return save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st-other"), seed=1)


@pytest.fixture(scope="module")
def encoder(st_dir):
    from embedder.sentence_encoder import SentenceEncoder

    return SentenceEncoder.load(st_dir)


def doc_texts(docs: list[dict]) -> list[str]:
    return [f"{d['title']} {d['text']}" for d in docs]


@pytest.fixture
def encoder_index(toy_corpus, tiny_embedder, encoder, tmp_path) -> Path:
    """The toy corpus with sparse, BM25 and encoder channels."""
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=16, progress=False, lexical="words", encoder=encoder)
    return tmp_path / "index"


# ============================================================ the encoder itself
def test_sentence_encoder_identity_and_unit_norm_output(st_dir, other_st_dir, encoder):
    from sentence_transformers import SentenceTransformer

    from embedder.sentence_encoder import SentenceEncoder

    assert encoder.identity["name"] == str(st_dir.resolve())
    assert encoder.dim == 32 and encoder.describe()["dim"] == 32
    assert SentenceEncoder.load(st_dir).identity == encoder.identity  # the weights' hash is stable
    assert SentenceEncoder.load(other_st_dir).identity["sha256"] != encoder.identity["sha256"]
    emb = encoder.encode(QUERIES)
    assert emb.dtype == np.float32 and emb.shape == (len(QUERIES), 32)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    reference = SentenceTransformer(str(st_dir), device="cpu").encode(QUERIES, normalize_embeddings=True)
    np.testing.assert_allclose(emb, reference, atol=1e-6)
    assert encoder.encode([]).shape == (0, 32)


def test_minilm_names_the_packaged_model_and_unknown_names_are_refused(tmp_path):
    from embedder.models import ModelNotAvailable
    from embedder.sentence_encoder import MINILM_DIST, resolve_encoder

    try:
        name, directory = resolve_encoder("minilm")
    except ModelNotAvailable as exc:
        assert MINILM_DIST in str(exc)
    else:
        assert name == "minilm" and (directory / "modules.json").exists()
    with pytest.raises(ModelNotAvailable, match="unknown encoder 'no-such-encoder'"):
        resolve_encoder("no-such-encoder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotAvailable, match="not a sentence-transformers model directory"):
        resolve_encoder(tmp_path / "empty")


# ============================================================ the index channel
def test_index_records_the_encoder_and_searches_it_by_cosine(encoder_index, tiny_embedder, encoder, docs_factory):
    r = Retriever.load(encoder_index, embedder=tiny_embedder)  # loads the encoder its manifest names
    m = r.manifest
    assert {k: m.record("encoder")[k] for k in ("name", "sha256", "dim", "kind", "normalised")} == {
        **encoder.identity, "dim": 32, "kind": "Flat", "normalised": True,
    }
    assert "encoder_seconds" in m.build and (encoder_index / "encoder.faiss").exists()
    assert r.modes == ["sparse", "bm25", "encoder", "hybrid"]
    assert r.encoder.identity == encoder.identity
    docs = docs_factory(40)
    d = encoder.encode(doc_texts(docs))
    for query in QUERIES:
        cos = d @ encoder.encode([query])[0]
        hits = r.search(query, k=3, mode="encoder")
        assert hits[0].doc_id == docs[int(np.argmax(cos))]["_id"]
        assert hits[0].score == pytest.approx(float(cos.max()), abs=1e-5)
        assert hits[0].matched_tokens == {}


def test_loading_refuses_another_encoder(encoder_index, tiny_embedder, other_st_dir, encoder, toy_corpus, tmp_path):
    from embedder.sentence_encoder import SentenceEncoder

    other = SentenceEncoder.load(other_st_dir)
    with pytest.raises(IndexFormatError, match="index built with encoder .* asked to use"):
        Retriever.load(encoder_index, embedder=tiny_embedder, encoders={"encoder": other})
    # and an index without the channel refuses any encoder
    build_index(toy_corpus, tmp_path / "plain", tiny_embedder, top_k=8, progress=False)
    with pytest.raises(IndexFormatError, match="no encoder channel"):
        Retriever.load(tmp_path / "plain", embedder=tiny_embedder, encoders={"encoder": encoder})
    # the manifest check alone
    m = Manifest.read(encoder_index)
    m.check_encoder(encoder.identity)
    with pytest.raises(IndexFormatError):
        m.check_encoder(None)


def test_encoder_mode_needs_an_encoder_index(toy_corpus, tiny_embedder, tmp_path):
    build_index(toy_corpus, tmp_path / "plain", tiny_embedder, top_k=8, progress=False, lexical="words")
    r = Retriever.load(tmp_path / "plain", embedder=tiny_embedder)
    assert "encoder" not in r.modes and r.fusion == DEFAULT_FUSION  # today's default without the channel
    with pytest.raises(ValueError, match="mode 'encoder' needs an index built with --encoder"):
        r.search("cat", mode="encoder")


def test_hybrid_of_bm25_and_encoder_never_runs_the_llm(encoder_index, tiny_embedder, monkeypatch):
    default = Retriever.load(encoder_index, embedder=tiny_embedder)
    # the index holds the fast profile's channels, so it is searched at that point: BM25 + the encoder, weighed as
    # the index's calibration says (issue 71), never the aligned tokens
    assert default.profile.name == "fast" and default.fusion == profile_fusion(get_profile("fast"), default.manifest.calibration)[0]
    assert default.channels_of("hybrid") == ["bm25", "encoder"]
    # the LLM encodes the sparse query here (the fast profile would give it the query's own tokens, with no LLM at all)
    r = Retriever.load(encoder_index, embedder=tiny_embedder, fusion={"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}}, query_encoder="llm")
    assert r.channels_of("hybrid") == ["bm25", "encoder"]
    full = r.batch_search(QUERIES, k=10, mode="hybrid")

    def no_llm(*args, **kwargs):
        raise AssertionError("the LLM ran")

    monkeypatch.setattr(tiny_embedder, "embed", no_llm)
    for mode in ("bm25", "encoder", "hybrid"):
        assert all(r.batch_search(QUERIES, k=5, mode=mode))
    again = r.batch_search(QUERIES, k=10, mode="hybrid")
    assert [[(h.doc_id, h.score) for h in hits] for hits in again] == [[(h.doc_id, h.score) for h in hits] for hits in full]
    with pytest.raises(AssertionError, match="the LLM ran"):
        r.search("cat", mode="sparse")
    for hits in full:
        assert any("encoder" in h.channels for h in hits)
        for h in hits:
            assert set(h.channels) <= {"bm25", "encoder"} and sum(h.channels.values()) == pytest.approx(h.score, abs=1e-9)
            assert all(t.startswith("bm25:") for t in h.matched_tokens)


def test_hybrid_with_every_channel_runs_llm_and_encoder_once(encoder_index, tiny_embedder):
    fusion = {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.3, "sparse": 0.2}}
    r = Retriever.load(encoder_index, embedder=tiny_embedder, fusion=fusion, query_encoder="llm")
    (enc,) = r.encode(QUERIES[:1], mode="hybrid")
    assert enc.embedding.size and enc.tokens.size and enc.encoder_embedding is not None
    (text_only,) = r.encode(QUERIES[:1], mode="encoder")
    assert text_only.embedding.size == 0 and text_only.encoder_embedding is not None
    with pytest.raises(ValueError, match="encoded without the LLM"):
        r.search_encoded([text_only], mode="sparse")
    (no_encoder,) = r.encode(QUERIES[:1], mode="sparse")
    with pytest.raises(ValueError, match="encoded without the encoder"):
        r.search_encoded([no_encoder], mode="encoder")
    hits = r.search(QUERIES[0], k=10, mode="hybrid")
    assert {c for h in hits for c in h.channels} == {"bm25", "encoder", "sparse"}


def test_fusion_over_a_missing_channel_uses_the_channels_there(toy_corpus, tiny_embedder, encoder, tmp_path):
    # an encoder index without BM25: a bm25 0.6 / encoder 0.4 fusion fuses what exists
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=8, progress=False, encoder=encoder)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder, fusion={"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}})
    assert r.channels_of("hybrid") == ["encoder"]
    for query in QUERIES:
        hybrid = r.search(query, k=40, mode="hybrid")  # every document: no cut among near-ties
        alone = {h.doc_id: h.score for h in r.search(query, k=40, mode="encoder")}
        assert {h.doc_id for h in hybrid} == set(alone)  # same documents, in the encoder's order (up to ties)
        assert all(alone[a.doc_id] >= alone[b.doc_id] - 1e-6 for a, b in pairwise(hybrid))
        assert all(set(h.channels) == {"encoder"} for h in hybrid)
    nothing = Retriever.load(tmp_path / "index", embedder=tiny_embedder, fusion={"method": "minmax", "weights": {"bm25": 1.0, "dense": 1.0}})
    with pytest.raises(ValueError, match="none of the fusion's channels"):
        nothing.search("cat", mode="hybrid")


def _reseal(index: Path, change) -> None:
    """Change the manifest's fields and record its checksum again (as a buggy builder would): the
    field checks alone stand between the damage and the loaders."""
    data = json.loads((index / MANIFEST).read_text())
    change(data)
    data.pop("checksum", None)
    data["checksum"] = json_checksum(data)
    (index / MANIFEST).write_text(json.dumps(data))


DAMAGED_ENCODER_FIELDS = {
    "dim-a-string": ("encoder.dim", lambda e: e.update(dim="32")),
    "dim-a-list": ("encoder.dim", lambda e: e.update(dim=[32])),
    "dim-missing": ("encoder.dim", lambda e: e.pop("dim")),
    "dim-negative": ("encoder.dim", lambda e: e.update(dim=-32)),
    "dim-a-bool": ("encoder.dim", lambda e: e.update(dim=True)),
    "name-missing": ("encoder.name", lambda e: e.pop("name")),
    "sha256-null": ("encoder.sha256", lambda e: e.update(sha256=None)),
}


def test_damaged_encoder_fields_are_one_line_never_a_traceback(encoder_index, tiny_embedder, tmp_path, capsys):
    """The encoder's manifest fields are validated like the other channels' (issue 49): a bad
    ``encoder.dim`` is an IndexFormatError naming the field from the loader, one problem line from
    verify-index (exit 1: damaged) and one error line from search-index (exit 2), never a raw
    TypeError / KeyError out of ``int(m.record("encoder")["dim"])``."""
    from indexer import verify_cli
    from retriever import cli as search_cli

    for case, (field, change) in DAMAGED_ENCODER_FIELDS.items():
        index = tmp_path / case
        shutil.copytree(encoder_index, index)
        _reseal(index, lambda m, change=change: change(m["channels"]["encoder"]))
        expected = rf"manifest\.json: field '{field}': "
        with pytest.raises(IndexFormatError, match=expected):
            Manifest.read(index)
        with pytest.raises(IndexFormatError, match=expected):
            Retriever.load(index, embedder=tiny_embedder)
        capsys.readouterr()
        assert verify_cli.main([str(index)]) == 1, case
        out, err = capsys.readouterr()
        (line,) = out.splitlines()
        assert line.startswith(f"{index / MANIFEST}: field '{field}': "), (case, line)
        assert err.splitlines() == [f"{index}: 1 problem(s)"], (case, err)
        assert search_cli.main(["--index", str(index), "cat and dog"]) == 2, case
        out, err = capsys.readouterr()
        (line,) = err.splitlines()
        assert line.startswith("search-index: error: ") and f"field '{field}'" in line and not out, (case, err, out)
    # an encoder that is not an object at all
    index = tmp_path / "not-an-object"
    shutil.copytree(encoder_index, index)
    _reseal(index, lambda m: m["channels"].update(encoder=32))
    with pytest.raises(IndexFormatError, match="field 'encoder': neither an object nor null"):
        Manifest.read(index)


# ======================================================================= CLI
def test_build_and_search_index_cli_with_an_encoder(toy_corpus, tiny_model_dir, st_dir, other_st_dir, tmp_path, capsys):
    from indexer import cli as build_cli
    from retriever import cli as search_cli

    index = tmp_path / "index"
    argv = ["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "16", "--quiet"]
    assert build_cli.main([*argv, "--lexical", "words", "--encoder", str(st_dir)]) == 0
    assert Manifest.read(index).record("encoder")["name"] == str(st_dir.resolve())
    capsys.readouterr()
    for mode in ("encoder", "hybrid"):
        assert search_cli.main(["--index", str(index), "--mode", mode, "--json", "-k", "3", "cat and dog"]) == 0
        (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(row["hits"]) == 3
        if mode == "hybrid":
            assert all(set(h["channels"]) <= {"sparse", "bm25", "encoder"} for h in row["hits"])
    assert search_cli.main(["--index", str(index), "--mode", "encoder", "--encoder", str(st_dir), "cat"]) == 0
    assert search_cli.main(["--index", str(index), "--mode", "encoder", "--encoder", str(other_st_dir), "cat"]) == 2
    assert "index built with encoder" in capsys.readouterr().err
    assert build_cli.main([*argv, "--overwrite", "--encoder", str(tmp_path / "nowhere")]) == 2
    assert "unknown encoder" in capsys.readouterr().err


# ================================================================ benchmarks
def test_bm25_minilm_fusion_is_ranx_minmax_wsum():
    """The baseline's per-query fusion gives ranx.fuse's numbers (min-max, weighted sum)."""
    from ranx import Run, fuse

    from benchmarks.systems.baselines import BM25PlusMiniLM

    rng = np.random.default_rng(0)
    system = SimpleNamespace(fusion={"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}})
    bm25, dense = {}, {}
    for q in range(5):
        bm25[f"q{q}"] = {f"d{d}": float(s) for d, s in zip(rng.choice(60, 20, replace=False), rng.uniform(0, 20, 20))}
        dense[f"q{q}"] = {f"d{d}": float(s) for d, s in zip(rng.choice(60, 20, replace=False), rng.uniform(-1, 1, 20))}
    theirs = fuse([Run(bm25), Run(dense)], norm="min-max", method="wsum", params={"weights": [0.6, 0.4]}).to_dict()
    ranked = lambda hits: sorted(hits.items(), key=lambda kv: -kv[1])
    for q, hits in bm25.items():
        ours = BM25PlusMiniLM.fuse(system, ranked(hits), ranked(dense[q]), k=100)
        assert dict(ours) == pytest.approx(theirs[q], abs=1e-9)


def write_beir(root: Path, docs: list[dict], queries: list[dict]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    qrels = [f"{q['_id']}\t{d['_id']}\t1" for q, d in zip(queries, docs)]
    (root / "qrels" / "test.tsv").write_text("\n".join(["query-id\tcorpus-id\tscore", *qrels]) + "\n", encoding="utf-8")
    return root


def test_encoder_systems_share_one_index_and_skip_the_llm_for_bm25_plus_encoder(tmp_path, docs_factory, tiny_model_dir, st_dir):
    from benchmarks import datasets, runs, systems
    from benchmarks.suite import run_suite

    docs = docs_factory(40)
    queries = [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[:5])]
    ds = datasets.load_beir_folder(write_beir(tmp_path / "toyq", docs, queries))
    fusions = {"bm25+encoder+sparse": {"method": "minmax", "weights": {"bm25": 0.4, "encoder": 0.4, "sparse": 0.2}}}
    settings = systems.Settings(
        work_dir=tmp_path / "work", progress=False, top_k=8, expansion_m=4, model=str(tiny_model_dir), adapter="none", device="cpu",
        encoder=str(st_dir), fusions=fusions,
    )
    names = ["bm25", "encoder", "hybrid", "hybrid-bm25+encoder", "hybrid-bm25+encoder+sparse"]
    out = tmp_path / "out"
    results = run_suite([ds], names, settings, out, depth=10, command="test")
    (entry,) = results["datasets"]
    assert list(entry["results"]) == names
    assert len({res["index"]["seconds"] for res in entry["results"].values()}) == 1  # one build
    params = results["systems"]
    # "hybrid" is the engine's LLM hybrid in every run, even where the index also has the encoder
    assert params["hybrid"]["params"]["fusion"] == DEFAULT_FUSION
    assert params["hybrid-bm25+encoder"]["params"]["fusion_source"].startswith("untuned fallback")
    assert params["hybrid-bm25+encoder+sparse"]["params"]["fusion"] == fusions["bm25+encoder+sparse"]
    assert params["encoder"]["params"]["encoder"]["name"] == str(st_dir.resolve())
    # the encoder system's run is what Retriever mode "encoder" returns
    index_dir = settings.work_dir / ds.name / "aligned-tokens"
    reference = Retriever.load(index_dir, device="cpu")
    run = runs.read_trec(out / entry["results"]["encoder"]["run_file"])
    for qid, hits in zip(ds.queries, reference.batch_search(list(ds.queries.values()), k=10, mode="encoder")):
        assert run[qid] == pytest.approx({h.doc_id: h.score for h in hits}, abs=1e-6)
    # bm25 + encoder queries are encoded without the LLM; + sparse with it
    shared: dict = {}
    made = {n: systems.make(n, settings, shared) for n in names[3:]}
    engine = shared["aligned-tokens"]
    for system in made.values():
        system.load()
        system.index(ds)
    hybrid2 = made["hybrid-bm25+encoder"]
    (enc,), _ = hybrid2.encode([queries[0]["text"]])
    assert enc.embedding.size == 0 and enc.encoder_embedding is not None
    (enc3,), _ = made["hybrid-bm25+encoder+sparse"].encode([queries[0]["text"]])
    assert enc3.embedding.size > 0 and enc3.encoder_embedding is not None
    assert engine.retriever_for(fusions["bm25+encoder+sparse"]).channels_of("hybrid") == ["sparse", "bm25", "encoder"]


def test_read_fusions_takes_each_subsets_setting_chosen_on_all_collections(tmp_path):
    from benchmarks.results_file import read_fusions

    table = {"kind": "table", "details": {"subsets": {"bm25+encoder": {"default": {"method": "minmax", "weights": {"bm25": 0.7, "encoder": 0.3}}}}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    assert read_fusions(tmp_path / "t.json") == {"bm25+encoder": {"method": "minmax", "weights": {"bm25": 0.7, "encoder": 0.3}}}
    (tmp_path / "bad.json").write_text(json.dumps({"bm25+encoder": 1}))
    with pytest.raises(ValueError, match="expected"):
        read_fusions(tmp_path / "bad.json")
