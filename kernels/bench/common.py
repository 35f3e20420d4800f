"""What the topk, tree and accept suites share: input sets that L2 cannot hold, the CPU rows.

Each CUDA kernel is timed against the baselines that do the same job: plain torch, the
Python/heapq reference (what the live service runs today) and the compiled C++ baseline, both
timed on this host's CPU (`cpu_rows`).
"""

from __future__ import annotations

import math

import torch

from kernels.bench.config import BenchConfig, Row, row
from kernels.timing import time_host

ROTATE_BYTES = 192 << 20  # rotate inputs over at least this much (L2 is 50-60 MB)
HBM_BYTES_PER_S = 4.3e12  # measured device-to-device copy on this workplace's H200


def n_sets(bytes_per_set: int, lo: int = 2, hi: int = 64) -> int:
    return max(lo, min(hi, math.ceil(ROTATE_BYTES / max(bytes_per_set, 1))))


def launches(n_sets: int) -> int:
    """Launches per captured graph: every input set at least once (so L2 cannot hold them)."""
    return min(64, max(8, n_sets))


def cuda_ops():
    """`kernels.cuda`, imported when a suite runs."""
    from kernels import cuda

    return cuda


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def top_inputs(
    b: int, h: int, k: int, seed: int, scale: float = 2.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Realistic top-K: the top k of log_softmax over 4096 random logits per position."""
    x = torch.randn(b, h, max(4096, k), device="cuda", generator=gen(seed)) * scale
    lp, ids = torch.log_softmax(x, -1).topk(k, dim=-1)
    return lp.contiguous(), ids.contiguous()


def cpu_rows(suite: str, kernel: str, shape: dict, cfg: BenchConfig, py_fn, cpp_fn) -> list[Row]:
    out = [
        row(
            suite,
            kernel,
            "cpu_python",
            shape,
            time_host(py_fn, reps=3 if cfg.quick else 10, warmup=1),
        )
    ]
    if cpp_fn is not None:
        out.append(row(suite, kernel, "cpu_cpp", shape, cpp_fn()))
    return out


def cpp_ops():
    """`kernels.cpu` (the C++ baselines), or None where it cannot be imported."""
    try:
        from kernels import cpu
    except ImportError:
        return None
    return cpu
