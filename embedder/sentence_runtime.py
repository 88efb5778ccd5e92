"""A sentence-transformers encoder compiled by OpenVINO in fp32: the same embeddings, a third of the time.

A one-query forward of all-MiniLM-L6-v2 is ~22M parameters over a dozen tokens: in torch's eager
mode (what sentence-transformers runs) the per-operator dispatch costs more than the arithmetic.
The same graph compiled by OpenVINO, in fp32, answers a cranfield query in 5.8 ms against 14.7 ms
(2-core AMX Xeon; cosine to torch's embedding >= 0.99999 on all 225 queries). The distilled
query path reads this embedding first (embedder/query_encoder.py), so it is most of a query's
cost: docs/speed-and-precision.md, "The sentence encoder".

Only fp32, named explicitly: the embedding is compared with documents encoded by torch, and an
AMX CPU would otherwise switch OpenVINO to bf16 by itself (bf16 saved 0.4 ms a query here, not
worth an index that no longer matches). Supported: a Transformer, then mean or CLS pooling, then
optionally Normalize (what all-MiniLM-L6-v2 and most sentence-transformers models are). Anything
else, and any graph that fails to compile in a child process (embedder/runtime_probe.py) or to
reproduce torch's embeddings on probe texts (:data:`MIN_COSINE`), raises
:class:`SentenceRuntimeUnusable`, and the encoder stays on torch (embedder/sentence_encoder.py).

Tokenisation is sentence-transformers' own (``model.preprocess``), so truncation and special
tokens are the torch path's by construction.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import warnings
from collections.abc import Sequence
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
SENTENCE_EXPORT_VERSION = 2  # 2: the token states are a second output
POOLINGS = ("mean", "cls")
# The least cosine to torch's embedding, on every probe text, for the compiled graph to be used.
MIN_COSINE = 0.9999
# Texts the compiled graph must reproduce before it answers anything: short, long (truncated at
# the model's max_seq_length), padded in a batch, non-ASCII.
PROBE_TEXTS = (
    "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft",
    "x",
    "Schrödinger's equation, naïve Bayes and 東京 in one sentence.",
    " ".join(["the boundary layer on a flat plate at high Mach number"] * 60),
)


class SentenceRuntimeUnusable(RuntimeError):
    """The sentence encoder could not be compiled (or faithfully) here: torch stays."""


class _Pooled(torch.nn.Module):
    """The transformer, its pooling and (optionally) L2 normalisation in one graph."""

    def __init__(self, transformer: torch.nn.Module, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.transformer, self.pooling, self.normalize = transformer, pooling, normalize

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the pooled embedding, the last layer's token states): the second for a student that reads them."""
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        states = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        if self.pooling == "cls":
            pooled = states[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return (torch.nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled), states


def graph_parts(model: Any) -> tuple[torch.nn.Module, str, bool]:
    """(the Hugging Face transformer, its pooling, whether it normalises) of a SentenceTransformer
    this module can compile; :class:`SentenceRuntimeUnusable` for any other layout."""
    modules = list(model)
    names = [type(m).__name__ for m in modules]
    if not 2 <= len(modules) <= 3 or names[0] != "Transformer" or names[1] != "Pooling" or names[2:] not in ([], ["Normalize"]):
        raise SentenceRuntimeUnusable(f"modules {names}: only Transformer, Pooling[, Normalize] are compiled")
    config = modules[1].get_config_dict()
    mode = config.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6 spelled it as flags
        flags = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
        mode = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}.get(flags[0]) if len(flags) == 1 else None
    if mode not in POOLINGS:
        raise SentenceRuntimeUnusable(f"pooling {mode!r}: only {', '.join(POOLINGS)} pooling is compiled")
    transformer = getattr(modules[0], "auto_model", None) or getattr(modules[0], "model", None)
    if not isinstance(transformer, torch.nn.Module):
        raise SentenceRuntimeUnusable("the Transformer module holds no torch model")
    return transformer.eval(), mode, len(modules) == 3


