"""The retrieval channels besides aligned tokens, checked against reference implementations.

Fusion against ranx, BM25 against Lucene's formula written out here, EmbedFilter against
NumPy's SVD, then the channels end to end: an index built with all of them, the Retriever's
modes, all-caps folding, and the benchmark systems that serve each mode.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from embedder.embedfilter import embedfilter_projection
from embedder.encoder import EmbedderConfig
from embedder.tokenization import is_all_caps
from indexer.build import build_index
from indexer.lexical import LUCENE_STOPWORDS, BM25Index, WordAnalyzer, make_analyzer
from retriever.fusion import fuse
from retriever.query import literal_ids
from retriever.retriever import Retriever

QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow"]
ALL_MODES = ["sparse", "dense", "dense-ef", "bm25", "hybrid"]


# ==================================================================== fusion
def random_channels(rng: np.random.Generator, names: list[str], n_docs: int = 30, pad: int = 3) -> dict:
    """One query's channels: distinct doc numbers with distinct scores, best first, each
    list padded at the end with (-1, -inf) as the search kernels pad."""
    channels = {}
    for name in names:
        n = int(rng.integers(2, 15))
        docs = rng.choice(n_docs, size=n, replace=False)
        scores = np.sort(rng.normal(size=n) * 5)[::-1]
        channels[name] = (np.concatenate([docs, np.full(pad, -1)]), np.concatenate([scores, np.full(pad, -np.inf)]))
    return channels


def ranx_fused(queries: dict[str, dict], names: list[str], **fuse_kw) -> dict[str, dict[str, float]]:
    """ranx.fuse over the same channels, one ranx Run per channel (doc numbers as strings)."""
    import ranx

    runs = [
        ranx.Run({qid: {str(d): float(s) for d, s in zip(*channels[name]) if d >= 0} for qid, channels in queries.items()})
        for name in names
    ]
    return ranx.fuse(runs=runs, **fuse_kw).to_dict()


def our_fused(channels: dict, weights: dict[str, float], method: str) -> dict[str, float]:
    return {str(f.doc): f.score for f in fuse(channels, weights, k=10_000, method=method)}


def assert_same_fused_scores(ours: dict[str, float], theirs: dict[str, float]) -> None:
    assert set(ours) == set(theirs)
    for doc, score in theirs.items():
        assert ours[doc] == pytest.approx(score, abs=1e-6), doc


def test_minmax_fusion_equals_ranx_wsum_of_minmax_normalised_runs():
    rng = np.random.default_rng(0)
    weights = {"sparse": 0.7, "dense": 1.3, "bm25": 0.4}
    names = list(weights)
    queries = {f"q{i}": random_channels(rng, names) for i in range(8)}
    theirs = ranx_fused(queries, names, norm="min-max", method="wsum", params={"weights": list(weights.values())})
    for qid, channels in queries.items():
        assert_same_fused_scores(our_fused(channels, weights, "minmax"), theirs[qid])


def test_max_fusion_equals_ranx_wsum_of_max_normalised_runs():
    rng = np.random.default_rng(5)
    weights = {"sparse": 0.1, "encoder": 0.6, "bm25": 0.3}
    names = list(weights)
    # positive scores, as BM25's, the aligned tokens' and cosines at the top are (see the next tests)
    queries = {f"q{i}": {c: (d, np.exp(s / 5)) for c, (d, s) in random_channels(rng, names).items()} for i in range(8)}
    theirs = ranx_fused(queries, names, norm="max", method="wsum", params={"weights": list(weights.values())})
    for qid, channels in queries.items():
        assert_same_fused_scores(our_fused(channels, weights, "max"), theirs[qid])


def test_max_fusion_keeps_how_far_a_channels_top_stands_out():
    # two channels rank the same three documents; min-max sends both lists' ends to 1 and 0, so
    # their first places weigh the same; dividing by the top keeps how far "peaked"'s first stands out
    peaked = (np.array([1, 2, 3]), np.array([10.0, 2.0, 1.0]))
    flat = (np.array([2, 1, 3]), np.array([0.9, 0.8, 0.7]))
    weights = {"bm25": 0.5, "encoder": 0.5}
    by_max = fuse({"bm25": peaked, "encoder": flat}, weights, k=3, method="max")
    assert [f.doc for f in by_max] == [1, 2, 3]
    assert by_max[0].contributions["bm25"] == pytest.approx(0.5)
    assert by_max[1].contributions["bm25"] == pytest.approx(0.5 * 0.2)


def test_max_fusion_of_a_list_without_a_positive_top_falls_back_to_min_max():
    # dividing by a top <= 0 would turn the order over (ranx divides by 1e-9 instead)
    negative = {"dense": (np.array([7, 8, 9]), np.array([-0.1, -0.2, -0.6]))}
    by_max = fuse(negative, {"dense": 1.0}, k=3, method="max")
    by_minmax = fuse(negative, {"dense": 1.0}, k=3, method="minmax")
    assert [(f.doc, f.score) for f in by_max] == [(f.doc, f.score) for f in by_minmax]
    assert [f.doc for f in by_max] == [7, 8, 9] and [f.score for f in by_max] == pytest.approx([1.0, 0.8, 0.0])


def test_rrf_fusion_with_unit_weights_equals_ranx_rrf():
    rng = np.random.default_rng(1)
    names = ["sparse", "dense", "bm25"]
    queries = {f"q{i}": random_channels(rng, names) for i in range(8)}
    theirs = ranx_fused(queries, names, norm=None, method="rrf", params={"k": 60})
    for qid, channels in queries.items():
        assert_same_fused_scores(our_fused(channels, dict.fromkeys(names, 1.0), "rrf"), theirs[qid])


@pytest.mark.parametrize("method", ["minmax", "max", "rrf"])
def test_channel_contributions_sum_to_the_fused_score(method):
    channels = random_channels(np.random.default_rng(2), ["sparse", "dense", "bm25"])
    fused = fuse(channels, {"sparse": 1.0, "dense": 0.5, "bm25": 2.0}, k=100, method=method)
    assert fused
    for f in fused:
        assert sum(f.contributions.values()) == pytest.approx(f.score, abs=1e-12)
    assert [f.score for f in fused] == sorted((f.score for f in fused), reverse=True)


def test_a_channel_with_weight_zero_contributes_nothing():
    channels = random_channels(np.random.default_rng(3), ["sparse", "dense"])
    fused = fuse(channels, {"sparse": 1.0, "dense": 0.0}, k=100)
    assert all(set(f.contributions) == {"sparse"} for f in fused)
    # documents only the weight-0 channel retrieved are not in the result at all
    only_sparse = fuse({"sparse": channels["sparse"]}, {"sparse": 1.0}, k=100)
    assert [(f.doc, f.score) for f in fused] == [(f.doc, f.score) for f in only_sparse]


def test_padding_is_ignored():
    channels = random_channels(np.random.default_rng(4), ["sparse", "dense"], pad=5)
    unpadded = {name: (docs[docs >= 0], scores[docs >= 0]) for name, (docs, scores) in channels.items()}
    weights = {"sparse": 1.0, "dense": 1.0}
    fused = fuse(channels, weights, k=100)
    assert all(f.doc >= 0 and math.isfinite(f.score) for f in fused)
    assert fused == fuse(unpadded, weights, k=100)


def test_a_channel_with_all_equal_scores_normalises_to_one():
    channels = {"flat": (np.array([4, 2, 9, -1]), np.array([3.5, 3.5, 3.5, -np.inf]))}
    fused = fuse(channels, {"flat": 2.0}, k=10)
    assert [(f.doc, f.score) for f in fused] == [(2, 2.0), (4, 2.0), (9, 2.0)]  # ties by doc number


def test_fusion_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="method must be one of"):
        fuse({"sparse": (np.array([1]), np.array([1.0]))}, {"sparse": 1.0}, k=5, method="borda")


# ====================================================================== BM25
TEXTS = [
    "The cat sat on the mat with another cat",
    "Dogs and cats are living together in the house",
    "The running of the bulls",
    "A cat runs after the dog, and the dog runs after the cat",
    "Stock markets fell sharply on Monday",
    "mat",
]
BM25_QUERIES = ["cat", "running dogs", "cat cat mat", "the house of stock", "zebra"]


def lucene_bm25(docs: list[list[str]], query: list[str], k1: float = 0.9, b: float = 0.4) -> dict[int, float]:
    """Lucene's BM25Similarity written out: every document matching a query term, with its score."""
    n_docs = len(docs)
    avgdl = sum(len(d) for d in docs) / n_docs
    df = Counter(t for d in docs for t in set(d))
    scores = {}
    for i, terms in enumerate(docs):
        tf, norm = Counter(terms), k1 * (1 - b + b * len(terms) / avgdl)
        matched = [(t, n) for t, n in Counter(query).items() if tf[t]]
        if matched:
            idf = {t: math.log(1 + (n_docs - df[t] + 0.5) / (df[t] + 0.5)) for t, _ in matched}
            scores[i] = sum(n * idf[t] * tf[t] / (tf[t] + norm) for t, n in matched)
    return scores


