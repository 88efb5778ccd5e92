"""Metadata filters: which documents a search may return.

A filter is a JSON object of conditions on the metadata fields the index stores
(indexer/stored_documents.py), all of which must hold::

    {"lang": "en"}                       equal (a document whose field is a list: contains it)
    {"tag": ["db", "search"]}            any of
    {"year": {"gte": 2000, "lt": 2010}}  a range (gt, gte, lt, lte; numbers or strings)

Typed: the index records each field's kinds of values (boolean, number, string, object; the
manifest's ``documents.metadata_types``, inferred from the stored documents at build and update
time; for an index built before, inferred from them on the first filter). A value or bound of a
kind the field does not hold, NaN or Infinity (or 1e400, which reads as Infinity), and a range on a
field of several kinds are refused with one line naming the field (search-index exits 2, the
server answers 422); so is a filter nested more than three levels deep.

A filter is applied to each channel before fusion, as Lucene applies a filter query: each
channel ranks the documents that pass, so hybrid fuses the best matching documents of every
channel (not the survivors of an unfiltered top list), and k hits come back whenever k
documents pass.
"""
from __future__ import annotations

import json
import math
import numbers
import reprlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.stored_documents import field_kinds, value_kind

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


# A filter is at most three levels deep ({field: {op: value}} or {field: [values]}); anything deeper is
# refused by its depth before any of it is read (a 1000-level nest is one line, never a RecursionError).
MAX_FILTER_DEPTH = 3
# JSON text of a filter (search-index --where, GET /search?filter=) nested deeper than this is refused before it is parsed
MAX_FILTER_JSON_DEPTH = 32
_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlist, _BRIEF.maxdict = 2, 60, 60, 6, 4


def _brief(value: object) -> str:
    """``repr(value)``, cut short: an error message quotes a client's value without its whole depth or size."""
    return _BRIEF.repr(value)


def _too_deep(value: object, limit: int) -> bool:
    """Whether ``value`` nests objects and lists more than ``limit`` levels (walked without recursion,
    stopping at the first level beyond the limit)."""
    level = [value]
    for _ in range(limit):
        level = [v for x in level for v in (x.values() if isinstance(x, Mapping) else x if isinstance(x, list) else ())]
        if not level:
            return False
    return any(isinstance(x, (Mapping, list)) for x in level)


