"""Torch bindings for the CUDA ops tree-verify MLA attention and KV compaction.

Layout as in `kernels.reference_attention` (the float64 reference) and
`kernels/csrc/ddtree_attention.h`. Arguments are validated before any launch with the shared
`kernels.cuda_core` helpers (ValueError naming the op and the argument); a launcher's error
code becomes `KernelError`. The ops live in the shared kernel library (`kernels.build`
SOURCES), loaded through `kernels.cuda_core` (built once per arch and source digest;
`DDTREE_KERNELS_LIB` overrides).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels.cuda_core import check_same_device, check_tensor, declare, launch, ptr, stream_of

__all__ = [
    "ALGOS",
    "TreeVerifyLaunch",
    "compact_kv",
    "planned_splits",
    "prepare_tree_verify",
    "tree_verify_attention",
]

QK_DIM, V_DIM = 576, 512
# Attention kernels (DDTREE_ATTN_* in kernels/csrc/ddtree_attention.h). auto: bf16 -> the
# first of wgmma_tma (H100/H200 with an sm_90a build), mma_sync_64 (225 KiB of shared memory)
# and mma_sync_32 (75 KiB: sm_120 too) that runs on the device; fp32 -> simt. The tensor-core
# kernels need bf16; forced where they cannot run, the launch fails with CUDA's reason.
ALGOS = {"auto": 0, "simt": 1, "mma_sync_64": 2, "mma_sync_32": 3, "wgmma_tma": 4}
_BF16_ONLY = ("mma_sync_64", "mma_sync_32", "wgmma_tma")
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_I, _P, _F, _SZ = ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_size_t
_PLAN = ("ddtree_tree_verify_attention_plan", (_I,) * 8 + (ctypes.POINTER(_I), ctypes.POINTER(_SZ)))
_ATTN = ("ddtree_tree_verify_attention", (_P,) * 8 + (_SZ,) + (_I,) * 9 + (_F, _I, _P))
_COMPACT = ("ddtree_compact_kv", (_P,) * 4 + (_I,) * 5 + (_P,))
_LENS = (torch.int32, torch.int64)


def _check_algo(op: str, algo: str, dtype: torch.dtype) -> None:
    if algo not in ALGOS:
        raise ValueError(f"{op}: algo must be one of {list(ALGOS)}, got {algo!r}")
    if algo in _BF16_ONLY and dtype != torch.bfloat16:
        raise ValueError(f"{op}: algo {algo!r} needs bfloat16 inputs")


def _lens(op: str, name: str, t: object, batch: int) -> torch.Tensor:
    check_tensor(op, name, t, dtypes=_LENS, shape=(batch,))
    return t.to(torch.int32)  # type: ignore[union-attr]


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
    The same as `prepare_tree_verify(...)` then `.run(q, kv_cache, out)`.
    """
    prepared = prepare_tree_verify(
        q,
        kv_cache,
        block_table,
        prefix_lens,
        tree_lens,
        visibility,
        scale,
        max_kv_len=max_kv_len,
        num_splits=num_splits,
        algo=algo,
        check=check,
    )
    return prepared.run(q, kv_cache, out=out)


