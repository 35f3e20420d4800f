"""Drop-ins for the SGLang fork's DDTree tree builder and accept walk, on our builders.

The fork's `sglang.srt.speculative.dflash_ddtree_utils` (issue 18's contract):

- `build_ddtree_tree_from_topk(top_log_probs [H, K], top_token_ids [H, K], budget)` -> the
  7-tuple (node_token_ids long [n], node_depths long [n] 1-based, parents list of n+1 ints,
  child_maps list of n+1 dicts {token: child}, visibility bool [n+1, n+1],
  retrieve_next_token long [n+1], retrieve_next_sibling long [n+1]), all on the CPU. K is cut
  to min(budget, K); budget <= 0, H == 0 (or K == 0) give the root-only tree.
- `follow_verified_tree(child_maps, posterior)` -> (accepted node indices from 0, next token).

Backends: `cpp` (kernels.cpu, one request per call on the CPU), `cuda` (kernels.cuda; worth it
only for a batch, see `build_ddtree_trees`) and `python` (plain heapq; the stock algorithm).
Every backend gives the same answers, bit for bit, ties included: the compiled ones take
float32 log-probs (bf16 / fp16 convert exactly); float64 inputs go to `python`.

`child_maps` from our builder is a `ChildMaps`, a list subclass that also carries the tree's
arrays, so the `cpp` accept walk needs no conversion; it pickles and copies as a plain list.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kernels import cpu
from kernels.reference import BatchedTrees

__all__ = [
    "ACCEPT_BACKENDS",
    "ChildMaps",
    "TREE_BACKENDS",
    "build_ddtree_trees",
    "build_tree",
    "check_backend",
    "follow_tree",
    "make_accept",
    "make_build",
]

TREE_BACKENDS = ("cpp", "cuda", "python")
ACCEPT_BACKENDS = ("cpp", "python")
_EXACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CPP_MAX_BUDGET = 4096  # beyond, padded outputs grow as budget^2: the Python loop instead
_CUDA_LIMITS = {"H": 32, "K": 1024, "budget": 512}  # kernels.cuda's MAX_DEPTH / MAX_K / MAX_BUDGET
Tree7 = tuple[torch.Tensor, torch.Tensor, list, list, torch.Tensor, torch.Tensor, torch.Tensor]


class ChildMaps(list):
    """`child_maps` as a list of dicts, plus the arrays of the tree it came from."""

    __slots__ = ("trees", "depth", "unique")

    def __reduce__(self) -> tuple:  # pickle / copy as the plain list the contract names
        return (list, (list(self),))


# ----------------------------------------------------------------------------- build


def _root_only() -> Tree7:
    return (
        torch.empty(0, dtype=torch.long),
        torch.empty(0, dtype=torch.long),
        [-1],
        [{}],
        torch.ones((1, 1), dtype=torch.bool),
        torch.full((1,), -1, dtype=torch.long),
        torch.full((1,), -1, dtype=torch.long),
    )


def _long(a: np.ndarray) -> torch.Tensor:
    t = torch.empty(a.shape, dtype=torch.long)  # torch-owned storage, like the stock tensors
    t.numpy()[...] = a
    return t


def _contract(trees: BatchedTrees, b: int, depth: int) -> Tree7:
    """Request b of padded trees as the fork's 7-tuple (child_maps a ChildMaps)."""
    n = int(trees.num_nodes[b])
    parents = trees.parents[b, : n + 1].tolist()
    tokens = trees.token_ids[b, :n].tolist()
    maps = ChildMaps([{} for _ in range(n + 1)])
    for i, (p, tok) in enumerate(zip(parents[1:], tokens, strict=True), 1):
        maps[p][tok] = i  # in pop order, as the stock loop assigns them
    maps.trees = BatchedTrees(*(getattr(trees, f)[b : b + 1] for f in _FIELDS))
    maps.depth = depth
    maps.unique = sum(map(len, maps)) == n  # no two siblings share a token
    vis = torch.empty((n + 1, n + 1), dtype=torch.bool)
    vis.numpy()[...] = trees.visibility[b, : n + 1, : n + 1]
    return (
        _long(trees.token_ids[b, :n]),
        _long(trees.depths[b, :n]),
        parents,
        maps,
        vis,
        _long(trees.first_child[b, : n + 1]),
        _long(trees.next_sibling[b, : n + 1]),
    )


_FIELDS = ("token_ids", "depths", "parents", "visibility", "first_child", "next_sibling")
_FIELDS += ("num_nodes",)


