"""The table of channels: one :class:`ChannelSpec` row per channel, every name of it said once.

A channel is a way of scoring documents that an index may hold. Each row says, for one channel:

- its names: the search mode (what fusion weights and ``Retriever.search(mode=...)`` use), the
  manifest's key, the file (or folder) its data lives in, the Retriever's attribute, and the
  older spellings that still resolve (:func:`spec` takes any of them);
- what it needs at build time (:data:`BUILD_NEEDS`) and at query time (:data:`QUERY_NEEDS`), and
  how a backend is asked for it (``query_kind``: ``sparse`` = ids and weights, ``dense`` = one vector);
- how ``build_index`` and ``build-index`` turn it on (``option``, ``flag``) and its default setting;
- the manifest fields its loaders rely on (checked by ``Manifest.read``, indexer/manifest.py);
- its writer (the build's, over the committed shards and the corpus' texts: indexer/build.py) and its
  validating reader (what ``Retriever.load`` and ``verify-index`` open it with: indexer/verify.py).

The writers and readers wrap the formats' own code (indexer/inverted_index.py, dense.py,
lexical.py); nothing here defines a format. Build, manifest validation, verify-index, the
``--channels`` parsing (indexer/channel_set.py), fusion's channel names and the backends' read the
table, so a new channel is one row here (and its format's module).

This module sits below the manifest (which reads :func:`field_problem`) and so never imports it:
a reader is given the channel's own manifest record, not the manifest.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.codec import FLOAT32, PostingsCodec
from indexer.dense import DENSE_NAME, EMBEDFILTER_NAME, ENCODER_NAME, DenseIndex
from indexer.errors import IndexFormatError
from indexer.inverted_index import InvertedIndex
from indexer.layout import MANIFEST
from indexer.lexical import LEXICAL_DIR, BM25Builder, BM25Index, make_analyzer

# ------------------------------------------------------------------ what a channel needs
# at build time
LLM_TOKENS = "llm-tokens"  # the top-K aligned tokens of each document's LLM state (always computed: the sparse channel)
LLM_EMBEDDINGS = "llm-embeddings"  # the documents' pooled LLM states, kept in the shards
LM_HEAD = "lm-head"  # the model's LM head (EmbedFilter's projection is computed from it)
TEXT = "text"  # the documents' raw text, read in the build's pass over the corpus that stores them
SENTENCE_ENCODER = "sentence-encoder"  # an external sentence encoder's embeddings, computed in the shards (an array named as the row)
BUILD_NEEDS = (LLM_TOKENS, LLM_EMBEDDINGS, LM_HEAD, TEXT, SENTENCE_ENCODER)
# at query time
LLM_STATE = "llm-state"  # the query's LLM state h (the LLM or a distilled student computes it)
LITERAL_TOKENS = "literal-tokens"  # the query's own tokens in the LLM's vocabulary (no model needed)
ANALYSED_TERMS = "analysed-terms"  # the query's terms through the channel's analyser (BM25)
ENCODER_EMBEDDING = "encoder-embedding"  # the channel's sentence encoder's embedding of the query
QUERY_NEEDS = (LLM_STATE, LITERAL_TOKENS, ANALYSED_TERMS, ENCODER_EMBEDDING)
QUERY_KINDS = ("sparse", "dense")  # how a backend is asked: (ids, weights) or one vector

# manifest field checks: kind -> (test, what the message says the value is not)
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive-int": (lambda x: isinstance(x, int) and not isinstance(x, bool) and x > 0, "a positive integer"),
    "int": (lambda x: isinstance(x, int), "an integer"),
    "str": (lambda x: isinstance(x, str), "a string"),
}


# ------------------------------------------------------------------ writing
@dataclass
class WriteContext:
    """What a channel's writer is handed by the build (indexer/build.py): the index directory
    being written, the build's embedder and settings, the channel's own setting, and the
    committed shards' arrays (``arrays("tokens", "weights")``: a function that streams them, one
    shard at a time). ``quantise(directory)``: a compact build's 8-bit impacts for the postings
    saved there (indexer/compact.py), returning what the channel's record gains; None in a plain
    build. ``row_doc``: multi-vector documents' document of each row (indexer/segments.py)."""

    out: Path
    embedder: Any
    setting: Any
    arrays: Callable[..., Callable[[], Iterator[tuple[np.ndarray, ...]]]]
    top_k: int
    dense_kind: str
    row_doc: np.ndarray | None = None
    quantise: Callable[[Path], dict] | None = None

    def column(self, name: str) -> Callable[[], Iterator[np.ndarray]]:
        """One array of every shard, streamed (``column("embeddings")``)."""
        return lambda: (a for (a,) in self.arrays(name)())


