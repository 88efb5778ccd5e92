"""The names an index directory's top level shares between layers: the manifest's file, the doc-ids
file, and the marker of 8-bit impacts.

Their own module, below the manifest and the checked loaders (indexer/integrity.py), so that the
channel readers and writers (indexer/channels.py, which the manifest reads for each channel's
fields) never import the manifest back. ``indexer.manifest`` re-exports all three, where they
lived first.
"""
from __future__ import annotations

MANIFEST = "manifest.json"
DOC_IDS = "doc_ids.json"  # document ids in doc-number order (a JSON list)
# the "impacts" of a channel (manifest's sparse / lexical) stored as 8-bit codes; absent: float32
UINT8_IMPACTS = "uint8"
# ... or as 4-bit codes, two a byte (format 6; indexer/kernels.py's NIBBLES)
UINT4_IMPACTS = "uint4"
IMPACTS = (UINT8_IMPACTS, UINT4_IMPACTS)
# the "doc_ids" of a channel (manifest's sparse / lexical) delta-coded and bit-packed in blocks of
# 128 (indexer/packed_docs.py, format 4); absent: int32 doc numbers (postings_docs.npy)
BITPACKED_DOC_IDS = "bitpacked-128"
# ... or as 16-bit offsets within ranges of 65,536 documents (indexer/range_docs.py, format 5)
RANGE_DOC_IDS = "range16-65536"
# ... or bit-packed in blocks of 128 laid end to end on bit boundaries, each list's first doc
# number in the stream (indexer/packed_docs.py's stream layout, format 7)
BITSTREAM_DOC_IDS = "bitstream-128"
PACKED_DOC_IDS = (BITPACKED_DOC_IDS, BITSTREAM_DOC_IDS)  # either layout of packed_docs.py
# These are the names formats 4-7 record; how a channel's postings are stored is now read as the
# postings codec (indexer/codec.py) from its record ("doc_layout", "impact_bits", or these).


__all__ = [
    "BITPACKED_DOC_IDS",
    "BITSTREAM_DOC_IDS",
    "DOC_IDS",
    "IMPACTS",
    "MANIFEST",
    "PACKED_DOC_IDS",
    "RANGE_DOC_IDS",
    "UINT4_IMPACTS",
    "UINT8_IMPACTS",
]
