"""The tree stage's handoff to a CUDA accept, and the rollout baseline it makes.

A host builder's trees for a CUDA accept are uploaded at the end of the tree-build stage
(`kernels.tree_stage.to_device`: one flat copy, kept as `device_copy`), so on a service whose
accept is `cuda` the stage a tree-build rollout replaces is `reference_stage_to_device`, not
`reference_stage`. Here: `to_device` round-trips every field exactly and is idempotent; the
upload stage is the reference stage plus that copy, and is what the engine binds; on a GPU the
bench's `reference_stage_to_device` row exists, refchecked against the CUDA stage; and on fixed
records `ops report` takes s(c) against `reference_stage_to_device` where the profiled service's
accept is cuda and the bench has its rows, against `reference_stage` otherwise, and says which.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_report import RECORDS, ops_report
from test_report_parts import _load, _row, _write

from engine.backends import DEFAULTS, make_backends
from kernels import cuda, reference, tree_stage
from kernels.bench import BenchConfig, add_speedups
from kernels.bench import stage as bench_stage

TREE_FIELDS = tuple(reference.BatchedTrees.__dataclass_fields__)
TORCH_OF = {np.dtype(np.int64): torch.int64, np.dtype(np.bool_): torch.bool}


def _trees(b: int = 3, h: int = 3, k: int = 2, budget: int = 64) -> tuple:
    """lp / ids of the reference topk and their trees; budget 64 > 2+4+8 nodes: padded (-1)."""
    lp, ids = bench_stage.stage_inputs(b, h, k, 2.5, "cpu", seed=7)
    return lp, ids, tree_stage.reference_stage(lp, ids, budget)


def _assert_copy_is(trees: reference.BatchedTrees, host: reference.BatchedTrees) -> None:
    """`trees.device_copy` holds `host`'s every field exactly: dtype, shape and values."""
    dc = trees.device_copy
    assert isinstance(dc, cuda.CudaTrees)
    for f in TREE_FIELDS:
        want, got = getattr(host, f), getattr(dc, f)
        assert got.dtype == TORCH_OF[want.dtype], f
        assert tuple(got.shape) == want.shape, f
        assert np.array_equal(got.cpu().numpy(), want), f
    assert dc.visibility.dtype == torch.bool


def test_to_device_round_trips_every_field_and_is_idempotent() -> None:
    _, _, trees = _trees()
    assert (trees.num_nodes < 64).all() and (trees.token_ids == -1).any()  # padding travels too
    host = {f: getattr(trees, f).copy() for f in TREE_FIELDS}
    assert getattr(trees, "device_copy", None) is None
    out = tree_stage.to_device(trees, "cpu")
    assert out is trees  # the same trees, now with their device copy
    _assert_copy_is(out, trees)
    assert all(np.array_equal(getattr(trees, f), host[f]) for f in TREE_FIELDS)  # host untouched
    assert all(t.device.type == "cpu" for t in out.device_copy)
    first = out.device_copy
    again = tree_stage.to_device(out, "cpu")
    assert again is trees and again.device_copy is first  # no second upload


def test_reference_stage_to_device_is_the_reference_stage_plus_its_upload() -> None:
    lp, ids, _ = _trees(b=4, h=7, k=16, budget=16)
    want = tree_stage.reference_stage(lp, ids, 16)
    for args in ((lp, ids), (torch.from_numpy(lp), torch.from_numpy(ids))):  # numpy or tensors
        got = tree_stage.reference_stage_to_device(*args, 16, "cpu")
        for f in TREE_FIELDS:
            assert getattr(got, f).dtype == getattr(want, f).dtype, f
            assert np.array_equal(getattr(got, f), getattr(want, f)), f
        _assert_copy_is(got, want)


def test_the_engine_with_a_cuda_accept_builds_what_the_upload_stage_builds() -> None:
    """What the bench times as reference_stage_to_device is the engine's bound stage."""
    cpu = torch.device("cpu")
    lp, ids, _ = _trees(b=2, h=7, k=16, budget=16)
    want = tree_stage.reference_stage_to_device(lp, ids, 16, cpu)
    got = make_backends({**DEFAULTS, "accept": "cuda"}, cpu).tree_build(lp, ids, 16)
    for f in TREE_FIELDS:
        assert np.array_equal(getattr(got, f), getattr(want, f)), f
    _assert_copy_is(got, want)


def test_cuda_stage_speedups_name_each_baseline() -> None:
    """add_speedups sets the CUDA stage against both host stages, each under its own key."""
    shape = {"B": 8, "H": 7, "K": 16, "budget": 16, "scale": 2.5, "inputs": "cuda"}
    rows = [
        {"kernel": "tree_build_stage", "impl": i, "shape": shape, "median_us": us, "mode": "host"}
        for i, us in (
            ("reference_stage", 1000.0),
            ("cuda_stage", 250.0),
            ("reference_stage_to_device", 1250.0),
        )
    ]
    add_speedups(rows)
    assert rows[1]["speedup"] == {"reference_stage": 4.0, "reference_stage_to_device": 5.0}
    assert "speedup" not in rows[0] and "speedup" not in rows[2]


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [2.5, 6.0])
def test_upload_stage_on_cuda_matches_the_cuda_stage_and_has_its_row(scale: float) -> None:
    dev = torch.device("cuda")
    lp, ids = bench_stage.stage_inputs(8, 7, 16, scale, "cuda", seed=3)
    got = tree_stage.reference_stage_to_device(lp, ids, 16, dev)
    want = tree_stage.build_trees_stage(lp, ids, 16, dev)
    for f in TREE_FIELDS:
        assert np.array_equal(getattr(got, f), getattr(want, f)), f
        a, b = getattr(got.device_copy, f), getattr(want.device_copy, f)
        assert a.is_cuda and a.dtype == b.dtype and torch.equal(a, b), f
    rows = bench_stage.tree_stage_rows(BenchConfig(batches=[1, 8], quick=True, reps=5), "cuda")
    assert [(r["impl"], r["shape"]["B"]) for r in rows] == [
        (i, b)
        for b in (1, 8)
        for i in ("reference_stage", "cuda_stage", "reference_stage_to_device")
    ]
    assert all(r["refcheck"] is True for r in rows if r["impl"] != "reference_stage")