class ChannelWriter:
    """One channel being written. The build feeds every document's text to :meth:`add_text` of
    the channels that need it (:data:`TEXT`), in document order, then calls :meth:`finish`, which
    writes the channel's files under ``ctx.out`` and returns its manifest record."""

    def __init__(self, ctx: WriteContext) -> None:
        self.ctx = ctx

    def add_text(self, text: str) -> None:
        """A document's text (only channels that need :data:`TEXT` are given any)."""

    def finish(self) -> dict:
        raise NotImplementedError


class _SparseWriter(ChannelWriter):
    def finish(self) -> dict:
        ctx = self.ctx
        InvertedIndex.write_from_shards(ctx.arrays("tokens", "weights"), ctx.embedder.vocab_size, ctx.out)
        impacts = ctx.quantise(ctx.out) if ctx.quantise is not None else FLOAT32.record()
        return {"top_k": ctx.top_k, "vocab_size": ctx.embedder.vocab_size, "weight": "logit", **impacts}


class _DenseWriter(ChannelWriter):
    def finish(self) -> dict:
        ctx = self.ctx
        DenseIndex.build_from_chunks(ctx.column("embeddings"), ctx.dense_kind, row_doc=ctx.row_doc).save(ctx.out, DENSE_NAME)
        info = {"kind": ctx.dense_kind, "dim": ctx.embedder.dim, "normalised": True, "metric": "inner_product"}
        if ctx.row_doc is not None:
            info["n_vectors"] = len(ctx.row_doc)
        return info


class _EmbedFilterWriter(ChannelWriter):
    def finish(self) -> dict:
        from embedder.embedfilter import embedfilter_projection

        ctx, tau = self.ctx, self.ctx.setting
        w_u = ctx.embedder.causal_lm.get_output_embeddings().weight.detach().float().cpu().numpy()
        proj, left, right = embedfilter_projection(w_u, tau)
        DenseIndex.build_from_chunks(ctx.column("embeddings"), ctx.dense_kind, projection=proj, row_doc=ctx.row_doc).save(ctx.out, EMBEDFILTER_NAME)
        return {"tau": tau, "left": left, "right": right, "dim": right - left, "kind": ctx.dense_kind, "normalised": True}


def _encoder_writer(name: str) -> Callable[[WriteContext], ChannelWriter]:
    """The writer of a sentence-encoder channel whose shards' array and files are called ``name``."""

    class _EncoderWriter(ChannelWriter):
        def finish(self) -> dict:
            ctx, encoder = self.ctx, self.ctx.setting
            DenseIndex.build_from_chunks(ctx.column(name), ctx.dense_kind).save(ctx.out, name)
            return {**encoder.describe(), "kind": ctx.dense_kind, "normalised": True, "metric": "inner_product"}

    return _EncoderWriter


class _BM25Writer(ChannelWriter):
    def __init__(self, ctx: WriteContext) -> None:
        super().__init__(ctx)
        self.builder = BM25Builder(make_analyzer(ctx.setting, ctx.embedder.tokenizer))

    def add_text(self, text: str) -> None:
        self.builder.add(text)

    def finish(self) -> dict:
        lex = self.builder.finish()
        lex.save(self.ctx.out / LEXICAL_DIR)
        info = {"analyzer": lex.analyzer, "k1": lex.k1, "b": lex.b, "n_terms": len(lex.vocab)}
        info |= self.ctx.quantise(self.ctx.out / LEXICAL_DIR) if self.ctx.quantise is not None else FLOAT32.record()
        return info


