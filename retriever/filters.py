"""Metadata filters: which documents a search may return.

A filter is a JSON object of conditions on the metadata fields the index stores
(indexer/stored_documents.py), all of which must hold::

    {"lang": "en"}                       equal (a document whose field is a list: contains it)
    {"tag": ["db", "search"]}            any of
    {"year": {"gte": 2000, "lt": 2010}}  a range (gt, gte, lt, lte; numbers or strings)

A filter is applied to each channel before fusion, as Lucene applies a filter query: each
channel ranks the documents that pass, so hybrid fuses the best matching documents of every
channel (not the survivors of an unfiltered top list), and k hits come back whenever k
documents pass.
"""
from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

RANGE_OPS = ("gt", "gte", "lt", "lte")
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Condition:
    field: str
    any_of: tuple | None = None  # equality (one value) or membership
    bounds: tuple[tuple[str, object], ...] = ()  # ((op, value), ...) for a range

    def holds(self, value: object) -> bool:
        if value is None:
            return False
        values = value if isinstance(value, list) else [value]
        return any(self._one(v) for v in values)

    def _one(self, v: object) -> bool:
        if self.any_of is not None:
            return any(_same(v, want) for want in self.any_of)
        for op, bound in self.bounds:
            if not _comparable(v, bound):
                return False
            if (op == "gt" and not v > bound) or (op == "gte" and not v >= bound) or (op == "lt" and not v < bound) or (op == "lte" and not v <= bound):
                return False
        return True


def _same(a: object, b: object) -> bool:
    # True == 1 in Python; a filter on a flag must not match a count
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _comparable(a: object, b: object) -> bool:
    number = lambda x: isinstance(x, numbers.Real) and not isinstance(x, bool)
    return (number(a) and number(b)) or (isinstance(a, str) and isinstance(b, str))


def parse_filter(where: Mapping | None, fields: list[str]) -> list[Condition]:
    """Check ``where`` against the index's metadata ``fields``; ValueError naming the field and
    the problem otherwise."""
    if where is None:
        return []
    if not isinstance(where, Mapping):
        # a ValueError as every other malformed filter: callers answer bad input with one kind of error
        raise ValueError(f"filter must be a JSON object of field: condition, not {type(where).__name__}")  # noqa: TRY004
    out = []
    for name, cond in where.items():
        if not isinstance(name, str) or name not in fields:
            known = ", ".join(fields) if fields else "none: the index stores no metadata"
            raise ValueError(f"filter field {name!r} is not a metadata field of this index (fields: {known})")
        if isinstance(cond, _SCALARS):
            out.append(Condition(name, any_of=(cond,)))
        elif isinstance(cond, list) and cond and all(isinstance(v, _SCALARS) for v in cond):
            out.append(Condition(name, any_of=tuple(cond)))
        elif isinstance(cond, Mapping) and cond and set(cond) <= set(RANGE_OPS):
            for op, bound in cond.items():
                if not (isinstance(bound, str) or (isinstance(bound, numbers.Real) and not isinstance(bound, bool) and math.isfinite(bound))):
                    raise ValueError(f"filter field {name!r}: {op} needs a number or a string, not {bound!r}")
            out.append(Condition(name, bounds=tuple(cond.items())))
        else:
            raise ValueError(
                f"filter field {name!r}: expected a value, a non-empty list of values, or a range object with {', '.join(RANGE_OPS)}; got {cond!r}"
            )
    return out


def filter_mask(conditions: list[Condition], metadata: list[dict | None]) -> np.ndarray:
    """Which documents (by doc number) pass every condition."""
    mask = np.ones(len(metadata), bool)
    for cond in conditions:
        mask &= np.fromiter((cond.holds((m or {}).get(cond.field)) for m in metadata), bool, len(metadata))
    return mask


MASK_CACHE = 32  # filters whose document masks are kept


class MetadataFilters:
    """An index's metadata filters: the documents' metadata (read on first use, once for a
    Retriever and its fusion views) and the masks of the latest :data:`MASK_CACHE` filters (a
    server asks for the same few again and again)."""

    def __init__(self, fields: list[str], read_metadata: Callable[[], list[dict | None]]) -> None:
        """``fields``: the metadata fields the index stores; ``read_metadata``: reads each
        document's metadata (None where it has none), by doc number."""
        self.fields = fields
        self._read_metadata = read_metadata
        self._metadata: list[dict | None] | None = None
        self._masks: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def metadata(self) -> list[dict | None]:
        if self._metadata is None:
            self._metadata = self._read_metadata()
        return self._metadata

    def mask(self, where: Mapping | None) -> np.ndarray | None:
        """The documents filter ``where`` lets through (None: no filter); ValueError for a bad one."""
        if not where:
            return None
        conditions = parse_filter(where, self.fields)
        key = repr(conditions)
        with self._lock:
            mask = self._masks.get(key)
        if mask is None:
            mask = filter_mask(conditions, self.metadata)
            with self._lock:
                self._masks[key] = mask
                while len(self._masks) > MASK_CACHE:
                    self._masks.pop(next(iter(self._masks)))
        return mask


__all__ = ["MASK_CACHE", "RANGE_OPS", "Condition", "MetadataFilters", "filter_mask", "parse_filter"]
