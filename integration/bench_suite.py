"""The `integration` bench suite: the SGLang fork's DDTree calls as the service makes them.

One request per call, CPU tensors in, the fork's 7-tuple out (`integration.sglang_dropins`):
`build_ddtree_tree_from_topk` by the stock-style Python builder (`cpu_python`: heapq, the
contract in plain Python), by the real fork's function when this host's `sglang` has it
(`cpu_sglang_stock`), by our drop-in on the C++ builder (`cpu_cpp`) and on the CUDA builder
(`cuda_dropin`: upload, launch, download, per request; only where a GPU is visible), at each
budget and K; `follow_verified_tree` (stock dict walk vs the C++ walk) on the path to the
deepest node; and, for each batch size B > 1 of the config, `build_ddtree_trees` (B requests
handed at once: one builder call, B 7-tuples back). Wall-clock host time per call (the service
waits for all of it). Every row checks its answers against the stock-style builder's
(`refcheck`). `python -m kernels.bench --json --suite integration`.

It lives beside the drop-ins it measures; `kernels.bench.registry` names it. The service never
imports it (the hook's path is stdlib and the kernels' C ABI): only the bench does, with torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from integration import sglang_dropins as dropins
from kernels.bench.config import BenchConfig, Row, row
from kernels.timing import time_host

SUITE = "integration"
STOCK_MODULE = "sglang.srt.speculative.dflash_ddtree_utils"
N_SETS = 8


def _inputs(h: int, k: int, seed: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's drafter top-K [H, K] (float32 log-probs, int64 ids), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(h, max(4096, k), generator=g) * scale
    lp, ids = torch.log_softmax(x, -1).topk(k, dim=-1)
    return lp.contiguous(), ids.contiguous()


def _deepest_posterior(tree: tuple, seed: int) -> torch.Tensor:
    """Target tokens [n+1] that accept the path to the deepest node (the longest walk)."""
    tokens, depths, parents = tree[0], tree[1], tree[2]
    post = torch.randint(0, 163840, (len(parents),), generator=torch.Generator().manual_seed(seed))
    if len(tokens):
        node = 1 + int(torch.argmax(depths))
        while node > 0:
            post[parents[node]] = tokens[node - 1]
            node = parents[node]
    return post


def same(a: Any, b: Any) -> bool:
    """Equal as the contract compares: tensors by dtype, shape and value; the rest by ==."""
    if isinstance(a, tuple | list) and not isinstance(a, dict):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _real_stock() -> tuple[Callable | None, str]:
    """The fork's own builder if this host's sglang has it (and it is not ours), else a note."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return None, "no sglang on this host"
    try:
        mod = __import__(STOCK_MODULE, fromlist=["build_ddtree_tree_from_topk"])
        fn = mod.build_ddtree_tree_from_topk
    except Exception as exc:
        return None, f"{STOCK_MODULE}: {type(exc).__name__}: {exc}"
    if hasattr(fn, "ddtree_ops_backend"):
        return None, "the fork's builder is already replaced by the hook in this process"
    return fn, STOCK_MODULE


def _builders(cfg: BenchConfig) -> dict[str, Callable]:
    out: dict[str, Callable] = {"cpu_python": dropins.make_build("python")}
    real, why = _real_stock()
    if real is not None:
        out["cpu_sglang_stock"] = real
    else:
        print(f"note: integration suite: no cpu_sglang_stock row ({why})", file=sys.stderr)
    out["cpu_cpp"] = dropins.make_build("cpp")
    if torch.cuda.is_available():
        try:
            dropins.check_backend("tree_build", "cuda")
            out["cuda_dropin"] = dropins.make_build("cuda")
        except Exception as exc:
            print(f"note: integration suite: no cuda_dropin row ({exc})", file=sys.stderr)
    return out


def _reps(impl: str, cfg: BenchConfig) -> int:
    slow = impl.startswith("cpu_python") or impl == "cpu_sglang_stock"
    return (10 if cfg.quick else 40) if slow else (50 if cfg.quick else 300)


