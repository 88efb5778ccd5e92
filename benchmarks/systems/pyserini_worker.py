"""Pyserini (Lucene BM25) in its own process, driven over a pipe by ``PyseriniBM25``.

Why a separate process: a JVM started inside a process that also runs torch crashed
there (SIGSEGV in ``at::autocast::clear_cache`` after ~17 minutes, reported by the JVM's
signal handler; see hs_err logs). Keeping the JVM away from torch removes that risk and
keeps Lucene's threads and heap out of the other systems' timings.

Protocol: one JSON object per line on stdin, one JSON answer per line on the original
stdout; everything else the JVM or Python prints goes to stderr. Timings are taken here,
around the Lucene calls only, so the pipe's round trip is never counted.

    -> {"cmd": "index", "docs": "corpus.jsonl", "index": "DIR", "threads": 1}
    <- {"ok": true, "seconds": s, "n_docs": n}
    -> {"cmd": "search", "queries": ["..."], "k": 100, "k1": 0.9, "b": 0.4}
    <- {"ok": true, "hits": [[[docid, score], ...], ...], "seconds": [s, ...]}
    -> {"cmd": "info"}  <- {"ok": true, "pyserini": "...", "java": "..."}
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # the JVM's and Python's own prints go to stderr, never into the protocol
    sys.stdout = sys.stderr

    def answer(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    t0 = time.perf_counter()
    try:
        from indexer.exports.lucene_jvm import import_pyserini, java_version

        lucene = import_pyserini()
        from pyserini.index.lucene import LuceneIndexer
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises a clear error
        answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    answer({"ok": True, "load_seconds": time.perf_counter() - t0})

    searcher = None
    searcher_dir = None
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            cmd = req["cmd"]
            if cmd == "quit":
                break
            if cmd == "info":
                import importlib.metadata

                answer({"ok": True, "pyserini": importlib.metadata.version("pyserini"), "java": java_version()})
            elif cmd == "index":
                with open(req["docs"], encoding="utf-8") as f:
                    docs = [json.loads(x) for x in f if x.strip()]
                if searcher is not None:
                    searcher.close()
                    searcher = None
                start = time.perf_counter()
                indexer = LuceneIndexer(req["index"], threads=int(req.get("threads", 1)))
                for i in range(0, len(docs), 1000):  # batches keep the Python <-> JVM crossings few
                    indexer.add_batch_dict(docs[i : i + 1000])
                indexer.close()
                seconds = time.perf_counter() - start
                searcher = lucene.LuceneSearcher(req["index"])
                searcher_dir = req["index"]
                answer({"ok": True, "seconds": seconds, "n_docs": int(searcher.num_docs), "index": searcher_dir})
            elif cmd == "search":
                if searcher is None:
                    raise RuntimeError("no index: send 'index' first")
                searcher.set_bm25(float(req.get("k1", 0.9)), float(req.get("b", 0.4)))
                k = int(req["k"])
                hits, secs = [], []
                for q in req["queries"]:
                    start = time.perf_counter()
                    found = [[h.docid, float(h.score)] for h in searcher.search(q, k)]
                    secs.append(time.perf_counter() - start)
                    hits.append(found)
                answer({"ok": True, "hits": hits, "seconds": secs})
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    if searcher is not None:
        searcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
