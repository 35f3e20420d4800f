"""Two refinements of s(c) in the Amdahl table, on fixed records written here from the shipped
ones: (1) a wall share with a part in prefill (attention runs there too) is projected in two
parts, the decode steps at the step rows' s(c) and prefill at the bench's own prefill rows
(`row_attention_prefill` at the pinned prompt length), and without prefill rows at the step's s
with a note saying so; (2) a tree-build change that names no bench kernel takes s(c) from the
engine's stage rows (`tree_build_stage`: copies included) when the bench has them, and from
the kernel rows (`build_trees`) otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import RECORDS, ops_report

from ops.verdict.decide import projected_gain, projected_gain_parts


def _load(name: str) -> dict:
    return json.loads((RECORDS / name / "record.json").read_text())


def _write(tmp: Path, name: str, rec: dict) -> str:
    d = tmp / "recs" / name
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps(rec))
    return str(d)


def _row(kernel: str, impl: str, shape: dict, us: float) -> dict:
    return {
        "suite": "attn" if "attention" in kernel else "tree",
        "kernel": kernel,
        "impl": impl,
        "shape": shape,
        "median_us": us,
        "p25_us": us * 0.98,
        "p75_us": us * 1.02,
        "iqr_us": us * 0.04,
        "reps": 50,
        "mode": "events",
        "launches_per_sample": 1,
        "refcheck": True,
    }


def _attn_records(tmp: Path, prefill_rows: bool, parts: dict | None = None) -> list[str]:
    """The attention change's records; `parts`: {(prompt length, impl): (host_us, gpu_us)}
    given to those prefill rows (the bench's stage rows carry them)."""
    change = _load("rollout_attn_change")
    change["change"].update(bench_kernel="row_attention", shape={"T": 17, "L": 1024})
    bench = _load("bench_attn")
    rows = []
    for b, (t_us, c_us) in {1: (300.0, 100.0), 8: (900.0, 300.0), 32: (3000.0, 600.0)}.items():
        shape = {"B": b, "T": 17, "L": 1024, "heads": 8, "kv_dim": 576, "dtype": "fp32"}
        rows += [
            _row("row_attention", "torch_rows", shape, t_us),
            _row("row_attention", "cuda_rows", shape, c_us),
        ]
    if prefill_rows:
        for length, (t_us, c_us) in {1024: (4000.0, 8000.0), 64: (100.0, 50.0)}.items():
            shape = {"B": 1, "L": length, "heads": 8, "kv_dim": 576, "dtype": "fp32"}
            rows += [
                _row("row_attention_prefill", "torch_rows", shape, t_us),
                _row("row_attention_prefill", "cuda_rows", shape, c_us),
            ]
            for r in rows[-2:]:
                host_gpu = (parts or {}).get((length, r["impl"]))
                if host_gpu:
                    r["host_us"], r["gpu_us"] = host_gpu
    bench["bench"]["rows"] = rows
    prof = _load("profile_attn_wall")
    for lv in prof["profile"]["levels"]:
        lv["wall_share"]["attention"]["prefill"] = 0.1  # of the 40% (or less) at each level
    return [
        str(RECORDS / "preflight_ok"),
        _write(tmp, "change", change),
        _write(tmp, "bench", bench),
        _write(tmp, "profile", prof),
    ]


def test_prefill_part_is_projected_at_the_prefill_rows_s(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *_attn_records(tmp_path, True), args=("-c", "32"))
    assert code in (0, 1, 3), doc
    rows = {r["concurrency"]: r for r in doc["amdahl"]}
    for c, s in {1: 3.0, 8: 3.0, 32: 5.0}.items():
        row = rows[c]
        f = row["f"]
        assert row["f_prefill"] == pytest.approx(min(0.1, f))
        assert row["speed"]["s"] == pytest.approx(s)
        assert row["prefill_speed"]["s"] == pytest.approx(0.5)  # L = 1024's rows, not L = 64's
        want = projected_gain_parts([(f - row["f_prefill"], s), (row["f_prefill"], 0.5)])
        assert row["gain"] == pytest.approx(want)
        assert row["gain"] < projected_gain(f, s)  # the slower prefill part pulls it down
        assert row["gain_lo"] <= row["gain"] <= row["gain_hi"]
        assert "in prefill, projected at its own s = 0.5x" in row["note"]


def test_a_prefill_s_resting_on_host_time_is_named_with_the_gpu_parts_s(tmp_path: Path) -> None:
    """Prefill stage rows whose plans are most of their time (the bench's host_us): each level's
    note names it, with the s of the calls alone; the projection itself is unchanged. Rows
    whose host part is small, or that carry no parts (the decode rows here), get no such note."""
    parts = {(1024, "torch_rows"): (2000.0, 2000.0), (1024, "cuda_rows"): (7000.0, 1000.0)}
    code, doc = ops_report(tmp_path, *_attn_records(tmp_path, True, parts), args=("-c", "32"))
    base_code, base = ops_report(
        tmp_path / "b", *_attn_records(tmp_path / "b", True), args=("-c", "32")
    )
    assert code == base_code
    want = (
        "prefill: 0.5x rests on host time (the plans: 50% of the baseline's stage, 88% of "
        "the candidate's), which varies with the process and the host's load; the calls "
        "alone (their CUDA events, launch gaps included) give 2x"
    )
    for row, plain in zip(doc["amdahl"], base["amdahl"], strict=True):
        assert want in row["note"], row["note"]
        assert "decode steps:" not in row["note"]
        assert row["gain"] == pytest.approx(plain["gain"])  # a note, not another projection
        assert row["prefill_speed"]["candidate_host_us"] == 7000.0
        assert "rests on host time" not in plain["note"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert want in md
    small = {(1024, "torch_rows"): (800.0, 3200.0), (1024, "cuda_rows"): (1600.0, 6400.0)}
    _, doc = ops_report(
        tmp_path / "s", *_attn_records(tmp_path / "s", True, small), args=("-c", "32")
    )
    assert all("rests on host time" not in r["note"] for r in doc["amdahl"])


def test_without_prefill_rows_the_prefill_part_takes_the_steps_s_and_says_so(
    tmp_path: Path,
) -> None:
    code, doc = ops_report(tmp_path, *_attn_records(tmp_path, False), args=("-c", "32"))
    row = next(r for r in doc["amdahl"] if r["concurrency"] == 32)
    assert row["f_prefill"] is None and row["prefill_speed"] is None
    assert row["gain"] == pytest.approx(projected_gain(row["f"], row["speed"]["s"]))
    assert "projected at the decode step's s (the bench has no prefill rows" in row["note"]


def test_projected_gain_parts_is_projected_gain_for_one_part_and_checks_its_input() -> None:
    assert projected_gain_parts([(0.01, 474.0)]) == pytest.approx(projected_gain(0.01, 474.0))
    assert projected_gain_parts([(0.2, 2.0), (0.1, 1.0)]) == pytest.approx(1 / 0.9 - 1)
    with pytest.raises(ValueError):
        projected_gain_parts([(0.7, 2.0), (0.4, 2.0)])  # f > 1
    with pytest.raises(ValueError):
        projected_gain_parts([(0.1, 0.0)])


def _tree_records(tmp: Path, stage_rows: bool) -> list[str]:
    bench = _load("bench_tree")
    if stage_rows:
        for b in (1, 8, 32, 64):
            shape = {"B": b, "H": 7, "K": 16, "budget": 16, "scale": 2.5, "inputs": "cuda"}
            bench["bench"]["rows"] += [
                _row("tree_build_stage", "reference_stage", shape, 1000.0),
                _row("tree_build_stage", "cuda_stage", shape, 250.0),
            ]
    return [
        str(RECORDS / "preflight_ok"),
        str(RECORDS / "rollout_tree"),
        _write(tmp, "bench", bench),
        str(RECORDS / "profile_tree"),
    ]


def test_tree_build_takes_s_from_the_stage_rows_where_the_bench_has_them(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *_tree_records(tmp_path, True))
    assert doc["change"]["bench_kernel"] == "tree_build_stage", doc["change"]
    for row in doc["amdahl"]:
        assert row["speed"]["s"] == pytest.approx(4.0), row
    md = (tmp_path / "out" / "report.md").read_text()
    assert "`reference_stage`" in md and "`cuda_stage`" in md


def test_tree_build_without_stage_rows_takes_the_kernel_rows(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *_tree_records(tmp_path, False))
    assert doc["change"]["bench_kernel"] is None
    speeds = [r["speed"] for r in doc["amdahl"] if r["speed"] is not None]
    assert speeds and all(sp["s"] != pytest.approx(4.0) for sp in speeds)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "`cpu_python`" in md and "reference_stage" not in md


def test_the_service_s_beside_the_bench_s_and_a_note_where_they_differ(tmp_path: Path) -> None:
    recs = _attn_records(tmp_path, True)
    meas = _load("measure_attn_noisy")
    service = {
        1: {"total": 2.9, "steps": 3.1, "prefill": 0.5},  # as the bench: no note
        8: {"total": 1.5, "steps": 1.6, "prefill": 1.2},  # both parts off
        32: {"total": 5.0, "steps": 5.2},
    }
    for lv in meas["measure"]["levels"]:
        lv["service_speedup"] = service[lv["concurrency"]]
    code, doc = ops_report(tmp_path, *recs, _write(tmp_path, "measure", meas), args=("-c", "32"))
    rows = {r["concurrency"]: r for r in doc["amdahl"]}
    assert rows[1]["service_speedup"] == service[1]
    assert "s in the service differs" not in rows[1]["note"]
    note8 = rows[8]["note"]
    assert "decode steps: the service saw 1.6x where the bench measured 3x" in note8
    assert "prefill: the service saw 1.2x where the bench measured 0.5x" in note8
    assert "s in the service differs" not in rows[32]["note"]  # 5.2 vs 5: within 20%
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| s projected with | s in the service |" in md
    assert "| 3x (prefill 0.5x) | 1.5x (steps 1.6x, prefill 1.2x) |" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<th>s in the service</th>" in html and "1.5x (steps 1.6x, prefill 1.2x)" in html