# -- ops: which rows s(c) comes from ------------------------------------------------------


def _records(tmp: Path, accept: str | None, upload_rows: bool, change: dict | None = None) -> list:
    bench = _load("bench_tree")
    for b in (1, 8, 32, 64):
        shape = {"B": b, "H": 7, "K": 16, "budget": 16, "scale": 2.5, "inputs": "cuda"}
        bench["bench"]["rows"] += [
            _row("tree_build_stage", "reference_stage", shape, 1000.0),
            _row("tree_build_stage", "cuda_stage", shape, 250.0),
        ]
        if upload_rows:
            bench["bench"]["rows"].append(
                _row("tree_build_stage", "reference_stage_to_device", shape, 1250.0)
            )
    prof = _load("profile_tree")
    if accept is not None:
        prof["profile"]["service"]["backends"]["accept"] = accept
    ch = _load("rollout_tree")
    if change is not None:
        ch["change"] = change
    return [
        str(RECORDS / "preflight_ok"),
        _write(tmp, "change", ch),
        _write(tmp, "bench", bench),
        _write(tmp, "profile", prof),
    ]


def _s_line(tmp: Path) -> str:
    md = (tmp / "out" / "report.md").read_text()
    start = md.index("s(c) = median of")
    return " ".join(md[start : md.index("rows.", start) + 5].split())


def test_on_a_cuda_accept_s_is_against_the_reference_stage_with_its_upload(
    tmp_path: Path,
) -> None:
    code, doc = ops_report(tmp_path, *_records(tmp_path, "cuda", True))
    ch = doc["change"]
    assert (ch["bench_kernel"], ch["baseline_impl"]) == (
        "tree_build_stage",
        "reference_stage_to_device",
    ), ch
    assert ch["candidate_impl"] is None
    assert doc["amdahl"] and all(r["speed"]["s"] == pytest.approx(5.0) for r in doc["amdahl"])
    assert all(r["speed"]["baseline_us"] == 1250.0 for r in doc["amdahl"])
    assert _s_line(tmp_path) == (
        "s(c) = median of `reference_stage_to_device` / median of `cuda_stage` in the bench's "
        "`tree/tree_build_stage` rows."
    )


@pytest.mark.parametrize(
    ("accept", "upload_rows"), [("reference", True), (None, True), ("cuda", False)]
)
def test_otherwise_s_is_against_the_reference_stage_as_before(
    tmp_path: Path, accept: str | None, upload_rows: bool
) -> None:
    code, doc = ops_report(tmp_path, *_records(tmp_path, accept, upload_rows))
    ch = doc["change"]
    assert (ch["bench_kernel"], ch["baseline_impl"]) == ("tree_build_stage", None), ch
    assert doc["amdahl"] and all(r["speed"]["s"] == pytest.approx(4.0) for r in doc["amdahl"])
    assert "`reference_stage` / median of `cuda_stage`" in _s_line(tmp_path)


def test_a_cpp_baseline_keeps_the_kernel_rows_on_a_cuda_accept(tmp_path: Path) -> None:
    change = {"component": "tree_build", "baseline": "cpp", "candidate": "cuda"}
    code, doc = ops_report(tmp_path, *_records(tmp_path, "cuda", True, change))
    ch = doc["change"]
    assert (ch["bench_kernel"], ch["baseline_impl"]) == (None, None), ch
    assert "`cpu_cpp` / median of `cuda_events`" in _s_line(tmp_path)


def test_a_change_back_to_the_host_builder_takes_the_upload_stage_as_candidate(
    tmp_path: Path,
) -> None:
    change = {"component": "tree_build", "baseline": "cuda", "candidate": "reference"}
    code, doc = ops_report(tmp_path, *_records(tmp_path, "cuda", True, change))
    ch = doc["change"]
    assert (ch["baseline_impl"], ch["candidate_impl"]) == (None, "reference_stage_to_device")
    assert all(r["speed"]["s"] == pytest.approx(0.2) for r in doc["amdahl"])
    assert "`cuda_stage` / median of `reference_stage_to_device`" in _s_line(tmp_path)


def test_flat_trees_views_cover_one_buffer_without_overlap() -> None:
    """The CUDA stage's trees are views of one byte buffer read back in one copy: each field's
    view and its host layout entry address the same bytes, and no two fields overlap."""
    from kernels.tree_stage import _layout, _views

    layout = _layout(3, 5)
    flat = torch.empty(layout[-1][2], dtype=torch.uint8)
    t = _views(flat, layout)
    for i, f in enumerate(t._fields):
        v = getattr(t, f)
        v.fill_(i + 1) if v.dtype != torch.bool else v.fill_(True)
    host = flat.numpy()
    assert layout[-1][2] == flat.numel()
    for f, a, b, dt, shape in layout:
        got = host[a:b].view(dt).reshape(shape)
        want = getattr(t, f).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        assert a % 8 == 0
