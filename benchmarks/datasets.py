"""Test collections for the benchmarks: BEIR folders, ir_datasets ids, the shared collections.

Every loader returns a :class:`Dataset` (documents as the engine reads them, queries,
graded qrels). Bad input is reported as :class:`indexer.corpus.CorpusError` naming the
file, line and field; a collection that cannot be had (unknown id, offline download) as
:class:`DatasetUnavailable` with what to do about it.
"""
from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import benchmarks  # also sets IR_DATASETS_HOME before ir_datasets can be imported
from indexer.corpus import CorpusError, CorpusSpec, Document, read_queries

log = logging.getLogger(__name__)


class DatasetUnavailable(RuntimeError):
    """A collection that cannot be loaded here (unknown name or id, no network...)."""


@dataclass
class Dataset:
    """One test collection, in memory.

    ``docs`` hold the text every system indexes (title and body joined by a space);
    ``qrels`` maps query id -> doc id -> graded relevance (> 0 is relevant); ``queries``
    keeps only the queries that have at least one relevant document (as BEIR does).
    """

    name: str
    source: str
    split: str
    docs: list[Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    sample: dict | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        """What a results file records about the collection."""
        return {
            "name": self.name,
            "source": self.source,
            "split": self.split,
            "n_docs": len(self.docs),
            "n_queries": len(self.queries),
            "n_qrels": sum(len(v) for v in self.qrels.values()),
            "sample": self.sample,
            "notes": self.notes,
        }

    def write_corpus(self, path: Path) -> Path:
        """Write the documents as JSONL (``_id``, ``text``) for the engine's indexer."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"_id": d.doc_id, "text": d.text}, ensure_ascii=False) + "\n" for d in self.docs)
        os.replace(tmp, path)
        return path


# --------------------------------------------------------------------- shared data
def shared_data_dir() -> Path:
    """The project's read-only test collections (``../shared/data`` beside the checkout,
    overridable with ``ALIGNED_TOKENS_DATA``). May not exist on a user's machine."""
    if os.environ.get("ALIGNED_TOKENS_DATA"):
        return Path(os.environ["ALIGNED_TOKENS_DATA"])
    return benchmarks.REPO_ROOT.parent / "shared" / "data"


def shared_collections(root: Path | None = None) -> list[str]:
    """Names of the BEIR-layout collections under the shared data folder (sorted)."""
    root = root or shared_data_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "corpus.jsonl").exists())


# ---------------------------------------------------------------------- BEIR folder
def load_beir_folder(path: str | os.PathLike[str], split: str = "test", name: str | None = None) -> Dataset:
    """Read a BEIR folder: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``."""
    root = Path(path)
    for needed in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (root / needed).exists():
            raise CorpusError(root / needed, None, None, f"missing: a BEIR folder needs corpus.jsonl, queries.jsonl and qrels/{split}.tsv")
    spec = CorpusSpec(root, fmt="beir")
    docs = list(spec)
    notes = [f"{spec.n_empty} documents with empty title and text left out"] if spec.n_empty else []
    queries = read_queries(root / "queries.jsonl")
    qrels = _read_qrels(root / "qrels" / f"{split}.tsv")
    return _finish(name or root.name, str(root.resolve()), split, docs, queries, qrels, notes)




