"""How far from fp32, and how fast, are the ways of running the decoder in int8 (issue 54)?

Each recipe turns the exported fp32 OpenVINO graph of the default embedder into an int8 one:

- ``dynamic``: the engine's int8 (embedder/runtime.py): int8 weights per output channel (NNCF),
  activations quantised on the fly in groups of ``INT8_ACTIVATION_GROUP``; ``dynamic-g16`` with
  groups of 16;
- ``dynamic-down-fp32``: the same, with every MLP's down projection left in fp32 (the matmul whose
  inputs carry an LLM's activation outliers);
- ``static``: NNCF post-training quantisation (activations per tensor, SmoothQuant, the transformer
  preset) calibrated on other texts of the same draw.

Texts come from the training pairs (``--pairs``: positives, never evaluation data): ``--texts`` to
measure, as many again to calibrate ``static``. Reported per recipe: mean and worst (1 - cosine) of
the pooled embedding to fp32 (x 1e4), top-64 aligned-token overlap, and the seconds to encode the
measured texts in batches of 16 sorted by length against fp32's in the same run. This measures
faithfulness on texts; whether a recipe holds retrieval is the shared-collection check
(``experiments.precision_table --int8-verdict``).

    python -m experiments.int8_recipes --pairs ../shared/data/pairs --out benchmarks/results/int8-recipes.json
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

RECIPES = ("dynamic", "dynamic-g16", "dynamic-down-fp32", "static")
PAIR_FILES = ("scitldr", "medquad", "wikisimple", "debian")


def draw_texts(pairs: Path, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` texts to measure and ``n`` others to calibrate on, drawn evenly from PAIR_FILES' positives."""
    csv.field_size_limit(10**8)
    rng = np.random.default_rng(seed)
    each = max(1, n // len(PAIR_FILES))
    measured, calibration = [], []
    for name in PAIR_FILES:
        path = pairs / f"{name}.tsv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (--pairs is the folder of the training pairs)")
        with path.open(encoding="utf-8") as f:
            rows = [r["positive"][:1500] for r in csv.DictReader(f, delimiter="\t") if r.get("positive")]
        pick = rng.choice(len(rows), 2 * each, replace=False)
        measured += [rows[i] for i in pick[:each]]
        calibration += [rows[i] for i in pick[each:]]
    return measured, calibration


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.int8_recipes", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=Path, default=Path("../shared/data/pairs"))
    p.add_argument("--adapter", default="default")
    p.add_argument("--texts", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import nncf
    import openvino as ov
    import torch
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    from benchmarks.tables import write_table
    from embedder.encoder import Embedder
    from embedder.hardware import cpu_capability
    from embedder.runtime import INT8_ACTIVATION_GROUP, exported_graph, openvino_config

    recipes = [r for r in args.recipes.split(",") if r]
    unknown = set(recipes) - set(RECIPES)
    if unknown:
        p.error(f"unknown recipe(s) {sorted(unknown)}; known: {', '.join(RECIPES)}")
    measured, calibration = draw_texts(args.pairs, args.texts)
    emb = Embedder.load(adapter=args.adapter, dtype="fp32", runtime="openvino")
    prefix = emb._runtime_prefix()
    skip = len(prefix or [])
    graph_dir = exported_graph(emb.body(), "fp32", emb.identity, emb.adapter, prefix)
    core, cpu = ov.Core(), cpu_capability()

    def batches(texts: list[str]) -> list[tuple]:
        ids = sorted((r[skip:] for r in emb.prompt_ids(texts, "document")), key=len)
        return [emb._pad(ids[s:s + 16]) for s in range(0, len(ids), 16)]

    measure_batches = batches(measured)

    def encode(model, dtype: str, group: int | None = None) -> tuple[np.ndarray, float]:
        config = openvino_config(dtype, args.threads, cpu)
        if group is not None:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = group
        request = core.compile_model(model, "CPU", config).create_infer_request()
        ids, mask, _ = measure_batches[0]
        request.infer({"input_ids": ids[:1, :8], "attention_mask": mask[:1, :8]})  # warm-up, not timed
        out, t0 = [], time.perf_counter()
        for ids, mask, lengths in measure_batches:
            h = np.array(request.infer({"input_ids": ids, "attention_mask": mask})[0], np.float32)
            out.append(emb._pool(torch.from_numpy(h), mask, lengths).numpy())
        return np.concatenate(out), time.perf_counter() - t0

    def fp32_graph():
        return core.read_model(str(graph_dir / "model.xml"))

    reference, fp32_s = encode(fp32_graph(), "fp32")
    reference_top, _ = emb.top_tokens(reference, 64)

    def dynamic(kept: list[str] | None = None):
        scope = {"ignored_scope": nncf.IgnoredScope(patterns=kept, validate=False)} if kept else {}
        return nncf.compress_weights(fp32_graph(), mode=nncf.CompressWeightsMode.INT8_ASYM, **scope)

    def static():
        data = nncf.Dataset([{"input_ids": i, "attention_mask": m} for i, m, _ in batches(calibration)])
        return nncf.quantize(fp32_graph(), data, model_type=nncf.ModelType.TRANSFORMER, preset=nncf.QuantizationPreset.MIXED,
                             subset_size=len(calibration), advanced_parameters=AdvancedQuantizationParameters())

    build = {
        "dynamic": lambda: (dynamic(), "int8", None),
        "dynamic-g16": lambda: (dynamic(), "int8", 16),
        "dynamic-down-fp32": lambda: (dynamic([r".*mlp\.down_proj.*"]), "int8", None),
        "static": lambda: (static(), "fp32", None),  # static int8 carries its own quantisers: no dynamic group
    }
    rows = [["fp32", 0.0, 0.0, 1.0, 1.0, round(fp32_s, 2), 1.0]]
    for name in recipes:
        model, dtype, group = build[name]()
        got, seconds = encode(model, dtype, group)
        cos = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
        top, _ = emb.top_tokens(got, 64)
        overlap = np.array([len(set(a) & set(b)) / 64 for a, b in zip(top, reference_top)])
        row = [name, round(float((1 - cos).mean() * 1e4), 2), round(float((1 - cos).max() * 1e4), 2), round(float(overlap.min()), 4),
               round(float(overlap.mean()), 4), round(seconds, 2), round(fp32_s / seconds, 3)]
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    write_table(
        args.out, "int8 recipes of the decoder against its fp32 graph (OpenVINO)",
        "python -m experiments.int8_recipes " + " ".join(argv if argv is not None else sys.argv[1:]),
        (f"{len(measured)} positives of the training pairs ({', '.join(PAIR_FILES)}; never evaluation data), "
                     f"{len(calibration)} others to calibrate static int8; the default embedder's pooled embedding; batches of 16 "
                     f"sorted by length on {args.threads} threads; dynamic activation group {INT8_ACTIVATION_GROUP} unless named. "
         "Speed-up: fp32's seconds over the recipe's in the same run (one pass: indicative)."),
        ["recipe", "mean (1 - cos) x1e4", "worst (1 - cos) x1e4", "top-64 overlap min", "top-64 overlap mean", "seconds",
         "speed-up over fp32"],
        rows,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
