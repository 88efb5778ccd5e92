"""Where a distilled hybrid query's time goes, each stage timed in place:
``python -m experiments.query_stages --index DIR --queries QUERIES.jsonl --out FILE.json``.

beir-eval reports one end-to-end time per query; this study splits it. For every query, in
turn: the whole query (``Retriever.encode`` + ``search_encoded(explain=False)``, the call
beir-eval times), then the same query again stage by stage, each stage right after the one
before it, so that every stage sees the caches the real path leaves it (after the sentence
encoder's forward has streamed its weights through them). The stages: the sentence encoder
(which bm25+minilm pays too), the student's LLM tokens and table rows, its head, the LM head's
top-M, the literal tokens, each fused channel's search, the fusion. The index must hold the
encoder channel and a student must exist for its adapter (what ``build-index`` builds by default).

``--profile fast`` times the default operating point instead (no query model: the sentence
encoder, the query's own tokens, each channel's search, the fusion, and the explanation of the
first 10 hits that ``search-index`` and the server show).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.provenance import git_commit, machine_info
from benchmarks.timing import latency_stats
from indexer.corpus import read_queries
from retriever.query import literal_ids
from retriever.retriever import FUSION_DEPTH, Retriever


class Laps:
    """Times consecutive stages: each call records the seconds since the previous one (or since
    it was made) under the stage's name, in :attr:`out`."""

    def __init__(self) -> None:
        self.out: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.out[name] = now - self._t
        self._t = now


def stage_times(r: Retriever, query: str, k: int) -> dict[str, float]:
    """Seconds per stage of one hybrid query through ``r`` (its distilled query encoder)."""
    from embedder.query_encoder import llm_token_ids

    student, lap = r.student, Laps()

    x = r.student_encoder.encode([query])
    lap("sentence encoder")
    ids, mask = llm_token_ids(student.teacher, [query], student.max_tokens)
    tokens = np.take(student.table.numpy(), ids, axis=0)  # as DistilledQueryEncoder.states gathers them
    lap("student tokens")
    h = student._compiled(np.ascontiguousarray(x, np.float32), tokens, mask)
    lap("student head")
    top, _ = r.student_head.top_tokens(h, r.expansion_m)
    lap("LM head top-M")
    lit = literal_ids(r.embedder, query, r.literal)
    toks = np.asarray(list(dict.fromkeys(lit + top[0].tolist())), np.int64)
    weights = r.token_idf[np.clip(toks, 0, len(r.token_idf) - 1)]
    lap("literal tokens")
    from retriever.query import EncodedQuery

    q = EncodedQuery(query, toks, weights, len(lit), h[0], encoder_embeddings={"encoder": x[0]}, query_encoder=student.name)
    channels = {}
    for m in r.channels_of("hybrid"):
        channels[m] = r.search_channel(q, m, FUSION_DEPTH)
        lap(f"search {m}")
    fused = r.fusion.fuse(channels, k)
    [r.doc_ids[f.doc] for f in fused]
    lap("fusion")
    return lap.out


def fast_stage_times(r: Retriever, query: str, k: int) -> dict[str, float]:
    """Seconds per stage of one hybrid query through ``r`` with no query model (the ``fast``
    profile, query_encoder "none"), then the explanation of its first 10 hits (what
    ``search-index`` and the server show; beir-eval's timing leaves it out)."""
    from retriever.query import EncodedQuery

    lap = Laps()

    x = r.encoder.encode([query])
    lap("sentence encoder")
    lit = np.asarray(literal_ids(r.embedder, query, r.literal), np.int64)
    q = EncodedQuery(query, lit, r.token_idf[np.clip(lit, 0, len(r.token_idf) - 1)], len(lit), np.zeros(0, np.float32),
                     encoder_embeddings={"encoder": x[0]}, query_encoder="none")
    lap("literal tokens")
    used, channels = r.channels_of("hybrid"), {}
    for m in used:
        channels[m] = r.search_channel(q, m, FUSION_DEPTH)
        lap(f"search {m}")
    fused = r.fusion.fuse(channels, k)
    [r.doc_ids[f.doc] for f in fused]
    lap("fusion")
    [r.explanations.hit(q, "hybrid", f.doc, f.score, True, used, f.contributions) for f in fused[:10]]
    lap("explain top 10")
    return lap.out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, help="an index built by build-index (or beir-eval --index-dir) with the encoder channel")
    ap.add_argument("--queries", required=True, help="queries.jsonl (BEIR layout)")
    ap.add_argument("--k", type=int, default=100, help="hits per query (beir-eval's depth: 100)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--profile", choices=("distilled", "fast"), default="distilled",
                    help="the query path timed: the distilled student's (default) or the fast profile's (no query model)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile == "fast":
        r, stages_of = Retriever.load(args.index, profile="fast", query_cache_size=0), fast_stage_times
    else:
        r, stages_of = Retriever.load(args.index, query_encoder="auto", query_cache_size=0), stage_times
        if r.student is None or r.student.kind != "token-bag" or r.student._compiled is None:
            raise SystemExit(f"{args.index}: no compiled token-bag student for its adapter (query encoder {r.query_encoder})")
    queries = [q for q in read_queries(Path(args.queries)).values() if q.strip()]
    for q in queries[:5]:  # first calls: allocation, Numba, the LM head's tables
        stages_of(r, q, args.k)
    whole, stages = [], {}
    for q in queries:
        t0 = time.perf_counter()
        r.search_encoded(r.encode([q]), k=args.k, explain=False)
        whole.append(time.perf_counter() - t0)
        for name, s in stages_of(r, q, args.k).items():
            stages.setdefault(name, []).append(s)
    total = np.sum([v for v in stages.values()], axis=0)
    result = {
        "machine": machine_info(),
        "commit": git_commit(),
        "index": args.index,
        "queries": args.queries,
        "n_queries": len(queries),
        "profile": args.profile,
        "query_encoder": r.query_encoder,
        "student_runtime": r.student.runtime_reason if r.student is not None else None,
        "lm_head": r.student_head.dtype if r.student is not None else None,
        "fusion": r.fusion.as_dict(),
        "whole_query": latency_stats(whole),
        "sum_of_stages": latency_stats(total),
        "stages": {name: {**latency_stats(v), "p90_ms": round(float(np.percentile(v, 90)) * 1e3, 4)} for name, v in stages.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"{'stage':<20} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8}")
    for name, st in result["stages"].items():
        print(f"{name:<20} {st['p50_ms']:>8.2f} {st['p90_ms']:>8.2f} {st['mean_ms']:>8.2f}")
    print(f"{'sum of stages':<20} {result['sum_of_stages']['p50_ms']:>8.2f} {'':>8} {result['sum_of_stages']['mean_ms']:>8.2f}")
    print(f"{'whole query':<20} {result['whole_query']['p50_ms']:>8.2f} {'':>8} {result['whole_query']['mean_ms']:>8.2f}")


if __name__ == "__main__":
    main()
