"""Choose the encoder's runtime by timing it on this machine, not by reading its CPU flags (issue 54).

The CPU flags said "native bf16" on an AVX512-BF16 Xeon without AMX, and OpenVINO bf16 encoded
documents there no faster than a naive fp32 loop (1.0x), while on an AMX Xeon the same choice was
5.5x. So for ``dtype="auto"`` on a CPU, the first time a setting (graph, CPU, thread count,
runtime versions, probe texts) is needed on a machine, every candidate runtime
(embedder.hardware.speed_candidates: torch and OpenVINO fp32; bf16 where the CPU has it in
hardware; OpenVINO int8 where it has VNNI or AMX) encodes a fixed batch of documents and a few
queries one at a time, and the fastest *faithful* one is taken, for documents and for queries
apart (a batch and a one-text call do not favour the same runtime).

- OpenVINO candidates are compiled and timed in a child process (embedder/runtime_probe.py), the
  one that already guards against native crashes: a candidate whose compile kills its child is
  never chosen, and its crash verdict is kept for the runtime that would otherwise probe it again.
  torch candidates run in this process: torch fp32 is the reference and the last fallback, which
  runs here anyway.
- Faithful: against torch fp32 on every probe text, cosine >= 0.995 and top-64 aligned-token
  overlap >= 0.9. int8 must also have passed issue 28's shared-collection check (nDCG@10 within
  0.005 of fp32 on every shared collection), which needs minutes and the collections, so it cannot
  run here: int8 is timed and judged, but offered only where a recorded verdict says it passed
  (``int8-quality.json`` in the adapter's directory, see :func:`recorded_int8_verdict`).
- Each timing is the minimum over a few repeats (the CPU may be shared), after a warm-up call.

The verdict (the choice, every candidate's timings and faithfulness, and why) is kept in
``probes.json`` beside the exported fp32 graph, as the crash verdicts are, so later loads read it
and time nothing; the embedder records it in its runtime info and so in index manifests.
"""
from __future__ import annotations

import hashlib
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from embedder.runtime_probe import DEFAULT_TIMEOUT_S, ProbeVerdict, record, remember, run_in_child

log = logging.getLogger(__name__)

# Bump when what the probe measures or how it judges changes, so that older verdicts are not trusted.
SPEED_PROBE_VERSION = 1
COSINE_MIN = 0.995
OVERLAP_MIN = 0.9
TOP_TOKENS = 64
NDCG_TOLERANCE = 0.005  # issue 28's bar for int8, on every shared collection
INT8_VERDICT_FILE = "int8-quality.json"
DOC_REPEATS = 2
QUERY_REPEATS = 3
# The child that compiles and times an OpenVINO candidate ("module:function"); tests point it at one that crashes.
OPENVINO_TARGET = "embedder.speed_probe:time_openvino"

# Fixed probe texts: abstracts of the length the shared collections have, and short queries.
PROBE_DOCUMENTS = (
    ("The retrieval of documents from large collections depends on how well the terms of a query match the terms "
    "used by authors. This study compares automatic indexing with manual indexing by trained librarians on a "
    "collection of technical reports, measuring recall and precision for two hundred queries. Automatic methods "
    "that weight terms by their frequency in a document and their rarity in the collection performed as well as "
    "the manual indexes, at a fraction of the cost."),
    ("Boundary layer transition on a flat plate was measured in a low turbulence wind tunnel at Mach numbers from "
    "0.5 to 3. The location of transition moved downstream as the surface was cooled, and roughness elements "
    "placed near the leading edge brought it forward again. Heat transfer rates agree with the laminar theory "
    "upstream of transition and with turbulent correlations downstream of it."),
    ("Patients with chronic renal failure were treated with a low protein diet supplemented by essential amino "
    "acids for twelve months. Plasma urea fell in all patients, and the rate at which glomerular filtration "
    "declined was slower than in the year before treatment. No patient showed signs of malnutrition, and "
    "serum albumin remained within the normal range throughout the study."),
    ("A library that lends books to readers must decide how many copies of each title to hold. We model the "
    "demand for a title as a process that decays with its age and show that the optimal number of copies "
    "depends on the loan period and on how long readers are willing to wait. The model was fitted to the "
    "circulation records of a university library."),
    ("The electron density of the ionosphere was measured by radio sounding at three stations during a solar "
    "eclipse. The density fell by up to forty per cent in the lower layers while the sun was covered and "
    "recovered within an hour, faster than models of recombination alone predict."),
    ("Citation indexes make it possible to follow a subject forward in time, from an early paper to the papers "
    "that cite it. We describe how such an index is compiled by computer, how its entries are arranged, and "
    "how searchers used it in a trial with chemists and physicists, who found relevant papers that subject "
    "indexes had missed."),
    ("Pressure distributions were calculated for slender wings at supersonic speeds using linearised theory "
    "and compared with measurements on delta wings of several aspect ratios. Agreement is good at small angles "
    "of attack; at larger angles the leading edge vortex changes the loading and the theory underestimates the lift."),
    ("The growth of bacteria in milk stored at low temperatures was followed for ten days. Psychrotrophic "
    "organisms dominated after the third day, and their proteolytic enzymes survived pasteurisation, which "
    "explains the bitter flavour that develops in milk kept too long."),
)
PROBE_QUERIES = (
    "automatic indexing compared with manual indexing",
    "what causes transition of the boundary layer on a cooled plate?",
    "diet therapy in chronic kidney failure",
    "how many copies of a book should a library buy",
    "ionosphere during a solar eclipse",
    "searching the literature with a citation index",
    "lift of delta wings at supersonic speed",
    "bacteria in refrigerated milk",
)


