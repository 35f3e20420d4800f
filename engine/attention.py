"""Tree-verify attention backends for the batched forward: every row of a step in one plan.

A forward's rows each see an explicit list of KV slots in position order (`table[i, :lens[i]]`:
the prefix, then the row's tree ancestors, then itself). A backend turns that into a *plan*
once per forward (index tensors on the device) and then runs one layer's attention per call.
The plans and calls live in `kernels.row_attention` (which the kernel bench's `row_attention`
rows time as they run here); this module names them as the engine's backends.

Batch invariance (DDTree output == AR output, bit for bit) needs a row's arithmetic to depend
only on its own visible keys, never on which other rows share the call:
- `torch`: rows are grouped by their own padded length `Lb = ceil(len / bucket) * bucket` (a
  function of the row alone) and run in calls of a fixed number of rows (`rows_per_call`,
  padded), so every bmm / softmax has one of a few fixed shapes; keys past a row's length are
  masked to -inf and contribute exact zeros.
- `cuda`: the CUDA tree-verify kernel with every row as its own request (a page-size-1 view of
  the pool) and the fp32 SIMT path, a row's keys cut into KV splits of a fixed length
  (`kernels.row_attention.SPLIT_KEYS`) and combined in a fixed order, so the row's result is
  the same whatever the batch.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from kernels.row_attention import RowGroup as _Group
from kernels.row_attention import RowwisePlan as _RowwisePlan
from kernels.row_attention import cuda_rows, rowwise_plan, torch_rows, torch_rows_plan
from kernels.row_attention import reference_rows as reference_attention

__all__ = ["Attention", "CudaAttention", "TorchAttention", "reference_attention", "rowwise_plan"]


class Attention(Protocol):
    name: str

    def plan(self, table: np.ndarray, lens: np.ndarray, device: torch.device) -> Any:
        """Per-forward state from the rows' slot table [R, W] (a host array, or a tensor on the
        device: engine.decode builds a step's and a prefill block's there on a GPU) and their
        lengths [R] (a host array)."""
        ...

    def __call__(
        self, q: torch.Tensor, pool: torch.Tensor, plan: Any, scale: float, latent_dim: int
    ) -> torch.Tensor:
        """q [R, heads, kv_dim], pool [slots, kv_dim] (one layer) -> out [R, heads, latent]."""
        ...


class TorchAttention:
    """Batched torch attention with fixed shapes per (length bucket, rows_per_call)."""

    name = "torch"

    def __init__(self, bucket: int = 64, rows_per_call: int = 16) -> None:
        self.bucket, self.rows_per_call = bucket, rows_per_call

    def plan(self, table: np.ndarray, lens: np.ndarray, device: torch.device) -> list[_Group]:
        return torch_rows_plan(table, lens, device, self.bucket, self.rows_per_call)

    def __call__(
        self, q: torch.Tensor, pool: torch.Tensor, plan: list[_Group], scale: float, latent_dim: int
    ) -> torch.Tensor:
        return torch_rows(q, pool, plan, scale, latent_dim)


class CudaAttention:
    """The CUDA tree-verify kernel (fp32 SIMT, fixed-length KV splits), one launch per layer
    for all rows."""

    name = "cuda"

    def plan(self, table: np.ndarray, lens: np.ndarray, device: torch.device) -> _RowwisePlan:
        return rowwise_plan(table, lens, device)

    def __call__(
        self, q: torch.Tensor, pool: torch.Tensor, plan: _RowwisePlan, scale: float, latent_dim: int
    ) -> torch.Tensor:
        return cuda_rows(q, pool, plan, scale, latent_dim)
