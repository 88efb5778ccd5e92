"""Self-calibrating fusion (issue 71): the weights each BM25 + encoder pair earns on the corpus itself.

- pseudo-queries: a sentence held out of a document, the rest kept, reproducible by seed;
- the held-out lists: the source scored by its rest, wherever that puts it;
- the ranks calibration scores settings by agree with what retriever/fusion.py fuses;
- it adapts: the channel that finds the held-out sentences' documents gets the weight;
- build-index records the calibration in the manifest, the fast profile searches with it and says so;
  a corpus too small to calibrate keeps the fixed setting and says why; a damaged record is named.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from conftest import FILLER, TOPICS, reseal, save_tiny_sentence_encoder

from indexer import calibration as cal
from retriever.fusion import fuse


class ListChannel:
    """A channel whose lists and held-out scores a test sets: ``finds`` of the pseudo-queries are
    answered with their source first, the others with random documents."""

    def __init__(self, name: str, n_docs: int, finds: float, seed: int) -> None:
        self.name, self.n_docs, self.finds = name, n_docs, finds
        self.rng = np.random.default_rng(seed)
        self.sources: dict[str, int] = {}

    def search(self, queries, depth):
        out = []
        for q in queries:
            src = self.sources[q]
            docs = self.rng.permutation(self.n_docs)[:depth]
            docs = docs[docs != src][: depth - 1]
            out.append((docs, np.sort(self.rng.random(len(docs)))[::-1] * 0.9))
        return out

    def score(self, queries, texts):
        return np.asarray([1.0 if self.rng.random() < self.finds else 0.0 for _ in queries])


def sentences_corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    names = sorted(TOPICS)
    docs = []
    for i in range(n):
        topic = TOPICS[names[i % len(names)]]
        sents = [" ".join(rng.choice(topic) if rng.random() < 0.7 else rng.choice(FILLER) for _ in range(rng.randint(6, 12))) + "."
                 for _ in range(rng.randint(3, 5))]
        docs.append(" ".join(sents))
    return docs


def test_pseudo_queries_hold_a_sentence_out_reproducibly():
    texts = sentences_corpus(60) + ["one sentence only, no second one"]
    a, b = cal.pseudo_queries(texts, 30, seed=3), cal.pseudo_queries(texts, 30, seed=3)
    assert a == b and len(a) == 30 and a != cal.pseudo_queries(texts, 30, seed=4)
    for p in a:
        parts = cal.sentences(texts[p.doc])
        assert p.query in parts and p.rest == " ".join(s for s in parts if s != p.query or parts.count(s) > 1)
        assert len(p.rest.split()) >= cal.REST_WORDS
    assert all(p.doc != 60 for p in cal.pseudo_queries(texts, 100))  # a one-sentence document gives none
    assert cal.calibrate([ListChannel("a", 5, 1, 0), ListChannel("b", 5, 0, 1)], texts[:5]) is None  # too few: None


def test_held_out_lists_score_the_source_by_its_rest():
    class Fixed:
        name = "x"

        def search(self, queries, depth):  # the full document (7) on top, as an index holding it finds it
            return [(np.array([7, 1, 2, 3]), np.array([9.0, 5.0, 4.0, 3.0]))]

        def __init__(self, rest_score):
            self.rest_score = rest_score

        def score(self, queries, texts):
            return np.array([self.rest_score])

    pq = [cal.PseudoQuery(7, "q", "rest")]
    docs, scores = cal.held_out_lists(Fixed(4.5), pq, depth=4)[0]
    assert docs.tolist() == [1, 7, 2, 3] and scores.tolist() == [5.0, 4.5, 4.0, 3.0]
    docs, _ = cal.held_out_lists(Fixed(1.0), pq, depth=3)[0]
    assert docs.tolist() == [1, 2, 3]  # its rest scores below the list: not found


@pytest.mark.parametrize("depth", [None, 10])
@pytest.mark.parametrize("method", ["minmax", "max"])
def test_source_ranks_agree_with_the_retrievers_fusion(method, depth):
    """Calibration ranks the sources as the Retriever fuses: listed documents only (depth None),
    or each list's first ``depth`` with scores completed from the rest (a "complete" fusion)."""
    rng = np.random.default_rng(0)
    pqs, lists = [], [[], []]
    for j in range(25):
        src = int(rng.integers(50))
        pqs.append(cal.PseudoQuery(src, "q", "r"))
        for c in range(2):
            docs = rng.permutation(50)[:20]
            scores = np.sort(rng.random(20) * (3 if c else 1))[::-1]
            lists[c].append((docs, scores))
    settings = cal.grid(2, methods=(method,))
    ranks = cal.source_ranks(lists, pqs, settings, depth)
    for i, s in enumerate(settings):
        for j, p in enumerate(pqs):
            fused = fuse({"a": lists[0][j], "b": lists[1][j]}, {"a": s.weights[0], "b": s.weights[1]}, k=100, method=method, depth=depth)
            order = [f.doc for f in fused]
            want = order.index(p.doc) + 1 if p.doc in order else 0
            assert ranks[i, j] == want, (s, j)


