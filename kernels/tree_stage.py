"""The engine's tree-build STAGE per backend: what `engine.backends` binds, what the bench times.

A stage is the whole call the reference engine makes between its `topk` and `tree_build` laps,
boundary copies included, so its time is what swapping the backend changes in a decode step
(`kernels.bench --suite tree`, kernel `tree_build_stage`; the kernel alone is `build_trees`).

- `reference_stage` IS `kernels.reference.build_trees` (the engine's reference backend binds
  that very function). It takes lp / ids as the topk backend returns them: numpy from the
  reference topk, CUDA tensors from the CUDA topk, which it converts itself (`.detach().cpu()`
  of each input, one device-to-host copy and sync each, then contiguous float32 / int64 numpy).
- `build_trees_stage(lp, ids, budget, device)`: the CUDA backend. Uploads lp / ids to `device`
  (a no-op for tensors already there), runs `kernels.cuda.build_trees`, and copies every tree
  field back in ONE device-to-host copy into a numpy `BatchedTrees`, which keeps the device
  trees as its `device_copy` attribute (the CUDA accept reuses them: no re-upload).
- `CudaTreeStage(device)`: that stage as the engine binds it and the bench times it, with its
  buffers kept per (batch, H, budget): the byte buffer and its views, and a
  `kernels.cuda.TreeWorkspace` over them (trees and the accept's outputs, checked once when
  made, not every step), kept as the trees' `workspace` beside their `device_copy`. A
  step's trees are good until the stage's next call at that shape overwrites them (the engine
  accepts them in the same step, in stream order).
- `reference_stage_to_device(lp, ids, budget, device)`: the reference backend as the engine
  binds it when the accept runs on a GPU: `reference_stage`, then the trees' upload for that
  accept (`to_device`: one host-to-device copy, kept as `device_copy`). The upload is the
  handoff the tree stage owes its consumer, so it is timed in the tree-build stage whichever
  backend builds the trees, and the accept stage costs the same after either: a rollout of
  the tree build changes the tree-build stage's time and nothing else's.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from kernels import reference
from kernels.cuda_core import on_device
from kernels.reference import BatchedTrees

__all__ = [
    "CudaTreeStage",
    "build_trees_stage",
    "reference_stage",
    "reference_stage_to_device",
    "to_device",
]

reference_stage = reference.build_trees  # the same function object, not a wrapper


def build_trees_stage(lp: Any, ids: Any, budget: int, device: torch.device | str) -> BatchedTrees:
    """The CUDA tree-build stage: upload, build on `device`, one copy back to numpy trees."""
    lp, ids = on_device(lp, device, torch.float32), on_device(ids, device, torch.int64)
    layout = _layout(lp.shape[0], budget)
    flat = torch.empty(layout[-1][2], dtype=torch.uint8, device=lp.device)
    t = _views(flat, layout)
    return _build_into(lp, ids, budget, flat, layout, t, t)


def _build_into(
    lp: torch.Tensor,
    ids: torch.Tensor,
    budget: int,
    flat: torch.Tensor,
    layout: tuple,
    trees: Any,
    out: Any,
) -> BatchedTrees:
    """Build into `out` (CudaTrees `trees` over the byte buffer `flat`, or a TreeWorkspace over
    them), copy every field back in ONE device-to-host copy, and hand back numpy trees that keep
    the device trees as their `device_copy` (the CUDA accept reuses them: no re-upload)."""
    from kernels import cuda  # lazily: the kernel library loads on first use

    cuda.build_trees(lp, ids, budget, out=out)
    host = flat.cpu().numpy()
    got = BatchedTrees(**{f: host[a:b].view(dt).reshape(sh) for f, a, b, dt, sh in layout})
    object.__setattr__(got, "device_copy", trees)
    return got


class CudaTreeStage:
    """`build_trees_stage` with its buffers kept per (batch, H, budget) (module doc)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._kept: dict[tuple[int, int, int], tuple[torch.Tensor, tuple, Any]] = {}

    def __call__(self, lp: Any, ids: Any, budget: int) -> BatchedTrees:
        from kernels import cuda  # lazily: the kernel library loads on first use

        dev = self.device
        lp, ids = on_device(lp, dev, torch.float32), on_device(ids, dev, torch.int64)
        if (
            lp.dim() != 3
            or lp.shape[1] > cuda.MAX_DEPTH
            or type(budget) is not int
            or not 0 <= budget <= cuda.MAX_BUDGET
        ):
            return build_trees_stage(lp, ids, budget, dev)  # its checks name what is wrong
        key = (lp.shape[0], lp.shape[1], budget)
        kept = self._kept.get(key)
        if kept is None:
            layout = _layout(key[0], budget)
            flat = torch.empty(layout[-1][2], dtype=torch.uint8, device=dev)
            ws = cuda.TreeWorkspace(_views(flat, layout), key[1])
            kept = self._kept[key] = (flat, layout, ws)
        flat, layout, ws = kept
        trees = _build_into(lp, ids, budget, flat, layout, ws.trees, ws)
        object.__setattr__(trees, "workspace", ws)  # the CUDA accept's outputs, checked once
        return trees


