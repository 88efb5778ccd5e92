"""Full disks, odd files and odd input as clear errors, never a signal, a hang or a traceback (issue 33).

Each case of the probe: a full disk during the merge (on a small tmpfs), a manifest that is a
FIFO, a link to /dev/zero or a directory, FAISS and .npy headers that declare more than the
file holds, a manifest ``max_length`` of 2.5, corpus lines nested too deeply, with lone
surrogates or a 5000-digit id, undecodable bytes in a CLI query, bad fusion settings, and a
corpus edited in place that must not resume from stale shards.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, toy_docs, write_corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer import cli as build_cli
from indexer import verify_cli
from indexer.corpus import CorpusError, CorpusSpec
from indexer.integrity import load_npy
from indexer.manifest import DOC_IDS, MANIFEST, IndexFormatError, Manifest
from indexer.reader import open_index
from indexer.shards import corpus_identity
from retriever.fusion import check_fusion

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("odd")
    corpus = write_corpus(root / "corpus", toy_docs(30), "beir")
    index = root / "index"
    argv = ["--corpus", str(corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
            "--top-k", "8", "--dense", "--no-compact", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    return index


@pytest.fixture(scope="module")
def built_compact(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("odd-compact")
    corpus = write_corpus(root / "corpus", toy_docs(30), "beir")
    index = root / "index"
    argv = ["--corpus", str(corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
            "--top-k", "8", "--dense", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    return index


@pytest.fixture
def index(built, tmp_path) -> Path:
    path = tmp_path / "index"
    shutil.copytree(built, path)  # an old-layout copy of the files: cases damage it freely
    return path


# ------------------------------------------------------------------ a full disk
@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _free(path: Path) -> int:
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def test_a_full_disk_during_the_merge_is_an_error_and_keeps_the_old_index_and_the_shards(small_tmpfs, tmp_path, tiny_model_dir, capsys):
    target = small_tmpfs / "index"
    old_corpus = write_corpus(tmp_path / "old", toy_docs(20), "beir")
    new_corpus = write_corpus(tmp_path / "new", toy_docs(2000, seed=3), "beir")
    common = ["--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "16", "--quiet", "--shard-size", "1000", "--channels", "sparse"]  # the sizes below are for one channel
    assert build_cli.main(["--corpus", str(old_corpus), "--index", str(target), *common]) == 0
    old = open_index(target)
    old_ids = old.doc_ids
    old.close()
    # room for the shards (2000 x 16 x (4 + 4) bytes, and their headers) but not for the merged postings too
    shards = 2000 * 16 * 8
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, _free(small_tmpfs) - shards - 64 * 1024 - shards // 2)
    capsys.readouterr()
    rc = build_cli.main(["--corpus", str(new_corpus), "--index", str(target), "--overwrite", *common])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    err = [line for line in err if line.strip() and not line.startswith("Loading weights")]  # model-loading progress bars (and the blank line they leave)
    assert len(err) == 1 and err[0].startswith("build-index: error: no space left on device writing "), err
    assert err[0].endswith(" MB)") and "(needs " in err[0], err
    again = open_index(target)  # the old index, intact
    assert again.doc_ids == old_ids
    again.close()
    kept = list(small_tmpfs.glob(".index.shards-*/shard-*"))
    assert len(kept) == 2, "the committed shards are kept for the rerun"
    filler.unlink()
    assert build_cli.main(["--corpus", str(new_corpus), "--index", str(target), "--overwrite", *common]) == 0
    assert "resumed 2 of 2 shards" in capsys.readouterr().out
    assert Manifest.read(target).n_docs == 2000


def test_no_sparse_memory_map_writes_index_files():
    """open_memmap makes sparse files (SIGBUS on a full disk); the build writes none."""
    for path in (REPO / "indexer").rglob("*.py"):
        assert "open_memmap" not in path.read_text(encoding="utf-8"), path


# ------------------------------------------------------------------ odd files
def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("rel", [MANIFEST, DOC_IDS, "postings_docs.npy", "dense.faiss"])
@pytest.mark.parametrize("make", [_fifo, _dev_zero, _directory], ids=["fifo", "dev-zero", "directory"])
def test_a_special_file_in_an_index_is_refused_at_once(index, rel, make, capsys):
    make(index / rel)
    with pytest.raises(IndexFormatError, match=rf"{rel}: (not a regular file|.*not a regular file)"):
        open_index(index)
    rc = verify_cli.main([str(index)])
    out = capsys.readouterr()
    assert rc == 1 and rel in out.out and "Traceback" not in out.err, out


def test_search_index_on_a_fifo_manifest_exits_2_in_one_line(index):
    _fifo(index / MANIFEST)
    proc = subprocess.run([sys.executable, "-m", "retriever.cli", "--index", str(index), "cat"], cwd=REPO, env=ENV,
                          check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("search-index: error: ") and "not a regular file (a FIFO)" in proc.stderr


def test_a_faiss_header_declaring_more_than_the_file_is_refused_before_reading(index):
    path = index / "dense.faiss"
    data = bytearray(path.read_bytes())
    assert data[:4] == b"IxFI"
    data[37:45] = struct.pack("<Q", 6 * 10**9 // 4)  # the vector count: 6 GB of floats in a small file
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=r"dense\.faiss: header declares 1500000000 floats"):
        open_index(index)
    data[4:8] = struct.pack("<i", 10**6)  # the dimension
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=r"dense\.faiss: header declares 1000000 dimensions"):
        open_index(index)


def test_a_scalar_quantiser_header_declaring_more_than_the_file_is_refused_before_reading(built_compact, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(built_compact, index)
    path = index / "dense.faiss"
    data = bytearray(path.read_bytes())
    assert data[:4] == b"IxSQ"
    start = 4 + 4 + 8 * 3 + 1 + 4  # code, d, ntotal, two dummies, is_trained, metric
    n_trained = struct.unpack_from("<Q", data, start + 4 + 4 + 4 + 8 + 8)[0]
    codes_at = start + 4 + 4 + 4 + 8 + 8 + 8 + 4 * n_trained
    data[codes_at:codes_at + 8] = struct.pack("<Q", 6 * 10**9)  # 6 GB of codes in a small file
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=r"dense\.faiss: header declares 6000000000 code bytes"):
        open_index(index)


def test_an_npy_header_declaring_more_than_the_file_is_refused(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10, dtype=np.int64))
    data = path.read_bytes()
    assert b"'shape': (10,)" in data
    path.write_bytes(data.replace(b"'shape': (10,)", b"'shape': (99,)"))  # same header length
    for mmap in (True, False):
        with pytest.raises(IndexFormatError, match=r"a\.npy: header declares shape \(99,\)"):
            load_npy(path, "int64", 1, mmap=mmap)
    np.save(path, np.arange(10, dtype=np.int64))
    assert list(load_npy(path, "int64", 1)) == list(range(10))


def test_manifest_max_length_not_an_integer(index):
    data = json.loads((index / MANIFEST).read_text())
    data["embedding"]["max_length"] = 2.5
    (index / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match=r"manifest\.json: field 'embedding\.max_length': 2\.5 is not an integer"):
        Manifest.read(index)


def test_manifest_as_a_directory_under_verify_index(index, capsys):
    _directory(index / MANIFEST)
    proc = subprocess.run([sys.executable, "-m", "indexer.verify_cli", str(index)], cwd=REPO, env=ENV, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "manifest.json: not a regular file (a directory)" in proc.stdout


def test_a_deeply_nested_manifest_is_refused(index):
    (index / MANIFEST).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(IndexFormatError, match="manifest.json: unreadable manifest"):
        Manifest.read(index)


# ------------------------------------------------------------------ odd corpus lines
def _corpus(tmp_path: Path, bad_line: str) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"_id": "a", "text": "fine"}\n' + bad_line + '\n{"_id": "c", "text": "fine too"}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "line, field, words",
    [
        ('{"_id": "b", "text": ' + "[" * 50000 + "]" * 50000 + "}", None, "nested too deeply"),
        ('{"_id": "b", "text": "bad \\ud800 text"}', "text", "lone surrogate U+D800"),
        ('{"_id": "b\\udfff", "text": "x"}', "_id", "lone surrogate U+DFFF"),
        ('{"_id": "b", "title": "\\ud83d", "text": "x"}', "title", "lone surrogate U+D83D"),
        ('{"_id": ' + "9" * 5000 + ', "text": "x"}', None, "unreadable JSON value"),
    ],
    ids=["nested", "surrogate-text", "surrogate-id", "surrogate-title", "5000-digit-id"],
)
def test_odd_corpus_lines_name_file_line_and_field(tmp_path, line, field, words):
    path = _corpus(tmp_path, line)
    with pytest.raises(CorpusError) as info:
        list(CorpusSpec(path))
    assert info.value.line == 2 and info.value.field == field and words in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{path}:2:")


def test_build_index_refuses_a_lone_surrogate_id_in_one_line(tmp_path, tiny_model_dir, capsys):
    path = _corpus(tmp_path, '{"_id": "b\\ud800", "text": "x"}')
    rc = build_cli.main(["--corpus", str(path), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir), "--adapter", "none", "--quiet"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"build-index: error: {path}:2: field '_id': lone surrogate"), err
    assert not os.path.lexists(tmp_path / "index")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=st.dictionaries(st.sampled_from(["_id", "id", "text", "title", "contents", "x"]), _json_values, max_size=4)
       | st.text(max_size=30).map(lambda s: {"_id": s, "text": s}))  # fmt: skip
def test_any_json_line_is_a_document_or_a_corpus_error(tmp_path, obj):
    """No corpus line makes the reader raise anything but CorpusError; every document it yields
    has text and an id that can be written out as UTF-8."""
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(obj) + "\n", encoding="utf-8")
    try:
        docs = list(CorpusSpec(path))
    except CorpusError as exc:
        assert exc.line == 1
        return
    for d in docs:
        d.doc_id.encode("utf-8")
        d.text.encode("utf-8")


def test_a_query_with_undecodable_bytes_under_strict_utf8_stdout(built):
    proc = subprocess.run([sys.executable, "-m", "retriever.cli", "--index", str(built), b"cat \xff\xfe dog"], cwd=REPO,
                          env={**ENV, "PYTHONIOENCODING": "utf-8:strict", "PYTHONUTF8": "1"}, check=False, capture_output=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")[-2000:]
    assert b"query: cat \\udcff\\udcfe dog" in proc.stdout


# ------------------------------------------------------------------ fusion settings
@pytest.mark.parametrize(
    "fusion, key",
    [
        ({"method": "minmax", "weights": {"sparse": float("inf")}}, "weights.sparse"),
        ({"method": "minmax", "weights": {"sparse": float("nan")}}, "weights.sparse"),
        ({"method": "minmax", "weights": {"dense": -1}}, "weights.dense"),
        ({"method": "minmax", "weights": {"dense": "0.5"}}, "weights.dense"),
        ({"method": "minmax", "weights": {"colbert": 0.5}}, "weights.colbert"),
        ({"method": "borda", "weights": {"sparse": 1}}, "method"),
        ({"method": "rrf", "weights": {"sparse": 1}, "rrf_k": 0}, "rrf_k"),
        ({"method": "minmax", "weights": [("sparse", 1)]}, "weights"),
        ({"method": "minmax", "wieghts": {"sparse": 1}}, "wieghts"),
        ({"method": "milvus-weighted", "weights": {"sparse": 1}, "norm_score": "yes"}, "norm_score"),
        ("minmax", "fusion setting"),
    ],
)
def test_bad_fusion_settings_are_refused_when_the_retriever_is_made(index, tiny_embedder, fusion, key):
    from retriever.retriever import Retriever

    tiny_embedder.identity = Manifest.read(index).model
    with pytest.raises(ValueError, match="fusion setting") as info:
        Retriever.load(index, embedder=tiny_embedder, fusion=fusion, warm=False)
    assert key in str(info.value)


@given(weights=st.dictionaries(st.sampled_from(["sparse", "dense", "dense-ef", "bm25", "encoder"]),
                               st.floats(min_value=0, max_value=1e6), max_size=5))  # fmt: skip
def test_good_fusion_settings_pass(weights):
    assert check_fusion({"method": "minmax", "weights": weights}) == {"method": "minmax", "weights": weights}


# ------------------------------------------------------------------ resume key
def test_a_corpus_edited_in_place_gets_another_resume_key(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"_id": "a", "text": "cat"}\n', encoding="utf-8")
    before = corpus_identity(path)
    st_ = path.stat()
    path.write_text('{"_id": "a", "text": "dog"}\n', encoding="utf-8")  # same size
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns))  # same modification time
    assert path.stat().st_size == st_.st_size and path.stat().st_mtime_ns == st_.st_mtime_ns
    assert corpus_identity(path) != before
