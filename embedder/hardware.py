"""What the machine can do natively, and the precision the encoder runs in because of it.

Machines differ in ways that change the fastest precision by 5x or more: a CPU with native
bfloat16 (AVX512-BF16 or AMX) may run bf16 matrix products ~2-3x faster than fp32 (AMX) or
no faster (an AVX512-BF16 Xeon without AMX: 1.0x), while a CPU with only AVX2 emulates bf16
and runs it ~5x *slower* than fp32. So the flags only say which settings are worth timing
(:func:`speed_candidates`); which one runs is measured on the machine (embedder/speed_probe.py),
printed by ``build-index`` and recorded in the manifest. The candidates are a pure function of
the capability so that they can be tested with the capability mocked.
"""
from __future__ import annotations

import importlib.util
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

DTYPES = ("auto", "fp32", "bf16", "int8")
# CPU flags (as /proc/cpuinfo spells them) that matter for the encoder's matrix products.
_FLAGS_OF_INTEREST = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Capability:
    """The compute capability of the device an encoder runs on."""

    device: str  # "cpu" or "cuda"
    name: str  # CPU model name or GPU name
    flags: tuple[str, ...] = field(default_factory=tuple)  # the flags of interest that are present
    native_bf16: bool = False  # bf16 matrix products in hardware (AVX512-BF16 / AMX / a GPU that has them)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line for logs and benchmark headers."""
        bf16 = f"native bf16: {'yes' if self.native_bf16 else 'no'}"
        if self.device != "cpu":  # CPU vector flags say nothing of an accelerator
            return f"{self.device}: {self.name} {bf16}"
        flags = " ".join(self.flags) or "no AVX2"
        return f"{self.device}: {self.name} [{flags}] {bf16}"


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]]:
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return name, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return name, flags


def cpu_capability(cpuinfo: Path = Path("/proc/cpuinfo")) -> Capability:
    """The CPU's capability, from /proc/cpuinfo (Linux) or, elsewhere, from what torch reports."""
    name, flags = _cpuinfo(cpuinfo)
    if not flags:  # not Linux: torch knows the vector ISA it dispatches to
        try:
            import torch

            isa = torch.backends.cpu.get_cpu_capability().lower()  # "AVX2", "AVX512", "DEFAULT"...
            flags = {"avx2"} if isa == "avx2" else {"avx2", "avx512f"} if isa == "avx512" else set()
        except Exception:  # noqa: BLE001 - capability detection must never stop a build
            flags = set()
    present = tuple(f for f in _FLAGS_OF_INTEREST if f in flags)
    return Capability("cpu", name, present, native_bf16=bool({"avx512_bf16", "amx_bf16"} & flags))


def lm_head_dtype(cap: Capability) -> str:
    """The precision of the LM-head product for distilled queries (embedder/lm_head.py): "int8"
    on a CPU, where the product over the whole vocabulary is bound by reading the weights: an int8
    first pass reads a quarter of fp32's bytes and an fp32 rescoring of the survivors keeps fp32's
    top tokens, on any CPU Numba compiles for (no instruction set is assumed). A GPU keeps fp32:
    there the product is not the cost."""
    return "int8" if cap.device == "cpu" else "fp32"


def student_precision(cap: Capability) -> str:
    """The precision a distilled query encoder's compiled head runs in (embedder/student_runtime.py):
    "bf16" where the CPU has bf16 in hardware, else "f32" (emulated bf16 is ~5x slower than f32).
    After the sentence encoder's forward has evicted the caches, the head is bound by reading its
    weights, and bf16 reads half of them. Measured on 2 AVX512-BF16 cores (docs/speed-and-precision.md):
    2.2 against 3.1 ms a query in place, 3.1 against 7.0 ms at p90; on the 459 shared queries cosine
    >= 0.99999 to the f32 head's h and top-128 expansion overlap >= 0.977 (mean 0.996)."""
    return "bf16" if cap.device == "cpu" and cap.native_bf16 else "f32"


def openvino_threads(cap: Capability, precision: str, threads: int) -> int:
    """The thread count to compile the decoder graph with in OpenVINO, for ``threads`` asked.

    2 at least for bf16 on an AMX CPU: there (and only there) OpenVINO 2026.4's CPU plugin fuses
    the gated MLP into its AMX kernel (the ``LLMMLP`` node), whose down projection splits the work
    over pairs of threads and divides by ``threads // 2`` when it is compiled: with one thread, an
    integer division by zero kills the process (SIGFPE, "trap divide error"; found on an AMX
    Xeon by cutting the graph down to the first op that crashes: layer 0's ``down_proj``). One
    thread is what pytest's tiny models and each of ``build-index --workers 2``'s workers ask
    for on 2 cores. Two threads in a one-core worker cost ~17% against one process (300 cisi
    documents, 48 against 41 s) where OpenVINO fp32, the fallback, cost 3.3x (135 s), and the
    index is byte for byte the one-process build's. The child-process probe
    (embedder/runtime_probe.py) still guards every other combination."""
    if precision == "bf16" and cap.device == "cpu" and "amx_bf16" in cap.flags:
        return max(2, threads)
    return threads


def device_capability(device: str) -> Capability:
    """Capability of ``device`` ("cpu", "cuda", "cuda:0"...)."""
    if device.startswith("cuda"):
        import torch

        return Capability("cuda", torch.cuda.get_device_name(device), (), native_bf16=torch.cuda.is_bf16_supported())
    return cpu_capability()