def bm25_search(index: BM25Index, terms: list[str], k: int) -> dict[int, float]:
    ids, weights, _ = index.encode_query(terms)
    docs, scores = index.postings.search(ids, weights, k)
    return {int(d): float(s) for d, s in zip(docs, scores) if d >= 0}


@pytest.fixture(scope="module")
def words() -> WordAnalyzer:
    return WordAnalyzer()


@pytest.mark.parametrize("query", BM25_QUERIES)
def test_bm25_scores_equal_lucene_formula(words, query):
    index = BM25Index.build(TEXTS, words)
    want = lucene_bm25([words(t) for t in TEXTS], words(query))
    got = bm25_search(index, words(query), k=len(TEXTS))
    assert set(got) == set(want)
    for doc, score in want.items():
        assert got[doc] == pytest.approx(score, rel=1e-5), doc


def test_bm25_query_term_weight_is_its_count(words):
    index = BM25Index.build(TEXTS, words)
    _, weights, names = index.encode_query(words("cat cat mat zebra"))
    assert dict(zip(names, weights.tolist())) == {"cat": 2.0, "mat": 1.0}  # unknown terms dropped


def test_word_analyzer_lowercases_drops_stop_words_and_stems(words):
    assert words("Running runs") == ["run", "run"]
    assert words("The CATS and the dog") == ["cat", "dog"]
    assert words("the cat's toy") == ["cat", "toi"]  # possessive dropped, Porter stem
    assert words(" ".join(sorted(LUCENE_STOPWORDS)).upper()) == []


