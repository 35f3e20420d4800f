"""Drop-ins for the SGLang fork's DDTree tree builder and accept walk, on our builders.

The fork's `sglang.srt.speculative.dflash_ddtree_utils` (SyJarvis/sglang; issue 18's contract,
two versions of the builder's signature, see `integration.hook.CONTRACTS`):

- `build_ddtree_tree_from_topk(top_log_probs [H, K], top_token_ids [H, K], budget)`, and since
  807ab0e4 a fourth parameter `workspace: DFlashDDTreeBuildWorkspace | None = None` ->
  the 7-tuple (node_token_ids long [n], node_depths long [n] 1-based, parents list of n+1
  ints, child_maps list of n+1 dicts {token: child}, visibility bool [n+1, n+1],
  retrieve_next_token long [n+1], retrieve_next_sibling long [n+1]), all on the CPU.
- `follow_verified_tree(child_maps, posterior)` -> (accepted node indices from 0, next token).

A drop-in made for the hook holds the function it replaces (`stock`). Its fast path takes the
inputs the service hands over (float32 log-probs, bf16 / fp16 converted exactly, int64 ids, on
the CPU or a GPU, 1 <= budget <= MAX_BUDGET); everything else goes to `stock` unchanged, so the
answer or the exception is the fork's own: a float64 tensor (the fork rounds it to float32 its
own way), K = 0 (the fork raises), a budget over MAX_BUDGET, a budget that is not an int, a
tensor that requires grad or is a subclass, other dtypes, devices or layouts; for the walk, a
posterior that is not a contiguous 1-D int64 CPU tensor, or child_maps that are not a plain
list of plain dicts with int values in range.

Backends: `cpp` (the CPython extension of `integration.native`: kernels/csrc/cpu_tree_build.cpp's
builder writing the fork's objects directly, one request per call), `cuda` (kernels.cuda, worth
it only for a batch, see `build_ddtree_trees`) and `python` (`integration.fork_style`, the
contract the fork's way in plain Python: the bench's reference, never installed by the hook).
Every backend gives the same answers as the fork, bit for bit, ties included.

The workspace (807ab0e4) is accepted and ignored: the drop-in returns fresh tensors with the
values the fork would put in the workspace's buffers. Why not fill the buffers: the fork's
own reason for them is to skip numpy allocations per call, which our C++ path never makes (its
tensors cost the same fresh or reused); fresh outputs cannot be overwritten by the next call
under a caller that keeps a tree (the fork's caller copies out first, and loses nothing); and
the workspace's float32 / int64 input copies are not needed by a builder that reads the
caller's tensors in place. An argument that is neither None nor the fork's workspace class
goes to the stock function (which decides what it means).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from integration import fork_style, native

__all__ = [
    "ACCEPT_BACKENDS",
    "MAX_BUDGET",
    "TREE_BACKENDS",
    "build_ddtree_trees",
    "build_tree",
    "check_backend",
    "follow_tree",
    "make",
    "make_accept",
    "make_build",
]

TREE_BACKENDS = ("cpp", "cuda", "python")
ACCEPT_BACKENDS = ("cpp", "python")
MAX_BUDGET = 4096  # the compiled builders' limit: beyond, padded outputs grow as budget^2
Tree7 = tuple[torch.Tensor, torch.Tensor, list, list, torch.Tensor, torch.Tensor, torch.Tensor]
# (name, default, class): a parameter after `budget` that does not change the answer when it is
# its default or an instance of the class (e.g. the fork's workspace)
Passive = tuple[tuple[str, Any, type | None], ...]

_Tensor, _F32, _I64, _STRIDED = torch.Tensor, torch.float32, torch.int64, torch.strided
_EXACT = (torch.bfloat16, torch.float16)  # convert to float32 exactly, as the fork's .to() does


# ----------------------------------------------------------------------------- build


def _host_inputs(lp: Any, ids: Any, budget: Any) -> tuple | None:
    """(lp float32, ids int64: contiguous CPU tensors, H, K) if the fast path takes the call.

    None sends the call to the stock function. The cases taken give exactly the fork's tree:
    the fork reads float32 values of the log-probs and int64 ids on the CPU; so do we."""
    if type(lp) is not _Tensor or type(ids) is not _Tensor or type(budget) is not int:
        return None
    if lp.dim() != 2 or lp.requires_grad or lp.is_neg() or ids.is_neg() or budget > MAX_BUDGET:
        return None  # the fork's .numpy() raises on a grad tensor: its error, not ours
    h, k = shape = lp.shape
    if ids.shape != shape or (k == 0 and h and budget > 0):
        return None
    if not (
        lp.dtype is _F32
        and ids.dtype is _I64
        and lp.is_cpu
        and ids.is_cpu
        and lp.is_contiguous()
        and ids.is_contiguous()
    ):
        return _normalised(lp, ids, h, k)
    return lp, ids, h, k


def _normalised(lp: torch.Tensor, ids: torch.Tensor, h: int, k: int) -> tuple | None:
    """_host_inputs for the rarer inputs: bf16 / fp16, a GPU, not contiguous; None for the rest."""
    if lp.layout is not _STRIDED or ids.layout is not _STRIDED or ids.dtype is not _I64:
        return None
    if lp.dtype is not _F32:
        if lp.dtype not in _EXACT:
            return None  # float64 above all: the fork rounds it to float32 first
        lp = lp.float()
    if not lp.is_cpu:
        if not lp.is_cuda:
            return None
        lp = lp.cpu()
    if not ids.is_cpu:
        if not ids.is_cuda:
            return None
        ids = ids.cpu()
    return lp.contiguous(), ids.contiguous(), h, k


def _cpp_build(lp: Any, ids: Any, budget: Any) -> Tree7 | None:
    got = _host_inputs(lp, ids, budget)
    if got is None:
        return None
    lp, ids, h, k = got
    # rows deeper than the budget can hold no node: the tree is the same without them
    return _native_build(lp.data_ptr(), ids.data_ptr(), min(h, budget), k, budget)


def _native_build(*args: int) -> Tree7:
    """The extension's `build` (loaded, then bound in this name, on the first call)."""
    global _native_build
    _native_build = _ext().build
    return _native_build(*args)


