"""Benchmark suite `tree` of `python -m kernels.bench`: the DDTree build.

`build_trees` per `--variants` algorithm (`cuda_graph`, `cuda_events`) against the
Python/heapq reference and the C++ baseline on this host's CPU; then the engine's whole
tree-build stage per backend (`kernels.bench.stage`, kernel `tree_build_stage`): the speedup a
rollout of the tree build can expect, beside the kernel's.
"""

from __future__ import annotations

import numpy as np

from kernels import reference as ref
from kernels.bench.common import cpp_ops, cpu_rows, cuda_ops, top_inputs
from kernels.bench.config import BenchConfig, Row, impl_name, row
from kernels.bench.stage import tree_stage_rows
from kernels.timing import summarize, time_cuda, time_graph

__all__ = ["tree_suite"]


def tree_suite(cfg: BenchConfig) -> list[Row]:
    kc, cpu, rows, h = cuda_ops(), cpp_ops(), [], cfg.depth
    for b in cfg.batches:
        for budget in cfg.budgets:
            for k in cfg.ks:
                shape = {"B": b, "H": h, "K": k, "budget": budget, "scale": cfg.tree_scale}
                sets = [top_inputs(b, h, k, 100 * i + k, cfg.tree_scale) for i in range(8)]
                out = kc.CudaTrees.empty(b, budget, "cuda")
                lp_np, ids_np = (t.cpu().numpy() for t in sets[0])
                want = ref.build_trees(lp_np, ids_np, budget) if cfg.refcheck else None
                for algo in [v for v in cfg.variants if v in kc.TREE_ALGOS] or ["auto"]:

                    def fn(i: int, budget=budget, out=out, sets=sets, algo=algo) -> None:
                        kc.build_trees(sets[i][0], sets[i][1], budget, out=out, algo=algo)

                    check = None
                    if want is not None and algo != "levels":  # levels alone may decline
                        fn(0)
                        check = all(
                            np.array_equal(getattr(out, f).cpu().numpy(), getattr(want, f))
                            for f in out._fields
                        )
                    graph = time_graph(fn, len(sets))
                    rows.append(
                        row(
                            "tree",
                            "build_trees",
                            impl_name("cuda_graph", algo),
                            shape,
                            graph,
                            refcheck=check,
                        )
                    )
                    events = time_cuda(fn, len(sets), reps=cfg.reps)
                    rows.append(
                        row("tree", "build_trees", impl_name("cuda_events", algo), shape, events)
                    )

                def cpp_time(lp_np=lp_np, ids_np=ids_np, budget=budget):
                    s = cpu.time_build_trees_cpp(
                        lp_np, ids_np, budget, reps=50 if cfg.quick else 200
                    )
                    return summarize(np.asarray(s) * 1e6, "host")

                rows += cpu_rows(
                    "tree",
                    "build_trees",
                    shape,
                    cfg,
                    lambda i, lp_np=lp_np, ids_np=ids_np, budget=budget: ref.build_trees(
                        lp_np, ids_np, budget
                    ),
                    cpp_time if cpu is not None else None,
                )
    return rows + tree_stage_rows(cfg, "cuda")  # the engine's whole stage, beside the kernel
