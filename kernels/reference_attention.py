"""Float64 CPU references for tree-verify MLA attention and KV compaction.

Ragged layout (shared with the CUDA kernels in `kernels/csrc/tree_verify_attention.cu`):

- B requests; request b has a prefix of L_b = `prefix_lens[b]` committed KV rows and a tree of
  T_b = `tree_lens[b]` = N_b + 1 rows (root + N_b nodes) whose own KV rows are already stored at
  sequence positions L_b .. L_b + N_b. Its KV length is L_b + T_b.
- `q` `[sum_b T_b, heads, 576]`: request b's tree rows start at `qo_offsets[b]` = sum_{b'<b}
  T_b' (tree row i of request b is `q[qo_offsets[b] + i]`); 576 = 512 latent + 64 rope dims.
- `kv_cache` `[num_pages, page_size, 576]`: sequence position p of request b lives in
  `kv_cache[block_table[b, p // page_size], p % page_size]`; `block_table` `[B, max_pages]`.
  MLA absorbed form: all heads share these rows (key = the whole row, value = its first 512).
- `visibility` `[B, T_max, T_max]` bool (padded; `BatchedTrees.visibility`) or a list of
  `[T_b, T_b]` arrays (`Tree.visibility`): tree row i sees every prefix row and tree row j
  exactly when `visibility[b, i, j]`.
- out `[sum_b T_b, heads, 512]` float64: softmax(scale * q . k) . v over the visible rows. A
  row that sees nothing (only possible with a visibility lacking its diagonal and L_b = 0)
  is all zeros.

`compact_kv` moves the accepted tree rows (tree indices, the root 0 first, strictly increasing
as along any root-to-node path) of request b to positions L_b, L_b + 1, ...
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["compact_kv", "kv_slots", "qo_offsets", "tree_verify_attention"]

QK_DIM = 576
V_DIM = 512


def _np(x: Any, name: str, dtype: Any = None) -> np.ndarray:
    """numpy view of an array or torch tensor (bf16/fp16 tensors upcast to float32 first)."""
    if type(x).__module__.startswith("torch"):
        t = x.detach().cpu()
        if t.is_floating_point() and t.dtype.itemsize < 4:
            t = t.float()
        x = t.numpy()
    a = np.asarray(x)
    if dtype is None:
        return a
    kind = {bool: np.bool_, np.int64: np.integer, np.float64: np.floating}[dtype]
    if not np.issubdtype(a.dtype, kind):
        raise ValueError(f"{name}: expected a {kind.__name__} dtype, got {a.dtype}")
    return a.astype(dtype)


def qo_offsets(tree_lens: Any) -> np.ndarray:
    """Row offsets `[B + 1]` of each request's tree rows in the ragged q / out arrays."""
    t = _np(tree_lens, "tree_lens", np.int64)
    return np.concatenate([[0], np.cumsum(t)]).astype(np.int64)


