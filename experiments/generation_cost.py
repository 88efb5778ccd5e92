"""What holding an index generation costs a load: ``python -m experiments.generation_cost --index DIR``.

Times, best of ``--repeat`` runs with the files in the page cache (no model is loaded):
- *by path*: the file-level load before issue 33 (manifest, recorded sizes, doc ids, every
  channel opened and checked, each file found by path);
- *held*: ``indexer.reader.open_index``, the same checks on one generation resolved once and held
  with a shared flock (what ``Retriever.load`` does now);
- *generation only*: resolving, opening, locking and re-checking the generation alone.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from indexer.generations import open_generation
from indexer.integrity import check_doc_ids, check_files
from indexer.manifest import DOC_IDS, Manifest
from indexer.reader import open_index
from indexer.verify import open_channels


def timings(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.generation_cost", description=__doc__.split("\n")[0])
    p.add_argument("--index", required=True, type=Path)
    p.add_argument("--repeat", type=int, default=100)
    args = p.parse_args(argv)
    target = args.index

    def by_path() -> None:
        m = Manifest.read(target)
        check_files(target, m)
        check_doc_ids(target / DOC_IDS, m.n_docs)
        open_channels(target, m)

    def held() -> None:
        open_index(target).close()

    def generation_only() -> None:
        g = open_generation(target)
        g.moved()
        g.close()

    for name, fn in (("by path (no generation held)", by_path), ("held generation (open_index)", held), ("generation only", generation_only)):
        best, median = timings(args.repeat, fn)
        print(f"{name:30s} best {best * 1e3:8.3f} ms  median {median * 1e3:8.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
