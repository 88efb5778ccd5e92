"""Query encoders: what maps a query to the embedder's pooled state h.

The Retriever asks for "the query's state" and never knows which encoder answered:

- the LLM itself (:class:`Embedder` with its query template): the reference, ~40-70 ms a query
  on a CPU for the 135M backbone;
- a :class:`DistilledQueryEncoder`: a small head over a frozen sentence encoder's embedding
  (all-MiniLM-L6-v2), trained to reproduce h (training/query_distillation.py). The index's
  encoder channel computes that embedding for every hybrid query anyway, so the head costs
  one small matrix product: the LLM leaves the query path.

h then gives both LLM channels' query: the dense vector, and through the LLM's own LM head the
aligned-token logits the expansion is taken from. A student records the model and adapter it was
distilled from; loading it beside another one is refused, as an index built with another model
is (indexer/manifest.py).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

STUDENT_FILE = "query_encoder.json"
HEAD_FILE = "head.safetensors"
STUDENT_FORMAT = 1
# A student kept beside its adapter lives in the adapter's folder (embedder/adapters/NAME/ for a shipped one).
SHIPPED_SUBDIR = "query-encoder"


class QueryEncoderMismatch(ValueError):
    """A distilled query encoder was loaded beside an embedder it was not distilled from."""


def make_head(d_in: int, d_out: int, hidden: int = 1024) -> torch.nn.Module:
    """The student head: linear (``hidden`` 0) or one hidden GELU layer."""
    if hidden <= 0:
        return torch.nn.Linear(d_in, d_out)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d_out))


def teacher_identity(embedder: Any) -> dict:
    """What a student must match: the backbone's and the adapter's weights, and the query template."""
    return {
        "model": (embedder.identity or {}).get("sha256") or (embedder.identity or {}).get("name"),
        "adapter": (embedder.adapter or {}).get("sha256"),
        "query_template": embedder.config.template("query"),
    }


@dataclass
class DistilledQueryEncoder:
    """A frozen sentence encoder's embedding -> the teacher's pooled query state h."""

    head: torch.nn.Module
    record: dict  # query_encoder.json: teacher, encoder, head shape, training, faithfulness
    directory: Path | None = None

    @property
    def name(self) -> str:
        """How results and hits name this encoder."""
        return f"distilled:{self.record.get('name') or (self.directory.name if self.directory else 'in-memory')}"

    @property
    def encoder_identity(self) -> dict:
        """The sentence encoder whose embeddings the head reads (name, sha256)."""
        return self.record["encoder"]

    def check_teacher(self, embedder: Any) -> None:
        """Refuse an embedder this student was not distilled from (another model, adapter or template)."""
        want, have = self.record["teacher"], teacher_identity(embedder)
        for key in ("model", "adapter", "query_template"):
            if want.get(key) != have.get(key):
                where = self.directory or "this query encoder"
                raise QueryEncoderMismatch(
                    f"{where}: distilled from another {key.replace('_', ' ')} ({str(want.get(key))[:16]}...) than the index's "
                    f"embedder ({str(have.get(key))[:16]}...); re-distil it (distill-query-encoder) or use query_encoder='llm'"
                )

    def check_encoder(self, identity: dict) -> None:
        """Refuse a sentence encoder other than the one the head was trained on."""
        if identity.get("sha256") != self.encoder_identity.get("sha256"):
            raise QueryEncoderMismatch(
                f"{self.directory or 'this query encoder'}: its head reads {self.encoder_identity.get('name')} embeddings, "
                f"not {identity.get('name')}'s"
            )

    @torch.inference_mode()
    def states(self, encoder_embeddings: np.ndarray) -> np.ndarray:
        """The students' h (n, d) float32 of the sentence encoder's embeddings (n, d_enc)."""
        x = torch.from_numpy(np.ascontiguousarray(encoder_embeddings, dtype=np.float32))
        return self.head(x).numpy()

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the head and its record into ``directory`` (a temporary folder, then renamed)."""
        from safetensors.torch import save_file

        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        save_file({k: v.detach().contiguous() for k, v in self.head.state_dict().items()}, str(tmp / HEAD_FILE))
        (tmp / STUDENT_FILE).write_text(json.dumps({**self.record, "format": STUDENT_FORMAT}, indent=1, sort_keys=True), encoding="utf-8")
        if target.exists():
            import shutil

            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        self.directory = target
        return target

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> DistilledQueryEncoder:
        """Read a student written by :meth:`save` (``distill-query-encoder``)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        path = directory / STUDENT_FILE
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a distilled query encoder ({exc})") from None
        if not isinstance(record, dict) or record.get("format") != STUDENT_FORMAT:
            raise ValueError(f"{path}: field 'format': expected {STUDENT_FORMAT}, got {record.get('format') if isinstance(record, dict) else record!r}")
        for key in ("teacher", "encoder", "head"):
            if not isinstance(record.get(key), dict):
                raise ValueError(f"{path}: field {key!r} missing or not an object")  # noqa: TRY004 - a malformed file is bad input: ValueError naming file and field, which the CLIs catch
        shape = record["head"]
        head = make_head(int(shape["in"]), int(shape["out"]), int(shape.get("hidden", 0)))
        head.load_state_dict(load_file(str(directory / HEAD_FILE)))
        return cls(head.eval(), record, directory)


class LMHead:
    """The LLM's own LM head for distilled queries: top-M aligned tokens of a student's h.

    With no LLM forward left on the query path, the product over the whole vocabulary (49,152 x
    576 for the default backbone) is the largest cost of a distilled query, and it is bound by
    reading the weights. So it runs in the precision ``embedder.hardware.lm_head_dtype`` chooses
    for the CPU: fp16 (half the bytes) where F16C converts in hardware. The LLM's own path keeps
    fp32 (``Embedder.top_tokens``).
    """

    def __init__(self, weight: torch.Tensor, dtype: str = "fp32") -> None:
        if dtype not in ("fp32", "fp16"):
            raise ValueError(f"LM head dtype must be fp32 or fp16, not {dtype!r}")
        self.dtype = dtype
        self._torch_dtype = torch.float16 if dtype == "fp16" else torch.float32
        self.weight = weight.detach().to(self._torch_dtype).contiguous()

    @classmethod
    def of(cls, embedder: Any, dtype: str | None = None) -> LMHead:
        """``embedder``'s LM head, in ``dtype`` (None: the one its device's capability calls for)."""
        from embedder.hardware import device_capability, lm_head_dtype

        if dtype is None:
            dtype = lm_head_dtype(device_capability(str(getattr(embedder, "device", "cpu"))))
        return cls(embedder.causal_lm.get_output_embeddings().weight, dtype)

    @torch.inference_mode()
    def top_tokens(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k token ids (n, k) int32 and their logits (n, k) float32, best first."""
        x = torch.as_tensor(np.ascontiguousarray(h, dtype=np.float32), device=self.weight.device).to(self._torch_dtype)
        vals, ids = torch.topk(x @ self.weight.T, min(k, self.weight.shape[0]), dim=-1)
        return ids.cpu().numpy().astype(np.int32), vals.float().cpu().numpy()


def student_beside(adapter: dict | None) -> Path | None:
    """The student kept in an adapter's folder (``ADAPTER/query-encoder/``, where the package ships
    one for a shipped adapter and ``distill-query-encoder --beside-adapter`` writes one); None where there is none."""
    path = (adapter or {}).get("path")
    if not path:
        return None
    student = Path(path) / SHIPPED_SUBDIR
    return student if (student / STUDENT_FILE).exists() else None


__all__ = [
    "HEAD_FILE",
    "SHIPPED_SUBDIR",
    "STUDENT_FILE",
    "DistilledQueryEncoder",
    "LMHead",
    "QueryEncoderMismatch",
    "make_head",
    "student_beside",
    "teacher_identity",
]