def features(model: Any, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """sentence-transformers' own tokenisation of ``texts`` (padded to the longest), as int64 arrays."""
    prepare = getattr(model, "preprocess", None) or model.tokenize  # preprocess: sentence-transformers >= 6
    feats = prepare(list(texts))
    return {k: v.numpy() for k, v in feats.items() if isinstance(v, torch.Tensor) and k in ("input_ids", "attention_mask", "token_type_ids")}


def _export(model: Any, target: Path) -> None:
    import openvino as ov

    transformer, pooling, normalize = graph_parts(model)
    example = {k: torch.from_numpy(v) for k, v in features(model, ["an example", "two"]).items()}
    # transformers' mask code branches on shapes in Python; the trace keeps the branch taken
    # whenever the mask is as long as the input (always, here), and warns. The compiled graph
    # is checked against torch on padded and unpadded texts before it is used.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        graph = ov.convert_model(_Pooled(transformer, pooling, normalize), example_input=example)
    save_graph(graph, target)


def compile_sentence_graph(xml: str, config: dict, inputs: dict) -> None:
    """Compile an exported sentence graph and run it once on ``inputs`` (lists): what a probe child does."""
    import openvino as ov

    compiled = ov.Core().compile_model(xml, "CPU", config)
    compiled.create_infer_request().infer({k: np.asarray(v, np.int64) for k, v in inputs.items()})


class CompiledSentenceEncoder:
    """``texts -> embeddings`` of a SentenceTransformer's graph compiled by OpenVINO (fp32).

    ``identity``: the encoder's (name, sha256 of its weights), which keys the exported graph."""

    # What a probe child runs ("module:function"); tests point it at a compile that crashes.
    probe_target = "embedder.sentence_runtime:compile_sentence_graph"

    def __init__(self, model: Any, identity: dict[str, str], threads: int | None = None, cache_root: Path | None = None) -> None:
        try:
            import openvino as ov
        except ImportError:
            raise SentenceRuntimeUnusable("OpenVINO is not installed") from None
        self.model = model
        graph_parts(model)  # refuse an unsupported layout before exporting anything
        root = cache_root or cache_dir() / "runtimes"
        key = {"sha256": identity.get("sha256"), "export": SENTENCE_EXPORT_VERSION, "openvino": ov.__version__,
               "max_seq_length": getattr(model, "max_seq_length", None)}  # fmt: skip
        self.directory = root / f"sentence-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]}"
        xml = self.directory / "model.xml"
        if not xml.exists():
            log.info("exporting the sentence encoder %s to OpenVINO (once) into %s", identity.get("name"), self.directory)
            _export(model, self.directory)
        self.config = {
            "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads()),
            "INFERENCE_PRECISION_HINT": "f32",  # named: an AMX CPU would otherwise take bf16 by itself
            "PERFORMANCE_HINT": "LATENCY",
        }
        cpu = cpu_capability()
        probe_inputs = {k: v.tolist() for k, v in features(model, PROBE_TEXTS[:2]).items()}
        fields = {"runtime": "openvino-sentence", "openvino": ov.__version__, "config": self.config, "graph": self.directory.name,
                  "cpu": cpu.name, "flags": list(cpu.flags)}  # fmt: skip
        probes = root / "sentence-probes"
        probes.mkdir(parents=True, exist_ok=True)
        verdict = probe(probes, fields, self.probe_target, {"xml": str(xml), "config": self.config, "inputs": probe_inputs})
        if not verdict.ok:
            raise SentenceRuntimeUnusable(f"openvino f32: {verdict.reason} at its first compile (in a child process)")
        self.compiled = ov.Core().compile_model(str(xml), "CPU", self.config)
        self._inputs = {port.get_any_name() for port in self.compiled.inputs}
        self._local = threading.local()  # one infer request per thread: requests are not thread-safe
        self.min_cosine = self._faithfulness()
        if self.min_cosine < MIN_COSINE:
            raise SentenceRuntimeUnusable(f"openvino f32: cosine to torch's embeddings {self.min_cosine:.6f} on the probe texts (at least {MIN_COSINE} needed)")

    def _faithfulness(self) -> float:
        """The least cosine between this graph's and torch's embeddings of :data:`PROBE_TEXTS`, one at a time and batched."""
        want = np.asarray(self.model.encode(list(PROBE_TEXTS), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False), np.float32)
        one = np.concatenate([self.encode([t], normalize=True) for t in PROBE_TEXTS])
        batch = self.encode(list(PROBE_TEXTS), normalize=True)
        # the token states too (a student may read them), each real token's, in a padded batch
        feats = {k: torch.from_numpy(v) for k, v in features(self.model, list(PROBE_TEXTS[:3])).items()}
        with torch.inference_mode():
            states = self.model(dict(feats))["token_embeddings"].float().numpy()
        _, got, mask = self.encode_with_tokens(list(PROBE_TEXTS[:3]))
        real = mask.astype(bool)
        a, b = states[real], got[real]
        token_cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
        return float(min((one * want).sum(1).min(), (batch * want).sum(1).min(), token_cos.min()))

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request

    def encode(self, texts: Sequence[str], batch_size: int = 32, normalize: bool = True, progress: bool = False) -> np.ndarray:
        """(n, dim) float32 embeddings; batches of similar lengths, as sentence-transformers forms them."""
        if not len(texts):
            raise ValueError("no texts to encode")
        order = np.argsort([-len(t) for t in texts], kind="stable")  # little padding inside a batch
        out: list[np.ndarray] = []
        starts = range(0, len(texts), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="sentence encoder (openvino)", unit="batch")
        for start in starts:
            feats = features(self.model, [texts[i] for i in order[start : start + batch_size]])
            result = self._request().infer({k: v for k, v in feats.items() if k in self._inputs})[0]
            out.append(np.array(result, dtype=np.float32, copy=True))
        emb = np.empty((len(texts), out[0].shape[1]), np.float32)
        emb[order] = np.concatenate(out)
        if normalize:  # a graph without Normalize: as sentence-transformers' normalize_embeddings
            emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        return emb

    def encode_with_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One padded batch: (unit-norm embeddings (n, dim), token states (n, S, dim), mask (n, S)), as
        :meth:`embedder.sentence_encoder.SentenceEncoder.encode_with_tokens` gives them."""
        feats = features(self.model, list(texts))
        result = self._request().infer({k: v for k, v in feats.items() if k in self._inputs})
        emb = np.array(result[0], dtype=np.float32, copy=True)
        emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        return emb, np.array(result[1], dtype=np.float32, copy=True), feats["attention_mask"].astype(np.float32)


__all__ = ["MIN_COSINE", "POOLINGS", "PROBE_TEXTS", "SENTENCE_EXPORT_VERSION", "CompiledSentenceEncoder", "SentenceRuntimeUnusable",
           "compile_sentence_graph", "features", "graph_parts"]  # fmt: skip
