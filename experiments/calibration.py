"""Self-calibrating fusion (issue 71): do the weights read off each corpus track the best fixed ones?

    python -m experiments.calibration --data shared --encoders minilm,minilm-64,potion,mpnet \\
        --analyzers words,plain --pyserini RUNS/anchors-mpnet --pyserini RUNS/encoder-hybrid \\
        --out benchmarks/results/calibration/calibration.json

For each collection, each encoder (all-MiniLM-L6-v2; MiniLM cut to its first 64 dimensions; the
static potion-base-8M; all-mpnet-base-v2) and each BM25 analyser ("words": stemmed, stop words
out, the engine's; "plain": lowercased words as they are, a poorer one), two channels are fused:
BM25 and the encoder. For every setting of the calibration grid (indexer/calibration.py: min-max
and max-normalised weights on a 0.1 simplex) the real queries' nDCG@10 is computed (ranx). Then:

* *oracle*: the best setting for that collection and pair, chosen on its qrels (the ceiling);
* *calibrated*: the setting indexer.calibration chooses from pseudo-queries of the corpus, no qrels;
* *fixed*: today's ``fast`` setting without its aligned tokens (max-normalised, BM25 0.33, encoder 0.67);
* *B+E 0.6/0.4*, *B+E 0.5/0.5*: BM25 + the encoder at min-max weights, what a user would build
  (Pyserini BM25's stored runs with ``--pyserini`` and the "words" analyser; this study's BM25 otherwise).

Document embeddings are cached under ``--cache`` (one .npy per encoder and collection).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)
from benchmarks.fusion_grid import per_query
from benchmarks.tables import study_command, write_table
from indexer import calibration as cal
from indexer.calibration_channels import EmbeddingChannel, LexicalChannel, exact_search
from indexer.lexical import LUCENE_STOPWORDS, BM25Index, WordAnalyzer  # noqa: F401

DEPTH = 100
FIXED = cal.Setting("max", (0.33, 0.67))
USER = (cal.Setting("minmax", (0.6, 0.4)), cal.Setting("minmax", (0.5, 0.5)))


class PlainAnalyzer:
    """A poor BM25 analyser: lowercased words, nothing dropped, nothing stemmed."""

    name = "plain"

    def __call__(self, text: str) -> list[str]:
        import re

        return re.findall(r"\w+", text.lower())


def morphological_variants(texts: list[str], rate: float):
    """A function (query, seed) -> the query with each word of more than three letters replaced, with
    probability ``rate``, by another word of ``texts`` with the same Porter stem ("retrieval" ->
    "retrieving"). A held-out sentence shares its document's exact word forms, so an analyser that
    does not stem finds it as well as one that does; a query written by someone else does not."""
    import re
    from collections import defaultdict

    import Stemmer

    stem = Stemmer.Stemmer("porter").stemWord
    forms: dict[str, set[str]] = defaultdict(set)
    for text in texts:
        for w in re.findall(r"[a-z]{4,}", text.lower()):
            forms[stem(w)].add(w)
    groups = {s: sorted(f) for s, f in forms.items() if len(f) > 1}

    def vary(query: str, seed: int) -> str:
        rng = np.random.default_rng(seed)

        def swap(m: re.Match) -> str:
            w = m.group(0).lower()
            others = [f for f in groups.get(stem(w), []) if f != w] if len(w) > 3 else []
            return others[int(rng.integers(len(others)))] if others and rng.random() < rate else m.group(0)

        return re.sub(r"[A-Za-z]+", swap, query)

    return vary


def stored_vectors(path: Path, n: int) -> np.ndarray:
    """The document vectors of an exact (flat) FAISS index a beir-eval baseline wrote, in corpus order."""
    import faiss

    index = faiss.read_index(str(path))
    if index.ntotal != n or not isinstance(index, faiss.IndexFlat):
        raise ValueError(f"{path}: expected an exact flat index of {n} vectors, found {type(index).__name__} of {index.ntotal}")
    return np.asarray(index.reconstruct_n(0, n), np.float32)


def load_encoder(name: str):
    """(encode function, short description) of an encoder name of this study."""
    from embedder.sentence_encoder import SentenceEncoder

    if name == "potion":
        from sentence_transformers import SentenceTransformer

        path = Path(".cache/potion/potion-base-8M")
        if not path.is_dir():
            raise SystemExit(f"{path}: potion-base-8M not unpacked (see docs/benchmarks.md, 'Calibration')")
        model = SentenceTransformer(str(path), device="cpu")
        return (lambda texts: model.encode(texts, batch_size=256, normalize_embeddings=True, show_progress_bar=False)), "potion-base-8M (static)"
    base, _, dims = name.partition("-")
    enc = SentenceEncoder.load(base)
    if dims:
        d = int(dims)
        return (lambda texts: enc.encode(texts)[:, :d]), f"{base} cut to {d} dimensions"
    return enc.encode, base


def fused(runs: list[dict], setting: cal.Setting) -> dict:
    """ranx's fusion of channel runs under ``setting`` (one channel alone: its own run)."""
    from ranx import Run, fuse

    used = [(Run(r), w) for r, w in zip(runs, setting.weights) if w > 0]
    if len(used) == 1:
        return used[0][0]
    norm = "min-max" if setting.method == "minmax" else "max"
    return fuse(runs=[r for r, _ in used], norm=norm, method="wsum", params={"weights": [w for _, w in used]})


