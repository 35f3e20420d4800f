"""`ops report` takes s(c) of the engine's attention switch from the `row_attention` bench rows
(torch_rows vs cuda_rows at the pinned T and L) when the change names `bench_kernel`, and from
the generic tree_verify_attention rows when it does not; a bench_kernel of another component
is a bad record / a bad playbook; playbooks/rollout-attention.yaml says exactly that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.records.make_records import bench, envelope, krow
from typer.testing import CliRunner

from ops.cli import app
from ops.rollout.playbook import PlaybookError
from ops.rollout.playbook_load import load_playbook
from ops.sections.change import Change

RECORDS = Path(__file__).parent / "fixtures" / "records"
ROW_CHANGE = {
    "component": "attention",
    "baseline": "torch",
    "candidate": "cuda",
    "bench_kernel": "row_attention",
    "shape": {"T": 17, "L": 1024},
}
# batch -> (torch_rows us, cuda_rows us) at L = 1024; L = 64 and the generic rows differ
ROWS_1024 = {1: (300.0, 100.0), 8: (900.0, 450.0), 32: (3000.0, 2400.0)}


def bench_rows() -> list[dict]:
    rows = []
    for b, (t_us, c_us) in ROWS_1024.items():
        for L, scale in ((1024, 1.0), (64, 0.1)):
            shape = {"B": b, "T": 17, "L": L, "heads": 8, "kv_dim": 576, "dtype": "fp32"}
            cand = c_us * scale * (0.5 if L == 64 else 1.0)  # s doubles at L = 64
            rows += [
                krow("attn", "row_attention", "torch_rows", shape, t_us * scale, refcheck=True),
                krow(
                    "attn",
                    "row_attention",
                    "cuda_rows",
                    shape,
                    cand,
                    refcheck=True,
                    speedup={"torch_rows": round(t_us * scale / cand, 2)},
                ),
            ]
        shape = {"batch": b, "prefix": 4096, "tree_rows": 65, "heads": 8, "page_size": 64}
        rows += [
            krow("attn", "tree_verify_attention", "cuda", shape, 10.0),
            krow("attn", "tree_verify_attention", "torch_sdpa", shape, 70.0),  # s = 7
        ]
    return rows


def write_runs(tmp: Path, change: dict) -> list[str]:
    for name, doc in {
        "bench_rows": envelope("bench", 3, "pass", 0, bench=bench(bench_rows())),
        "rollout": envelope("rollout", 0, "ok", 0, change=change),
    }.items():
        (tmp / name).mkdir()
        (tmp / name / "record.json").write_text(json.dumps(doc))
    return [
        str(RECORDS / "preflight_ok"),
        str(RECORDS / "profile_attn"),
        str(tmp / "bench_rows"),
        str(tmp / "rollout"),
    ]


def report(tmp: Path, change: dict) -> tuple[int, dict]:
    res = CliRunner().invoke(
        app,
        ["report", *write_runs(tmp, change), "--out", str(tmp / "out"), "--json"],
        env={"OPS_RUNS_DIR": str(tmp / "runs")},
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, json.loads(res.stdout)


def test_report_takes_s_from_the_row_attention_rows_at_the_pinned_shape(tmp_path: Path) -> None:
    _, doc = report(tmp_path, ROW_CHANGE)
    assert doc["change"]["bench_kernel"] == "row_attention"
    speed = {r["concurrency"]: r["speed"] for r in doc["amdahl"]}
    assert sorted(speed) == [1, 8, 32]
    for c, (t_us, c_us) in ROWS_1024.items():
        assert speed[c]["batch"] == c and speed[c]["note"] == ""
        assert (speed[c]["baseline_us"], speed[c]["candidate_us"]) == (t_us, c_us)
        assert speed[c]["s"] == pytest.approx(t_us / c_us)
    # f(32) = 45 / 57 ms of the attention fixture's profile, s(32) = 3000 / 2400
    row32 = next(r for r in doc["amdahl"] if r["concurrency"] == 32)
    f = row32["f"]
    assert row32["gain"] == pytest.approx(1 / ((1 - f) + f / 1.25) - 1)


def test_without_the_pin_of_L_the_report_says_which_rows_it_took(tmp_path: Path) -> None:
    _, doc = report(tmp_path, {**ROW_CHANGE, "shape": {"T": 17}})
    s1 = next(r["speed"] for r in doc["amdahl"] if r["concurrency"] == 1)
    assert s1["s"] == pytest.approx(3.0)  # the lower of L = 1024 (3x) and L = 64 (6x)
    assert "lowest of 2 shapes" in s1["note"]


def test_without_bench_kernel_attention_is_the_generic_kernel(tmp_path: Path) -> None:
    change = {k: v for k, v in ROW_CHANGE.items() if k not in ("bench_kernel", "shape")}
    _, doc = report(tmp_path, change)
    assert all(r["speed"]["s"] == pytest.approx(7.0) for r in doc["amdahl"])
    assert Change(**change).bench_map() == ("attn", "tree_verify_attention", "torch_sdpa", "cuda")
    assert Change(**ROW_CHANGE).bench_map() == ("attn", "row_attention", "torch_rows", "cuda_rows")


def test_a_bench_kernel_of_another_component_is_bad_input(tmp_path: Path) -> None:
    bad = {
        "component": "tree_build",
        "baseline": "reference",
        "candidate": "cuda",
        "bench_kernel": "row_attention",
    }
    code, doc = report(tmp_path, bad)
    assert code == 2 and "rollout/record.json: change" in json.dumps(doc)
    assert "not a bench kernel of tree_build" in json.dumps(doc)
    with pytest.raises(PlaybookError) as info:
        load_playbook("rollout-attention", ["change.bench_kernel=tree_verify_attn"])
    assert info.value.field == "change"
    assert "'tree_verify_attn' is not a bench kernel of attention" in info.value.message


def test_the_rollout_attention_playbook() -> None:
    pb = load_playbook("rollout-attention")
    assert pb.change is not None and pb.change.label == "attention: torch -> cuda"
    ch = pb.change.to_change()
    # the engine's attention stage of one forward: the plan, then one call per layer
    assert ch.bench_map() == ("attn", "row_attention", "torch_rows_stage", "cuda_rows_stage")
    assert ch.shape == {"T": 17, "L": 1024}
    assert (pb.load.input_len, pb.load.output_len) == (1024, 64)
    assert [s.step for s in pb.step_list()] == [
        "healthcheck",
        "bench",
        "profile",
        "decide",
        "measure",
        "deploy",
        "healthcheck",
        "measure",
        "report",
    ]
    pb = load_playbook("rollout-attention", ["change.shape.L=64", "load.input_len=64"])
    assert pb.change is not None and pb.change.shape == {"T": 17, "L": 64}
