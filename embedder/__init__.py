"""The embedding model: a decoder LLM whose pooled hidden state is both a dense embedding
and, through the model's own LM head, a distribution over "aligned" vocabulary tokens."""
from embedder.encoder import Embedder, EmbedderConfig
from embedder.models import DEFAULT_MODEL, REGISTRY, ModelNotAvailable, resolve_model

__all__ = ["DEFAULT_MODEL", "REGISTRY", "Embedder", "EmbedderConfig", "ModelNotAvailable", "resolve_model"]