@dataclass
class Trial:
    """One candidate's outcome: whether it ran, its timings and its faithfulness to torch fp32."""

    runtime: str
    dtype: str
    ran: bool
    reason: str  # "offered", or why not: a crash verdict, "unfaithful: ...", "int8: ..."
    docs_per_s: float | None = None
    query_ms: float | None = None  # median over the probe queries, one at a time (the network alone)
    cosine_min: float | None = None
    overlap_min: float | None = None
    faithful: bool = False
    offered: bool = False  # whether auto may take it

    @property
    def label(self) -> str:
        return f"{self.runtime} {self.dtype}"


@dataclass
class SpeedVerdict:
    """The speed probe's choice for documents and for queries, and everything it was chosen from."""

    documents: tuple[str, str]
    queries: tuple[str, str]
    documents_reason: str
    queries_reason: str
    trials: list[Trial]
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    threads: int = 0
    cached: bool = False  # read from probes.json: nothing was timed this time

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, cached: bool = False) -> SpeedVerdict:
        return cls(
            tuple(data["documents"]), tuple(data["queries"]), str(data["documents_reason"]), str(data["queries_reason"]),
            [Trial(**t) for t in data["trials"]], list(data.get("skipped", [])), float(data.get("seconds", 0.0)),
            int(data.get("threads", 0)), cached,
        )

    def record(self) -> dict:
        """What runtime info and manifests keep: the choice, each candidate in one line, and how it was known."""
        lines = []
        for t in self.trials:
            if t.ran:
                lines.append(f"{t.label}: {t.docs_per_s} docs/s, query {t.query_ms} ms, cosine min {t.cosine_min}, "
                             f"top-{TOP_TOKENS} overlap min {t.overlap_min}; {t.reason}")
            else:
                lines.append(f"{t.label}: {t.reason}")
        return {
            "documents": " ".join(self.documents), "queries": " ".join(self.queries), "candidates": lines, "not timed": self.skipped,
            "threads": self.threads, "seconds": round(self.seconds, 1),
        }  # not whether it was read or measured now: a manifest must not change with that


@dataclass
class Measurement:
    """What one candidate gave on the probe texts: timings and pooled embeddings, or why it did not run."""

    ok: bool
    reason: str
    doc_seconds: float = 0.0
    query_seconds: list[float] = field(default_factory=list)
    docs: np.ndarray | None = None  # pooled (n_docs, d)
    queries: np.ndarray | None = None  # pooled (n_queries, d)


