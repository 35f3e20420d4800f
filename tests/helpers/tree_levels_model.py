"""Python model of the CUDA level-synchronous tree build (kernels/csrc/tree_build_levels.cuh).

The model makes the same decisions as the kernel, step for step, so the CPU test suite can check
the algorithm itself against `kernels.reference.build_tree` on thousands of inputs (the GPU
tests then check the kernel against the reference). It returns None where the kernel declines
the input and falls back to the serial best-first loop.
"""

from __future__ import annotations

import math

import numpy as np

ROOT = -1
LOG = 1024  # the kernel's node log (kLvLog)


def eligible(lp: np.ndarray, budget: int) -> bool:
    """The kernel's preconditions: every score the reference forms is an exact float64 sum.

    Then the reference's `(s - a) + b` chains equal `s_parent + b`, scores only fall along
    parent -> child (log-probs <= 0) and sibling -> next sibling (sorted rows), so the best-first
    pop order is the order of the scores themselves (ties excepted: checked later).
    """
    h, k = lp.shape
    if not 1 <= budget <= 64 or h == 0 or k == 0:
        return False
    kc = min(k, budget)
    used = lp[:, : min(k, kc + 1)].astype(np.float32)
    if not np.all(np.isfinite(used)):
        return False
    rows = used[:, :kc].astype(np.float64)
    if np.any(rows[:, 1:] > rows[:, :-1]) or np.any(rows[1:, 0] > 0):
        return False
    bits = used.view(np.uint32)
    ex = (bits >> 23) & 0xFF
    nz = (bits & 0x7FFFFFFF) != 0
    if not np.any(nz):
        return True
    emin = int(np.min(np.where(ex[nz] == 0, 1, ex[nz]))) - 150
    mx = h * float(np.max(np.abs(rows)))  # bounds every partial sum along a path
    return mx < math.ldexp(1.0, 53 + emin)


def build(lp32: np.ndarray, budget: int):
    """(depths, ranks, parents) in pop order, or None where the kernel declines the input.

    parents[0] is -1 (the root's); a node's parent is 0 for the root, else its 1-based index.
    """
    if not eligible(lp32, budget):
        return None
    lp = lp32.astype(np.float64)
    h, k = lp.shape
    b = budget
    kc = min(k, b)
    # T: sorted list of (key, parent slot, rank, depth)
    t = [(lp[0][r], ROOT, r, 1) for r in range(kc)]
    logged = len(t)  # node ids handed out: depth 1, then every candidate
    d = 1
    while d < h:
        n_t = len(t)
        tau = t[-1][0] if n_t == b else -math.inf
        cands = []
        j = 0
        for i, (s, _p, _r, dep) in enumerate(t):
            if dep != d:
                continue
            cmax = min(kc, b // (j + 1) - 1)
            j += 1
            for r in range(max(cmax, 0)):
                v = s + lp[d][r]
                if v < tau:
                    break
                cands.append((v, i, r, d + 1))
        if not cands:
            break
        logged += len(cands)
        if logged > LOG:
            return None  # the kernel's node log is full
        pool = t + cands
        keys = [e[0] for e in pool]
        ranks = [sum(1 for f in keys if f > e) for e in keys]
        kept = [e for e, rk in zip(pool, ranks, strict=True) if rk < b]
        if len({rk for rk in ranks if rk < b}) != len(kept):
            return None  # a tie among the kept: the kernel declines
        newpos = {i: rk for i, rk in enumerate(ranks[:n_t]) if rk < b}
        order = sorted(zip(ranks, range(len(pool)), strict=True))
        new_t = []
        for rk, idx in order:
            if rk >= b:
                break
            key, p, r, dep = pool[idx]
            # Without ties a kept node's parent scores higher, so it is kept too (the kernel
            # relies on this; a KeyError here would be a bug in the argument, not a decline).
            new_t.append((key, p if p == ROOT else newpos[p], r, dep))
        t = new_t
        d += 1
    depths = [e[3] for e in t]
    ranks = [e[2] for e in t]
    parents = [-1] + [0 if e[1] == ROOT else e[1] + 1 for e in t]
    return depths, ranks, parents