def openvino_available() -> bool:
    """Whether the OpenVINO runtime (and NNCF, for int8 weights) can be imported."""
    return importlib.util.find_spec("openvino") is not None


@dataclass(frozen=True)
class Precision:
    """The runtime and dtype an encoder runs in, and why."""

    runtime: str  # "torch" or "openvino"
    dtype: str  # "fp32", "bf16" or "int8"
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


# Flags whose int8 dot products run in hardware (VNNI, AMX): without them OpenVINO's int8 was slower
# than its fp32 (2-core AVX2: 1.55x against 1.7x the naive loop for documents).
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def speed_candidates(cap: Capability, runtime: str, have_openvino: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """The (runtime, dtype) settings the speed probe (embedder/speed_probe.py) times on a CPU for
    ``dtype="auto"`` and ``runtime`` (auto|torch|openvino), and why the others are not timed.

    torch fp32 (the reference) and OpenVINO fp32 always; bf16 (torch, OpenVINO) only where the CPU
    has it in hardware: emulated bf16 is ~5x slower than fp32 on AVX2, and is not worth a timing;
    OpenVINO int8 only where the CPU has VNNI or AMX (its int8 products in hardware)."""
    out: list[tuple[str, str]] = []
    skipped: list[str] = []
    torch_ok, ov_ok = runtime in ("auto", "torch"), runtime in ("auto", "openvino") and have_openvino
    if runtime in ("auto", "openvino") and not have_openvino:
        skipped.append("openvino: not installed")
    if torch_ok:
        out.append(("torch", "fp32"))
    if ov_ok:
        out.append(("openvino", "fp32"))
    if cap.native_bf16:
        out += ([("torch", "bf16")] if torch_ok else []) + ([("openvino", "bf16")] if ov_ok else [])
    elif torch_ok or ov_ok:
        skipped.append("bf16: emulated on this CPU (no avx512_bf16 / amx_bf16; ~5x slower than fp32 on AVX2), not timed")
    if ov_ok and set(INT8_FLAGS) & set(cap.flags):
        out.append(("openvino", "int8"))
    elif ov_ok:
        skipped.append("int8: no VNNI / AMX on this CPU (OpenVINO int8 measured slower than its fp32 there), not timed")
    return out, skipped


def choose_precision(requested: str, runtime: str, cap: Capability, have_openvino: bool) -> Precision:
    """Resolve ``requested`` (auto|fp32|bf16|int8) and ``runtime`` (auto|torch|openvino).

    On a CPU, ``auto`` is measured, not read from the CPU flags: where more than one setting is
    a candidate (:func:`speed_candidates`), the answer has dtype "auto" (and runtime "auto" unless
    one was asked for), and the embedder times the candidates the first time it needs its runtime
    on this machine (embedder/speed_probe.py), then takes the fastest faithful one, for documents
    and for queries apart. The flags only rule out what cannot pay: emulated bf16 (~5x slower than
    fp32 on AVX2) and int8 without VNNI/AMX. An asked-for dtype is taken as asked (OpenVINO where
    installed, unless ``runtime`` says otherwise). torch has no faithful int8 path (per-tensor
    dynamic quantisation: cosine 0.77). A GPU runs torch, bf16 where it has it.
    """
    if requested not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {requested!r}")
    if runtime not in ("auto", "torch", "openvino"):
        raise ValueError(f"runtime must be auto, torch or openvino, not {runtime!r}")
    if runtime == "openvino" and not have_openvino:
        raise ValueError("runtime 'openvino' asked for but the openvino package is not installed (pip install openvino nncf)")
    if cap.device != "cpu":  # OpenVINO's CPU plugin is what we measured; GPUs run torch
        if runtime == "openvino":
            raise ValueError(f"runtime 'openvino' runs on the CPU only, not on {cap.device}")
        if requested == "int8":
            raise ValueError("dtype int8 is available on the CPU only (OpenVINO)")
        dtype = requested if requested != "auto" else ("bf16" if cap.native_bf16 else "fp32")
        return Precision("torch", dtype, f"{cap.device}: {'requested' if requested != 'auto' else 'native bf16' if cap.native_bf16 else 'no native bf16'}")
    if requested == "int8":
        if runtime == "torch":
            raise ValueError("dtype int8 needs runtime openvino (torch's dynamic int8 is per-tensor and unfaithful)")
        if not have_openvino:
            raise ValueError("dtype int8 needs the openvino package (pip install openvino nncf)")
        return Precision("openvino", "int8", "requested")
    if requested in ("fp32", "bf16"):
        chosen = runtime if runtime != "auto" else ("openvino" if have_openvino else "torch")
        why = "requested" if requested == "fp32" or cap.native_bf16 else "requested (emulated on this CPU: slow)"
        return Precision(chosen, requested, why)
    candidates, skipped = speed_candidates(cap, runtime, have_openvino)
    if len(candidates) == 1:
        return Precision(*candidates[0], "the only candidate on this CPU (" + "; ".join(skipped) + ")")
    return Precision(runtime, "auto", "to be measured on this machine at first use (speed probe: " + ", ".join(" ".join(c) for c in candidates) + ")")


__all__ = ["DTYPES", "INT8_FLAGS", "Capability", "Precision", "choose_precision", "cpu_capability", "device_capability", "lm_head_dtype", "openvino_available", "speed_candidates", "student_precision"]
