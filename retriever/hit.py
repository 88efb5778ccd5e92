"""``Hit``: one search result, what every search of the Retriever returns."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Hit:
    """One search result.

    ``matched_tokens``: what matched, as words a person reads (retriever/explain.py), with
    each entry's contribution to the channel score, largest first; they add up to the score
    of a "sparse" or "bm25" hit. Forms of one word are merged; fragments are marked
    (``Schu…``, ``…ellig``), symbols grouped. In "hybrid", BM25's entries are prefixed ``bm25:``.
    ``matched_ids``: the same for tools, raw: each matched aligned-token id. ``matched_terms``:
    each matched BM25 term as analysed (a stem). ``channels``: for hybrid hits, each channel's
    weighted, normalised share of ``score``.
    """

    doc_id: str
    score: float
    matched_tokens: dict[str, float] = field(default_factory=dict)
    channels: dict[str, float] = field(default_factory=dict)
    matched_ids: dict[int, float] = field(default_factory=dict)
    matched_terms: dict[str, float] = field(default_factory=dict)
    query_encoder: str = ""  # who encoded the query for the LLM channels: "llm", "distilled:NAME", "none" ("": no LLM channel)
