"""How the encoder's network runs: a runtime turns token ids into final hidden states.

Two runtimes, chosen once per embedder (embedder/hardware.py) and recorded in manifests:

- ``torch``: the transformers model itself, weights cast once to the chosen dtype (fp32 or
  bf16; never autocast, which re-casts every weight matrix on every call). The reference.
- ``openvino``: the same network exported once to an OpenVINO graph (the LoRA adapter already
  merged, the template prefix baked in), fp32 / bf16, or int8 weights (per output channel,
  NNCF) with dynamic int8 activations. No Python per operator: a one-query call costs the
  arithmetic, not the interpreter (1.75x faster queries than the transformers loop on AVX2). The exported graph is cached on disk like the safetensors
  conversion, keyed by model + adapter + prefix + settings (``$ALIGNED_TOKENS_CACHE/runtimes``).

Both hold the template's prefix keys/values (embedder/prefix_cache.py) when the attention is
causal: a runtime's :attr:`prefix_len` says how many leading prompt tokens it already holds.

An OpenVINO setting is compiled for the first time on a machine in a child process
(embedder/runtime_probe.py): a setting whose compile kills its process (SIGFPE in the CPU
plugin, bf16 on one thread of an AMX Xeon) is then not used, and :func:`make_runtime` falls
back to the next one (OpenVINO fp32, then torch fp32), saying why. The one such setting known
(bf16 on one thread of an AMX CPU) is not asked for: it compiles with two
(:func:`embedder.hardware.openvino_threads`).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from embedder.hardware import Capability, cpu_capability, openvino_threads
from embedder.models import cache_dir
from embedder.prefix_cache import PlainBody, PrefixCachedBody, supports_prefix_cache
from embedder.runtime_probe import VERDICTS_FILE, probe

log = logging.getLogger(__name__)

# Bump when the export changes, so that cached graphs of an older export are not reused.
EXPORT_VERSION = 1
# int8 (asked for with dtype="int8"): activations quantised on the fly in groups of 32 input
# channels, so that the matmuls run on int8 x int8; without it OpenVINO decompresses the int8
# weights to fp32 and saves memory, not time.
INT8_ACTIVATION_GROUP = 32
# Weights int8 leaves in fp32 (NNCF ignored-scope patterns): none. On 96 training texts with v4
# (benchmarks/results/int8-recipes.json), mean (1 - cosine) to fp32 x 1e4 of the pooled embedding:
# 13.2 with every weight int8, 9.4 with the 30 MLP down projections in fp32 at 15% less speed. The
# latter did *worse* on the shared-collection check (adi's sparse channel -0.0165 against -0.0058:
# benchmarks/results/precision_int8_v4_downfp32.json): a closer embedding on training texts did not
# carry over to retrieval. Static int8 (NNCF post-training quantisation, SmoothQuant, activations
# per tensor) was 1.4x faster and 5x further from fp32 (72). docs/speed-and-precision.md.
INT8_FP32_WEIGHTS: tuple[str, ...] = ()


def int8_recipe() -> dict:
    """What an int8 graph is: part of its cache key, of the embedding cache's key and of the
    recorded shared-collection verdict (a verdict on one recipe says nothing of another)."""
    return {"weights": "int8 asymmetric per output channel (NNCF)", "kept_fp32": list(INT8_FP32_WEIGHTS),
            "activation_group": INT8_ACTIVATION_GROUP}


def int8_recipe_id() -> str:
    """A short hash of :func:`int8_recipe`."""
    return hashlib.sha256(json.dumps(int8_recipe(), sort_keys=True).encode()).hexdigest()[:12]


class RuntimeUnusable(RuntimeError):
    """A runtime setting failed its first compile on this machine (in a child process)."""


class Runtime(Protocol):
    """What the Embedder needs from a runtime."""

    name: str
    dtype: str
    prefix_len: int  # leading prompt tokens the runtime holds already (pass the ids after them)
    fallback: str | None  # why this runtime runs instead of the one asked for (None: it is the one)

    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> torch.Tensor:
        """Final hidden states (batch, length, d) float32 of right-padded ids (int64) and mask."""
        ...


def _module(body: torch.nn.Module, prefix_ids: list[int] | None) -> torch.nn.Module:
    return PrefixCachedBody(body, prefix_ids) if prefix_ids else PlainBody(body)


def cacheable_prefix(body: torch.nn.Module, prefix_ids: list[int] | None) -> list[int] | None:
    """``prefix_ids`` where the architecture allows computing them once, else None."""
    return list(prefix_ids) if prefix_ids and supports_prefix_cache(body) else None


class TorchRuntime:
    """The transformers network in fp32 or bf16 (weights cast once)."""

    name = "torch"
    fallback: str | None = None

    def __init__(self, body: torch.nn.Module, dtype: str = "fp32", prefix_ids: list[int] | None = None, device: str = "cpu") -> None:
        if dtype not in ("fp32", "bf16"):
            raise ValueError(f"the torch runtime runs fp32 or bf16, not {dtype!r}")
        self.dtype = dtype
        self.device = device
        if dtype == "bf16":
            # A copy: the fp32 model stays as it is for training and for the LM head.
            body = copy.deepcopy(body).to(torch.bfloat16)
        self.module = _module(body, prefix_ids).eval()
        self.prefix_len = self.module.prefix_len

    @torch.inference_mode()
    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> torch.Tensor:
        ids = torch.from_numpy(input_ids).to(self.device)
        mask = torch.from_numpy(attention_mask).to(self.device)
        return self.module(ids, mask).float()


def runtime_key(identity: dict, adapter: dict | None, dtype: str, prefix_ids: list[int] | None, extra: dict | None = None) -> str:
    """Cache key of an exported graph: everything that changes its weights or its graph."""
    import openvino

    what = {
        "model": identity.get("sha256") or identity.get("name"),
        "adapter": (adapter or {}).get("sha256"),
        "dtype": dtype,
        "prefix": list(prefix_ids or []),
        "export": EXPORT_VERSION,
        "openvino": openvino.__version__,
        **(extra or {}),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def _export_openvino(module: torch.nn.Module, dtype: str, target: Path) -> None:
    """Trace ``module`` into an OpenVINO IR in ``target`` (written to a temporary dir, then renamed)."""
    import openvino as ov

    example = (torch.ones((2, 8), dtype=torch.long), torch.ones((2, 8), dtype=torch.long))
    with torch.no_grad():
        graph = ov.convert_model(
            module, example_input=example, input=[("input_ids", [-1, -1], ov.Type.i64), ("attention_mask", [-1, -1], ov.Type.i64)]
        )
    if dtype == "int8":
        import nncf

        # Per-output-channel asymmetric int8 weights (per-tensor, as torch's dynamic
        # quantisation does, costs the embedding its faithfulness: cosine 0.80 to fp32).
        kept = {"ignored_scope": nncf.IgnoredScope(patterns=list(INT8_FP32_WEIGHTS), validate=False)} if INT8_FP32_WEIGHTS else {}
        # NNCF draws its progress bar and logs its statistics on stdout, where they would land inside a
        # command's --json output: the bar goes to stderr, the statistics only from warnings up
        nncf_log = logging.getLogger("nncf")
        level = nncf_log.level
        nncf_log.setLevel(max(level, logging.WARNING))
        try:
            with contextlib.redirect_stdout(sys.stderr):
                graph = nncf.compress_weights(graph, mode=nncf.CompressWeightsMode.INT8_ASYM, **kept)
        finally:
            nncf_log.setLevel(level)
    save_graph(graph, target)


def save_graph(graph, target: Path) -> None:
    """Write an OpenVINO graph as ``target/model.xml`` (a temporary folder, then renamed); where
    another process published the same graph first, keep theirs."""
    import openvino as ov

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        ov.save_model(graph, str(tmp / "model.xml"), compress_to_fp16=False)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "model.xml").exists():  # another process may have published it first
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def graph_directory(
    body: torch.nn.Module, dtype: str, identity: dict, adapter: dict | None, prefix_ids: list[int] | None, cache_root: Path | None = None
) -> Path:
    """Where the exported graph of ``body`` in ``dtype`` is cached.

    bf16 shares the fp32 graph (the precision is a compile-time hint). Identical weights give
    identical graphs; an in-memory model without a hash gets one from its parameters, so that
    two different models never share a cached graph.
    """
    if not identity.get("sha256"):
        identity = {**identity, "sha256": _parameters_sha256(body)}
    int8 = dtype == "int8"
    key = runtime_key(identity, adapter, "int8" if int8 else "fp32", prefix_ids, {"int8": int8_recipe()} if int8 else None)
    return (cache_root or cache_dir() / "runtimes") / key


def exported_graph(
    body: torch.nn.Module, dtype: str, identity: dict, adapter: dict | None, prefix_ids: list[int] | None, cache_root: Path | None = None
) -> Path:
    """The directory of ``body``'s OpenVINO graph for ``dtype``, exported there first if it is not yet."""
    directory = graph_directory(body, dtype, identity, adapter, prefix_ids, cache_root)
    if not (directory / "model.xml").exists():
        log.info("exporting the encoder to OpenVINO (%s, once) into %s", dtype, directory)
        _export_openvino(_module(body, prefix_ids).eval(), dtype, directory)
    return directory


