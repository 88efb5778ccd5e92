"""Runtimes and build workers that die as a native crash would (tests only).

Imported by probe children and spawned build workers (which see the parent's sys.path), so
that a crash can be simulated on any CPU: the real one (SIGFPE in OpenVINO's CPU plugin on an
AMX Xeon) happens only on hardware the test machine may not have.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path


def die(signal_name: str = "SIGFPE", **_: object) -> None:
    """Kill this process with ``signal_name``, as a native crash in a compile does."""
    os.kill(os.getpid(), getattr(signal, signal_name))


def hang(seconds: float = 30.0, **_: object) -> None:
    """Never answer in time, as a compile stuck in a native loop does."""
    import time

    time.sleep(seconds)


def compile_that_crashes_in_bf16(xml: str, config: dict, count_in: str | None = None) -> None:
    """The real probe compile, except that bf16 kills the process (the AMX crash, simulated)."""
    if count_in:
        with open(count_in, "a", encoding="utf-8") as f:
            f.write(f"{config['INFERENCE_PRECISION_HINT']}\n")
    if config["INFERENCE_PRECISION_HINT"] == "bf16":
        die("SIGFPE")
    from embedder.runtime import compile_openvino

    compile_openvino(xml, config)


def compile_that_crashes_in_bf16_on_one_thread(xml: str, config: dict) -> None:
    """The real probe compile, except that it dies where OpenVINO 2026.4's AMX MLP kernel does:
    bf16 on one thread (its down projection divides by ``threads // 2``)."""
    if config["INFERENCE_PRECISION_HINT"] == "bf16" and config["INFERENCE_NUM_THREADS"] < 2:
        die("SIGFPE")
    from embedder.runtime import compile_openvino

    compile_openvino(xml, config)


def student_compile_that_crashes_in_bf16(xml: str, config: dict, d_enc: int, d_llm: int, lengths: tuple[int, ...] = ()) -> None:
    """A query encoder head's probe compile, except that bf16 kills the process."""
    if config["INFERENCE_PRECISION_HINT"] == "bf16":
        die("SIGFPE")
    from embedder.student_runtime import compile_student

    compile_student(xml, config, d_enc, d_llm, tuple(lengths))


def compile_that_always_crashes(xml: str, config: dict) -> None:
    die("SIGFPE")


def raise_value_error(**_: object) -> None:
    raise ValueError("a compile that fails politely")


@dataclass(frozen=True)
class DyingSpec:
    """An ``EmbedderSpec`` whose workers die when they start their ``die_on``-th shard.

    ``how``: a signal name (the process is killed) or "raise" (an exception)."""

    model: str
    die_on: int = 2
    how: str = "SIGKILL"

    def load(self):
        from indexer.build import EmbedderSpec

        embedder, encoder = EmbedderSpec(self.model, adapter="none", dtype="fp32", runtime="torch").load()
        if self.die_on == 0:
            die(self.how)
        calls = {"n": 0}
        real = embedder.iter_batches

        def iter_batches(texts, role="document"):
            calls["n"] += 1
            if calls["n"] == self.die_on:
                if self.how == "raise":
                    raise RuntimeError(f"worker gave up on its shard {Path(self.model).name}")
                die(self.how)
            return real(texts, role)

        embedder.iter_batches = iter_batches
        return embedder, encoder


def sentence_compile_that_crashes(xml: str, config: dict, inputs: dict) -> None:
    """A sentence encoder's probe compile that kills its process, as a native crash would."""
    die("SIGFPE")


def time_that_crashes_in_bf16(xml: str, config: dict, **kwargs) -> None:
    """The speed probe's child (compile, then time), except that bf16 kills the process at its compile."""
    if config["INFERENCE_PRECISION_HINT"] == "bf16":
        die("SIGFPE")
    from embedder.speed_probe import time_openvino

    time_openvino(xml, config, **kwargs)
