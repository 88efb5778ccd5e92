"""What an in-place update costs, and that it gives the index a rebuild gives:
``python -m experiments.update_cost --data ../shared/data/adi --data ../shared/data/cisi --out benchmarks/results/update-cost.json``.

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
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import load_avg
from benchmarks.tables import study_command, table_header
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


def measure(data: Path, add_fraction: float, n_replace: int, n_delete: int, work: Path, embedder, encoder, options: dict) -> dict:
    """One collection: build, update, rebuild, compare (see the module docstring)."""
    docs = list(CorpusSpec(data))
    n_add = max(1, int(len(docs) * add_fraction))
    initial, added = docs[:-n_add], docs[-n_add:]
    replaced = [_reversed(d) for d in initial[:n_replace]]
    deleted = [d.doc_id for d in initial[n_replace: n_replace + n_delete]]
    gone = set(deleted) | {d.doc_id for d in replaced}
    final = [d for d in initial if d.doc_id not in gone] + replaced + added
    queries = list(read_queries(data / "queries.jsonl").values())
    build_kwargs = {k: v for k, v in options.items() if k != "encoder"}
    t0 = time.perf_counter()
    build_index(_write(initial, work / "initial.jsonl"), work / "updated", embedder, encoder=encoder, overwrite=True, progress=False, **build_kwargs)
    initial_build = time.perf_counter() - t0
    report = update_index(work / "updated", add=replaced + added, delete=deleted, embedder=embedder, encoder=encoder, progress=False)
    t0 = time.perf_counter()
    build_index(_write(final, work / "final.jsonl"), work / "rebuilt", embedder, encoder=encoder, overwrite=True, progress=False, **build_kwargs)
    rebuild = time.perf_counter() - t0
    return {
        "documents": {"initial": len(initial), "added": len(added), "replaced": len(replaced), "deleted": len(deleted), "final": len(final)},
        "seconds": {"initial_build": round(initial_build, 2), "update": report.seconds, "update_encode": report.encode_seconds,
                    "update_write": report.merge_seconds, "full_rebuild": round(rebuild, 2)},
        "added_docs_per_s": round((len(added) + len(replaced)) / max(report.encode_seconds, 1e-9), 1),
        "build_docs_per_s": round(len(final) / max(rebuild, 1e-9), 1),
        "update_vs_rebuild": round(report.seconds / max(rebuild, 1e-9), 3),
        "same_as_rebuild": compare(work / "updated", work / "rebuilt", queries),
    }


def measure_existing(index: Path, n: int, work: Path, embedder, encoder) -> dict:
    """The cost alone of one update of a copy of a built ``index``: ``n`` new documents (copies of
    its first ``n`` with their words reversed, under new ids) added and ``n`` others deleted."""
    from indexer.manifest import Manifest
    from indexer.stored_documents import StoredDocuments

    copy = work / "index"
    shutil.copytree(os.path.realpath(index), copy)
    m = Manifest.read(copy)
    stored = StoredDocuments.open(copy, m.n_docs)
    fresh = [_reversed(stored.document(i)) for i in range(n)]
    fresh = [Document(f"{d.doc_id}-copy", d.text, d.title, d.body, d.metadata) for d in fresh]
    delete = [stored.record(i)["_id"] for i in range(n, 2 * n)]
    report = update_index(copy, add=fresh, delete=delete, embedder=embedder, encoder=encoder, progress=False)
    return {"documents": {"initial": m.n_docs, "added": n, "replaced": 0, "deleted": n, "final": report.n_docs},
            "seconds": {"update": report.seconds, "update_encode": report.encode_seconds, "update_write": report.merge_seconds},
            "added_docs_per_s": round(n / max(report.encode_seconds, 1e-9), 1),
            "index_bytes": sum(p.stat().st_size for p in Path(os.path.realpath(copy)).rglob("*") if p.is_file())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.update_cost", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, action="append", default=[], help="a BEIR folder (corpus.jsonl, queries.jsonl); repeatable")
    p.add_argument("--add-fraction", type=float, default=0.1)
    p.add_argument("--replace", type=int, default=5)
    p.add_argument("--delete", type=int, default=5)
    p.add_argument("--existing", type=Path, action="append", default=[],
                   help="also time one update (--n added, --n deleted) of a copy of this built index (default model and channels); repeatable")
    p.add_argument("--n", type=int, default=50, help="documents added and deleted in an --existing update")
    p.add_argument("--out", required=True, type=Path, help="the table's JSON file (beir-eval report renders it)")
    args = p.parse_args(argv)
    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder

    channels = default_channels()
    options = build_options(channels)
    load_start = load_avg()
    embedder = Embedder.load("smollm2-135m")
    encoder = SentenceEncoder.load(options["encoder"]) if "encoder" in options else None
    results = {}
    for data in args.data:
        work = Path(tempfile.mkdtemp(prefix="update-cost-"))
        try:
            results[data.name] = measure(data, args.add_fraction, args.replace, args.delete, work, embedder, encoder, options)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(data.name, json.dumps(results[data.name]), flush=True)
    existing = {}
    for index in args.existing:
        work = Path(tempfile.mkdtemp(prefix="update-cost-"))
        try:
            existing[str(index)] = measure_existing(index, args.n, work, embedder, encoder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(index, json.dumps(existing[str(index)]), flush=True)
    rows = []
    for name, r in existing.items():
        d, sec = r["documents"], r["seconds"]
        rows.append([f"`{name}` (built before; {r['index_bytes'] / 1e6:.0f} MB after)", f"{d['initial']} + {d['added']} added, {d['deleted']} deleted",
                     "–", f"{sec['update']} ({sec['update_encode']} + {sec['update_write']})", "–", r["added_docs_per_s"], "–", "–", "–"])
    for name, r in results.items():
        d, sec, same = r["documents"], r["seconds"], r["same_as_rebuild"]
        rows.append([
            name, f"{d['initial']} + {d['added']} added, {d['replaced']} replaced, {d['deleted']} deleted", sec["full_rebuild"],
            f"{sec['update']} ({sec['update_encode']} + {sec['update_write']})", r["update_vs_rebuild"], r["added_docs_per_s"], r["build_docs_per_s"],
            f"{sum(v['top10_ids_differ'] for v in same.values())} / {sum(v['queries'] for v in same.values())}",
            f"{max(v['max_rel_score_diff'] for v in same.values()):.1e}",
        ])
    table = {
        **table_header(),
        "title": "Updating an index in place: cost, and equality with a rebuild",
        "command": study_command("experiments.update_cost", argv),
        "description": (
            f"Each collection: the default index (channels {', '.join(channels)}; {embedder.runtime_summary()}) of all but its last "
            f"{args.add_fraction:.0%} of documents, then one `update_index` adding them, replacing {args.replace} documents by their words "
            f"reversed and deleting {args.delete}, against `build_index` of the final corpus from scratch. Seconds on the machine named "
            f"below (load average at the start {load_start}); the update's are encoding + writing. Equality: for every query of the "
            "collection and every channel and hybrid, queries whose top-10 ids differ between the updated and the rebuilt index (of "
            "queries x modes), and the largest relative score difference (float32 sums of aligned-token logits are in the thousands: "
            "an absolute 1e-5 is below their resolution). Rows naming an index: one update of a copy of an index built before "
            f"({args.n} documents added, {args.n} deleted), its cost alone."
        ),
        "columns": ["collection", "documents", "rebuild s", "update s (encode + write)", "update / rebuild", "added docs/s", "rebuild docs/s",
                    "top-10 differ", "max rel. score diff"],
        "rows": rows, "details": {**results, **{f"existing:{k}": v for k, v in existing.items()}},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(v["top10_ids_differ"] == 0 for r in results.values() for v in r["same_as_rebuild"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