@dataclass
class ProbeSetup:
    """Everything the probe needs from the embedder (kept apart from it: no import circle)."""

    body: object  # the torch body the runtimes run (embedder.Embedder.body())
    identity: dict
    adapter: dict | None
    prefix_ids: list[int] | None  # the prompt prefix the runtimes hold (None: not cached)
    docs: tuple[np.ndarray, np.ndarray, np.ndarray]  # ids, mask, lengths after the prefix: one batch
    queries: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # one per query
    pool: Callable  # (hidden torch (b, t, d), mask, lengths) -> pooled torch (b, d)
    top_tokens: Callable  # (pooled (n, d), k) -> (ids (n, k), logits)
    threads: int
    cpu: object  # embedder.hardware.Capability
    fingerprint: dict  # the embedding settings that decide the embeddings (pooling, attention...)
    cache_root: Path | None = None
    doc_repeats: int = DOC_REPEATS
    query_repeats: int = QUERY_REPEATS


# ------------------------------------------------------------------ timing (parent and child)
def time_hidden(hidden: Callable, docs: tuple, queries: list[tuple], doc_repeats: int, query_repeats: int) -> dict:
    """Time ``hidden(ids, mask)`` on the document batch (best of ``doc_repeats``) and on each query
    alone (best of ``query_repeats`` each), after a warm-up call of each kind."""
    hidden(*queries[0][:2])
    docs_out = hidden(*docs[:2])
    doc_best = float("inf")
    for _ in range(doc_repeats):
        t0 = time.perf_counter()
        docs_out = hidden(*docs[:2])
        doc_best = min(doc_best, time.perf_counter() - t0)
    query_best = [float("inf")] * len(queries)
    query_out: list = [None] * len(queries)
    for _ in range(query_repeats):
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            query_out[i] = hidden(*q[:2])
            query_best[i] = min(query_best[i], time.perf_counter() - t0)
    return {"doc_seconds": doc_best, "query_seconds": query_best, "docs": docs_out, "queries": query_out}


