"""The compiled C++ CPU builder (kernels/cpu.py) gives the reference's answers bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels import cpu
from kernels.cpu import CpuBuildError, build_trees_cpp, greedy_accept_cpp
from kernels.reference import BatchedTrees, build_trees, greedy_accept_batch

FIELDS = (
    "token_ids",
    "depths",
    "parents",
    "visibility",
    "first_child",
    "next_sibling",
    "num_nodes",
)


def assert_same(a: BatchedTrees, b: BatchedTrees, what: str) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: {f}"
        assert np.array_equal(x, y), f"{what}: {f} differs"


def random_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int, str]:
    """[B, H, K] top-K inputs in one of several modes, most of them full of exact score ties."""
    b = int(rng.integers(1, 5))
    h = int(rng.integers(1, 33)) if rng.random() < 0.5 else int(rng.integers(1, 6))
    k = int(rng.integers(1, 65)) if rng.random() < 0.5 else int(rng.integers(1, 6))
    if rng.random() < 0.3:
        budget = int(rng.choice([0, 1, 2, 3, 15, 64, 128, 512]))
    else:  # log-uniform over 0..512
        budget = int(np.exp(rng.uniform(0, np.log(513)))) - 1
    mode = str(rng.choice(["continuous", "quarter", "half_zeros", "nonfinite", "unsorted"]))
    lp = -rng.exponential(1.5, size=(b, h, k))
    if mode == "quarter":  # multiples of 1/4: equal log-probs and equal path sums everywhere
        lp = np.round(lp * 4) / 4
    elif mode == "half_zeros":  # coarse, with zero log-probs: children tie their parents
        lp = np.round(lp * 2) / 2
        lp[rng.random(lp.shape) < 0.3] = 0.0
    elif mode == "nonfinite":  # -inf log-probs make NaN scores; heapq replay must still agree
        lp = np.round(lp * 4) / 4
        lp[rng.random(lp.shape) < 0.15] = -np.inf
    if mode != "unsorted":
        lp = -np.sort(-lp, axis=-1)
    ids = rng.integers(0, 4 * k + 8, size=(b, h, k))  # repeated ids allowed: both must agree
    return lp.astype(np.float32), ids, budget, mode


@pytest.mark.parametrize("seed", range(4))
def test_cpp_matches_reference_on_random_cases_with_ties(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    requests = 0
    for i in range(1000):
        lp, ids, budget, mode = random_case(rng)
        what = f"seed={seed} case={i} mode={mode} shape={lp.shape} budget={budget}"
        ref = build_trees(lp, ids, budget)
        got = build_trees_cpp(lp, ids, budget)
        assert_same(ref, got, what)
        h = lp.shape[1]
        pool = np.concatenate([ids.ravel(), [-5]])
        target = rng.choice(pool, size=(lp.shape[0], budget + 1))
        want = greedy_accept_batch(ref, target, max_depth=h)
        have = greedy_accept_cpp(got, target, max_depth=h)
        for x, y in zip(want, have, strict=True):
            assert np.array_equal(x, y), what
        requests += lp.shape[0]
    assert requests >= 1000


def test_accept_full_depth_paths_match() -> None:
    """Targets that follow each request's deepest node: long accepts, both implementations."""
    rng = np.random.default_rng(7)
    lp = np.round(-rng.exponential(0.3, size=(16, 15, 4)) * 4) / 4
    lp = (-np.sort(-lp, axis=-1)).astype(np.float32)
    ids = np.broadcast_to(np.arange(4), lp.shape).copy()
    trees = build_trees_cpp(lp, ids, 64)
    target = np.full((16, 65), -1, dtype=np.int64)
    for b in range(16):
        n = int(trees.num_nodes[b])
        node = int(np.argmax(trees.depths[b, :n])) + 1
        while node:
            parent = int(trees.parents[b, node])
            target[b, parent] = trees.token_ids[b, node - 1]
            node = parent
    acc, acc_len, bonus = greedy_accept_cpp(trees, target, max_depth=15)
    want = greedy_accept_batch(build_trees(lp, ids, 64), target, max_depth=15)
    for x, y in zip(want, (acc, acc_len, bonus), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(acc_len, trees.depths.max(axis=1) + 1)
    with pytest.raises(ValueError, match="max_depth"):
        greedy_accept_cpp(trees, target, max_depth=1)


@pytest.mark.parametrize("shape,budget", [((3, 0, 4), 8), ((2, 5, 0), 8), ((0, 5, 4), 8)])
def test_degenerate_shapes(shape: tuple[int, int, int], budget: int) -> None:
    lp = np.zeros(shape, np.float32)
    ids = np.zeros(shape, np.int64)
    assert_same(build_trees(lp, ids, budget), build_trees_cpp(lp, ids, budget), str(shape))


def test_torch_inputs_accepted() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    lp = (-np.sort(rng.exponential(1.0, (3, 6, 5)), axis=-1)).astype(np.float32)
    ids = rng.integers(0, 100, (3, 6, 5))
    got = build_trees_cpp(torch.from_numpy(lp), torch.from_numpy(ids), 20)
    assert_same(build_trees(lp, ids, 20), got, "torch")


def test_bad_arguments_raise() -> None:
    lp = np.zeros((2, 3, 4), np.float32)
    ids = np.zeros((2, 3, 4), np.int64)
    with pytest.raises(ValueError, match="top_log_probs"):
        build_trees_cpp(lp[0], ids[0], 4)
    with pytest.raises(ValueError, match="top_log_probs"):
        build_trees_cpp(ids, ids, 4)
    with pytest.raises(ValueError, match="top_token_ids"):
        build_trees_cpp(lp, ids[:, :2], 4)
    with pytest.raises(ValueError, match="top_token_ids"):
        build_trees_cpp(lp, lp, 4)
    with pytest.raises(ValueError, match="budget"):
        build_trees_cpp(lp, ids, -1)
    with pytest.raises(ValueError, match="budget"):
        build_trees_cpp(lp, ids, 2.0)
    trees = build_trees_cpp(lp, ids, 4)
    with pytest.raises(ValueError, match="target_ids"):
        greedy_accept_cpp(trees, np.zeros((2, 4), np.int64), max_depth=3)
    with pytest.raises(ValueError, match="target_ids"):
        greedy_accept_cpp(trees, np.zeros((2, 5), np.float32), max_depth=3)
    with pytest.raises(ValueError, match="max_depth"):
        greedy_accept_cpp(trees, np.zeros((2, 5), np.int64), max_depth=-1)
    broken = build_trees_cpp(lp, ids, 4)
    broken.first_child[0, 0] = 99  # out-of-range link: the C++ walk refuses it
    with pytest.raises(RuntimeError, match="bad tree"):
        greedy_accept_cpp(broken, np.zeros((2, 5), np.int64), max_depth=3)


def test_build_is_cached_by_source_hash_and_safe_across_processes(tmp_path: Path) -> None:
    env = {**os.environ, "DDTREE_CACHE": str(tmp_path)}
    code = "from kernels.cpu import library_path; print(library_path())"
    root = Path(cpu.__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, cwd=root, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1 and Path(outs[0]).is_file()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".lock", ".so"]  # no stray temps


def test_missing_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(CpuBuildError, match="g\\+\\+ not found"):
        cpu.library_path()


def test_core_timer_returns_per_call_seconds() -> None:
    rng = np.random.default_rng(11)
    lp = (-np.sort(rng.exponential(1.0, (2, 15, 8)), axis=-1)).astype(np.float32)
    ids = rng.integers(0, 100, (2, 15, 8))
    seconds = cpu.time_build_trees_cpp(lp, ids, 64, reps=5)
    assert seconds.shape == (5,) and (seconds > 0).all() and (seconds < 1).all()
    with pytest.raises(ValueError, match="reps"):
        cpu.time_build_trees_cpp(lp, ids, 64, reps=0)