def _json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether JSON ``text`` opens more than ``limit`` brackets at once (strings skipped): checked before parsing."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def loads_filter(text: str) -> dict:
    """A filter given as JSON text (``search-index --where``, ``GET /search?filter=``): a JSON object,
    or ValueError in one line (not JSON, nested too deeply, not an object). Its conditions are checked
    by :func:`parse_filter`."""
    if _json_depth_exceeds(text, MAX_FILTER_JSON_DEPTH):
        raise ValueError(f"filter: nested more than {MAX_FILTER_JSON_DEPTH} levels deep (a filter is at most {MAX_FILTER_DEPTH}: "
                         '{"field": {"gte": value}})')
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"filter: not JSON ({exc.msg} at column {exc.colno})") from None
    except (RecursionError, ValueError) as exc:  # RecursionError: cannot happen below the depth bound; ValueError: a 5000-digit integer
        raise ValueError(f"filter: unreadable JSON ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise ValueError("filter: expected a JSON object of field: condition")  # noqa: TRY004 - every bad filter is a ValueError
    return value


def _kind_problem(name: str, value: object, kinds: list[str] | None, what: str) -> str | None:
    """Why ``value`` (a condition's value or bound) cannot be compared with field ``name`` holding ``kinds``."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"filter field {name!r}: {what} {value!r} is not a finite number (NaN and Infinity match nothing; 1e400 reads as Infinity)"
    if kinds is None:  # no schema to check against (parse_filter called without one)
        return None
    kind = value_kind(value)
    if kind not in kinds:
        holds = f"holds {' and '.join(_plural(k) for k in kinds)}" if kinds else "holds no values (null in every document)"
        return f"filter field {name!r}: {what} {_brief(value)} is a {kind}, but the field {holds}"
    return None


def _plural(kind: str) -> str:
    return {"boolean": "booleans", "number": "numbers", "string": "strings", "object": "objects or nested lists"}.get(kind, kind)


def parse_filter(where: Mapping | None, fields: list[str], types: Mapping[str, list[str]] | None = None) -> list[Condition]:
    """Check ``where`` against the index's metadata ``fields`` and, given, their ``types`` (each field's
    kinds of values, indexer/stored_documents.py: a value or bound of another kind, or a range on a field
    of several kinds, is refused); ValueError naming the field and the problem otherwise."""
    if where is None:
        return []
    if not isinstance(where, Mapping):
        # a ValueError as every other malformed filter: callers answer bad input with one kind of error
        raise ValueError(f"filter must be a JSON object of field: condition, not {type(where).__name__}")  # noqa: TRY004
    if _too_deep(where, MAX_FILTER_DEPTH):
        raise ValueError(f'filter nested more than {MAX_FILTER_DEPTH} levels deep (a filter is {{"field": value}}, {{"field": [values]}} '
                         'or {"field": {"gte": value}})')
    out = []
    for name, cond in where.items():
        if not isinstance(name, str) or name not in fields:
            known = ", ".join(fields) if fields else "none: the index stores no metadata"
            raise ValueError(f"filter field {_brief(name)} is not a metadata field of this index (fields: {known})")
        kinds = None if types is None else list(types.get(name, []))
        if isinstance(cond, _SCALARS):
            problem = _kind_problem(name, cond, kinds, "value")
            if problem:
                raise ValueError(problem)
            out.append(Condition(name, any_of=(cond,)))
        elif isinstance(cond, list) and cond and all(isinstance(v, _SCALARS) for v in cond):
            for v in cond:
                problem = _kind_problem(name, v, kinds, "value")
                if problem:
                    raise ValueError(problem)
            out.append(Condition(name, any_of=tuple(cond)))
        elif isinstance(cond, Mapping) and cond and set(cond) <= set(RANGE_OPS):
            for op, bound in cond.items():
                if not (isinstance(bound, str) or (isinstance(bound, numbers.Real) and not isinstance(bound, bool))):
                    raise ValueError(f"filter field {name!r}: {op} needs a number or a string, not {_brief(bound)}")  # noqa: TRY004
                problem = _kind_problem(name, bound, kinds, op)
                if problem:
                    raise ValueError(problem)
            if kinds is not None and len(kinds) != 1:
                raise ValueError(f"filter field {name!r}: a range needs a field of one type, numbers or strings; this index holds "
                                 f"{' and '.join(_plural(k) for k in kinds) or 'no values'} in it (filter it by value instead)")
            out.append(Condition(name, bounds=tuple(cond.items())))
        else:
            raise ValueError(
                f"filter field {name!r}: expected a value, a non-empty list of values, or a range object with {', '.join(RANGE_OPS)}; got {_brief(cond)}"
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

    def __init__(self, fields: list[str], read_metadata: Callable[[], list[dict | None]], types: Mapping[str, list[str]] | None = None) -> None:
        """``fields``: the metadata fields the index stores; ``read_metadata``: reads each
        document's metadata (None where it has none), by doc number; ``types``: each field's kinds
        of values as the manifest records them (None, an index built before they were recorded:
        inferred from the stored metadata on the first filter, the same read its mask needs)."""
        self.fields = fields
        self._read_metadata = read_metadata
        self._types = dict(types) if types is not None else None
        self._metadata: list[dict | None] | None = None
        self._masks: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def metadata(self) -> list[dict | None]:
        if self._metadata is None:
            self._metadata = self._read_metadata()
        return self._metadata

    @property
    def types(self) -> dict[str, list[str]]:
        """Each metadata field's kinds of values: the manifest's, else inferred from the stored metadata."""
        if self._types is None:
            self._types = field_kinds(self.metadata)
        return self._types

    def mask(self, where: Mapping | None) -> np.ndarray | None:
        """The documents filter ``where`` lets through (None: no filter); ValueError for a bad one."""
        if not where:
            return None
        if isinstance(where, Mapping) and not _too_deep(where, MAX_FILTER_DEPTH) and all(isinstance(n, str) and n in self.fields for n in where):
            types = self.types  # read (or inferred) only once the filter names known fields
        else:
            types = None  # parse_filter refuses it before any type matters
        conditions = parse_filter(where, self.fields, types)
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


__all__ = ["MASK_CACHE", "MAX_FILTER_DEPTH", "MAX_FILTER_JSON_DEPTH", "RANGE_OPS", "Condition", "MetadataFilters", "filter_mask", "loads_filter", "parse_filter", "stored_metadata"]


def stored_metadata(index_dir: Path, manifest: Any) -> list[dict | None]:
    """Each document's stored metadata (None where it has none), by doc number, read from the
    index (generation) directory ``index_dir``; an index built before documents were stored has none."""
    from indexer.stored_documents import StoredDocuments

    if manifest.documents is None:
        return [None] * manifest.n_docs
    stored = StoredDocuments.open(index_dir, manifest.n_docs)
    return [stored.record(i).get("metadata") for i in range(len(stored))]
