"""No operation on one index destroys another (issue 48, items 1 and 2).

An index ``NAME`` is a link to its generation ``.NAME.gen-N``. Users copy (``cp -a``), link
(``ln -s``) and move indexes; rebuilding the copy must leave the original whole, and a build
never reuses a generation number while any trace of it is left. Each case: the original still
verifies and answers the same.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from indexer.build import build_index
from indexer.verify import verify
from retriever.retriever import Retriever

ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
QUERY = "alpha"


def answers(index: Path, embedder) -> list[tuple[str, float]]:
    with Retriever.load(index, embedder=embedder, warm=False) as r:
        return [(h.doc_id, round(h.score, 6)) for h in r.search(QUERY, k=5, mode="sparse")]


def intact(index: Path, embedder, before: list) -> None:
    report = verify(index)
    assert report.ok, report.problems
    assert answers(index, embedder) == before


@pytest.fixture
def orig(tmp_path, tiny_embedder, make_corpus) -> Path:
    index = tmp_path / "orig"
    build_index(make_corpus(n=12), index, tiny_embedder, top_k=8, progress=False)
    return index


def old_layout(index: Path) -> Path:
    """The same index as a directory of files (the layout before generations)."""
    flat = index.parent / "flat"
    shutil.copytree(os.path.realpath(index), flat)
    return flat


@pytest.mark.parametrize("how", ["cp -a", "ln -s relative", "ln -s absolute", "link to old layout", "mv"])
def test_rebuilding_a_copy_or_link_leaves_the_original_whole(tmp_path, tiny_embedder, make_corpus, orig, how):
    before = answers(orig, tiny_embedder)
    mine = tmp_path / "mine"
    original = orig
    if how == "cp -a":
        subprocess.run(["cp", "-a", str(orig), str(mine)], check=True)
    elif how == "ln -s relative":
        mine.symlink_to("orig")
    elif how == "ln -s absolute":
        mine.symlink_to(orig)
    elif how == "link to old layout":
        original = old_layout(orig)
        mine.symlink_to(original.name)
    else:  # mv: the link moves, the generation it names stays where it was
        os.rename(orig, mine)
    build_index(make_corpus(n=9, seed=3), mine, tiny_embedder, top_k=8, overwrite=True, progress=False)
    assert len(Retriever.load(mine, embedder=tiny_embedder, warm=False).doc_ids) == 9
    if how == "mv":
        original = tmp_path / "restored"
        original.symlink_to(f".{orig.name}.gen-000001")  # what mv left of the original is whole
    intact(original, tiny_embedder, before)
    # the copy got a generation of its own, named for it
    assert os.path.basename(os.readlink(mine)).startswith(".mine.gen-")


def test_a_copy_beside_the_original_survives_the_originals_rebuild(tmp_path, tiny_embedder, make_corpus, orig):
    before = answers(orig, tiny_embedder)
    backup = tmp_path / "backup"
    subprocess.run(["cp", "-a", str(orig), str(backup)], check=True)  # a link to orig's generation
    build_index(make_corpus(n=9, seed=3), orig, tiny_embedder, top_k=8, overwrite=True, progress=False)
    build_index(make_corpus(n=7, seed=4), orig, tiny_embedder, top_k=8, overwrite=True, progress=False)  # sweeps too
    intact(backup, tiny_embedder, before)
    assert len(Retriever.load(orig, embedder=tiny_embedder, warm=False).doc_ids) == 7


def test_a_removed_generation_is_reported_and_rebuilt_under_a_new_number(tmp_path, tiny_embedder, make_corpus, orig):
    gen = tmp_path / os.readlink(orig)
    shutil.rmtree(gen)
    from indexer.manifest import IndexFormatError

    with pytest.raises(IndexFormatError, match=r"dangling: its generation \.orig\.gen-000001 is missing; rebuild it with --overwrite"):
        Retriever.load(orig, embedder=tiny_embedder, warm=False)
    build_index(make_corpus(n=9, seed=3), orig, tiny_embedder, top_k=8, overwrite=True, progress=False)
    assert os.readlink(orig) == ".orig.gen-000002"  # never the number the missing one had
    assert verify(orig).ok
    assert len(Retriever.load(orig, embedder=tiny_embedder, warm=False).doc_ids) == 9


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=ENV, check=False, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_a_dangling_index_is_one_line_from_each_command(tmp_path, orig, tiny_model_dir):
    shutil.rmtree(tmp_path / os.readlink(orig))
    proc = run_cli("indexer.verify_cli", str(orig))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"verify-index: error: {orig}: the index is dangling: its generation .orig.gen-000001 is missing; rebuild it with --overwrite"
    ]
    proc = run_cli("retriever.cli", "--index", str(orig), "--model", str(tiny_model_dir), QUERY)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "generation .orig.gen-000001 is missing" in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr


def test_cli_rebuild_of_a_copy_keeps_the_original(tmp_path, tiny_embedder, make_corpus, orig, tiny_model_dir):
    """The issue's reproduction through the command line."""
    before = answers(orig, tiny_embedder)
    mine = tmp_path / "mine"
    subprocess.run(["cp", "-a", str(orig), str(mine)], check=True)
    proc = run_cli("indexer.cli", "--corpus", str(make_corpus(n=9, seed=3)), "--index", str(mine), "--model",
                   str(tiny_model_dir), "--adapter", "none", "--top-k", "8", "--quiet", "--overwrite")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    intact(orig, tiny_embedder, before)