_INT64_FIELDS = ("token_ids", "depths", "parents", "first_child", "next_sibling", "num_nodes")


@functools.cache  # per (batch, budget): a step's host work is what a batch-1 step costs
def _layout(batch: int, budget: int) -> tuple[tuple[str, int, int, type, tuple[int, ...]], ...]:
    """One byte buffer for a tree set, both ways (the CUDA stage's copy back, `to_device`'s
    upload): per field (name, start, end, numpy dtype, shape), the int64 fields first, then the
    bool visibility, so every offset is a multiple of 8."""
    n1 = budget + 1
    shapes = {
        "token_ids": (batch, budget),
        "depths": (batch, budget),
        "parents": (batch, n1),
        "first_child": (batch, n1),
        "next_sibling": (batch, n1),
        "num_nodes": (batch,),
        "visibility": (batch, n1, n1),
    }
    layout, off = [], 0
    for f, sh in shapes.items():
        dt = np.int64 if f in _INT64_FIELDS else np.bool_
        size = int(np.prod(sh)) * np.dtype(dt).itemsize
        layout.append((f, off, off + size, dt, sh))
        off += size
    return tuple(layout)


def _views(flat: torch.Tensor, layout: tuple) -> Any:
    """kernels.cuda.CudaTrees whose fields are views of the byte buffer `flat` (`_layout`)."""
    from kernels import cuda

    return cuda.CudaTrees(
        **{
            f: flat[a:b].view(torch.int64 if dt is np.int64 else torch.bool).view(sh)
            for f, a, b, dt, sh in layout
        }
    )


def to_device(trees: BatchedTrees, device: torch.device | str) -> BatchedTrees:
    """`trees` with a `device_copy` (kernels.cuda.CudaTrees on `device`) made by ONE
    host-to-device copy of every field; trees that have one already are returned as they are."""
    if getattr(trees, "device_copy", None) is not None:
        return trees
    batch, budget = np.asarray(trees.token_ids).shape
    layout = _layout(batch, budget)
    host = np.empty(layout[-1][2], dtype=np.uint8)
    for f, a, b, dt, _ in layout:
        host[a:b].view(dt)[:] = np.asarray(getattr(trees, f), dtype=dt).reshape(-1)
    flat = torch.from_numpy(host).to(device)
    object.__setattr__(trees, "device_copy", _views(flat, layout))
    return trees


def reference_stage_to_device(
    lp: Any, ids: Any, budget: int, device: torch.device | str
) -> BatchedTrees:
    """The reference stage handing its trees to an accept on `device` (`to_device`)."""
    return to_device(reference_stage(lp, ids, budget), device)
