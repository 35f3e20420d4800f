"""Torch bindings of the CUDA ops top-k log-probs, tree build and greedy accept.

Each function takes CUDA tensors, checks shapes / dtypes / devices / contiguity, launches on the
current stream of the tensors' device and returns new tensors (or fills `out=`). Results are
identical to `kernels.reference` (ids and trees exactly; log-probs to float32 rounding). Errors:
ValueError naming the op and the argument, or `KernelError` with the op and CUDA's message.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.cuda_core import (
    KernelError,
    c_i32,
    c_i64,
    c_ptr,
    check_same_device,
    check_tensor,
    declare,
    launch,
    ptr,
    stream_of,
)

__all__ = [
    "TREE_ALGOS",
    "CudaTrees",
    "KernelError",
    "TreeWorkspace",
    "build_trees",
    "greedy_accept",
    "greedy_accept_from_logits",
    "topk_logprobs",
]

MAX_DEPTH, MAX_K, MAX_BUDGET, MAX_TOPK = 32, 1024, 512, 512
# Tree-build algorithms (DDTREE_TREE_* in kernels/csrc/ddtree_kernels.h); all build the same
# trees. auto: level selection for budgets <= 64 with the heap loop as its fallback, the heap
# loop above; levels: the level selection alone, num_nodes = -1 where it declines the input
# (tests); heap: the heap loop alone; heap_lowmem: the loop that needs the least shared memory
# (the others take it where their shared memory would pass 160 KiB).
TREE_ALGOS = {"auto": 0, "levels": 1, "heap": 2, "heap_lowmem": 3}
_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}
_I64 = (torch.int64,)


class CudaTrees(NamedTuple):
    """B trees padded to the budget, on the GPU (fields as in kernels.reference.BatchedTrees)."""

    token_ids: torch.Tensor  # int64 [B, budget]
    depths: torch.Tensor  # int64 [B, budget]
    parents: torch.Tensor  # int64 [B, budget+1]
    visibility: torch.Tensor  # bool [B, budget+1, budget+1]
    first_child: torch.Tensor  # int64 [B, budget+1]
    next_sibling: torch.Tensor  # int64 [B, budget+1]
    num_nodes: torch.Tensor  # int64 [B]

    @classmethod
    def empty(cls, batch: int, budget: int, device: torch.device | str) -> CudaTrees:
        def i64(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.int64, device=device)

        n1 = budget + 1
        vis = torch.empty((batch, n1, n1), dtype=torch.bool, device=device)
        return cls(
            i64(batch, budget),
            i64(batch, budget),
            i64(batch, n1),
            vis,
            i64(batch, n1),
            i64(batch, n1),
            i64(batch),
        )


class TreeWorkspace:
    """Trees and the greedy accept's outputs for one (batch, budget, max_depth) on one GPU,
    checked once, here: a decode loop that builds and accepts trees of one shape every step
    passes it as `build_trees(..., out=ws)` and `greedy_accept(ws, ...)`, which then check
    only their other arguments (a batch-1 decode step is host-bound, and these buffers' checks
    were 14 tensor checks a step). `trees`: the CudaTrees every build overwrites; `accept_out`:
    (accepted, accept_len, bonus), views of the one int64 buffer `accept_flat` (one copy back).
    The tensors are never replaced; nobody else should resize them."""

    __slots__ = ("accept_flat", "accept_out", "batch", "budget", "device", "max_depth", "trees")

    def __init__(self, trees: CudaTrees, max_depth: int) -> None:
        op = "TreeWorkspace"
        self.device = _check_trees(op, "trees", trees, None, None)
        self.trees = trees
        self.batch, self.budget = (int(x) for x in trees.token_ids.shape)
        self.max_depth = _int_arg(op, "max_depth", max_depth, 0, MAX_DEPTH)
        b, n = self.batch, self.batch * (self.max_depth + 1)
        flat = torch.empty(n + 2 * b, dtype=torch.int64, device=self.device)
        self.accept_flat = flat
        self.accept_out = (flat[:n].view(b, self.max_depth + 1), flat[n : n + b], flat[n + b :])


def _int_arg(op: str, name: str, v: object, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{op}: {name}: expected an int in {lo}..{hi}, got {v!r}")
    return v


def topk_logprobs(
    logits: torch.Tensor, k: int, *, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_probs float32 [..., k], token_ids int64 [..., k]) over the last axis of logits."""
    op = "topk_logprobs"
    check_tensor(op, "logits", logits, dtypes=tuple(_DTYPE_CODE))
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(
            f"{op}: logits: expected shape [..., V] with V > 0, got {tuple(logits.shape)}"
        )
    vocab = logits.shape[-1]
    k = _int_arg(op, "k", k, 1, min(vocab, MAX_TOPK))
    lead = tuple(logits.shape[:-1])
    if out is None:
        out = (
            torch.empty((*lead, k), dtype=torch.float32, device=logits.device),
            torch.empty((*lead, k), dtype=torch.int64, device=logits.device),
        )
    lp, ids = out
    check_tensor(op, "out[0]", lp, dtypes=(torch.float32,), shape=(*lead, k))
    check_tensor(op, "out[1]", ids, dtypes=_I64, shape=(*lead, k))
    check_same_device(op, logits=logits, log_probs=lp, token_ids=ids)
    rows = logits.numel() // vocab
    fn = declare("ddtree_topk_logprobs", (c_ptr, c_i32, c_i64, c_i64, c_i32, c_ptr, c_ptr, c_ptr))
    with torch.cuda.device(logits.device):
        launch(
            op,
            fn,
            ptr(logits),
            _DTYPE_CODE[logits.dtype],
            rows,
            vocab,
            k,
            ptr(lp),
            ptr(ids),
            stream_of(logits),
        )
    return lp, ids


