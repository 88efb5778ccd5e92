"""Comparing two rankings up to ties (the equivalence checks between backends)."""
from __future__ import annotations

import numpy as np


def _hits(docs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A top-k list without its padding (doc -1), scores in float64."""
    d, sc = np.asarray(docs), np.asarray(scores, np.float64)
    keep = d >= 0
    return d[keep], sc[keep]


def same_up_to_ties(
    docs_a: np.ndarray, scores_a: np.ndarray, docs_b: np.ndarray, scores_b: np.ndarray, k: int | None = None
) -> str | None:
    """Compare two top-k lists (doc -1 = padding): None when they agree, else what differs.

    They agree when the scores are equal position by position and, for every score, the two
    lists hold the same documents, except at the last score of a full list (``k`` hits, or
    ``k`` unknown), where a tie may have been cut differently: only the count must match
    there, which equal scores already imply.
    """
    (a_d, a_s), (b_d, b_s) = _hits(docs_a, scores_a), _hits(docs_b, scores_b)
    if len(a_d) != len(b_d):
        return f"{len(a_d)} hits vs {len(b_d)}"
    if not np.array_equal(a_s, b_s):
        j = int(np.flatnonzero(a_s != b_s)[0])
        return f"score at rank {j + 1}: {a_s[j]} vs {b_s[j]}"
    full = k is None or len(a_s) >= k
    last = a_s[-1] if len(a_s) and full else None
    for score in np.unique(a_s):
        if score == last:
            continue  # the boundary tie group may be cut differently
        sa, sb = set(a_d[a_s == score].tolist()), set(b_d[b_s == score].tolist())
        if sa != sb:
            return f"documents with score {score}: {sorted(sa - sb)} vs {sorted(sb - sa)}"
    return None


def same_up_to_near_ties(
    docs_a: np.ndarray, scores_a: np.ndarray, docs_b: np.ndarray, scores_b: np.ndarray, k: int | None = None, rtol: float = 1e-5
) -> str | None:
    """Like :func:`same_up_to_ties` for engines that add the same float32 products in another
    order (or in float64): scores are equal when within ``rtol`` of the larger, and a document
    only one list holds must score within ``rtol`` of the other list's last score (a tie at the
    cut). None when they agree, else what differs."""
    (a_d, a_s), (b_d, b_s) = _hits(docs_a, scores_a), _hits(docs_b, scores_b)
    if len(a_d) != len(b_d):
        return f"{len(a_d)} hits vs {len(b_d)}"

    def close(x: float, y: float) -> bool:
        return abs(x - y) <= rtol * max(abs(x), abs(y), 1e-30)

    for j in range(len(a_s)):
        if not close(a_s[j], b_s[j]):
            return f"score at rank {j + 1}: {a_s[j]} vs {b_s[j]}"
    full = k is None or len(a_s) >= k
    score_a, score_b = dict(zip(a_d.tolist(), a_s.tolist())), dict(zip(b_d.tolist(), b_s.tolist()))
    for doc in set(score_a) | set(score_b):
        if doc in score_a and doc in score_b:
            if not close(score_a[doc], score_b[doc]):
                return f"document {doc}: score {score_a[doc]} vs {score_b[doc]}"
            continue
        mine, other_last = (score_a[doc], b_s[-1]) if doc in score_a else (score_b[doc], a_s[-1])
        if not (full and close(mine, other_last)):
            return f"document {doc} (score {mine}) in only one list, not at a tie with the cut ({other_last})"
    return None
