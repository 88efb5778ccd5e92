"""The search contract's argument checks (``Retriever.search``, ``batch_search``, ``search-index``,
the server) and the Retriever's read-through attributes: retriever/retriever.py re-exports them."""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np


class Delegate:
    """A Retriever attribute that is one of its pieces' (``"queries.expansion_m"``), read through."""

    def __init__(self, path: str, doc: str, settable: bool = False) -> None:
        self.owner, _, self.name = path.rpartition(".")
        self.__doc__, self.settable = doc, settable

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(operator.attrgetter(self.owner)(obj), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"{self.name} is read-only")
        setattr(operator.attrgetter(self.owner)(obj), self.name, value)


def check_k(k: object) -> int:
    """``k`` as an int, or ValueError unless it is a positive integer (bools are not)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def check_queries(queries: object) -> list[str]:
    """``queries`` as a list, or TypeError unless it is a sequence of str (a str alone is not:
    it would be searched character by character)."""
    if isinstance(queries, (str, bytes)) or not isinstance(queries, Sequence):
        raise TypeError(f"queries must be a sequence of str, got {type(queries).__name__}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise TypeError(f"queries[{i}] must be a str, got {type(q).__name__}")
    return list(queries)


def utf8_safe(text: str) -> str:
    """``text`` with lone surrogates (a str can hold them: undecodable command-line bytes
    arrive as such) replaced by U+FFFD, which tokenizers cannot encode otherwise."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