def build_trees(
    top_log_probs: torch.Tensor,
    top_token_ids: torch.Tensor,
    budget: int,
    *,
    out: CudaTrees | None = None,
    algo: str = "auto",
) -> CudaTrees:
    """Best-first DDTrees from top-K [B, H, K] (float32 log-probs, int64 ids), tie-exact.

    `algo` is one of `TREE_ALGOS` (the same trees whichever; `levels` alone may decline).
    """
    op = "build_trees"
    if algo not in TREE_ALGOS:
        raise ValueError(f"{op}: algo must be one of {list(TREE_ALGOS)}, got {algo!r}")
    check_tensor(op, "top_log_probs", top_log_probs, dtypes=(torch.float32,), ndim=3)
    b, h, k = top_log_probs.shape
    check_tensor(op, "top_token_ids", top_token_ids, dtypes=_I64, shape=(b, h, k))
    budget = _int_arg(op, "budget", budget, 0, MAX_BUDGET)
    if h > MAX_DEPTH:
        raise ValueError(f"{op}: top_log_probs: H = {h} > {MAX_DEPTH}")
    if k > MAX_K:
        raise ValueError(f"{op}: top_log_probs: K = {k} > {MAX_K}")
    dev = check_same_device(op, top_log_probs=top_log_probs, top_token_ids=top_token_ids)
    if isinstance(out, TreeWorkspace):  # its trees were checked when it was made
        if (out.batch, out.budget) != (b, budget) or out.device != dev:
            raise ValueError(
                f"{op}: out: a workspace for batch {out.batch}, budget {out.budget} on "
                f"{out.device}; these inputs need batch {b}, budget {budget} on {dev}"
            )
        out = out.trees
    else:
        out = out if out is not None else CudaTrees.empty(b, budget, dev)
        _check_trees(op, "out", out, b, budget)
        check_same_device(op, top_log_probs=top_log_probs, out=out.parents)
    argtypes = (c_ptr, c_ptr, c_i32, c_i32, c_i32, c_i32) + (c_ptr,) * 7 + (c_i32, c_ptr)
    fn = declare("ddtree_build_trees", argtypes)
    with torch.cuda.device(dev):
        launch(
            op,
            fn,
            ptr(top_log_probs),
            ptr(top_token_ids),
            b,
            h,
            k,
            budget,
            *(ptr(t) for t in out),
            TREE_ALGOS[algo],
            stream_of(top_log_probs),
        )
    return out


def _check_trees(
    op: str, name: str, trees: CudaTrees, batch: int | None, budget: int | None
) -> torch.device:
    if not isinstance(trees, CudaTrees):
        raise ValueError(f"{op}: {name}: expected CudaTrees, got {type(trees).__name__}")
    b = trees.num_nodes.shape[0] if batch is None else batch
    n = trees.token_ids.shape[-1] if budget is None else budget
    shapes = {
        "token_ids": (b, n),
        "depths": (b, n),
        "parents": (b, n + 1),
        "visibility": (b, n + 1, n + 1),
        "first_child": (b, n + 1),
        "next_sibling": (b, n + 1),
        "num_nodes": (b,),
    }
    for field, shape in shapes.items():
        dt = (torch.bool,) if field == "visibility" else _I64
        check_tensor(op, f"{name}.{field}", getattr(trees, field), dtypes=dt, shape=shape)
    return check_same_device(op, **{f"{name}.{f}": getattr(trees, f) for f in shapes})


