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
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kernels import reference
from kernels.reference import BatchedTrees

__all__ = ["build_trees_stage", "reference_stage"]

reference_stage = reference.build_trees  # the same function object, not a wrapper

_NP_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_}


def _on(x: Any, device: torch.device | str) -> torch.Tensor:
    return torch.as_tensor(x).to(device).contiguous()


def build_trees_stage(lp: Any, ids: Any, budget: int, device: torch.device | str) -> BatchedTrees:
    """The CUDA tree-build stage: upload, build on `device`, one copy back to numpy trees."""
    from kernels import cuda  # lazily: the kernel library loads on first use

    t = cuda.build_trees(_on(lp, device).float(), _on(ids, device).long(), budget)
    # one device-to-host copy for every field (visibility travels as int64)
    parts = [getattr(t, f) for f in t._fields]
    flat = torch.cat([p.reshape(-1).long() for p in parts]).cpu().numpy()
    fields, off = {}, 0
    for f, p in zip(t._fields, parts, strict=True):
        n = p.numel()
        fields[f] = flat[off : off + n].reshape(p.shape).astype(_NP_DTYPES[p.dtype])
        off += n
    host = BatchedTrees(**fields)
    object.__setattr__(host, "device_copy", t)  # the CUDA accept reuses it (no re-upload)
    return host