def crash_fields(config: dict, cpu: Capability) -> dict:
    """What decides whether an OpenVINO compile survives (the key of its crash verdict)."""
    import openvino as ov

    return {"runtime": "openvino", "openvino": ov.__version__, "config": config, "cpu": cpu.name, "flags": list(cpu.flags)}


def compile_openvino(xml: str, config: dict) -> None:
    """Compile an exported graph with ``config`` and run one tiny batch: what a probe child does."""
    import openvino as ov

    compiled = ov.Core().compile_model(xml, "CPU", config)
    ids = np.ones((1, 4), dtype=np.int64)
    compiled.create_infer_request().infer({"input_ids": ids, "attention_mask": ids})


class OpenVINORuntime:
    """The network exported to OpenVINO (cached), fp32 / bf16 / int8 weights."""

    name = "openvino"
    fallback: str | None = None
    # What a probe child runs ("module:function"); tests point it at a compile that crashes.
    probe_target = "embedder.runtime:compile_openvino"

    def __init__(
        self,
        body: torch.nn.Module,
        dtype: str,
        identity: dict,
        adapter: dict | None,
        prefix_ids: list[int] | None = None,
        threads: int | None = None,
        cache_root: Path | None = None,
    ) -> None:
        import openvino as ov

        if dtype not in ("fp32", "bf16", "int8"):
            raise ValueError(f"the openvino runtime runs fp32, bf16 or int8, not {dtype!r}")
        self.dtype = dtype
        self.prefix_len = len(prefix_ids or [])
        self.directory = exported_graph(body, dtype, identity, adapter, prefix_ids, cache_root)
        cpu = cpu_capability()
        config = openvino_config(dtype, int(threads or torch.get_num_threads()), cpu)
        xml = str(self.directory / "model.xml")
        self.verdict = probe(self.directory, crash_fields(config, cpu), self.probe_target, {"xml": xml, "config": config})
        if not self.verdict.ok:
            raise RuntimeUnusable(
                f"openvino {dtype} on {config['INFERENCE_NUM_THREADS']} thread(s): {self.verdict.reason} at its first compile "
                f"(in a child process; verdict kept in {self.directory / VERDICTS_FILE})"
            )
        self.compiled = ov.Core().compile_model(xml, "CPU", config)
        self._local = threading.local()  # one infer request per thread: requests are not thread-safe

    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> torch.Tensor:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        out = request.infer({"input_ids": input_ids, "attention_mask": attention_mask})[0]
        return torch.from_numpy(np.array(out, dtype=np.float32, copy=True))