# ------------------------------------------------------------------ reading
# A reader opens one channel, checked against its manifest record (its loaders' structural
# checks), or raises IndexFormatError naming the file: reader(index directory, the channel's
# manifest record, the index's n_docs, mmap).
ChannelReader = Callable[[Path, dict, int, bool], Any]


def _read_sparse(d: Path, info: dict, n_docs: int, mmap: bool) -> InvertedIndex:
    return InvertedIndex.load(d, n_docs, mmap=mmap, n_lists=int(info["vocab_size"]), codec=PostingsCodec.of_record(info, d, "sparse"))


def _read_dense(name: str) -> ChannelReader:
    def read(d: Path, info: dict, n_docs: int, mmap: bool) -> DenseIndex:
        return DenseIndex.load(d, name, n_docs, int(info["dim"]))

    return read


ANALYZERS = ("words", "tokens")  # indexer.lexical.make_analyzer's names


def _read_bm25(d: Path, info: dict, n_docs: int, mmap: bool) -> BM25Index:
    if info.get("analyzer") not in ANALYZERS:
        raise IndexFormatError(f"{d / MANIFEST}: field 'lexical.analyzer': {info.get('analyzer')!r} is not one of {ANALYZERS}")
    return BM25Index.load(d / LEXICAL_DIR, n_docs, info.get("n_terms"), info.get("analyzer"),
                          codec=PostingsCodec.of_record(info, d, "lexical"))


def _default_tau() -> int:
    # embedder/__init__ imports torch: not on the manifest's import path
    from embedder.embedfilter import DEFAULT_TAU

    return DEFAULT_TAU