def _python(lp: list[list[float]], ids: list[list[int]], budget: int) -> Tree7:
    """The stock algorithm in plain Python (float64 sums of the values as given)."""
    h, k = len(lp), len(lp[0])
    heap = [(-lp[0][0], (0,), 0, 1, 0, lp[0][0])]
    tokens: list[int] = []
    depths: list[int] = []
    parents = [-1]
    while heap and len(tokens) < budget:
        _, path, parent, depth, rank, score = heapq.heappop(heap)
        tokens.append(ids[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        if rank + 1 < k:
            s = score - lp[depth - 1][rank] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-s, path[:-1] + (rank + 1,), parent, depth, rank + 1, s))
        if depth < h:
            s = score + lp[depth][0]
            heapq.heappush(heap, (-s, path + (0,), len(tokens), depth + 1, 0, s))
    n = len(tokens)
    out = BatchedTrees(
        token_ids=np.asarray([tokens], dtype=np.int64).reshape(1, n),
        depths=np.asarray([depths], dtype=np.int64).reshape(1, n),
        parents=np.asarray([parents], dtype=np.int64),
        visibility=np.zeros((1, n + 1, n + 1), dtype=np.bool_),
        first_child=np.full((1, n + 1), -1, dtype=np.int64),
        next_sibling=np.full((1, n + 1), -1, dtype=np.int64),
        num_nodes=np.asarray([n], dtype=np.int64),
    )
    vis, last = out.visibility[0], [-1] * (n + 1)
    vis[0, 0] = True
    for i in range(1, n + 1):
        p = parents[i]
        vis[i, :i] = vis[p, :i]
        vis[i, i] = True
        if last[p] < 0:
            out.first_child[0, p] = i
        else:
            out.next_sibling[0, last[p]] = i
        last[p] = i
    return _contract(out, 0, h)


def _cut(top_log_probs: Any, top_token_ids: Any, budget: Any) -> tuple[Any, Any, int] | None:
    """(log-probs, ids) cut to K' = min(budget, K), or None for the root-only tree."""
    budget = int(budget)
    h, k = int(top_log_probs.shape[-2]), int(top_log_probs.shape[-1])
    kk = min(budget, k)
    if budget <= 0 or h == 0 or kk <= 0:
        return None
    lp, ids = top_log_probs[..., :kk], top_token_ids[..., :kk]
    if isinstance(lp, torch.Tensor):
        lp, ids = lp.detach(), ids.detach()
    return lp, ids, budget


def _exact_f32(lp: Any) -> bool:
    if isinstance(lp, torch.Tensor):
        return lp.dtype in _EXACT_DTYPES
    return np.asarray(lp).dtype in (np.float32, np.float16)


def build_tree(top_log_probs: Any, top_token_ids: Any, budget: Any, *, backend: str) -> Tree7:
    """One request's tree as the fork's 7-tuple, built by `backend`."""
    cut = _cut(top_log_probs, top_token_ids, budget)
    if cut is None:
        return _root_only()
    lp, ids, budget = cut
    h = int(lp.shape[0])
    if backend == "python" or not _exact_f32(lp) or budget > _CPP_MAX_BUDGET:
        return _python(_tolist(lp), _tolist(ids), budget)
    if backend == "cuda" and _cuda_fits(h, int(lp.shape[1]), budget):
        return _contract(_cuda_trees(lp[None], ids[None], budget), 0, h)
    return _contract(cpu.build_trees_cpp(lp[None], ids[None], budget), 0, h)


def build_ddtree_trees(
    top_log_probs: Any, top_token_ids: Any, budget: int, *, backend: str = "cuda"
) -> list[Tree7]:
    """A batch [B, H, K] (CPU or CUDA tensors) -> B 7-tuples: one kernel launch for all."""
    if backend not in TREE_BACKENDS:
        raise ValueError(f"backend: expected one of {TREE_BACKENDS}, got {backend!r}")
    b = int(top_log_probs.shape[0])
    cut = _cut(top_log_probs, top_token_ids, budget)
    if cut is None:
        return [_root_only() for _ in range(b)]
    lp, ids, budget = cut
    h, k = int(lp.shape[1]), int(lp.shape[2])
    if backend == "python" or not _exact_f32(lp) or budget > _CPP_MAX_BUDGET:
        return [_python(_tolist(lp[i]), _tolist(ids[i]), budget) for i in range(b)]
    if backend == "cuda" and _cuda_fits(h, k, budget):
        trees = _cuda_trees(lp, ids, budget)
    else:
        trees = cpu.build_trees_cpp(lp, ids, budget)
    return [_contract(trees, i, h) for i in range(b)]


def _tolist(x: Any) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _cuda_fits(h: int, k: int, budget: int) -> bool:
    lim = _CUDA_LIMITS
    return h <= lim["H"] and k <= lim["K"] and budget <= lim["budget"]


