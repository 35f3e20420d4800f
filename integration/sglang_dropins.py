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

The returned tensors of one call are slices of one buffer (contiguous, no copies), and
`child_maps` is a `ChildMaps`, a list subclass that also knows where the tree's arrays are, so
the `cpp` accept walk needs no conversion; it pickles and copies as a plain list.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kernels import cpu

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
Tree7 = tuple[torch.Tensor, torch.Tensor, list, list, torch.Tensor, torch.Tensor, torch.Tensor]


class ChildMaps(list):
    """`child_maps` as a list of dicts, plus where the tree's arrays are (for the C++ walk)."""

    __slots__ = ("arrays",)

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


class _Packed:
    """B padded trees in one int64 numpy buffer, field after field (the C++ builder's layout):
    token_ids [B, budget], depths [B, budget], parents / first_child / next_sibling
    [B, budget+1], num_nodes [B]; and visibility bool [B, budget+1, budget+1]."""

    def __init__(self, batch: int, budget: int, ints: np.ndarray, vis: np.ndarray) -> None:
        self.batch, self.budget, self.ints, self.vis = batch, budget, ints, vis
        self.base = ints.ctypes.data
        b, s = batch, budget + 1
        self.off = dict(tok=0, dep=b * budget, par=2 * b * budget)
        self.off.update(fc=self.off["par"] + b * s, ns=self.off["par"] + 2 * b * s)
        self.off["num"] = self.off["par"] + 3 * b * s

    @classmethod
    def empty(cls, batch: int, budget: int) -> _Packed:
        s = budget + 1
        ints = np.empty(2 * batch * budget + 3 * batch * s + batch, dtype=np.int64)
        return cls(batch, budget, ints, np.empty((batch, s, s), dtype=np.bool_))

    def request(self, b: int, depth: int) -> Tree7:
        """Request b as the fork's 7-tuple; its tensors share the buffers' memory (no copies)."""
        s, o, arr = self.budget + 1, self.off, self.ints
        n = int(arr[o["num"] + b])
        t0, d0 = o["tok"] + b * self.budget, o["dep"] + b * self.budget
        p0, f0, s0 = o["par"] + b * s, o["fc"] + b * s, o["ns"] + b * s
        parents = arr[p0 : p0 + n + 1].tolist()
        maps = ChildMaps([{} for _ in range(n + 1)])
        for i, (p, tok) in enumerate(zip(parents[1:], arr[t0 : t0 + n].tolist(), strict=True), 1):
            maps[p][tok] = i  # in pop order, as the stock loop assigns them
        unique = sum(map(len, maps)) == n  # no two siblings share a token: the walks agree
        base = self.base
        arrays = (self, base + 8 * t0, base + 8 * f0, base + 8 * s0, depth, n)
        maps.arrays = arrays if unique else None
        vis = (
            self.vis[b] if n == self.budget else np.ascontiguousarray(self.vis[b, : n + 1, : n + 1])
        )
        t = torch.from_numpy
        return (t(arr[t0 : t0 + n]), t(arr[d0 : d0 + n]), parents, maps, t(vis),
                t(arr[f0 : f0 + n + 1]), t(arr[s0 : s0 + n + 1]))  # fmt: skip


def _host(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous():
        return t
    return t.detach().to("cpu", dtype).contiguous()


def _cpp(lp: torch.Tensor, ids: torch.Tensor, budget: int) -> _Packed:
    """kernels.cpu's compiled builder on [B, H, K] or one request's [H, K], into a _Packed."""
    lp, ids = _host(lp, torch.float32), _host(ids, torch.int64)
    b, h, k = lp.shape if lp.dim() == 3 else (1, *lp.shape)
    out = _Packed.empty(b, budget)
    base, o = out.base, out.off
    rc = cpu._lib().ddtree_cpu_build_trees(
        lp.data_ptr(), ids.data_ptr(), b, h, k, budget, base + 8 * o["tok"], base + 8 * o["dep"],
        base + 8 * o["par"], out.vis.ctypes.data, base + 8 * o["fc"], base + 8 * o["ns"],
        base + 8 * o["num"],
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"ddtree_cpu_build_trees: error {rc}")
    return out


def _python(lp: list[list[float]], ids: list[list[int]], budget: int) -> _Packed:
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
            w = score - lp[depth - 1][rank] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-w, path[:-1] + (rank + 1,), parent, depth, rank + 1, w))
        if depth < h:
            w = score + lp[depth][0]
            heapq.heappush(heap, (-w, path + (0,), len(tokens), depth + 1, 0, w))
    n = len(tokens)
    out = _Packed.empty(1, n)  # padded to n: exactly the tree
    arr, o = out.ints, out.off
    arr[:] = -1
    arr[o["tok"] : o["tok"] + n], arr[o["dep"] : o["dep"] + n] = tokens, depths
    arr[o["par"] : o["par"] + n + 1], arr[o["num"]] = parents, n
    vis, last = out.vis[0], [-1] * (n + 1)
    vis[...] = False
    vis[0, 0] = True
    for i in range(1, n + 1):
        p = parents[i]
        vis[i, :i] = vis[p, :i]
        vis[i, i] = True
        if last[p] < 0:
            arr[o["fc"] + p] = i
        else:
            arr[o["ns"] + last[p]] = i
        last[p] = i
    return out