@pytest.mark.parametrize("strong", [0, 1])
def test_the_channel_that_finds_the_sources_gets_the_weight(strong):
    texts = sentences_corpus(120)
    pqs = cal.pseudo_queries(texts, 100)
    channels = [ListChannel("a", len(texts), 0.9 if strong == 0 else 0.1, 0), ListChannel("b", len(texts), 0.9 if strong == 1 else 0.1, 1)]
    for c in channels:
        c.sources = {p.query: p.doc for p in pqs}
    chosen = cal.choose(channels, pqs)
    weights = chosen.fusion["weights"]
    assert weights.get(channels[strong].name, 0) > weights.get(channels[1 - strong].name, 0)
    assert chosen.alone[channels[strong].name] > chosen.alone[channels[1 - strong].name]
    assert "held-out sentences" in chosen.why()


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    return save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st"), seed=0)


def _corpus(tmp_path, n):
    from conftest import write_corpus

    docs = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(sentences_corpus(n))]
    return write_corpus(tmp_path / f"corpus-{n}", docs, "beir")


def test_build_records_the_calibration_and_fast_searches_with_it(tmp_path, tiny_embedder, st_dir):
    from embedder.sentence_encoder import SentenceEncoder
    from indexer.build import build_index
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    index = tmp_path / "index"
    build_index(_corpus(tmp_path, 80), index, tiny_embedder, top_k=16, progress=False, lexical="words", encoder=SentenceEncoder.load(st_dir))
    m = Manifest.read(index)
    pair = m.calibration["pairs"]["bm25+encoder"]
    assert pair["n_queries"] >= cal.MIN_QUERIES and set(pair["alone"]) == {"bm25", "encoder"}
    assert set(pair["fusion"]["weights"]) <= {"bm25", "encoder"} and pair["fusion"]["method"] in cal.METHODS
    r = Retriever.load(index, embedder=tiny_embedder, warm=False, profile="fast")
    assert r.fusion == pair["fusion"] and r.fusion_source.startswith("calibrated on this corpus")
    assert r.search("cat dog river", k=3)
    # a record damaged by hand (and resealed, so that only its meaning is wrong) is named, not searched with
    data = json.loads((index / "manifest.json").read_text())
    data["calibration"]["pairs"]["bm25+encoder"]["fusion"]["weights"]["bm25"] = -1
    (index / "manifest.json").write_text(json.dumps(data))
    reseal(index)
    with pytest.raises(Exception, match="calibration"):
        Retriever.load(index, embedder=tiny_embedder, warm=False, profile="fast")


def test_a_corpus_too_small_to_calibrate_keeps_the_fixed_setting_and_says_why(tmp_path, tiny_embedder, st_dir):
    from embedder.sentence_encoder import SentenceEncoder
    from indexer.build import build_index
    from indexer.manifest import Manifest
    from retriever.profiles import PROFILES
    from retriever.retriever import Retriever

    index = tmp_path / "small"
    build_index(_corpus(tmp_path, 8), index, tiny_embedder, top_k=16, progress=False, lexical="words", encoder=SentenceEncoder.load(st_dir))
    assert "pseudo-queries drawn" in Manifest.read(index).calibration["skipped"]
    r = Retriever.load(index, embedder=tiny_embedder, warm=False, profile="fast")
    assert r.fusion == PROFILES["fast"].fusion and "fixed setting" in r.fusion_source and "pseudo-queries drawn" in r.fusion_source
    assert Retriever.load(index, embedder=tiny_embedder, warm=False, profile="fast", fusion={"weights": {"bm25": 1.0}}).fusion_source == "given by the caller"


def test_updates_carry_the_calibration_and_read_it_again_once_a_tenth_has_changed(tmp_path, tiny_embedder, st_dir, monkeypatch):
    from embedder.sentence_encoder import SentenceEncoder
    from indexer import calibration_channels
    from indexer.build import build_index
    from indexer.corpus import Document
    from indexer.manifest import Manifest
    from indexer.updates import update_index

    encoder = SentenceEncoder.load(st_dir)
    index = tmp_path / "index"
    build_index(_corpus(tmp_path, 60), index, tiny_embedder, top_k=16, progress=False, lexical="words", encoder=encoder)
    first = Manifest.read(index).calibration
    assert first["n_docs"] == 60 and first["pairs"]
    calls = []
    real = calibration_channels.calibrate_index
    monkeypatch.setattr("indexer.updates.calibrate_index", lambda *a, **k: calls.append(1) or real(*a, **k))
    new = [Document(f"n{i}", t) for i, t in enumerate(sentences_corpus(8, seed=5))]
    update_index(index, add=new[:3], embedder=tiny_embedder, encoder=encoder, progress=False)  # 3 of 60: carried
    m = Manifest.read(index)
    assert not calls and m.calibration["pairs"] == first["pairs"] and m.calibration["changed_since"] == 3
    update_index(index, add=new[3:8], embedder=tiny_embedder, encoder=encoder, progress=False)  # 8 of 60 > a tenth: read again
    m = Manifest.read(index)
    assert calls == [1] and m.calibration["changed_since"] == 5 and m.calibration["pairs"]["bm25+encoder"]["n_queries"] >= cal.MIN_QUERIES
    update_index(index, delete=["d0"], embedder=tiny_embedder, encoder=encoder, progress=False, recalibrate=True)
    assert calls == [1, 1] and Manifest.read(index).calibration["changed_since"] == 1
