"""Compact indexes: 8-bit impacts and scalar-quantised dense vectors (issue 53, item 2).

A compact index holds the same channels as a plain one, smaller:

- aligned-token postings (and BM25's): each float32 weight becomes a uint8 code with an affine
  map per posting list, weight = offset[t] + scale[t] * code (``postings_scale.npy`` and
  ``postings_offset.npy`` beside the codes; the error is at most scale[t] / 2, half a step of
  the list's [min, max] in 255 steps). The kernels (indexer/kernels.py, ``*_u8``) tabulate
  q_weight * level once per query token, so a search reads a quarter of the weight bytes and
  scores exactly as the float32 kernels on the dequantised weights would;
- dense channels (LLM dense, EmbedFilter, the sentence encoders): FAISS scalar quantisers
  (``SQ8``: one byte per dimension, trained per-dimension ranges; ``SQ6`` for mpnet's encoder2,
  :data:`COMPACT_DENSE_KINDS`; ``SQfp16``: two bytes), which give their vectors back
  (``reconstruct_n``), so updates work as on Flat.

A copy can spread the aligned-token weights over fewer of the 256 codes (``impact_levels``; 16: the precision
of 4-bit impacts, each code still a byte), recorded as the record's ``"levels"`` so that an update
quantises as the copy did (benchmarks/results/compact-index/README.md: ``fast`` within 0.0009 at 16, ``best``
up to -0.0039; not a build default).

The manifest records ``"impacts": "uint8"`` (and ``"quantisation"``) in ``sparse`` and
``lexical``, each dense channel's FAISS kind in its record, and the format version
(:data:`indexer.manifest.COMPACT_FORMAT_VERSION` and on), which older readers refuse rather than
misread. Plain indexes are unchanged (format 1, or 2 with segments). Two ways to get one:
``build_index(..., compact=True)`` (``build-index``'s default), or :func:`compact_copy` of a
built index (no model runs: the float32 weights and vectors are read back and quantised; it can
leave channels out and give each dense channel its own kind).
The measured quality and size: experiments/compact_index.py.

The doc numbers of a compact index's postings are stored one of three ways (``doc_ids``;
``build-index --doc-ids``, by default its ``--profile``'s: bit-packed for ``fast``, range-blocked
for ``best`` and ``both``, indexer/build_profiles.py; :data:`DEFAULT_DOC_IDS` in Python):

- int32 (format 3, :data:`indexer.manifest.COMPACT_FORMAT_VERSION`): ``postings_docs.npy``;
- bit-packed (format 7, :data:`indexer.manifest.STREAM_FORMAT_VERSION`): delta-coded in blocks of 128
  laid end to end on bit boundaries, each list's first doc number in the stream (indexer/packed_docs.py:
  ``postings_blockskip``, ``postings_blockwidth``, ``postings_packed``; lossless, the kernels decode a
  block at a time); the records say ``"doc_ids": "bitstream-128"``. Format 4
  (:data:`indexer.manifest.PACKED_FORMAT_VERSION`, ``"bitpacked-128"``) is its first layout, each block
  on a word with its first doc number in ``postings_blockfirst``: read, and written again only by an
  update of such an index;
- range-blocked (format 5, :data:`indexer.manifest.RANGE_FORMAT_VERSION`): 16-bit offsets
  within ranges of 65,536 documents (indexer/range_docs.py: ``postings_rangestart`` and
  ``postings_low``; lossless, 2 bytes a doc number, searched range by range, 1.4x faster than format 3
  on a million synthetic documents); the records say ``"doc_ids": "range16-65536"``.

The aligned-token impacts can be 4-bit instead (``impact_bits=4``, ``build-index --impact-bits 4``, the
default of ``build-index --profile fast``;
format 6, :data:`indexer.manifest.NIBBLE_FORMAT_VERSION`, with any of the three doc-number layouts):
16 levels per list, two codes a byte (``postings_weights.npy`` holds half as many bytes as postings,
rounded up), the record says ``"impacts": "uint4"``; BM25's stay 8-bit. They are quantised and their
doc numbers encoded as for 8 bits, then packed (:func:`compact_channel_files`).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from indexer.channels import CHANNEL_SPECS, ChannelSpec, by_manifest_key
from indexer.channels import spec as channel_spec
from indexer.codec import INT32, DocLayout, PostingsCodec, doc_layout, layout_options
from indexer.codec import compact_format as codec_format
from indexer.dense import DenseIndex
from indexer.generations import build_lock, publish_staged, stage
from indexer.generations import sweep as sweep_generations
from indexer.integrity import record_files
from indexer.inverted_index import IMPACT_LEVELS, InvertedIndex, check_levels
from indexer.lexical import LEXICAL_DIR
from indexer.manifest import (
    BITSTREAM_DOC_IDS,
    MANIFEST,
    RANGE_DOC_IDS,
    UINT4_IMPACTS,
    UINT8_IMPACTS,
    Manifest,
)
from indexer.reader import open_index, verify_generation
from indexer.staging import staging_dir

# The dense kind of a compact index where none other is asked for, and build-index's default
# (--no-compact builds the float32 reference): experiments/compact_index.py on adi, medline,
# cisi and cranfield (npl not measured: its 11k documents take hours to encode on 2 cores), per-list
# impacts + SQ8: nDCG@10 of every channel within 0.0008 of float32, of both profiles' hybrids within
# 0.0021 (medline, best), 8.5 -> 3.9 KB per document for postings and vectors
# (benchmarks/results/compact-index/compact-index.json). SQfp16 was no closer on the hybrids
# (the same -0.0021) for ~950 more bytes per document; one global scale instead of one per list
# lost up to 0.0016 on BM25 (cranfield) where per-list lost at most 0.0008.
COMPACT_DENSE_KIND = "SQ8"
# Channels a compact build quantises further (issue 53's size goal; the rows' compact_kind, indexer/channels.py): mpnet's 768 dimensions at 6 bits
# (576 bytes a document, 192 fewer than SQ8) kept both profiles' hybrids within 0.0024 of SQ8 on the
# five shared collections, and mpnet's own channel within 0.0016; at 4 bits best lost 0.0041 on
# cranfield. MiniLM stays SQ8: at 6 bits its own channel lost 0.0079 on adi (at 4 bits fast lost
# 0.0038 there) for 96 bytes (benchmarks/results/compact-index/compact-index-default-*.json).
COMPACT_DENSE_KINDS: dict[str, str] = {s.mode: s.compact_kind for s in CHANNEL_SPECS if s.compact_kind is not None}  # each row's compact_kind
DEFAULT_COMPACT = True  # build-index's default; build_index()'s stays False (the exact float32 reference)
PER_LIST, GLOBAL = "per-list", "global"
QUANTISATIONS = (PER_LIST, GLOBAL)
# the dense channels (FAISS files, the channel table's query_kind "dense"): (manifest key, file name)
_DENSE_CHANNELS = tuple((s.manifest_key, s.name) for s in CHANNEL_SPECS if s.query_kind == "dense")
_MODES = {s.manifest_key: s.mode for s in CHANNEL_SPECS}


IMPACT_BITS = {8: UINT8_IMPACTS, 4: UINT4_IMPACTS}  # build-index --impact-bits: the manifest's "impacts"
DEFAULT_IMPACT_BITS = 8


def full_levels(bits: int) -> int:
    """The codes ``bits``-bit impacts hold: 256 or 16."""
    if bits not in IMPACT_BITS:
        raise ValueError(f"impact bits must be one of {sorted(IMPACT_BITS)}, not {bits!r}")
    return 1 << bits


def record_bits(record: dict) -> int:
    """The bits of the impacts a channel's manifest record names (4 for ``uint4``, else 8)."""
    return 4 if record.get("impacts") == UINT4_IMPACTS else 8