def _inputs(top_log_probs: Any, top_token_ids: Any, budget: Any) -> tuple | None:
    """(log-probs, ids, budget, H, K) as tensors, or None for the root-only tree."""
    budget = int(budget)
    lp = (
        top_log_probs if isinstance(top_log_probs, torch.Tensor) else torch.as_tensor(top_log_probs)
    )
    ids = (
        top_token_ids if isinstance(top_token_ids, torch.Tensor) else torch.as_tensor(top_token_ids)
    )
    h, k = int(lp.shape[-2]), int(lp.shape[-1])
    if budget <= 0 or h == 0 or k == 0:
        return None
    return lp, ids, budget, h, k


def _compiled(lp: torch.Tensor, budget: int) -> bool:
    """Can a float32 builder reproduce the stock float64 sums exactly (and pad sanely)?"""
    return lp.dtype in _EXACT_DTYPES and budget <= _CPP_MAX_BUDGET


# The compiled builders get all K columns: cutting K to min(budget, K) cannot change the tree
# (a rank-r sibling pops only after its r elder siblings, so no rank >= budget ever pops, and
# the extra candidates pushed never reorder the others). The Python builder cuts, as the stock.


def build_tree(top_log_probs: Any, top_token_ids: Any, budget: Any, *, backend: str) -> Tree7:
    """One request's tree as the fork's 7-tuple, built by `backend`."""
    got = _inputs(top_log_probs, top_token_ids, budget)
    if got is None:
        return _root_only()
    lp, ids, budget, h, k = got
    if backend == "python" or not _compiled(lp, budget):
        kk = min(budget, k)
        return _python(lp[:, :kk].tolist(), ids[:, :kk].tolist(), budget).request(0, h)
    if backend == "cuda" and _cuda_fits(h, min(k, budget), budget):
        return _cuda(lp[None, :, :budget], ids[None, :, :budget], budget).request(0, h)
    return _cpp(lp, ids, budget).request(0, h)


def build_ddtree_trees(
    top_log_probs: Any, top_token_ids: Any, budget: int, *, backend: str = "cuda"
) -> list[Tree7]:
    """A batch [B, H, K] (CPU or CUDA tensors) -> B 7-tuples, from one builder call."""
    if backend not in TREE_BACKENDS:
        raise ValueError(f"backend: expected one of {TREE_BACKENDS}, got {backend!r}")
    b = int(top_log_probs.shape[0])
    got = _inputs(top_log_probs, top_token_ids, budget)
    if got is None:
        return [_root_only() for _ in range(b)]
    lp, ids, budget, h, k = got
    if backend == "python" or not _compiled(lp, budget):
        kk = min(budget, k)
        lists = zip(lp[..., :kk].tolist(), ids[..., :kk].tolist(), strict=True)
        return [_python(x, y, budget).request(0, h) for x, y in lists]
    if backend == "cuda" and _cuda_fits(h, min(k, budget), budget):
        packed = _cuda(lp[..., :budget], ids[..., :budget], budget)
    else:
        packed = _cpp(lp, ids, budget)
    return [packed.request(i, h) for i in range(b)]


def _cuda_fits(h: int, k: int, budget: int) -> bool:
    """Within kernels.cuda's limits (else the C++ builder gives the same answer)."""
    from kernels.cuda import MAX_BUDGET, MAX_DEPTH, MAX_K

    return h <= MAX_DEPTH and k <= MAX_K and budget <= MAX_BUDGET


def _cuda(lp: torch.Tensor, ids: torch.Tensor, budget: int) -> _Packed:
    """kernels.cuda.build_trees on the current device; the outputs come back in two copies."""
    from kernels import cuda as kc

    dev = torch.device("cuda", torch.cuda.current_device())
    lpt = lp.detach().to(dev, torch.float32).contiguous()
    idt = ids.detach().to(dev, torch.int64).contiguous()
    t = kc.build_trees(lpt, idt, budget)
    ints = torch.cat([t.token_ids.view(-1), t.depths.view(-1), t.parents.view(-1),
                      t.first_child.view(-1), t.next_sibling.view(-1), t.num_nodes])  # fmt: skip
    return _Packed(int(lpt.shape[0]), budget, ints.cpu().numpy(), t.visibility.cpu().numpy())


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
    arrays = getattr(child_maps, "arrays", None)
    if (
        backend == "cpp"
        and arrays is not None
        and isinstance(posterior, torch.Tensor)
        and posterior.dtype == torch.int64
        and posterior.device.type == "cpu"
        and posterior.dim() == 1
        and posterior.is_contiguous()
        and posterior.shape[0] >= len(child_maps)
        and len(child_maps) == arrays[5] + 1
    ):
        packed, tok, fc, ns, depth, _ = arrays
        out = np.empty(depth + 3, dtype=np.int64)  # accepted [depth+1], length, next token
        base = out.ctypes.data
        rc = cpu._lib().ddtree_cpu_greedy_accept(
            tok, fc, ns, posterior.data_ptr(), 1, packed.budget, depth, base,
            base + 8 * (depth + 1), base + 8 * (depth + 2),
        )  # fmt: skip
        if rc == 0:
            return out[: out[depth + 1]].tolist(), int(out[depth + 2])
    return _walk(child_maps, posterior.tolist() if hasattr(posterior, "tolist") else posterior)


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
