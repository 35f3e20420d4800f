"""Paged KV cache for MLA: one latent+rope row per token per layer, pages of `page_size` slots.

The pool is `[layers, (num_pages + 1) * page_size, kv_dim]`; a sequence owns a list of pages
(its block table) and sequence position p lives in slot `pages[p // page_size] * page_size +
p % page_size`. The extra last page is never handed out: its first slot, `trash_slot`, takes the
KV writes of a forward's padding rows. Tree rows of a DDTree step are written at positions
L .. L + N (L = committed length) and the accepted ones are compacted to L, L + 1, ... after
(`PagedKVCache.move`, the whole batch at once).
"""

from __future__ import annotations

import numpy as np
import torch


class CacheFull(RuntimeError):
    """No free page is left for a sequence that needs one."""


class PagedKVCache:
    def __init__(
        self, layers: int, num_pages: int, page_size: int, kv_dim: int, device: str | torch.device
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.pool = torch.zeros(layers, (num_pages + 1) * page_size, kv_dim, device=device)
        self.trash_slot = num_pages * page_size
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def new_sequence(self) -> SeqBlocks:
        return SeqBlocks(self)

    def _alloc(self) -> int:
        if not self._free:
            raise CacheFull("KV cache: no free page")
        return self._free.pop()

    def move(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy slots src[i] -> dst[i] in every layer (one gather into a new tensor, then one
        scatter, so a slot that is both a source and a destination moves its old row)."""
        if len(src):
            idx = torch.from_numpy(np.concatenate([src, dst])).to(self.pool.device)
            n = len(src)
            # index_select / index_copy_: the plain kernels, with less host work per call than
            # advanced indexing (a batch-1 decode step is host-bound)
            self.pool.index_copy_(1, idx[n:], self.pool.index_select(1, idx[:n]))

    def _release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


class SeqBlocks:
    """One sequence's block table in a PagedKVCache."""

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.pages: list[int] = []

    def reserve(self, num_positions: int) -> None:
        """Make positions 0 .. num_positions - 1 addressable (allocating pages as needed)."""
        need = -(-num_positions // self.cache.page_size)
        while len(self.pages) < need:
            self.pages.append(self.cache._alloc())

    def slot_array(self, count: int) -> np.ndarray:
        """Pool slot of positions 0 .. count - 1 (int64 numpy)."""
        ps = self.cache.page_size
        pos = np.arange(count, dtype=np.int64)
        return np.asarray(self.pages, dtype=np.int64)[pos // ps] * ps + pos % ps

    def free(self) -> None:
        self.cache._release(self.pages)
        self.pages = []
