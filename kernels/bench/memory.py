"""The bench's GPU memory cap: `DDTREE_BENCH_MAX_MEM_GIB`, set by `ops bench --allow-shared`."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["apply_memory_cap"]


def apply_memory_cap() -> dict[str, Any] | None:
    """Honour `DDTREE_BENCH_MAX_MEM_GIB` (set by `ops bench --allow-shared` on a GPU the service
    uses): cap this process's CUDA allocations to that many GiB of the visible GPU."""
    text = os.environ.get("DDTREE_BENCH_MAX_MEM_GIB")
    if not text:
        return None
    import torch

    gib = float(text)
    if not torch.cuda.is_available():
        return {"gib": gib, "fraction": None, "applied": False, "reason": "no CUDA device"}
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return {"gib": gib, "fraction": round(fraction, 6), "applied": True}