def integration_suite(cfg: BenchConfig) -> list[Row]:
    rows: list[Row] = []
    builders = _builders(cfg)
    walks = {"cpu_python": dropins.make_accept("python"), "cpu_cpp": dropins.make_accept("cpp")}
    for budget in cfg.budgets:
        for k in cfg.ks:
            shape = {"B": 1, "H": cfg.depth, "K": k, "budget": budget, "scale": cfg.tree_scale}
            seeds = [1000 * budget + 10 * k + i for i in range(N_SETS)]
            sets = [_inputs(cfg.depth, k, s, cfg.tree_scale) for s in seeds]
            want = [builders["cpu_python"](lp, ids, budget) for lp, ids in sets]
            rows += _build_rows(cfg, shape, sets, want, budget, builders)
            rows += _walk_rows(cfg, shape, sets, want, budget, walks)
            for b in (b for b in cfg.batches if b > 1):
                rows += _batch_rows(cfg, {**shape, "B": b}, b, budget, builders)
    return rows


def _batch_rows(cfg, shape, b: int, budget: int, builders: dict[str, Callable]) -> list[Row]:
    """`build_ddtree_trees`: a caller that hands B requests at once (one builder call)."""
    k, h = shape["K"], shape["H"]
    seeds = [7 + 1000 * budget + 10 * k + 100000 * i for i in range(b)]
    reqs = [_inputs(h, k, s, cfg.tree_scale) for s in seeds]
    lp, ids = torch.stack([r[0] for r in reqs]), torch.stack([r[1] for r in reqs])
    want = dropins.build_ddtree_trees(lp, ids, budget, backend="python")
    impls = {"cpu_python": "python", "cpu_cpp": "cpp"}
    if "cuda_dropin" in builders:
        impls["cuda_dropin"] = "cuda"
    rows = []
    for impl, backend in impls.items():
        fn = lambda i, backend=backend: dropins.build_ddtree_trees(lp, ids, budget, backend=backend)  # noqa: E731
        check = same(fn(0), want)
        reps = max(3, _reps(impl, cfg) // (8 if impl == "cpu_python" else 4))
        t = time_host(fn, 1, reps=reps)
        extra = {"refcheck": check, "per_request_us": round(t.median_us / b, 2)}
        rows.append(row(SUITE, "build_ddtree_trees", impl, shape, t, **extra))
    return rows


def _build_rows(cfg, shape, sets, want, budget: int, builders: dict[str, Callable]) -> list[Row]:
    rows, base = [], None
    for impl, fn in builders.items():
        check = all(same(fn(lp, ids, budget), w) for (lp, ids), w in zip(sets, want, strict=True))
        t = time_host(lambda i, fn=fn: fn(*sets[i], budget), N_SETS, reps=_reps(impl, cfg))
        extra: dict[str, Any] = {"refcheck": check}
        if impl == "cpu_python":
            base = t.median_us
            extra["note"] = "plain heapq implementation of the fork's contract"
        elif impl == "cpu_cpp" and base:
            extra["speedup"] = {"cpu_python": round(base / t.median_us, 2)}
        rows.append(row(SUITE, "build_ddtree_tree_from_topk", impl, shape, t, **extra))
    return rows


def _walk_rows(cfg, shape, sets, want, budget: int, walks: dict[str, Callable]) -> list[Row]:
    """follow_verified_tree on our trees (ChildMaps: the C++ walk reads their arrays)."""
    ours = [dropins.build_tree(lp, ids, budget, backend="cpp") for lp, ids in sets]
    posts = [_deepest_posterior(w, seed=i) for i, w in enumerate(want)]
    expect = [walks["cpu_python"](w[3], p) for w, p in zip(want, posts, strict=True)]
    depth = max(len(e[0]) - 1 for e in expect)
    rows, base = [], None
    for impl, fn in walks.items():
        check = all(fn(o[3], p) == e for o, p, e in zip(ours, posts, expect, strict=True))
        t = time_host(lambda i, fn=fn: fn(ours[i][3], posts[i]), N_SETS, reps=_reps("cpu_cpp", cfg))
        extra: dict[str, Any] = {"refcheck": check, "path": "deepest", "accepted_depth": depth}
        if impl == "cpu_python":
            base = t.median_us
        elif base:
            extra["speedup"] = {"cpu_python": round(base / t.median_us, 2)}
        rows.append(row(SUITE, "follow_verified_tree", impl, shape, t, **extra))
    return rows