def test_word_analyzer_drops_possessives_before_punctuation_and_at_the_end(words):
    assert words("the toy is the cat's") == ["toi", "cat"]
    assert words("the cat's, toy") == ["cat", "toi"]


def test_word_analyzer_yields_no_empty_terms(words):
    # PyStemmer's Porter stems "s" to "": short words must stay unstemmed, as in Lucene
    assert "" not in words("the U.S. army")


def test_tokens_analyzer_uses_the_backbone_tokenizer(tiny_tokenizer):
    analyze = make_analyzer("tokens", tiny_tokenizer)
    assert analyze("The CAT sat") == tiny_tokenizer.tokenize(" the cat sat")
    index = BM25Index.build(["the cat sat", "a dog"], analyze)
    assert index.analyzer == "tokens"
    assert set(index.vocab) == set(tiny_tokenizer.tokenize(" the cat sat")) | set(tiny_tokenizer.tokenize(" a dog"))


def test_make_analyzer_refuses_unknown_names_and_tokens_without_tokenizer():
    assert make_analyzer("words").name == "words"
    with pytest.raises(ValueError, match="unknown lexical analyser 'stems'"):
        make_analyzer("stems")
    with pytest.raises(ValueError, match="needs the backbone tokenizer"):
        make_analyzer("tokens")


def test_bm25_index_save_load_roundtrip(words, tmp_path):
    index = BM25Index.build(TEXTS, words)
    index.save(tmp_path / "lexical")
    loaded = BM25Index.load(tmp_path / "lexical", n_docs=len(TEXTS))
    assert (loaded.vocab, loaded.k1, loaded.b, loaded.analyzer) == (index.vocab, 0.9, 0.4, "words")
    for query in BM25_QUERIES:
        assert bm25_search(loaded, words(query), 10) == bm25_search(index, words(query), 10)


# ================================================================ EmbedFilter
def projector(v: np.ndarray) -> np.ndarray:
    """V Vᵀ: the orthogonal projection onto the span of V's columns (sign-free)."""
    v = np.asarray(v, np.float64)
    return v @ v.T


