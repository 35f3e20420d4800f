"""Torch bindings for the Kernels II CUDA ops: tree-verify MLA attention and KV compaction.

Layout as in `kernels.reference_attention` (the float64 reference) and
`kernels/csrc/ddtree_attention.h`. Arguments are validated before any launch; errors name the
op and the argument. The ops live in the shared kernel library (`kernels.build` SOURCES),
loaded through `kernels.cuda_core` (built once per arch and source digest;
`DDTREE_KERNELS_LIB` overrides).
"""

from __future__ import annotations

import ctypes

import torch

from kernels.cuda_core import declare, launch

__all__ = ["compact_kv", "planned_splits", "tree_verify_attention"]

QK_DIM, V_DIM = 576, 512
# "mma" picks the preferred tensor-core variant that fits the device (H100/H200: mma21);
# "mmaN" forces one (tuning only; see mma_variants in tree_verify_attention.cu). mma7, mma8,
# mma14 and mma17 to mma21 are the sm_90a wgmma kernel (H100/H200 only; elsewhere the launch
# fails with "invalid device function"); mma9 to mma13, mma15 and mma16 were retired.
MMA_VARIANTS = (*range(9), 14, 17, 18, 19, 20, 21)
WGMMA_VARIANTS = tuple(i for i in MMA_VARIANTS if i >= 7)
_ALGOS = {"auto": 0, "simt": 1, "mma": 2, **{f"mma{i}": 3 + i for i in MMA_VARIANTS}}
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_I, _P, _F, _SZ = ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_size_t
_PLAN = ("ddtree_tree_verify_attention_plan", (_I,) * 8 + (ctypes.POINTER(_I), ctypes.POINTER(_SZ)))
_ATTN = ("ddtree_tree_verify_attention", (_P,) * 8 + (_SZ,) + (_I,) * 9 + (_F, _I, _P))
_COMPACT = ("ddtree_compact_kv", (_P,) * 4 + (_I,) * 5 + (_P,))


def _tensor(op: str, name: str, t: object, dtypes: tuple, ndim: int, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{op}: {name} must have dtype in {list(dtypes)}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not t.is_cuda or (device is not None and t.device != device):
        raise ValueError(f"{op}: {name} must be on {device or 'a CUDA device'}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous")


def _lens(op: str, name: str, t: torch.Tensor, batch: int, device) -> torch.Tensor:
    _tensor(op, name, t, (torch.int32, torch.int64), 1, device)
    if t.shape[0] != batch:
        raise ValueError(f"{op}: {name} must be [B={batch}], got {tuple(t.shape)}")
    return t.to(torch.int32)


def tree_verify_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_lens: torch.Tensor,
    visibility: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    max_kv_len: int | None = None,
    num_splits: int = 0,
    algo: str = "auto",
    check: bool = True,
) -> torch.Tensor:
    """out `[sum T_b, heads, 512]` (q's dtype) = tree-verify attention on the GPU.

    `max_kv_len` (an upper bound on L_b + T_b) only plans the KV split; when None it is read
    from the device (a sync). `check` verifies the data-dependent preconditions on the device
    (also a sync); pass `check=False, max_kv_len=...` inside CUDA graphs. `num_splits` 0 = auto.
    """
    op = "tree_verify_attention"
    _tensor(op, "q", q, tuple(_DTYPES), 3)
    dev = q.device
    _tensor(op, "kv_cache", kv_cache, (q.dtype,), 3, dev)
    _tensor(op, "block_table", block_table, (torch.int32,), 2, dev)
    _tensor(op, "visibility", visibility, (torch.bool,), 3, dev)
    total_q, heads, _ = q.shape
    batch, max_pages = block_table.shape
    page_size, t_max = kv_cache.shape[1], visibility.shape[1]
    if q.shape[2] != QK_DIM or not 1 <= heads <= 128:
        raise ValueError(f"{op}: q must be [sum T_b, heads 1..128, {QK_DIM}], got {tuple(q.shape)}")
    if kv_cache.shape[2] != QK_DIM:
        raise ValueError(f"{op}: kv_cache must be [pages, page_size, {QK_DIM}]")
    if visibility.shape != (batch, t_max, t_max) or t_max < 1:
        raise ValueError(f"{op}: visibility must be [B={batch}, T_max, T_max]")
    if algo not in _ALGOS:
        raise ValueError(f"{op}: algo must be one of {list(_ALGOS)}, got {algo!r}")
    if algo.startswith("mma") and q.dtype != torch.bfloat16:
        raise ValueError(f"{op}: algo 'mma' needs bfloat16 inputs")
    pl = _lens(op, "prefix_lens", prefix_lens, batch, dev)
    tl = _lens(op, "tree_lens", tree_lens, batch, dev)
    if out is None:
        out = torch.empty((total_q, heads, V_DIM), dtype=q.dtype, device=dev)
    else:
        _tensor(op, "out", out, (q.dtype,), 3, dev)
        if out.shape != (total_q, heads, V_DIM):
            raise ValueError(f"{op}: out must be [{total_q}, {heads}, {V_DIM}]")
    if batch == 0 or total_q == 0:
        return out
    if check:
        _check_attention(op, pl, tl, block_table, kv_cache.shape[0], total_q, t_max,
                         max_pages * page_size)  # fmt: skip
    if max_kv_len is None:
        max_kv_len = int((pl + tl).max().item())
    qo = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    torch.cumsum(tl, 0, dtype=torch.int32, out=qo[1:])
    dtype = _DTYPES[q.dtype]
    splits, ws_bytes = _plan(op, dtype, algo, batch, heads, total_q, t_max, max_kv_len, num_splits)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    launch(op, declare(*_ATTN),
        q.data_ptr(), kv_cache.data_ptr(), block_table.data_ptr(), pl.data_ptr(), qo.data_ptr(),
        visibility.data_ptr(), out.data_ptr(), ws.data_ptr(), ws_bytes, dtype,
        _ALGOS[algo], batch, heads, total_q, t_max, page_size, max_pages, max_kv_len,
        float(scale), splits, stream)  # fmt: skip
    return out


