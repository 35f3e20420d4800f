"""Row attention of a batched forward: every row over its own list of KV slots, in one plan.

The engine-independent half of the reference engine's two attention backends
(`engine.attention` wraps these; this module never imports `engine`), and what the kernel bench's
`row_attention` rows time (`kernels.bench.attn`). A forward's rows each see an explicit list
of KV slots in position order (`table[i, :lens[i]]`: the prefix, then the row's tree ancestors,
then itself). A *plan* is built once per forward (index tensors on the device); each call then
runs one layer's attention of every row: q [R, heads, kv_dim], pool [slots, kv_dim] -> out
[R, heads, latent_dim].

Batch invariance (a row's result bit-identical in any batch) needs a row's arithmetic to depend
only on its own visible keys, never on which other rows share the call:
- `torch_rows` (plan `torch_rows_plan`): rows are grouped by their own padded length
  `Lb = ceil(len / bucket) * bucket` (a function of the row alone) and run in calls of a fixed
  number of rows (`rows_per_call`, padded), so every bmm / softmax has one of a few fixed shapes;
  keys past a row's length are masked to -inf and contribute exact zeros.
- `cuda_rows` (plan `rowwise_plan`): the CUDA tree-verify kernel with every row as its own
  request (a page-size-1 view of the pool) and the fp32 SIMT path, its keys cut into KV splits
  of a fixed `SPLIT_KEYS` (`split_plan`): the kernel walks a split's keys in order and combines
  the splits in a fixed order, so the row's result is the same whatever the batch.

`visible_rows` lays out the rows of one decode step (B requests of T = budget + 1 rows over a
paged prefix of L keys): the engine's verify calls it, and `step_rows` builds the bench's steps
through it; `prefill_blocks` cuts a prompt's prefill into forwards as the engine's prefill
runs it (and the bench's `row_attention_prefill` rows time it); `reference_rows` is the float64
yardstick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "RowGroup",
    "RowwisePlan",
    "cuda_rows",
    "random_parents",
    "reference_rows",
    "split_plan",
    "rowwise_plan",
    "paged_slots",
    "step_rows",
    "visible_rows",
    "visible_rows_device",
    "torch_rows",
    "torch_rows_plan",
]


@dataclass
class RowGroup:
    rows: torch.Tensor  # [rows_per_call] int64, padded with the group's first row
    count: int  # real rows in `rows`
    table: torch.Tensor  # [rows_per_call, Lb] int64 slots
    mask: torch.Tensor  # [rows_per_call, 1, Lb] bool, True past the row's length


def torch_rows_plan(
    table: np.ndarray,
    lens: np.ndarray,
    device: torch.device,
    bucket: int = 64,
    rows_per_call: int = 16,
) -> list[RowGroup]:
    """The groups of fixed shape (length bucket, rows_per_call) of the rows [R, W] / [R]."""
    lens = np.asarray(lens, dtype=np.int64)
    padded_len = -(-lens // bucket) * bucket
    width = int(padded_len.max())
    on_device = isinstance(table, torch.Tensor)
    if table.shape[1] < width:  # pad with slot 0 (finite; masked out)
        pad = width - table.shape[1]
        table = F.pad(table, (0, pad)) if on_device else np.pad(table, ((0, 0), (0, pad)))
    c = rows_per_call
    metas, rows_l, tabs = [], [], []
    for lb in np.unique(padded_len):
        members = np.flatnonzero(padded_len == lb)
        for start in range(0, len(members), c):
            part = members[start : start + c]
            rows = np.concatenate([part, np.full(c - len(part), part[0])])
            metas.append((int(lb), len(part)))
            rows_l.append(rows)
            if not on_device:
                tabs.append(table[rows, :lb].reshape(-1))
    all_rows = np.concatenate(rows_l)
    if on_device:  # a table built on the device (the engine's verify): gather it there
        flat = torch.from_numpy(np.concatenate([all_rows, lens[all_rows]])).to(device)
        n_rows = len(all_rows)
        rows_d, lens_d = flat[:n_rows], flat[n_rows:]
        groups = []
        for g, (lb, count) in enumerate(metas):
            rows_g = rows_d[g * c : (g + 1) * c]
            own = lens_d[g * c : (g + 1) * c, None, None]
            mask = torch.arange(lb, device=device)[None, None, :] >= own
            groups.append(RowGroup(rows_g, count, table.index_select(0, rows_g)[:, :lb], mask))
        return groups
    # one upload for every group: row ids, then the slot tables, then the lengths
    flat = torch.from_numpy(np.concatenate([all_rows, *tabs, lens[all_rows]])).to(device)
    n_rows = len(all_rows)
    rows_d, rest = flat[:n_rows], flat[n_rows:]
    lens_d = rest[-n_rows:]
    groups, off = [], 0
    for g, (lb, count) in enumerate(metas):
        tab = rest[off : off + c * lb].view(c, lb)
        off += c * lb
        own = lens_d[g * c : (g + 1) * c, None, None]
        mask = torch.arange(lb, device=device)[None, None, :] >= own
        groups.append(RowGroup(rows_d[g * c : (g + 1) * c], count, tab, mask))
    return groups


def torch_rows(
    q: torch.Tensor, pool: torch.Tensor, plan: list[RowGroup], scale: float, latent_dim: int
) -> torch.Tensor:
    """One layer's attention of every row, one fixed-shape bmm/softmax/bmm per group."""
    out = torch.empty(q.shape[0], q.shape[1], latent_dim, device=q.device, dtype=q.dtype)
    for g in plan:
        keys = pool[g.table]  # [C, Lb, kv_dim]
        s = torch.bmm(q.index_select(0, g.rows), keys.transpose(1, 2)) * scale
        p = torch.softmax(s.masked_fill(g.mask, float("-inf")), dim=-1)  # [C, heads, Lb]
        o = torch.bmm(p, keys[..., :latent_dim].contiguous())
        out.index_copy_(0, g.rows[: g.count], o[: g.count])
    return out


