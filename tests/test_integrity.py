"""A damaged index never takes its reader down.

The corruption matrix damages one file of a tiny-model index per case (truncated, emptied,
bytes flipped, values out of range) and runs ``search-index`` and ``verify-index`` on it in
subprocesses: the reader must exit 2 (never by a signal) with one line naming the file, and
``verify-index`` must flag every case (exit 1) and pass a fresh index (exit 0).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pytest
from conftest import REPO, reseal

from indexer import cli as build_cli
from indexer import verify, verify_cli
from indexer.checksums import CHECKSUM, file_checksum, json_checksum
from indexer.manifest import DOC_IDS, MANIFEST, IndexFormatError, Manifest
from retriever.retriever import Retriever

N_DOCS = 40


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_model_dir) -> Path:
    """An index with every channel, built once per module; cases work on copies. The float32
    format (--no-compact): compact indexes' damage is tests/test_compact.py's."""
    from conftest import toy_docs, write_corpus

    root = tmp_path_factory.mktemp("integrity")
    corpus = write_corpus(root / "corpus", toy_docs(N_DOCS), "beir")
    index = root / "index"
    argv = ["--corpus", str(corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
            "--top-k", "16", "--dense", "--embedfilter", "2", "--lexical", "words", "--no-compact", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    return index


@pytest.fixture
def index(pristine, tmp_path) -> Path:
    path = tmp_path / "index"
    shutil.copytree(pristine, path)
    return path


ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's packages, not an installed copy


def fresh(module: str, *args: str) -> subprocess.CompletedProcess:
    """A command line in a fresh interpreter (``python -m module``)."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False)


