"""Benchmark suites topk, tree and accept of `python -m kernels.bench` (listed in its `suites()`).

Each CUDA kernel is timed against the baselines that do the same job: plain torch (topk +
logsumexp on the upcast logits; argmax), the Python/heapq reference (what the live service
runs today) and the compiled C++ baseline, both timed on this host's CPU. The tree suite also
times the engine's whole tree-build stage per backend (`kernels.bench_stage`, kernel
`tree_build_stage`): the speedup a rollout of the tree build can expect, beside the kernel's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kernels import reference as ref
from kernels.bench import BenchConfig, Row, impl_name, row
from kernels.bench_stage import tree_stage_rows
from kernels.timing import summarize, time_cuda, time_graph, time_host

ROTATE_BYTES = 192 << 20  # rotate inputs over at least this much (L2 is 50-60 MB)
HBM_BYTES_PER_S = 4.3e12  # measured device-to-device copy on this workplace's H200


def _n_sets(bytes_per_set: int, lo: int = 2, hi: int = 64) -> int:
    return max(lo, min(hi, math.ceil(ROTATE_BYTES / max(bytes_per_set, 1))))


def _launches(n_sets: int) -> int:
    """Launches per captured graph: every input set at least once (so L2 cannot hold them)."""
    return min(64, max(8, n_sets))


def _kc():
    from kernels import cuda

    return cuda


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _top_inputs(
    b: int, h: int, k: int, seed: int, scale: float = 2.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Realistic top-K: the top k of log_softmax over 4096 random logits per position."""
    x = torch.randn(b, h, max(4096, k), device="cuda", generator=_gen(seed)) * scale
    lp, ids = torch.log_softmax(x, -1).topk(k, dim=-1)
    return lp.contiguous(), ids.contiguous()


def topk_suite(cfg: BenchConfig) -> list[Row]:
    kc, rows, h, v = _kc(), [], cfg.depth, cfg.vocab
    for b in cfg.batches:
        nbytes = b * h * v * 2
        xs = [
            torch.randn(b * h, v, device="cuda", generator=_gen(i)).mul_(3).bfloat16()
            for i in range(_n_sets(nbytes))
        ]
        for k in cfg.ks:
            shape = {"B": b, "H": h, "V": v, "K": k, "dtype": "bf16"}
            out = (
                torch.empty(b * h, k, device="cuda"),
                torch.empty(b * h, k, dtype=torch.int64, device="cuda"),
            )

            def cuda_fn(i: int, k: int = k, out=out, xs=xs) -> None:
                kc.topk_logprobs(xs[i], k, out=out)

            def torch_fn(i: int, k: int = k, xs=xs) -> None:
                f = xs[i].float()
                val, _ = f.topk(k, dim=-1)
                _ = val - f.logsumexp(-1, keepdim=True)

            check = None
            if cfg.refcheck:
                cuda_fn(0)
                rlp, rids = ref.topk_logprobs(xs[0][:8].float().cpu().numpy(), k)
                check = bool(np.array_equal(out[1][:8].cpu().numpy(), rids)) and bool(
                    np.allclose(out[0][:8].cpu().numpy(), rlp, rtol=0, atol=1e-5)
                )
            rows.append(
                row(
                    "topk",
                    "topk_logprobs",
                    "cuda_events",
                    shape,
                    time_cuda(cuda_fn, len(xs), reps=cfg.reps),
                )
            )
            t = time_graph(cuda_fn, len(xs), launches=_launches(len(xs)))
            rows.append(
                row(
                    "topk",
                    "topk_logprobs",
                    "cuda_graph",
                    shape,
                    t,
                    refcheck=check,
                    bytes=nbytes,
                    floor_us=round(nbytes / HBM_BYTES_PER_S * 1e6, 1),
                    gbps=round(nbytes / t.median_us / 1e3, 1),
                )
            )
            tt = time_cuda(torch_fn, len(xs), reps=max(5, cfg.reps // 5))
            rows.append(row("topk", "topk_logprobs", "torch", shape, tt))
        xs.clear()
        torch.cuda.empty_cache()
    return rows


def _cpu_rows(suite: str, kernel: str, shape: dict, cfg: BenchConfig, py_fn, cpp_fn) -> list[Row]:
    out = [
        row(
            suite,
            kernel,
            "cpu_python",
            shape,
            time_host(py_fn, reps=3 if cfg.quick else 10, warmup=1),
        )
    ]
    if cpp_fn is not None:
        out.append(row(suite, kernel, "cpu_cpp", shape, cpp_fn()))
    return out


def _cpp():
    try:
        from kernels import cpu
    except ImportError:
        return None
    return cpu


def tree_suite(cfg: BenchConfig) -> list[Row]:
    kc, cpu, rows, h = _kc(), _cpp(), [], cfg.depth
    for b in cfg.batches:
        for budget in cfg.budgets:
            for k in cfg.ks:
                shape = {"B": b, "H": h, "K": k, "budget": budget, "scale": cfg.tree_scale}
                sets = [_top_inputs(b, h, k, 100 * i + k, cfg.tree_scale) for i in range(8)]
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
                        )  # fmt: skip
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

                rows += _cpu_rows(
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
    kc, cpu, rows, h, v, k = _kc(), _cpp(), [], cfg.depth, cfg.vocab, 8
    for b in cfg.batches:
        for budget in cfg.budgets:
            lp, ids = _top_inputs(b, h, k, seed=7)
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
            rows += _cpu_rows(
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
    for i in range(_n_sets(nbytes)):
        x = torch.randn(b, budget + 1, v, device="cuda", generator=_gen(i)).mul_(3)
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
    t = time_graph(fn, len(xs), launches=_launches(len(xs)))
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
