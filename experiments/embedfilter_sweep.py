"""EmbedFilter's filtering ratio τ: STS-B Spearman and dense nDCG@10, raw and trained backbone.

    python -m experiments.embedfilter_sweep --pairs ../shared/data/stsb/test.tsv --data shared \\
        --variant raw=none --variant trained=default --taus 1,2,4,8 \\
        --embedding-cache .cache/embeddings --out benchmarks/results/embedfilter.json

For each embedder variant, every text (STS-B sentences, documents, queries) is embedded once
(documents through the embedding cache that ``beir-eval --embedding-cache`` fills); each τ
then only projects: e ↦ e · V[l:r] (embedder/embedfilter.py), cosine, exact top-100 search,
nDCG@10 by ranx. τ = 1 keeps every singular vector, so it equals the plain dense channel.
Writes a ``{"kind": "table"}`` results file that ``beir-eval report`` renders.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)
from benchmarks.tables import study_command, write_table


def dense_run(docs: np.ndarray, queries: np.ndarray, doc_ids: list[str], query_ids: list[str], depth: int = 100) -> dict:
    """Exact cosine top-``depth`` of each query, as a ranx-style {qid: {doc_id: score}}."""
    from indexer.dense import normalise

    scores = normalise(queries) @ normalise(docs).T
    k = min(depth, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return {q: {doc_ids[d]: float(scores[i, d]) for d in top[i]} for i, q in enumerate(query_ids)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.embedfilter_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=Path, required=True, help="STS-B pairs TSV (e.g. ../shared/data/stsb/test.tsv)")
    p.add_argument("--data", action="append", default=None, help="collections as beir-eval reads them (default: shared)")
    p.add_argument("--variant", action="append", required=True, help="NAME=ADAPTER (none, default or a folder); repeatable")
    p.add_argument("--taus", default="1,2,4,8", help="comma-separated filtering ratios (default 1,2,4,8)")
    p.add_argument("--model", default=None, help="backbone (default: the engine's default)")
    p.add_argument("--embedding-cache", type=Path, default=None, help="document embedding cache folder (embedder/cache.py)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, required=True, help="results JSON file to write")
    args = p.parse_args(argv)

    import torch
    from ranx import Qrels, Run, evaluate

    from benchmarks import datasets as dsets
    from embedder.cache import CachedEmbedder
    from embedder.embedfilter import embedfilter_projection
    from embedder.encoder import Embedder
    from embedder.models import DEFAULT_MODEL
    from training.sts import read_pairs, spearman_of_embeddings, unique_sentences

    taus = [int(t) for t in args.taus.split(",")]
    pairs = read_pairs(args.pairs)
    collections = [d for spec in (args.data or ["shared"]) for d in dsets.resolve(spec, "test")]
    rows, details = [], {}
    for spec in args.variant:
        name, _, adapter = spec.partition("=")
        embedder = Embedder.load(args.model or DEFAULT_MODEL, adapter=adapter or "none")
        if args.threads:
            torch.set_num_threads(args.threads)
        cached = CachedEmbedder(embedder, args.embedding_cache) if args.embedding_cache else None
        embed = cached.embed_texts if cached else embedder.embed
        w_u = embedder.causal_lm.get_output_embeddings().weight.detach().float().cpu().numpy()
        sts = embed(unique_sentences(pairs))
        encoded = {}
        for ds in collections:
            qids = list(ds.queries)
            queries = embed([ds.queries[q] for q in qids], role="query")  # STS sentences and documents: the document template
            encoded[ds.name] = (embed([d.text for d in ds.docs]), queries, [d.doc_id for d in ds.docs], qids)
            print(f"{name}: {ds.name} embedded", file=sys.stderr, flush=True)
        for tau in taus:
            proj, left, right = embedfilter_projection(w_u, tau)
            rho = spearman_of_embeddings(sts @ proj, pairs)["spearman"]
            ndcg = {}
            for ds in collections:
                docs, queries, doc_ids, qids = encoded[ds.name]
                run = dense_run(docs @ proj, queries @ proj, doc_ids, qids)
                qrels = Qrels({q: ds.qrels[q] for q in qids})
                ndcg[ds.name] = float(evaluate(qrels, Run(run), "ndcg@10"))
            mean = float(np.mean(list(ndcg.values())))
            rows.append([name, tau, right - left, f"{left}:{right}", round(rho, 4), *[round(ndcg[d.name], 4) for d in collections], round(mean, 4)])
            details[f"{name}/tau={tau}"] = {"adapter": embedder.adapter, "left": left, "right": right, "sts_spearman": rho, "ndcg@10": ndcg}
            print(f"{name} tau={tau}: STS-B {rho:.4f}  mean nDCG@10 {mean:.4f}  {ndcg}", file=sys.stderr, flush=True)
        del embedder, cached
    write_table(
        args.out,
        title="EmbedFilter: filtering ratio τ (STS-B and dense retrieval)",
        command=study_command("experiments.embedfilter_sweep", argv),
        description=(
            f"Dense channel with EmbedFilter (embedfilter paper §4): keep d/τ right singular vectors of the LM head "
            f"from the middle of its spectrum. STS-B: Spearman ρ of cosine vs gold on {args.pairs.name} "
            f"({len(pairs.scores)} pairs). nDCG@10: exact cosine search of each collection's test queries. "
            "τ = 1 keeps all dimensions (equal to the plain dense channel). `raw` = backbone without adapter; "
            "`trained` = the shipped Text2Token adapter."
        ),
        columns=["embedder", "τ", "dim", "kept l:r", "STS-B ρ", *[f"{d.name} nDCG@10" for d in collections], "mean nDCG@10"],
        rows=rows,
        details=details,
        plot={"kind": "line", "x": "τ", "y": ["STS-B ρ", "mean nDCG@10"], "series": "embedder", "title": "EmbedFilter: τ vs STS-B and dense nDCG@10"},
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
