"""Encoder runtimes against a naive fp32 transformers loop, on the same texts, in one run.

The naive loop is what a user would write first: the transformers model in fp32 (adapter
merged), the PromptEOL prompt ids, batches of 16 in input order padded to their longest
text, last-token pooling. Every engine runtime available on this machine (embedder/runtime.py;
emulated bf16 only with ``--include-emulated``: it is ~5x slower than fp32 on AVX2) encodes the
same documents (batches of 16, longest first, as ``build-index`` does) and the same queries,
one at a time, as ``Retriever.search`` does. Reported per runtime:

- documents/s and prompt tokens/s, and the speed-up over the naive loop;
- query encoding latency p50/p95 (encoding only: tokenise, network, pool) and its speed-up;
- faithfulness to the naive fp32 embeddings: cosine of the pooled embeddings (min, mean) and
  overlap of the top-64 aligned tokens (min, mean).

The last row is the engine as a user gets it: ``dtype="auto"``, which times the candidate runtimes
on this machine the first time (embedder/speed_probe.py) and takes the fastest faithful one for
documents and for queries apart; its choice, its reasons and the probe's own table go into the
results' details. Its warm-up column includes the probe (0 work when a verdict was already kept).
``--auto-only`` times the naive loop and that row alone (the bars/10 comparison). The load average
is recorded before and after: on a shared CPU it says how much to trust the timings.

    python -m experiments.encoder_speed --corpus ../shared/data/cisi --docs 128 \\
        --out benchmarks/results/encoder-speed-avx2.json

The machine's CPU flags go into the results header (benchmarks/provenance.py machine_info): the
numbers mean nothing without them. Warm-up calls (export, compilation, first allocation) are
timed apart and never counted.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.tables import study_command, write_table
from benchmarks.timing import latency_stats
from embedder.encoder import Embedder
from embedder.hardware import cpu_capability, openvino_available
from indexer.corpus import CorpusSpec

TOP_TOKENS = 64


def naive_embed(embedder: Embedder, ids: list[list[int]], batch_size: int = 16) -> np.ndarray:
    """The naive loop: fp32 transformers forward of each batch in input order, last-token pooling."""
    body = embedder.causal_lm.base_model
    out = np.zeros((len(ids), embedder.dim), np.float32)
    with torch.inference_mode():
        for start in range(0, len(ids), batch_size):
            rows = ids[start : start + batch_size]
            width = max(len(r) for r in rows)
            x = torch.full((len(rows), width), embedder._pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):
                x[i, : len(r)] = torch.tensor(r)
                mask[i, : len(r)] = 1
            hidden = body(input_ids=x, attention_mask=mask).last_hidden_state
            last = torch.tensor([len(r) - 1 for r in rows])
            out[start : start + len(rows)] = hidden[torch.arange(len(rows)), last].float().numpy()
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def token_overlap(embedder: Embedder, a: np.ndarray, b: np.ndarray, k: int = TOP_TOKENS) -> np.ndarray:
    """Share of each text's top-k aligned tokens that two embeddings have in common."""
    ta, _ = embedder.top_tokens(a, k)
    tb, _ = embedder.top_tokens(b, k)
    return np.array([len(set(x) & set(y)) / k for x, y in zip(ta.tolist(), tb.tolist())])


def time_queries(encode, queries: list[str]) -> tuple[np.ndarray, list[float]]:
    encode(queries[:1])  # warm-up, not counted
    vectors, seconds = [], []
    for q in queries:
        t0 = time.perf_counter()
        vectors.append(encode([q])[0])
        seconds.append(time.perf_counter() - t0)
    return np.stack(vectors), seconds


