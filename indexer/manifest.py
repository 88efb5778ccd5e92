"""The index manifest: what an index directory holds and how it was built.

An index records its format version and the exact model (name + weights hash), adapter
and embedding settings; loading checks both, so that queries are never encoded by a
different model than the documents.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class IndexFormatError(RuntimeError):
    """An index directory that cannot be used as asked (wrong format, other model...)."""




@dataclass
class Manifest:
    model: dict  # {"name", "sha256"}
    adapter: dict | None  # {"path", "sha256"} or None for the raw backbone
    embedding: dict  # EmbedderConfig.to_dict()
    sparse: dict  # {"top_k", "vocab_size", "weight"}
    n_docs: int
    corpus: dict = field(default_factory=dict)
    dense: dict | None = None  # {"kind", "dim", "normalised", "metric"} when stored
    embedfilter: dict | None = None  # {"tau", "left", "right", "dim", "kind"} when stored
    lexical: dict | None = None  # {"analyzer", "k1", "b", "n_terms"} when stored
    encoder: dict | None = None  # {"name", "sha256", "dim", "max_seq_length", "kind", ...} when stored
    build: dict = field(default_factory=dict)  # timings and throughput
    created: str = ""
    format_version: int = FORMAT_VERSION

    def write(self, directory: Path) -> None:
        write_json_atomic(directory / MANIFEST, asdict(self))

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        path = Path(directory) / MANIFEST
        if not path.exists():
            raise IndexFormatError(f"{directory}: not an index (no {MANIFEST})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise IndexFormatError(f"{path}: unreadable manifest ({exc})") from None
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise IndexFormatError(
                f"{path}: field 'format_version': index format {version!r}, this version reads {FORMAT_VERSION}; rebuild the index"
            )
        known = set(cls.__dataclass_fields__)
        missing = [k for k in ("model", "embedding", "sparse", "n_docs") if k not in data]
        if missing:
            raise IndexFormatError(f"{path}: missing field(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in known})

    def check_model(self, model_identity: dict, adapter_identity: dict | None) -> None:
        """Refuse an embedder other than the one the index was built with."""
        if model_identity.get("sha256") != self.model.get("sha256"):
            raise IndexFormatError(
                f"index built with model {self.model.get('name')!r} (sha256 {self.model.get('sha256', '')[:12]}), "
                f"asked to use {model_identity.get('name')!r} (sha256 {model_identity.get('sha256', '')[:12]})"
            )
        mine = (self.adapter or {}).get("sha256")
        theirs = (adapter_identity or {}).get("sha256")
        if mine != theirs:
            raise IndexFormatError(
                f"index built with adapter {(self.adapter or {}).get('path', 'none')!r}, "
                f"asked to use {(adapter_identity or {}).get('path', 'none')!r}"
            )

    def check_encoder(self, encoder_identity: dict | None) -> None:
        """Refuse a sentence-transformers encoder other than the one the index's encoder
        channel was built with (and any encoder for an index without that channel)."""
        if self.encoder is None:
            if encoder_identity is not None:
                raise IndexFormatError(f"index has no encoder channel (built without --encoder), asked to use {encoder_identity.get('name')!r}")
            return
        if encoder_identity is None or encoder_identity.get("sha256") != self.encoder.get("sha256"):
            theirs = encoder_identity or {}
            raise IndexFormatError(
                f"index built with encoder {self.encoder.get('name')!r} (sha256 {self.encoder.get('sha256', '')[:12]}), "
                f"asked to use {theirs.get('name')!r} (sha256 {theirs.get('sha256', '')[:12]})"
            )


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
