"""The Retriever's public faces (issue 49, item 2): ``with_fusion`` checks a fusion exactly as
the constructor does and searches as a Retriever made with that fusion, sharing the loaded
index and models; and no code outside the retriever reaches into the private attributes of a
Retriever or of the pieces it is a facade over (benchmarks, the server and the CLIs use
``search_channel``, ``student_encoder``, ``student_head``, ``with_fusion`` ... instead).
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from conftest import retriever_over

from retriever.channel_search import ChannelSearch
from retriever.explain import HitExplainer
from retriever.feedback import Feedback, FeedbackExpander
from retriever.filters import MetadataFilters
from retriever.fusion import Fusion
from retriever.hybrid import HybridSearch
from retriever.query_encoding import QueryEncoding
from retriever.retriever import DEFAULT_FUSION_WITH_ENCODER, Retriever

# the Retriever and the pieces it is a facade over: none of their privates is used outside them
FACADE = (Retriever, QueryEncoding, ChannelSearch, HybridSearch, FeedbackExpander, HitExplainer, MetadataFilters, Fusion)

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ["cat and dog near the river", "computer memory", "a puzzle for the team", "snow"]
FUSION = {"method": "rrf", "weights": {"sparse": 0.3, "bm25": 0.5, "encoder": 0.2}, "rrf_k": 20}


def ranked(r: Retriever, k: int = 10) -> list[list[tuple]]:
    return [[(h.doc_id, h.score, h.channels, h.matched_tokens) for h in hits] for hits in r.batch_search(QUERIES, k=k, mode="hybrid")]


def message(make) -> str:
    with pytest.raises(ValueError) as caught:
        make()
    return str(caught.value)


# ====================================================================== with_fusion
def test_with_fusion_searches_as_a_retriever_made_with_that_fusion(encoder_index, tiny_embedder):
    pytest.importorskip("sentence_transformers")
    path, encoder = encoder_index
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", feedback=Feedback(docs=2, tokens=8, weight=0.5))
    before = ranked(r)
    view = r.with_fusion(dict(FUSION))
    made = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", feedback=Feedback(docs=2, tokens=8, weight=0.5), fusion=dict(FUSION))
    assert view.fusion == made.fusion == FUSION
    assert ranked(view) == ranked(made) != before
    # the original keeps its fusion, and its results
    assert r.fusion == DEFAULT_FUSION_WITH_ENCODER and ranked(r) == before
    # nothing reloaded or copied: the same channels, backend, models, caches
    for name in ("doc_ids", "sparse", "dense", "lexical", "encoder_index", "engine", "embedder", "encoder", "query_cache", "generation", "token_idf"):
        assert getattr(view, name) is getattr(r, name), name
    # what either builds on first use is built once, for both
    assert view.document_tokens is r.document_tokens and view.explainer is r.explainer and view.metadata is r.metadata
    # None: the constructor's default for this index
    assert r.with_fusion(None).fusion == retriever_over(path, tiny_embedder, encoder, query_encoder="llm").fusion == DEFAULT_FUSION_WITH_ENCODER
    # a view holds no generation of its own: closing it leaves the original's
    view.close()
    assert r.generation.fd is not None
    r.close()


@pytest.mark.parametrize(
    ("fusion", "expected"),
    [
        ({"method": "minmax", "weights": {"bm25": -1}}, "weights.bm25"),  # a bad weight
        ({"method": "minmax", "weights": {"bm25": float("nan")}}, "weights.bm25"),
        ({"method": "minmax", "weights": {"telepathy": 1}}, "weights.telepathy': unknown channel"),  # an unknown channel
        ({"method": "borda", "weights": {"bm25": 1}}, "'method'"),
        ({"weights": {"bm25": 1}, "rrf": 60}, "unknown key"),
        ([("bm25", 1)], "expected a dict"),
    ],
)
def test_with_fusion_refuses_what_the_constructor_refuses_with_its_message(encoder_index, tiny_embedder, fusion, expected):
    pytest.importorskip("sentence_transformers")
    path, encoder = encoder_index
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm")
    refused = message(lambda: r.with_fusion(fusion))
    assert expected in refused
    assert refused == message(lambda: retriever_over(path, tiny_embedder, encoder, query_encoder="llm", fusion=fusion))
    assert r.fusion == DEFAULT_FUSION_WITH_ENCODER


def test_with_fusion_makes_the_constructors_query_side_checks(encoder_index, tiny_embedder):
    """A model-free query has no embedding: a fusion that weighs the dense channel is refused,
    by the view as by the constructor; feedback with a fusion made inside Milvus too."""
    pytest.importorskip("sentence_transformers")
    path, encoder = encoder_index
    weighs_dense = {"method": "minmax", "weights": {"bm25": 0.5, "dense": 0.5}}
    free = retriever_over(path, tiny_embedder, encoder, query_encoder="none", fusion={"method": "minmax", "weights": {"bm25": 1.0}})
    refused = message(lambda: free.with_fusion(weighs_dense))
    assert "gives the dense channel no query" in refused
    assert refused == message(lambda: retriever_over(path, tiny_embedder, encoder, query_encoder="none", fusion=weighs_dense))
    milvus = {"method": "milvus-weighted", "weights": {"sparse": 0.5, "bm25": 0.5}}
    fed = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", feedback=Feedback())
    refused = message(lambda: fed.with_fusion(milvus))
    assert "fuses inside Milvus" in refused
    assert refused == message(lambda: retriever_over(path, tiny_embedder, encoder, query_encoder="llm", feedback=Feedback(), fusion=milvus))


# ====================================================================== no private reach-ins
# Where code outside retriever/retriever.py must not touch a Retriever's privates. The server and
# CLIs and the benchmarks are the brief of issue 49; indexer/ and training/ are held to it as well.
SCANNED = ["benchmarks", "experiments", "retriever/server", "retriever/cli*.py", "indexer", "training"]


def retriever_private_names() -> set[str]:
    """Every private name a Retriever or one of its pieces (:data:`FACADE`) has: the ``_x``
    defined on the class (methods, properties, class attributes: ``vars(cls)``, its bases'
    included, ``object`` aside) and every ``self._x`` the class's source sets or reads (what
    ``__init__`` sets, and what is set later, on first use). Dunder names (``__init__``) are
    public protocol, not private."""
    names = set()
    for facade in FACADE:
        names |= {n for cls in facade.__mro__[:-1] if cls.__module__.startswith("retriever.") for n in vars(cls)}
        for node in ast.walk(ast.parse(inspect.getsource(facade))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "other", "cls"):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))}


def private_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each use of one of ``names`` as an attribute, ``x._name`` (read, written,
    called, on any expression: ``r._search_one``, ``self.retriever._holds_generation``, ``f()._masks``), or as
    getattr/setattr/hasattr/delattr's constant name, except on ``self`` or ``cls``.

    Read from the syntax tree, not the text: a comment or docstring that names a private (as this
    one does) is no use, and a use spread over lines is still seen. ``self._x``/``cls._x`` are
    left out because there they are the scanned class's own attributes (a benchmark class may
    well have its own ``_lock``); the one thing this misses is a subclass of Retriever outside
    retriever.py using its privates through ``self``, which nothing does."""
    def own(receiver: ast.expr) -> bool:
        return isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names and not own(node.value):
            found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names and not own(node.args[0])):
            found.append((node.lineno, node.args[1].value))
    return sorted(found)


