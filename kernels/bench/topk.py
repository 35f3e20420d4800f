"""Benchmark suite `topk` of `python -m kernels.bench`: the drafter's top-K log-probs.

`topk_logprobs` over bf16 logits [B*H, V], timed per call (`cuda_events`) and replayed from a
CUDA graph (`cuda_graph`, with its bytes and the HBM floor), against plain torch (topk +
logsumexp on the upcast logits).
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import reference as ref
from kernels.bench.common import HBM_BYTES_PER_S, cuda_ops, gen, launches, n_sets
from kernels.bench.config import BenchConfig, Row, row
from kernels.timing import time_cuda, time_graph

__all__ = ["topk_suite"]


def topk_suite(cfg: BenchConfig) -> list[Row]:
    kc, rows, h, v = cuda_ops(), [], cfg.depth, cfg.vocab
    for b in cfg.batches:
        nbytes = b * h * v * 2
        xs = [
            torch.randn(b * h, v, device="cuda", generator=gen(i)).mul_(3).bfloat16()
            for i in range(n_sets(nbytes))
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
            t = time_graph(cuda_fn, len(xs), launches=launches(len(xs)))
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
