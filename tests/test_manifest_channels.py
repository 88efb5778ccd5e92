"""The manifest's ``channels`` dict (issue 69): every channel's record is its entry there.

A manifest written before the dict held every record (formats 1-8: the first six channels' records
as top-level fields, indexer/manifest.py LEGACY_CHANNEL_FIELDS) maps on read to the same
:class:`Manifest`; today's manifests write the dict, and (deprecated, for the previous release's
readers) the six top-level fields as copies of their entries, which the reader checks.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import build_tiny_model, format_4_copy, reseal, save_tiny_sentence_encoder, tiny_identity, toy_docs, write_corpus

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import build_index
from indexer.channels import CHANNEL_SPECS
from indexer.compact import compact_copy
from indexer.manifest import (
    CODEC_FORMAT_VERSION,
    COMPACT_FORMAT_VERSION,
    LEGACY_CHANNEL_FIELDS,
    LEGACY_MARKER,
    MANIFEST,
    NIBBLE_FORMAT_VERSION,
    PACKED_FORMAT_VERSION,
    RANGE_FORMAT_VERSION,
    SEGMENTS_FORMAT_VERSION,
    STREAM_FORMAT_VERSION,
    IndexFormatError,
    Manifest,
)
from indexer.verify import open_channels, verify

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def formats(tmp_path_factory, tiny_tokenizer) -> dict[int, Path]:
    """An index of every format this version reads ({format_version: index}), each with every channel
    that had a top-level field (the segmented one with those a segmented build takes)."""
    from embedder.sentence_encoder import SentenceEncoder

    root = tmp_path_factory.mktemp("formats")
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    encoders = {name: SentenceEncoder.load(save_tiny_sentence_encoder(root / name, seed=seed)) for seed, name in enumerate(("encoder", "encoder2"))}
    corpus = write_corpus(root / "corpus", toy_docs(40, seed=3), "beir")
    out = {1: root / "plain", 2: root / "segments"}
    build_index(corpus, out[1], embedder, top_k=16, progress=False, channels={"dense": True, "dense-ef": 2, "bm25": "words", **encoders})
    build_index(corpus, out[2], embedder, top_k=16, progress=False, segments=True, max_segments=2,
                channels={"dense": True, "bm25": "words", "encoder": encoders["encoder"]})
    out[COMPACT_FORMAT_VERSION] = root / "compact"
    compact_copy(out[1], out[COMPACT_FORMAT_VERSION])
    format_4_copy(out[COMPACT_FORMAT_VERSION], root / "packed")
    out[PACKED_FORMAT_VERSION] = root / "packed"
    for version, options in ((RANGE_FORMAT_VERSION, {"range_doc_ids": True}), (NIBBLE_FORMAT_VERSION, {"impact_bits": 4}),
                             (STREAM_FORMAT_VERSION, {"pack_doc_ids": True})):
        out[version] = root / f"format-{version}"
        compact_copy(out[1], out[version], **options)
    # format 8: records that name their codec (doc_layout, impact_bits), as the format-7 copy's do
    out[CODEC_FORMAT_VERSION] = root / "codec"
    shutil.copytree(out[STREAM_FORMAT_VERSION].resolve(), out[CODEC_FORMAT_VERSION])
    data = json.loads((out[CODEC_FORMAT_VERSION] / MANIFEST).read_text())
    (out[CODEC_FORMAT_VERSION] / MANIFEST).write_text(json.dumps({**data, "format_version": CODEC_FORMAT_VERSION}))
    reseal(out[CODEC_FORMAT_VERSION])
    for version, index in out.items():
        assert Manifest.read(index).format_version == version
    return out


def legacy_layout(data: dict, known: tuple[str, ...] = LEGACY_CHANNEL_FIELDS) -> dict:
    """``data`` (a manifest as written today) as releases before the ``channels`` dict wrote it: the records
    of the channels they ``known`` as top-level fields (null: not built), the others' (rows added since) in
    ``channels`` (absent where none), no marker."""
    old = {k: v for k, v in data.items() if k not in (*LEGACY_CHANNEL_FIELDS, LEGACY_MARKER, "channels", "checksum")}
    others = {k: v for k, v in data["channels"].items() if k not in LEGACY_CHANNEL_FIELDS}
    return old | {key: data["channels"].get(key) for key in known} | ({"channels": others} if others else {})


def _rewrite(index: Path, change) -> Path:
    """The index's generation with its manifest changed by ``change(data)`` and resealed (checksums of it and its files)."""
    d = index.resolve()
    data = json.loads((d / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps(change(data)))
    reseal(d)
    return d


def _same(a: Manifest, b: Manifest) -> None:
    assert dataclasses.replace(a, checksum=None) == dataclasses.replace(b, checksum=None)


@pytest.mark.parametrize("known", [LEGACY_CHANNEL_FIELDS, ("sparse", "dense", "embedfilter", "lexical"), ("sparse", "dense", "lexical", "encoder")],
                         ids=["previous-release", "before-encoders", "before-encoder2"])
@pytest.mark.parametrize("version", [1, SEGMENTS_FORMAT_VERSION, COMPACT_FORMAT_VERSION, PACKED_FORMAT_VERSION, RANGE_FORMAT_VERSION,
                                     NIBBLE_FORMAT_VERSION, STREAM_FORMAT_VERSION, CODEC_FORMAT_VERSION])
def test_an_old_manifest_of_every_format_maps_into_channels(formats, version, known, tmp_path):
    """Every format's manifest, in the layout releases before the dict wrote it (the records of the channels
    they knew as top-level fields), reads as the manifest of today: the same records in ``channels``; the
    index verifies and opens every channel; written again, it is today's layout."""
    today = Manifest.read(formats[version])
    # a release that did not know a channel could not have built it: only indexes without those channels
    if any(today.channels.get(k) for k in LEGACY_CHANNEL_FIELDS if k not in known):
        today = dataclasses.replace(today, channels={k: v for k, v in today.channels.items() if k in known})
    index = tmp_path / "index"
    shutil.copytree(formats[version].resolve(), index)
    old = legacy_layout(json.loads(json.dumps({**json.loads((index / MANIFEST).read_text()), "channels": today.channels})), known)
    _rewrite(index, lambda _: old)
    assert "channels" not in json.loads((index / MANIFEST).read_text()) and set(known) <= set(old)
    m = Manifest.read(index)
    _same(dataclasses.replace(m, files=None), dataclasses.replace(today, files=None))
    assert m.format_version == version and list(m.channels) == [s.manifest_key for s in CHANNEL_SPECS if s.manifest_key in today.channels]
    assert m.compact == today.compact and m.packed == today.packed and m.ranged == today.ranged
    assert verify(index).ok and {mode for mode, opened in open_channels(index, m).items() if opened is not None} == {s.mode for s in CHANNEL_SPECS if s.record(m)}
    # written again (any update or compact copy does): the dict, and the deprecated copies beside it
    m.write(index)
    data = json.loads((index / MANIFEST).read_text())
    assert data["channels"] == m.channels and data[LEGACY_MARKER] == list(LEGACY_CHANNEL_FIELDS)
    assert all(data[key] == m.channels.get(key) for key in LEGACY_CHANNEL_FIELDS)
    _same(Manifest.read(index), m)


def test_todays_manifests_write_the_dict_and_matching_copies(formats):
    """Every format's manifest as built: ``channels`` holds every built channel's record (and only
    those); the six top-level copies (null: not built) equal their entries, so that a reader of the
    previous release (which reads only them) sees the records this version reads."""
    for version, index in formats.items():
        data = json.loads((index / MANIFEST).read_text())
        m = Manifest.read(index)
        assert data["channels"] == m.channels and all(isinstance(v, dict) and v for v in m.channels.values()), version
        assert data[LEGACY_MARKER] == list(LEGACY_CHANNEL_FIELDS), version
        previous_reader = {key: data[key] for key in LEGACY_CHANNEL_FIELDS}  # all it reads of the channels
        assert previous_reader == {key: m.channels.get(key) for key in LEGACY_CHANNEL_FIELDS}, version


def test_a_copy_that_disagrees_with_its_record_is_refused(formats, tmp_path):
    """In a manifest that says it mirrors (``legacy_fields``), a top-level copy that differs from its
    ``channels`` entry, or is missing, is damage (or a hand edit): refused, naming the field."""
    for name, change, says in (
        ("differs", lambda d: d["lexical"].update(n_terms=1), r"field 'lexical': \{.*not a copy of its record in 'channels'"),
        ("built-not-copied", lambda d: d.update(dense=None), "field 'dense': None, not a copy"),
        ("missing", lambda d: d.pop("sparse"), "field 'sparse': missing"),
        ("marker-not-a-list", lambda d: d.update({LEGACY_MARKER: "sparse"}), f"field '{LEGACY_MARKER}': not a list"),
        ("channels-not-an-object", lambda d: d.update(channels=[1]), "field 'channels': neither an object nor null"),
        ("no-channels", lambda d: d.pop("channels"), r"missing field\(s\) channels"),
    ):
        index = tmp_path / name
        shutil.copytree(formats[1].resolve(), index)
        data = json.loads((index / MANIFEST).read_text())
        change(data)
        (index / MANIFEST).write_text(json.dumps(data))
        with pytest.raises(IndexFormatError, match=says):
            Manifest.read(index)
        report = verify(index)
        assert len(report.problems) == 1 and "manifest.json" in report.problems[0], (name, report.problems)


def test_a_manifest_the_previous_release_rewrote_reads_its_fields(formats, tmp_path):
    """The previous release rewriting today's manifest (an update, a compact copy) keeps the fields it
    knows, changed, carries ``channels`` along as it found it, and drops the marker it does not know:
    its top-level records are the index's then, and the stale entries they replace are not read."""
    index = tmp_path / "index"
    shutil.copytree(formats[1].resolve(), index)
    before = Manifest.read(index)

    def previous_release_rewrite(data: dict) -> dict:
        data.pop(LEGACY_MARKER)
        data["dense"] = None  # a channel it dropped (its files gone: only the manifest is checked here)
        data["lexical"] = {**data["lexical"], "n_terms": data["lexical"]["n_terms"] + 1}
        return data

    d = _rewrite(index, previous_release_rewrite)
    assert json.loads((d / MANIFEST).read_text())["channels"]["dense"] == before.record("dense")  # the stale copy
    m = Manifest.read(index)
    assert m.record("dense") is None and m.record("lexical")["n_terms"] == before.record("lexical")["n_terms"] + 1
    assert m.channels == {**{k: v for k, v in before.channels.items() if k != "dense"}, "lexical": m.record("lexical")}


def test_a_channel_record_is_read_by_any_of_its_names(formats):
    m = Manifest.read(formats[1])
    for s in CHANNEL_SPECS:
        assert all(m.record(name) is s.record(m) is m.channels.get(s.manifest_key) for name in s.names)
    assert m.record("bm25") is m.record("lexical") is m.channels["lexical"]
    with pytest.raises(KeyError, match="unknown channel"):
        m.record("nope")
    # channels_with: records in place of theirs, None removing one, the table's order kept on construction
    changed = dataclasses.replace(m, channels=m.channels_with({"dense": None, "lexical": {"x": 1}}))
    assert "dense" not in changed.channels and changed.record("bm25") == {"x": 1} and "dense" in m.channels
    assert list(changed.channels) == [k for k in m.channels if k != "dense"]