def openvino_config(dtype: str, threads: int, cpu: Capability) -> dict:
    """The CPU plugin's settings for the decoder graph in ``dtype`` on ``threads`` threads of ``cpu``
    (raised where a thread count is known to crash: :func:`embedder.hardware.openvino_threads`)."""
    hint = "bf16" if dtype == "bf16" else "f32"  # int8 weights run with f32 activations' hint
    config: dict = {"INFERENCE_NUM_THREADS": openvino_threads(cpu, hint, threads), "INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
    if dtype == "int8":
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = INT8_ACTIVATION_GROUP
    return config


def _parameters_sha256(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def make_runtime(
    name: str,
    dtype: str,
    body: torch.nn.Module,
    identity: dict,
    adapter: dict | None,
    prefix_ids: list[int] | None,
    device: str = "cpu",
    cache_root: Path | None = None,
) -> Runtime:
    """Build the runtime ``name`` ("torch" or "openvino") in ``dtype`` for a decoder body.

    An OpenVINO setting that fails its first compile on this machine (probed in a child
    process) is replaced by the next that works: OpenVINO fp32, then torch fp32. The runtime
    returned says why in :attr:`fallback`; the failure is logged as a warning.
    """
    prefix_ids = cacheable_prefix(body, prefix_ids)
    if name == "torch":
        return TorchRuntime(body, dtype, prefix_ids, device)
    if name != "openvino":
        raise ValueError(f"unknown runtime {name!r}")
    failures: list[str] = []
    for candidate in [dtype] + (["fp32"] if dtype != "fp32" else []):
        try:
            runtime: Runtime = OpenVINORuntime(body, candidate, identity, adapter, prefix_ids, cache_root=cache_root)
        except RuntimeUnusable as exc:
            log.warning("%s; trying the next runtime", exc)
            failures.append(str(exc))
            continue
        break
    else:
        runtime = TorchRuntime(body, "fp32", prefix_ids, device)
    if failures:
        runtime.fallback = f"{'; '.join(failures)}: runs {runtime.name} {runtime.dtype} instead"
    return runtime


__all__ = [
    "EXPORT_VERSION", "INT8_FP32_WEIGHTS", "OpenVINORuntime", "Runtime", "RuntimeUnusable", "TorchRuntime", "compile_openvino", "crash_fields", "exported_graph",
    "graph_directory", "int8_recipe", "int8_recipe_id", "make_runtime", "openvino_config", "runtime_key", "save_graph",
]