def scanned_files() -> list[Path]:
    files = set()
    for pattern in SCANNED:
        for p in ROOT.glob(pattern):
            files.update([p] if p.is_file() else p.rglob("*.py"))
    return sorted(p for p in files if "results" not in p.relative_to(ROOT).parts)  # benchmark outputs, not code


def test_the_scan_knows_the_retrievers_privates_and_finds_a_use():
    """The scan below is only as good as its name list and its detector: both checked here, so
    that it cannot pass by finding nothing to look for."""
    names = retriever_private_names()
    # methods and attributes set in __init__, the Retriever's and its pieces', and one set on first use
    assert {"_check_mode", "_search_one", "_holds_generation", "_encode_uncached", "_masks", "_analysed", "_student_head"} <= names
    assert not any(n.startswith("__") and n.endswith("__") for n in names)
    planted = "r = Retriever.load(p)\n# r._search_one in a comment\nr._search_one(q, 'sparse', 10)\nx = getattr(r.queries, '_encode_uncached')\nself._search_one = 1\n"
    assert private_uses(planted, names) == [(3, "_search_one"), (4, "_encode_uncached")]
    scanned = {str(p.relative_to(ROOT)) for p in scanned_files()}
    assert {"benchmarks/systems/engine.py", "experiments/query_stages.py", "retriever/server/app.py", "retriever/cli.py"} <= scanned


def test_no_code_outside_the_retriever_touches_its_privates():
    names = retriever_private_names()
    uses = [f"{p.relative_to(ROOT)}:{line}: .{name}" for p in scanned_files() for line, name in private_uses(p.read_text(encoding="utf-8"), names)]
    assert not uses, "private attributes of Retriever or its pieces used outside them (give them a public face):\n" + "\n".join(uses)
