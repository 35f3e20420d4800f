"""The level-synchronous tree build (the CUDA default for budget <= 64), as a Python model of
its decisions, against the reference on thousands of random inputs.

The kernel (kernels/csrc/tree_build_levels.cuh) takes an input only when every score is an
exact float64 sum, the rows are sorted and no two kept nodes tie; then the pop order is the
score order and the level selection finds it. Here the model must give the reference's tree
wherever it takes an input, take most drafter-like inputs, and decline inputs with ties.
The GPU tests check the kernel against the same model's decisions (tests/test_cuda_kernels.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.tree_levels_model import build, eligible

from kernels.reference import build_tree


def _drafter(rng: np.random.Generator, h: int, k: int, scale: float) -> np.ndarray:
    x = rng.standard_normal((h, max(k, 1) * 4)) * scale
    x = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return (-np.sort(-x, axis=-1)[:, :k]).astype(np.float32)


def _case(rng: np.random.Generator, mode: str) -> tuple[np.ndarray, int]:
    h = int(rng.integers(1, 33)) if rng.random() < 0.5 else int(rng.integers(1, 16))
    k = int(rng.integers(1, 80))
    budget = int(rng.integers(0, 70))
    if mode == "quarter":  # exact ties everywhere
        lp = -np.sort(rng.integers(0, 6, (h, k)) * 0.25, axis=-1)
    elif mode == "tiny":  # log-probs far below a score's ulp: float64 sums are inexact
        lp = np.full((h, k), -1e-9)
        lp[0] = -3.0 - np.arange(k) * 1e-9
        lp = -np.sort(-lp, axis=-1)
    elif mode == "unsorted":
        lp = -rng.exponential(1.5, size=(h, k))
    else:
        lp = _drafter(rng, h, k, {"drafter": 2.5, "peaked": 6.0, "sharp": 12.0}[mode])
    return lp.astype(np.float32), budget


@pytest.mark.parametrize("mode", ["drafter", "peaked", "sharp", "quarter", "tiny", "unsorted"])
def test_model_matches_reference_where_it_takes_the_input(mode):
    rng = np.random.default_rng(sum(map(ord, mode)))
    taken = 0
    n = 600
    for _ in range(n):
        lp, budget = _case(rng, mode)
        ids = rng.integers(0, 1000, size=lp.shape)
        got = build(lp, budget)
        if got is None:
            continue
        taken += 1
        want = build_tree(lp, ids, budget)
        depths, ranks, parents = got
        assert depths == want.depths.tolist()
        assert parents == want.parents.tolist()
        tokens = [ids[d - 1][r] for d, r in zip(depths, ranks, strict=True)]
        assert tokens == want.token_ids.tolist()
    if mode in ("drafter", "peaked"):  # budget 1..64 of a drafter-like input: always taken
        assert taken >= 0.9 * n * 64 / 70


def test_model_declines_ties_and_bad_inputs():
    lp = np.array([[-0.5, -0.5, -1.0], [-0.25, -0.75, -1.0]], dtype=np.float32)
    assert eligible(lp, 8) and build(lp, 8) is None  # equal scores among the kept nodes
    assert not eligible(np.array([[-1.0, -0.5]], dtype=np.float32), 2)  # unsorted row
    assert not eligible(np.array([[-1.0], [0.5]], dtype=np.float32), 2)  # child above parent
    inexact = np.array([[-3.0, -3.5], [-1e-9, -2e-9]], dtype=np.float32)
    assert not eligible(inexact, 4)  # -3 + -1e-9 is not a float64
    assert not eligible(np.array([[-1.0, np.nan]], dtype=np.float32), 1)  # read past the pop
    assert not eligible(np.zeros((2, 2), dtype=np.float32), 65)  # budget over 64
    assert build(np.array([[-1.0, -2.0]], dtype=np.float32), 0) is None