def _read_qrels(file: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(file, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.rstrip("\r\n").split("\t")
            if not line.strip():
                continue
            if lineno == 1 and parts[0].strip().lower() in ("query-id", "query_id", "qid"):
                continue  # BEIR header
            if len(parts) == 4:  # TREC qrels: qid 0 docid rel
                parts = [parts[0], parts[2], parts[3]]
            if len(parts) != 3:
                raise CorpusError(file, lineno, None, f"expected query-id<TAB>corpus-id<TAB>score, got {len(parts)} column(s)")
            qid, did, score = (p.strip() for p in parts)
            if not qid:
                raise CorpusError(file, lineno, "query-id", "empty")
            if not did:
                raise CorpusError(file, lineno, "corpus-id", "empty")
            try:
                rel = int(float(score))
            except ValueError:
                raise CorpusError(file, lineno, "score", f"not a number: {score!r}") from None
            qrels.setdefault(qid, {})[did] = rel
    return qrels


def _finish(
    name: str, source: str, split: str, docs: list[Document], queries: dict[str, str], qrels: dict[str, dict[str, int]], notes: list[str]
) -> Dataset:
    """Keep judged queries only; say what was left out and why."""
    doc_ids = {d.doc_id for d in docs}
    unknown_docs = sum(1 for judged in qrels.values() for d in judged if d not in doc_ids)
    if unknown_docs:
        notes.append(f"{unknown_docs} qrels name documents absent from the corpus (kept: they count as missed)")
    missing_queries = sorted(q for q in qrels if q not in queries)
    if missing_queries:
        notes.append(f"{len(missing_queries)} judged queries absent from the queries file (dropped)")
    kept = {q: t for q, t in queries.items() if any(r > 0 for r in qrels.get(q, {}).values())}
    if not kept:
        raise DatasetUnavailable(f"{source}: no query has a relevant document in split {split!r}")
    kept_qrels = {q: qrels[q] for q in kept}
    if not docs:
        raise DatasetUnavailable(f"{source}: no documents")
    return Dataset(name, source, split, docs, kept, kept_qrels, notes=notes)


# ----------------------------------------------------------------------- ir_datasets
def load_ir_datasets(dataset_id: str) -> Dataset:
    """Load an ir_datasets id such as ``beir/scifact/test`` (downloads into IR_DATASETS_HOME).

    Offline, or for an unknown id, raises :class:`DatasetUnavailable` with what to do.
    """
    try:
        import ir_datasets
    except ImportError:
        raise DatasetUnavailable(f"{dataset_id!r} looks like an ir_datasets id, but ir_datasets is not installed (pip install ir_datasets)") from None
    try:
        ds = ir_datasets.load(dataset_id)
    except KeyError:
        raise DatasetUnavailable(
            f"unknown ir_datasets id {dataset_id!r} (and no such folder); see https://ir-datasets.com for ids, e.g. beir/scifact/test"
        ) from None
    missing = [what for what, has in (("docs", ds.has_docs()), ("queries", ds.has_queries()), ("qrels", ds.has_qrels())) if not has]
    if missing:
        raise DatasetUnavailable(f"ir_datasets id {dataset_id!r} has no {' or '.join(missing)}; name a split with qrels, e.g. beir/scifact/test")
    home = os.environ.get("IR_DATASETS_HOME", "~/.ir_datasets")
    try:
        docs = [Document(str(d.doc_id), _doc_text(d)) for d in ds.docs_iter()]
        queries = {str(q.query_id): _query_text(q) for q in ds.queries_iter()}
        qrels: dict[str, dict[str, int]] = {}
        for r in ds.qrels_iter():
            qrels.setdefault(str(r.query_id), {})[str(r.doc_id)] = int(r.relevance)
    except Exception as exc:  # noqa: BLE001 - ir_datasets downloads through requests/urllib/OSError...: all mean "could not get the files"
        raise DatasetUnavailable(
            f"could not get ir_datasets {dataset_id!r}: {type(exc).__name__}: {_first_line(exc)}. "
            f"Is this machine offline? ir_datasets downloads on first use into IR_DATASETS_HOME={home}; "
            "run once where the network allows (the cache is reused), or pass a BEIR folder to --data instead."
        ) from None
    n_empty = sum(1 for d in docs if not d.text.strip())
    docs = [d for d in docs if d.text.strip()]
    notes = [f"{n_empty} documents with empty text left out"] if n_empty else []
    parts = dataset_id.split("/")
    split = parts[-1] if len(parts) > 2 else "test"
    return _finish(dataset_id.replace("/", "-"), f"ir_datasets:{dataset_id}", split, docs, queries, qrels, notes)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _doc_text(doc) -> str:
    title = getattr(doc, "title", "") or ""
    text = getattr(doc, "text", None)
    if text is None:
        text = doc.default_text() if hasattr(doc, "default_text") else ""
        return text
    return f"{title} {text}".strip() if title else text


def _query_text(query) -> str:
    text = getattr(query, "text", None)
    if text is None and hasattr(query, "default_text"):
        text = query.default_text()
    return text or ""


# -------------------------------------------------------------------------- resolve
def resolve(spec: str, split: str = "test") -> list[Dataset]:
    """Turn a ``--data`` value into datasets.

    * a BEIR folder (holds corpus.jsonl) -> that collection;
    * a folder of BEIR folders (e.g. ``../shared/data``) -> each of them;
    * a name of a shared collection (``cisi``), or ``shared`` for all of them;
    * otherwise an ir_datasets id (``beir/scifact/test``).
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "corpus.jsonl").exists():
            return [load_beir_folder(path, split)]
        children = shared_collections(path)
        if children:
            return [load_beir_folder(path / c, split) for c in children]
        raise CorpusError(path, None, None, "neither a BEIR folder (corpus.jsonl, queries.jsonl, qrels/) nor a folder of them")
    shared = shared_data_dir()
    if spec == "shared":
        names = shared_collections(shared)
        if not names:
            raise DatasetUnavailable(f"no shared collections: {shared} is absent or empty (set ALIGNED_TOKENS_DATA)")
        return [load_beir_folder(shared / n, split) for n in names]
    if "/" not in spec and (shared / spec / "corpus.jsonl").exists():
        return [load_beir_folder(shared / spec, split)]
    if spec.startswith((".", "/", "~")) or path.exists():
        raise CorpusError(path, None, None, "no such folder")
    if "/" not in spec:
        known = ", ".join(shared_collections(shared)) or f"none: {shared} is absent"
        raise DatasetUnavailable(f"{spec!r}: not a folder, not a shared collection ({known}), not an ir_datasets id")
    return [load_ir_datasets(spec)]


# ------------------------------------------------------------------------- sampling
def sample(ds: Dataset, n_queries: int = 20, n_docs: int = 300, seed: int = 0) -> Dataset:
    """A small, still meaningful slice: ``n_queries`` random queries, every judged document
    of those queries, and random other documents up to ``n_docs`` in all.

    Keeping all judged documents keeps recall measurable; the random others are the
    distractors. Documents keep their corpus order.
    """
    rng = random.Random(seed)
    qids = sorted(ds.queries)
    chosen = sorted(rng.sample(qids, min(n_queries, len(qids))), key=qids.index)
    by_id = {d.doc_id: d for d in ds.docs}
    judged = {d for q in chosen for d in ds.qrels[q] if d in by_id}
    others = [d.doc_id for d in ds.docs if d.doc_id not in judged]
    extra = rng.sample(others, max(0, min(len(others), n_docs - len(judged))))
    keep = judged | set(extra)
    return Dataset(
        ds.name,
        ds.source,
        ds.split,
        [d for d in ds.docs if d.doc_id in keep],
        {q: ds.queries[q] for q in chosen},
        {q: ds.qrels[q] for q in chosen},
        sample={"n_queries": len(chosen), "n_docs": len(keep), "seed": seed, "of_queries": len(ds.queries), "of_docs": len(ds.docs)},
        notes=list(ds.notes),
    )
