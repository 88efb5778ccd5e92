"""How fast the decoder could encode on this CPU at best: its matmuls at the CPU's measured peak.

Issue 54 asks the engine for 3x the naive fp32 loop's documents/s on every CPU kind. A document's
encode is the decoder's matmuls (its linear layers, 2 FLOPs a weight a token, and causal attention);
this study counts those FLOPs for the same documents the encoder-speed study encodes (its prompt
ids, the same first N of the corpus), times the CPU's own matrix multiply at the decoder's shapes
(torch, fp32 and bf16, on the given threads, batches of 16 documents as the engine encodes them),
and divides: documents/s if every matmul ran at that speed and nothing else cost anything (and the
same for the median query, encoded alone, its matmuls timed at its own few rows). That
ceiling over the naive loop's documents/s (read from an encoder-speed results file of the same
CPU) bounds what any fp32 runtime can reach there; only a precision with faster matmuls (int8 on
VNNI/AMX, bf16 where it is native) can go past it.

    python -m experiments.compute_ceiling --corpus ../shared/data/cisi --docs 64 --threads 2 \\
        --encoder-speed benchmarks/results/encoder-speed-avx512bf16-xeon.json \\
        --out benchmarks/results/compute-ceiling-avx512bf16-xeon.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.tables import write_table
from embedder.encoder import Embedder
from embedder.hardware import cpu_capability
from indexer.corpus import CorpusSpec

BATCH = 16  # documents a batch, as build-index encodes them


def decoder_shapes(config) -> dict[str, tuple[int, int, int]]:
    """name -> (in features, out features, layers) of the decoder's linear layers (a Llama-style block)."""
    d, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = d // config.num_attention_heads * config.num_key_value_heads
    return {"q, o projections": (d, d, 2 * layers), "k, v projections": (d, kv, 2 * layers),
            "MLP gate, up": (d, inter, 2 * layers), "MLP down": (inter, d, layers)}


def document_flops(lengths: list[int], config) -> dict[str, float]:
    """FLOPs of encoding documents of these token counts: linear layers (2 a weight a token), causal
    attention (scores and weighted sum, 4 x d a visible pair a layer) and the LM head on the pooled vector."""
    tokens = float(sum(lengths))
    out = {name: 2.0 * i * o * n * tokens for name, (i, o, n) in decoder_shapes(config).items()}
    pairs = sum(n * (n + 1) / 2 for n in lengths)
    out["attention"] = 4.0 * config.hidden_size * config.num_hidden_layers * pairs
    out["LM head (pooled)"] = 2.0 * config.vocab_size * config.hidden_size * len(lengths)
    return out