@pytest.mark.parametrize("tau", [1, 2, 3, 8])
def test_embedfilter_keeps_the_middle_right_singular_vectors(tau):
    w_u = np.random.default_rng(tau).normal(size=(300, 64))
    proj, left, right = embedfilter_projection(w_u, tau)
    k = 64 // tau
    assert proj.shape == (64, k) and (left, right) == ((64 - k) // 2, (64 - k) // 2 + k)
    _, _, vt = np.linalg.svd(w_u, full_matrices=False)
    np.testing.assert_allclose(projector(proj), projector(vt[left:right].T), atol=1e-5)
    np.testing.assert_allclose(proj.T @ proj, np.eye(k), atol=1e-5)  # orthonormal columns


@pytest.mark.parametrize("tau, k, left", [(2, 32, 16), (8, 8, 28)])
def test_embedfilter_dimensions_for_d_64(tau, k, left):
    proj, l, r = embedfilter_projection(np.random.default_rng(0).normal(size=(200, 64)), tau)
    assert (proj.shape, l, r) == ((64, k), left, left + k)


def test_embedfilter_tau_1_preserves_cosine_similarities():
    rng = np.random.default_rng(5)
    proj, left, right = embedfilter_projection(rng.normal(size=(200, 64)), 1)
    assert (proj.shape, left, right) == ((64, 64), 0, 64)
    x, y = rng.normal(size=(10, 64)), rng.normal(size=(10, 64))

    def cosines(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    np.testing.assert_allclose(cosines(x @ proj, y @ proj), cosines(x, y), atol=1e-5)


def test_embedfilter_refuses_tau_below_one():
    with pytest.raises(ValueError, match="tau"):
        embedfilter_projection(np.eye(8), 0)


# ===================================================== an index with every channel
@pytest.fixture
def all_channels(toy_corpus, tiny_embedder, tmp_path) -> Retriever:
    """An index of the toy corpus with sparse, dense, EmbedFilter (tau 2) and BM25 channels."""
    channels = {"dense": True, "embedfilter_tau": 2, "lexical": "words"}
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=16, progress=False, **channels)
    return Retriever.load(tmp_path / "index", embedder=tiny_embedder)


def doc_texts(docs: list[dict]) -> list[str]:
    return [f"{d['title']} {d['text']}" for d in docs]  # what the BEIR reader indexes


def test_index_with_every_channel_records_them(all_channels):
    r = all_channels
    assert r.modes == ALL_MODES
    assert r.embedder.dim == 32  # EmbedFilter tau 2 keeps 16 dimensions, from the 8th
    embedfilter = {k: r.manifest.record("embedfilter")[k] for k in ("tau", "left", "right", "dim")}
    assert embedfilter == {"tau": 2, "left": 8, "right": 24, "dim": 16}
    assert {k: r.manifest.record("lexical")[k] for k in ("analyzer", "k1", "b")} == {"analyzer": "words", "k1": 0.9, "b": 0.4}
    assert {"dense.faiss", "dense_ef.faiss", "dense_ef_projection.npy", "lexical"} <= {p.name for p in r.index_dir.iterdir()}


def test_bm25_mode_scores_and_explains_hits(all_channels, docs_factory, words):
    texts = doc_texts(docs_factory(40))
    position = {doc_id: i for i, doc_id in enumerate(all_channels.doc_ids)}
    for query in QUERIES:
        hits = all_channels.search(query, k=5, mode="bm25")
        assert hits, query
        want = lucene_bm25([words(t) for t in texts], words(query))
        for h in hits:
            assert h.score == pytest.approx(want[position[h.doc_id]], rel=1e-5)
            assert h.matched_terms and set(h.matched_terms) <= set(words(query))  # the analysed terms (stems)
            assert set(h.matched_tokens) <= set(query.lower().split())  # shown as the query's words
            assert sum(h.matched_tokens.values()) == pytest.approx(h.score, rel=1e-5)
            assert sum(h.matched_terms.values()) == pytest.approx(h.score, rel=1e-5)


def test_dense_ef_mode_is_cosine_of_projected_embeddings(all_channels, docs_factory):
    docs = docs_factory(40)
    embedder = all_channels.embedder
    w_u = embedder.causal_lm.get_output_embeddings().weight.detach().float().numpy()
    proj, _, _ = embedfilter_projection(w_u, 2)
    d = embedder.embed(doc_texts(docs)) @ proj
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    for query in QUERIES:
        q = embedder.embed([query])[0] @ proj
        cos = d @ q / np.linalg.norm(q)
        (top,) = all_channels.search(query, k=1, mode="dense-ef")
        assert top.doc_id == docs[int(np.argmax(cos))]["_id"]
        assert top.score == pytest.approx(float(cos.max()), abs=1e-4)


def test_hybrid_hits_split_their_score_over_the_channels(all_channels):
    for query in QUERIES:
        hits = all_channels.search(query, k=10, mode="hybrid")
        assert hits
        for h in hits:
            assert h.channels and set(h.channels) <= {"sparse", "dense", "bm25"}  # dense-ef weighs 0 by default
            assert sum(h.channels.values()) == pytest.approx(h.score, abs=1e-9)


def test_hybrid_with_only_the_sparse_weight_ranks_like_sparse(all_channels, tiny_embedder):
    fusion = {"method": "minmax", "weights": {"sparse": 1, "dense": 0, "bm25": 0}}
    r = Retriever.load(all_channels.index_dir, embedder=tiny_embedder, fusion=fusion)
    for query in QUERIES:
        hybrid = r.search(query, k=10, mode="hybrid")
        assert [h.doc_id for h in hybrid] == [h.doc_id for h in r.search(query, k=10, mode="sparse")]
        assert all(set(h.channels) == {"sparse"} for h in hybrid)


@pytest.mark.parametrize("mode", ["sparse", "bm25", "hybrid"])
def test_search_without_explanations_returns_the_same_hits(all_channels, mode):
    encoded = all_channels.encode(QUERIES)
    full = all_channels.search_encoded(encoded, k=10, mode=mode)
    bare = all_channels.search_encoded(encoded, k=10, mode=mode, explain=False)
    for f, b in zip(full, bare):
        assert [(h.doc_id, h.score, h.channels) for h in b] == [(h.doc_id, h.score, h.channels) for h in f]
        assert all(h.matched_tokens == {} for h in b) and any(h.matched_tokens for h in f)


def test_bm25_mode_needs_a_lexical_index(toy_corpus, tiny_embedder, tmp_path):
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder)
    assert "bm25" not in r.modes
    with pytest.raises(ValueError, match="mode 'bm25' needs an index built with --lexical"):
        r.search("cat", mode="bm25")