def time_openvino(xml: str, config: dict, inputs: str, out: str, doc_repeats: int, query_repeats: int) -> None:
    """A probe child's work: compile the graph (where a native crash would kill the child), time it
    on the probe inputs, and write the timings (``out``.json) and the hidden states (``out``.npz)."""
    import openvino as ov

    data = np.load(inputs)
    request = ov.Core().compile_model(xml, "CPU", config).create_infer_request()

    def hidden(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.array(request.infer({"input_ids": ids, "attention_mask": mask})[0], dtype=np.float32, copy=True)

    n = int(data["n_queries"])
    queries = [(data[f"q{i}_ids"], data[f"q{i}_mask"]) for i in range(n)]
    got = time_hidden(hidden, (data["doc_ids"], data["doc_mask"]), queries, doc_repeats, query_repeats)
    np.savez(out + ".npz", docs=got["docs"], **{f"q{i}": h for i, h in enumerate(got["queries"])})
    Path(out + ".json").write_text(json.dumps({"doc_seconds": got["doc_seconds"], "query_seconds": got["query_seconds"]}), encoding="utf-8")


def _pooled(setup: ProbeSetup, docs_hidden, queries_hidden) -> tuple[np.ndarray, np.ndarray]:
    import torch

    d = setup.pool(torch.as_tensor(np.asarray(docs_hidden, np.float32)), setup.docs[1], setup.docs[2])
    q = [setup.pool(torch.as_tensor(np.asarray(h, np.float32)), m, n) for h, (_, m, n) in zip(queries_hidden, setup.queries)]
    return d.float().numpy(), torch.cat(q).float().numpy()


def _measure_torch(dtype: str, setup: ProbeSetup) -> Measurement:
    import torch

    from embedder.runtime import TorchRuntime

    runtime = TorchRuntime(setup.body, dtype, setup.prefix_ids)
    with torch.inference_mode():
        got = time_hidden(lambda i, m: runtime.hidden(i, m).numpy(), setup.docs, setup.queries, setup.doc_repeats, setup.query_repeats)
        docs, queries = _pooled(setup, got["docs"], got["queries"])
    return Measurement(True, "ran", got["doc_seconds"], got["query_seconds"], docs, queries)


def _measure_openvino(dtype: str, setup: ProbeSetup, crashes: list) -> Measurement:
    from embedder.runtime import crash_fields, exported_graph, openvino_config

    try:
        directory = exported_graph(setup.body, dtype, setup.identity, setup.adapter, setup.prefix_ids, setup.cache_root)
    except Exception as exc:  # noqa: BLE001 - e.g. int8 without NNCF: that candidate is out, the others stand
        log.warning("openvino %s: its export failed (%s); not a candidate", dtype, exc)
        return Measurement(False, f"export failed: {type(exc).__name__}: {exc}"[:300])
    config = openvino_config(dtype, setup.threads, setup.cpu)
    with tempfile.TemporaryDirectory(prefix="speed-probe-") as work:
        inputs, out = str(Path(work) / "inputs.npz"), str(Path(work) / "out")
        arrays = {"doc_ids": setup.docs[0], "doc_mask": setup.docs[1], "n_queries": np.array(len(setup.queries))}
        for i, (ids, mask, _) in enumerate(setup.queries):
            arrays[f"q{i}_ids"], arrays[f"q{i}_mask"] = ids, mask
        np.savez(inputs, **arrays)
        kwargs = {"xml": str(directory / "model.xml"), "config": config, "inputs": inputs, "out": out,
                  "doc_repeats": setup.doc_repeats, "query_repeats": setup.query_repeats}
        log.info("timing openvino %s in a child process once on this machine", dtype)
        verdict = run_in_child(OPENVINO_TARGET, kwargs, DEFAULT_TIMEOUT_S)
        # kept as the crash probe's verdict too: the runtime built next does not try it again
        crashes.append((directory, crash_fields(config, setup.cpu), ProbeVerdict(verdict.ok, verdict.reason, verdict.seconds)))
        if not verdict.ok:
            return Measurement(False, f"{verdict.reason} at its first compile (in a child process)")
        timings = json.loads(Path(out + ".json").read_text(encoding="utf-8"))
        hidden = np.load(out + ".npz")
        docs, queries = _pooled(setup, hidden["docs"], [hidden[f"q{i}"] for i in range(len(setup.queries))])
    return Measurement(True, "ran", float(timings["doc_seconds"]), [float(s) for s in timings["query_seconds"]], docs, queries)


def measure(candidate: tuple[str, str], setup: ProbeSetup, crashes: list) -> Measurement:
    """Run one candidate on the probe texts (OpenVINO: in a child process; its crash verdict is
    appended to ``crashes`` as (directory, fields, verdict))."""
    runtime, dtype = candidate
    return _measure_torch(dtype, setup) if runtime == "torch" else _measure_openvino(dtype, setup, crashes)


# ------------------------------------------------------------------ judging and choosing
def recorded_int8_verdict(adapter: dict | None) -> tuple[bool, str]:
    """Whether issue 28's shared-collection check passed for int8 with this adapter, and where that is said.

    The check (nDCG@10 of int8 documents and queries within 0.005 of fp32 on every shared
    collection) needs the collections and minutes, so the probe cannot run it: a run of it records
    ``{"adapter_sha256", "passed", "max_ndcg_drop", "source"}`` as ``int8-quality.json`` in the
    adapter's directory (:func:`write_int8_verdict`; ``python -m experiments.precision_table
    --int8-verdict DIR`` writes it from two beir-eval runs)."""
    path = Path((adapter or {}).get("path") or "") / INT8_VERDICT_FILE if adapter and adapter.get("path") else None
    if path is None or not path.is_file():
        return False, f"no recorded nDCG@10 verdict (issue 28's shared-collection check, within {NDCG_TOLERANCE}) for this adapter"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False, f"{path}: unreadable"
    if data.get("adapter_sha256") != adapter.get("sha256"):
        return False, f"{path} is about other adapter weights"
    if data.get("int8_recipe") != _int8_recipe_id():
        return False, f"{path} is about another int8 recipe (recorded {data.get('int8_recipe')}, this version's {_int8_recipe_id()})"
    drop = data.get("max_ndcg_drop")
    if data.get("passed") is True and isinstance(drop, (int, float)) and drop <= NDCG_TOLERANCE:
        return True, f"nDCG@10 within {drop} of fp32 ({data.get('source', path)})"
    return False, f"nDCG@10 check not passed ({path}: max drop {drop})"


def write_int8_verdict(adapter_dir: str | Path, differences: dict[str, float], source: str, cpu: str) -> dict:
    """Record issue 28's shared-collection check for int8 with the adapter in ``adapter_dir``, as
    ``int8-quality.json`` there (written atomically): the verdict :func:`recorded_int8_verdict` reads.

    ``differences`` maps "collection/system" to int8's nDCG@10 minus fp32's. Passed when every one is
    within ``NDCG_TOLERANCE`` either way: an int8 run that scores much *higher* is just as much a
    different model. The adapter's weights are hashed here, so the verdict cannot outlive them."""
    from embedder.util import weights_sha256, write_json_atomic

    if not differences:
        raise ValueError("write_int8_verdict: no nDCG@10 differences to judge")
    worst_drop = max(0.0, -min(differences.values()))
    verdict = {
        "adapter_sha256": weights_sha256(adapter_dir), "int8_recipe": _int8_recipe_id(), "passed": all(abs(d) <= NDCG_TOLERANCE for d in differences.values()),
        "max_ndcg_drop": round(worst_drop, 4), "max_abs_difference": round(max(abs(d) for d in differences.values()), 4),
        "tolerance": NDCG_TOLERANCE, "differences": {k: round(v, 4) for k, v in sorted(differences.items())}, "source": source, "cpu": cpu,
    }
    write_json_atomic(Path(adapter_dir) / INT8_VERDICT_FILE, verdict)
    return verdict


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)


