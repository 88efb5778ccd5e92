"""A token-bag student's head compiled by OpenVINO: the same fp32 arithmetic, no Python per operator.

The head is a dozen small matrix products over a query's dozen tokens (embedder/query_encoder.py,
:class:`TokenBagHead`). In torch's eager mode each product costs more in dispatch than in
arithmetic: 4.4 ms a query on 2 AVX2 cores, against 1.8 ms for the same graph compiled by
OpenVINO (docs/speed-and-precision.md), and a distilled query's budget is a few milliseconds.

The graph is exported once per head (keyed by a digest of its weights) into the runtime cache
(``$ALIGNED_TOKENS_CACHE/runtimes``) and compiled in the precision asked for, f32 or bf16, always
named explicitly (an AMX CPU would otherwise switch OpenVINO to bf16 by itself); which one a
CPU gets is :func:`embedder.hardware.student_precision`. As for the LLM's graph
(embedder/runtime.py), the first compile of a setting on a machine runs in a child process
(embedder/runtime_probe.py); a setting that fails there raises :class:`StudentRuntimeUnusable`,
and :meth:`embedder.query_encoder.DistilledQueryEncoder.compile` tries the next (f32, then torch).

One query at a time (what a served engine answers) runs a copy of the graph compiled for a fixed
length (:data:`STATIC_LENGTHS`), the query padded to the next one (its mask hides the padding):
with every shape known at compile time OpenVINO skips its per-call shape inference and picks
kernels for that shape. Batches, and queries longer than the longest, run the dynamic graph.
Every compiled graph must reproduce the torch head on a probe input before it answers anything
(:data:`TOLERANCE`): OpenVINO 2026.4's CPU plugin computes the bf16 head wrong at the static length
8 (a quarter of the largest output off, at every count of real tokens; the dynamic graph and
the other lengths are right), so a graph that fails is dropped, with a warning, not trusted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedder.hardware import cpu_capability
from embedder.models import cache_dir
from embedder.runtime import save_graph
from embedder.runtime_probe import probe

log = logging.getLogger(__name__)

# Bump when the export changes, so that graphs of an older export are not reused.
STUDENT_EXPORT_VERSION = 1
INPUTS = ("sentence", "tokens", "mask")
STUDENT_PRECISIONS = ("f32", "bf16")
# Query lengths (the student's LLM tokens) with a graph of their own, compiled for one query at a
# time; 8 is left out for the OpenVINO bug in the module docstring. Each costs ~0.1 s to compile and
# ~17 MB (2-core AVX512-BF16; the speed-up: docs/speed-and-precision.md).
STATIC_LENGTHS = (16, 32, 64, 96)
# How far a compiled graph's output may be from the torch head's on the probe input (the largest
# absolute difference over the largest absolute output): bf16 rounding gives ~0.004, the bug ~0.25.
TOLERANCE = {"f32": 1e-3, "bf16": 0.02}


class StudentRuntimeUnusable(RuntimeError):
    """The student's graph could not be exported or compiled here: the torch head stays."""


