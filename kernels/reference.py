"""Exact CPU references for the DDTree step kernels (numpy in, numpy out; torch tensors accepted).

Top-K log-probs, the best-first tree build (tie-exact with liranringel/ddtree
`build_ddtree_tree`), its batched padded form, and the greedy accept walk. The Python/heapq
`build_trees` here is also the "reference-style" CPU baseline: what the live service runs today.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BatchedTrees",
    "Tree",
    "build_tree",
    "build_trees",
    "greedy_accept",
    "greedy_accept_batch",
    "topk_logprobs",
]


def _to_numpy(x: Any, name: str) -> np.ndarray:
    """Convert an array, torch tensor or nested list to numpy (bf16/fp16 tensors -> float32)."""
    if type(x).__module__.startswith("torch"):
        t = x.detach().cpu()
        if t.is_floating_point() and t.dtype.itemsize < 4:
            t = t.float()
        return t.numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # pragma: no cover - numpy raises many kinds here
        raise ValueError(f"{name}: cannot convert {type(x).__name__} to an array") from exc


def _float32(x: Any, name: str) -> np.ndarray:
    a = _to_numpy(x, name)
    if a.dtype.kind != "f":
        raise ValueError(f"{name}: expected a floating dtype, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _int64(x: Any, name: str) -> np.ndarray:
    a = _to_numpy(x, name)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected an integer dtype, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _budget(budget: Any) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"budget: expected an int >= 0, got {budget!r}")
    return int(budget)


# ----------------------------------------------------------------------------- top-k log-probs


def topk_logprobs(logits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k log-probs over the last axis: (log_probs float32 [..., k], token_ids int64 [..., k]).

    Sorted by logit descending, equal logits by smaller token id first. The log-sum-exp is
    computed in float64 and rounded to float32; log_prob = top_logit - lse in float32.
    """
    x = _float32(logits, "logits")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"logits: expected shape [..., V] with V > 0, got {x.shape}")
    v = x.shape[-1]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= v:
        raise ValueError(f"k: expected an int in 1..{v}, got {k!r}")
    k = int(k)
    lead = x.shape[:-1]
    rows = x.reshape(-1, v)
    ids = np.empty((rows.shape[0], k), dtype=np.int64)
    for i, row in enumerate(rows):
        if 4 * k >= v:
            cand = np.arange(v)
        else:  # every index whose value ties or beats the k-th largest, then a stable sort
            thr = np.partition(row, v - k)[v - k]
            cand = np.flatnonzero(row >= thr)
        order = np.argsort(-row[cand], kind="stable")[:k]
        ids[i] = cand[order]
    top = np.take_along_axis(rows, ids, axis=-1)
    r64 = rows.astype(np.float64)
    m = r64.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        lse = m + np.log(np.exp(r64 - m).sum(axis=-1, keepdims=True))
    lp = top - lse.astype(np.float32)
    return lp.reshape(*lead, k), ids.reshape(*lead, k)


# ----------------------------------------------------------------------------- trees


