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
- `reference_stage_to_device(lp, ids, budget, device)`: the reference backend as the engine
  binds it when the accept runs on a GPU: `reference_stage`, then the trees' upload for that
  accept (`to_device`: one host-to-device copy, kept as `device_copy`). The upload is the
  handoff the tree stage owes its consumer, so it is timed in the tree-build stage whichever
  backend builds the trees, and the accept stage costs the same after either: a rollout of
  the tree build changes the tree-build stage's time and nothing else's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kernels import reference
from kernels.reference import BatchedTrees

__all__ = ["build_trees_stage", "reference_stage", "reference_stage_to_device", "to_device"]

reference_stage = reference.build_trees  # the same function object, not a wrapper


def _on(x: Any, device: torch.device | str) -> torch.Tensor:
    return torch.as_tensor(x).to(device).contiguous()


def build_trees_stage(lp: Any, ids: Any, budget: int, device: torch.device | str) -> BatchedTrees:
    """The CUDA tree-build stage: upload, build on `device`, one copy back to numpy trees."""
    from kernels import cuda  # lazily: the kernel library loads on first use

    lp, ids = _on(lp, device).float(), _on(ids, device).long()
    flat, t, layout = _flat_trees(lp.shape[0], budget, lp.device)
    cuda.build_trees(lp, ids, budget, out=t)
    host = flat.cpu().numpy()  # every field in ONE device-to-host copy
    fields = {f: host[a:b].view(dt).reshape(sh) for f, a, b, dt, sh in layout}
    trees = BatchedTrees(**fields)
    object.__setattr__(trees, "device_copy", t)  # the CUDA accept reuses it (no re-upload)
    return trees


_INT64_FIELDS = ("token_ids", "depths", "parents", "first_child", "next_sibling", "num_nodes")


def _flat_trees(batch: int, budget: int, device: torch.device) -> tuple[torch.Tensor, Any, list]:
    """CudaTrees whose fields are views of one byte buffer (the int64 fields, then the bool
    visibility: every offset a multiple of 8), so the whole tree set comes back in one copy;
    and the layout (field, start, end, numpy dtype, shape) to read the host copy with."""
    from kernels import cuda

    n1 = budget + 1
    shapes = {"token_ids": (batch, budget), "depths": (batch, budget), "parents": (batch, n1),
              "first_child": (batch, n1), "next_sibling": (batch, n1), "num_nodes": (batch,),
              "visibility": (batch, n1, n1)}  # fmt: skip
    layout, off = [], 0
    for f, sh in shapes.items():
        size = int(np.prod(sh)) * (8 if f in _INT64_FIELDS else 1)
        layout.append((f, off, off + size, np.int64 if f in _INT64_FIELDS else np.bool_, sh))
        off += size
    flat = torch.empty(off, dtype=torch.uint8, device=device)
    views = {
        f: flat[a:b].view(torch.int64 if dt is np.int64 else torch.bool).view(sh)
        for f, a, b, dt, sh in layout
    }
    return flat, cuda.CudaTrees(**views), layout


_FIELDS = ("token_ids", "depths", "parents", "visibility", "first_child", "next_sibling",
           "num_nodes")  # fmt: skip


def to_device(trees: BatchedTrees, device: torch.device | str) -> BatchedTrees:
    """`trees` with a `device_copy` (kernels.cuda.CudaTrees on `device`) made by ONE
    host-to-device copy of every field; trees that have one already are returned as they are."""
    if getattr(trees, "device_copy", None) is not None:
        return trees
    from kernels import cuda

    parts = [np.asarray(getattr(trees, f)) for f in _FIELDS]
    flat = torch.from_numpy(np.concatenate([p.reshape(-1).astype(np.int64) for p in parts]))
    flat = flat.to(device)
    fields, off = [], 0
    for p in parts:
        t = flat[off : off + p.size].view(p.shape)
        fields.append(t.bool() if p.dtype == np.bool_ else t)
        off += p.size
    object.__setattr__(trees, "device_copy", cuda.CudaTrees(*fields))
    return trees


def reference_stage_to_device(
    lp: Any, ids: Any, budget: int, device: torch.device | str
) -> BatchedTrees:
    """The reference stage handing its trees to an accept on `device` (`to_device`)."""
    return to_device(reference_stage(lp, ids, budget), device)