def head_digest(head: torch.nn.Module) -> str:
    """A digest of the head's weights and shapes: which exported graph is its own."""
    h = hashlib.sha256()
    for name, p in sorted(head.state_dict().items()):
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def _example(d_enc: int, d_llm: int, n: int = 2, length: int = 5, encoder_tokens: bool = False) -> tuple[np.ndarray, ...]:
    mask = np.ones((n, length), np.float32)
    mask[-1, length // 2 :] = 0  # a padded row, so that the traced graph keeps the masking
    out = (np.zeros((n, d_enc), np.float32), np.full((n, length, d_llm), 0.01, np.float32), mask)
    if encoder_tokens:  # the sentence encoder's token states, one more than the LLM's tokens (they differ in length)
        states_mask = np.ones((n, length + 1), np.float32)
        states_mask[-1, (length + 1) // 2 :] = 0
        out += (np.full((n, length + 1, d_enc), 0.1, np.float32), states_mask)
    return out


def probe_input(d_enc: int, d_llm: int, n: int, length: int, encoder_tokens: bool = False) -> tuple[np.ndarray, ...]:
    """Inputs at the scale of real ones (a unit-norm sentence embedding, tokens like an LLM's
    input-embedding rows, std ~0.03; constant inputs hide the OpenVINO bug that random ones of
    this scale show), the last row's last quarter padded; with ``encoder_tokens``, token states
    like a sentence encoder's last layer (std ~0.5), as many, padded alike."""
    rng = np.random.default_rng(length)
    sentence = (rng.standard_normal((n, d_enc)) / np.sqrt(d_enc)).astype(np.float32)
    tokens = (0.03 * rng.standard_normal((n, length, d_llm))).astype(np.float32)
    mask = np.ones((n, length), np.float32)
    mask[-1, length - length // 4 :] = 0
    if not encoder_tokens:
        return sentence, tokens, mask
    return sentence, tokens, mask, (0.5 * rng.standard_normal((n, length, d_enc))).astype(np.float32), mask.copy()


def static_model(model, d_enc: int, d_llm: int, length: int):
    """A copy of the exported graph with every shape fixed: one query of ``length`` tokens (and,
    for a head that reads them, ``length`` token states of the sentence encoder)."""
    fixed = model.clone()
    shapes = {fixed.inputs[0]: [1, d_enc], fixed.inputs[1]: [1, length, d_llm], fixed.inputs[2]: [1, length]}
    if len(fixed.inputs) == 5:
        shapes.update({fixed.inputs[3]: [1, length, d_enc], fixed.inputs[4]: [1, length]})
    fixed.reshape(shapes)
    return fixed


def _export(head: torch.nn.Module, d_enc: int, d_llm: int, target: Path, encoder_tokens: bool = False) -> None:
    """Trace ``head`` into an OpenVINO IR in ``target`` (a temporary folder, then renamed)."""
    import openvino as ov

    example = tuple(torch.from_numpy(a) for a in _example(d_enc, d_llm, encoder_tokens=encoder_tokens))
    shapes = [ov.PartialShape([-1, d_enc]), ov.PartialShape([-1, -1, d_llm]), ov.PartialShape([-1, -1])]
    if encoder_tokens:
        shapes += [ov.PartialShape([-1, -1, d_enc]), ov.PartialShape([-1, -1])]
    with torch.no_grad():
        graph = ov.convert_model(head, example_input=example, input=shapes)
    save_graph(graph, target)


def compile_student(xml: str, config: dict, d_enc: int, d_llm: int, lengths: tuple[int, ...] = (), encoder_tokens: bool = False) -> None:
    """Compile an exported head with ``config`` and run one padded batch, then the same for each
    static length in ``lengths``: what a probe child does."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(xml)
    core.compile_model(model, "CPU", config).create_infer_request().infer(list(_example(d_enc, d_llm, encoder_tokens=encoder_tokens)))
    for length in lengths:
        compiled = core.compile_model(static_model(model, d_enc, d_llm, length), "CPU", config)
        compiled.create_infer_request().infer(list(probe_input(d_enc, d_llm, 1, length, encoder_tokens)))


class CompiledHead:
    """A token-bag head run by OpenVINO (f32 or bf16): ``(sentence, tokens, mask) -> h``, as the torch head.

    ``static_lengths``: the lengths with a fixed-shape graph of their own (module docstring); () for none."""

    # What a probe child runs ("module:function"); tests point it at a compile that crashes.
    probe_target = "embedder.student_runtime:compile_student"

    def __init__(
        self, head: torch.nn.Module, d_enc: int, d_llm: int, threads: int | None = None, cache_root: Path | None = None,
        precision: str = "f32", static_lengths: tuple[int, ...] = STATIC_LENGTHS, encoder_tokens: bool = False,
    ) -> None:  # fmt: skip
        if precision not in STUDENT_PRECISIONS:
            raise ValueError(f"student precision must be one of {', '.join(STUDENT_PRECISIONS)}, not {precision!r}")
        self.precision = precision
        try:
            import openvino as ov
        except ImportError:
            raise StudentRuntimeUnusable("OpenVINO is not installed") from None
        root = cache_root or cache_dir() / "runtimes"
        key = hashlib.sha256(json.dumps({"head": head_digest(head), "export": STUDENT_EXPORT_VERSION, "openvino": ov.__version__}).encode())
        self.directory = root / f"student-{key.hexdigest()[:20]}"
        xml = self.directory / "model.xml"
        if not xml.exists():
            log.info("exporting the query encoder's head to OpenVINO (once) into %s", self.directory)
            _export(head.eval(), d_enc, d_llm, self.directory, encoder_tokens)
        config: dict = {
            "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads()),
            "INFERENCE_PRECISION_HINT": precision,  # asked for explicitly: an AMX CPU would otherwise pick bf16 by itself
            "PERFORMANCE_HINT": "LATENCY",
        }
        cpu = cpu_capability()
        # what decides whether a compile crashes: the graph's layout (not its weights), the settings, the CPU
        layout = {name: list(p.shape) for name, p in head.state_dict().items()}
        fields = {"runtime": "openvino-student", "openvino": ov.__version__, "config": config, "layout": layout, "cpu": cpu.name, "flags": list(cpu.flags),
                  "static_lengths": list(static_lengths)}  # fmt: skip
        probes = root / "student-probes"
        probes.mkdir(parents=True, exist_ok=True)
        kwargs = {"xml": str(xml), "config": config, "d_enc": d_enc, "d_llm": d_llm, "lengths": list(static_lengths)}
        if encoder_tokens:  # (a head without them keeps the probe call, and so the verdicts, it always had)
            kwargs["encoder_tokens"] = True
        verdict = probe(probes, fields, self.probe_target, kwargs)
        if not verdict.ok:
            raise StudentRuntimeUnusable(f"openvino {precision}: {verdict.reason} at its first compile (in a child process)")
        core = ov.Core()
        model = core.read_model(str(xml))
        self.d_enc, self.d_llm, self.encoder_tokens = d_enc, d_llm, encoder_tokens
        self.compiled = core.compile_model(model, "CPU", config)
        error = self._error(self.compiled, head, 2, 12)
        if error > TOLERANCE[precision]:
            raise StudentRuntimeUnusable(f"openvino {precision}: its output is off the torch head's by {error:.3g} (tolerance {TOLERANCE[precision]:g})")
        self.static: dict[int, Any] = {}
        self.unfaithful: dict[int, float] = {}  # static lengths dropped: their error
        for length in static_lengths:
            compiled = core.compile_model(static_model(model, d_enc, d_llm, length), "CPU", config)
            error = self._error(compiled, head, 1, length)
            if error <= TOLERANCE[precision]:
                self.static[length] = compiled
            else:
                self.unfaithful[length] = error
                log.warning("query encoder head: openvino %s at the static length %d is off the torch head by %.3g; that length runs the dynamic graph",
                            precision, length, error)  # fmt: skip
        self._lengths = sorted(self.static)
        self._local = threading.local()  # one infer request per thread and graph: requests are not thread-safe

    def _error(self, compiled: Any, head: torch.nn.Module, n: int, length: int) -> float:
        """How far ``compiled`` is from the torch ``head`` on :func:`probe_input` (relative to its largest output)."""
        inputs = probe_input(self.d_enc, self.d_llm, n, length, self.encoder_tokens)
        with torch.inference_mode():
            want = head(*(torch.from_numpy(a) for a in inputs)).numpy()
        got = np.asarray(compiled.create_infer_request().infer(list(inputs))[0], dtype=np.float32)
        if got.shape != want.shape or not np.isfinite(got).all():
            return float("inf")
        return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-12))

    def _request(self, length: int | None) -> Any:
        """This thread's infer request of the graph for ``length`` (None: the dynamic one)."""
        requests = getattr(self._local, "requests", None)
        if requests is None:
            requests = self._local.requests = {}
        if length not in requests:
            requests[length] = (self.compiled if length is None else self.static[length]).create_infer_request()
        return requests[length]

    def __call__(
        self, sentence: np.ndarray, tokens: np.ndarray, mask: np.ndarray, states: np.ndarray | None = None, states_mask: np.ndarray | None = None
    ) -> np.ndarray:
        """h of one query or a batch; ``states``, ``states_mask``: the sentence encoder's token
        states, for a head compiled with ``encoder_tokens`` (one query pads both to one static length)."""
        inputs = [sentence, tokens, mask] + ([states, states_mask] if self.encoder_tokens else [])
        n, length = tokens.shape[0], max(tokens.shape[1], states.shape[1] if self.encoder_tokens else 0)
        fixed = next((k for k in self._lengths if k >= length), None) if n == 1 else None
        if fixed is not None:  # padded positions are masked out: the head ignores them
            inputs[1:] = [_pad(a, fixed) for a in inputs[1:]]
        out = self._request(fixed).infer(inputs)[0]
        return np.array(out, dtype=np.float32, copy=True)


def _pad(a: np.ndarray, length: int) -> np.ndarray:
    """``a`` (1, L[, d]) padded with zeros to (1, length[, d])."""
    if a.shape[1] == length:
        return a
    return np.concatenate([a, np.zeros((1, length - a.shape[1], *a.shape[2:]), np.float32)], axis=1)


__all__ = [
    "STATIC_LENGTHS", "STUDENT_EXPORT_VERSION", "STUDENT_PRECISIONS", "TOLERANCE", "CompiledHead", "StudentRuntimeUnusable",
    "compile_student", "head_digest", "probe_input", "static_model",
]