@dataclass
class TreeVerifyLaunch:
    """A tree-verify attention launch with its arguments checked and its plan (query offsets,
    KV splits, workspace) made once: `run` launches it for a q / kv_cache of the shapes it was
    prepared with (a model's every layer: one plan per forward, one launch per layer)."""

    q_shape: tuple[int, ...]
    kv_shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    args: tuple  # block_table, prefix_lens, qo_offsets, visibility (tensors)
    ws_bytes: int
    dims: tuple[
        int, ...
    ]  # dtype code, algo, batch, heads, total_q, t_max, page_size, max_pages, max_kv_len
    scale: float
    splits: int

    def run(
        self, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        op = "tree_verify_attention"
        for name, t, shape in (("q", q, self.q_shape), ("kv_cache", kv_cache, self.kv_shape)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != self.dtype:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{op}: {name}: prepared for {shape} {self.dtype}, got {got}")
            if t.device != self.device or not t.is_contiguous():
                raise ValueError(f"{op}: {name}: expected a contiguous tensor on {self.device}")
        total_q, heads = self.q_shape[0], self.q_shape[1]
        if out is None:
            out = torch.empty((total_q, heads, V_DIM), dtype=q.dtype, device=q.device)
        check_tensor(op, "out", out, dtypes=(q.dtype,), shape=(total_q, heads, V_DIM))
        if out.device != self.device:
            raise ValueError(f"{op}: out: expected a tensor on {self.device}, got {out.device}")
        if not self.args:  # nothing to compute (no request or no query row)
            return out
        bt, pl, qo, vis = self.args
        dtype, algo, batch, heads, total_q, t_max, page_size, max_pages, max_kv_len = self.dims
        # the split partials: per launch from torch's caching allocator, not held by the
        # launch (at 544 rows x 17 splits they are ~150 MB; a bench keeps many plans alive)
        ws = torch.empty(max(self.ws_bytes, 1), dtype=torch.uint8, device=self.device)
        launch(
            op,
            declare(*_ATTN),
            ptr(q),
            ptr(kv_cache),
            ptr(bt),
            ptr(pl),
            ptr(qo),
            ptr(vis),
            ptr(out),
            ptr(ws),
            self.ws_bytes,
            dtype,
            algo,
            batch,
            heads,
            total_q,
            t_max,
            page_size,
            max_pages,
            max_kv_len,
            self.scale,
            self.splits,
            stream_of(q),
        )
        return out


def prepare_tree_verify(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_lens: torch.Tensor,
    visibility: torch.Tensor,
    scale: float,
    *,
    max_kv_len: int | None = None,
    num_splits: int = 0,
    algo: str = "auto",
    check: bool = True,
) -> TreeVerifyLaunch:
    """Check `tree_verify_attention`'s arguments and plan its launch (see there)."""
    op = "tree_verify_attention"
    check_tensor(op, "q", q, dtypes=tuple(_DTYPES), shape=(None, None, QK_DIM))
    total_q, heads, _ = q.shape
    if not 1 <= heads <= 128:
        raise ValueError(f"{op}: q: expected 1..128 heads, got shape {tuple(q.shape)}")
    check_tensor(op, "kv_cache", kv_cache, dtypes=(q.dtype,), shape=(None, None, QK_DIM))
    check_tensor(op, "block_table", block_table, dtypes=(torch.int32,), ndim=2)
    batch, max_pages = block_table.shape
    page_size = kv_cache.shape[1]
    check_tensor(op, "visibility", visibility, dtypes=(torch.bool,), shape=(batch, None, None))
    t_max = visibility.shape[1]
    if visibility.shape[2] != t_max or t_max < 1:
        raise ValueError(f"{op}: visibility: expected shape (B={batch}, T_max, T_max)")
    _check_algo(op, algo, q.dtype)
    pl = _lens(op, "prefix_lens", prefix_lens, batch)
    tl = _lens(op, "tree_lens", tree_lens, batch)
    tensors = dict(kv_cache=kv_cache, block_table=block_table, visibility=visibility)
    dev = check_same_device(op, q=q, **tensors, prefix_lens=pl, tree_lens=tl)
    shapes = (tuple(q.shape), tuple(kv_cache.shape), q.dtype, dev)
    if batch == 0 or total_q == 0:
        return TreeVerifyLaunch(*shapes, (), 0, (), float(scale), 0)
    if check:
        _check_attention(
            op, pl, tl, block_table, kv_cache.shape[0], total_q, t_max, max_pages * page_size
        )
    if max_kv_len is None:
        max_kv_len = int((pl + tl).max().item())
    qo = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    torch.cumsum(tl, 0, dtype=torch.int32, out=qo[1:])
    dtype = _DTYPES[q.dtype]
    splits, ws_bytes = _plan(op, dtype, algo, batch, heads, total_q, t_max, max_kv_len, num_splits)
    dims = (dtype, ALGOS[algo], batch, heads, total_q, t_max, page_size, max_pages, max_kv_len)
    return TreeVerifyLaunch(
        *shapes, (block_table, pl, qo, visibility), ws_bytes, dims, float(scale), splits
    )


def _plan(op, dtype: int, algo: str, batch, heads, total_q, t_max, max_kv_len, num_splits):
    """(split count, workspace bytes) of a launch on the current device (the C planner)."""
    splits, ws_bytes = _I(0), _SZ(0)
    launch(
        op,
        declare(*_PLAN),
        dtype,
        ALGOS[algo],
        batch,
        heads,
        total_q,
        t_max,
        max_kv_len,
        num_splits,
        ctypes.byref(splits),
        ctypes.byref(ws_bytes),
    )
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
    if dtype not in _DTYPES:
        raise ValueError(f"{op}: dtype must be one of {list(_DTYPES)}, got {dtype}")
    _check_algo(op, algo, dtype)
    return _plan(
        op, _DTYPES[dtype], algo, batch, heads, batch * t_max, t_max, max_kv_len, num_splits
    )[0]


def _check_attention(op, pl, tl, block_table, num_pages, total_q, t_max, capacity) -> None:
    stats = torch.stack(
        [
            (tl < 1).sum(),
            tl.sum() - total_q,
            (tl > t_max).sum(),
            (pl < 0).sum(),
            (pl + tl > capacity).sum(),
            ((block_table < 0) | (block_table >= num_pages)).sum(),
        ]
    ).tolist()
    problems = [
        "tree_lens must be >= 1",
        f"tree_lens must sum to q.shape[0] = {total_q}",
        f"tree_lens must be <= T_max = {t_max}",
        "prefix_lens must be >= 0",
        f"prefix_lens + tree_lens must be <= max_pages * page_size = {capacity}",
        f"block_table entries must lie in [0, {num_pages})",
    ]
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
    check_tensor(op, "kv_cache", kv_cache, dtypes=tuple(_DTYPES), shape=(None, None, QK_DIM))
    check_tensor(op, "block_table", block_table, dtypes=(torch.int32,), ndim=2)
    batch, max_pages = block_table.shape
    check_tensor(op, "accepted", accepted, dtypes=_LENS, shape=(batch, None))
    pl = _lens(op, "prefix_lens", prefix_lens, batch)
    dev = check_same_device(
        op, kv_cache=kv_cache, block_table=block_table, accepted=accepted, prefix_lens=pl
    )
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
    launch(
        op,
        declare(*_COMPACT),
        ptr(kv_cache),
        ptr(block_table),
        ptr(pl),
        ptr(acc),
        batch,
        acc.shape[1],
        kv_cache.shape[1],
        max_pages,
        kv_cache.element_size(),
        stream_of(kv_cache),
    )
    return kv_cache
