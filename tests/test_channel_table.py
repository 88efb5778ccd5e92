"""The channel table (indexer/channels.py, issue 49): every row is built, round-trips through the
manifest (its ``channels`` entry), is validated by the manifest check, verified by verify-index,
searched and explained through the public Retriever API, compacted, updated and exported, on one
tiny index with every channel; and every layer that names channels reads its names from the table.

A new channel is one more row: the parametrised tests below then cover it without an edit (its
setting for the test index is its row's default, or one of :data:`SETTINGS`).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import build_tiny_model, save_tiny_sentence_encoder, tiny_identity, toy_docs, write_corpus

from embedder.encoder import Embedder, EmbedderConfig
from indexer import channel_set, channels
from indexer.build import BuildPlan, build, build_index
from indexer.channels import ANALYSED_TERMS, CHANNEL_SPECS, MODES, ChannelSpec, spec
from indexer.manifest import LEGACY_CHANNEL_FIELDS, LEGACY_MARKER, MANIFEST, IndexFormatError, Manifest
from indexer.verify import CHANNELS as VERIFY_CHANNELS
from indexer.verify import open_channels, verify
from retriever.backends import DENSE_CHANNELS, SPARSE_CHANNELS
from retriever.fusion import CHANNELS as FUSION_CHANNELS
from retriever.fusion import check_fusion

pytest.importorskip("sentence_transformers")

QUERY = "cat and dog near the river"


@dataclasses.dataclass
class Built:
    root: Path
    corpus: Path
    index: Path
    embedder: Embedder
    encoder: object
    encoder2: object
    settings: dict


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_tokenizer) -> Built:
    """The toy corpus indexed with every row of the table, through the plan (indexer.build.build)."""
    from embedder.sentence_encoder import SentenceEncoder

    root = tmp_path_factory.mktemp("channel-table")
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    encoder = SentenceEncoder.load(save_tiny_sentence_encoder(root / "st"))
    encoder2 = SentenceEncoder.load(save_tiny_sentence_encoder(root / "st2", seed=1))  # another model: a second encoder channel
    # each row's setting: its default, except what a test index cannot load by name
    settings = {s.mode: s.default_setting() for s in CHANNEL_SPECS} | {"encoder": encoder, "encoder2": encoder2}
    corpus = write_corpus(root / "corpus", toy_docs(40), "beir")
    build(corpus, root / "index", embedder, BuildPlan.make(settings, embedder, top_k=16, progress=False))
    return Built(root, corpus, root / "index", embedder, encoder, encoder2, settings)


# ------------------------------------------------------------------ the table itself
def test_every_name_is_said_once_and_old_names_resolve():
    for attr in ("mode", "manifest_key", "name", "attribute"):
        values = [getattr(s, attr) for s in CHANNEL_SPECS]
        assert len(values) == len(set(values)), attr
    for s in CHANNEL_SPECS:
        for name in s.names:
            assert spec(name) is s
        assert s.build_needs <= set(channels.BUILD_NEEDS) and s.query_needs <= set(channels.QUERY_NEEDS)
        assert s.query_kind in channels.QUERY_KINDS
        # its record: an entry of the manifest's channels dict, by its manifest key
        m = Manifest(model={}, adapter=None, embedding={}, n_docs=1, channels={s.manifest_key: {"x": 1}})
        assert s.record(m) == m.record(s.mode) == {"x": 1} and all(m.record(n) == {"x": 1} for n in s.names)
    # the spellings the layers used before the table (manifest keys, file stems, attributes)
    assert spec("lexical").mode == "bm25" and spec("embedfilter").mode == spec("dense_ef").mode == "dense-ef"
    assert spec("encoder_index").mode == "encoder" and channels.mode_of("lexical") == "bm25"
    with pytest.raises(KeyError, match="unknown channel 'nope'"):
        spec("nope")
    assert [s for s in CHANNEL_SPECS if s.required] == [channels.SPARSE]


def test_the_layers_read_their_channel_names_from_the_table():
    assert MODES == channel_set.CHANNELS == FUSION_CHANNELS == tuple(VERIFY_CHANNELS)
    assert sorted(SPARSE_CHANNELS + DENSE_CHANNELS) == sorted(MODES)
    assert channel_set.parse_channels(",".join(reversed(MODES))) == MODES
    for mode in MODES:
        check_fusion({"method": "minmax", "weights": {mode: 1.0}})


def test_the_plan_is_the_keyword_form(built, tmp_path):
    """``build_index(...)`` (the keyword form) writes the index the plan writes, byte for byte
    (the manifest's timings and date aside)."""
    build_index(built.corpus, tmp_path / "kw", built.embedder, top_k=16, progress=False, channels=built.settings)
    a, b = built.index.resolve(), (tmp_path / "kw").resolve()
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name != MANIFEST)
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    ma, mb = (json.loads((d / MANIFEST).read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("build"), m.pop("created"), m.pop("checksum")
    assert ma == mb


# ------------------------------------------------------------------ every row
@pytest.fixture(params=CHANNEL_SPECS, ids=[s.mode for s in CHANNEL_SPECS])
def row(request) -> ChannelSpec:
    return request.param


def _copy(built: Built, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(built.index.resolve(), out)
    return out


def test_row_is_built(built, row):
    m = Manifest.read(built.index)
    record = row.record(m)
    assert isinstance(record, dict) and record
    index = built.index.resolve()
    for pattern in row.files[:1]:  # the first pattern names the file every build of it writes
        assert list(index.glob(pattern)), pattern
    assert set(m.files) >= {str(p.relative_to(index)) for pattern in row.files for p in index.glob(pattern)}
    assert row.mode in open_channels(built.index, m)


def test_row_round_trips_through_the_manifest(built, row, tmp_path):
    """The row's record, alone in a manifest, written and read back: its entry in ``channels`` (one of
    the six rows that had a top-level field: an equal copy there too, the others' copies null; a later
    row: in ``channels`` alone); in the layout releases before the dict wrote (those six as top-level
    fields, a later row in ``channels``), read as the same manifest."""
    record = row.record(Manifest.read(built.index))
    one = dataclasses.replace(Manifest.read(built.index), channels={row.manifest_key: record}, files=None)
    one.write(tmp_path)
    data = json.loads((tmp_path / MANIFEST).read_text())
    assert data["channels"] == {row.manifest_key: record} and data[LEGACY_MARKER] == list(LEGACY_CHANNEL_FIELDS)
    assert {k: data[k] for k in LEGACY_CHANNEL_FIELDS} == {k: record if k == row.manifest_key else None for k in LEGACY_CHANNEL_FIELDS}
    assert row.manifest_key in LEGACY_CHANNEL_FIELDS or row.manifest_key not in data
    back = Manifest.read(tmp_path)
    assert back == one and row.record(back) == back.record(row.mode) == record and list(back.channels) == [row.manifest_key]
    old = {k: v for k, v in data.items() if k not in (LEGACY_MARKER, "channels", "checksum")}
    if row.manifest_key not in LEGACY_CHANNEL_FIELDS:
        old["channels"] = {row.manifest_key: record}
    (tmp_path / MANIFEST).write_text(json.dumps(old))
    assert dataclasses.replace(Manifest.read(tmp_path), checksum=one.checksum) == one


def test_row_is_validated_by_the_manifest_check(built, row, tmp_path):
    index = _copy(built, tmp_path)
    original = json.loads((index / MANIFEST).read_text())
    damages = [(name, value) for name, _ in row.fields for value in (None, [], 2.5)]  # wrong for every kind of field
    if not row.required:
        damages.append((None, 7))  # the record itself neither an object nor null
    assert damages
    for name, value in damages:
        data = json.loads(json.dumps(original))
        # its record: its entry of the manifest's channels dict (a top-level copy of one of the first six rows', the
        # deprecated mirror, is checked to equal it: test_manifest_channels.py)
        holder = data["channels"]
        if name is None:
            holder[row.manifest_key] = value
        else:
            holder[row.manifest_key][name] = value
        (index / MANIFEST).write_text(json.dumps(data))
        where = row.manifest_key if name is None else f"{row.manifest_key}.{name}"
        with pytest.raises(IndexFormatError, match=rf"field '{where}'"):
            Manifest.read(index)
        report = verify(index)
        assert len(report.problems) == 1 and f"field '{where}'" in report.problems[0]


def test_row_is_verified(built, row, tmp_path):
    assert verify(built.index).ok
    index = _copy(built, tmp_path)
    damaged = min(p for pattern in row.files for p in index.glob(pattern) if p.is_file())
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    report = verify(index)
    assert not report.ok and any(str(damaged.name) in p for p in report.problems), report.problems


def searched_alone_and_fused(built, row: ChannelSpec, k: int) -> tuple[list, list]:
    """The hits of QUERY in ``row``'s channel alone (top ``k``) and in a hybrid that weighs it alone (top 5)."""
    from retriever.retriever import Retriever

    r = Retriever.load(built.index, embedder=built.embedder, encoders={s.mode: built.settings[s.mode] for s in channels.sentence_encoder_specs()}, query_encoder="llm", profile=None, warm=False,
                       fusion={"method": "minmax", "weights": {row.mode: 1.0}})
    try:
        return r.search(QUERY, k=k, mode=row.mode), r.search(QUERY, k=5, mode="hybrid")
    finally:
        r.close()


def test_row_is_searched(built, row):
    alone, fused = searched_alone_and_fused(built, row, k=20)
    assert alone and fused
    # the hybrid of one channel is that channel's ranking (up to its near-ties, which min-max
    # rounding may reorder)
    assert {h.doc_id for h in fused} <= {h.doc_id for h in alone}
    assert all(set(h.channels) == {row.mode} for h in fused)


def test_row_is_explained(built, row):
    """A channel searched with a sparse query (ids and weights) explains each hit by what matched,
    the entries adding up to the hit's score; a dense channel has nothing to list. In a hybrid
    that reads the channel, its entries appear too, prefixed with its mode unless it is the
    aligned-token channel."""
    alone, fused = searched_alone_and_fused(built, row, k=5)
    assert alone
    if row.query_kind == "dense":
        assert all(not h.matched_tokens and not h.matched_ids and not h.matched_terms for h in alone)
        return
    assert all(h.matched_tokens for h in alone)
    for h in alone:
        assert sum(h.matched_tokens.values()) == pytest.approx(h.score, rel=1e-4)
    raw = [h.matched_terms if ANALYSED_TERMS in row.query_needs else h.matched_ids for h in alone]
    assert all(raw) and all(sum(x.values()) == pytest.approx(h.score, rel=1e-4) for x, h in zip(raw, alone))
    prefix = "" if row.required else f"{row.mode}:"
    assert any(t.startswith(prefix) for h in fused for t in h.matched_tokens)


@pytest.fixture(scope="module")
def compacted(built) -> Path:
    """A compact copy of the every-row index (indexer/compact.py), as ``compact-index`` writes it."""
    from indexer.compact import compact_copy

    compact_copy(built.index, built.root / "compact")
    return built.root / "compact"


def test_row_is_compacted(built, compacted, row):
    """A compact copy keeps the row (its record and files, verified): a row with postings holds 8-bit impacts,
    a dense row its compact kind (its row's ``compact_kind``, else SQ8); the row alone still finds the
    documents it found before among its first hits (quantisation moves near-ties)."""
    from indexer.compact import compact_dense_kind

    m = Manifest.read(compacted)
    record = row.record(m)
    assert isinstance(record, dict) and m.compact and verify(compacted).ok
    if row.postings is not None:
        assert record["impacts"] == "uint8"
    if row.query_kind == "dense":
        assert record["kind"] == compact_dense_kind("Flat", True, row.mode) == (row.compact_kind or "SQ8")
    compact_built = dataclasses.replace(built, index=compacted)
    before, _ = searched_alone_and_fused(built, row, k=10)
    after, _ = searched_alone_and_fused(compact_built, row, k=10)
    assert after and {h.doc_id for h in before[:3]} & {h.doc_id for h in after}


def _encoders(built: Built) -> dict:
    """The sentence models of the test index's encoder channels, by mode."""
    return {s.mode: built.settings[s.mode] for s in channels.sentence_encoder_specs()}


def test_row_is_updated(built, row, tmp_path):
    """An update (indexer/updates.py) adds a document to every channel and removes one: the
    channel alone finds the added document for its own text (the tiny model ranks it anywhere),
    holds the deleted one no more, and
    the updated index verifies."""
    from indexer.corpus import document_from_object
    from indexer.updates import update_index
    from retriever.retriever import Retriever

    index = _copy(built, tmp_path)
    before = Retriever.load(index, embedder=built.embedder, encoders=_encoders(built), query_encoder="llm", profile=None, warm=False)
    gone = before.doc_ids[0]
    before.close()
    added = {"_id": "added-doc", "title": "zebra giraffe", "text": "zebra giraffe savanna zebra giraffe " + QUERY}
    report = update_index(index, add=[document_from_object(added, "test", 1)], delete=[gone], embedder=built.embedder,
                          encoders=_encoders(built), progress=False)
    assert report.published and verify(index).ok
    m = Manifest.read(index)
    assert m.n_docs == Manifest.read(built.index).n_docs and isinstance(row.record(m), dict)
    r = Retriever.load(index, embedder=built.embedder, encoders=_encoders(built), query_encoder="llm", profile=None, warm=False)
    try:
        hits = r.search(added["text"], k=m.n_docs, mode=row.mode)
        assert "added-doc" in {h.doc_id for h in hits} and gone not in {h.doc_id for h in hits}
    finally:
        r.close()


def test_row_is_exported(built, row, tmp_path):
    """A row exported to Milvus (its ``milvus``) is searched there as the engine searches it; one
    that is not stays out of the collection (and the Milvus backend refuses its mode)."""
    pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install -e '.[milvus]')")
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install -e '.[milvus]')")
    from indexer.exports.milvus import export_milvus
    from retriever.retriever import Retriever

    uri = str(tmp_path / "milvus.db")
    info = export_milvus(built.index, uri, progress=False)
    assert (row.mode in info["channels"]) == row.milvus
    if not row.milvus:
        return
    kw = {"embedder": built.embedder, "encoders": _encoders(built), "query_encoder": "llm", "profile": None, "warm": False}
    with Retriever.load(built.index, **kw) as numba, Retriever.load(built.index, backend="milvus", milvus_uri=uri, **kw) as milvus:
        (q,) = numba.encode([QUERY], mode=row.mode)
        a, b = numba.search_channel(q, row.mode, 5), milvus.search_channel(q, row.mode, 5)
        assert a[0][0] == b[0][0] and a[1][0] == pytest.approx(b[1][0], rel=1e-4)
