"""What an in-place update costs, and that it gives the index a rebuild gives:
``python -m benchmarks.studies.update_cost --data ../shared/data/adi --out benchmarks/results/update-cost``.

On one collection, with the default model and channels (build-index's defaults):
1. build the index of the collection less its last ``--add-fraction`` of documents;
2. update it (indexer/updates.py): add those documents, replace ``--replace`` documents by
   an edited text (their words reversed) and delete ``--delete`` others;
3. build the final corpus from scratch (the same documents in the same order);
4. for every query of the collection and every channel (and hybrid), compare the updated
   index's top-10 with the rebuilt one's: ids and scores.

Reports the seconds of each step (documents per second added, the merge), and the number of
queries whose top-10 ids differ per channel with the largest score difference. The queries
and judgments are never used to choose anything: they are only searched.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import git_commit, load_avg, machine_info
from indexer.build import build_index
from indexer.channel_set import build_options, default_channels
from indexer.corpus import CorpusSpec, Document, join_title, read_queries
from indexer.updates import update_index


def _reversed(doc: Document) -> Document:
    body = " ".join(reversed((doc.body or doc.text).split()))
    return Document(doc.doc_id, join_title(doc.title, body), doc.title, body, doc.metadata)


def _write(docs: list[Document], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": d.doc_id, **({"title": d.title} if d.title else {}), "text": d.body or d.text}) + "\n" for d in docs)
    return path


def compare(updated: Path, rebuilt: Path, queries: list[str], k: int = 10) -> dict:
    """Per mode: queries whose top-k ids differ, and the largest |score difference| over the
    hits both give at the same rank."""
    from retriever.retriever import Retriever

    out = {}
    with Retriever.load(updated, query_encoder="llm", warm=False) as a, Retriever.load(rebuilt, query_encoder="llm", warm=False) as b:
        if a.doc_ids != b.doc_ids:
            raise AssertionError("updated and rebuilt indexes hold different documents")
        for mode in a.modes:
            ra, rb = a.batch_search(queries, k=k, mode=mode), b.batch_search(queries, k=k, mode=mode)
            differ = sum([h.doc_id for h in x] != [h.doc_id for h in y] for x, y in zip(ra, rb))
            pairs = [(h.score, g.score) for x, y in zip(ra, rb) for h, g in zip(x, y)]
            out[mode] = {
                "queries": len(queries), "top10_ids_differ": differ,
                "max_abs_score_diff": float(max((abs(s - t) for s, t in pairs), default=0.0)),
                # float32 sums of thousands: an absolute bound alone would ask for more than float32 holds
                "max_rel_score_diff": float(max((abs(s - t) / max(abs(t), 1e-9) for s, t in pairs), default=0.0)),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.update_cost", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, help="a BEIR folder (corpus.jsonl, queries.jsonl)")
    p.add_argument("--add-fraction", type=float, default=0.1)
    p.add_argument("--replace", type=int, default=5)
    p.add_argument("--delete", type=int, default=5)
    p.add_argument("--work", type=Path, help="where the indexes are built (default: a temporary folder, removed)")
    p.add_argument("--out", required=True, type=Path, help="folder for <collection>.json")
    args = p.parse_args(argv)
    docs = list(CorpusSpec(args.data))
    n_add = max(1, int(len(docs) * args.add_fraction))
    initial, added = docs[:-n_add], docs[-n_add:]
    replaced = [_reversed(d) for d in initial[: args.replace]]
    deleted = [d.doc_id for d in initial[args.replace: args.replace + args.delete]]
    gone = set(deleted) | {d.doc_id for d in replaced}
    final = [d for d in initial if d.doc_id not in gone] + replaced + added
    queries = list(read_queries(args.data / "queries.jsonl").values())
    channels = default_channels()
    options = build_options(channels)
    work = Path(tempfile.mkdtemp(prefix="update-cost-")) if args.work is None else args.work
    work.mkdir(parents=True, exist_ok=True)
    try:
        from embedder.encoder import Embedder
        from embedder.sentence_encoder import SentenceEncoder

        embedder = Embedder.load("smollm2-135m")
        encoder = SentenceEncoder.load(options["encoder"]) if "encoder" in options else None
        build_kwargs = {k: v for k, v in options.items() if k != "encoder"}
        t0 = time.perf_counter()
        build_index(_write(initial, work / "initial.jsonl"), work / "updated", embedder, encoder=encoder, overwrite=True, progress=False, **build_kwargs)
        initial_build = time.perf_counter() - t0
        report = update_index(work / "updated", add=replaced + added, delete=deleted, embedder=embedder, encoder=encoder, progress=False)
        t0 = time.perf_counter()
        build_index(_write(final, work / "final.jsonl"), work / "rebuilt", embedder, encoder=encoder, overwrite=True, progress=False, **build_kwargs)
        rebuild = time.perf_counter() - t0
        same = compare(work / "updated", work / "rebuilt", queries)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "kind": "update_cost", "collection": args.data.name, "command": "python -m benchmarks.studies.update_cost " + " ".join(argv or []),
        "machine": machine_info(), "commit": git_commit(), "load_avg_start": load_avg(), "channels": list(channels),
        "runtime": embedder.runtime_summary(),
        "documents": {"initial": len(initial), "added": len(added), "replaced": len(replaced), "deleted": len(deleted), "final": len(final)},
        "seconds": {"initial_build": round(initial_build, 2), "update": report.seconds, "update_encode": report.encode_seconds,
                    "update_write": report.merge_seconds, "full_rebuild": round(rebuild, 2)},
        "added_docs_per_s": round((len(added) + len(replaced)) / max(report.encode_seconds, 1e-9), 1),
        "update_vs_rebuild": round(report.seconds / max(rebuild, 1e-9), 3),
        "same_as_rebuild": same,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.data.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("documents", "seconds", "added_docs_per_s", "update_vs_rebuild", "same_as_rebuild")}, indent=2))
    print(f"wrote {path}")
    return 0 if all(v["top10_ids_differ"] == 0 for v in same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
