"""Is the fast encoder faithful? nDCG@10 of two beir-eval runs side by side, per collection.

The reference run encodes with the plain transformers forward in fp32 (``beir-eval --runtime
reference``); the candidate with whatever runtime and dtype it names (by default ``auto``:
OpenVINO fp32 on a CPU without native bf16). Collections of the reference that the candidate
lacks are named in the table as not compared. Each row: a collection and a system, both
nDCG@10, their difference, the paired t-test p-value on per-query nDCG@10 (ranx), and whether
it is within the tolerance.

    python -m experiments.precision_table --reference benchmarks/results/runtime-fp32 \\
        --candidate benchmarks/results/runtime-openvino-fp32 --systems sparse,dense,hybrid \\
        --out benchmarks/results/precision_faithfulness.json

With ``--int8-verdict ADAPTER_DIR`` (an fp32 reference and an OpenVINO int8 candidate, both made with
that adapter, on every collection of the reference), the outcome is also written as the adapter's
``int8-quality.json``: the recorded verdict without which ``dtype="auto"`` never takes int8
(embedder/speed_probe.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.results_file import load_results
from benchmarks.tables import study_command, write_table
from embedder.speed_probe import NDCG_TOLERANCE

TOLERANCE = NDCG_TOLERANCE  # issue 28's bar: nDCG@10 within 0.005 of fp32 on every collection


def _results(folder: Path) -> dict:
    path = folder / "results.json"
    if not path.exists():
        raise SystemExit(f"precision_table: {path}: no beir-eval results there")
    return load_results(path)


def _params(res: dict, system: str) -> dict:
    """The params beir-eval recorded for ``system`` (run-level, else the first collection's)."""
    params = (res.get("systems") or {}).get(system, {}).get("params")
    if params:
        return params
    for ds in res["datasets"]:
        if ds["results"].get(system, {}).get("params"):
            return ds["results"][system]["params"]
    return {}


def _runtime(res: dict, system: str) -> str:
    rt = _params(res, system).get("runtime")
    return f"{rt.get('name')} {rt.get('dtype')}" if rt else (res.get("settings") or {}).get("runtime", "?")


def _int8_verdict(adapter_dir: Path, ref: dict, cand: dict, systems: list[str], differences: dict[str, float], missing: list[str],
                  source: str) -> dict:
    """Write ``int8-quality.json`` for the adapter in ``adapter_dir``, after checking that both runs
    are about its weights, that the candidate is OpenVINO int8 against fp32, and that no collection
    of the reference was left out (a partial check is not issue 28's check)."""
    from embedder.speed_probe import write_int8_verdict
    from embedder.util import weights_sha256

    sha = weights_sha256(adapter_dir)
    for name, res in (("reference", ref), ("candidate", cand)):
        for system in systems:
            got = (_params(res, system).get("adapter") or {}).get("sha256")
            if got != sha:
                raise SystemExit(f"precision_table: --int8-verdict {adapter_dir}: the {name} run's {system!r} was made with adapter "
                                 f"weights {got}, not these ({sha})")
    ref_rt, cand_rt = _params(ref, systems[0]).get("runtime") or {}, _params(cand, systems[0]).get("runtime") or {}
    if cand_rt.get("dtype") != "int8" or ref_rt.get("dtype") != "fp32":
        raise SystemExit(f"precision_table: --int8-verdict needs an fp32 reference and an int8 candidate, not "
                         f"{ref_rt.get('dtype')} and {cand_rt.get('dtype')}")
    if missing:
        raise SystemExit(f"precision_table: --int8-verdict: the candidate has no run for {', '.join(missing)}; the check is on every collection")
    cap = cand_rt.get("capability") or {}
    cpu = f"{cap.get('name', '?')} [{' '.join(cap.get('flags') or [])}]"
    return write_int8_verdict(adapter_dir, differences, source, cpu)


def _p_value(ref_folder: Path, cand_folder: Path, ref_ds: dict, cand_ds: dict, system: str) -> float | None:
    """Paired t-test of per-query nDCG@10 (ranx.compare) between the two runs of one system."""
    try:
        from ranx import Qrels, Run, compare

        from benchmarks.datasets import resolve
        from benchmarks.runs import read_trec
    except ImportError:
        return None
    ds = resolve(str(ref_ds["source"]))[0]
    a = read_trec(ref_folder / ref_ds["results"][system]["run_file"])
    b = read_trec(cand_folder / cand_ds["results"][system]["run_file"])
    qrels = Qrels({q: {d: int(r) for d, r in rel.items()} for q, rel in ds.qrels.items() if q in a})
    runs = [Run(run, name=name) for run, name in ((a, "reference"), (b, "candidate"))]
    report = compare(qrels=qrels, runs=runs, metrics=["ndcg@10"], max_p=0.05, stat_test="student")
    value = float(report.to_dict()["candidate"]["comparisons"]["reference"]["ndcg@10"])
    return value if np.isfinite(value) else None  # identical per-query scores: the t-test is undefined


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", type=Path, required=True, help="beir-eval output folder of the fp32 reference run")
    p.add_argument("--candidate", type=Path, required=True, help="beir-eval output folder of the run to check")
    p.add_argument("--systems", default="sparse,dense,hybrid")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--int8-verdict", type=Path, metavar="ADAPTER_DIR",
                   help="also record the result as int8-quality.json in this adapter's folder (the speed probe offers OpenVINO "
                        "int8 to auto only where it says passed): both runs must be this adapter's, fp32 against int8, every collection")
    args = p.parse_args(argv)
    ref, cand = _results(args.reference), _results(args.candidate)
    systems = args.systems.split(",")
    cand_by_name = {d["name"]: d for d in cand["datasets"]}
    rows, worst, missing, differences = [], 0.0, [], {}
    for ds in ref["datasets"]:
        other = cand_by_name.get(ds["name"])
        if other is None:  # said in the table's description: a partial comparison is not a full one
            missing.append(ds["name"])
            continue
        for system in systems:
            if system not in ds["results"] or system not in other["results"]:
                raise SystemExit(f"precision_table: system {system!r} missing for {ds['name']!r} in one of the runs")
            a, b = ds["results"][system]["metrics"]["ndcg@10"], other["results"][system]["metrics"]["ndcg@10"]
            diff = b - a
            differences[f"{ds['name']}/{system}"] = diff
            worst = max(worst, abs(diff))
            pv = _p_value(args.reference, args.candidate, ds, other, system)
            rows.append([ds["name"], system, round(a, 4), round(b, 4), round(diff, 4), None if pv is None else round(pv, 3),
                         "yes" if abs(diff) <= TOLERANCE else "NO"])
    ref_rt, cand_rt = _runtime(ref, systems[0]), _runtime(cand, systems[0])
    command = study_command("experiments.precision_table", argv)
    write_table(
        args.out,
        f"Faithfulness of the fast encoder: nDCG@10, {cand_rt} vs {ref_rt}",
        command,
        f"The same index settings and queries encoded by the fp32 reference ({args.reference}: {ref_rt}) and by the fast "
        f"path ({args.candidate}: {cand_rt}); documents and queries in the same precision. Tolerance {TOLERANCE}; "
        f"largest |difference| {worst:.4f}. p: paired t-test on per-query nDCG@10 (ranx)."
        + (f" NOT COMPARED (no candidate run): {', '.join(missing)}." if missing else ""),
        ["collection", "system", f"nDCG@10 {ref_rt}", f"nDCG@10 {cand_rt}", "difference", "p", f"within {TOLERANCE}"],
        rows,
        details={"tolerance": TOLERANCE, "max_abs_difference": worst, "not_compared": missing},
    )
    print(f"largest |nDCG@10 difference| {worst:.4f} (tolerance {TOLERANCE}); wrote {args.out}")
    if args.int8_verdict is not None:
        verdict = _int8_verdict(args.int8_verdict, ref, cand, systems, differences, missing, f"{command} ({args.out})")
        print(f"int8 verdict for {args.int8_verdict}: {'passed' if verdict['passed'] else 'NOT passed'} "
              f"(largest |difference| {verdict['max_abs_difference']}); wrote {args.int8_verdict / 'int8-quality.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
