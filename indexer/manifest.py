"""The index manifest: what an index directory holds and how it was built.

An index records its format version and the exact model (name + weights hash), adapter
and embedding settings; loading checks both, so that queries are never encoded by a
different model than the documents. Every channel's record is its entry in the ``channels``
dict (by its row's manifest key, indexer/channels.py); how manifests written before that map
into it, and the deprecated top-level copies written beside it: LEGACY_CHANNEL_FIELDS.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from embedder.util import write_json_atomic
from indexer.channels import CHANNEL_SPECS, field_problem
from indexer.channels import spec as channel_spec
from indexer.checksums import json_checksum
from indexer.codec import CODEC_FORMAT_VERSION
from indexer.errors import IndexFormatError  # also imported from here (its first home)
from indexer.layout import (  # also imported from here (their first home)
    BITPACKED_DOC_IDS,
    BITSTREAM_DOC_IDS,
    DOC_IDS,
    IMPACTS,
    MANIFEST,
    PACKED_DOC_IDS,
    RANGE_DOC_IDS,
    UINT4_IMPACTS,
    UINT8_IMPACTS,
)
from indexer.regular_files import MAX_MANIFEST_BYTES, read_regular

# The channels whose records were fields of the manifest's top level before its ``channels`` dict
# held every channel's (issue 69). Frozen: a later row is never added here.
# - Reading: a manifest without LEGACY_MARKER (formats 1-8, written before the dict, or rewritten
#   by a release of then, which keeps the fields it knows and drops the marker) has its top-level
#   records mapped into ``channels`` (each one there taking the place of a stale copy in the dict).
# - Writing (DEPRECATED, for one release): every manifest also writes these six top-level fields,
#   copies of their ``channels`` entries (null: not built), so that the previous release's readers
#   (which read only these) read today's indexes; LEGACY_MARKER lists them. Dropping them later:
#   write the marker as [] (``channels`` then stands alone), which readers of this release accept.
LEGACY_CHANNEL_FIELDS = ("sparse", "dense", "embedfilter", "lexical", "encoder", "encoder2")
# The top-level fields a manifest mirrors from ``channels`` (above); its presence says ``channels``
# is the record, each mirror checked to equal its entry. Readers before it ignore it (and drop it when they rewrite).
LEGACY_MARKER = "legacy_fields"

FORMAT_VERSION = 1
# Multi-vector documents (indexer/segments.py) are written as format 2, so that a reader that
# predates them refuses such an index instead of misreading its dense rows as documents;
# single-vector indexes stay format 1, unchanged.
SEGMENTS_FORMAT_VERSION = 2
# Compact indexes (indexer/compact.py: 8-bit impacts, scalar-quantised dense vectors), with or
# without segments, are format 3: a reader that predates them would take the uint8 codes for
# float32 weights, so it must refuse them. Plain indexes keep formats 1 and 2, byte for byte.
COMPACT_FORMAT_VERSION = 3
# Compact indexes whose postings' doc numbers are delta-coded and bit-packed in blocks
# (indexer/packed_docs.py: no postings_docs.npy) are format 4, with or without segments: a reader of
# format 3 would find no doc numbers. Formats 1-3 are read as before.
PACKED_FORMAT_VERSION = 4
# Compact indexes whose doc numbers are 16-bit offsets within ranges of 65,536 documents
# (indexer/range_docs.py: postings_rangestart.npy and postings_low.npy in place of postings_docs.npy)
# are format 5: a reader of formats 3-4 would find neither doc numbers nor packed blocks.
RANGE_FORMAT_VERSION = 5
# Compact indexes whose aligned-token impacts are 4-bit codes, two a byte ("impacts": "uint4"; their
# doc numbers stored any of the three ways, the record's "doc_ids") are format 6: a reader of formats
# 3-5 would take the bytes for one code each, and read past the end of the file.
NIBBLE_FORMAT_VERSION = 6
# Compact indexes whose doc numbers are bit-packed as one stream (indexer/packed_docs.py's stream
# layout: blocks on bit boundaries, each list's first doc number in the stream, "doc_ids":
# "bitstream-128"; 8-bit or 4-bit impacts) are format 7: a reader of formats 4 and 6 would look
# for postings_blockfirst.npy and take the blocks to start on words.
STREAM_FORMAT_VERSION = 7
# Compact indexes with a doc layout that formats 3-7 did not know are format 8 (CODEC_FORMAT_VERSION): their channels'
# records name the postings codec ("doc_layout", "impact_bits"; indexer/codec.py), which readers before it would misread.
COMPACT_VERSIONS = (COMPACT_FORMAT_VERSION, PACKED_FORMAT_VERSION, RANGE_FORMAT_VERSION, NIBBLE_FORMAT_VERSION,
                    STREAM_FORMAT_VERSION, CODEC_FORMAT_VERSION)  # quantised impacts
NIBBLE_VERSIONS = (NIBBLE_FORMAT_VERSION, STREAM_FORMAT_VERSION, CODEC_FORMAT_VERSION)  # the formats whose aligned-token impacts may be 4-bit
READABLE_VERSIONS = (FORMAT_VERSION, SEGMENTS_FORMAT_VERSION, *COMPACT_VERSIONS)
# the doc-number encodings beside int32, and the format each belongs to
_DOC_ID_FORMATS = {BITPACKED_DOC_IDS: PACKED_FORMAT_VERSION, RANGE_DOC_IDS: RANGE_FORMAT_VERSION, BITSTREAM_DOC_IDS: STREAM_FORMAT_VERSION}


@dataclass
class Manifest:
    model: dict  # {"name", "sha256"}
    adapter: dict | None  # {"path", "sha256"} or None for the raw backbone
    embedding: dict  # EmbedderConfig.to_dict()
    n_docs: int
    corpus: dict = field(default_factory=dict)
    # every built channel's record, by its row's manifest key (indexer/channels.py): "sparse" {"top_k",
    # "vocab_size", "weight", ...}, "dense" {"kind", "dim", "normalised", "metric"}, "embedfilter" {"tau",
    # "left", "right", "dim", "kind"}, "lexical" {"analyzer", "k1", "b", "n_terms"}, "encoder" and
    # "encoder2" {"name", "sha256", "dim", "max_seq_length", "kind", ...}, and any later row's; a channel
    # not built has no entry. Read through :meth:`record` (or its row's ``record``).
    channels: dict = field(default_factory=dict)
    # multi-vector documents: {"length", "max_segments", "n_segments", "max_per_doc", ...}; None: one vector per document
    segments: dict | None = None
    # the stored documents (indexer/stored_documents.py): {"file", "n_docs", "metadata_fields", "metadata_types"} (the
    # types since issue 68: each field's kinds of values, which filters check conditions against);
    # None in indexes built before they were stored (those load, but cannot be updated in place)
    documents: dict | None = None
    # how the documents were encoded: {"name": runtime, "dtype", "reason", "capability"} (embedder/hardware.py)
    runtime: dict | None = None
    # the fusion each BM25 + encoder pair earned on this corpus (indexer/calibration_channels.py
    # calibrate_index): {"version", "pairs": {"bm25+encoder": {"fusion", "pseudo_ndcg10", ...}}}; None: not calibrated
    calibration: dict | None = None
    build: dict = field(default_factory=dict)  # timings and throughput
    created: str = ""
    format_version: int = FORMAT_VERSION
    # {relative path: {"size", "xxh3_64"}} of every other file (indexer/integrity.py); None in
    # indexes built before checksums existed, which still load (structure is checked anyway).
    files: dict | None = None
    checksum: str | None = None  # of this manifest's other fields (json_checksum), set by write()

    def __post_init__(self) -> None:
        # the built channels' records in the table's order (a key no row has, from a newer version, last); none empty
        order = {s.manifest_key: i for i, s in enumerate(CHANNEL_SPECS)}
        self.channels = dict(sorted(((k, v) for k, v in (self.channels or {}).items() if v), key=lambda kv: order.get(kv[0], len(order))))

    def record(self, channel: str) -> dict | None:
        """The record of ``channel`` (any of its names: ``bm25``, ``lexical``...); None: not built."""
        return self.channels.get(channel_spec(channel).manifest_key) or None

    def channels_with(self, records: dict[str, dict | None]) -> dict:
        """``channels`` with ``records`` ({manifest key: record}) in place of theirs: a None record removes its channel."""
        out = {**self.channels, **records}
        return {k: v for k, v in out.items() if v}

    def write(self, directory: Path) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "checksum"}
        # DEPRECATED mirror, for the previous release's readers (LEGACY_CHANNEL_FIELDS says why and until when)
        data |= {key: data["channels"].get(key) for key in LEGACY_CHANNEL_FIELDS} | {LEGACY_MARKER: list(LEGACY_CHANNEL_FIELDS)}
        self.checksum = json_checksum(data)
        write_json_atomic(directory / MANIFEST, {**data, "checksum": self.checksum})

    def _postings(self) -> dict | None:
        """The record of the format's postings: the first row with postings that is built (the aligned tokens', else BM25's)."""
        return next((r for s in CHANNEL_SPECS if s.postings is not None and (r := s.record(self)) is not None), None)

    @property
    def compact(self) -> bool:
        """Quantised impacts (format 3 to 7, indexer/compact.py); in an index without the aligned tokens, BM25's
        (and in one without postings at all, its format)."""
        postings = self._postings()
        if postings is None:
            return self.format_version in COMPACT_VERSIONS
        return postings.get("impacts") in IMPACTS

    @property
    def packed(self) -> bool:
        """Bit-packed doc numbers in the aligned-token postings (formats 4 and 7, indexer/packed_docs.py); in an index
        without them, BM25's."""
        return (self._postings() or {}).get("doc_ids") in PACKED_DOC_IDS

    @property
    def ranged(self) -> bool:
        """Range-blocked doc numbers in the aligned-token postings (format 5, indexer/range_docs.py); in an index
        without them, BM25's."""
        return (self._postings() or {}).get("doc_ids") == RANGE_DOC_IDS

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        path = Path(directory) / MANIFEST
        if not os.path.lexists(path):
            raise IndexFormatError(f"{directory}: not an index (no {MANIFEST})")
        try:
            data = json.loads(read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise IndexFormatError(f"{path}: unreadable manifest ({exc})") from None
        except RecursionError:
            raise IndexFormatError(f"{path}: unreadable manifest (JSON nested too deeply)") from None
        if not isinstance(data, dict):
            raise IndexFormatError(f"{path}: not a JSON object")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise IndexFormatError(
                f"{path}: field 'format_version': index format {version!r}, this version reads {', '.join(map(str, READABLE_VERSIONS))}; rebuild the index"
            )
        if version not in COMPACT_VERSIONS and (version == SEGMENTS_FORMAT_VERSION) != isinstance(data.get("segments"), dict):
            raise IndexFormatError(f"{path}: field 'segments': format {version} {'needs' if version == SEGMENTS_FORMAT_VERSION else 'has no'} a segments object")
        mirrored = data.get(LEGACY_MARKER, [])
        if not isinstance(mirrored, list) or not all(isinstance(k, str) for k in mirrored):
            raise IndexFormatError(f"{path}: field {LEGACY_MARKER!r}: not a list of field names")
        # a manifest with the marker: ``channels`` is the record; without: its top-level fields are (LEGACY_CHANNEL_FIELDS)
        current = LEGACY_MARKER in data
        missing = [k for k in ("model", "embedding", "channels" if current else "sparse", "n_docs") if k not in data]
        if missing:
            raise IndexFormatError(f"{path}: missing field(s) {', '.join(missing)}")
        if data.get("channels") is not None and not isinstance(data["channels"], dict):
            raise IndexFormatError(f"{path}: field 'channels': neither an object nor null")
        records = dict(data.get("channels") or {})
        if not current:
            records |= {key: data[key] for key in LEGACY_CHANNEL_FIELDS if key in data}
        problem = _field_problem(data, records) or _impacts_problem(records, version) or _mirror_problem(data, records)
        if problem:
            raise IndexFormatError(f"{path}: {problem}")
        known = set(cls.__dataclass_fields__) - {"channels"}
        return cls(**{k: v for k, v in data.items() if k in known}, channels=records)

    def check_model(self, model_identity: dict, adapter_identity: dict | None) -> None:
        """Refuse an embedder other than the one the index was built with."""
        if model_identity.get("sha256") != self.model.get("sha256"):
            raise IndexFormatError(
                f"index built with model {self.model.get('name')!r} (sha256 {self.model.get('sha256', '')[:12]}), "
                f"asked to use {model_identity.get('name')!r} (sha256 {model_identity.get('sha256', '')[:12]})"
            )
        mine = (self.adapter or {}).get("sha256")
        theirs = (adapter_identity or {}).get("sha256")
        if mine != theirs:
            raise IndexFormatError(
                f"index built with adapter {(self.adapter or {}).get('path', 'none')!r}, "
                f"asked to use {(adapter_identity or {}).get('path', 'none')!r}"
            )

    def check_encoder(self, encoder_identity: dict | None, channel: str = "encoder") -> None:
        """Refuse a sentence-transformers encoder other than the one the index's ``channel``
        (any of its names) was built with (and any encoder for an index without it)."""
        mine = channel_spec(channel).record(self)
        if mine is None:
            if encoder_identity is not None:
                raise IndexFormatError(f"index has no {channel} channel (built without --{channel}), asked to use {encoder_identity.get('name')!r}")
            return
        if encoder_identity is None or encoder_identity.get("sha256") != mine.get("sha256"):
            theirs = encoder_identity or {}
            raise IndexFormatError(
                f"index built with {channel} {mine.get('name')!r} (sha256 {mine.get('sha256', '')[:12]}), "
                f"asked to use {theirs.get('name')!r} (sha256 {theirs.get('sha256', '')[:12]})"
            )


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _mirror_problem(data: dict, records: dict) -> str | None:
    """A top-level field the manifest says mirrors its ``channels`` entry (LEGACY_MARKER) that does not equal it."""
    for key in data.get(LEGACY_MARKER, []):
        if data.get(key) != records.get(key) or key not in data:
            got = repr(data[key]) if key in data else "missing"
            return f"field {key!r}: {got}, not a copy of its record in 'channels' ({LEGACY_MARKER} says it mirrors it)"
    return None


def _field_problem(data: dict, records: dict) -> str | None:
    """The first field whose type or range the loaders cannot work with (hand edits, damage); ``records``:
    the channels' records, as :meth:`Manifest.read` found them."""
    for key in ("model", "embedding"):
        if not isinstance(data[key], dict):
            return f"field {key!r}: not an object"
    for key, value in records.items():
        if value is not None and not isinstance(value, dict):
            return f"field {key!r}: neither an object nor null"
    if all(records.get(s.manifest_key) is None for s in CHANNEL_SPECS):
        return f"no channel: every channel's record ({', '.join(s.manifest_key for s in CHANNEL_SPECS)}) is null"
    for key in ("adapter", "documents", "files", "calibration"):
        value = data.get(key)
        if value is not None and not isinstance(value, dict):
            return f"field {key!r}: neither an object nor null"
    problem = _embedding_problem(data["embedding"])
    if problem:
        return problem
    if not isinstance(data["model"].get("name"), str) or not isinstance(data["model"].get("sha256"), str):
        return "field 'model': needs string 'name' and 'sha256'"
    if not _positive_int(data["n_docs"]):
        return f"field 'n_docs': {data['n_docs']!r} is not a positive integer"
    problem = field_problem(records)  # every channel's own fields (its row's ``fields``)
    if problem:
        return problem
    if data.get("documents") is not None:
        if data["documents"].get("n_docs") != data["n_docs"]:
            return f"field 'documents.n_docs': {data['documents'].get('n_docs')!r} is not n_docs ({data['n_docs']})"
        if not isinstance(data["documents"].get("metadata_fields"), list):
            return f"field 'documents.metadata_fields': {data['documents'].get('metadata_fields')!r} is not a list"
        problem = _metadata_types_problem(data["documents"])
        if problem:
            return problem
    for rel, rec in (data.get("files") or {}).items():
        if not isinstance(rec, dict) or not isinstance(rec.get("size"), int) or ".." in Path(rel).parts or Path(rel).is_absolute():
            return f"field 'files': bad record for {rel!r}"
    return None


def _metadata_types_problem(documents: dict) -> str | None:
    """``documents.metadata_types`` (each metadata field's kinds of values, indexer/stored_documents.py):
    absent in indexes built before it (filters then infer it from the stored documents), else one
    list of known kinds per metadata field."""
    from indexer.stored_documents import KINDS

    types = documents.get("metadata_types")
    if types is None:
        return None
    if not isinstance(types, dict) or sorted(types) != sorted(documents["metadata_fields"]):
        return "field 'documents.metadata_types': not an object of the metadata fields"
    for name, kinds in types.items():
        if not isinstance(kinds, list) or any(k not in KINDS for k in kinds):
            return f"field 'documents.metadata_types.{name}': {kinds!r} is not a list of {', '.join(KINDS)}"
    return None


def _impacts_problem(records: dict, version: int) -> str | None:
    """Formats 3-5 and 8-bit impacts go together: a format-1 manifest naming uint8 impacts (or a
    format-3 one without them) would have its postings read with the wrong element type. Format 4
    and bit-packed doc numbers go together too, and format 5 and range-blocked ones (in the
    aligned-token postings; BM25's may be encoded or not), and only with 8-bit impacts. Format 6
    and 4-bit aligned-token impacts go together, with the doc numbers stored any of the three ways;
    format 7 and stream-packed doc numbers go together, with 8-bit or 4-bit aligned-token impacts.
    BM25's impacts are 8-bit in every format."""
    for key in (s.manifest_key for s in CHANNEL_SPECS if s.postings is not None):
        impacts = (records.get(key) or {}).get("impacts")
        if impacts is not None and impacts not in (IMPACTS if key == "sparse" else (UINT8_IMPACTS,)):
            return f"field '{key}.impacts': {impacts!r} is not {UINT8_IMPACTS!r}" + (f" or {UINT4_IMPACTS!r}" if key == "sparse" else "")
        if key == "sparse" and ((impacts == UINT4_IMPACTS and version not in NIBBLE_VERSIONS)
                                or (version == NIBBLE_FORMAT_VERSION and impacts != UINT4_IMPACTS)):
            return (f"field 'sparse.impacts': 4-bit impacts are format {NIBBLE_FORMAT_VERSION} (or {STREAM_FORMAT_VERSION}), and format "
                    f"{NIBBLE_FORMAT_VERSION} needs them (format {version}, impacts {impacts!r})")
        levels = (records.get(key) or {}).get("levels")
        most = 16 if impacts == UINT4_IMPACTS else 256
        if levels is not None and (not _positive_int(levels) or not 2 <= levels <= most or impacts is None):
            return f"field '{key}.levels': {levels!r} is not a count of impact levels (2 to {most}, with 'impacts')"
        if impacts is not None and version not in COMPACT_VERSIONS:
            return (f"field '{key}.impacts': 8-bit impacts in an index of format {version} "
                    f"(they are format {', '.join(map(str, COMPACT_VERSIONS))})")
        doc_ids = (records.get(key) or {}).get("doc_ids")
        if doc_ids is not None and doc_ids not in _DOC_ID_FORMATS:
            return f"field '{key}.doc_ids': {doc_ids!r} is not one of {sorted(_DOC_ID_FORMATS)}"
        allowed = ((STREAM_FORMAT_VERSION,) if doc_ids == BITSTREAM_DOC_IDS else (_DOC_ID_FORMATS.get(doc_ids), NIBBLE_FORMAT_VERSION)) + (CODEC_FORMAT_VERSION,)
        if doc_ids is not None and version not in allowed:
            what = "bit-packed" if doc_ids in PACKED_DOC_IDS else "range-blocked"
            return f"field '{key}.doc_ids': {what} doc numbers in an index of format {version} (they are format {_DOC_ID_FORMATS[doc_ids]})"
        if doc_ids is not None and impacts is None:
            what = "bit-packed" if doc_ids in PACKED_DOC_IDS else "range-blocked"
            return f"field '{key}.doc_ids': {what} doc numbers without 8-bit impacts ('{key}.impacts')"
    # the format's postings: the aligned tokens', else (an index built without them) BM25's; none: nothing to check
    key = next((s.manifest_key for s in CHANNEL_SPECS if s.postings is not None and records.get(s.manifest_key) is not None), None)
    if key is None:
        return None
    postings = records[key]
    if version in COMPACT_VERSIONS and version not in NIBBLE_VERSIONS and postings.get("impacts") != UINT8_IMPACTS:
        return f"field '{key}.impacts': format {version} needs {UINT8_IMPACTS!r}"
    for doc_ids, fmt in _DOC_ID_FORMATS.items():
        if version == fmt and postings.get("doc_ids") != doc_ids:
            return f"field '{key}.doc_ids': format {fmt} needs {doc_ids!r}"
    return None


# EmbedderConfig's fields as the manifest records them: (type, least value); bool is not an int here
_EMBEDDING_FIELDS = {"max_length": (int, 1), "batch_size": (int, 1), "memory_tokens": (int, 0), "fold_all_caps": (bool, None),
                     "prompt": (str, None), "query_prompt": (str, None), "pooling": (str, None), "attention": (str, None)}


def _embedding_problem(embedding: dict) -> str | None:
    for key, value in embedding.items():
        if key not in _EMBEDDING_FIELDS:
            continue  # unknown settings are refused by EmbedderConfig itself, naming them
        kind, least = _EMBEDDING_FIELDS[key]
        if value is None and key == "query_prompt":
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"field 'embedding.{key}': {value!r} is not {'an integer' if kind is int else 'a ' + kind.__name__}"
        if least is not None and value < least:
            return f"field 'embedding.{key}': {value!r} is less than {least}"
    return None



__all__ = [
    "BITPACKED_DOC_IDS",
    "BITSTREAM_DOC_IDS",
    "COMPACT_FORMAT_VERSION",
    "COMPACT_VERSIONS",
    "DOC_IDS",
    "FORMAT_VERSION",
    "IMPACTS",
    "LEGACY_CHANNEL_FIELDS",
    "LEGACY_MARKER",
    "MANIFEST",
    "NIBBLE_FORMAT_VERSION",
    "PACKED_FORMAT_VERSION",
    "RANGE_DOC_IDS",
    "RANGE_FORMAT_VERSION",
    "READABLE_VERSIONS",
    "SEGMENTS_FORMAT_VERSION",
    "STREAM_FORMAT_VERSION",
    "UINT4_IMPACTS",
    "UINT8_IMPACTS",
    "IndexFormatError",
    "Manifest",
]