def measure(engine: Embedder, reference: Embedder, docs: list[str], queries: list[str], ref_docs: np.ndarray,
            ref_queries: np.ndarray) -> tuple[float, dict, np.ndarray, np.ndarray]:
    """A warm engine timed on the documents (seconds for all) and query by query (latency
    stats), with each output's cosine and top-token overlap against the reference's."""
    t0 = time.perf_counter()
    out_docs = engine.embed(docs)
    doc_s = time.perf_counter() - t0
    out_q, q_s = time_queries(partial(engine.embed, role="query"), queries)
    cos = np.concatenate([cosines(out_docs, ref_docs), cosines(out_q, ref_queries)])
    overlap = np.concatenate([token_overlap(reference, out_docs, ref_docs), token_overlap(reference, out_q, ref_queries)])
    return doc_s, latency_stats(q_s), cos, overlap


class _Candidate:
    """A runtime evaluated but not shipped: fed to an Embedder in place of its own runtime."""

    prefix_len = 0

    def __init__(self, name: str, dtype: str, hidden) -> None:
        self.name, self.dtype, self.hidden = name, dtype, hidden


def candidate_runtimes(reference: Embedder, work: Path) -> list[tuple[str, str, object]]:
    """Runtimes the registries offer that the engine does not ship, to show why (``--candidates``):
    torch's own dynamic int8 (per-tensor weights) and ONNX Runtime fp32 / dynamic int8, each
    over the plain body (no prefix cache). Skipped where the package is missing."""
    import copy

    from embedder.prefix_cache import PlainBody

    body = PlainBody(reference.causal_lm.base_model).eval()
    out: list[tuple[str, str, object]] = []

    def torch_int8():
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(body), {torch.nn.Linear}, dtype=torch.qint8)
        return _Candidate("torch dynamic int8", "int8", lambda i, m: q(torch.from_numpy(i), torch.from_numpy(m)).float())

    out.append(("candidate: torch quantize_dynamic", "int8", torch_int8))
    try:
        import onnxruntime as ort
    except ImportError:
        return out

    def onnx(dtype: str):
        fp32 = work / "body.onnx"
        if not fp32.exists():
            example = (torch.ones((2, 8), dtype=torch.long), torch.ones((2, 8), dtype=torch.long))
            axes = {"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}, "hidden": {0: "b", 1: "t"}}
            torch.onnx.export(body, example, str(fp32), input_names=["input_ids", "attention_mask"], output_names=["hidden"],
                              dynamic_axes=axes, opset_version=17, dynamo=False)
        path = fp32
        if dtype == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            path = work / "body-int8.onnx"
            quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, per_channel=True)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return _Candidate("onnxruntime", dtype, lambda i, m: torch.from_numpy(sess.run(None, {"input_ids": i, "attention_mask": m})[0]))

    out += [("candidate: onnxruntime", "fp32", lambda: onnx("fp32")), ("candidate: onnxruntime dynamic", "int8", lambda: onnx("int8"))]
    return out


def variants(cap, include_emulated: bool, prefix_ablation: bool) -> list[tuple[str, str, bool]]:
    """(runtime, dtype, prefix cache) to time on this machine."""
    out = [("torch", "fp32", True)]
    if prefix_ablation:
        out.append(("torch", "fp32", False))
    if cap.native_bf16 or include_emulated:
        out.append(("torch", "bf16", True))
    if openvino_available():
        out += [("openvino", "fp32", True), ("openvino", "int8", True)]
        if prefix_ablation:
            out.append(("openvino", "int8", False))
        if cap.native_bf16 or include_emulated:
            out.append(("openvino", "bf16", True))
    return out