def _cuda_trees(lp: Any, ids: Any, budget: int) -> BatchedTrees:
    """kernels.cuda.build_trees on the current device; the outputs come back in two copies."""
    from kernels import cuda as kc

    dev = torch.device("cuda", torch.cuda.current_device())
    lpt = torch.as_tensor(lp).to(dev, torch.float32).contiguous()
    idt = torch.as_tensor(ids).to(dev, torch.int64).contiguous()
    t = kc.build_trees(lpt, idt, budget)
    b, s = int(lpt.shape[0]), budget + 1
    ints = torch.cat([t.token_ids.view(-1), t.depths.view(-1), t.parents.view(-1),
                      t.first_child.view(-1), t.next_sibling.view(-1), t.num_nodes])  # fmt: skip
    flat, vis = ints.cpu().numpy(), t.visibility.cpu().numpy()
    sizes = np.cumsum([0, b * budget, b * budget, b * s, b * s, b * s, b])
    part = [flat[sizes[i] : sizes[i + 1]] for i in range(6)]
    return BatchedTrees(
        token_ids=part[0].reshape(b, budget),
        depths=part[1].reshape(b, budget),
        parents=part[2].reshape(b, s),
        visibility=vis,
        first_child=part[3].reshape(b, s),
        next_sibling=part[4].reshape(b, s),
        num_nodes=part[5],
    )


# ----------------------------------------------------------------------------- accept


def _walk(child_maps: list, tokens: list) -> tuple[list[int], Any]:
    accepted, node = [0], 0
    nxt = tokens[0]
    while nxt in child_maps[node]:
        node = child_maps[node][nxt]
        accepted.append(node)
        nxt = tokens[node]
    return accepted, nxt


def follow_tree(child_maps: list, posterior: Any, *, backend: str) -> tuple[list[int], Any]:
    """(accepted node indices from 0, next token); `cpp` walks our tree's arrays in C++."""
    trees = getattr(child_maps, "trees", None)
    if (
        backend == "cpp"
        and trees is not None
        and child_maps.unique
        and len(child_maps) == int(trees.num_nodes[0]) + 1
        and isinstance(posterior, torch.Tensor)
        and posterior.dim() == 1
        and not posterior.dtype.is_floating_point
        and posterior.shape[0] >= len(child_maps)
    ):
        target = np.full((1, trees.budget + 1), -1, dtype=np.int64)
        target[0, : len(child_maps)] = posterior[: len(child_maps)].cpu().numpy()
        accepted, length, bonus = cpu.greedy_accept_cpp(trees, target, child_maps.depth)
        return accepted[0, : int(length[0])].tolist(), int(bonus[0])
    return _walk(child_maps, _tolist(posterior))


# ----------------------------------------------------------------------------- the functions


def check_backend(component: str, backend: str) -> None:
    """Raise (ValueError, RuntimeError, OSError, ...) unless `backend` can serve `component`."""
    known = TREE_BACKENDS if component == "tree_build" else ACCEPT_BACKENDS
    if backend not in known:
        raise ValueError(f"{component}: backend {backend!r} is not one of {known}")
    if backend == "cpp":  # compiles on first use (g++) and loads: fail now, not mid-request
        cpu.build_trees_cpp(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.int64), 1)
    if backend == "cuda":
        from kernels import cuda_core

        cuda_core.library_path()  # $DDTREE_KERNELS_LIB must name a library; nothing loads yet


def make_build(backend: str) -> Callable[[Any, Any, Any], Tree7]:
    """`build_ddtree_tree_from_topk` on `backend`, with the fork's exact signature."""
    if backend not in TREE_BACKENDS:
        raise ValueError(f"tree_build: backend {backend!r} is not one of {TREE_BACKENDS}")

    def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget):
        return build_tree(top_log_probs, top_token_ids, budget, backend=backend)

    build_ddtree_tree_from_topk.ddtree_ops_backend = backend  # type: ignore[attr-defined]
    return build_ddtree_tree_from_topk


def make_accept(backend: str) -> Callable[[Any, Any], tuple[list[int], Any]]:
    """`follow_verified_tree` on `backend`, with the fork's exact signature."""
    if backend not in ACCEPT_BACKENDS:
        raise ValueError(f"accept: backend {backend!r} is not one of {ACCEPT_BACKENDS}")

    def follow_verified_tree(child_maps, posterior):
        return follow_tree(child_maps, posterior, backend=backend)

    follow_verified_tree.ddtree_ops_backend = backend  # type: ignore[attr-defined]
    return follow_verified_tree