def matmul_gflops(rows: int, n_in: int, n_out: int, dtype: torch.dtype, repeats: int = 20) -> float:
    """GFLOP/s of a (rows x n_in) @ (n_in x n_out) product on torch's threads (median of ``repeats``)."""
    a = torch.randn(rows, n_in, dtype=dtype)
    b = torch.randn(n_in, n_out, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * rows * n_in * n_out / float(np.median(times)) / 1e9


def naive_and_best(path: Path | None, column: str = "docs/s") -> tuple[float | None, list[tuple[str, float]]]:
    """(the naive loop's value, [(runtime, value)]) of ``column`` in an encoder-speed results file."""
    if path is None:
        return None, []
    data = json.loads(path.read_text())
    col = data["columns"].index(column)
    rows = [(" ".join(str(x) for x in r[:3]), float(r[col])) for r in data["rows"]]
    naive = next(v for name, v in rows if name.startswith("naive"))
    return naive, rows


def seconds_at_peak(flops: dict[str, float], rates: dict[str, float]) -> float:
    """Seconds for ``flops`` with each linear shape at its measured GFLOP/s; attention and the LM
    head at the square projection's rate (a generous guess: they are smaller matmuls)."""
    seconds = sum(flops[part] / (rate * 1e9) for part, rate in rates.items())
    return seconds + (flops["attention"] + flops["LM head (pooled)"]) / (rates["q, o projections"] * 1e9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.compute_ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="BEIR folder: its first --docs documents")
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--queries", type=int, default=40, help="the first N queries (the median one's length is timed)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--encoder-speed", type=Path, help="an encoder_speed results file of this CPU (the naive loop's documents/s)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    embedder = Embedder.load(args.model, adapter=None, runtime=None)  # the tokenizer and the prompt; the adapter changes no shape
    if args.threads:
        torch.set_num_threads(args.threads)
    config = embedder.causal_lm.config
    texts = [d.text for _, d in zip(range(args.docs), CorpusSpec(args.corpus))]
    lengths = [len(x) for x in embedder.prompt_ids(texts)]
    flops = document_flops(lengths, config)
    rows_per_batch = round(BATCH * float(np.mean(lengths)))
    naive, measured = naive_and_best(args.encoder_speed)
    naive_q, _ = naive_and_best(args.encoder_speed, "query p50 ms")
    queries = [json.loads(line)["text"] for line in (args.corpus / "queries.jsonl").open(encoding="utf-8")][: args.queries]
    q_lengths = sorted(len(x) for x in embedder.prompt_ids(queries, role="query"))
    q_median = q_lengths[len(q_lengths) // 2]  # the median query, alone (a query is encoded on its own)
    table = []
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        shapes = decoder_shapes(config)
        rates = {part: matmul_gflops(rows_per_batch, n_in, n_out, dtype) for part, (n_in, n_out, _) in shapes.items()}
        seconds = seconds_at_peak(flops, rates)
        ceiling = len(texts) / seconds
        q_rates = {part: matmul_gflops(q_median, n_in, n_out, dtype, repeats=50) for part, (n_in, n_out, _) in shapes.items()}
        q_ms = 1000 * seconds_at_peak(document_flops([q_median], config), q_rates)
        table.append([name, round(sum(flops.values()) / seconds / 1e9, 1), " / ".join(f"{rates[k]:.0f}" for k in rates), round(ceiling, 2),
                      round(ceiling / naive, 2) if naive else "–", " / ".join(f"{q_rates[k]:.0f}" for k in q_rates), round(q_ms, 1),
                      round(naive_q / q_ms, 2) if naive_q else "–"])
        print(table[-1], flush=True)
    cap = cpu_capability()
    write_table(
        args.out,
        f"The decoder's documents/s at the CPU's matmul peak ({cap.describe()})",
        "python -m experiments.compute_ceiling " + " ".join(argv if argv is not None else sys.argv[1:]),
        f"{len(texts)} documents of {args.corpus} ({sum(lengths)} prompt tokens, {sum(flops.values()) / len(texts) / 1e9:.2f} GFLOP a "
        f"document; over all of them: linear layers {sum(v for k, v in flops.items() if k not in ('attention', 'LM head (pooled)')) / 1e9:.1f} GFLOP, "
        f"causal attention {flops['attention'] / 1e9:.1f}, LM head on the pooled vectors {flops['LM head (pooled)'] / 1e9:.2f}). torch matmuls "
        f"of {rows_per_batch} rows (a batch of {BATCH} documents) at each linear shape of {args.model}, {torch.get_num_threads()} threads; "
        "the ceiling is documents/s if every FLOP ran at that shape's measured rate and nothing else cost time. "
        f"Queries: the median of the first {len(queries)} queries' prompts ({q_median} tokens), alone, its matmuls timed at that many rows. "
        + (f"Naive fp32 loop: {naive} documents/s and {naive_q} ms a query p50 ({args.encoder_speed}); documents/s measured there: "
           + "; ".join(f"{name} {v}" for name, v in measured) + ". " if naive else "")
        + f"Load average {[round(x, 2) for x in load_before]} before, {[round(x, 2) for x in os.getloadavg()]} after.",
        ["precision", "GFLOP/s (all FLOPs)", "GFLOP/s per shape (q,o / k,v / gate,up / down)", "ceiling documents/s", "ceiling over the naive loop",
         "GFLOP/s per shape, median query", "ceiling ms, median query", "ceiling over the naive loop's query p50"],
        table,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