def _cuda_build(lp: Any, ids: Any, budget: Any) -> Tree7 | None:
    got = _host_inputs(lp, ids, budget)
    if got is None:
        return None
    lp, ids, h, k = got
    if budget <= 0 or h == 0 or not _cuda_fits(h, min(k, budget), budget):
        return _ext().build(lp.data_ptr(), ids.data_ptr(), min(h, budget), k, budget)
    return _cuda(lp[None, :, :budget], ids[None, :, :budget], budget).request(0)


_FAST: dict[str, Callable[[Any, Any, Any], Tree7 | None]] = {
    "cpp": _cpp_build,
    "cuda": _cuda_build,
    "python": lambda lp, ids, budget: None,  # the reference: every call goes to the stock
}


def build_tree(
    top_log_probs: Any,
    top_token_ids: Any,
    budget: Any,
    *,
    backend: str,
    stock: Callable | None = None,
) -> Tree7:
    """One request's tree as the fork's 7-tuple by `backend`; inputs it does not take go to
    `stock` (default: `integration.fork_style`, the fork's algorithm in plain Python)."""
    out = _FAST[backend](top_log_probs, top_token_ids, budget)
    if out is None:
        return (stock or fork_style.build_ddtree_tree_from_topk)(
            top_log_probs, top_token_ids, budget
        )
    return out


def make_build(backend: str, stock: Callable | None = None, passive: Passive = ()) -> Callable:
    """`build_ddtree_tree_from_topk` on `backend`, with the signature of the contract: the
    fork's three parameters, then the `passive` ones (name, default, class) if any.

    `stock` is the function it replaces (the hook passes it); calls the fast path does not
    take go to it with the arguments as given. Without one (the bench, tests), to
    `integration.fork_style`."""
    if backend not in TREE_BACKENDS:
        raise ValueError(f"tree_build: backend {backend!r} is not one of {TREE_BACKENDS}")
    fast = _FAST[backend]
    fallback = stock or fork_style.build_ddtree_tree_from_topk

    if not passive:

        def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget):
            out = fast(top_log_probs, top_token_ids, budget)
            return fallback(top_log_probs, top_token_ids, budget) if out is None else out

    else:
        names = tuple(name for name, _, _ in passive)
        known = {name: (default, cls) for name, default, cls in passive}

        def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget, *more, **named):
            out = None
            if not (more or named) or _ignorable(names, known, more, named):
                out = fast(top_log_probs, top_token_ids, budget)
            if out is None:
                return fallback(top_log_probs, top_token_ids, budget, *more, **named)
            return out

        build_ddtree_tree_from_topk.__signature__ = _signature(  # type: ignore[attr-defined]
            ("top_log_probs", "top_token_ids", "budget"), passive
        )

    build_ddtree_tree_from_topk.__qualname__ = "build_ddtree_tree_from_topk"  # as in TypeErrors
    build_ddtree_tree_from_topk.ddtree_ops_backend = backend  # type: ignore[attr-defined]
    build_ddtree_tree_from_topk.ddtree_ops_stock = fallback  # type: ignore[attr-defined]
    return build_ddtree_tree_from_topk