@dataclass
class RowwisePlan:
    block_table: torch.Tensor  # [R, W] int32
    prefix_lens: torch.Tensor  # [R] int32: the row's own length - 1
    tree_lens: torch.Tensor  # [R] int32: ones
    visibility: torch.Tensor  # [R, 1, 1] bool
    max_kv_len: int
    # the launch planned on the first call (kernels.cuda_attention.TreeVerifyLaunch) and
    # reused by the forward's every later layer: same rows, same q / pool shapes
    launch: Any = None


def rowwise_plan(table: np.ndarray, lens: np.ndarray, device: torch.device) -> RowwisePlan:
    """The CUDA kernel's ragged layout with every row as its own request.

    Row i becomes request i with a root-only tree (T = 1) whose "prefix" is its visible keys in
    position order but the last (itself), over a page_size-1 view `[slots, 1, kv_dim]` of the
    pool with block table `table[i, :lens[i]]`.
    """
    lens_t = torch.as_tensor(np.asarray(lens), dtype=torch.int32).to(device)
    if not isinstance(table, torch.Tensor):
        table = torch.from_numpy(np.ascontiguousarray(table))
    bt = table.to(device=device, dtype=torch.int32).contiguous()
    vis = torch.ones(len(lens), 1, 1, dtype=torch.bool, device=device)
    return RowwisePlan(bt, lens_t - 1, torch.ones_like(lens_t), vis, int(np.max(lens)))


# Keys a KV split of `cuda_rows` covers. The kernel cuts each row's keys at multiples of
# `ceil(max_tiles / num_splits)` tiles of 16 keys (the SIMT tile), max_tiles planned from
# `max_kv_len`; `split_plan` passes a `max_kv_len` that makes that exactly SPLIT_KEYS, so a row's
# splits (and the fixed-order combine over them) depend only on its own length, never on the
# batch: splits past a row's end are empty and the combine skips them.
SPLIT_KEYS = 64
_SIMT_TILE = 16


