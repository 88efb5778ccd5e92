"""Search an aligned-token index: ``Retriever.load(index_dir).search(query)``."""
from retriever.retriever import Hit, Retriever
from retriever.settings import SearchSettings

__all__ = ["Hit", "Retriever", "SearchSettings"]