def _ignorable(names: tuple[str, ...], known: dict, more: tuple, named: dict) -> bool:
    """True when every extra argument is a passive parameter at its default or of its class."""
    if more:
        if len(more) > len(names) or any(name in named for name in names[: len(more)]):
            return False  # too many, or given twice: the stock raises its TypeError
        values = {**dict(zip(names, more, strict=False)), **named}
    else:
        values = named
    for name, value in values.items():
        spec = known.get(name)
        if spec is None or (value is not spec[0] and not (spec[1] and isinstance(value, spec[1]))):
            return False
    return True


def _signature(names: tuple[str, ...], passive: Passive) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind) for n in names]
    params += [inspect.Parameter(n, kind, default=d) for n, d, _ in passive]
    return inspect.Signature(params)


def build_ddtree_trees(
    top_log_probs: Any, top_token_ids: Any, budget: int, *, backend: str = "cuda"
) -> list[Tree7]:
    """A batch [B, H, K] (CPU or CUDA tensors) -> B 7-tuples, from one builder call (`cpp`,
    `cuda`); `python` and inputs the compiled builders do not take: per request, the fork's
    way (`integration.fork_style`)."""
    if backend not in TREE_BACKENDS:
        raise ValueError(f"backend: expected one of {TREE_BACKENDS}, got {backend!r}")
    b = int(top_log_probs.shape[0])
    per_request = backend == "python" or b == 0
    if not per_request:
        got = _host_inputs(top_log_probs[0], top_token_ids[0], budget)
        per_request = got is None or budget <= 0 or got[2] == 0
    if per_request:
        build = fork_style.build_ddtree_tree_from_topk
        return [build(top_log_probs[i], top_token_ids[i], budget) for i in range(b)]
    if backend == "cuda" and _cuda_fits(got[2], min(got[3], budget), budget):
        packed = _cuda(top_log_probs[..., :budget], top_token_ids[..., :budget], budget)
    else:
        packed = _cpp_batch(top_log_probs, top_token_ids, budget)
    return [packed.request(i) for i in range(b)]


class _Packed:
    """B padded trees in one int64 numpy buffer, field after field (the builders' layout):
    token_ids [B, budget], depths [B, budget], parents / first_child / next_sibling
    [B, budget+1], num_nodes [B]; and visibility bool [B, budget+1, budget+1]."""

    def __init__(self, batch: int, budget: int, ints: np.ndarray, vis: np.ndarray) -> None:
        self.batch, self.budget, self.ints, self.vis = batch, budget, ints, vis
        self.base = ints.ctypes.data
        b, s = batch, budget + 1
        self.off = dict(tok=0, dep=b * budget, par=2 * b * budget)
        self.off.update(fc=self.off["par"] + b * s, ns=self.off["par"] + 2 * b * s)
        self.off["num"] = self.off["par"] + 3 * b * s

    @classmethod
    def empty(cls, batch: int, budget: int) -> _Packed:
        s = budget + 1
        ints = np.empty(2 * batch * budget + 3 * batch * s + batch, dtype=np.int64)
        return cls(batch, budget, ints, np.empty((batch, s, s), dtype=np.bool_))

    def addr(self, field: str, b: int) -> int:
        width = self.budget if field in ("tok", "dep") else self.budget + 1
        return self.base + 8 * (self.off[field] + b * width)

    def request(self, b: int) -> Tree7:
        """Request b as the fork's 7-tuple (copies: nothing shares these buffers)."""
        s = self.budget + 1
        n = int(self.ints[self.off["num"] + b])
        vis = self.vis.ctypes.data + b * s * s
        a = self.addr
        return _ext().tree(a("tok", b), a("dep", b), a("par", b), vis, a("fc", b), a("ns", b), n, s)


def _cpp_batch(lp: torch.Tensor, ids: torch.Tensor, budget: int) -> _Packed:
    """kernels.cpu's compiled builder on [B, H, K], into a _Packed."""
    from kernels import cpu

    lp = lp.detach().to("cpu", torch.float32).contiguous()
    ids = ids.detach().to("cpu", torch.int64).contiguous()
    b, h, k = lp.shape
    out = _Packed.empty(b, budget)
    a = out.addr
    rc = cpu._lib().ddtree_cpu_build_trees(
        lp.data_ptr(),
        ids.data_ptr(),
        b,
        h,
        k,
        budget,
        a("tok", 0),
        a("dep", 0),
        a("par", 0),
        out.vis.ctypes.data,
        a("fc", 0),
        a("ns", 0),
        out.base + 8 * out.off["num"],
    )
    if rc != 0:
        raise RuntimeError(f"ddtree_cpu_build_trees: error {rc}")
    return out