def record_levels(record: dict) -> int:
    """The impact levels a channel's manifest record says its codes use (all its bits hold unless it names fewer)."""
    return int(record.get("levels", full_levels(record_bits(record))))


def impacts_record(quantisation: str = PER_LIST, levels: int | None = None, bits: int = DEFAULT_IMPACT_BITS) -> dict:
    """What the manifest's ``sparse`` / ``lexical`` gain in a compact index: ``bits``-bit impacts
    (``levels`` recorded where fewer codes than the bits hold are used, so that an update
    quantises as the build did)."""
    if quantisation not in QUANTISATIONS:
        raise ValueError(f"quantisation must be one of {QUANTISATIONS}, not {quantisation!r}")
    most = full_levels(bits)
    levels = check_levels(most if levels is None else levels)
    if levels > most:
        raise ValueError(f"{bits}-bit impacts hold at most {most} levels, not {levels}")
    return {"impacts": IMPACT_BITS[bits], "quantisation": quantisation, **({"levels": levels} if levels != most else {})}


def quantise_channel_files(directory: Path, quantisation: str = PER_LIST, levels: int = IMPACT_LEVELS) -> None:
    """Saved float32 postings (``postings_*.npy`` in ``directory``) turned into 8-bit impacts
    spread over ``levels`` codes."""
    impacts_record(quantisation, levels)
    InvertedIndex.quantise_saved(Path(directory), per_list=quantisation == PER_LIST, levels=levels)


