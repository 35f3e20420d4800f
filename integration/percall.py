"""Per-call cost of the fork's tree builder beside the drop-in, in the caller's shape.

`measure()` times `build_ddtree_tree_from_topk` as the fork's worker calls it (one request, H =
K = budget, float32 log-probs and int64 ids on the CPU) by the fork-style builder
(`integration.fork_style`: the fork's algorithm and data structures in plain Python; also the
real fork's function when this interpreter has one that is not replaced) and by the `cpp`
drop-in (`integration.sglang_dropins`), on the same inputs, calls interleaved so both see the
same machine, and checks the answers are the same. Wall clock per call (perf_counter), GC on, as
in the service: what the caller waits for. Also the accept walk on the path to the deepest
node. One run, one JSON document:

    python -m integration.percall [--budgets 16,64,128] [--reps 400] [--hook]

`hook_costs()` (the document's `hook`; `--hook`: that alone) measures what the import hook's
stage clock adds to a call (`integration.counters.timed`: a no-op function and the `cpp`
drop-in, each bare and counted, in interleaved rounds; the target is under 1 us) and what a
shadow adds to a sampled call (`integration.shadow.shadowed`: the fork-style builder serving,
the `cpp` drop-in beside it, with its copies and the comparison).

Each row has the medians and quartiles in us, the speedup (fork-style / drop-in) and the
issue's target for it (>= 4x at budget < 64, >= 10x at 64 and above). A bench suite can call
`measure()` and take the rows.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from integration import fork_style, sglang_dropins

MODULE = "sglang.srt.speculative.dflash_ddtree_utils"
TARGETS = {16: 4.0}  # budget -> minimum speedup; 10x elsewhere (issue 40)


def target(budget: int) -> float:
    return TARGETS.get(budget, 4.0 if budget < 64 else 10.0)


def inputs(budget: int, seed: int, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's drafter top-K in the caller's shape: [budget, budget] float32 / int64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(budget, max(4096, budget), generator=g) * scale
    lp, ids = torch.log_softmax(x, -1).topk(budget, dim=-1)
    return lp.contiguous(), ids.contiguous()


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, torch.Tensor):
        return type(a) is torch.Tensor and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _real_fork() -> Callable | None:
    """The fork's own builder if this interpreter has it and it is not replaced."""
    try:
        mod = __import__(MODULE, fromlist=["build_ddtree_tree_from_topk"])
    except Exception:
        return None
    fn = getattr(mod, "build_ddtree_tree_from_topk", None)
    return None if fn is None or hasattr(fn, "ddtree_ops_backend") else fn


def _interleaved(fns: dict[str, Callable[[int], Any]], reps: int, inner: dict[str, int]) -> dict:
    """Per-call seconds of each fn, one rep of every fn after the other (`inner[name]` calls of
    that fn per rep), after two warm-up rounds."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter
    for r in range(reps + 2):
        for name, fn in fns.items():
            for j in range(inner.get(name, 1)):
                t0 = clock()
                fn(r + j)
                t1 = clock()
                if r >= 2:
                    samples[name].append(t1 - t0)
    return samples


def _stats(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4)
    return {
        "median_us": round(statistics.median(xs) * 1e6, 2),
        "p25_us": round(q[0] * 1e6, 2),
        "p75_us": round(q[2] * 1e6, 2),
        "calls": len(xs),
    }


def _deepest(tree: tuple) -> torch.Tensor:
    """The target's argmax row [1 + n] that accepts the path to the deepest node."""
    tokens, depths, parents = tree[0], tree[1], tree[2]
    post = torch.full((len(parents),), -7, dtype=torch.long)
    node = 1 + int(torch.argmax(depths)) if len(tokens) else 0
    while node > 0:
        post[parents[node]] = tokens[node - 1]
        node = parents[node]
    return post


