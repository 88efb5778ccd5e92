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
for tools.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

SYMBOLS = "(symbols)"  # the one entry grouping pieces with no letter or digit
WORD_START = "…"  # appended to a word start (``Schu…``), prepended to an inner piece (``…ellig``)
_WORD = re.compile(r"\w+(?:'\w+)*", re.UNICODE)
_START_MARKERS = ("Ġ", "▁")  # byte-level BPE (GPT-2, SmolLM2), SentencePiece


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


def term_words(terms: Sequence[str], query: str, analyze: Callable[[str], list[str]], decode: Callable[[str], str] | None = None) -> list[str]:
    """Each analysed BM25 term shown as the first query word it came from (``pars`` ->
    "parsing"); ``decode`` spells terms no query word gives (a backbone-token analyser's)."""
    source: dict[str, str] = {}
    for word in _WORD.findall(query):
        for term in analyze(word):
            source.setdefault(term, word.lower())
    return [source.get(t) or (decode(t) if decode else t) for t in terms]


def _ids(tokenizer, text: str) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i not in special]
