"""Explanations a person reads: matched tokens and BM25 terms shown as words.

The aligned-token channel matches vocabulary entries of a byte-level BPE tokenizer: ``Ġargparse``
(word-initial form), ``parse`` (inner form), ``ĠSchu`` (the start of a longer word), ``Ã©``
(bytes of one character). A hit's explanation turns them into what a reader expects:

- each token is decoded (``Ġargparse`` -> ``argparse``);
- the word-initial and inner forms of one word (any case) are merged into one entry whose
  contribution is the sum of theirs, so the entries still add up to the channel's score;
- a piece that is not a word is *marked*: ``Schu…`` (a word start), ``…ellig`` (the inside of
  a word); pieces without a letter or digit (punctuation, partial UTF-8 bytes) are *grouped*
  into one entry, :data:`SYMBOLS`.

A piece counts as a word when it is a word of the query (then it is spelled as the query spells
it), or when it starts a word, is more than one letter and, where the index has a stemmed-words
BM25 channel, its stem is a term of the corpus (``Schu`` is not).

BM25 terms are stems (``pars`` for "parsing"): each is shown as the query word it came from.
The raw token ids and analysed terms stay on the hit (``Hit.matched_ids``, ``Hit.matched_terms``)
for tools. :class:`HitExplainer` puts them on each hit, channel by channel, as the channel table
says how each channel's query is made.
"""
from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from indexer.channels import ANALYSED_TERMS, CHANNEL_SPECS, ChannelSpec, spec
from retriever.channel_search import ChannelSearch
from retriever.hit import Hit
from retriever.query import EncodedQuery

SYMBOLS = "(symbols)"  # the one entry grouping pieces with no letter or digit
WORD_START = "…"  # appended to a word start (``Schu…``), prepended to an inner piece (``…ellig``)
_WORD = re.compile(r"\w+(?:'\w+)*", re.UNICODE)
_START_MARKERS = ("Ġ", "▁")  # byte-level BPE (GPT-2, SmolLM2), SentencePiece
SOURCES_CACHE = 256  # queries whose term -> word maps a HitExplainer keeps


class TokenExplainer:
    """Turns (token id, contribution) pairs into readable words, once per query and hit.

    ``tokenizer``: a Hugging Face tokenizer; ``known_word``: a test of a lower-cased word
    against the corpus (e.g. its stem among the BM25 terms), None when the index has none.
    Decoded spellings are cached per token id (the vocabulary has tens of thousands).
    """

    def __init__(self, tokenizer, known_word: Callable[[str], bool] | None = None) -> None:
        self.tokenizer = tokenizer
        self.known_word = known_word
        self._pieces: dict[int, tuple[str, bool]] = {}
        # a tokenizer that marks word starts (byte-level BPE, SentencePiece) tells inner pieces
        # apart; one that does not (a whitespace pre-tokenizer) gives no such evidence
        self.marks_word_starts = any(self.piece(i)[1] for i in _ids(tokenizer, " hello world"))

    def piece(self, token_id: int) -> tuple[str, bool]:
        """(decoded text without its word-start marker, whether it starts a word)."""
        token_id = int(token_id)
        if token_id not in self._pieces:
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            if raw is None:
                self._pieces[token_id] = (f"<{token_id}>", False)
            else:
                text = self.tokenizer.convert_tokens_to_string([raw])
                initial = raw.startswith(_START_MARKERS) or text.startswith(" ")
                self._pieces[token_id] = (text.strip(), initial)
        return self._pieces[token_id]

    def label(self, token_id: int, query_words: dict[str, str]) -> str:
        """The entry a token is listed under: a word, a marked fragment or :data:`SYMBOLS`.

        ``query_words``: the query's words by their lower case; a token spelling one of them is
        listed as the query spells it (``FILE`` and ``file`` are one entry, "file")."""
        text, initial = self.piece(token_id)
        if not any(ch.isalnum() for ch in text) or "\ufffd" in text:
            return SYMBOLS
        lower = text.lower()
        if lower in query_words:
            return query_words[lower]
        if self.marks_word_starts and not initial:
            return WORD_START + text
        if (len(text) == 1 and text.isalpha()) or (self.known_word is not None and not self.known_word(lower)):
            # a lone letter is a piece of a word, not one (unless the query has it)
            return text + WORD_START if self.marks_word_starts else WORD_START + text
        return text

    def words(self, token_ids: Sequence[int], contributions: Sequence[float], query: str) -> dict[str, float]:
        """Readable entries with summed contributions, largest first (ties: first seen).

        Entries of one word in different forms or cases are merged under the spelling of
        the largest contribution."""
        query_words: dict[str, str] = {}
        for w in _WORD.findall(query):
            query_words.setdefault(w.lower(), w)
        pairs = sorted(zip(token_ids, contributions), key=lambda tc: -tc[1])
        labels = [self.label(t, query_words) for t, _ in pairs]
        # an inner form ("…parser") joins the word-initial form of the same text that matched too
        # ("parser", or the fragment "pars…"): one word, one entry
        starts = {lab.rstrip(WORD_START).lower(): lab for lab in labels if lab != SYMBOLS and not lab.startswith(WORD_START)}
        labels = [starts.get(lab[1:].lower(), lab) if lab.startswith(WORD_START) and not lab.endswith(WORD_START) else lab for lab in labels]
        return merge((lab, c) for lab, (_, c) in zip(labels, pairs))