def measure(
    budgets: tuple[int, ...] = (16, 64, 128),
    *,
    reps: int = 400,
    sets: int = 8,
    seed: int = 0,
    scale: float = 3.0,
) -> dict[str, Any]:
    """The rows (builder and walk per budget) and the environment they were measured in."""
    real = _real_fork()
    rows = []
    for budget in budgets:
        data = [inputs(budget, seed + 1000 * budget + i, scale) for i in range(sets)]
        shape = {"B": 1, "H": budget, "K": budget, "budget": budget, "scale": scale}
        build_row, trees = _build_row(data, budget, reps, real)
        rows += [{**build_row, "shape": shape}, {**_walk_row(trees, reps), "shape": shape}]
    return {
        "suite": "integration",
        "what": "per-call wall time in the caller's shape; fork_style = the fork's algorithm "
        "the fork's way in Python (integration.fork_style), dropin_cpp = the hook's tree_build=cpp",
        "rows": rows,
        "ok": all(r.get("meets_target", True) and r["refcheck"] for r in rows),
        "env": _env(real is not None),
    }


def _build_row(data: list, budget: int, reps: int, real: Callable | None) -> tuple[dict, list]:
    fork = fork_style.build_ddtree_tree_from_topk
    builders = {"fork_style": fork, "dropin_cpp": sglang_dropins.make_build("cpp", fork)}
    if real is not None:
        builders["sglang"] = real
    want = [fork(lp, ids, budget) for lp, ids in data]
    check = all(
        _same(fn(lp, ids, budget), w)
        for fn in builders.values()
        for (lp, ids), w in zip(data, want, strict=True)
    )
    n = len(data)
    calls = {name: (lambda i, fn=fn: fn(*data[i % n], budget)) for name, fn in builders.items()}
    stats = {k: _stats(v) for k, v in _interleaved(calls, reps, {"dropin_cpp": 4}).items()}
    speedup = stats["fork_style"]["median_us"] / stats["dropin_cpp"]["median_us"]
    row = {
        "kernel": "build_ddtree_tree_from_topk",
        "refcheck": check,
        "impls": stats,
        "speedup": round(speedup, 2),
        "target": target(budget),
        "meets_target": bool(check and speedup >= target(budget)),
    }
    return row, want


def _walk_row(trees: list, reps: int) -> dict:
    """follow_verified_tree on the path to each tree's deepest node (the longest walk)."""
    fork = fork_style.follow_verified_tree
    walk = sglang_dropins.make_accept("cpp", fork)
    posts = [_deepest(t) for t in trees]
    check = all(walk(t[3], p) == fork(t[3], p) for t, p in zip(trees, posts, strict=True))
    n = len(trees)
    calls = {
        "fork_style": lambda i: fork(trees[i % n][3], posts[i % n]),
        "dropin_cpp": lambda i: walk(trees[i % n][3], posts[i % n]),
    }
    stats = {k: _stats(v) for k, v in _interleaved(calls, reps, {}).items()}
    depth = max(len(fork(t[3], p)[0]) - 1 for t, p in zip(trees, posts, strict=True))
    speedup = stats["fork_style"]["median_us"] / stats["dropin_cpp"]["median_us"]
    return {
        "kernel": "follow_verified_tree",
        "refcheck": check,
        "impls": stats,
        "speedup": round(speedup, 2),
        "accepted_depth": depth,
    }


COUNT_TARGET_NS = 1000  # the stage clock's cost per call, at most (issue 40)


