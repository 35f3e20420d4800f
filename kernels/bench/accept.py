"""Benchmark suite `accept` of `python -m kernels.bench`: the greedy walk of a verified tree.

`greedy_accept` on target ids that accept the path to each request's deepest node (the worst
case), and `greedy_accept_from_logits` (argmax of the path's rows, then the walk) against
torch's argmax of every row; the CPU rows as in `kernels.bench.common`.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import reference as ref
from kernels.bench.common import (
    HBM_BYTES_PER_S,
    cpp_ops,
    cpu_rows,
    cuda_ops,
    gen,
    launches,
    n_sets,
    top_inputs,
)
from kernels.bench.config import BenchConfig, Row, row
from kernels.timing import time_cuda, time_graph, time_host

__all__ = ["accept_suite"]


def _deep_targets(trees: ref.BatchedTrees, vocab: int, seed: int) -> np.ndarray:
    """Target ids that accept the path to each request's deepest node (the worst case)."""
    rng = np.random.default_rng(seed)
    b, budget = trees.token_ids.shape
    tg = rng.integers(0, vocab, size=(b, budget + 1))
    for i in range(b):
        n = int(trees.num_nodes[i])
        if n == 0:
            continue
        node = 1 + int(np.argmax(trees.depths[i, :n]))
        while node > 0:
            parent = int(trees.parents[i, node])
            tg[i, parent] = trees.token_ids[i, node - 1]
            node = parent
    return tg


def accept_suite(cfg: BenchConfig) -> list[Row]:
    kc, cpu, rows, h, v, k = cuda_ops(), cpp_ops(), [], cfg.depth, cfg.vocab, 8
    for b in cfg.batches:
        for budget in cfg.budgets:
            lp, ids = top_inputs(b, h, k, seed=7)
            ids = ids % v
            trees = kc.build_trees(lp, ids, budget)
            rt = ref.build_trees(lp.cpu().numpy(), ids.cpu().numpy(), budget)
            tg_np = _deep_targets(rt, v, seed=b + budget)
            tg = torch.from_numpy(tg_np).cuda()
            want = ref.greedy_accept_batch(rt, tg_np, h)
            shape = {"B": b, "H": h, "budget": budget, "path": "deepest"}
            out = tuple(
                torch.empty(s, dtype=torch.int64, device="cuda") for s in [(b, h + 1), (b,), (b,)]
            )

            def fn(i: int, out=out, trees=trees, tg=tg) -> None:
                kc.greedy_accept(trees, tg, h, out=out)

            fn(0)
            check = all(np.array_equal(o.cpu().numpy(), w) for o, w in zip(out, want, strict=True))
            rows.append(
                row("accept", "greedy_accept", "cuda_graph", shape, time_graph(fn), refcheck=check)
            )
            rows.append(
                row("accept", "greedy_accept", "cuda_events", shape, time_cuda(fn, reps=cfg.reps))
            )
            rows += cpu_rows(
                "accept",
                "greedy_accept",
                shape,
                cfg,
                lambda i, rt=rt, tg_np=tg_np: ref.greedy_accept_batch(rt, tg_np, h),
                (
                    lambda rt=rt, tg_np=tg_np: time_host(
                        lambda i: cpu.greedy_accept_cpp(rt, tg_np, h), reps=50
                    )
                )
                if cpu is not None
                else None,
            )
            rows += _accept_logits_rows(cfg, kc, trees, rt, tg_np, b, budget)
    return rows


def _accept_logits_rows(cfg, kc, trees, rt, tg_np, b: int, budget: int) -> list[Row]:
    h, v = cfg.depth, cfg.vocab
    nbytes = b * (budget + 1) * v * 2
    idx = torch.from_numpy(tg_np).cuda()[..., None]
    xs = []
    for i in range(n_sets(nbytes)):
        x = torch.randn(b, budget + 1, v, device="cuda", generator=gen(i)).mul_(3)
        xs.append(x.scatter_(2, idx, 30.0).bfloat16())  # argmax = the planted deep path
    want = ref.greedy_accept_batch(rt, tg_np, h)
    path_rows = int(want[1].sum())
    shape = {"B": b, "H": h, "budget": budget, "V": v, "dtype": "bf16", "path": "deepest"}
    out = tuple(torch.empty(s, dtype=torch.int64, device="cuda") for s in [(b, h + 1), (b,), (b,)])

    def fn(i: int) -> None:
        kc.greedy_accept_from_logits(trees, xs[i], h, out=out)

    fn(0)
    check = all(np.array_equal(o.cpu().numpy(), w) for o, w in zip(out, want, strict=True))
    rows = [
        row(
            "accept",
            "greedy_accept_from_logits",
            "cuda_events",
            shape,
            time_cuda(fn, len(xs), reps=cfg.reps),
        )
    ]
    t = time_graph(fn, len(xs), launches=launches(len(xs)))
    read = path_rows * v * 2
    rows += [
        row(
            "accept",
            "greedy_accept_from_logits",
            "cuda_graph",
            shape,
            t,
            refcheck=check,
            rows_read=path_rows,
            bytes_read=read,
            gbps=round(read / t.median_us / 1e3, 1),
            all_rows_floor_us=round(nbytes / HBM_BYTES_PER_S * 1e6, 1),
        )
    ]
    tt = time_cuda(lambda i: xs[i].argmax(-1), len(xs), reps=max(5, cfg.reps // 5))
    rows.append(
        row(
            "accept",
            "greedy_accept_from_logits",
            "torch_argmax",
            shape,
            tt,
            note="argmax of all rows only; the walk is not included",
        )
    )
    xs.clear()
    torch.cuda.empty_cache()
    return rows