def judge(candidate: tuple[str, str], got: Measurement, reference: Measurement, top_tokens: Callable, int8_ok: tuple[bool, str]) -> Trial:
    """A candidate's trial: its speed, and whether it is faithful to torch fp32 (every probe text:
    cosine >= 0.995, top-64 overlap >= 0.9) and may be offered to ``auto``."""
    runtime, dtype = candidate
    if not got.ok:
        return Trial(runtime, dtype, False, got.reason)
    mine = np.concatenate([got.docs, got.queries])
    ref = np.concatenate([reference.docs, reference.queries])
    cos = _cosines(mine, ref)
    a, _ = top_tokens(mine, TOP_TOKENS)
    b, _ = top_tokens(ref, TOP_TOKENS)
    k = a.shape[1]
    overlap = np.array([len(set(x) & set(y)) / k for x, y in zip(a.tolist(), b.tolist())])
    cos_min, overlap_min = float(cos.min()), float(overlap.min())
    faithful = cos_min >= COSINE_MIN and overlap_min >= OVERLAP_MIN
    if not faithful:
        reason = f"unfaithful: cosine min {cos_min:.5f} (bar {COSINE_MIN}), top-{TOP_TOKENS} overlap min {overlap_min:.3f} (bar {OVERLAP_MIN})"
    elif dtype == "int8" and not int8_ok[0]:
        reason = f"faithful on the probe texts but not offered: {int8_ok[1]}"
    else:
        reason = "offered" + (f" ({int8_ok[1]})" if dtype == "int8" else "")
    n_docs = len(reference.docs)
    return Trial(
        runtime, dtype, True, reason, round(n_docs / max(got.doc_seconds, 1e-9), 2), round(1000 * statistics.median(got.query_seconds), 2),
        round(cos_min, 5), round(overlap_min, 3), faithful, faithful and reason.startswith("offered"),
    )


def choose(trials: list[Trial], skipped: list[str], seconds: float = 0.0, threads: int = 0) -> SpeedVerdict:
    """The fastest offered trial for documents (documents/s) and for queries (median latency), apart.
    Where none is offered (every candidate crashed or was unfaithful), torch fp32, the reference."""
    offered = [t for t in trials if t.offered]
    if not offered:
        why = "no candidate ran faithfully (" + "; ".join(f"{t.label}: {t.reason}" for t in trials) + "): torch fp32, the reference"
        return SpeedVerdict(("torch", "fp32"), ("torch", "fp32"), why, why, trials, skipped, seconds, threads)
    docs = max(offered, key=lambda t: t.docs_per_s)
    queries = min(offered, key=lambda t: t.query_ms)

    def others(best: Trial, what: Callable[[Trial], str]) -> str:
        rest = [f"{t.label} {what(t)}" for t in trials if t is not best and t.offered]
        rest += [f"{t.label} not offered ({t.reason})" for t in trials if not t.offered]
        if skipped:
            rest.append("not timed: " + ", ".join(s.split(":")[0] for s in skipped))
        return "; ".join(rest)

    doc_why = f"speed probe: fastest faithful for documents here, {docs.docs_per_s} docs/s (against {others(docs, lambda t: f'{t.docs_per_s}')})"
    query_why = f"speed probe: fastest faithful for queries here, {queries.query_ms} ms (against {others(queries, lambda t: f'{t.query_ms} ms')})"
    return SpeedVerdict((docs.runtime, docs.dtype), (queries.runtime, queries.dtype), doc_why, query_why, trials, skipped, seconds, threads)


