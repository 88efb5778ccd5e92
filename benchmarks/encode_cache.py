"""Encode collections' documents into an embedding cache, on one machine, for runs on another.

Encoding the documents is the whole cost of an evaluation with the LLM (hours for the shared
collections on two CPU cores, a minute or two on a GPU); everything after the pooled
embedding is cheap. This fills ``--cache`` (embedder/cache.py) with the pooled embedding of
every document of each collection, read exactly as ``beir-eval`` reads it, so that a later
``beir-eval --embedding-cache DIR`` with the same model, adapter, ``--dtype`` and
``--runtime`` serves every document from it, wherever it runs::

    python -m benchmarks.encode_cache --data ../shared/data --adapter A --dtype fp32 --runtime torch \\
        --device cuda --cache .cache/embeddings

The cache key covers the weights, the adapter, the embedding settings, the runtime and the
precision, not the device: fp32 on a GPU and fp32 on a CPU compute the same function (they
differ in the last bits of a float sum). The key of each role is printed, and written beside
the cache in ``encode_cache.json``, so the run that reads the cache can be checked against it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.datasets import resolve
from embedder.cache import CachedEmbedder, embedder_key


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.encode_cache", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, help="a collection (BEIR folder, a folder of them, or a dataset id); repeatable")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", default="default")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="the precision the reading run will name (auto is refused: its choice depends on the machine)")
    p.add_argument("--runtime", choices=("torch", "openvino"), default="torch")
    p.add_argument("--device", default=None, help="cuda, cpu (default: cuda when there is one)")
    p.add_argument("--batch-size", type=int, default=None, help="documents per forward pass (does not change the key)")
    p.add_argument("--cache", type=Path, required=True, help="the embedding cache folder to fill")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from embedder.encoder import Embedder

    embedder = Embedder.load(args.model, adapter=args.adapter, device=args.device, dtype=args.dtype, runtime=args.runtime)
    if args.batch_size:
        embedder.config = replace(embedder.config, batch_size=args.batch_size)
    cached = CachedEmbedder(embedder, args.cache)
    record = {"model": embedder.identity, "adapter": embedder.adapter, "device": str(embedder.device),
              "runtime": embedder.runtime_name, "dtype": embedder.dtype,
              "keys": {role: embedder_key(embedder, role) for role in ("document", "query")}, "collections": {}}
    print(f"encode_cache: keys {record['keys']} ({embedder.runtime_name} {embedder.dtype} on {embedder.device})", file=sys.stderr)
    for spec in args.data:
        for ds in resolve(spec):
            texts = [d.text for d in ds.docs]
            t0, hits = time.perf_counter(), cached.hits
            with torch.inference_mode():  # iter_batches keeps autograd on for training's callers
                for _ in cached.iter_batches(texts, role="document"):
                    pass
            seconds = time.perf_counter() - t0
            encoded = len(texts) - (cached.hits - hits)
            record["collections"][ds.name] = {"documents": len(texts), "encoded": encoded, "seconds": round(seconds, 1)}
            print(f"  {ds.name}: {len(texts)} documents, {encoded} encoded in {seconds:.1f} s", file=sys.stderr)
    out = args.cache / "encode_cache.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