# ------------------------------------------------------------------ the row
@dataclass(frozen=True)
class ChannelSpec:
    """One channel, every name and need of it (see the module docstring)."""

    mode: str  # the search mode and fusion weight key
    manifest_key: str  # its key in the manifest's ``channels`` dict (absent there: not built)
    name: str  # the file stem (or folder) its data is saved under
    attribute: str  # the Retriever's attribute holding the opened channel
    files: tuple[str, ...]  # glob patterns of its files, relative to the index directory
    build_needs: frozenset[str]
    query_needs: frozenset[str]
    query_kind: str  # "sparse" (ids, weights) or "dense" (one vector): how a backend is asked
    writer: Callable[[WriteContext], ChannelWriter]
    reader: ChannelReader
    option: str | None  # the build_index keyword that builds it (None: built unless left out: build_index(sparse=False), --channels)
    flag: str | None  # build-index's flag that builds it (None: see option)
    # its setting when named in --channels without one (the analyser, the encoder's name...); a
    # function is called for it (a default that lives in a module this one should not import)
    default: Any = True
    fields: tuple[tuple[str, str], ...] = ()  # (field of its manifest record, kind in _KINDS)
    postings: str | None = None  # folder (relative) of its postings, 8-bit impacts in a compact index ("": the index's own)
    aliases: tuple[str, ...] = ()  # older spellings that still resolve
    doc: str = ""
    flag_help: str = ""  # build-index's help for ``flag`` (the flag itself is made from the row: :func:`add_flags`)
    flag_choices: tuple[str, ...] | None = None  # the values ``flag`` takes, where they are few
    flag_type: Callable[[str], Any] | None = None  # how ``flag``'s value is read (None: as text)
    # the FAISS kind a compact build (indexer/compact.py) writes this dense channel as, where not
    # the compact default (SQ8)
    compact_kind: str | None = None
    milvus: bool = False  # exported to Milvus (``build-index --export-milvus``): a collection field named :attr:`milvus_field`
    # what ``/info`` says of it, under its manifest key: None nothing, "" its whole record, else that field of the record
    info: str | None = None

    @property
    def required(self) -> bool:
        """Built unless left out by name (the aligned-token channel: ``build_index(sparse=False)``,
        ``build-index --channels`` without it)."""
        return self.option is None

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling :func:`spec` resolves to this row."""
        return tuple(dict.fromkeys((self.mode, self.manifest_key, self.name, self.attribute, *self.aliases)))

    @property
    def milvus_field(self) -> str:
        """Its field in a Milvus collection (retriever/backends/milvus.py, indexer/exports/milvus.py)."""
        return self.mode.replace("-", "_")

    def info_value(self, manifest: Any) -> Any:
        """What ``/info`` says of it (:attr:`info`), from the manifest."""
        record = self.record(manifest)
        return record if not self.info or record is None else record.get(self.info)

    def default_setting(self) -> Any:
        return self.default() if callable(self.default) else self.default

    def record(self, manifest: Any) -> dict | None:
        """The channel's manifest record, its entry in the manifest's ``channels`` dict (indexer/manifest.py;
        None, or empty: not built)."""
        return (manifest.channels or {}).get(self.manifest_key) or None

    def load_encoder(self, manifest: Any, device: str | None = None) -> Any:
        """The sentence encoder this encoder channel's manifest record names, loaded and checked
        against the record (``Manifest.check_encoder``)."""
        from embedder.sentence_encoder import SentenceEncoder

        encoder = SentenceEncoder.load(self.record(manifest)["name"], device=device)
        manifest.check_encoder(encoder.identity, self.manifest_key)
        return encoder

    def open(self, index_dir: Path, manifest: Any, mmap: bool = True) -> Any:
        """The channel opened and checked (:attr:`reader`), or None where the manifest says the
        index was built without it."""
        info = self.record(manifest)
        return None if info is None else self.reader(Path(index_dir), info, manifest.n_docs, mmap)


def _encoder_row(mode: str, name: str, flag: str, default: str, doc: str, flag_help: str, compact_kind: str | None = None) -> ChannelSpec:
    """A sentence-encoder channel: its embeddings in the shards' array ``name`` and in
    ``name.faiss``, its manifest record ``mode`` (the encoder's identity), built by the option
    ``mode``, searched with its own encoder's embedding of the query."""
    return ChannelSpec(
        mode=mode, manifest_key=mode, name=name, attribute=f"{mode}_index", files=(f"{name}.faiss",),
        build_needs=frozenset({SENTENCE_ENCODER}), query_needs=frozenset({ENCODER_EMBEDDING}), query_kind="dense",
        writer=_encoder_writer(name), reader=_read_dense(name), option=mode, flag=flag, default=default,
        fields=(("dim", "positive-int"), ("name", "str"), ("sha256", "str")), doc=doc, flag_help=flag_help, compact_kind=compact_kind,
        info="name",
    )


CHANNEL_SPECS: tuple[ChannelSpec, ...] = (
    ChannelSpec(
        mode="sparse", manifest_key="sparse", name="postings", attribute="sparse", files=("postings_*.npy",),
        build_needs=frozenset({LLM_TOKENS}), query_needs=frozenset({LLM_STATE, LITERAL_TOKENS}), query_kind="sparse",
        writer=_SparseWriter, reader=_read_sparse, option=None, flag=None,
        fields=(("top_k", "positive-int"), ("vocab_size", "positive-int")), postings="", aliases=("aligned",),
        doc="aligned tokens: the top-K tokens of the LM head's reading of each document (Eq. 15-16), a Numba inverted index", milvus=True,
    ),
    ChannelSpec(
        mode="dense", manifest_key="dense", name=DENSE_NAME, attribute="dense", files=(f"{DENSE_NAME}.faiss", f"{DENSE_NAME}_rows.npy"),
        build_needs=frozenset({LLM_EMBEDDINGS}), query_needs=frozenset({LLM_STATE}), query_kind="dense",
        writer=_DenseWriter, reader=_read_dense(DENSE_NAME), option="dense", flag="--dense",
        fields=(("dim", "positive-int"),), doc="cosine over the pooled LLM states (FAISS)", milvus=True,
        flag_help="also store dense embeddings in a FAISS index",
    ),
    ChannelSpec(
        mode="dense-ef", manifest_key="embedfilter", name=EMBEDFILTER_NAME, attribute="dense_ef",
        files=(f"{EMBEDFILTER_NAME}.faiss", f"{EMBEDFILTER_NAME}_projection.npy", f"{EMBEDFILTER_NAME}_rows.npy"),
        build_needs=frozenset({LLM_EMBEDDINGS, LM_HEAD}), query_needs=frozenset({LLM_STATE}), query_kind="dense",
        writer=_EmbedFilterWriter, reader=_read_dense(EMBEDFILTER_NAME), option="embedfilter_tau", flag="--embedfilter TAU",
        default=_default_tau,
        fields=(("dim", "positive-int"),), aliases=("dense_ef",), doc="cosine over EmbedFilter-projected LLM states (embedder/embedfilter.py)",
        flag_help="also store EmbedFilter dense vectors (d // TAU dims)", flag_type=int,
    ),
    ChannelSpec(
        mode="bm25", manifest_key="lexical", name=LEXICAL_DIR, attribute="lexical", files=(f"{LEXICAL_DIR}/*",),
        build_needs=frozenset({TEXT}), query_needs=frozenset({ANALYSED_TERMS}), query_kind="sparse",
        writer=_BM25Writer, reader=_read_bm25, option="lexical", flag="--lexical words", default="words",
        fields=(("n_terms", "int"),), postings=LEXICAL_DIR, doc="BM25 on stemmed words or sub-word tokens, this engine's own inverted index",
        flag_help="also store a BM25 lexical channel (stemmed words or backbone tokens)", flag_choices=ANALYZERS, milvus=True, info="",
    ),
    _encoder_row("encoder", ENCODER_NAME, "--encoder NAME_OR_PATH", "minilm",
                 "cosine over an external sentence-transformers encoder's embeddings (embedder/sentence_encoder.py)",
                 "also store a sentence-transformers encoder's embeddings (mode 'encoder', the fast point's): 'minilm' (the packaged "
                 "all-MiniLM-L6-v2), 'mpnet' (all-mpnet-base-v2 from its five zip-part packages: ~5x MiniLM's cost, better held out), "
                 "a local model directory or a cached hub id"),
    # a second encoder, so that one index serves both operating points (retriever/profiles.py):
    # ``fast`` reads the cheap one above at query time, ``best`` this stronger, costlier one
    # mpnet's 768 dimensions at 6 bits in a compact build (indexer/compact.py says why)
    _encoder_row("encoder2", "encoder2", "--encoder2 NAME_OR_PATH", "mpnet",
                 "cosine over a second sentence encoder's embeddings (default all-mpnet-base-v2: the 'best' operating point's)",
                 "also store a second sentence encoder's embeddings (mode 'encoder2', the best point's; default mpnet), named as --encoder",
                 compact_kind="SQ6"),
)

MODES: tuple[str, ...] = tuple(s.mode for s in CHANNEL_SPECS)  # in table order: the order of --channels, fusion, verify
SPARSE = CHANNEL_SPECS[0]
_BY_NAME: dict[str, ChannelSpec] = {n: s for s in CHANNEL_SPECS for n in s.names}
_BY_KEY: dict[str, ChannelSpec] = {s.manifest_key: s for s in CHANNEL_SPECS}


def spec(name: str) -> ChannelSpec:
    """The row of a channel named any way it is or was spelled (mode ``bm25``, manifest key
    ``lexical``; ``dense-ef``, ``embedfilter``, ``dense_ef``...); KeyError naming the modes otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown channel {name!r} (channels: {', '.join(MODES)})") from None


def by_manifest_key(key: str) -> ChannelSpec:
    return _BY_KEY[key]


def mode_of(name: str) -> str:
    """A channel's search mode from any of its names (``lexical`` -> ``bm25``)."""
    return spec(name).mode


def with_need(need: str) -> tuple[ChannelSpec, ...]:
    """The rows that need ``need`` (one of :data:`BUILD_NEEDS` or :data:`QUERY_NEEDS`)."""
    if need not in BUILD_NEEDS + QUERY_NEEDS:
        raise ValueError(f"unknown need {need!r}")
    return tuple(s for s in CHANNEL_SPECS if need in s.build_needs or need in s.query_needs)


def of_kind(query_kind: str) -> tuple[str, ...]:
    """The modes a backend is asked with ``query_kind`` ("sparse": ids and weights; "dense": a vector)."""
    return tuple(s.mode for s in CHANNEL_SPECS if s.query_kind == query_kind)


def sentence_encoder_specs(modes: Iterable[str] | None = None) -> tuple[ChannelSpec, ...]:
    """The rows of sentence-encoder channels ("encoder", "encoder2"), in table order; with
    ``modes``, those among them. Each keeps its embeddings in the shards' array named as the row
    (:attr:`ChannelSpec.name`), and its query is its own encoder's embedding of the query."""
    rows = tuple(s for s in CHANNEL_SPECS if SENTENCE_ENCODER in s.build_needs)
    return rows if modes is None else tuple(s for s in rows if s.mode in set(modes))


def encoders_by_mode(encoder: Any = None, encoders: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sentence encoders a caller gives, by channel mode: ``encoders`` ({name: model}, any of a
    channel's names) and ``encoder`` (the ``encoder`` channel's, a shorthand); those given alone."""
    given = {spec(name).mode: model for name, model in (encoders or {}).items() if model is not None}
    if encoder is not None:
        given.setdefault(spec("encoder").mode, encoder)
    unknown = [m for m in given if SENTENCE_ENCODER not in spec(m).build_needs]
    if unknown:
        raise ValueError(f"encoders: {', '.join(unknown)} is not a sentence-encoder channel ({', '.join(s.mode for s in sentence_encoder_specs())})")
    return given


def flag_dest(s: ChannelSpec) -> str:
    """The argparse attribute of a row's build-index flag (``--embedfilter TAU`` -> ``embedfilter``)."""
    return s.flag.split()[0].lstrip("-").replace("-", "_")


def add_flags(parser: Any) -> None:
    """build-index's per-channel flags, one per row with a :attr:`~ChannelSpec.flag`: a flag
    without a value (``--dense``) turns its channel on; one with a value sets its setting too."""
    for s in CHANNEL_SPECS:
        if s.flag is None:
            continue
        name, *metavar = s.flag.split()
        if not metavar:
            parser.add_argument(name, action="store_true", help=s.flag_help)
        elif s.flag_choices is not None:
            parser.add_argument(name, choices=list(s.flag_choices), help=s.flag_help)
        else:
            parser.add_argument(name, metavar=metavar[0], type=s.flag_type or str, help=s.flag_help)


def flag_settings(args: Any) -> dict[str, Any]:
    """{mode: setting} of the per-channel flags given on a command line (parsed by :func:`add_flags`)."""
    given = {s.mode: getattr(args, flag_dest(s), None) for s in CHANNEL_SPECS if s.flag is not None}
    return {mode: value for mode, value in given.items() if value not in (None, False)}


def field_problem(records: Mapping[str, Any]) -> str | None:
    """The first channel field of a manifest's channel ``records`` ({manifest key: record}, as parsed)
    that a channel's loaders cannot work with, as ``Manifest.read`` reports it; records that are not
    objects are the manifest's own check (indexer/manifest.py)."""
    for s in CHANNEL_SPECS:
        info = records.get(s.manifest_key)
        if not isinstance(info, dict):  # null, or not an object: the manifest's own check
            continue
        for name, kind in s.fields:
            test, what = _KINDS[kind]
            if not test(info.get(name)):
                return f"field '{s.manifest_key}.{name}': {info.get(name)!r} is not {what}"
    return None


__all__ = [
    "ANALYSED_TERMS",
    "ANALYZERS",
    "BUILD_NEEDS",
    "CHANNEL_SPECS",
    "ENCODER_EMBEDDING",
    "LITERAL_TOKENS",
    "LLM_EMBEDDINGS",
    "LLM_STATE",
    "LLM_TOKENS",
    "LM_HEAD",
    "MODES",
    "QUERY_KINDS",
    "QUERY_NEEDS",
    "SENTENCE_ENCODER",
    "SPARSE",
    "TEXT",
    "ChannelReader",
    "ChannelSpec",
    "ChannelWriter",
    "WriteContext",
    "add_flags",
    "by_manifest_key",
    "encoders_by_mode",
    "field_problem",
    "flag_dest",
    "flag_settings",
    "mode_of",
    "of_kind",
    "sentence_encoder_specs",
    "spec",
    "with_need",
]
