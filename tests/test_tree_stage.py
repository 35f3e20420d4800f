"""The engine's tree-build stage (`kernels.tree_stage`) and its bench rows (`tree_build_stage`).

The engine binds the very functions the bench times (identity, not copies); the reference
stage's rows run on the CPU with the row schema; on a GPU the CUDA stage builds the same trees
as the reference stage from the CUDA topk's tensors, and `python -m kernels.bench --suite tree`
carries the three stage rows (reference, CUDA, reference with its trees' upload for a CUDA
accept) with the speedups beside the kernel's rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.backends import DEFAULTS, make_backends
from engine.config import preset
from kernels import reference, tree_stage
from kernels.bench import BenchConfig, add_speedups, main
from kernels.bench import stage as bench_stage

TIMING_KEYS = {"median_us", "p25_us", "p75_us", "iqr_us", "reps", "mode", "launches_per_sample"}
TREE_FIELDS = reference.BatchedTrees.__dataclass_fields__.keys()
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")


def _check_row(r: dict, impl: str, b: int, shape: tuple[int, int, int], inputs: str) -> None:
    h, k, budget = shape
    assert {"suite", "kernel", "impl", "shape", "note"} | TIMING_KEYS <= set(r)
    assert "samples_us" not in r and r["mode"] == "host"
    assert (r["suite"], r["kernel"], r["impl"]) == ("tree", "tree_build_stage", impl)
    assert r["shape"] == {"B": b, "H": h, "K": k, "budget": budget, "scale": 2.5, "inputs": inputs}
    assert 0 < r["p25_us"] <= r["median_us"] <= r["p75_us"]
    assert r["iqr_us"] == pytest.approx(r["p75_us"] - r["p25_us"])


def test_the_engine_binds_the_stage_functions_themselves() -> None:
    cpu = torch.device("cpu")
    assert tree_stage.reference_stage is reference.build_trees
    assert make_backends(dict(DEFAULTS), cpu).tree_build is tree_stage.reference_stage
    cuda = make_backends({**DEFAULTS, "tree_build": "cuda"}, cpu).tree_build
    assert isinstance(cuda, tree_stage.CudaTreeStage) and cuda.device == cpu
    import engine.backends as eb

    assert not hasattr(eb, "_cuda_build")  # moved, not copied


def test_stage_shape_defaults_are_the_engines_small_preset() -> None:
    p = preset("small")
    want = (p.engine.draft_len, p.engine.k(p.model.vocab_size), p.engine.budget)
    assert BenchConfig().stage_shape == want == (7, 16, 16)


def test_reference_stage_converts_tensors_as_the_engine_hands_them() -> None:
    lp, ids = bench_stage.stage_inputs(3, 7, 16, 2.5, "cpu", seed=1)  # the reference topk: numpy
    want = tree_stage.reference_stage(lp, ids, 16)
    got = tree_stage.reference_stage(torch.from_numpy(lp), torch.from_numpy(ids), 16)
    assert all(np.array_equal(getattr(got, f), getattr(want, f)) for f in TREE_FIELDS)
    assert int(want.num_nodes.min()) == 16  # a full tree per request at the engine's shape


def test_reference_stage_rows_on_the_cpu_have_the_schema() -> None:
    cfg = BenchConfig(batches=[1, 3], quick=True)
    rows = bench_stage.tree_stage_rows(cfg, "cpu")
    assert [r["impl"] for r in rows] == ["reference_stage", "reference_stage"]  # no CUDA row
    for r, b in zip(rows, [1, 3], strict=True):
        _check_row(r, "reference_stage", b, (7, 16, 16), "numpy")
        assert r["reps"] == 5
    add_speedups(rows)
    assert all("speedup" not in r for r in rows)


def test_stage_shape_option_bad_values_are_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("7,16", "7,x,16", "7,0,16"):
        assert main(["--suite", "tree", "--stage-shape", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err


@no_cuda
def test_tree_suite_without_cuda_is_a_note_and_keeps_the_stage_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--suite", "tree", "--batch", "1", "--stage-shape", "5,8,8", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["results"] == [] and "no CUDA device" in err  # no fake rows
    assert doc["config"]["stage_shape"] == [5, 8, 8]


def _targets(trees: reference.BatchedTrees, seed: int) -> np.ndarray:
    """Verify ids [B, budget + 1] that follow each node's first child 3 times in 4 (else a
    random id): accepts of every length."""
    rng = np.random.default_rng(seed)
    fc, tok = np.asarray(trees.first_child), np.asarray(trees.token_ids)
    b, n1 = fc.shape
    out = rng.integers(0, 1 << 20, size=(b, n1)).astype(np.int64)
    follow = (fc > 0) & (rng.random((b, n1)) < 0.75)
    rows, cols = np.nonzero(follow)
    out[rows, cols] = tok[rows, fc[rows, cols] - 1]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 7, 32])
def test_the_kept_stage_reuses_its_buffers_and_accepts_exactly(b: int) -> None:
    # the engine's CUDA tree stage keeps one workspace per shape: every call at that shape
    # overwrites the same buffers, its trees and the CUDA accept through the workspace (no
    # checks of the kept buffers) equal the references on fresh inputs each time, and a
    # call's host trees are its own (the next call does not change them)
    dev = torch.device("cuda", torch.cuda.current_device())
    be = make_backends({**DEFAULTS, "topk": "cuda", "tree_build": "cuda", "accept": "cuda"}, dev)
    assert isinstance(be.tree_build, tree_stage.CudaTreeStage)
    seen, kept = set(), []
    for i in range(3):
        lp, ids = bench_stage.stage_inputs(b, 7, 16, 2.5 + 2 * i, "cuda", seed=100 * b + i)
        want = tree_stage.reference_stage(lp, ids, 16)
        got = be.tree_build(lp, ids, 16)
        for f in TREE_FIELDS:
            assert np.array_equal(getattr(got, f), getattr(want, f)), (i, f)
        seen.add(got.workspace.trees.parents.data_ptr())
        assert got.device_copy is got.workspace.trees
        target = _targets(want, seed=i)
        acc = be.accept(got, torch.from_numpy(target).to(dev), 7)
        ref_acc = reference.greedy_accept_batch(want, target, 7)
        for x, y in zip(acc, ref_acc, strict=True):
            assert np.array_equal(np.asarray(x), np.asarray(y)), i
        kept.append((got, want))
    assert len(seen) == 1  # one workspace for the shape
    for got, want in kept:  # each call's host trees are its own copy
        assert all(np.array_equal(getattr(got, f), getattr(want, f)) for f in TREE_FIELDS)


@pytest.mark.gpu
def test_a_tree_workspace_is_checked_once_and_refuses_another_shape() -> None:
    from kernels import cuda

    dev = torch.device("cuda", torch.cuda.current_device())
    good = cuda.CudaTrees.empty(2, 16, dev)
    with pytest.raises(ValueError, match="TreeWorkspace: trees.depths: expected dtype int64"):
        cuda.TreeWorkspace(good._replace(depths=good.depths.float()), 7)
    with pytest.raises(ValueError, match="TreeWorkspace: max_depth"):
        cuda.TreeWorkspace(good, 99)
    ws = cuda.TreeWorkspace(good, 7)
    assert ws.accept_out[0].shape == (2, 8) and ws.accept_out[0].data_ptr() == (
        ws.accept_flat.data_ptr()
    )
    lp, ids = bench_stage.stage_inputs(3, 7, 16, 2.5, "cuda", seed=1)  # batch 3, not 2
    with pytest.raises(ValueError, match="build_trees: out: a workspace for batch 2, budget 16"):
        cuda.build_trees(lp, ids, 16, out=ws)
    target = torch.zeros((2, 17), dtype=torch.int64, device=dev)
    with pytest.raises(ValueError, match="greedy_accept: max_depth: 5, the workspace's is 7"):
        cuda.greedy_accept(ws, target, 5)
    with pytest.raises(ValueError, match="greedy_accept: target_ids: expected shape"):
        cuda.greedy_accept(ws, target[:, :5].contiguous(), 7)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("scale", [2.5, 6.0])
def test_cuda_stage_builds_the_reference_stages_trees(b: int, scale: float) -> None:
    from kernels import cuda

    dev = torch.device("cuda")
    lp, ids = bench_stage.stage_inputs(b, 7, 16, scale, "cuda", seed=b)  # the CUDA topk's
    assert lp.is_cuda and ids.is_cuda and (lp.dtype, ids.dtype) == (torch.float32, torch.int64)
    want = tree_stage.reference_stage(lp, ids, 16)
    for got in (
        tree_stage.build_trees_stage(lp, ids, 16, dev),
        make_backends({**DEFAULTS, "topk": "cuda", "tree_build": "cuda"}, dev).tree_build(
            lp, ids, 16
        ),
        tree_stage.CudaTreeStage(dev)(lp, ids, 16),
    ):
        for f in TREE_FIELDS:
            assert getattr(got, f).dtype == getattr(want, f).dtype, f
            assert np.array_equal(getattr(got, f), getattr(want, f)), f
        assert isinstance(got.device_copy, cuda.CudaTrees)
        assert all(
            np.array_equal(getattr(got.device_copy, f).cpu().numpy(), getattr(want, f))
            for f in TREE_FIELDS
        )


@pytest.mark.gpu
def test_tree_suite_carries_the_three_stage_rows_with_speedups(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "--suite",
        "tree",
        "--batch",
        "1,32",
        "--budget",
        "16",
        "--k",
        "8",
        "--reps",
        "10",
        "--quick",
        "--json",
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [r for r in doc["results"] if r["kernel"] == "tree_build_stage"]
    impls = ("reference_stage", "cuda_stage", "reference_stage_to_device")
    assert [(r["impl"], r["shape"]["B"]) for r in rows] == [(i, b) for b in (1, 32) for i in impls]
    for r in rows:
        _check_row(r, r["impl"], r["shape"]["B"], (7, 16, 16), "cuda")
    for r in rows[1::3]:  # cuda_stage: against each host stage, under its own key
        assert r["refcheck"] is True
        assert set(r["speedup"]) == {"reference_stage", "reference_stage_to_device"}
        assert all(v > 0 for v in r["speedup"].values())
    for r in rows[2::3]:  # reference_stage_to_device: a baseline, refchecked against cuda_stage
        assert r["refcheck"] is True and "speedup" not in r
    assert any(r["kernel"] == "build_trees" and "speedup" in r for r in doc["results"])
