"""Sweep the aligned-token parameters (document top-K, query expansion M, literal token
forms, query token weighting) on BEIR collections, encoding each corpus only once.

    python -m experiments.sweep_sparse --data ../shared/data/cisi --data ../shared/data/medline

Writes a ``{"kind": "table"}`` results file that ``beir-eval report`` renders into BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", action="append", type=Path, required=True)
    p.add_argument("--top-k", default="64,128,256,512,1024,2048")
    p.add_argument("--expansion-m", default="0,16,32,64,128,256")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sweep_sparse.json"))
    args = p.parse_args(argv)
    from ranx import Qrels, Run, evaluate

    from benchmarks.datasets import load_beir_folder
    from embedder.encoder import Embedder
    from indexer.dense import normalise
    from indexer.inverted_index import InvertedIndex
    from retriever.query import literal_ids

    ks = [int(x) for x in args.top_k.split(",")]
    ms = [int(x) for x in args.expansion_m.split(",")]
    emb = Embedder.load(adapter="none")
    rows = []
    for folder in args.data:
        # the one BEIR reader (benchmarks/datasets.py): its CorpusError checks, judged queries only
        ds = load_beir_folder(folder)
        ids, texts, queries = [d.doc_id for d in ds.docs], [d.text for d in ds.docs], ds.queries
        qrels_d = {q: {d: r for d, r in judged.items() if r > 0} for q, judged in ds.qrels.items()}
        qids = list(queries)
        t0 = time.perf_counter()
        h_docs = emb.embed(texts)
        doc_tok, doc_w = emb.top_tokens(h_docs, max(ks))
        h_q = emb.embed([queries[q] for q in qids], role="query")
        q_top, _ = emb.top_tokens(h_q, max(ms) or 1)
        print(f"{folder.name}: encoded {len(texts)} docs + {len(qids)} queries in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        qrels = Qrels(qrels_d)

        def ndcg(results: dict[str, dict[str, float]], qrels: Qrels = qrels) -> float:
            return float(evaluate(qrels, Run(results), "ndcg@10"))

        sims = normalise(h_q) @ normalise(h_docs).T
        dense = {q: {ids[j]: float(sims[i, j]) for j in np.argsort(-sims[i])[:100]} for i, q in enumerate(qids)}
        rows.append([folder.name, "dense", "-", "-", "-", "-", round(ndcg(dense), 4)])
        for k in ks:
            inv = InvertedIndex.from_forward(doc_tok[:, :k], doc_w[:, :k], emb.vocab_size)
            df = np.diff(inv.indptr)
            idf = np.log((inv.n_docs + 1) / (df + 1)).astype(np.float32)
            for m in ms:
                for forms in ("space", "bare", "both"):
                    for weighting in ("one", "idf"):
                        if (forms != "both" or weighting != "one") and k != 512:
                            continue  # the literal/weighting variants are swept at one K only
                        run = {}
                        for i, q in enumerate(qids):
                            toks = np.asarray(list(dict.fromkeys(literal_ids(emb, queries[q], forms) + q_top[i, :m].tolist())), np.int64)
                            w = idf[toks] if weighting == "idf" else np.ones(len(toks), np.float32)
                            d, s = inv.search(toks, w, 100)
                            run[q] = {ids[j]: float(x) for j, x in zip(d, s)} or {ids[0]: 0.0}
                        rows.append([folder.name, "sparse", k, m, forms, weighting, round(ndcg(run), 4)])
                        print(rows[-1], file=sys.stderr)
    from benchmarks.tables import write_table

    write_table(
        args.out,
        title="Aligned-token parameter sweep (raw backbone, nDCG@10)",
        command="python -m experiments.sweep_sparse " + " ".join(f"--data {d}" for d in args.data),
        description=(
            "Documents keep their top-K aligned tokens (weight = logit); a query is its literal tokens "
            "(forms: 'space' = word-initial Ġ forms, 'bare' = each word tokenised alone, 'both') united with its top-M "
            "aligned tokens, each weighted 1 ('one', the paper's Eq. 16) or by the token's IDF in the aligned-token index "
            f"('idf'). Model {emb.identity['name']}, no adapter."
        ),
        columns=["dataset", "system", "top_k", "expansion_m", "literal", "query weight", "nDCG@10"],
        rows=rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