def merge(entries: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Sum contributions of entries equal up to case; the first spelling seen names the entry;
    the result is ordered by total, largest first."""
    total: dict[str, float] = {}
    spelling: dict[str, str] = {}
    for label, value in entries:
        key = label.lower()
        spelling.setdefault(key, label)
        total[key] = total.get(key, 0.0) + float(value)
    ordered = sorted(total.items(), key=lambda kv: -kv[1])  # stable: ties keep first-seen order
    return {spelling[k]: v for k, v in ordered}


def term_words(terms: Sequence[str], query: str, analyze: Callable[[str], list[str]], decode: Callable[[str], str] | None = None,
               sources: dict[str, str] | None = None) -> list[str]:
    """Each analysed BM25 term shown as the first query word it came from (``pars`` ->
    "parsing"); ``decode`` spells terms no query word gives (a backbone-token analyser's).
    ``sources``: :func:`term_sources` of this query, where the caller already has it."""
    source = term_sources(query, analyze) if sources is None else sources
    return [source.get(t) or (decode(t) if decode else t) for t in terms]


def term_sources(query: str, analyze: Callable[[str], list[str]]) -> dict[str, str]:
    """{analysed term: the first query word (lower case) it came from}."""
    source: dict[str, str] = {}
    for word in _WORD.findall(query):
        for term in analyze(word):
            source.setdefault(term, word.lower())
    return source


def _ids(tokenizer, text: str) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i not in special]


class HitExplainer:
    """Explains hits: for each channel searched by a sparse query (aligned-token ids, or analysed
    terms where its row's query is analysed terms: indexer/channels.py), what of the query matched
    the document and what each part added to the score. The TokenExplainer that spells aligned
    tokens is built on first use (it decodes vocabulary entries), once for a Retriever and its
    fusion views."""

    def __init__(self, tokenizer, channels: ChannelSearch, doc_ids: list[str]) -> None:
        self.tokenizer = tokenizer
        self.channels = channels
        self.doc_ids = doc_ids
        self._words: TokenExplainer | None = None
        self._lock = threading.Lock()
        # each query word analysed once per query text, not once per hit explained (a third of a
        # hybrid's explanation time on cisi went to re-analysing them); thread-safe, per instance
        self._sources = functools.lru_cache(maxsize=SOURCES_CACHE)(lambda text: term_sources(text, self.channels.analyze))

    @property
    def words(self) -> TokenExplainer:
        """Spells matched aligned tokens as words."""
        with self._lock:
            if self._words is None:
                self._words = TokenExplainer(self.tokenizer, self._known_word())
            return self._words

    def _known_word(self) -> Callable[[str], bool] | None:
        """A test of a word against the corpus, where a channel of analysed words (a stemmed-words
        BM25) can tell: all its terms are in that channel's vocabulary. None where none can."""
        for row in CHANNEL_SPECS:
            held = self.channels.channels.get(row.mode)
            if ANALYSED_TERMS in row.query_needs and held is not None and getattr(held, "analyzer", None) == "words":
                vocab, analyze = held.vocab, self.channels.analyze
                return lambda word: all(t in vocab for t in analyze(word))  # stop words give no term: known
        return None

    def hit(self, q: EncodedQuery, mode: str, doc: int, score: float, explain: bool, used: Sequence[str] = (),
            channels: dict[str, float] | None = None) -> Hit:
        """The hit of document ``doc``; with ``explain``, what matched in ``mode``'s channel, or
        for "hybrid" in each sparse channel it reads (``used``) and in the aligned-token channel
        whenever the query has aligned tokens, every channel's words but the aligned tokens'
        prefixed ``MODE:`` (``bm25:parsing``)."""
        hit = Hit(self.doc_ids[doc], float(score), channels=dict(channels or {}))
        if not explain:
            return hit
        if mode != "hybrid":
            if spec(mode).query_kind == "sparse":
                self._add(hit, q, spec(mode), doc, prefix="")
            return hit
        for row in CHANNEL_SPECS:
            if row.query_kind != "sparse" or self.channels.channels.get(row.mode) is None:
                continue
            # the aligned tokens say why the query matched even where the fusion weighs them 0
            explained = row.mode in used if ANALYSED_TERMS in row.query_needs else q.tokens.size > 0
            if explained:
                self._add(hit, q, row, doc, prefix="" if row.required else f"{row.mode}:")
        return hit

    def _add(self, hit: Hit, q: EncodedQuery, row: ChannelSpec, doc: int, prefix: str) -> None:
        """Adds to ``hit`` what of ``q`` matched ``doc`` in channel ``row``, largest first."""
        engine = self.channels.engine
        if ANALYSED_TERMS in row.query_needs:
            terms, weights, names = self.channels.terms(row.mode, q.text)
            contrib = engine.contributions(row.mode, terms, doc) * weights
            nz = _largest_first(contrib)
            raw = [names[j] for j in nz]
            hit.matched_terms.update({t: float(contrib[j]) for t, j in zip(raw, nz)})
            shown = term_words(raw, q.text, self.channels.analyze, self._decode_term, self._sources(q.text))
            matched = merge(zip(shown, contrib[nz].tolist()))
        else:
            contrib = engine.contributions(row.mode, q.tokens, doc) * q.weights
            nz = _largest_first(contrib)
            ids, values = q.tokens[nz].tolist(), contrib[nz].tolist()
            hit.matched_ids.update(zip(ids, values))
            matched = self.words.words(ids, values, q.text)
        hit.matched_tokens.update({f"{prefix}{t}": w for t, w in matched.items()})

    def _decode_term(self, term: str) -> str:
        """A backbone-token BM25 term (``Ġparse``) as text."""
        return self.tokenizer.convert_tokens_to_string([term]).strip() or term


def _largest_first(contrib: np.ndarray) -> np.ndarray:
    """Positions of the nonzero contributions, largest first (ties: first position)."""
    nz = np.flatnonzero(contrib)
    return nz[np.argsort(-contrib[nz], kind="stable")]