# ------------------------------------------------------------------ the probe, cached
def verdict_directory(setup: ProbeSetup, have_openvino: bool) -> Path:
    """Where the verdict is kept: beside the exported fp32 graph (the one every OpenVINO candidate
    but int8 compiles), or, without OpenVINO, a folder keyed the same way."""
    from embedder.models import cache_dir
    from embedder.runtime import graph_directory

    if have_openvino:
        return graph_directory(setup.body, "fp32", setup.identity, setup.adapter, setup.prefix_ids, setup.cache_root)
    what = {"model": setup.identity.get("sha256") or setup.identity.get("name"), "adapter": (setup.adapter or {}).get("sha256"),
            "prefix": list(setup.prefix_ids or []), "torch-only": True}
    return (setup.cache_root or cache_dir() / "runtimes") / ("torch-" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20])


def probe_speed(setup: ProbeSetup, candidates: list[tuple[str, str]], skipped: list[str], refresh: bool = False) -> SpeedVerdict:
    """The verdict for ``candidates`` on this machine: read from ``probes.json``, or measured once and
    kept there (``refresh``: measured again, and the new verdict kept)."""
    import torch

    int8_ok = recorded_int8_verdict(setup.adapter)
    have_openvino = any(runtime == "openvino" for runtime, _ in candidates)
    inputs = hashlib.sha256()
    for ids, mask, _ in [setup.docs, *setup.queries]:
        inputs.update(ids.tobytes() + mask.tobytes() + str(ids.shape).encode())
    fields = {
        "kind": "speed", "speed_probe": SPEED_PROBE_VERSION, "candidates": [" ".join(c) for c in candidates],
        "cpu": setup.cpu.name, "flags": list(setup.cpu.flags), "threads": setup.threads, "torch": torch.__version__,
        "openvino": _openvino_version() if have_openvino else None, "inputs": inputs.hexdigest()[:20], "embedding": setup.fingerprint,
        "int8_verdict": int8_ok[0], "int8_recipe": _int8_recipe_id() if have_openvino else None,
    }
    if have_openvino:  # exported before its folder gets a lock file beside it (an export is renamed into place)
        from embedder.runtime import exported_graph

        exported_graph(setup.body, "fp32", setup.identity, setup.adapter, setup.prefix_ids, setup.cache_root)
    directory = verdict_directory(setup, have_openvino)
    crashes: list = []

    def run() -> dict:
        log.info("timing the encoder's candidate runtimes once on this machine (%s)", ", ".join(" ".join(c) for c in candidates))
        t0 = time.perf_counter()
        reference = measure(("torch", "fp32"), setup, crashes)
        trials = []
        for candidate in candidates:
            got = reference if candidate == ("torch", "fp32") else measure(candidate, setup, crashes)
            trials.append(judge(candidate, got, reference, setup.top_tokens, int8_ok))
        return choose(trials, skipped, time.perf_counter() - t0, setup.threads).to_dict()

    data, cached = remember(directory, fields, run, valid=lambda v: "documents" in v and "trials" in v, refresh=refresh)
    for where, crash_key, verdict in crashes:  # after the lock above is let go: the same folder's
        record(where, crash_key, verdict)
    verdict = SpeedVerdict.from_dict(data, cached=cached)
    if not cached:
        log.info("speed probe: documents %s (%s); queries %s (%s)", " ".join(verdict.documents), verdict.documents_reason,
                 " ".join(verdict.queries), verdict.queries_reason)
    return verdict


def _int8_recipe_id() -> str:
    # embedder.runtime imports torch, which this module leaves to the probe itself
    from embedder.runtime import int8_recipe_id

    return int8_recipe_id()


def _openvino_version() -> str:
    import openvino

    return openvino.__version__


__all__ = [
    "COSINE_MIN", "INT8_VERDICT_FILE", "OVERLAP_MIN", "PROBE_DOCUMENTS", "PROBE_QUERIES", "SPEED_PROBE_VERSION", "Measurement",
    "ProbeSetup", "SpeedVerdict", "Trial", "choose", "judge", "measure", "probe_speed", "recorded_int8_verdict", "time_hidden",
    "time_openvino", "write_int8_verdict",
]