# ============================================================ all-caps folding
def test_is_all_caps():
    assert is_all_caps("THE CAT SAT") and is_all_caps("ÉTÉ 1999") and is_all_caps("U.S.A.")
    assert not is_all_caps("The Cat sat") and not is_all_caps("the cat")
    assert not is_all_caps("1999 ...") and not is_all_caps("")  # no cased letter at all


def test_all_caps_text_is_read_as_lower_case_by_default(make_embedder):
    embedder = make_embedder()
    assert embedder.config.fold_all_caps is EmbedderConfig().fold_all_caps is True
    upper, lower = "THE CAT SAT", "the cat sat"
    assert embedder.normalise(upper) == lower
    assert embedder.prompt_ids([upper]) == embedder.prompt_ids([lower])
    assert embedder.literal_token_ids(upper) == embedder.literal_token_ids(lower)
    assert literal_ids(embedder, upper, "both") == literal_ids(embedder, lower, "both")


def test_all_caps_text_is_kept_when_folding_is_off(make_embedder):
    embedder = make_embedder(fold_all_caps=False)
    upper, lower = "THE CAT SAT", "the cat sat"
    assert embedder.normalise(upper) == upper
    assert embedder.prompt_ids([upper]) != embedder.prompt_ids([lower])
    assert embedder.literal_token_ids(upper) != embedder.literal_token_ids(lower)


def test_mixed_case_text_is_never_folded(make_embedder):
    embedder = make_embedder()
    mixed = "The Cat SAT"
    assert embedder.normalise(mixed) == mixed
    assert embedder.prompt_ids([mixed]) != embedder.prompt_ids([mixed.lower()])


