"""Compiled CPU baseline: builds csrc/cpu_tree_build.cpp with g++ on first use and binds it.

The shared library is cached under `$DDTREE_CACHE` (default `~/.cache/ddtree-ops/`), keyed by
the sha256 of the source; the build is atomic (temp file + os.replace) and serialised across
processes with a file lock. `build_trees_cpp` and `greedy_accept_cpp` have the same contract
and the same answers as `kernels.reference.build_trees` / `greedy_accept_batch`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kernels.build import cache_dir, cached
from kernels.reference import BatchedTrees, _budget, _check_topk, _int64

__all__ = [
    "CpuBuildError",
    "build_trees_cpp",
    "greedy_accept_cpp",
    "library_path",
    "time_build_trees_cpp",
]

SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_tree_build.cpp"
CXXFLAGS = ["-O3", "-shared", "-fPIC", "-std=c++17"]
_INT32_MAX = 2**31 - 1
_ERRORS = {1: "bad shape", 2: "null pointer", 3: "out of memory", 4: "path too deep", 5: "bad tree"}


class CpuBuildError(RuntimeError):
    """The C++ baseline could not be compiled (no g++, or the compiler failed)."""


def library_path() -> Path:
    """Path of the compiled library for the current source (built if missing)."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(CXXFLAGS).encode()).hexdigest()[:16]
    lib = cache_dir() / f"cpu_tree_build-{digest}.so"
    return cached(lib, lambda: _compile(lib))