def split_plan(max_len: int, split_keys: int = SPLIT_KEYS) -> tuple[int, int]:
    """(num_splits, max_kv_len) for rows of at most `max_len` keys: splits of `split_keys`."""
    if split_keys % _SIMT_TILE:
        raise ValueError(f"split_keys must be a multiple of {_SIMT_TILE}, got {split_keys}")
    splits = max(1, -(-int(max_len) // split_keys))
    return splits, splits * split_keys


def cuda_rows(
    q: torch.Tensor, pool: torch.Tensor, plan: RowwisePlan, scale: float, latent_dim: int
) -> torch.Tensor:
    """The CUDA tree-verify kernel (fp32 SIMT), one launch for all rows, each row's keys in
    splits of SPLIT_KEYS (flash-decoding: parallel over a long row, and batch-invariant)."""
    from kernels.cuda_attention import prepare_tree_verify

    kv = pool.view(pool.shape[0], 1, pool.shape[1])
    q = q.contiguous()
    run = plan.launch
    if run is None or (run.q_shape, run.kv_shape, run.scale) != (q.shape, kv.shape, scale):
        splits, max_kv_len = split_plan(plan.max_kv_len)
        run = plan.launch = prepare_tree_verify(
            q,
            kv,
            plan.block_table,
            plan.prefix_lens,
            plan.tree_lens,
            plan.visibility,
            scale,
            max_kv_len=max_kv_len,
            num_splits=splits,
            algo="simt",
            check=False,
        )
    return run.run(q, kv)[..., :latent_dim]


def reference_rows(
    q: torch.Tensor,
    pool: torch.Tensor,
    table: np.ndarray,
    lens: np.ndarray,
    scale: float,
    latent_dim: int,
) -> torch.Tensor:
    """Row by row over exactly the visible keys, in float64: the tests' yardstick."""
    outs = []
    for i, n in enumerate(lens):
        keys = pool.index_select(0, torch.as_tensor(table[i, :n], device=pool.device)).double()
        p = torch.softmax(torch.mm(q[i].double(), keys.t()) * scale, dim=-1)
        outs.append(torch.mm(p, keys[:, :latent_dim]))
    return torch.stack(outs)


def random_parents(rng: np.random.Generator, t: int) -> np.ndarray:
    """A random tree of t nodes: node 0 the root (parent -1), node i's parent a node before it."""
    return np.array([-1] + [int(rng.integers(0, i)) for i in range(1, t)], dtype=np.int64)


def prefill_blocks(
    slots: np.ndarray, n: int, block: int, device: torch.device | str | None = None
) -> list[tuple[int, int, np.ndarray | torch.Tensor, np.ndarray]]:
    """A prompt's prefill as the engine runs it (engine.decode's `prefill`) and the bench times
    it: rows 0 .. n - 1 in forwards of at most `block` rows; each (a, b, table, lens) holds rows
    a .. b - 1, every row's table the slots 0 .. b - 1 and its length p + 1 (row p sees
    positions 0 .. p). With `device` the tables are built there: one upload of the n slots, each
    block's table a broadcast view of them ([b - a, b], nothing copied), where a host table is
    b - a copies of them that a plan then uploads (megabytes a prompt: 576 x 576 + 447 x 1023
    slots for 1024 tokens), as a decode step's table is built on the device
    (`visible_rows_device`); lens stay on the host either way."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    on_dev = None
    if device is not None and n > 0:
        on_dev = torch.from_numpy(np.ascontiguousarray(slots[:n], dtype=np.int64)).to(device)
    out = []
    for a in range(0, n, block):
        b = min(n, a + block)
        table = np.tile(slots[:b], (b - a, 1)) if on_dev is None else on_dev[:b].expand(b - a, b)
        out.append((a, b, table, np.arange(a + 1, b + 1, dtype=np.int64)))
    return out


def paged_slots(pages: np.ndarray, width: int, page_size: int) -> np.ndarray:
    """[B, width]: the pool slot of positions 0 .. width - 1 of each request's block table
    `pages[b]`; positions past a table map into its last page (slots nothing reads)."""
    pos = np.arange(width)
    return pages[:, np.minimum(pos // page_size, pages.shape[1] - 1)] * page_size + pos % page_size


def visible_rows(
    slots: np.ndarray, prefix_lens: np.ndarray, vis: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Slot table [B, T, W] and lengths [B, T] of a verify step's rows, the engine's layout.

    Request b's positions 0 .. L_b - 1 hold its prefix and L_b + i its tree node i, at pool
    slots `slots[b]` [W >= max L_b + T]; row i sees the prefix, then the nodes `vis[b, i]`
    marks (its ancestors and itself: each before its descendants) in position order. Entries
    past a row's length are valid slots that nothing reads."""
    b_n, t, _ = vis.shape
    width = slots.shape[1]
    order = np.argsort(~vis, axis=2, kind="stable")  # the visible nodes first, in index order
    lp = np.asarray(prefix_lens, dtype=np.int64)[:, None, None]
    j = np.arange(width)[None, None, :]
    k = np.clip(j - lp, 0, t - 1)
    bi, ti = np.arange(b_n)[:, None, None], np.arange(t)[None, :, None]
    table = slots[bi, np.where(j < lp, j, lp + order[bi, ti, k])]
    return table, lp[:, :, 0] + vis.sum(axis=2)


def visible_rows_device(
    slots: np.ndarray,
    prefix_lens: np.ndarray,
    vis: np.ndarray,
    keep: np.ndarray,
    device: torch.device | str,
) -> tuple[torch.Tensor, np.ndarray]:
    """`visible_rows`' table [B * T, W] restricted to the rows `keep` (flat indices into B * T),
    built on `device`: one upload of the slots [B, W], each kept row's request and prefix length
    and its visible nodes in index order ([T] each), then gathers there, instead of building
    and uploading R x W entries on the host (544 x 1100 at batch 32 with 1024-token prompts).
    Returns the table [R, W] (int64, on `device`) and the lengths [R] (host): exactly
    `visible_rows`' (tests/test_row_attention_device.py)."""
    b_n, t, _ = vis.shape
    width = slots.shape[1]
    prefix_lens = np.asarray(prefix_lens, dtype=np.int64)
    order = np.argsort(~vis, axis=2, kind="stable").reshape(b_n * t, t)[keep]  # [R, T]
    lens = (prefix_lens[:, None] + vis.sum(axis=2)).reshape(-1)[keep]
    rb = np.asarray(keep, dtype=np.int64) // t
    n = len(rb)
    flat = np.concatenate([slots.reshape(-1), rb, prefix_lens[rb], order.reshape(-1)])
    d = torch.from_numpy(flat.astype(np.int64, copy=False)).to(device)
    slots_d, rest = d[: b_n * width], d[b_n * width :]
    rb_d, lp_d, order_d = rest[:n, None], rest[n : 2 * n, None], rest[2 * n :].view(n, t)
    j = torch.arange(width, device=d.device)[None, :]
    k = (j - lp_d).clamp_(0, t - 1)
    pos = torch.where(j < lp_d, j, lp_d + order_d.gather(1, k))
    return slots_d[rb_d * width + pos], lens


def step_rows(
    prefix_lens: list[int], parents: list[np.ndarray], pages: np.ndarray, page_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The rows (table [B*T, W], lens [B*T]) of one decode step, built by `visible_rows` as the
    engine's verify builds them, for trees given by their parents (-1 for the root), in the
    pages `pages[b]` of a paged pool."""
    t = len(parents[0])
    width = max(prefix_lens) + t
    slots = paged_slots(pages, width, page_size)
    vis = np.zeros((len(parents), t, t), dtype=bool)
    for b, par in enumerate(parents):
        for i in range(t):
            node = i
            while node >= 0:  # node i and its ancestors
                vis[b, i, node] = True
                node = int(par[node])
    table, lens = visible_rows(slots, np.asarray(prefix_lens), vis)
    return table.reshape(-1, width), lens.reshape(-1)
