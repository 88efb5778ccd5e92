"""The query-side options every command that searches takes alike (``search-index``, ``serve``,
``beir-eval``): who encodes the queries, and first-pass feedback."""
from __future__ import annotations

import argparse

from retriever.feedback import feedback_arg
from retriever.profiles import profile_arg
from retriever.pruning import sparse_pruning_arg


def add_query_side_arguments(p: argparse.ArgumentParser) -> None:
    """``--profile``, ``--query-encoder``, ``--feedback`` and ``--sparse-pruning`` (Retriever.load's
    ``profile``, ``query_encoder``, ``feedback`` and ``sparse_pruning``)."""
    p.add_argument(
        "--profile", type=profile_arg, default="auto", metavar="fast|best",
        help="operating point (retriever/profiles.py): fast (no LLM forward per query: BM25 + MiniLM + the query's own "
        "tokens) or best (the LLM encodes the query; its dense channel joins the hybrid). Default: fast where the index "
        "has its channels (build-index's default), else the index searched as it was built",
    )
    p.add_argument(
        "--query-encoder", default=None, metavar="auto|llm|distilled|none|DIR",
        help="what encodes queries for the LLM channels (overrides the profile's): auto (a distilled student kept beside "
        "the index's adapter, else the LLM), llm, distilled, none (no model: the sparse channel searches the query's own "
        "tokens), or a student's directory (distill-query-encoder). Default: the profile's (fast: none, best: llm)",
    )
    p.add_argument(
        "--feedback", type=feedback_arg, default=None, metavar="DOCS,TOKENS,WEIGHT",
        help="hybrid: expand the sparse query from the other channels' top DOCS documents, their TOKENS best aligned tokens "
        "each weighing WEIGHT times its IDF (retriever/feedback.py; e.g. 3,128,0.25; default: no feedback)",
    )
    p.add_argument(
        "--sparse-pruning", type=sparse_pruning_arg, default=None, metavar="KEEP[,DEPTH]",
        help="search the aligned-token channel pruned (retriever/pruning.py): the query's highest-weight tokens covering KEEP "
        "of its weight, the top DEPTH (default 100) rescored exactly; for large indexes (10M synthetic documents: 0.95,100 "
        "found 99.4%% of the exact top 10 in 55%% of the time). Default: exact",
    )
