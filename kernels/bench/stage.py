"""The tree suite's `tree_build_stage` rows: the reference engine's tree-build stage, per backend.

The kernel rows (`build_trees`: cuda_events vs cpu_python) give the kernel's speedup. What a
rollout changes is the engine's stage: the same call the engine makes (`kernels.tree_stage`),
on lp / ids as its topk backend hands them, boundary copies included:
- `reference_stage`: `kernels.tree_stage.reference_stage` (= `kernels.reference.build_trees`,
  the engine's reference backend) on the CUDA topk's tensors, so it pays their copy to the host;
- `cuda_stage`: a `kernels.tree_stage.CudaTreeStage` (the engine's CUDA backend, its buffers
  kept per shape as in the engine): upload (a no-op for tensors already there), the kernel, one
  copy of every tree field back to numpy;
- `reference_stage_to_device`: `kernels.tree_stage.reference_stage_to_device`, the reference
  stage as the engine runs it when its accept is CUDA: `reference_stage`, then the trees'
  upload for the accept (one host-to-device copy, kept as `device_copy`). It is the baseline
  of a tree-build rollout on a service whose accept runs on CUDA (`ops.verdict.amdahl`).
Shape: B = each `--batch`; H, K, budget = `--stage-shape` (the engine's `small` preset: draft_len
7, K = 16, budget 16). Each sample is wall clock (perf_counter) with the device synchronised
before and after, as the engine's `lap` times its stages; on CUDA the three stages' samples
are taken in turn (`kernels.timing.interleave`, rows marked `interleaved`). Median and IQR as
every row; the cuda_stage row carries the speedup over each of the other two
(`kernels.bench.report.add_speedups`: {"reference_stage": x, "reference_stage_to_device": y})
and a refcheck against reference_stage's trees; the reference_stage_to_device row carries a refcheck
against cuda_stage (the same trees, and a `device_copy` equal to cuda_stage's field by field).
`device="cpu"` times the reference stage alone on the reference topk's numpy arrays (what a CPU
engine hands it): there is no CUDA side to time, so no CUDA row and no upload row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kernels import reference as ref
from kernels import tree_stage
from kernels.bench.config import BenchConfig, Row, row
from kernels.timing import Timing, interleave, summarize

N_SETS = 8  # input sets rotated over, as the engine's every step brings new ones
VOCAB = 4096  # logits behind each drafted position (only the top K reach the stage)
STAGE_NOTE = "the engine's stage: same call, boundary copies included, synchronised wall clock"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def lap_sampler(fn: Callable[[int], Any], n_inputs: int, device: str, warmup: int = 3):
    """A stage's sampler, warmed up here: per call, synchronise, perf_counter, one call,
    synchronise, perf_counter (the engine's lap); returns microseconds."""
    for i in range(warmup):
        fn(i % n_inputs)

    def sample(i: int) -> float:
        _sync(device)
        t0 = time.perf_counter()
        fn(i % n_inputs)
        _sync(device)
        return (time.perf_counter() - t0) * 1e6

    return sample


def time_stage(
    fn: Callable[[int], Any], n_inputs: int, device: str, warmup: int = 3, reps: int = 20
) -> Timing:
    """One stage alone: `reps` laps."""
    sample = lap_sampler(fn, n_inputs, device, warmup)
    return summarize([sample(i) for i in range(reps)], "host")


def stage_inputs(b: int, h: int, k: int, scale: float, device: str, seed: int) -> tuple[Any, Any]:
    """lp / ids as the engine's topk backend returns them: the CUDA topk's float32 / int64
    tensors on `device`, or the reference topk's numpy arrays on "cpu"."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(b, h, VOCAB, device=device, generator=gen) * scale
    if device == "cpu":
        return ref.topk_logprobs(x.numpy(), k)
    from kernels import cuda

    return cuda.topk_logprobs(x, k)


def _same_trees(a: ref.BatchedTrees, b: ref.BatchedTrees) -> bool:
    return all(
        np.array_equal(getattr(a, f), getattr(b, f)) and getattr(a, f).dtype == getattr(b, f).dtype
        for f in (
            "token_ids",
            "depths",
            "parents",
            "visibility",
            "first_child",
            "next_sibling",
            "num_nodes",
        )
    )


def _same_device_copy(a: ref.BatchedTrees, b: ref.BatchedTrees) -> bool:
    """Both trees carry a `device_copy` whose every field equals the other's (dtype included)."""
    da, db = getattr(a, "device_copy", None), getattr(b, "device_copy", None)
    if da is None or db is None:
        return False
    return all(
        x.dtype == y.dtype and x.device == y.device and torch.equal(x, y)
        for x, y in zip(da, db, strict=True)
    )


def tree_stage_rows(cfg: BenchConfig, device: str = "cuda") -> list[Row]:
    """reference_stage (and, on a CUDA `device`, cuda_stage and reference_stage_to_device) rows
    at each batch of `cfg`."""
    h, k, budget = cfg.stage_shape
    rows: list[Row] = []
    for b in cfg.batches:
        shape = {
            "B": b,
            "H": h,
            "K": k,
            "budget": budget,
            "scale": cfg.tree_scale,
            "inputs": "cuda" if device.startswith("cuda") else "numpy",
        }
        sets = [stage_inputs(b, h, k, cfg.tree_scale, device, 1000 * b + i) for i in range(N_SETS)]

        def ref_fn(i: int, sets=sets) -> ref.BatchedTrees:
            return tree_stage.reference_stage(sets[i][0], sets[i][1], budget)

        ref_reps = 5 if cfg.quick else 20
        if not device.startswith("cuda"):
            t = time_stage(ref_fn, N_SETS, device, warmup=1, reps=ref_reps)
            rows.append(
                row("tree", "tree_build_stage", "reference_stage", shape, t, note=STAGE_NOTE)
            )
            continue

        stage = tree_stage.CudaTreeStage(device)  # as the engine binds it: buffers kept

        def cuda_fn(i: int, sets=sets, stage=stage) -> ref.BatchedTrees:
            return stage(sets[i][0], sets[i][1], budget)

        def upload_fn(i: int, sets=sets) -> ref.BatchedTrees:
            return tree_stage.reference_stage_to_device(sets[i][0], sets[i][1], budget, device)

        checks: dict[str, bool | None] = {"reference_stage": None}
        if cfg.refcheck:
            checks["cuda_stage"] = _same_trees(cuda_fn(0), ref_fn(0))
            got, want = upload_fn(0), cuda_fn(0)
            checks["reference_stage_to_device"] = _same_trees(got, want) and _same_device_copy(
                got, want
            )
        # the three stages sampled in turn (A B C C B A ...): a slow spell of the host weighs
        # on each alike, so their ratios (what a rollout projects with) hold through it
        fns = {
            "reference_stage": ref_fn,
            "cuda_stage": cuda_fn,
            "reference_stage_to_device": upload_fn,
        }
        samplers = {name: lap_sampler(f, N_SETS, device, warmup=1) for name, f in fns.items()}
        laps = interleave(samplers, reps=10 if cfg.quick else max(cfg.reps, 20))  # per stage
        for name in fns:
            extra = {} if name == "reference_stage" else {"refcheck": checks.get(name)}
            rows.append(
                row(
                    "tree",
                    "tree_build_stage",
                    name,
                    shape,
                    summarize(laps[name], "host"),
                    note=STAGE_NOTE,
                    interleaved=True,
                    **extra,
                )
            )
    return rows