def compact_channel_files(directory: Path, n_docs: int, quantisation: str = PER_LIST, doc_ids: str | None = None,
                          bits: int = DEFAULT_IMPACT_BITS, levels: int | None = None) -> dict:
    """Saved float32 postings in ``directory`` made compact in place, in this order: quantised
    (``levels`` codes, by default all that ``bits`` hold), their doc numbers encoded in the layout
    ``doc_ids`` names (None: int32; any name indexer/codec.py's ``doc_layout`` takes), and, for
    4-bit impacts, the codes packed two a byte (last: the doc-number encoders read one code a
    posting). Returns what the channel's manifest record gains (with the codec's
    ``doc_layout`` and ``impact_bits``)."""
    record = impacts_record(quantisation, levels, bits)
    quantise_channel_files(directory, quantisation, record_levels(record))
    record |= encode_doc_ids(directory, doc_ids, n_docs)
    if bits == 4:
        InvertedIndex.nibble_saved(Path(directory))
    return record | {"impact_bits": bits}


def compact_as_recorded(directory: Path, n_docs: int, record: dict) -> None:
    """Saved float32 postings in ``directory`` made compact as the channel's manifest ``record``
    says (its impacts' bits, levels and quantisation, its doc numbers' layout): what an update
    writes again after reading the kept weights back dequantised. A record without impacts: left as they are."""
    codec = PostingsCodec.of_record(record)
    if codec.quantised:
        compact_channel_files(directory, n_docs, record.get("quantisation", PER_LIST), codec.doc_layout.name, codec.impact_bits,
                              record_levels(record))


def pack_channel_files(directory: Path, doc_ids: str = BITSTREAM_DOC_IDS) -> dict:
    """Saved postings' doc numbers (``postings_docs.npy`` in ``directory``, 8-bit impacts already)
    bit-packed in place, as ``doc_ids`` names the layout (the stream of format 7, or the blocks of
    format 4, which an update of such an index writes again); returns what the channel's manifest
    record gains."""
    return encode_doc_ids(directory, doc_ids, 0)


def range_channel_files(directory: Path, n_docs: int) -> dict:
    """Saved postings' doc numbers (8-bit impacts already) range-blocked in place
    (indexer/range_docs.py); returns what the channel's manifest record gains."""
    return encode_doc_ids(directory, RANGE_DOC_IDS, n_docs)


# build-index --doc-ids: each buildable layout of the codec (indexer/codec.py) by its option names,
# as the value build_index(doc_ids=...) takes: the "doc_ids" of formats 4-7 where the layout has one
# (so "bitpacked" and "stream" both write the stream layout, format 7), None for int32, else its name;
# format 4's blocks are read, and written again only where an update extends an index that has them
DOC_ID_ENCODINGS = {opt: None if layout.name == INT32 else layout.doc_ids or layout.name for opt, layout in layout_options().items()}
# a compact build's default where no layout is named (build_index, compact_copy; build-index takes
# its --profile's, indexer/build_profiles.py): format 5 scans faster than format 3 (1.4x on a million
# documents) in 3 bytes a posting instead of 5, ranking bit for bit as format 3; format 4 is smaller
# still (~2.1 bytes) but decodes at twice format 3's cost a posting (docs/backends-and-scale.md)
DEFAULT_DOC_IDS = "range16"


