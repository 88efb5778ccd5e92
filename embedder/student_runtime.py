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
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

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


class StudentRuntimeUnusable(RuntimeError):
    """The student's graph could not be exported or compiled here: the torch head stays."""


def head_digest(head: torch.nn.Module) -> str:
    """A digest of the head's weights and shapes: which exported graph is its own."""
    h = hashlib.sha256()
    for name, p in sorted(head.state_dict().items()):
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def _example(d_enc: int, d_llm: int, n: int = 2, length: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mask = np.ones((n, length), np.float32)
    mask[-1, length // 2 :] = 0  # a padded row, so that the traced graph keeps the masking
    return np.zeros((n, d_enc), np.float32), np.full((n, length, d_llm), 0.01, np.float32), mask


def _export(head: torch.nn.Module, d_enc: int, d_llm: int, target: Path) -> None:
    """Trace ``head`` into an OpenVINO IR in ``target`` (a temporary folder, then renamed)."""
    import openvino as ov

    example = tuple(torch.from_numpy(a) for a in _example(d_enc, d_llm))
    with torch.no_grad():
        graph = ov.convert_model(
            head, example_input=example,
            input=[ov.PartialShape([-1, d_enc]), ov.PartialShape([-1, -1, d_llm]), ov.PartialShape([-1, -1])],
        )  # fmt: skip
    save_graph(graph, target)


def compile_student(xml: str, config: dict, d_enc: int, d_llm: int) -> None:
    """Compile an exported head with ``config`` and run one padded batch: what a probe child does."""
    import openvino as ov

    compiled = ov.Core().compile_model(xml, "CPU", config)
    compiled.create_infer_request().infer(list(_example(d_enc, d_llm)))


class CompiledHead:
    """A token-bag head run by OpenVINO (f32): ``(sentence, tokens, mask) -> h``, as the torch head."""

    # What a probe child runs ("module:function"); tests point it at a compile that crashes.
    probe_target = "embedder.student_runtime:compile_student"

    def __init__(
        self, head: torch.nn.Module, d_enc: int, d_llm: int, threads: int | None = None, cache_root: Path | None = None,
        precision: str = "f32",
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
            _export(head.eval(), d_enc, d_llm, self.directory)
        config: dict = {
            "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads()),
            "INFERENCE_PRECISION_HINT": precision,  # asked for explicitly: an AMX CPU would otherwise pick bf16 by itself
            "PERFORMANCE_HINT": "LATENCY",
        }
        cpu = cpu_capability()
        # what decides whether a compile crashes: the graph's layout (not its weights), the settings, the CPU
        layout = {name: list(p.shape) for name, p in head.state_dict().items()}
        fields = {"runtime": "openvino-student", "openvino": ov.__version__, "config": config, "layout": layout, "cpu": cpu.name, "flags": list(cpu.flags)}
        probes = root / "student-probes"
        probes.mkdir(parents=True, exist_ok=True)
        verdict = probe(probes, fields, self.probe_target, {"xml": str(xml), "config": config, "d_enc": d_enc, "d_llm": d_llm})
        if not verdict.ok:
            raise StudentRuntimeUnusable(f"openvino {precision}: {verdict.reason} at its first compile (in a child process)")
        self.compiled = ov.Core().compile_model(str(xml), "CPU", config)
        self._local = threading.local()  # one infer request per thread: requests are not thread-safe

    def __call__(self, sentence: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        out = request.infer([sentence, tokens, mask])[0]
        return np.array(out, dtype=np.float32, copy=True)


__all__ = ["STUDENT_EXPORT_VERSION", "STUDENT_PRECISIONS", "CompiledHead", "StudentRuntimeUnusable", "compile_student", "head_digest"]