# ================================================= the channels as benchmark systems
def write_beir(root: Path, docs: list[dict], queries: list[dict]) -> Path:
    """A BEIR folder where query i judges document i relevant."""
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    qrels = [f"{q['_id']}\t{d['_id']}\t1" for q, d in zip(queries, docs)]
    (root / "qrels" / "test.tsv").write_text("\n".join(["query-id\tcorpus-id\tscore", *qrels]) + "\n", encoding="utf-8")
    return root


def test_one_index_build_serves_every_channel_system(tmp_path, docs_factory, tiny_model_dir, monkeypatch):
    """sparse, dense, dense-ef, bm25 and hybrid run through the suite on one shared index,
    and the bm25 system's run is what Retriever mode "bm25" returns."""
    import indexer.build
    from benchmarks import datasets, runs, systems
    from benchmarks.suite import run_suite

    assert set(ALL_MODES) <= set(systems.REGISTRY)
    docs = docs_factory(40)
    queries = [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[:5])]
    ds = datasets.load_beir_folder(write_beir(tmp_path / "toyq", docs, queries))
    builds = []
    real_build_index = indexer.build.build_index

    def counting_build_index(spec, index_dir, *args, **kwargs):
        # the harness's untimed warm-up build (a sample, in a temporary folder) is not the collection's build
        if not any(part.startswith(".warmup-") for part in Path(index_dir).parts):
            builds.append(kwargs)
        return real_build_index(spec, index_dir, *args, **kwargs)

    monkeypatch.setattr(indexer.build, "build_index", counting_build_index)
    tiny_model = {"model": str(tiny_model_dir), "adapter": "none", "device": "cpu"}
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, top_k=8, expansion_m=4, **tiny_model)
    out = tmp_path / "out"
    results = run_suite([ds], ALL_MODES, settings, out, depth=10, command="test")

    assert len(builds) == 1 and {"dense", "dense-ef", "bm25"} <= set(builds[0]["channels"])  # one build, every channel (by mode)
    (entry,) = results["datasets"]
    assert list(entry["results"]) == ALL_MODES
    metrics = results["settings"]["metrics"]
    for name, res in entry["results"].items():
        assert set(res["metrics"]) == set(metrics) and all(0 <= v <= 1 for v in res["metrics"].values()), name
    assert len({res["index"]["seconds"] for res in entry["results"].values()}) == 1
    # the warm-up build's seconds come off the wall clock of the call that ran it, not of later calls served from it
    assert all(res["index_wall_seconds"] >= 0 for res in entry["results"].values())
    assert entry["results"]["bm25"]["metrics"]["ndcg@10"] > 0  # each query is its document's title

    index_dir = settings.work_dir / ds.name / "aligned-tokens"
    run = runs.read_trec(out / entry["results"]["bm25"]["run_file"])
    reference = Retriever.load(index_dir, device="cpu")
    for qid, hits in zip(ds.queries, reference.batch_search(list(ds.queries.values()), k=10, mode="bm25")):
        assert hits and run[qid] == pytest.approx({h.doc_id: h.score for h in hits}, rel=1e-6)


# ------------------------------------------------------------------ dense index kinds
@pytest.mark.parametrize("kind", ["HNSW32", "IVF4,PQ8x4"])
def test_dense_index_kinds_build_search_and_reload(kind, tmp_path):
    """Approximate FAISS kinds (graph, inverted lists + product quantisation) are stored and
    reloaded like Flat; HNSW on a small set finds the exact nearest neighbour."""
    from indexer.dense import DenseIndex, normalise

    rng = np.random.default_rng(0)
    docs, queries = rng.normal(size=(300, 32)).astype(np.float32), rng.normal(size=(5, 32)).astype(np.float32)
    index = DenseIndex.build(docs, kind)
    index.save(tmp_path)
    again = DenseIndex.load(tmp_path)
    d1, s1 = index.search(queries, 10)
    d2, s2 = again.search(queries, 10)
    assert np.array_equal(d1, d2) and np.allclose(s1, s2)
    assert ((d1 >= 0) & (d1 < 300)).all()
    if kind.startswith("HNSW"):
        exact = np.argmax(normalise(queries) @ normalise(docs).T, axis=1)
        assert np.array_equal(d1[:, 0], exact)
