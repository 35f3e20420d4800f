"""Drop-in for the SGLang fork's GPU accept walk, on the project's CUDA kernel; its CPU oracle.

The fork (SyJarvis/sglang at 4b08d3cc) walks each verified tree on the GPU with a Triton kernel,
`sglang.srt.speculative.triton_ops.ddtree._compute_ddtree_accept_triton_unchecked`, which
`dflash_ddtree_info.DFlashDDTreeVerifyInput.verify` imports by name and calls with keywords:

    (candidates, target_top1, retrieve_next_token, retrieve_next_sibling,
     next_token_ids_out, commit_lens_out, accept_index_out) -> None

The contract, as its caller and kernel use it (S = 1 + budget, the root at column 0):
  candidates [B, S] int64 (the worker's tree tokens), target_top1 [B, S] int64 (an argmax),
  retrieve_next_token / retrieve_next_sibling [B, S] (int32 from the worker, -1 = none);
  outputs, written in place: next_token_ids_out [B, S] int64 = target_top1 at each node of the
  accepted path (its last entry is the bonus token), then 0; commit_lens_out [B] int32 = the
  path's length (root included); accept_index_out [B, S] int64 = b * S + node along the path,
  then -1. The walk: from the root, scan the current node's children in link order (first
  child, then next siblings) and move to the FIRST whose candidate equals
  target_top1[current]: a token that two siblings share goes to the earlier one in link order.
  The fork's loop bounds are part of the answer on malformed links and are kept: links are
  read as int32 (an int64 link is truncated), at most next_pow2(S) children are scanned per
  step, and a path stops at S nodes. A link >= S is outside the contract (the fork reads out of
  bounds there); here it ends the chain.

`make_gpu_accept("cuda", stock)` returns a function with that exact signature. Its fast path
takes the caller's inputs: all seven plain torch tensors on the current CUDA device,
contiguous, of the shapes above (1 <= S <= MAX_STRIDE, B >= 1), candidates / target / outputs
int64, commit lens int32, both link tensors int32 or both int64; it launches
`ddtree_retrieve_accept` (kernels/csrc/retrieve_accept.cu) on the current stream through the
kernels' C ABI (ctypes), with no copy and no synchronisation. Everything else goes to `stock`
(the fork's own function, handed over by the hook), so the answer or the error is the fork's:
CPU tensors, other dtypes (int32 candidates, int64 commit lens, mixed link types), other
shapes (wider outputs, a 1-D candidates), non-contiguous tensors (the fork raises
ValueError), B = 0, tensor subclasses, a tensor on another device than the current one, and a
launch that returns an error. Without a stock function, the fallback is `reference_into`.

`reference` is the contract in plain torch on the CPU (vectorised over rows, early exit):
the oracle of the tests. tests/helpers/triton_accept.py holds a Triton kernel of the same
contract written here, the baseline benchmarks/gpu-accept.sh times ours against.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "FORK_FUNCTION",
    "FORK_MODULE",
    "KINDS",
    "MAX_STRIDE",
    "check_backend",
    "launch_cuda",
    "make",
    "make_gpu_accept",
    "reference",
    "reference_into",
    "scan_cap",
]

FORK_MODULE = "sglang.srt.speculative.triton_ops.ddtree"
FORK_FUNCTION = "_compute_ddtree_accept_triton_unchecked"
PARAMS = (
    "candidates",
    "target_top1",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "next_token_ids_out",
    "commit_lens_out",
    "accept_index_out",
)
KINDS = ("cuda",)
MAX_STRIDE = 1025  # DDTREE_RETRIEVE_MAX_STRIDE of kernels/csrc/ddtree_retrieve_accept.h
SYMBOL = "ddtree_retrieve_accept"

_T, _I64, _I32 = torch.Tensor, torch.int64, torch.int32
_LINK_CODE = {torch.int32: 0, torch.int64: 1}  # DDTREE_LINK_INT32 / _INT64


def scan_cap(stride: int) -> int:
    """Children scanned per step at most: the fork's block size, next_pow2(stride)."""
    return 1 << max(int(stride) - 1, 0).bit_length()