def _compile(lib: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx or not shutil.which(cxx):
        raise CpuBuildError(
            "g++ not found: the C++ CPU baseline needs a C++17 compiler (install g++ or set CXX)"
        )
    fd, tmp = tempfile.mkstemp(prefix=lib.stem + ".", suffix=".tmp.so", dir=lib.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cxx, *CXXFLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise CpuBuildError(f"{cxx} failed on {SOURCE.name}:\n{proc.stderr[-4000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path()))
    ptr, c_int = ctypes.c_void_p, ctypes.c_int
    lib.ddtree_cpu_build_trees.argtypes = [ptr, ptr] + [c_int] * 4 + [ptr] * 7
    lib.ddtree_cpu_build_trees.restype = c_int
    lib.ddtree_cpu_greedy_accept.argtypes = [ptr] * 4 + [c_int] * 3 + [ptr] * 3
    lib.ddtree_cpu_greedy_accept.restype = c_int
    lib.ddtree_cpu_time_build_trees.argtypes = [ptr, ptr] + [c_int] * 5 + [ptr]
    lib.ddtree_cpu_time_build_trees.restype = c_int
    return lib


def _check(rc: int, op: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{op}: error {rc} ({_ERRORS.get(rc, 'unknown')})")


def build_trees_cpp(top_log_probs: Any, top_token_ids: Any, budget: int) -> BatchedTrees:
    """C++ `build_trees`: [B, H, K] top-K log-probs/ids -> BatchedTrees padded to `budget`."""
    lp, ids = _check_topk(top_log_probs, top_token_ids, 3)
    budget = _budget(budget)
    if max(*lp.shape, budget) > _INT32_MAX - 2:
        raise ValueError(f"top_log_probs: shape {lp.shape} / budget {budget} too large")
    b, h, k = lp.shape
    s = budget + 1
    # One int64 buffer holds all six int outputs (views), so only three addresses are taken
    # (each numpy address lookup costs microseconds; this keeps B=1 calls cheap).
    sizes = [b * budget, b * budget, b * s, b * s, b * s, b]
    buf = np.empty(sum(sizes), dtype=np.int64)
    vis = np.empty((b, s, s), dtype=np.bool_)
    offs = [0, *itertools.accumulate(sizes)]
    base = buf.ctypes.data
    addr = [base + 8 * o for o in offs[:-1]]
    rc = _lib().ddtree_cpu_build_trees(
        lp.ctypes.data,
        ids.ctypes.data,
        b,
        h,
        k,
        budget,
        addr[0],
        addr[1],
        addr[2],
        vis.ctypes.data,
        addr[3],
        addr[4],
        addr[5],
    )
    _check(rc, "ddtree_cpu_build_trees")
    part = [buf[offs[i] : offs[i + 1]] for i in range(6)]
    return BatchedTrees(
        token_ids=part[0].reshape(b, budget),
        depths=part[1].reshape(b, budget),
        parents=part[2].reshape(b, s),
        visibility=vis,
        first_child=part[3].reshape(b, s),
        next_sibling=part[4].reshape(b, s),
        num_nodes=part[5],
    )


def time_build_trees_cpp(
    top_log_probs: Any, top_token_ids: Any, budget: int, reps: int = 200
) -> np.ndarray:
    """Per-call seconds [reps] of the C++ build alone (timed in C++: no Python/ctypes overhead).

    The first call warms caches and scratch buffers and is not recorded.
    """
    lp, ids = _check_topk(top_log_probs, top_token_ids, 3)
    budget = _budget(budget)
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or not 0 < reps < 2**24:
        raise ValueError(f"reps: expected an int in 1..2**24-1, got {reps!r}")
    if max(*lp.shape, budget) > _INT32_MAX - 2:
        raise ValueError(f"top_log_probs: shape {lp.shape} / budget {budget} too large")
    seconds = np.empty(int(reps) + 1, dtype=np.float64)
    b, h, k = lp.shape
    rc = _lib().ddtree_cpu_time_build_trees(
        lp.ctypes.data, ids.ctypes.data, b, h, k, budget, int(reps) + 1, seconds.ctypes.data
    )
    _check(rc, "ddtree_cpu_time_build_trees")
    return seconds[1:]


def greedy_accept_cpp(
    trees: BatchedTrees, target_ids: Any, max_depth: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """C++ `greedy_accept_batch`: (accepted [B, max_depth+1] padded -1, accept_len, bonus)."""
    target = _int64(target_ids, "target_ids")
    b, budget = trees.batch, trees.budget
    if target.shape != (b, budget + 1):
        raise ValueError(f"target_ids: expected shape ({b}, {budget + 1}), got {target.shape}")
    if (
        isinstance(max_depth, bool)
        or not isinstance(max_depth, (int, np.integer))
        or not 0 <= max_depth < _INT32_MAX
    ):
        raise ValueError(f"max_depth: expected an int >= 0, got {max_depth!r}")
    fields = [trees.token_ids, trees.first_child, trees.next_sibling]
    tok, fc, ns = (np.ascontiguousarray(f, dtype=np.int64) for f in fields)
    if tok.shape != (b, budget) or fc.shape != (b, budget + 1) or ns.shape != (b, budget + 1):
        raise ValueError("trees: token_ids [B, budget], first_child / next_sibling [B, budget+1]")
    if budget > _INT32_MAX - 2:
        raise ValueError(f"trees: budget {budget} too large")
    accepted = np.empty((b, max_depth + 1), dtype=np.int64)
    accept_len = np.empty(b, dtype=np.int64)
    bonus = np.empty(b, dtype=np.int64)
    rc = _lib().ddtree_cpu_greedy_accept(
        tok.ctypes.data,
        fc.ctypes.data,
        ns.ctypes.data,
        target.ctypes.data,
        b,
        budget,
        int(max_depth),
        accepted.ctypes.data,
        accept_len.ctypes.data,
        bonus.ctypes.data,
    )
    if rc == 4:
        raise ValueError(f"max_depth: an accepted path is longer than {max_depth} nodes")
    _check(rc, "ddtree_cpu_greedy_accept")
    return accepted, accept_len, bonus


def _bench() -> None:
    """`python -m kernels.cpu`: median [IQR] us of the CPU baselines at H=15, budget=64."""
    import timeit

    from kernels.reference import build_trees, topk_logprobs

    rng = np.random.default_rng(0)
    print("baseline                      B   K   median us  [p25 - p75]")
    for k in (8, 64):
        logits = rng.standard_normal((64, 15, 4096), dtype=np.float32) * 3
        lp, ids = topk_logprobs(logits, k)
        for b in (1, 64):
            x, y = lp[:b], ids[:b]
            rows = {
                "python/heapq build_trees": timeit.repeat(
                    lambda x=x, y=y: build_trees(x, y, 64), number=1, repeat=max(3000 // b, 20)
                ),
                "c++ build_trees_cpp (call)": timeit.repeat(
                    lambda x=x, y=y: build_trees_cpp(x, y, 64), number=1, repeat=30000 // b
                ),
                "c++ core (timed in C++)": time_build_trees_cpp(x, y, 64, reps=30000 // b),
            }
            for name, t in rows.items():
                p25, p50, p75 = np.percentile(np.asarray(t) * 1e6, [25, 50, 75])
                print(f"{name:28s} {b:2d} {k:3d} {p50:10.1f}  [{p25:.1f} - {p75:.1f}]")


if __name__ == "__main__":
    _bench()
