"""The postings codec: how a channel's posting lists are stored, as two independent choices.

- a **doc layout** (:data:`DOC_LAYOUTS`, the one place layouts are registered): how the doc
  numbers are stored; each is one module (indexer/int32_docs.py, indexer/packed_docs.py,
  indexer/range_docs.py) giving a :class:`indexer.doc_numbers.DocLayout` and its
  :class:`indexer.doc_numbers.DocNumbers`, which the index calls for searches, lookups, exports
  and saves;
- an **impact width** (:data:`IMPACT_WIDTHS`): 32 (float32 weights), 8 (uint8 codes with a
  per-list affine map, indexer/compact.py) or 4 (two codes a byte, :data:`indexer.kernels.NIBBLES`).

A channel's manifest record names both (``"doc_layout"``, ``"impact_bits"``: :meth:`PostingsCodec.record`)
and a reader opens its postings as they say (:meth:`PostingsCodec.of_record`); a record written
before the codec (formats 1-7) names them the old way (``"doc_ids"``: ``bitpacked-128``,
``range16-65536`` or ``bitstream-128``, absent for int32; ``"impacts"``: ``uint8`` or ``uint4``,
absent for float32), which is read the same. The manifest's ``format_version`` only guards the
container: an index whose layouts formats 1-7 know is written with the format they knew it by
(:func:`compact_format`), one with a newer layout as :data:`CODEC_FORMAT_VERSION`, which older
readers refuse. A layout this version does not know is refused by name (IndexFormatError naming
the manifest and the field).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from indexer import int32_docs, packed_docs, range_docs
from indexer.doc_numbers import DocLayout, DocNumbers
from indexer.errors import IndexFormatError
from indexer.layout import IMPACTS, MANIFEST, UINT4_IMPACTS, UINT8_IMPACTS

# every doc layout, the one place each is registered: its name is what manifests record
DOC_LAYOUTS: dict[str, DocLayout] = {
    layout.name: layout for layout in (int32_docs.LAYOUT, packed_docs.STREAM_LAYOUT, range_docs.LAYOUT, packed_docs.BLOCKS_LAYOUT)
}
INT32 = int32_docs.NAME
IMPACT_WIDTHS = (32, 8, 4)  # float32 weights, 8-bit codes, 4-bit codes two a byte
_IMPACT_NAMES = {8: UINT8_IMPACTS, 4: UINT4_IMPACTS}  # the records' "impacts" (formats 3-7)
# a compact index with a layout that formats 1-7 did not know (DocLayout.format_version None)
CODEC_FORMAT_VERSION = 8


def doc_layout(name: str) -> DocLayout:
    """The registered layout ``name`` (also its formats-4-7 ``doc_ids`` name, or a ``--doc-ids``
    option), or ValueError naming the known ones."""
    for layout in DOC_LAYOUTS.values():
        if name in (layout.name, layout.doc_ids, layout.option, *layout.aliases):
            return layout
    raise ValueError(f"unknown doc layout {name!r}: this version knows {', '.join(DOC_LAYOUTS)}")


def layout_options() -> dict[str, DocLayout]:
    """``build-index --doc-ids`` choices: each buildable layout by its option and its aliases."""
    return {opt: layout for layout in DOC_LAYOUTS.values() if layout.option for opt in (layout.option, *layout.aliases)}


@dataclass(frozen=True)
class PostingsCodec:
    """How one channel's postings are stored: a doc layout and an impact width."""

    doc_layout: DocLayout = int32_docs.LAYOUT
    impact_bits: int = 32

    def __post_init__(self) -> None:
        if self.impact_bits not in IMPACT_WIDTHS:
            raise ValueError(f"impact width must be one of {IMPACT_WIDTHS} bits, not {self.impact_bits!r}")
        if self.impact_bits == 32 and not self.doc_layout.float_weights:
            raise ValueError(f"doc layout {self.doc_layout.name!r} goes with quantised impacts (8 or 4 bits: a compact index)")

    @classmethod
    def named(cls, layout: str = INT32, impact_bits: int = 32) -> PostingsCodec:
        """The codec of layout ``layout`` (any name :func:`doc_layout` takes) and ``impact_bits``."""
        return cls(doc_layout(layout), impact_bits)

    @property
    def quantised(self) -> bool:
        return self.impact_bits < 32

    @property
    def nibbles(self) -> bool:
        return self.impact_bits == 4

    def record(self) -> dict:
        """What a channel's manifest record says of it."""
        return {"doc_layout": self.doc_layout.name, "impact_bits": self.impact_bits}

    @classmethod
    def of_record(cls, record: dict, where: Path | None = None, key: str = "sparse") -> PostingsCodec:
        """The codec a channel's manifest ``record`` names (``key``: its field in the manifest of
        index ``where``, for messages): its ``doc_layout`` and ``impact_bits``, or, in a record
        written before them, its ``doc_ids`` and ``impacts``. IndexFormatError naming the field
        where a layout is unknown or the two ways disagree."""
        path = Path(where) / MANIFEST if where is not None else Path(MANIFEST)
        legacy_bits = {UINT8_IMPACTS: 8, UINT4_IMPACTS: 4}.get(record.get("impacts"), 32)
        if record.get("impacts") is not None and record.get("impacts") not in IMPACTS:
            raise IndexFormatError(f"{path}: field '{key}.impacts': {record.get('impacts')!r} is not one of {list(IMPACTS)}")
        name, bits = record.get("doc_layout"), record.get("impact_bits", legacy_bits)
        if name is None:
            legacy = record.get("doc_ids")
            known = {layout.doc_ids: layout for layout in DOC_LAYOUTS.values() if layout.doc_ids}
            if legacy is not None and legacy not in known:
                raise IndexFormatError(f"{path}: field '{key}.doc_ids': unknown doc layout {legacy!r} (this version reads {sorted(known)})")
            layout = known.get(legacy, int32_docs.LAYOUT)
        elif not isinstance(name, str) or name not in DOC_LAYOUTS:
            raise IndexFormatError(f"{path}: field '{key}.doc_layout': unknown doc layout {name!r} (this version reads {', '.join(DOC_LAYOUTS)}); "
                                   "built by a newer version?")
        else:
            layout = DOC_LAYOUTS[name]
            if record.get("doc_ids") is not None and record.get("doc_ids") != layout.doc_ids:
                raise IndexFormatError(f"{path}: field '{key}.doc_ids': {record.get('doc_ids')!r} is not layout {name!r}'s")
        if bits not in IMPACT_WIDTHS or isinstance(bits, bool) or (record.get("impacts") is not None and bits != legacy_bits):
            raise IndexFormatError(f"{path}: field '{key}.impact_bits': {bits!r} is not one of {IMPACT_WIDTHS} (or disagrees with '{key}.impacts')")
        try:
            return cls(layout, bits)
        except ValueError as exc:
            raise IndexFormatError(f"{path}: field '{key}.doc_layout': {exc}") from None


FLOAT32 = PostingsCodec()  # int32 doc numbers, float32 weights: an index that is not compact


def impact_name(bits: int) -> str | None:
    """The records' ``impacts`` (formats 3-7) of ``bits``-bit impacts (None: float32)."""
    return _IMPACT_NAMES.get(bits)


def compact_format(layout: DocLayout, bits: int) -> int:
    """The ``format_version`` of a compact index whose aligned-token postings are stored ``layout``
    with ``bits``-bit impacts: what formats 3-7 called it (4-bit impacts: format 6, but the stream
    layout's, format 7), or :data:`CODEC_FORMAT_VERSION` for a layout they did not know."""
    if layout.format_version is None:
        return CODEC_FORMAT_VERSION
    if layout.format_version == 7 or bits != 4:
        return layout.format_version
    return 6


__all__ = ["CODEC_FORMAT_VERSION", "DOC_LAYOUTS", "FLOAT32", "IMPACT_WIDTHS", "INT32", "DocLayout", "DocNumbers", "PostingsCodec", "compact_format",
           "doc_layout", "impact_name", "layout_options"]