def doc_id_encoding(name: str | None, compact: bool) -> str | None:
    """The manifest's ``doc_ids`` for ``--doc-ids NAME`` (None: the default, :data:`DEFAULT_DOC_IDS`
    for a compact build; a plain build encodes none)."""
    return DOC_ID_ENCODINGS[name or (DEFAULT_DOC_IDS if compact else "int32")]


def _layout(doc_ids: str | None) -> DocLayout:
    """The codec's layout of a ``doc_ids`` value (None: int32), or ValueError."""
    return doc_layout(INT32 if doc_ids is None else doc_ids)


def compact_format(doc_ids: str | None, bits: int = DEFAULT_IMPACT_BITS) -> int:
    """The format of a compact index whose doc numbers are stored as ``doc_ids`` names them (None:
    int32) and whose aligned-token impacts take ``bits`` bits (4: format 6, whatever the doc numbers
    but the stream, which is format 7 with either width; a layout formats 3-7 did not know: the codec's)."""
    try:
        layout = _layout(doc_ids)
    except ValueError:
        raise ValueError(f"doc_ids must be one of {sorted(n for n in DOC_ID_ENCODINGS.values() if n)} or None (int32), not {doc_ids!r}") from None
    full_levels(bits)
    return codec_format(layout, bits)


def encode_doc_ids(directory: Path, doc_ids: str | None, n_docs: int) -> dict:
    """Saved postings' doc numbers in the layout a manifest record names (``None``: int32, left as
    they are); returns what the record gains: its ``doc_layout`` (and its ``doc_ids`` of formats 4-7)."""
    layout = _layout(doc_ids)
    layout.encode_saved(Path(directory), n_docs)
    return ({"doc_ids": layout.doc_ids} if layout.doc_ids else {}) | {"doc_layout": layout.name}


def truncate_channel_files(directory: Path, n_docs: int, top_k: int) -> None:
    """Keep each document's ``top_k`` largest weights of the saved float32 aligned-token postings
    in ``directory``, rewritten in place. The weights are the LM head's logits and a build keeps
    each document's top-K of them, so the result is what a build with ``top_k`` writes (up to
    ties at the K-th logit), without running the model. Memory: the postings, twice."""
    directory = Path(directory)
    index = InvertedIndex.load(directory, n_docs, mmap=False)
    by_doc = index.doc_vectors()  # documents x tokens
    per_doc = np.diff(by_doc.indptr)
    if per_doc.size and per_doc.min() < top_k:
        raise ValueError(f"{directory}: top_k {top_k}: a document holds only {int(per_doc.min())} aligned tokens")
    tokens = np.empty((n_docs, top_k), np.int64)
    weights = np.empty((n_docs, top_k), np.float32)
    if per_doc.size and per_doc.min() == per_doc.max():  # every document holds the build's K: one vectorised pass
        row_tokens, row_weights = by_doc.indices.reshape(n_docs, -1), by_doc.data.reshape(n_docs, -1)
        keep = np.argpartition(-row_weights, top_k - 1, axis=1)[:, :top_k]
        tokens[:], weights[:] = np.take_along_axis(row_tokens, keep, 1), np.take_along_axis(row_weights, keep, 1)
    else:
        for d in range(n_docs):
            row = slice(by_doc.indptr[d], by_doc.indptr[d + 1])
            keep = np.argpartition(-by_doc.data[row], top_k - 1)[:top_k]
            tokens[d], weights[d] = by_doc.indices[row][keep], by_doc.data[row][keep]
    InvertedIndex.from_forward(tokens, weights, index.vocab_size).save(directory)


def dense_kinds(dense_kind: str | Mapping[str, str] | None = None) -> dict[str, str]:
    """{dense channel's mode: FAISS kind}: one kind for all of them, or {channel (any of its
    names): kind} with the others as a compact build writes them (None: all of them so);
    ValueError naming a channel that is not a dense one."""
    modes = [_MODES[f] for f, _ in _DENSE_CHANNELS]
    if isinstance(dense_kind, str):
        return dict.fromkeys(modes, dense_kind)
    out = {mode: compact_dense_kind("Flat", True, mode) for mode in modes}
    for name, kind in (dense_kind or {}).items():
        s = _row(name)
        if s.query_kind != "dense":
            raise ValueError(f"dense kind for {name!r}: not a dense channel (dense channels: {', '.join(modes)})")
        out[s.mode] = kind
    return out