def _per_call_ns(fns: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Median over `rounds` interleaved rounds of each fn's ns per call (`calls` calls a round)."""
    got: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter_ns
    for r in range(rounds + 1):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            if r:  # the first round warms up
                got[name].append((clock() - t0) / calls)
    return {name: statistics.median(v) for name, v in got.items()}


def hook_costs(
    *,
    calls: int = 20000,
    rounds: int = 15,
    budgets: tuple[int, ...] = (16, 64, 128),
    shadow_reps: int = 200,
) -> dict[str, Any]:
    """What the hook's counting adds per call, and a shadow per sampled call (module doc)."""
    from integration import counters, shadow

    with tempfile.TemporaryDirectory(prefix="ddtree-percall-") as tmp:
        clock = counters.Counters(Path(tmp))

        def noop(a: Any, b: Any, c: Any) -> Any:
            return a

        counted = counters.timed(noop, clock, "tree_build")
        lp, ids = inputs(16, 7)
        dropin = sglang_dropins.make_build("cpp", fork_style.build_ddtree_tree_from_topk)
        dropin_counted = counters.timed(dropin, clock, "accept")
        ns = _per_call_ns(
            {"noop": lambda: noop(1, 2, 3), "noop_counted": lambda: counted(1, 2, 3)},
            calls,
            rounds,
        )
        ns.update(
            _per_call_ns(
                {
                    "dropin": lambda: dropin(lp, ids, 16),
                    "dropin_counted": lambda: dropin_counted(lp, ids, 16),
                },
                max(calls // 20, 50),
                rounds,
            )
        )
        count = {
            "noop_ns": round(ns["noop"], 1),
            "noop_counted_ns": round(ns["noop_counted"], 1),
            "overhead_ns": round(ns["noop_counted"] - ns["noop"], 1),
            "dropin_cpp_b16_us": round(ns["dropin"] / 1e3, 3),
            "dropin_cpp_b16_counted_us": round(ns["dropin_counted"] / 1e3, 3),
            "overhead_on_dropin_ns": round(ns["dropin_counted"] - ns["dropin"], 1),
            "calls": calls,
            "rounds": rounds,
            "target_ns": COUNT_TARGET_NS,
        }
        count["meets_target"] = count["overhead_ns"] < COUNT_TARGET_NS
        rows = []
        stock = fork_style.build_ddtree_tree_from_topk
        for budget in budgets:
            data = [inputs(budget, 100 + i) for i in range(8)]
            cand = sglang_dropins.make_build("cpp", stock)
            shadowed = shadow.shadowed(stock, cand, clock, "tree_build", 1, lambda *a: None)
            calls_ = {
                "stock": lambda i, d=data, b=budget: stock(*d[i % 8], b),
                "shadowed": lambda i, d=data, b=budget, f=shadowed: f(*d[i % 8], b),
            }
            st = {k: _stats(v) for k, v in _interleaved(calls_, shadow_reps, {}).items()}
            rows.append(
                {
                    "budget": budget,
                    "stock_us": st["stock"]["median_us"],
                    "shadowed_us": st["shadowed"]["median_us"],
                    "added_us": round(st["shadowed"]["median_us"] - st["stock"]["median_us"], 2),
                    "candidate": "cpp",
                    "stock": "fork_style",
                    "every": 1,
                }
            )
    return {
        "what": "the import hook's stage clock: ns added per call by counting "
        "(integration.counters.timed), and us added per sampled call by a shadow "
        "(integration.shadow.shadowed: the candidate, its input copies, the comparison)",
        "count": count,
        "shadow": rows,
        "ok": count["meets_target"],
    }


def _env(real: bool) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gc": gc.isenabled(),
        "real_fork_timed": real,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.percall", description=__doc__)
    ap.add_argument("--budgets", default="16,64,128", help="comma-separated (default 16,64,128)")
    ap.add_argument("--reps", type=int, default=400, help="fork calls per budget (default 400)")
    ap.add_argument("--json", action="store_true", help="one JSON document (always)")
    ap.add_argument("--hook", action="store_true", help="only the hook's counting and shadow")
    args = ap.parse_args(argv)
    if args.hook:
        doc = {**hook_costs(), "env": _env(False)}
        print(json.dumps(doc))
        return 0 if doc["ok"] else 1
    try:
        budgets = tuple(int(b) for b in args.budgets.split(","))
        if not budgets or min(budgets) < 1 or args.reps < 4:
            raise ValueError
    except ValueError:
        print(json.dumps({"ok": False, "error": f"bad --budgets {args.budgets!r} / --reps"}))
        return 2
    doc = measure(budgets, reps=args.reps)
    doc["hook"] = hook_costs()
    doc["ok"] = doc["ok"] and doc["hook"]["ok"]
    print(json.dumps(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
