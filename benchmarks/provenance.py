"""Where and when a number was measured: the machine, the checkout's commit, the load average.
Recorded in every results file (beir-eval, cls-eval, study tables)."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import benchmarks


def machine_info() -> dict:
    """CPU model, cores, RAM, OS, Python: the machine a number was measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = round(int(line.split()[1]) / 1024**2, 1)
                break
    except OSError:
        pass
    from embedder.hardware import cpu_capability

    cap = cpu_capability()  # the vector ISA decides which precision is fast (embedder/hardware.py)
    return {
        "cpu": cpu,
        "cpu_flags": list(cap.flags),
        "native_bf16": cap.native_bf16,
        "cores": os.cpu_count(),
        "ram_gib": ram,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def git_commit(root: Path = benchmarks.REPO_ROOT) -> dict:
    """The checkout's commit and whether tracked files differ from it (read-only git calls)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def load_avg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (other jobs competing for the CPU), or None."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