def dropped_channels(drop: Iterable[str]) -> tuple[ChannelSpec, ...]:
    """The channel table's rows named in ``drop`` (any of their names); ValueError for the
    aligned-token channel, which every index holds."""
    rows = tuple(dict.fromkeys(_row(name) for name in ([drop] if isinstance(drop, str) else drop)))
    if any(s.required for s in rows):
        raise ValueError("the aligned-token channel (sparse) cannot be dropped: every index holds it")
    return rows


def _row(name: str) -> ChannelSpec:
    try:
        return channel_spec(name)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def _matches(root: Path, pattern: str) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()}


def compact_dense_kind(kind: str, compact: bool, mode: str | None = None) -> str:
    """The dense kind a build writes for the dense channel ``mode``: a compact build turns the
    default Flat into that channel's :data:`COMPACT_DENSE_KINDS` entry, else
    :data:`COMPACT_DENSE_KIND`; any other kind asked for is kept."""
    if not compact or kind != "Flat":
        return kind
    return COMPACT_DENSE_KINDS.get(mode, COMPACT_DENSE_KIND) if mode is not None else COMPACT_DENSE_KIND


def compact_copy(
    index_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], dense_kind: str | Mapping[str, str] | None = None,
    quantisation: str = PER_LIST, lexical: bool = True, overwrite: bool = False, pack_doc_ids: bool = False, top_k: int | None = None,
    range_doc_ids: bool = False, drop: Iterable[str] = (), impact_levels: int | None = None, impact_bits: int = DEFAULT_IMPACT_BITS,
    doc_layout: str | None = None,
) -> Manifest:
    """Write a compact copy of the plain index at ``index_dir`` to ``out_dir`` (published as a
    generation, as a build publishes) and return its manifest. No model runs: the postings'
    float32 weights are quantised (``quantisation``: per posting list, or one global map), BM25's
    too unless ``lexical`` is False, and every dense channel's vectors are read back and
    re-indexed as ``dense_kind`` (a FAISS factory string: ``SQ8``, ``SQfp16``, ``SQ4``, or ``Flat`` to
    keep them exact; or {channel: kind}; None, and the channels not named: as a compact build
    writes them, :func:`compact_dense_kind`).
    Everything else (documents, ids, projections) is copied as it is, but the channels named in
    ``drop`` (by any of their names; not the aligned tokens), which the copy leaves out.
    ``pack_doc_ids``: the postings' doc numbers bit-packed too (format 7; BM25's where it is quantised);
    ``range_doc_ids``: range-blocked instead (format 5); ``doc_layout``: any layout of the codec by name
    (indexer/codec.py; what the two flags say, more clearly).
    ``top_k``: keep only each document's ``top_k`` aligned tokens, fewer than the index holds
    (:func:`truncate_channel_files`: what a build with that top_k writes).
    ``impact_bits``: 4 stores the aligned-token impacts as 4-bit codes, two a byte (format 6; BM25's
    stay 8-bit); ``impact_levels``: they are spread over fewer codes than their bits hold (16 of 256:
    the precision of 4-bit impacts, one byte each)."""
    impacts_record(quantisation, impact_levels, impact_bits)  # checked before anything is written
    kinds = dense_kinds(dense_kind)
    dropped = dropped_channels(drop)
    if pack_doc_ids + range_doc_ids + (doc_layout is not None) > 1:
        raise ValueError("doc numbers are either bit-packed (format 7) or range-blocked (format 5), not both")
    doc_ids = BITSTREAM_DOC_IDS if pack_doc_ids else RANGE_DOC_IDS if range_doc_ids else doc_layout
    version = compact_format(doc_ids, impact_bits)
    target = Path(out_dir)
    opened = open_index(index_dir)
    try:
        m = opened.manifest
        if m.compact:
            raise ValueError(f"{index_dir}: already compact (format {m.format_version})")
        verify_generation(index_dir, opened, "no copy was written")  # a damaged file is never carried into a copy under fresh checksums
        sparse, lexical_record = m.record("sparse"), m.record("bm25")
        if sparse is None:  # an index without the aligned tokens: BM25's postings and the dense channels are compacted
            if top_k is not None:
                raise ValueError(f"{index_dir}: top_k: the index holds no aligned tokens (built without the sparse channel)")
            version = compact_format(doc_ids, DEFAULT_IMPACT_BITS)
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 < top_k < sparse["top_k"]:
                raise ValueError(f"top_k must be an integer from 1 to {sparse['top_k'] - 1} (the index holds {sparse['top_k']} a document), not {top_k!r}")
            if m.segments is not None:
                raise ValueError(f"{index_dir}: top_k: an index of multi-vector documents (segments) cannot be cut down without its model")
        target.parent.mkdir(parents=True, exist_ok=True)
        with build_lock(target):
            if os.path.lexists(target) and not overwrite:
                raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
            sweep_generations(target)
            left_out = {rel for s in dropped for pattern in s.files for rel in _matches(opened.path, pattern)}
            with staging_dir(target, "building") as tmp:
                # the files the manifest records (every file, in an index built before checksums existed): nothing unrecorded is carried
                recorded = set(m.files) if m.files is not None else None
                for src in sorted(opened.path.rglob("*")):
                    rel = src.relative_to(opened.path)
                    if recorded is not None and rel.as_posix() not in recorded:
                        continue
                    if src.is_file() and rel.as_posix() != MANIFEST and rel.as_posix() not in left_out:
                        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(src, tmp / rel)
                if top_k is not None:
                    truncate_channel_files(tmp, m.n_docs, top_k)
                changed: dict = {s.manifest_key: None for s in dropped}  # {manifest key: its new record (None: dropped)}
                if sparse is not None:
                    changed["sparse"] = {**sparse, **compact_channel_files(tmp, m.n_docs, quantisation, doc_ids, impact_bits, impact_levels),
                                         **({"top_k": top_k} if top_k is not None else {})}
                if lexical_record is not None and lexical and "lexical" not in changed:
                    changed["lexical"] = {**lexical_record, **compact_channel_files(tmp / LEXICAL_DIR, m.n_docs, quantisation, doc_ids)}
                written: dict[str, str] = {}  # {dense channel: the kind it was written as}
                for field, name in _DENSE_CHANNELS:
                    info = by_manifest_key(field).record(m)
                    if info is None or field in changed:
                        continue
                    kind = written[_MODES[field]] = kinds[_MODES[field]]
                    channel: DenseIndex = opened.channels[_MODES[field]]
                    vectors = channel.index.reconstruct_n(0, channel.index.ntotal)  # normalised (and projected) already
                    index = DenseIndex.build(vectors, kind, row_doc=channel.row_doc)
                    index.projection = channel.projection
                    index.save(tmp, name)
                    changed[field] = {**info, "kind": kind}
                out = dataclasses.replace(
                    m, format_version=version,
                    build={**m.build, "compacted": {"from": str(index_dir), "generation": opened.path.name,
                                                    "dense_kind": dense_kind if isinstance(dense_kind, str) else written,
                                                    **({"dropped": [s.mode for s in dropped]} if dropped else {}),
                                                    "quantisation": quantisation, "doc_ids": doc_ids or "int32",
                                                    **({"impact_bits": impact_bits} if impact_bits != DEFAULT_IMPACT_BITS else {}),
                                                    **({"impact_levels": impact_levels} if impact_levels is not None else {}),
                                                    **({"top_k": {"from": sparse["top_k"], "to": top_k}} if top_k is not None else {}),
                                                    "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}},
                    files=None, checksum=None, channels=m.channels_with(changed),
                )
                out.files = record_files(tmp)
                out.write(tmp)  # last: a directory without a manifest is not an index
                generation = stage(tmp, target)
            publish_staged(generation, target, overwrite)
    finally:
        opened.close()
    return out


def parse_dense_kind(text: str) -> str | dict[str, str]:
    """``SQ8`` (every dense channel) or ``encoder=SQ8,MODE=SQ4`` (per channel, by mode)."""
    if "=" not in text:
        return text
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 or not pair[0].strip() or not pair[1].strip() for pair in pairs):
        raise ValueError(f"dense kind {text!r}: not KIND or CHANNEL=KIND[,CHANNEL=KIND...]")
    return {name.strip(): kind.strip() for name, kind in pairs}


def main(argv: list[str] | None = None) -> int:
    """``python -m indexer.compact INDEX OUT``: a compact copy of a built plain index (no model runs)."""
    import argparse
    import sys

    from indexer.manifest import IndexFormatError

    p = argparse.ArgumentParser(prog="python -m indexer.compact", description="Write a compact copy (format 3; 4 with --pack-doc-ids, 5 with "
                                "--range-doc-ids, 6 with --impact-bits 4) of a plain index; no model runs.")
    p.add_argument("index", type=Path, help="a plain index (format 1 or 2)")
    p.add_argument("out", type=Path, help="the compact index to write")
    p.add_argument("--dense-kind", default=None, type=parse_dense_kind,
                   help="FAISS kind of every dense channel (SQ8, SQfp16, SQ4, Flat...), or per channel: MODE=KIND,... (encoder=SQ8,...); "
                   "the default, and the channels not named: what a compact build writes")
    p.add_argument("--drop", action="append", default=[], metavar="CHANNEL",
                   help="leave this channel out of the copy (repeatable; e.g. dense, where no profile searches it)")
    p.add_argument("--quantisation", choices=QUANTISATIONS, default=PER_LIST, help="one 8-bit map per posting list (default) or one for all")
    layouts = p.add_mutually_exclusive_group()  # the doc numbers' layout (indexer/codec.py)
    layouts.add_argument("--pack-doc-ids", dest="doc_layout", action="store_const", const="stream",
                         help="doc numbers delta-coded and bit-packed in blocks of 128 (format 7; lossless)")
    layouts.add_argument("--range-doc-ids", dest="doc_layout", action="store_const", const="range16",
                         help="doc numbers as 16-bit offsets within ranges of 65,536 documents (format 5; lossless, scans faster than format 3)")
    p.add_argument("--top-k", type=int, default=None, help="keep each document's TOP_K aligned tokens, fewer than the index holds (default: all)")
    p.add_argument("--impact-bits", type=int, choices=sorted(IMPACT_BITS), default=DEFAULT_IMPACT_BITS,
                   help="bits of each aligned-token impact: 8 (default) or 4, two a byte (format 6; BM25's stay 8)")
    p.add_argument("--impact-levels", type=int, default=None,
                   help="spread each aligned-token posting list's weights over this many codes, fewer than the bits hold (2-256 at 8 bits, "
                   "2-16 at 4; 16 at 8 bits: the precision of 4-bit impacts, a byte each)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    args = p.parse_args(argv)
    try:
        m = compact_copy(args.index, args.out, args.dense_kind, args.quantisation, overwrite=args.overwrite,
                         doc_layout=args.doc_layout, top_k=args.top_k, drop=args.drop, impact_levels=args.impact_levels,
                         impact_bits=args.impact_bits)
    except (IndexFormatError, OSError, ValueError, RuntimeError) as exc:  # FAISS reports a bad kind as a RuntimeError
        print(f"compact: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    before = sum(f.stat().st_size for f in Path(args.index).resolve().rglob("*") if f.is_file())
    after = sum(f.stat().st_size for f in Path(args.out).resolve().rglob("*") if f.is_file())
    print(f"{args.out}: compact copy of {args.index} ({m.n_docs} documents): {before / m.n_docs:.0f} -> {after / m.n_docs:.0f} bytes per document")
    return 0


__all__ = ["COMPACT_DENSE_KIND", "COMPACT_DENSE_KINDS", "DEFAULT_COMPACT", "DEFAULT_DOC_IDS", "DEFAULT_IMPACT_BITS", "DOC_ID_ENCODINGS", "GLOBAL",
           "IMPACT_BITS", "PER_LIST", "QUANTISATIONS", "compact_as_recorded", "compact_channel_files", "compact_copy", "compact_dense_kind", "dense_kinds",
           "doc_id_encoding", "dropped_channels", "full_levels", "impacts_record", "main", "pack_channel_files", "parse_dense_kind",
           "quantise_channel_files", "record_bits", "record_levels", "truncate_channel_files"]


if __name__ == "__main__":
    raise SystemExit(main())