def completed(lists: list, qids: list[str], doc_ids: list[str], setting: cal.Setting, k: int = DEPTH,
              per_query: np.ndarray | None = None) -> dict:
    """The engine's completed fusion (retriever/fusion.py ``depth``) of per-channel deep lists
    (one per query, as the channels answered them) under ``setting``, as a run. ``per_query``:
    (channels, queries) weights that replace the setting's, query by query."""
    from retriever.fusion import fuse

    names = [str(i) for i in range(len(lists))]
    run = {}
    for j, q in enumerate(qids):
        weights = dict(zip(names, (setting.weights if per_query is None else per_query[:, j].tolist())))
        found = fuse({n: lst[j] for n, lst in zip(names, lists)}, weights, k, setting.method, depth=DEPTH)
        run[q] = {doc_ids[f.doc]: f.score for f in found}
    return run


def peakedness(scores: np.ndarray, top: int = 10, depth: int = DEPTH) -> float:
    """How far a list's first score stands above its ``top``-th, as a share of its whole spread over ``depth``:
    near 1 where a few documents stand out (the channel is sure), near 0 where the top is flat."""
    s = np.asarray(scores, np.float64)[:depth]
    if s.size <= top:
        return 0.0
    spread = s[0] - s[-1]
    return float((s[0] - s[top - 1]) / spread) if spread > 0 else 0.0


def tilted(lists: list, qids: list[str], doc_ids: list[str], setting: cal.Setting, k: int = DEPTH) -> dict:
    """The completed fusion of ``setting`` with its weights tilted per query: each channel's weight times its
    list's :func:`peakedness` for that query over the channel's mean peakedness across the queries (a
    per-query score-distribution signal, read off the lists alone, no labels), then renormalised."""
    peaks = np.array([[peakedness(scores[docs >= 0]) for docs, scores in lst] for lst in lists])  # (channels, queries)
    weights = np.asarray(setting.weights)[:, None] * peaks / np.maximum(peaks.mean(axis=1, keepdims=True), 1e-9)
    total = weights.sum(axis=0)
    weights = np.where(total > 0, weights / np.where(total > 0, total, 1), np.asarray(setting.weights)[:, None])
    return completed(lists, qids, doc_ids, setting, k, per_query=weights)


def corroboration(lists: list) -> np.ndarray:
    """Where each channel's first document stands in the other channel's deep list, query by query:
    (2, queries) 1-based ranks; one past the other list's depth where it lacks that document, or where the
    channel found nothing. Read off the lists alone (no labels): a channel whose first answers the other
    keeps near its top is the more often right of the two, which the channels' overlap (symmetric) cannot say."""
    a, b = lists
    out = np.empty((2, len(a)), np.int32)
    for j, ((da, _), (db, _)) in enumerate(zip(a, b)):
        for row, (first, other) in enumerate(((da, db), (db, da))):
            hit = np.flatnonzero(other == first[0]) if first.size and first[0] >= 0 else np.empty(0)
            out[row, j] = hit[0] + 1 if hit.size else other.size + 1
    return out


