"""f(c) in the Amdahl table is the component's share of the measured window's wall time where
the profile record has it (`wall_share`, what `ops profile` measures now), and a record made
before it (no `wall_share`) still renders, with f the share of the step at batch c and a note
saying so. Fixed records: tests/fixtures/records/profile_attn_wall (ATTN_WALL) and
profile_attn (the same levels without wall_share)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import RECORDS, ops_report

from ops.verdict.decide import ceiling, projected_gain

RECS = ("preflight_ok", "bench_attn", "rollout_attn_change")


def test_f_is_the_wall_share_where_the_record_has_it(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *RECS, "profile_attn_wall", args=("-c", "32"))
    assert code == 0 and doc["verdict"] == "GO", doc
    levels = json.loads((RECORDS / "profile_attn_wall" / "record.json").read_text())
    wall = {lv["concurrency"]: lv["wall_share"] for lv in levels["profile"]["levels"]}
    rows = {r["concurrency"]: r for r in doc["amdahl"]}
    assert set(rows) == {1, 8, 32}
    for c, row in rows.items():
        f = wall[c]["attention"]["value"]
        assert row["f"] == pytest.approx(f) and row["f_basis"] == "wall"
        assert row["f_source"] == "measured"
        # one window has no IQR: f's range is the value itself, the spread comes from s
        assert row["f_lo"] == row["f_hi"] == row["f"]
        assert row["ceiling"] == pytest.approx(ceiling(f))
        assert row["gain"] == pytest.approx(projected_gain(f, row["speed"]["s"]))
        assert "wall_share" not in row["note"]
    # c=32: 40% of the wall time, not 45/66 = 68% of the step
    assert rows[32]["f"] == pytest.approx(0.40)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| 32 (target) | 40.000% | measured, share of the measured window's wall time |" in md
    assert "f(c) from the service profile: the component's\nshare of the measured window" in md
    assert "- c=32: tree_build 0.20%, attention 40.00% (window 20.000 s" in md
    rows_md = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert not any("share of the step at batch c" in ln for ln in rows_md)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<td>measured, share of the measured window's wall time</td>" in html
    assert '<ul id="wall-share">' in html


def test_an_old_record_without_wall_share_falls_back_to_the_step_share(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *RECS, "profile_attn", args=("-c", "32"))
    assert code == 0 and doc["verdict"] == "GO", doc
    row = next(r for r in doc["amdahl"] if r["concurrency"] == 32)
    step = 3.0 + 0.8 + 0.2 + 60.0 + 0.5 + 1.5  # the flat stages of profile_attn at c=32
    assert row["f"] == pytest.approx(45.0 / step) and row["f_basis"] == "step"
    assert row["f_lo"] < row["f"] < row["f_hi"]  # the stage's and the step's IQR ends
    assert "share of the step at batch c" in row["note"] and "no wall_share" in row["note"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| measured, share of the step at batch c |" in md
    assert "this profile record has no wall_share" in md
    assert "Share of the measured window's wall time" not in md


def test_the_batch_spread_is_shown_and_a_negative_one_is_a_bad_record(tmp_path: Path) -> None:
    """A profile level's `batch_spread` (ops profile records it from the engine's counters) is
    listed under the service profile; a negative spread names the record and the field."""
    prof = json.loads((RECORDS / "profile_attn_wall" / "record.json").read_text())
    for lv in prof["profile"]["levels"]:
        lv["batch_spread"] = {"value": 0.0 if lv["concurrency"] == 1 else 2.5, "n": 96}
    good = tmp_path / "good"
    good.mkdir()
    (good / "record.json").write_text(json.dumps(prof))
    code, doc = ops_report(tmp_path, *RECS, str(good))
    assert code == 0, doc
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Batch length spread (the mean over the level's steps" in md
    assert "c=1 0.0, c=8 2.5, c=32 2.5." in md
    prof["profile"]["levels"][1]["batch_spread"]["value"] = -1.0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "record.json").write_text(json.dumps(prof))
    code, doc = ops_report(tmp_path / "b", *RECS, str(bad))
    assert code == 2 and doc["field"] == "profile.levels.1.batch_spread", doc
    assert doc["file"] == str(bad / "record.json")
    assert "a length spread is >= 0 tokens, got -1.0" in json.dumps(doc)