def _cuda_fits(h: int, k: int, budget: int) -> bool:
    """Within kernels.cuda's limits (else the C++ builder gives the same answer)."""
    from kernels.cuda import MAX_BUDGET as CUDA_BUDGET
    from kernels.cuda import MAX_DEPTH, MAX_K

    return h <= MAX_DEPTH and k <= MAX_K and budget <= CUDA_BUDGET


def _cuda(lp: torch.Tensor, ids: torch.Tensor, budget: int) -> _Packed:
    """kernels.cuda.build_trees on the current device; the outputs come back in two copies."""
    from kernels import cuda as kc

    dev = torch.device("cuda", torch.cuda.current_device())
    lpt = lp.detach().to(dev, torch.float32).contiguous()
    idt = ids.detach().to(dev, torch.int64).contiguous()
    t = kc.build_trees(lpt, idt, budget)
    ints = torch.cat(
        [
            t.token_ids.view(-1),
            t.depths.view(-1),
            t.parents.view(-1),
            t.first_child.view(-1),
            t.next_sibling.view(-1),
            t.num_nodes,
        ]
    )
    return _Packed(int(lpt.shape[0]), budget, ints.cpu().numpy(), t.visibility.cpu().numpy())


def _ext() -> Any:
    return native.load()


# ----------------------------------------------------------------------------- accept


def _cpp_walk(child_maps: Any, posterior: Any) -> tuple | None:
    """The fork's dict walk in C over the same dicts, or None where the stock must walk."""
    p = posterior
    if (
        type(p) is not _Tensor
        or p.dtype is not _I64
        or p.layout is not _STRIDED
        or not p.is_cpu
        or p.dim() != 1
        or not p.is_contiguous()
        or p.is_neg()
    ):
        return None
    return _ext().walk(child_maps, p.data_ptr(), p.shape[0])


_WALKS: dict[str, Callable[[Any, Any], tuple | None]] = {
    "cpp": _cpp_walk,
    "python": lambda child_maps, posterior: None,  # every call goes to the stock
}


def follow_tree(
    child_maps: Any, posterior: Any, *, backend: str, stock: Callable | None = None
) -> tuple[list[int], Any]:
    """(accepted node indices from 0, next token) by `backend`, else by `stock` (default:
    `integration.fork_style`)."""
    out = _WALKS[backend](child_maps, posterior)
    if out is None:
        return (stock or fork_style.follow_verified_tree)(child_maps, posterior)
    return out


def make_accept(backend: str, stock: Callable | None = None) -> Callable:
    """`follow_verified_tree` on `backend`, with the fork's exact signature; calls the fast
    path does not take go to `stock` (the hook passes the function it replaces)."""
    if backend not in ACCEPT_BACKENDS:
        raise ValueError(f"accept: backend {backend!r} is not one of {ACCEPT_BACKENDS}")
    fast = _WALKS[backend]
    fallback = stock or fork_style.follow_verified_tree

    def follow_verified_tree(child_maps, posterior):
        out = fast(child_maps, posterior)
        return fallback(child_maps, posterior) if out is None else out

    follow_verified_tree.__qualname__ = "follow_verified_tree"
    follow_verified_tree.ddtree_ops_backend = backend  # type: ignore[attr-defined]
    follow_verified_tree.ddtree_ops_stock = fallback  # type: ignore[attr-defined]
    return follow_verified_tree


# ----------------------------------------------------------------------------- checks


def check_backend(component: str, backend: str) -> None:
    """Raise (ValueError, RuntimeError, OSError, ...) unless `backend` can serve `component`."""
    known = TREE_BACKENDS if component == "tree_build" else ACCEPT_BACKENDS
    if backend not in known:
        raise ValueError(f"{component}: backend {backend!r} is not one of {known}")
    if backend in ("cpp", "cuda"):  # compiles on first use (g++) and loads: fail now
        _ext()
    if backend == "cuda":
        from kernels import cuda_core

        cuda_core.library_path()  # $DDTREE_KERNELS_LIB must name a library; nothing loads yet


def make(component: str, backend: str, stock: Callable, passive: Passive = ()) -> Callable:
    """The hook's maker (`integration.hook.COMPONENTS`): the drop-in of `component`
    (`tree_build` or `accept`) on `backend`, `stock` its fallback; raises when `backend` cannot
    run here."""
    check_backend(component, backend)
    if component == "tree_build":
        return make_build(backend, stock, passive)
    return make_accept(backend, stock)
