"""Distilling the LLM's query state into a small student (embedder/query_encoder.py): data, recipe, trainer."""