# ----------------------------------------------------------------------------- the oracle


def _as_int32_links(x: Any) -> torch.Tensor:
    """Links as int64 holding their int32 value (an int64 link truncated, as the fork does)."""
    y = torch.as_tensor(x).detach().to("cpu", torch.int64) & 0xFFFFFFFF
    return torch.where(y >= 2**31, y - 2**32, y)


def reference(
    candidates: Any, target_top1: Any, retrieve_next_token: Any, retrieve_next_sibling: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contract on the CPU: (next_token_ids int64 [B, S], commit_lens int32 [B],
    accept_index int64 [B, S]) from the four inputs (any integer dtype, any device)."""
    cand = torch.as_tensor(candidates).detach().to("cpu", torch.int64)
    tgt = torch.as_tensor(target_top1).detach().to("cpu", torch.int64)
    nt, ns = _as_int32_links(retrieve_next_token), _as_int32_links(retrieve_next_sibling)
    if cand.dim() != 2 or any(x.shape != cand.shape for x in (tgt, nt, ns)):
        raise ValueError(f"reference: inputs must share one [B, S] shape, got {cand.shape}")
    b, s = cand.shape
    cap = scan_cap(s)
    rows = torch.arange(b)
    path = torch.full((b, s), -1, dtype=torch.int64)
    path[:, 0] = 0
    n = torch.ones(b, dtype=torch.int64)  # path length so far
    cur = torch.zeros(b, dtype=torch.int64)  # the node whose children are scanned
    child = nt[:, 0].clone() if s else torch.full((b,), -1, dtype=torch.int64)
    scanned = torch.zeros(b, dtype=torch.int64)  # children of `cur` looked at so far
    live = torch.ones(b, dtype=torch.bool)
    while True:
        live &= (child >= 0) & (child < s) & (n < s) & (scanned < cap)
        if not bool(live.any()):
            break
        r, c = rows[live], child[live]
        hit = cand[r, c] == tgt[r, cur[r]]
        hr, hc = r[hit], c[hit]
        path[hr, n[hr]] = hc
        n[hr] += 1
        cur[hr] = hc
        child[hr] = nt[hr, hc]
        scanned[hr] = 0
        mr, mc = r[~hit], c[~hit]
        child[mr] = ns[mr, mc]
        scanned[mr] += 1
    on = torch.arange(s)[None, :] < n[:, None]
    p = path.clamp(min=0)
    ids = torch.where(on, tgt.gather(1, p), torch.zeros_like(p))
    acc = torch.where(on, rows[:, None] * s + p, torch.full_like(p, -1))
    return ids, n.to(torch.int32), acc


def reference_into(
    candidates,
    target_top1,
    retrieve_next_token,
    retrieve_next_sibling,
    next_token_ids_out,
    commit_lens_out,
    accept_index_out,
) -> None:
    """The contract's in-place form on `reference` (outputs on any device; the first S
    columns of each output row are written, as the fork writes them)."""
    ids, lens, acc = reference(candidates, target_top1, retrieve_next_token, retrieve_next_sibling)
    s = ids.shape[1]
    next_token_ids_out[:, :s].copy_(ids)
    commit_lens_out.copy_(lens.view(commit_lens_out.shape))
    accept_index_out[:, :s].copy_(acc)


# ----------------------------------------------------------------------------- the CUDA path

_fn: Any = None


def _launcher() -> Any:
    """The C function (loaded once; AttributeError if the library predates it)."""
    global _fn
    if _fn is None:
        from kernels import cuda_core

        p, i = ctypes.c_void_p, ctypes.c_int
        _fn = cuda_core.declare(SYMBOL, (p, p, p, p, i, i, i, p, p, p, p))
    return _fn


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def launch_cuda(c, t, nt, ns, ids, lens, acc) -> bool:  # noqa: ANN001 (hot path)
    """Run the walk on the GPU if the fast path takes these arguments (see the module's
    docstring); False (nothing launched, nothing written) otherwise."""
    if not (
        type(c) is _T
        and type(t) is _T
        and type(nt) is _T
        and type(ns) is _T
        and type(ids) is _T
        and type(lens) is _T
        and type(acc) is _T
        and c.dtype is _I64
        and t.dtype is _I64
        and ids.dtype is _I64
        and acc.dtype is _I64
        and lens.dtype is _I32
        and ns.dtype is nt.dtype
        and c.is_cuda
    ):
        return False
    link = _LINK_CODE.get(nt.dtype)
    shape = c.shape
    if link is None or len(shape) != 2:
        return False
    b, s = shape
    if not (
        0 < b
        and 0 < s <= MAX_STRIDE
        and t.shape == shape
        and nt.shape == shape
        and ns.shape == shape
        and ids.shape == shape
        and acc.shape == shape
        and lens.shape == (b,)
        and c.is_contiguous()
        and t.is_contiguous()
        and nt.is_contiguous()
        and ns.is_contiguous()
        and ids.is_contiguous()
        and lens.is_contiguous()
        and acc.is_contiguous()
    ):
        return False
    dev = c.device
    index = dev.index
    if not (
        t.device == dev
        and nt.device == dev
        and ns.device == dev
        and ids.device == dev
        and lens.device == dev
        and acc.device == dev
        and index == torch.cuda.current_device()
    ):
        return False
    # the C function's arguments as it groups them: inputs, link type, shape; outputs, stream
    rc = _launcher()(
        c.data_ptr(), t.data_ptr(), nt.data_ptr(), ns.data_ptr(), link, b, s,
        ids.data_ptr(), lens.data_ptr(), acc.data_ptr(), _stream(index),
    )  # fmt: skip
    return rc == 0


def check_backend(kind: str) -> None:
    """Raise unless `kind` can serve the GPU accept here (a GPU, the library, its symbol)."""
    if kind not in KINDS:
        raise ValueError(f"gpu_accept: kind {kind!r} is not one of {KINDS}")
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_accept: no CUDA device visible to torch")
    _launcher()  # loads (or builds) the kernels' library; AttributeError if it lacks SYMBOL


def make_gpu_accept(kind: str, stock: Callable | None = None) -> Callable:
    """`_compute_ddtree_accept_triton_unchecked` on `kind`, with the fork's exact signature;
    calls the fast path does not take go to `stock` (the hook passes the function it
    replaces; default `reference_into`)."""
    if kind not in KINDS:
        raise ValueError(f"gpu_accept: kind {kind!r} is not one of {KINDS}")
    fallback = stock or reference_into
    fast = launch_cuda

    def _compute_ddtree_accept_triton_unchecked(
        candidates,
        target_top1,
        retrieve_next_token,
        retrieve_next_sibling,
        next_token_ids_out,
        commit_lens_out,
        accept_index_out,
    ):
        if fast(
            candidates,
            target_top1,
            retrieve_next_token,
            retrieve_next_sibling,
            next_token_ids_out,
            commit_lens_out,
            accept_index_out,
        ):
            return None
        return fallback(
            candidates,
            target_top1,
            retrieve_next_token,
            retrieve_next_sibling,
            next_token_ids_out,
            commit_lens_out,
            accept_index_out,
        )

    fn = _compute_ddtree_accept_triton_unchecked
    fn.ddtree_ops_backend = kind  # type: ignore[attr-defined]
    fn.ddtree_ops_stock = fallback  # type: ignore[attr-defined]
    return fn


def make(component: str, kind: str, stock: Callable, passive: tuple = ()) -> Callable:
    """The hook's maker (`integration.hook.COMPONENTS["gpu_accept"]`): `check_backend`, then
    `make_gpu_accept(kind, stock)`; raises where `kind` cannot run here (no CUDA device, no
    kernels' library). `passive` is unused (the contract has no passive parameter)."""
    if component != "gpu_accept":
        raise ValueError(f"integration.gpu_accept makes gpu_accept, not {component}")
    check_backend(kind)
    return make_gpu_accept(kind, stock)
