"""The error every index reader raises: :class:`IndexFormatError`.

Its own module, below everything that raises it, so that the manifest and the bounded readers
(indexer/regular_files.py) both import it without importing each other. It is also importable
from :mod:`indexer.manifest`, where it lived first.
"""
from __future__ import annotations


class IndexFormatError(RuntimeError):
    """An index directory that cannot be used as asked (wrong format, other model, a damaged
    file...). The message starts with the file concerned and says what is wrong."""