def _plan(op, dtype: int, algo: str, batch, heads, total_q, t_max, max_kv_len, num_splits):
    """(split count, workspace bytes) of a launch on the current device (the C planner)."""
    splits, ws_bytes = _I(0), _SZ(0)
    launch(op, declare(*_PLAN), dtype, _ALGOS[algo], batch, heads, total_q, t_max, max_kv_len,
           num_splits, ctypes.byref(splits), ctypes.byref(ws_bytes))  # fmt: skip
    return splits.value, ws_bytes.value


def planned_splits(
    batch: int,
    heads: int,
    t_max: int,
    max_kv_len: int,
    *,
    algo: str = "auto",
    dtype: torch.dtype = torch.bfloat16,
    num_splits: int = 0,
) -> int:
    """The KV split count `tree_verify_attention` launches with on the current device."""
    op = "planned_splits"
    if algo not in _ALGOS:
        raise ValueError(f"{op}: algo must be one of {list(_ALGOS)}, got {algo!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"{op}: dtype must be one of {list(_DTYPES)}, got {dtype}")
    return _plan(
        op, _DTYPES[dtype], algo, batch, heads, batch * t_max, t_max, max_kv_len, num_splits
    )[0]


def _check_attention(op, pl, tl, block_table, num_pages, total_q, t_max, capacity) -> None:
    stats = torch.stack([
        (tl < 1).sum(), tl.sum() - total_q, (tl > t_max).sum(), (pl < 0).sum(),
        (pl + tl > capacity).sum(),
        ((block_table < 0) | (block_table >= num_pages)).sum(),
    ]).tolist()  # fmt: skip
    problems = [
        "tree_lens must be >= 1", f"tree_lens must sum to q.shape[0] = {total_q}",
        f"tree_lens must be <= T_max = {t_max}", "prefix_lens must be >= 0",
        f"prefix_lens + tree_lens must be <= max_pages * page_size = {capacity}",
        f"block_table entries must lie in [0, {num_pages})",
    ]  # fmt: skip
    for bad, msg in zip(stats, problems, strict=True):
        if bad:
            raise ValueError(f"{op}: {msg}")


def compact_kv(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    accepted: torch.Tensor,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Move accepted tree rows to L_b, L_b+1, ... in place; returns `kv_cache`.

    `accepted` `[B, A]` int32/int64: tree indices starting with 0, strictly increasing, padded
    with -1 (as `greedy_accept_batch` returns them). `check` verifies that on the device (sync).
    """
    op = "compact_kv"
    _tensor(op, "kv_cache", kv_cache, tuple(_DTYPES), 3)
    dev = kv_cache.device
    _tensor(op, "block_table", block_table, (torch.int32,), 2, dev)
    _tensor(op, "accepted", accepted, (torch.int32, torch.int64), 2, dev)
    batch, max_pages = block_table.shape
    if kv_cache.shape[2] != QK_DIM:
        raise ValueError(f"{op}: kv_cache must be [pages, page_size, {QK_DIM}]")
    if accepted.shape[0] != batch:
        raise ValueError(f"{op}: accepted must be [B={batch}, A], got {tuple(accepted.shape)}")
    pl = _lens(op, "prefix_lens", prefix_lens, batch, dev)
    acc = accepted.to(torch.int32).contiguous()
    if batch == 0 or acc.shape[1] == 0:
        return kv_cache
    if check:
        valid = acc >= 0
        n = valid.sum(1)
        pos = torch.arange(acc.shape[1], device=dev)
        rows_ok = (valid == (pos[None, :] < n[:, None])).all(1) & (acc[:, 0] == 0)
        incr = (acc[:, 1:] > acc[:, :-1]) | ~valid[:, 1:]
        reach = pl + acc.max(1).values < max_pages * kv_cache.shape[1]
        if not bool((rows_ok & incr.all(1) & reach).all()):
            raise ValueError(
                f"{op}: accepted rows must start with 0, strictly increase, be padded with -1"
                " only at the end and stay within the block table"
            )
    stream = torch.cuda.current_stream(dev).cuda_stream
    launch(op, declare(*_COMPACT),
        kv_cache.data_ptr(), block_table.data_ptr(), pl.data_ptr(), acc.data_ptr(), batch,
        acc.shape[1], kv_cache.shape[1], max_pages, kv_cache.element_size(), stream)  # fmt: skip
    return kv_cache