def as_run(lists, qids: list[str], doc_ids: list[str]) -> dict:
    return {q: {doc_ids[d]: float(s) for d, s in zip(docs, scores) if d >= 0} for q, (docs, scores) in zip(qids, lists)}


def written_queries(folder: Path, collection: str, texts: list[str]) -> list[cal.PseudoQuery]:
    """The queries experiments.generated_queries wrote for ``collection``'s sampled documents, as
    pseudo-queries whose source is scored as its whole text (nothing was held out of it), or as the row's
    "rest" where it has one (a title's body)."""
    import json

    path = folder / f"{collection}.jsonl"
    if not path.exists():
        raise SystemExit(f"{path}: no written queries for {collection} (run python -m experiments.generated_queries)")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {n}: not a JSON object ({exc.msg})") from None
        if not isinstance(row.get("doc"), int) or not 0 <= row["doc"] < len(texts):
            raise ValueError(f"{path}, line {n}: field 'doc' is not a document number of {collection}")
        if str(row.get("query", "")).strip():  # "rest": what the source is scored as (a title's body); else its whole text
            out.append(cal.PseudoQuery(row["doc"], row["query"], row.get("rest") or texts[row["doc"]]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.calibration", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, help="collections (benchmarks.datasets.resolve); repeatable")
    p.add_argument("--encoders", default="minilm,minilm-64,potion,mpnet")
    p.add_argument("--analyzers", default="words,plain")
    p.add_argument("--pyserini", type=Path, action="append", default=[],
                   help="a beir-eval results folder holding runs/<collection>/bm25-pyserini.trec[.gz] (repeatable: the first that has it)")
    p.add_argument("--queries", type=int, default=cal.DEFAULT_QUERIES, help="pseudo-queries per corpus")
    p.add_argument("--seeds", default="0", help="pseudo-query seeds, comma-separated (each calibrates apart)")
    p.add_argument("--cache", type=Path, default=Path(".cache/calibration"))
    p.add_argument("--vectors-from", type=Path, default=None,
                   help="a beir-eval --index-dir: an encoder's document vectors are read from its exact FAISS index there "
                        "(NAME/ENCODER.faiss, written by the minilm / mpnet baselines) instead of encoding the corpus again")
    p.add_argument("--matrices", type=Path, default=None,
                   help="also write every variant's (settings, queries) matrices here (.npz): the real queries' nDCG@10 "
                        "('|real'), B+E's ('|user', USER's rows), the pseudo-queries' source ranks ('|pseudo|SEED') and the "
                        "channels' corroboration() on the real queries ('|agree'), for judging other selection rules without "
                        "recomputing")
    p.add_argument("--variant-rate", type=float, default=0.0,
                   help="rewrite each word of a pseudo-query into another form of the corpus with the same Porter stem, with this "
                        "probability (0: the held-out sentence as it is): a probe of the analyser blind spot")
    p.add_argument("--pseudo-from", type=Path, default=None,
                   help="a folder of experiments.generated_queries (COLLECTION.jsonl): each pair is also calibrated on those "
                        "written queries (row seed 'gen', matrices '|pseudo|gen'), the source scored as its whole text, or as a "
                        "row's 'rest' where it has one (a title's body)")
    p.add_argument("--tilt", action="store_true",
                   help="also score the calibrated setting with its weights tilted per query by each channel's peakedness "
                        "(tilted()): a column 'tilted nDCG@10', and the per-query matrices '|tilt|SEED'")
    p.add_argument("--plain", action="store_true",
                   help="fuse listed documents only, 0 where a list lacks one (calibration version 1); default: completed scores")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.tilt and args.plain:
        p.error("--tilt tilts the completed fusion; --plain fuses listed documents only")
    store: dict[str, np.ndarray] = {}

    from benchmarks.datasets import resolve
    from benchmarks.runs import read_trec

    datasets = [ds for spec in args.data for ds in resolve(spec)]
    encoders = [e.strip() for e in args.encoders.split(",") if e.strip()]
    analyzers = {"words": WordAnalyzer(), "plain": PlainAnalyzer()}
    chosen_analyzers = [a.strip() for a in args.analyzers.split(",") if a.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = cal.grid(2)
    loaded = {}
    rows, details = [], {"collections": {}}
    for ds in datasets:
        texts = [d.text for d in ds.docs]
        doc_ids = [d.doc_id for d in ds.docs]
        qids = list(ds.queries)
        qtexts = [ds.queries[q] for q in qids]
        qrels = {q: ds.qrels[q] for q in qids}
        pyserini = None
        for folder in args.pyserini:
            for suffix in (".trec", ".trec.gz"):
                path = folder / "runs" / ds.name / f"bm25-pyserini{suffix}"
                if pyserini is None and path.exists():
                    pyserini = dict(read_trec(path))
        details.setdefault("pyserini_runs", {})[ds.name] = pyserini is not None
        pqs_by_seed = {s: cal.pseudo_queries(texts, args.queries, s) for s in seeds}
        written = written_queries(args.pseudo_from, ds.name, texts) if args.pseudo_from is not None else None
        if args.variant_rate > 0:  # the held-out sentences in other word forms of the corpus (morphological_variants)
            vary = morphological_variants(texts, args.variant_rate)
            pqs_by_seed = {s: [cal.PseudoQuery(q.doc, vary(q.query, s * 7919 + i), q.rest) for i, q in enumerate(pqs)]
                           for s, pqs in pqs_by_seed.items()}
        lexical = {}
        for a in chosen_analyzers:
            t0 = time.perf_counter()
            lexical[a] = LexicalChannel(f"bm25-{a}", BM25Index.build(texts, analyzers[a]), analyzers[a], texts)
            print(f"{ds.name}: bm25 {a} built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        for e in encoders:
            if e not in loaded:
                loaded[e] = load_encoder(e)
            encode, described = loaded[e]
            details.setdefault("encoders", {})[e] = described
            cache = args.cache / f"{e}-{ds.name}-{len(texts)}.npy"
            base, _, dims = e.partition("-")
            whole = args.cache / f"{base}-{ds.name}-{len(texts)}.npy"
            stored = args.vectors_from / ds.name / f"{e}.faiss" if args.vectors_from is not None else None
            if cache.exists():
                vectors = np.load(cache)
            elif stored is not None and stored.exists():
                vectors = stored_vectors(stored, len(texts))
                cache.parent.mkdir(parents=True, exist_ok=True)
                np.save(cache.with_suffix(".tmp.npy"), vectors)
                cache.with_suffix(".tmp.npy").replace(cache)
                print(f"{ds.name}: {e} read {len(texts)} document vectors from {stored}", file=sys.stderr, flush=True)
            elif dims and whole.exists():  # a cut encoder's vectors are the whole one's first dimensions
                vectors = np.load(whole)[:, : int(dims)]
            else:
                t0 = time.perf_counter()
                vectors = np.asarray(encode(texts), np.float32)
                cache.parent.mkdir(parents=True, exist_ok=True)
                np.save(cache.with_suffix(".tmp.npy"), vectors)
                cache.with_suffix(".tmp.npy").replace(cache)
                print(f"{ds.name}: {e} encoded {len(texts)} documents in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            dense = EmbeddingChannel(e, encode, exact_search(vectors))
            dense_deep = dense.search(qtexts, cal.COMPLETION_DEPTH)
            dense_run = as_run([(d[:DEPTH], s[:DEPTH]) for d, s in dense_deep], qids, doc_ids)
            for a in chosen_analyzers:
                lex = lexical[a]
                lex_deep = lex.search(qtexts, cal.COMPLETION_DEPTH)
                runs = [as_run([(d[:DEPTH], s[:DEPTH]) for d, s in lex_deep], qids, doc_ids), dense_run]
                if args.plain:
                    ours = {i: fused(runs, s) for i, s in enumerate(settings)}
                else:
                    ours = {i: completed([lex_deep, dense_deep], qids, doc_ids, s) for i, s in enumerate(settings)}
                real_matrix = np.stack([per_query(qrels, ours[i], qids) for i in range(len(settings))])
                real = real_matrix.mean(axis=1)
                store[f"{ds.name}|{e}|{a}|real"] = real_matrix
                ref_bm25 = pyserini if (a == "words" and pyserini is not None) else runs[0]
                user_matrix = np.stack([per_query(qrels, fused([ref_bm25, dense_run], s), qids) for s in USER])
                store[f"{ds.name}|{e}|{a}|user"] = user_matrix
                store[f"{ds.name}|{e}|{a}|agree"] = corroboration([lex_deep, dense_deep])
                users = user_matrix.mean(axis=1).tolist()
                fixed = float(per_query(qrels, fused(runs, FIXED), qids).mean())
                alone = [float(per_query(qrels, fused(runs, cal.Setting("minmax", w)), qids).mean()) for w in ((1.0, 0.0), (0.0, 1.0))]
                recall_user = float(per_query(qrels, fused([ref_bm25, dense_run], USER[0]), qids, "recall@100").mean())
                oracle = int(np.argmax(real))
                sources = [(seed, pqs_by_seed[seed]) for seed in seeds] + ([("gen", written)] if written else [])
                for seed, pqs in sources:
                    t0 = time.perf_counter()
                    c, ranks = cal.choose([lex, dense], pqs, settings, seed=seed if isinstance(seed, int) else 0,
                                          with_ranks=True, complete=not args.plain)
                    took = time.perf_counter() - t0
                    store[f"{ds.name}|{e}|{a}|pseudo|{seed}"] = ranks
                    pick = next(i for i, s in enumerate(settings) if s.as_fusion([lex.name, dense.name], not args.plain) == c.fusion)
                    recall = float(per_query(qrels, ours[pick], qids, "recall@100").mean())
                    tilt = []
                    if args.tilt:
                        tilt_matrix = per_query(qrels, tilted([lex_deep, dense_deep], qids, doc_ids, settings[pick]), qids)
                        store[f"{ds.name}|{e}|{a}|tilt|{seed}"] = tilt_matrix
                        tilt = [round(float(tilt_matrix.mean()), 4)]
                    row = [
                        ds.name, e, a, seed, round(alone[0], 4), round(alone[1], 4), round(alone[1] / max(alone[0], 1e-9), 3),
                        round(float(real[oracle]), 4), cal.label(settings[oracle], ["bm25", "enc"]),
                        round(float(real[pick]), 4), cal.label(settings[pick], ["bm25", "enc"]),
                        round(float(real[pick] - real[oracle]), 4), round(fixed, 4), round(users[0], 4), round(users[1], 4),
                        round(float(real[pick]) - max(users), 4), round(recall, 4), round(recall_user, 4),
                        " / ".join(f"{v:.3f}" for v in c.alone.values()), round(took, 1), *tilt,
                    ]  # fmt: skip
                    rows.append(row)
                    print("  ".join(str(x) for x in row), file=sys.stderr, flush=True)
                    details["collections"].setdefault(ds.name, {}).setdefault(f"{e}|{a}", {})[str(seed)] = {
                        "calibration": c.to_dict(), "real_by_setting": {cal.label(s, ["bm25", "enc"]): round(float(v), 4) for s, v in zip(settings, real)},
                    }  # fmt: skip
        if args.matrices is not None:  # after each collection: a later failure keeps what was computed
            args.matrices.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(args.matrices.with_suffix(".tmp.npz"), **store)
            args.matrices.with_suffix(".tmp.npz").replace(args.matrices)
    columns = ["collection", "encoder", "analyser", "seed", "BM25 alone", "encoder alone", "enc/BM25", "oracle nDCG@10", "oracle setting",
               "calibrated nDCG@10", "calibrated setting", "calibrated - oracle", "fixed max .33/.67", "B+E 0.6/0.4", "B+E 0.5/0.5",
               "calibrated - best B+E", "calibrated R@100", "B+E 0.6/0.4 R@100", "pseudo alone (bm25 / enc)", "calibration s"]
    columns += ["tilted nDCG@10"] if args.tilt else []
    write_table(
        args.out,
        title="Self-calibrating fusion: weights read off each corpus against the per-collection oracle",
        command=study_command("experiments.calibration", argv),
        description=(
            "nDCG@10 of BM25 fused with one encoder. *oracle*: the grid setting best on the collection's qrels; *calibrated*: the "
            "setting indexer.calibration picks from held-out sentences of the corpus (no qrels); *fixed*: max-normalised BM25 0.33 / "
            "encoder 0.67; *B+E*: Pyserini BM25 (stored runs; this study's BM25 for the plain analyser) + the encoder, min-max. "
            "Grid: min-max and max-normalised weights on a 0.1 simplex, a channel alone included."
        ),
        columns=columns,
        rows=rows,
        details=details,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