def _accept_outputs(
    op: str, b: int, max_depth: int, dev: torch.device, out: tuple[torch.Tensor, ...] | None
) -> tuple[torch.Tensor, ...]:
    if out is None:
        out = (
            torch.empty((b, max_depth + 1), dtype=torch.int64, device=dev),
            torch.empty((b,), dtype=torch.int64, device=dev),
            torch.empty((b,), dtype=torch.int64, device=dev),
        )
    for name, t, shape in zip(
        ("accepted", "accept_len", "bonus"), out, ((b, max_depth + 1), (b,), (b,)), strict=True
    ):
        check_tensor(op, f"out.{name}", t, dtypes=_I64, shape=shape)
        if t.device != dev:
            raise ValueError(f"{op}: out.{name}: on {t.device}, expected {dev}")
    return out


def greedy_accept(
    trees: CudaTrees | TreeWorkspace,
    target_ids: torch.Tensor,
    max_depth: int,
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accepted [B, max_depth+1] padded -1, accept_len [B], bonus [B]) from ids [B, budget+1].

    Pass the drafter's H as max_depth: a walk is cut after max_depth steps (the reference
    raises instead; no tree built from H positions is deeper than H). A TreeWorkspace's trees
    and outputs (its `accept_out`, unless `out` is given) are not checked again.
    """
    op = "greedy_accept"
    if isinstance(trees, TreeWorkspace):
        ws, trees = trees, trees.trees
        if max_depth != ws.max_depth:
            raise ValueError(f"{op}: max_depth: {max_depth}, the workspace's is {ws.max_depth}")
        b, budget = ws.batch, ws.budget
        check_tensor(op, "target_ids", target_ids, dtypes=_I64, shape=(b, budget + 1))
        dev = check_same_device(op, trees=trees.parents, target_ids=target_ids)
        if out is None:
            acc, alen, bonus = ws.accept_out
        else:
            acc, alen, bonus = _accept_outputs(op, b, max_depth, dev, out)
    else:
        _check_trees(op, "trees", trees, None, None)
        b, budget = trees.token_ids.shape
        check_tensor(op, "target_ids", target_ids, dtypes=_I64, shape=(b, budget + 1))
        max_depth = _int_arg(op, "max_depth", max_depth, 0, MAX_DEPTH)
        dev = check_same_device(op, trees=trees.parents, target_ids=target_ids)
        acc, alen, bonus = _accept_outputs(op, b, max_depth, dev, out)
    fn = declare(
        "ddtree_greedy_accept",
        (c_ptr, c_ptr, c_ptr, c_i32, c_i32, c_ptr, c_i32, c_ptr, c_ptr, c_ptr, c_ptr),
    )
    with torch.cuda.device(dev):
        launch(
            op,
            fn,
            ptr(trees.token_ids),
            ptr(trees.first_child),
            ptr(trees.next_sibling),
            b,
            budget,
            ptr(target_ids),
            max_depth,
            ptr(acc),
            ptr(alen),
            ptr(bonus),
            stream_of(target_ids),
        )
    return acc, alen, bonus


def greedy_accept_from_logits(
    trees: CudaTrees,
    logits: torch.Tensor,
    max_depth: int,
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy accept fused with the argmax of verify logits [B, budget+1, V] (bf16/fp32)."""
    op = "greedy_accept_from_logits"
    _check_trees(op, "trees", trees, None, None)
    b, budget = trees.token_ids.shape
    check_tensor(op, "logits", logits, dtypes=tuple(_DTYPE_CODE), shape=(b, budget + 1, None))
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError(f"{op}: logits: empty vocabulary axis")
    max_depth = _int_arg(op, "max_depth", max_depth, 0, MAX_DEPTH)
    dev = check_same_device(op, trees=trees.parents, logits=logits)
    acc, alen, bonus = _accept_outputs(op, b, max_depth, dev, out)
    fn = declare(
        "ddtree_greedy_accept_from_logits",
        (c_ptr, c_ptr, c_ptr, c_i32, c_i32, c_ptr, c_i32, c_i64, c_i32, c_ptr, c_ptr, c_ptr, c_ptr),
    )
    with torch.cuda.device(dev):
        launch(
            op,
            fn,
            ptr(trees.token_ids),
            ptr(trees.first_child),
            ptr(trees.next_sibling),
            b,
            budget,
            ptr(logits),
            _DTYPE_CODE[logits.dtype],
            vocab,
            max_depth,
            ptr(acc),
            ptr(alen),
            ptr(bonus),
            stream_of(logits),
        )
    return acc, alen, bonus
