"""What validating an index costs beside loading it: ``python -m experiments.load_cost --index DIR``.

Times, best of ``--repeat`` runs with the files in the page cache:
- *load*: ``Retriever.load(DIR, warm=False, query_encoder=Q)`` end to end (manifest, checks,
  channels, the model; not the warm-up query that a default load also runs), for each query
  encoder Q of ``--query-encoders`` (with "none" only the LLM's tokenizer is loaded);
- *validation*: the checks that load always runs, timed alone (recorded sizes, doc ids, and
  every channel opened by its row's validating reader, indexer/channels.py: the CSR invariants
  of every posting file, FAISS count/dim/unit vectors, BM25 parameters and term ids; the files
  are memory-mapped, FAISS indexes read, from the page cache);
- *checksums*: what ``verify=True`` adds (every byte of every file through xxh3_64).
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from indexer.integrity import check_doc_ids, check_files
from indexer.manifest import DOC_IDS, Manifest
from indexer.verify import open_channels


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def validation(index_dir: Path, manifest: Manifest) -> None:
    """Every check Retriever.load runs: recorded sizes, doc ids, and each channel opened by its
    row's validating reader (indexer/channels.py) from the files already in the page cache."""
    check_files(index_dir, manifest)
    check_doc_ids(index_dir / DOC_IDS, manifest.n_docs)
    open_channels(index_dir, manifest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.load_cost", description=__doc__.split("\n")[0])
    p.add_argument("--index", required=True, type=Path)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--query-encoders", default="auto", help="comma-separated Retriever query encoders to time the load with (default auto)")
    args = p.parse_args(argv)
    from retriever.retriever import Retriever

    manifest = Manifest.read(args.index)
    channels = open_channels(args.index, manifest)
    check = best_of(args.repeat, lambda: validation(args.index, manifest))
    sums = best_of(args.repeat, lambda: check_files(args.index, manifest, checksums=True))
    size = sum(rec["size"] for rec in (manifest.files or {}).values())
    for choice in args.query_encoders.split(","):
        Retriever.load(args.index, query_encoder=choice)  # warm-up: page cache, model files, imports, the runtime's export
        # warm=False: the load itself, without the first query that Retriever.load runs by default
        load = best_of(args.repeat, lambda c=choice: Retriever.load(args.index, warm=False, query_encoder=c))
        row = {
            "index": str(args.index),
            "query_encoder": choice,
            "n_docs": manifest.n_docs,
            "postings": int(channels["sparse"].docs.shape[0]),
            "bytes": size,
            "load_s": round(load, 4),
            "validation_s": round(check, 5),
            "validation_pct_of_load": round(100 * check / load, 2),
            "checksums_s": round(sums, 5),
            "checksums_pct_of_load": round(100 * sums / load, 2),
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
