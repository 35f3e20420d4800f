"""The environment a benchmark ran in: GPU (name, UUID, driver, clocks, other processes),
CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER, git sha, torch version, host and CPU."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

_GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "temperature.gpu",
    "power.draw",
    "memory.used",
    "memory.total",
    "utilization.gpu",
)


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def nvidia_smi() -> dict[str, Any]:
    """GPUs and compute processes as nvidia-smi reports them ({} if it is absent)."""
    if not shutil.which("nvidia-smi"):
        return {}
    out: dict[str, Any] = {}
    q = _run(["nvidia-smi", f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader"])
    if q:
        out["gpus"] = [
            dict(zip(_GPU_FIELDS, (v.strip() for v in line.split(",")), strict=False))
            for line in q.splitlines()
        ]
    apps = _run(
        [
            "nvidia-smi",
            "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
            "--format=csv,noheader",
        ]
    )
    out["compute_processes"] = apps.splitlines() if apps else []
    return out


def git_sha() -> str:
    env = os.environ.get("DDTREE_GIT_SHA")
    if env:
        return env
    root = Path(__file__).resolve().parent.parent
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if not sha:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return sha + ("-dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
        "kernel_switches": {k: v for k, v in os.environ.items() if k.startswith("DDTREE_")},
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            i = torch.cuda.current_device()
            p = torch.cuda.get_device_properties(i)
            env["device"] = {
                "index": i,
                "name": p.name,
                "sm_count": p.multi_processor_count,
                "capability": f"{p.major}.{p.minor}",
                "uuid": str(getattr(p, "uuid", "")),
            }
    except ImportError:
        env["torch"] = None
    env["nvidia_smi"] = nvidia_smi()
    return env