class ForkServer:
    """tests/cli_forkserver.py: each command runs in its own forked process, imports paid once."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "cli_forkserver.py")], cwd=REPO, env=ENV,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, module: str, *args: str) -> subprocess.CompletedProcess:
        self.proc.stdin.write(json.dumps({"module": module, "argv": list(args)}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return subprocess.CompletedProcess([module, *args], reply["returncode"], reply["stdout"], reply["stderr"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def cli():
    server = ForkServer()
    yield server
    server.close()


def search(cli, index: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli.run("retriever.cli", "--index", str(index), *extra, "cat and dog")


def verify_index(cli, index: Path) -> subprocess.CompletedProcess:
    return cli.run("indexer.verify_cli", str(index))


# ------------------------------------------------------------------ damage
def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def flip(path: Path) -> None:
    """XOR 0xFF into 8 bytes of the file's second half (past any header), same size."""
    data = bytearray(path.read_bytes())
    rng = random.Random(path.name)
    for pos in rng.sample(range(len(data) // 2, len(data)), 8):
        data[pos] ^= 0xFF
    path.write_bytes(bytes(data))




def edit_npy(rel: str, change: Callable[[np.ndarray], None]) -> Callable[[Path], None]:
    def damage(index: Path) -> None:
        arr = np.load(index / rel)
        change(arr)
        np.save(index / rel, arr)  # same dtype and shape: same size
        reseal(index)

    return damage


def edit_json(rel: str, change: Callable[[object], object]) -> Callable[[Path], None]:
    def damage(index: Path) -> None:
        path = index / rel
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
        reseal(index)

    return damage


def set_item(obj, key, value):
    obj[key] = value
    return obj


def fewer_vectors(index: Path) -> None:
    old = faiss.read_index(str(index / "dense.faiss"))
    new = faiss.IndexFlatIP(old.d)
    new.add(old.reconstruct_n(0, old.ntotal - 1))
    faiss.write_index(new, str(index / "dense.faiss"))
    reseal(index)


def bad_bm25_term(meta: dict) -> dict:
    meta["vocab"][next(iter(meta["vocab"]))] = 10**6
    return meta


def duplicate_id(ids: list) -> list:
    ids[1] = ids[0]
    return ids


def _indptr_past_end(a: np.ndarray) -> None:
    a[-1] += 5


def _indptr_decreasing(a: np.ndarray) -> None:
    a[1] = a[2] + 1


def _set(pos: int, value) -> Callable[[np.ndarray], None]:
    def change(a: np.ndarray) -> None:
        a[pos] = value

    return change


FILES = [
    MANIFEST,
    DOC_IDS,
    "postings_indptr.npy",
    "postings_docs.npy",
    "postings_weights.npy",
    "dense.faiss",
    "dense_ef.faiss",
    "dense_ef_projection.npy",
    "lexical/bm25.json",
    "lexical/postings_indptr.npy",
    "lexical/postings_docs.npy",
    "lexical/postings_weights.npy",
]
# the stored documents (indexer/stored_documents.py): recorded and checksummed like every file, their
# damage tested in tests/test_updates.py
STORED = ["documents.jsonl", "documents_offsets.npy"]
OUT_OF_RANGE: dict[str, Callable[[Path], None]] = {
    MANIFEST: lambda i: edit_json(MANIFEST, lambda m: set_item(m, "n_docs", -1))(i),
    DOC_IDS: edit_json(DOC_IDS, duplicate_id),
    "postings_indptr.npy": edit_npy("postings_indptr.npy", _indptr_past_end),
    "postings_docs.npy": edit_npy("postings_docs.npy", _set(3, N_DOCS + 1000)),
    "postings_weights.npy": edit_npy("postings_weights.npy", _set(7, np.nan)),
    "dense.faiss": fewer_vectors,
    "dense_ef_projection.npy": edit_npy("dense_ef_projection.npy", _set((0, 0), np.inf)),
    "lexical/bm25.json": edit_json("lexical/bm25.json", bad_bm25_term),
    "lexical/postings_indptr.npy": edit_npy("lexical/postings_indptr.npy", _indptr_decreasing),
    "lexical/postings_docs.npy": edit_npy("lexical/postings_docs.npy", _set(0, -1)),
    "lexical/postings_weights.npy": edit_npy("lexical/postings_weights.npy", _set(0, -1.0)),
}


def _cases() -> list:
    cases = []
    for rel in FILES:
        cases.append(pytest.param(rel, "truncated", id=f"{rel}-truncated"))
        cases.append(pytest.param(rel, "flipped", id=f"{rel}-flipped"))
        if rel in OUT_OF_RANGE:
            cases.append(pytest.param(rel, "out-of-range", id=f"{rel}-out-of-range"))
    for rel in (MANIFEST, DOC_IDS, "postings_docs.npy", "dense.faiss", "lexical/bm25.json"):
        cases.append(pytest.param(rel, "emptied", id=f"{rel}-emptied"))
    return cases


def damage(index: Path, rel: str, kind: str) -> None:
    if kind == "out-of-range":
        OUT_OF_RANGE[rel](index)
    else:
        {"truncated": truncate, "emptied": empty, "flipped": flip}[kind](index / rel)


def assert_one_line_naming(proc: subprocess.CompletedProcess, rc: int, name: str) -> str:
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.mark.parametrize("rel, kind", _cases())
def test_corruption_matrix(cli, index, rel, kind):
    damage(index, rel, kind)
    # A flipped byte in a float is invisible to structural checks (Lucene too finds it only by
    # checksum): the reader asked to verify must refuse it; every other kind is refused always.
    reader = search(cli, index, "--verify") if kind == "flipped" else search(cli, index)
    assert_one_line_naming(reader, 2, rel.split("/")[-1])
    checked = verify_index(cli, index)
    assert checked.returncode == 1, (checked.stdout, checked.stderr)
    assert "Traceback" not in checked.stderr
    assert any(rel.split("/")[-1] in line for line in checked.stdout.splitlines()), checked.stdout


@pytest.mark.parametrize("rel", [f for f in FILES if f != MANIFEST])
def test_flipped_bytes_without_verify_never_crash(cli, index, rel):
    """Without --verify a flipped byte may go unnoticed (a changed weight), but never kills the
    reader or prints a traceback."""
    flip(index / rel)
    proc = search(cli, index)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1 and rel.split("/")[-1] in proc.stderr


@pytest.mark.parametrize(
    "rel, kind",
    [("postings_docs.npy", "truncated"), ("postings_weights.npy", "emptied"), ("dense.faiss", "truncated"), ("lexical/bm25.json", "truncated")],
)
def test_index_without_checksums_still_refuses_damage(cli, index, rel, kind):
    """An index built before checksums existed: the structural checks alone name the file."""
    data = json.loads((index / MANIFEST).read_text())
    del data["files"], data["checksum"]
    (index / MANIFEST).write_text(json.dumps(data))
    damage(index, rel, kind)
    assert_one_line_naming(search(cli, index), 2, rel.split("/")[-1])
    assert verify_index(cli, index).returncode == 1


def test_fresh_index_passes_verify_and_search_verify(index):
    """The real entry points in fresh interpreters."""
    proc = fresh("indexer.verify_cli", str(index))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(f"ok (index, {len(FILES) - 1 + len(STORED)} files checksummed)")
    proc = fresh("retriever.cli", "--index", str(index), "--verify", "--json", "cat and dog")
    assert proc.returncode == 0 and json.loads(proc.stdout)["hits"], proc.stderr


@pytest.mark.parametrize("rel, kind", [("postings_docs.npy", "out-of-range"), ("dense.faiss", "truncated")])
def test_damage_in_a_fresh_interpreter(index, rel, kind):
    """The two crashes the issue measured (SIGSEGV, FAISS traceback), through ``python -m``
    rather than the fork server."""
    damage(index, rel, kind)
    assert_one_line_naming(fresh("retriever.cli", "--index", str(index), "cat and dog"), 2, rel)
    proc = fresh("indexer.verify_cli", str(index))
    assert proc.returncode == 1 and rel in proc.stdout


# ------------------------------------------------------------------ in-process details
def test_manifest_records_every_file(index):
    m = Manifest.read(index)
    assert sorted(m.files) == sorted([f for f in FILES if f != MANIFEST] + STORED)
    for rel, rec in m.files.items():
        assert rec == {"size": (index / rel).stat().st_size, CHECKSUM: file_checksum(index / rel)}
    assert m.checksum == json_checksum({k: v for k, v in json.loads((index / MANIFEST).read_text()).items() if k != "checksum"})


def test_load_checks_sizes_always_and_checksums_on_request(index, tiny_embedder):
    flip(index / "postings_weights.npy")  # same size: only a checksum sees it
    Retriever.load(index, embedder=_matching(tiny_embedder, index))
    with pytest.raises(IndexFormatError, match=r"postings_weights\.npy: xxh3_64 checksum .* \(content changed\)"):
        Retriever.load(index, embedder=_matching(tiny_embedder, index), verify=True)
    truncate(index / "postings_weights.npy")
    with pytest.raises(IndexFormatError, match=r"postings_weights\.npy: \d+ bytes, manifest.json records \d+"):
        Retriever.load(index, embedder=_matching(tiny_embedder, index))


def _matching(embedder, index: Path):
    """The tiny embedder under the identity the CLI-built index recorded (a directory model)."""
    embedder.identity = Manifest.read(index).model
    return embedder


def test_verify_index_lists_every_problem_one_line_each(index, capsys):
    truncate(index / "postings_docs.npy")
    flip(index / "dense.faiss")
    empty(index / "lexical/bm25.json")
    assert verify_cli.main([str(index)]) == 1
    out = capsys.readouterr().out.splitlines()
    for name in ("postings_docs.npy", "dense.faiss", "bm25.json"):
        assert any(name in line for line in out), (name, out)
    assert all(line.startswith(str(index)) for line in out)


def test_verify_index_exit_codes(index, tmp_path, capsys):
    assert verify_cli.main([str(index)]) == 0
    assert verify_cli.main([str(tmp_path / "nowhere")]) == 2
    (tmp_path / "empty").mkdir()
    assert verify_cli.main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and "not an index" in err


def test_verify_index_notes_an_index_without_checksums(index, capsys):
    data = json.loads((index / MANIFEST).read_text())
    del data["files"], data["checksum"]
    (index / MANIFEST).write_text(json.dumps(data))
    assert verify_cli.main([str(index)]) == 0
    assert "no checksums recorded" in capsys.readouterr().out


def test_hand_edited_manifest_loads_but_fails_verification(index, tiny_embedder, capsys):
    data = json.loads((index / MANIFEST).read_text())
    data["created"] = "2000-01-01T00:00:00+00:00"
    (index / MANIFEST).write_text(json.dumps(data, indent=4))
    Retriever.load(index, embedder=_matching(tiny_embedder, index))  # hand edits are tolerated on load
    assert verify_cli.main([str(index)]) == 1
    assert "manifest.json: xxh3_64 checksum" in capsys.readouterr().out
    with pytest.raises(IndexFormatError, match="manifest.json"):
        Retriever.load(index, embedder=_matching(tiny_embedder, index), verify=True)


def test_reindenting_the_manifest_changes_nothing(index, capsys):
    data = json.loads((index / MANIFEST).read_text())
    (index / MANIFEST).write_text(json.dumps(data, indent=1, sort_keys=True))
    assert verify_cli.main([str(index)]) == 0


def test_pickled_npy_is_refused_without_unpickling(index, tmp_path, tiny_embedder):
    """A .npy holding a pickled object array would run code on np.load(allow_pickle=True)."""
    marker = tmp_path / "unpickled"
    payload = np.empty(1, dtype=object)
    payload[0] = _Boom(str(marker))
    np.save(index / "postings_weights.npy", payload, allow_pickle=True)
    with pytest.raises(IndexFormatError, match="postings_weights.npy"):
        Retriever.load(index, embedder=_matching(tiny_embedder, index))
    assert not marker.exists()


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_no_code_path_unpickles_or_runs_remote_code():
    """Static guard: torch.load only with weights_only=True, no pickle, no allow_pickle=True,
    no trust_remote_code anywhere in the packages."""
    offenders = []
    for package in ("embedder", "indexer", "retriever", "training", "benchmarks", "experiments"):
        for path in (REPO / package).rglob("*.py"):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#")[0]
                if ("torch.load(" in code and "weights_only=True" not in code) or "allow_pickle=True" in code \
                        or "trust_remote_code=True" in code or "import pickle" in code or "pickle.load" in code:
                    offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_export_records_checksums_and_verifies(index, tmp_path, capsys, tiny_tokenizer):
    from indexer.exports.lucene import EXPORT_MANIFEST, export_pyserini, vocabulary_strings

    assert verify.EXPORT_MANIFEST == EXPORT_MANIFEST
    vocab = Manifest.read(index).record("sparse")["vocab_size"]
    out = tmp_path / "export"
    info = export_pyserini(index, out, tokens=vocabulary_strings(tiny_tokenizer, vocab), build_lucene=False, progress=False)
    assert sorted(info["files"]) == ["collection/docs.jsonl", "token_map.json"]
    assert verify_cli.main([str(out)]) == 0
    flip(out / "collection" / "docs.jsonl")
    assert verify_cli.main([str(out)]) == 1
    assert "docs.jsonl: xxh3_64 checksum" in capsys.readouterr().out


def test_fork_server_reports_signals_and_tracebacks(cli):
    """The matrix above would pass vacuously if a crash did not show: it does, as -signal."""
    assert cli.run("_crash_cli").returncode == -11
    proc = cli.run("indexer.verify_cli", "--no-such-option")
    assert proc.returncode == 2 and "usage:" in proc.stderr