def kv_slots(block_table: np.ndarray, b: int, positions: np.ndarray, page_size: int) -> tuple:
    """(page, slot) index arrays of sequence `positions` of request b in the paged cache."""
    positions = np.asarray(positions, dtype=np.int64)
    return block_table[b, positions // page_size], positions % page_size


def _check_common(kv: np.ndarray, bt: np.ndarray, pl: np.ndarray, op: str) -> None:
    if kv.ndim != 3 or kv.shape[2] != QK_DIM:
        raise ValueError(f"{op}: kv_cache must be [pages, page_size, {QK_DIM}], got {kv.shape}")
    if bt.ndim != 2:
        raise ValueError(f"{op}: block_table must be [B, max_pages], got {bt.shape}")
    if pl.shape != (bt.shape[0],):
        raise ValueError(f"{op}: prefix_lens must be [B={bt.shape[0]}], got {pl.shape}")
    if (pl < 0).any():
        raise ValueError(f"{op}: prefix_lens must be >= 0")
    if bt.size and ((bt < 0).any() or (bt >= kv.shape[0]).any()):
        raise ValueError(f"{op}: block_table entries must lie in [0, {kv.shape[0]})")


def tree_verify_attention(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    prefix_lens: Any,
    tree_lens: Any,
    visibility: Any,
    scale: float,
) -> np.ndarray:
    """Tree-verify MLA attention in float64; layout in the module docstring."""
    op = "tree_verify_attention"
    qq = _np(q, "q", np.float64)
    kv = _np(kv_cache, "kv_cache", np.float64)
    bt = _np(block_table, "block_table", np.int64)
    pl = _np(prefix_lens, "prefix_lens", np.int64)
    tl = _np(tree_lens, "tree_lens", np.int64)
    _check_common(kv, bt, pl, op)
    batch, page_size = bt.shape[0], kv.shape[1]
    if tl.shape != (batch,) or (tl < 1).any():
        raise ValueError(f"{op}: tree_lens must be [B={batch}] with every T_b >= 1")
    if qq.ndim != 3 or qq.shape[2] != QK_DIM or qq.shape[0] != int(tl.sum()):
        raise ValueError(
            f"{op}: q must be [sum T_b={int(tl.sum())}, heads, {QK_DIM}], got {qq.shape}"
        )
    if ((pl + tl) > bt.shape[1] * page_size).any():
        raise ValueError(f"{op}: L_b + T_b exceeds the block table's capacity")
    vis = [_np(v, "visibility", bool) for v in visibility]
    if len(vis) != batch or any(v.ndim != 2 or min(v.shape) < tl[i] for i, v in enumerate(vis)):
        raise ValueError(f"{op}: visibility must hold a [>=T_b, >=T_b] bool matrix per request")
    offs = qo_offsets(tl)
    out = np.zeros((qq.shape[0], qq.shape[1], V_DIM), dtype=np.float64)
    for b in range(batch):
        length, t = int(pl[b] + tl[b]), int(tl[b])
        keys = kv[kv_slots(bt, b, np.arange(length), page_size)]  # [L + T, 576]
        qb = qq[offs[b] : offs[b + 1]]  # [T, heads, 576]
        logits = scale * np.einsum("thd,kd->thk", qb, keys)
        mask = np.ones((t, length), dtype=bool)
        mask[:, length - t :] = vis[b][:t, :t]
        logits = np.where(mask[:, None, :], logits, -np.inf)
        row_max = logits.max(axis=-1, keepdims=True)
        row_max = np.where(np.isfinite(row_max), row_max, 0.0)
        p = np.exp(logits - row_max)
        denom = p.sum(axis=-1, keepdims=True)
        p = p / np.where(denom > 0, denom, 1.0)
        out[offs[b] : offs[b + 1]] = np.einsum("thk,kd->thd", p, keys[:, :V_DIM])
    return out


def compact_kv(kv_cache: Any, block_table: Any, prefix_lens: Any, accepted: Any) -> np.ndarray:
    """Return a copy of `kv_cache` with request b's accepted tree rows moved to L_b, L_b+1, ...

    `accepted` is `[B, A]` padded with -1 (as `greedy_accept_batch` returns it) or a list of
    1-D arrays; each starts with the root 0 and is strictly increasing. Row k of the result's
    compacted region is the old row at L_b + accepted[b, k]; every other row is unchanged.
    Reading from the old cache is the same as moving rows in place in increasing k order:
    the destination L_b + k never exceeds its source L_b + accepted[k], and every later
    source L_b + accepted[k'] (k' > k) is > L_b + accepted[k] >= L_b + k, so no source row
    is overwritten before it is read (the CUDA kernel relies on this order).
    """
    op = "compact_kv"
    kv = _np(kv_cache, "kv_cache")
    if not np.issubdtype(kv.dtype, np.floating):
        raise ValueError(f"{op}: kv_cache must be floating, got {kv.dtype}")
    bt = _np(block_table, "block_table", np.int64)
    pl = _np(prefix_lens, "prefix_lens", np.int64)
    _check_common(kv, bt, pl, op)
    rows = [_np(a, "accepted", np.int64).reshape(-1) for a in accepted]
    if len(rows) != bt.shape[0]:
        raise ValueError(f"{op}: accepted must have one row per request ({bt.shape[0]})")
    out = kv.copy()
    capacity = bt.shape[1] * kv.shape[1]
    for b, acc in enumerate(rows):
        n = int((acc >= 0).sum())
        if (acc[n:] != -1).any():
            raise ValueError(f"{op}: accepted[{b}] may hold -1 padding only at its end")
        acc = acc[:n]
        if acc.size == 0 or acc[0] != 0 or (np.diff(acc) <= 0).any():
            raise ValueError(f"{op}: accepted[{b}] must start with 0 and strictly increase")
        if pl[b] + acc[-1] >= capacity:
            raise ValueError(f"{op}: accepted[{b}] reaches past the block table's capacity")
        src = kv_slots(bt, b, pl[b] + acc, kv.shape[1])
        dst = kv_slots(bt, b, pl[b] + np.arange(acc.size), kv.shape[1])
        out[dst] = kv[src]
    return out