@dataclass
class Tree:
    """One request's draft tree; node 0 is the root, nodes 1..n in pop order."""

    token_ids: np.ndarray  # int64 [n]
    depths: np.ndarray  # int64 [n], 1-based
    parents: np.ndarray  # int64 [n+1], parents[0] == -1
    visibility: np.ndarray  # bool [n+1, n+1], ancestors + self
    first_child: np.ndarray  # int64 [n+1], -1 = none
    next_sibling: np.ndarray  # int64 [n+1], -1 = none; siblings in pop order

    @property
    def num_nodes(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class BatchedTrees:
    """B trees padded to the budget: -1 in every int field, False in visibility."""

    token_ids: np.ndarray  # int64 [B, budget]
    depths: np.ndarray  # int64 [B, budget]
    parents: np.ndarray  # int64 [B, budget+1]
    visibility: np.ndarray  # bool [B, budget+1, budget+1]
    first_child: np.ndarray  # int64 [B, budget+1]
    next_sibling: np.ndarray  # int64 [B, budget+1]
    num_nodes: np.ndarray  # int64 [B]

    @property
    def batch(self) -> int:
        return int(self.num_nodes.shape[0])

    @property
    def budget(self) -> int:
        return int(self.token_ids.shape[1])

    def tree(self, b: int) -> Tree:
        """Request b's tree, unpadded."""
        n = int(self.num_nodes[b])
        return Tree(
            token_ids=self.token_ids[b, :n].copy(),
            depths=self.depths[b, :n].copy(),
            parents=self.parents[b, : n + 1].copy(),
            visibility=self.visibility[b, : n + 1, : n + 1].copy(),
            first_child=self.first_child[b, : n + 1].copy(),
            next_sibling=self.next_sibling[b, : n + 1].copy(),
        )


def _pop_order(lp: list[list[float]], ids: list[list[int]], h: int, k: int, budget: int):
    """Best-first expansion; returns (token_ids, depths, parents) lists in pop order.

    Mirrors liranringel/ddtree `build_ddtree_tree` (ddtree.py; copies in several public
    repositories): heap entries (-logw, rank_path, parent, depth, rank, logw), so equal scores
    pop the lexicographically smaller rank path first (a proper prefix before its extensions);
    sibling score `logw - lp[d-1][r] + lp[d-1][r+1]`, child score `logw + lp[d][0]`, in float64.
    """
    tokens: list[int] = []
    depths: list[int] = []
    parents = [-1]
    if budget <= 0 or h == 0 or k == 0:
        return tokens, depths, parents
    first = lp[0][0]
    heap: list[tuple[float, tuple[int, ...], int, int, int, float]] = [
        (-first, (0,), 0, 1, 0, first)
    ]
    n = 0
    while heap and n < budget:
        _, ranks, parent, depth, rank, logw = heapq.heappop(heap)
        tokens.append(ids[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        n += 1
        if rank + 1 < k:
            row = lp[depth - 1]
            sib = logw - row[rank] + row[rank + 1]
            heapq.heappush(heap, (-sib, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, sib))
        if depth < h:
            child = logw + lp[depth][0]
            heapq.heappush(heap, (-child, ranks + (0,), n, depth + 1, 0, child))
    return tokens, depths, parents


def _links(parents: list[int], size: int) -> tuple[np.ndarray, np.ndarray]:
    """first_child / next_sibling of length `size` (-1 padded), children in increasing index."""
    first_child = np.full(size, -1, dtype=np.int64)
    next_sibling = np.full(size, -1, dtype=np.int64)
    last = [-1] * len(parents)
    for i in range(1, len(parents)):
        p = parents[i]
        if last[p] < 0:
            first_child[p] = i
        else:
            next_sibling[last[p]] = i
        last[p] = i
    return first_child, next_sibling


def _visibility(parents: list[int], size: int) -> np.ndarray:
    vis = np.zeros((size, size), dtype=np.bool_)
    vis[0, 0] = True
    for i in range(1, len(parents)):
        vis[i, :i] = vis[parents[i], :i]
        vis[i, i] = True
    return vis


def _check_topk(top_log_probs: Any, top_token_ids: Any, ndim: int) -> tuple[np.ndarray, ...]:
    lp = _float32(top_log_probs, "top_log_probs")
    ids = _int64(top_token_ids, "top_token_ids")
    if lp.ndim != ndim:
        raise ValueError(f"top_log_probs: expected {ndim} dims, got shape {lp.shape}")
    if ids.shape != lp.shape:
        raise ValueError(f"top_token_ids: shape {ids.shape} != top_log_probs shape {lp.shape}")
    return lp, ids


def build_tree(top_log_probs: Any, top_token_ids: Any, budget: int) -> Tree:
    """Best-first tree of at most `budget` nodes from per-position top-K [H, K] (best first)."""
    lp, ids = _check_topk(top_log_probs, top_token_ids, 2)
    budget = _budget(budget)
    h, k = lp.shape
    tokens, depths, parents = _pop_order(lp.astype(np.float64).tolist(), ids.tolist(), h, k, budget)
    n = len(tokens)
    first_child, next_sibling = _links(parents, n + 1)
    return Tree(
        token_ids=np.asarray(tokens, dtype=np.int64).reshape(n),
        depths=np.asarray(depths, dtype=np.int64).reshape(n),
        parents=np.asarray(parents, dtype=np.int64),
        visibility=_visibility(parents, n + 1),
        first_child=first_child,
        next_sibling=next_sibling,
    )


def build_trees(top_log_probs: Any, top_token_ids: Any, budget: int) -> BatchedTrees:
    """Batched `build_tree` over [B, H, K] inputs, padded to `budget` nodes per request."""
    lp, ids = _check_topk(top_log_probs, top_token_ids, 3)
    budget = _budget(budget)
    b, h, k = lp.shape
    out = BatchedTrees(
        token_ids=np.full((b, budget), -1, dtype=np.int64),
        depths=np.full((b, budget), -1, dtype=np.int64),
        parents=np.full((b, budget + 1), -1, dtype=np.int64),
        visibility=np.zeros((b, budget + 1, budget + 1), dtype=np.bool_),
        first_child=np.full((b, budget + 1), -1, dtype=np.int64),
        next_sibling=np.full((b, budget + 1), -1, dtype=np.int64),
        num_nodes=np.zeros(b, dtype=np.int64),
    )
    lp64 = lp.astype(np.float64).tolist()
    idl = ids.tolist()
    for i in range(b):
        tokens, depths, parents = _pop_order(lp64[i], idl[i], h, k, budget)
        n = len(tokens)
        out.num_nodes[i] = n
        out.token_ids[i, :n] = tokens
        out.depths[i, :n] = depths
        out.parents[i, : n + 1] = parents
        out.first_child[i], out.next_sibling[i] = _links(parents, budget + 1)
        out.visibility[i] = _visibility(parents, budget + 1)
    return out


# ----------------------------------------------------------------------------- greedy accept


def _walk(
    token_ids: np.ndarray, first_child: np.ndarray, next_sibling: np.ndarray, target: np.ndarray
) -> tuple[list[int], int]:
    accepted = [0]
    cur = 0
    while True:
        want = int(target[cur])
        c = int(first_child[cur])
        while c >= 0 and int(token_ids[c - 1]) != want:
            c = int(next_sibling[c])
        if c < 0:
            return accepted, want
        accepted.append(c)
        cur = c


def greedy_accept(tree: Tree, target_ids: Any) -> tuple[np.ndarray, int]:
    """Walk from the root while the target's id at the current node is a child's token.

    `target_ids[i]` is the target's greedy token after node i ([n+1]). Returns the accepted
    node indices (starting with 0) and the bonus token (the target's id at the last one).
    """
    target = _int64(target_ids, "target_ids")
    n = tree.num_nodes
    if target.shape != (n + 1,):
        raise ValueError(f"target_ids: expected shape ({n + 1},), got {target.shape}")
    accepted, bonus = _walk(tree.token_ids, tree.first_child, tree.next_sibling, target)
    return np.asarray(accepted, dtype=np.int64), bonus


def greedy_accept_batch(
    trees: BatchedTrees, target_ids: Any, max_depth: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batched accept: (accepted [B, max_depth+1] padded -1, accept_len [B], bonus [B]).

    `target_ids` is [B, budget+1]; entries past a request's node count are ignored.
    `max_depth` is the drafter's H (the deepest node any tree can hold).
    """
    target = _int64(target_ids, "target_ids")
    b, budget = trees.batch, trees.budget
    if target.shape != (b, budget + 1):
        raise ValueError(f"target_ids: expected shape ({b}, {budget + 1}), got {target.shape}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)) or max_depth < 0:
        raise ValueError(f"max_depth: expected an int >= 0, got {max_depth!r}")
    accepted = np.full((b, max_depth + 1), -1, dtype=np.int64)
    accept_len = np.zeros(b, dtype=np.int64)
    bonus = np.zeros(b, dtype=np.int64)
    for i in range(b):
        path, bonus[i] = _walk(
            trees.token_ids[i], trees.first_child[i], trees.next_sibling[i], target[i]
        )
        if len(path) > max_depth + 1:
            raise ValueError(f"max_depth: request {i} accepted {len(path) - 1} > {max_depth} nodes")
        accepted[i, : len(path)] = path
        accept_len[i] = len(path)
    return accepted, accept_len, bonus


# The tree-verify attention and KV compaction references are re-exported below.
from kernels.reference_attention import compact_kv, tree_verify_attention  # noqa: E402,F401