def _auto_row(
    reference: Embedder, cap, docs, queries, ref_docs, ref_queries, naive_doc_s, naive_q_stats, n_doc_tokens, reprobe: bool
) -> tuple[dict, list]:
    """The engine as loaded by default (``dtype="auto"``: the speed probe decides), documents and queries."""
    engine = Embedder(reference.model, reference.tokenizer, reference.config, reference.identity, reference.adapter,
                      runtime="auto", dtype="auto", capability=cap)
    t0 = time.perf_counter()
    engine.resolve_runtime(refresh=reprobe)
    engine.embed(docs[:2])
    engine.embed(queries[:1], role="query")  # the probe, then export/compile of both roles' runtimes, timed apart
    warm = time.perf_counter() - t0
    doc_s, q, cos, overlap = measure(engine, reference, docs, queries, ref_docs, ref_queries)
    info = engine.runtime_info()
    queries_rt = (info.get("queries") or {"name": info["name"], "dtype": info["dtype"]})
    auto = {
        "documents": [info["name"], info["dtype"]], "queries": [queries_rt["name"], queries_rt["dtype"]],
        "documents_reason": info.get("reason"), "queries_reason": queries_rt.get("reason", info.get("reason")),
        "speed_probe": info.get("speed_probe"),
    }
    label = f"engine: auto (documents {info['name']} {info['dtype']}, queries {queries_rt['name']} {queries_rt['dtype']})"
    row = [
        label, "auto", "yes", round(len(docs) / doc_s, 2), round(n_doc_tokens / doc_s, 1), round(naive_doc_s / doc_s, 2), q["p50_ms"], q["p95_ms"],
        round(naive_q_stats["p50_ms"] / q["p50_ms"], 2), round(float(cos.min()), 5), round(float(cos.mean()), 5),
        round(float(overlap.min()), 3), round(float(overlap.mean()), 3), round(warm, 1),
    ]
    print(f"{label}: {row[3]} docs/s (x{row[5]}), query p50 {q['p50_ms']:.1f} ms (x{row[8]}); {auto['documents_reason']}")
    return auto, row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="BEIR folder: documents from corpus.jsonl, queries from queries.jsonl")
    p.add_argument("--docs", type=int, default=128, help="documents encoded (the first N of the corpus)")
    p.add_argument("--queries", type=int, default=0, help="queries encoded one at a time (0: all)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", default="default")
    p.add_argument("--threads", type=int, default=None, help="torch/OpenVINO threads (default: all cores)")
    p.add_argument("--include-emulated", action="store_true", help="also time bf16 where the CPU only emulates it (slow)")
    p.add_argument("--no-prefix-ablation", action="store_true", help="skip the runs without the prefix cache")
    p.add_argument("--candidates", action="store_true", help="also time runtimes the engine does not ship (torch dynamic int8, ONNX Runtime)")
    p.add_argument("--auto-only", action="store_true", help="time the naive loop and the engine's auto choice only")
    p.add_argument("--reprobe", action="store_true", help="run the speed probe again even where a verdict is kept (and keep the new one)")
    p.add_argument("--out", type=Path, required=True, help="table results JSON (read by beir-eval report)")
    args = p.parse_args(argv)

    cap = cpu_capability()
    print(cap.describe())
    load_before = os.getloadavg()
    reference = Embedder.load(args.model, adapter=args.adapter, runtime=None)  # fp32 weights, adapter merged
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    docs = [d.text for _, d in zip(range(args.docs), CorpusSpec(args.corpus))]
    queries = [json.loads(line)["text"] for line in (args.corpus / "queries.jsonl").open(encoding="utf-8")]
    queries = queries[: args.queries] if args.queries else queries
    doc_ids = reference.prompt_ids(docs)
    n_doc_tokens = sum(len(x) for x in doc_ids)

    naive_embed(reference, doc_ids[:16])  # warm-up
    t0 = time.perf_counter()
    ref_docs = naive_embed(reference, doc_ids)
    naive_doc_s = time.perf_counter() - t0
    # queries read the query template, as the Retriever reads them (the document one where none is set)
    ref_queries, naive_q = time_queries(lambda qs: naive_embed(reference, reference.prompt_ids(qs, role="query")), queries)
    naive_q_stats = latency_stats(naive_q)
    rows = [[
        "naive transformers loop", "fp32", "no", round(len(docs) / naive_doc_s, 2), round(n_doc_tokens / naive_doc_s, 1), 1.0,
        naive_q_stats["p50_ms"], naive_q_stats["p95_ms"], 1.0, 1.0, 1.0, 1.0, 1.0, 0.0,
    ]]
    print(f"naive: {rows[0][3]} docs/s, query p50 {naive_q_stats['p50_ms']:.1f} ms")
    todo = [(f"engine: {rt}", dt, prefix, None) for rt, dt, prefix in variants(cap, args.include_emulated, not args.no_prefix_ablation)]
    todo = [] if args.auto_only else todo
    if args.candidates:
        work = Path(tempfile.mkdtemp(prefix="encoder-speed-"))
        todo += [(label, dt, False, make) for label, dt, make in candidate_runtimes(reference, work)]
    for label, dtype, prefix, make in tqdm(todo, desc="runtimes", unit="runtime"):
        runtime = label.split(": ", 1)[1] if make is None else "torch"
        engine = Embedder(
            reference.model, reference.tokenizer, reference.config, reference.identity, reference.adapter,
            runtime=runtime, dtype=dtype if make is None else "fp32", prefix_cache=prefix,
        )
        t0 = time.perf_counter()
        if make is not None:
            engine._runtime = make()  # in place of the engine's own runtime (built lazily, so never built)
        engine.embed(docs[:2])  # export/compile/first allocation, timed apart
        warm = time.perf_counter() - t0
        doc_s, q, cos, overlap = measure(engine, reference, docs, queries, ref_docs, ref_queries)
        rows.append([
            label, dtype, "yes" if prefix else "no", round(len(docs) / doc_s, 2), round(n_doc_tokens / doc_s, 1),
            round(naive_doc_s / doc_s, 2), q["p50_ms"], q["p95_ms"], round(naive_q_stats["p50_ms"] / q["p50_ms"], 2),
            round(float(cos.min()), 5), round(float(cos.mean()), 5), round(float(overlap.min()), 3), round(float(overlap.mean()), 3),
            round(warm, 1),
        ])
        print(f"{label} {dtype} prefix={prefix}: {rows[-1][3]} docs/s (x{rows[-1][5]}), query p50 {q['p50_ms']:.1f} ms (x{rows[-1][8]}), "
              f"cos min {rows[-1][9]}, top-{TOP_TOKENS} overlap min {rows[-1][11]}")
    auto, auto_row = _auto_row(reference, cap, docs, queries, ref_docs, ref_queries, naive_doc_s, naive_q_stats, n_doc_tokens, args.reprobe)
    rows.append(auto_row)
    load_after = os.getloadavg()
    columns = [
        "runtime", "dtype", "prefix cache", "docs/s", "tokens/s", "docs speed-up", "query p50 ms", "query p95 ms",
        "query speed-up", "cos min", "cos mean", f"top-{TOP_TOKENS} overlap min", f"top-{TOP_TOKENS} overlap mean", "warm-up s",
    ]
    command = study_command("experiments.encoder_speed", argv)
    write_table(
        args.out,
        f"Encoder runtimes on {cap.name} ({' '.join(cap.flags) or 'no AVX2'}; native bf16: {'yes' if cap.native_bf16 else 'no'})",
        command,
        f"{len(docs)} {args.corpus.name} documents ({n_doc_tokens} prompt tokens, batches of 16) and {len(queries)} {args.corpus.name} "
        f"queries one at a time, {threads} threads. Naive loop: fp32 transformers, adapter merged, input order, padded batches of 16. "
        f"Speed-ups are over the naive loop in the same run; cosine and top-{TOP_TOKENS} aligned-token overlap are against its "
        "fp32 embeddings (documents and queries together). Warm-up (export, compilation) is timed apart. Last row: "
        f"dtype auto, measured by the speed probe: documents {' '.join(auto['documents'])}, queries {' '.join(auto['queries'])}. "
        f"Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} cores"
        + (": the CPU was shared with other jobs, timings are noisy." if max(load_before[0], load_after[0]) > 0.5 * (os.cpu_count() or 1) else "."),
        columns,
        rows,
        details={"capability": cap.to_dict(), "threads": threads, "n_docs": len(docs), "n_queries": len(queries), "doc_tokens": n_doc_tokens,
                 "auto": auto, "load_average": {"before": list(load_before), "after": list(load_after)}},
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
