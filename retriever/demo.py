"""``make demo``: index a corpus that exists on every machine and show what the engine finds.

The index is what ``build-index`` builds with no flags (the best measured channel set); the
hits are hybrid, with the words that matched and each channel's share of the score; the demo
ends with the ``serve`` command that puts the index behind the search page.

With no ``--corpus``, the corpus is the docstrings of the Python standard library, generated
on the fly (one document per module, class and function docstring). The index is cached in
``.cache/demo`` and rebuilt only when the corpus or model changes.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from indexer.manifest import IndexFormatError

STDLIB_MODULES = ["argparse", "base64", "bisect", "bz2", "calendar", "collections", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch", "fractions", "functools", "getpass", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http.client", "inspect", "io", "ipaddress", "itertools", "json", "locale", "logging", "lzma", "math", "mimetypes", "os", "os.path", "pathlib", "pickle", "platform", "pprint", "queue", "random", "re", "sched", "secrets", "shutil", "signal", "smtplib", "socket", "sqlite3", "ssl", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "traceback", "typing", "unicodedata", "urllib.parse", "urllib.request", "uuid", "warnings", "weakref", "xml.etree.ElementTree", "zipfile", "zlib"]

QUERIES = (
    "compress a file with gzip",
    "parse command line options",
    "read rows from a spreadsheet in comma separated format",
    "run an external program and capture its output",
    "compute the average and standard deviation of numbers",
    "generate a secure random password",
)


def stdlib_docstrings(limit: int) -> list[dict]:
    """One document per docstring of a few dozen standard-library modules and their members."""
    docs: list[dict] = []
    seen: set[str] = set()
    for name in STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a module missing on this platform is simply left out
            continue
        members = [(name, module)] + [
            (f"{name}.{attr}", obj)
            for attr, obj in sorted(vars(module).items())
            if not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj))
        ]
        for doc_id, obj in members:
            text = inspect.getdoc(obj) or ""
            paragraph = " ".join(text.split("\n\n")[0].split())
            if len(paragraph) < 40 or doc_id in seen or paragraph in seen:
                continue
            seen.update((doc_id, paragraph))
            docs.append({"_id": doc_id, "title": doc_id, "text": paragraph[:600]})
    # Round-robin over modules would be fairer, but a stable prefix keeps the demo reproducible.
    step = max(1, len(docs) // limit)
    return docs[::step][:limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__)
    p.add_argument("--corpus", type=Path, help="your own corpus (BEIR folder, .jsonl or .tsv) instead of the stdlib docstrings")
    p.add_argument("--limit", type=int, default=600, help="stdlib documents to index")
    p.add_argument("--cache", type=Path, default=Path(".cache/demo"))
    p.add_argument("queries", nargs="*", help="queries to run (default: a few about the standard library)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from embedder.encoder import Embedder
    from indexer import channel_set
    from indexer.build import build_index
    from indexer.channels import sentence_encoder_specs
    from retriever.quiet import quiet_libraries
    from retriever.retriever import Retriever

    args.cache.mkdir(parents=True, exist_ok=True)
    if args.corpus is None:
        docs = stdlib_docstrings(args.limit)
        corpus = args.cache / "stdlib_docstrings.jsonl"
        fd, tmp = tempfile.mkstemp(dir=args.cache)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
        os.replace(tmp, corpus)
        queries = args.queries or list(QUERIES)
        print(f"corpus: {len(docs)} docstrings of the Python {sys.version.split()[0]} standard library -> {corpus}")
    else:
        corpus = args.corpus
        queries = args.queries or [line.strip() for line in sys.stdin if line.strip()]
    key = hashlib.sha256(Path(corpus).resolve().as_posix().encode() + (Path(corpus).read_bytes() if Path(corpus).is_file() else b"")).hexdigest()[:12]
    # what build-index --profile fast builds (the demo searches fast; best's mpnet costs ~5x MiniLM a document)
    channels, settings, _ = channel_set.resolve(None, profile="fast")
    index_dir = args.cache / f"index-{key}-{'-'.join(channels)}"
    embedder = Embedder.load()
    print(embedder.runtime_summary())
    try:
        with quiet_libraries():
            retriever = Retriever.load(index_dir, embedder=embedder)
        print(f"index: reusing {index_dir}")
    except IndexFormatError:
        print(channel_set.describe(channels, settings) + " (build-index --profile fast's)")
        models = dict(settings)
        if sentence_encoder_specs(models):
            from embedder.sentence_encoder import SentenceEncoder

            models |= {s.mode: SentenceEncoder.load(models[s.mode]) for s in sentence_encoder_specs(models)}
        m = build_index(corpus, index_dir, embedder, channels=models, overwrite=True, sparse="sparse" in channels)
        print(f"index: built {index_dir}: {m.n_docs} docs in {m.build['seconds']:.1f} s ({m.n_docs / max(m.build['seconds'], 1e-9):.1f} docs/s)")
        with quiet_libraries():
            retriever = Retriever.load(index_dir, embedder=embedder, encoders={s.mode: models[s.mode] for s in sentence_encoder_specs(models)})
    print(f"search: {retriever.describe_mode()}; fusion: {retriever.fusion_source}")
    with quiet_libraries():
        results = retriever.batch_search(queries, k=3)
    for q, hits in zip(queries, results):
        print(f"\nquery: {q}")
        for rank, h in enumerate(hits, 1):
            words = ", ".join(list(h.matched_tokens)[:6])
            shares = "  ".join(f"{c} {v / h.score:.0%}" for c, v in sorted(h.channels.items(), key=lambda cv: -cv[1])) if h.score else ""
            print(f"  {rank}. {h.doc_id:<32} score {h.score:.3f}   [{shares}]")
            print(f"     matched: {words}")
    serve = Path(sys.executable).parent / "serve"
    command = f"{os.path.relpath(serve) if serve.exists() else 'serve'} {os.path.relpath(index_dir)}"
    print(f"\nnext: serve it, then open http://127.0.0.1:8000/ (search page) or try the API:\n  {command}")
    print("""  curl -s localhost:8000/search -H 'Content-Type: application/json' -d '{"query": "parse command line options", "k": 3}'""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
