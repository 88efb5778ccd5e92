"""A bounded, thread-safe LRU cache of encoded queries.

Served engines see the same queries again and again (popular searches, retries, paging); an
encoded query costs a model forward, a cache hit a dictionary lookup. Keys hold the query text
and everything that decides its encoding (which channels need it, which query encoder answered),
so that two encoders never share an entry.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import replace

from retriever.query import EncodedQuery

DEFAULT_QUERY_CACHE_SIZE = 1024


class QueryCache:
    """At most ``maxsize`` encoded queries, the least recently used evicted first (0: no caching)."""

    def __init__(self, maxsize: int = DEFAULT_QUERY_CACHE_SIZE) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"query cache size must be a non-negative integer, got {maxsize!r}")
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[Hashable, EncodedQuery] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> EncodedQuery | None:
        """A copy of the cached query (callers may reweigh it), or None."""
        with self._lock:
            q = self._data.get(key)
            if q is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
        return replace(q)

    def put(self, key: Hashable, query: EncodedQuery) -> None:
        if self.maxsize == 0:
            return
        with self._lock:
            self._data[key] = replace(query)
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


__all__ = ["DEFAULT_QUERY_CACHE_SIZE", "QueryCache"]
