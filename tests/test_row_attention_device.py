"""The verify's slot table built on the device (`visible_rows_device`) is exactly the host's
(`visible_rows`), for random trees, ragged prefixes and padded requests; and a torch attention
plan over the device table computes what the plan over the host table does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.row_attention import (
    paged_slots,
    random_parents,
    torch_rows,
    torch_rows_plan,
    visible_rows,
    visible_rows_device,
)


def _case(seed: int, b_n: int, t: int, page: int = 16):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 90, size=b_n)
    width = int(prefix.max()) + t
    pages_per = -(-width // page) + 1
    perm = rng.permutation(b_n * pages_per + 3)[: b_n * pages_per]
    pages = perm.reshape(b_n, pages_per).astype(np.int64)
    slots = paged_slots(pages, width, page)
    vis = np.zeros((b_n, t, t), dtype=bool)
    nodes = rng.integers(0, t, size=b_n)  # real nodes per request; the rest are padding
    for b in range(b_n):
        par = random_parents(rng, t)
        for i in range(t):
            n = i
            while n >= 0:
                vis[b, i, n] = True
                n = int(par[n])
    keep = np.flatnonzero((np.arange(t)[None, :] <= nodes[:, None]).reshape(-1))
    return slots, prefix, vis, keep


@pytest.mark.parametrize("seed,b_n,t", [(0, 1, 1), (1, 3, 17), (2, 32, 17), (3, 7, 5), (4, 64, 9)])
def test_device_table_is_the_host_table(seed: int, b_n: int, t: int) -> None:
    slots, prefix, vis, keep = _case(seed, b_n, t)
    table, lens = visible_rows(slots, prefix, vis)
    got, got_lens = visible_rows_device(slots, prefix, vis, keep, "cpu")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), table.reshape(b_n * t, -1)[keep])
    np.testing.assert_array_equal(got_lens, lens.reshape(-1)[keep])


def test_torch_plan_over_the_device_table_computes_the_same() -> None:
    slots, prefix, vis, keep = _case(5, 9, 17)
    host, lens = visible_rows(slots, prefix, vis)
    host = host.reshape(-1, host.shape[-1])[keep]
    lens = lens.reshape(-1)[keep]
    dev, _ = visible_rows_device(slots, prefix, vis, keep, "cpu")
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(int(slots.max()) + 1, 40, generator=gen)
    q = torch.randn(len(keep), 2, 40, generator=gen)
    want = torch_rows(q, pool, torch_rows_plan(host, lens, torch.device("cpu")), 0.2, 32)
    got = torch_rows(q, pool, torch_rows_plan(dev, lens, torch.device("cpu")), 0.2, 32)
    assert torch.equal(got, want)
