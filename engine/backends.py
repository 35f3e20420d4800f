"""Backend registry: one place that binds each DDTree component to an implementation.

Components and kinds (`--backend COMPONENT=KIND`, or $DDTREE_ENGINE_BACKENDS; engine.components):
  topk        reference (kernels.reference, numpy) | cuda (kernels.cuda)
  tree_build  reference (Python/heapq) | cpp (kernels.cpu, compiled g++) | cuda (kernels.cuda)
  accept      reference | cpp | cuda
  attention   torch (per-row gather, engine.model) | cuda (kernels.cuda_attention, fp32 SIMT)

Every tree is handed between components as a `kernels.reference.BatchedTrees` (numpy), so any
one component can be swapped alone; a CUDA backend uploads / downloads at its boundary and
that copy is counted in its stage's time. Kernel modules are imported lazily, only when a
backend that needs them is selected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# the names and their parsing live in engine.components (no torch: the CLI checks them fast)
from engine.components import (  # noqa: F401  (re-exported)
    COMPONENTS,
    DEFAULTS,
    ENV_VAR,
    parse_backends,
    resolve_backends,
)
from engine.model import Attention, torch_attention


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _cuda(x: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(x).to(device).contiguous()


@dataclass
class Backends:
    names: dict[str, str]
    topk: Callable[[torch.Tensor, int], tuple[Any, Any]]
    tree_build: Callable[[Any, Any, int], Any]
    accept: Callable[[Any, np.ndarray, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
    attention: Attention


def make_backends(names: dict[str, str], device: torch.device) -> Backends:
    from kernels import reference

    topk: Callable = lambda logits, k: reference.topk_logprobs(_np(logits), k)  # noqa: E731
    build: Callable = reference.build_trees
    accept: Callable = lambda trees, tgt, h: reference.greedy_accept_batch(trees, tgt, h)  # noqa: E731
    attention: Attention = torch_attention
    if names["topk"] == "cuda":
        from kernels import cuda

        topk = lambda logits, k: cuda.topk_logprobs(_cuda(logits, device), k)  # noqa: E731
    if names["tree_build"] == "cpp":
        from kernels import cpu

        build = lambda lp, ids, budget: cpu.build_trees_cpp(_np(lp), _np(ids), budget)  # noqa: E731
    elif names["tree_build"] == "cuda":
        build = lambda lp, ids, budget: _cuda_build(lp, ids, budget, device)  # noqa: E731
    if names["accept"] == "cpp":
        from kernels import cpu

        accept = cpu.greedy_accept_cpp
    elif names["accept"] == "cuda":
        accept = lambda trees, tgt, h: _cuda_accept(trees, tgt, h, device)  # noqa: E731
    if names["attention"] == "cuda":
        attention = cuda_attention
    return Backends(dict(names), topk, build, accept, attention)


def _cuda_build(lp: Any, ids: Any, budget: int, device: torch.device) -> Any:
    from kernels import cuda
    from kernels.reference import BatchedTrees

    t = cuda.build_trees(_cuda(lp, device).float(), _cuda(ids, device).long(), budget)
    return BatchedTrees(**{f: _np(getattr(t, f)) for f in t._fields})


def _cuda_accept(trees: Any, target: np.ndarray, h: int, device: torch.device) -> tuple:
    from kernels import cuda

    ct = cuda.CudaTrees(*(_cuda(getattr(trees, f), device) for f in cuda.CudaTrees._fields))
    acc, alen, bonus = cuda.greedy_accept(ct, _cuda(target, device).long(), h)
    return _np(acc), _np(alen), _np(bonus)


def rowwise_requests(
    pool: torch.Tensor, table: torch.Tensor, lens: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The Kernels II ragged layout with every row as its own request.

    Row i becomes request i with a root-only tree (T = 1) whose "prefix" is its visible keys
    in position order but the last (itself): a page_size-1 view of the pool
    `[slots, 1, kv_dim]` and block table `table[i, :lens[i]]`. Returns (kv_cache view,
    block_table int32, prefix_lens int32, tree_lens int32, visibility [R, 1, 1], max_kv_len).
    """
    dev = pool.device
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    kv = pool.view(pool.shape[0], 1, pool.shape[1])
    vis = torch.ones(len(lens), 1, 1, dtype=torch.bool, device=dev)
    block_table = table.to(device=dev, dtype=torch.int32).contiguous()
    return kv, block_table, lens_t - 1, torch.ones_like(lens_t), vis, max(lens)


def cuda_attention(
    q: torch.Tensor,
    pool: torch.Tensor,
    table: torch.Tensor,
    lens: list[int],
    scale: float,
    latent_dim: int,
) -> torch.Tensor:
    """Kernels II fp32 tree-verify attention, batch-invariant by construction.

    Each row is its own request (`rowwise_requests`), run with one split (no flash-decoding
    merge) on the SIMT fp32 path: a row's arithmetic depends only on its own visible keys in
    position order, so an AR row and the same row on a verify's accepted path are
    bit-identical, whatever the tree layout or the batch. AR decode runs through this same
    kernel call (a root-only tree).
    """
    from kernels.cuda_attention import tree_verify_attention

    kv, bt, pl, tl, vis, max_kv = rowwise_requests(pool, table, lens)
    out = tree_verify_attention(
        q.contiguous(),
        kv,
        bt,
        pl,
        tl,
        vis,
        scale,
        max_kv_len=max_kv,
        num_splits=1,
        algo="simt",
        check=False,
    )
    return out[..., :latent_dim]
