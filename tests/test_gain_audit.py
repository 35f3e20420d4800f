"""Where a measured gain came from: the measure step splits each run's window into parts that
add up to it (ops.rollout.switch.audit, from the service's counters:
ops.measure.counters.window_stages),
and the report sets the prediction beside them (ops.verdict.gain_audit). Fixed numbers
throughout, and the committed H200 rollout records (ROLLOUTS) edited by hand: their audit renders
as recorded; a missing, non-numeric or zero-time part is exit 2 naming the file and the field; an
empty or partial audit renders without a traceback."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import one_line
from test_report import ops_report
from test_report_parts import _attn_records, _load, _write

from ops.measure.counters import window_stages
from ops.rollout.switch import AUDIT_PARTS, _parts, audit
from ops.verdict.amdahl import gain_interval


def _pooled(runs: list[float]) -> float:
    """Runs of equal tokens pooled: their tokens over their time (the harmonic mean)."""
    return len(runs) / sum(1 / x for x in runs)


def _snap(steps: dict, prefill: dict | None) -> dict:
    state = {"step_time_breakdown": steps}
    if prefill is not None:
        state["prefill_time_breakdown"] = prefill
    return {"server_info": {"internal_states": [state]}}


def test_window_stages_are_the_windows_own_seconds_steps_and_prefill_apart() -> None:
    t0 = {
        "1": {"steps": 10, "total_s": {"draft": 1.0, "verify": 5.0, "attention": 2.0, "step": 7.0}}
    }
    t1 = {
        "1": {
            "steps": 30,
            "total_s": {"draft": 2.0, "verify": 9.0, "attention": 3.5, "step": 12.5},
        },
        "8": {
            "steps": 5,
            "total_s": {"draft": 0.5, "verify": 1.0, "attention": 0.25, "step": 1.75},
        },
    }
    p0 = {"prefills": 2, "total_s": {"prefill": 1.0, "attention": 0.5}}
    p1 = {"prefills": 6, "total_s": {"prefill": 3.0, "attention": 1.25}}
    got = window_stages(_snap(t0, p0), _snap(t1, p1))
    assert got is not None
    assert got["draft"] == pytest.approx(1.5) and got["verify"] == pytest.approx(5.0)
    assert got["attention"] == pytest.approx(1.75)  # the steps' own, not prefill's
    assert got["steps"] == pytest.approx(7.25) and got["tree_build"] == 0.0
    assert got["prefill"] == pytest.approx(2.0) and got["prefill_attention"] == pytest.approx(0.75)
    assert window_stages({"server_info": {}}, _snap(t1, p1)) is None  # no stage timings


def _run(arm: str, tokens: int, duration: float, **st: float) -> dict:
    stages = {
        "draft": 0.0,
        "topk": 0.0,
        "tree_build": 0.0,
        "verify": 0.0,
        "attention": 0.0,
        "accept": 0.0,
        "commit": 0.0,
        "steps": 0.0,
        "prefill": 0.0,
        "prefill_attention": 0.0,
        **st,
    }
    return {
        "arm": arm,
        "concurrency": 1,
        "output_tokens": tokens,
        "duration_s": duration,
        "stages": stages,
    }


def test_the_parts_add_up_to_the_window_and_audit_means_them_per_output_token() -> None:
    before = _run(
        "A",
        1000,
        2.0,
        verify=1.0,
        attention=0.4,
        tree_build=0.3,
        steps=1.5,
        prefill=0.2,
        prefill_attention=0.05,
    )
    p = _parts(before)
    assert p is not None
    assert p["verify"] == pytest.approx(0.6) and p["attention"] == pytest.approx(0.4)
    assert p["step_other"] == pytest.approx(0.2)  # 1.5 - (0.3 + 0.6 + 0.4)
    assert p["prefill_other"] == pytest.approx(0.15) and p["idle"] == pytest.approx(0.3)
    assert sum(v for k, v in p.items() if k != "window") == pytest.approx(p["window"])
    runs = [
        before,
        _run("A'", 1000, 2.2, verify=1.0, attention=0.4, tree_build=0.5, steps=1.7, prefill=0.2),
        _run("after", 1000, 1.8, verify=1.0, attention=0.4, tree_build=0.1, steps=1.3, prefill=0.2),
        _run("after", 500, 0.5, verify=0.25, attention=0.1, tree_build=0.05, steps=0.4),
    ]
    a = audit(runs, 1)
    assert a is not None and set(a) == set(AUDIT_PARTS)
    assert a["window"] == {"before_ms": pytest.approx(2.1), "after_ms": pytest.approx(1.4)}
    assert a["tree_build"] == {"before_ms": pytest.approx(0.4), "after_ms": pytest.approx(0.1)}
    assert audit(runs, 8) is None  # no runs at that level
    assert audit([{**r, "stages": None} for r in runs], 1) is None  # no stage timings


def test_the_report_sets_the_prediction_beside_the_audit(tmp_path) -> None:
    meas = _load("measure_attn_noisy")
    for lv in meas["measure"]["levels"]:
        lv["audit"] = {k: {"before_ms": 1.0, "after_ms": 0.8} for k in AUDIT_PARTS}
        lv["audit"]["tree_build"] = {"before_ms": 0.0, "after_ms": 0.0}  # not run: no row
        lv["audit"]["window"] = {"before_ms": 10.0, "after_ms": 8.0}  # the other 10 parts
    recs = _attn_records(tmp_path, True)
    code, doc = ops_report(tmp_path, *recs, _write(tmp_path, "measure", meas), args=("-c", "32"))
    rows = {r["concurrency"]: r for r in doc["amdahl"]}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Where the measured gain came from" in md
    g1, sp1 = rows[1]["gain"], rows[1]["speed"]["s"]
    psp = rows[1]["prefill_speed"]["s"]
    want_window = f"| 1 | window (wall time) | 10.0000 | 8.0000 | -2.0000 | {10 / (1 + g1):.4f} |"
    assert want_window in md, md
    assert (
        f"| 1 | attention (decode steps) [the change] | 1.0000 | 0.8000 | -0.2000 | {1 / sp1:.4f} |"
        in md
    )
    assert (
        f"| 1 | attention (prefill) [the change] | 1.0000 | 0.8000 | -0.2000 | {1 / psp:.4f} |"
        in md
    )
    assert "| 1 | draft | 1.0000 | 0.8000 | -0.2000 | - | - |" in md
    assert "tree_build" not in md.split("Where the measured gain came from")[1].split("##")[0]
    html = (tmp_path / "out" / "report.html").read_text()
    assert '<table id="gain-audit">' in html and "attention (prefill) [the change]" in html
    # the change's own parts alone: 0.2 + 0.2 ms per token saved of 10: +4.17%; the rest of
    # the window moved (8 - 10) + 0.4 = -1.6 ms per token, -16% of it
    line = next(x for x in md.splitlines() if x.startswith("- c=1: the change's own parts"))
    assert "saved 0.4000 ms per output token of the window's 10.0000" in line, line
    assert f"alone that is a gain of +4.17% (projected {g1:+.2%})" in line, line
    assert "moved -1.6000 ms per token (-16.00% of it; A/A noise" in line, line
    assert '<ul id="audit-lines">' in html
    # the projection on the measure's own baseline: the window 10 ms per token with the change's
    # parts (1 + 1) at the candidate's cost as the profile saw it: f 0.25 of it, 0.1 in prefill,
    # over the profile's 150 tokens/s, over s (3x steps, 0.5x prefill) -> 1000 * (0.15 / 3 +
    # 0.1 / 0.5) / 150 = 1.6667 ms per token; 10 / (10 - 2 + 1.6667) - 1 = +3.45%
    assert (rows[1]["f"], rows[1]["f_prefill"], sp1, psp) == pytest.approx((0.25, 0.1, 3, 0.5))
    m1 = rows[1]["measured_gain"]
    line = next(x for x in md.splitlines() if x.startswith("- c=1: the baseline's window"))
    assert (
        "the baseline's window 10.0000 ms per output token, the change's parts 2.0000 of it; "
        "with them at the candidate's cost as the profile saw it (1.6667: f over the profile's "
        f"150.0 tokens/s, over s) the projection is +3.45%; the measured gain {m1:+.2%} is "
        f"{100 * (m1 - 10 / 9.6667 + 1):+.1f} pp off it (off the report's projection, "
        f"{g1:+.2%}: {100 * (m1 - g1):+.1f} pp)"
    ) in line, line
    assert '<ul id="baseline-lines">' in html
    assert len(doc["gain_audit"]["on_baseline"]) == 3  # every level, in report.json too


def test_no_projection_on_the_baseline_without_a_wall_share_f(tmp_path) -> None:
    """f as a share of the step (a profile record from before the wall share) is not a share
    of the window's time, so it gives no candidate cost per output token: no such line."""
    meas = _load("measure_attn_noisy")
    for lv in meas["measure"]["levels"]:
        lv["audit"] = {k: {"before_ms": 1.0, "after_ms": 0.8} for k in AUDIT_PARTS}
        lv["audit"]["window"] = {"before_ms": 11.0, "after_ms": 8.8}
    recs = _attn_records(tmp_path, True)
    prof = _load("profile_attn_wall")
    for lv in prof["profile"]["levels"]:
        lv.pop("wall_share")
    recs[3] = _write(tmp_path, "profile_step", prof)
    code, doc = ops_report(tmp_path, *recs, _write(tmp_path, "measure", meas), args=("-c", "32"))
    assert code in (0, 1, 3), doc
    assert {r["f_basis"] for r in doc["amdahl"]} == {"step"}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "The change's own parts alone" in md and "the baseline's window" not in md
    assert doc["gain_audit"]["on_baseline"] == []


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"before_ms": 1.0}, "after_ms"),
        ({"before_ms": "x", "after_ms": 1.0}, "before_ms"),
        ({"before_ms": float("nan"), "after_ms": 1.0}, "before_ms"),
        ({"before_ms": True, "after_ms": 1.0}, "before_ms"),
        ({"before_ms": "1.5", "after_ms": 1.0}, "before_ms"),
        ({"before_ms": 1.0, "after_ms": 1e308}, "after_ms"),
        ({"before_ms": 0.0, "after_ms": 1.0}, "audit"),
    ],
)
def test_a_malformed_audit_is_bad_input_naming_the_file_and_field(tmp_path, bad, field) -> None:
    meas = _load("measure_attn_noisy")
    meas["measure"]["levels"][0]["audit"] = {"window": bad}
    recs = _attn_records(tmp_path, True)
    path = _write(tmp_path, "measure", meas)
    code, doc = ops_report(tmp_path, *recs, path, args=("-c", "32"))
    assert code == 2, doc
    text = str(doc)
    assert "measure" in text and "audit" in text and field in text, text


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -5.0, 1e309])
def test_a_profile_tokens_per_s_that_is_no_rate_is_bad_input(tmp_path, bad) -> None:
    """The projection on the measure's baseline divides by the profile's tokens/s: a record
    whose tokens/s is not a finite number > 0 is exit 2 naming the file and the field, never a
    line of nan or inf."""
    recs = _attn_records(tmp_path, True)
    prof = json.loads(Path(recs[3]).joinpath("record.json").read_text())
    prof["profile"]["levels"][1]["tokens_per_s"]["value"] = bad
    recs[3] = _write(tmp_path, "profile_bad_rate", prof)
    code, doc = ops_report(tmp_path, *recs, args=("-c", "32"))
    assert code == 2, doc
    text = str(doc)
    assert "profile" in text and "tokens_per_s" in text and "finite number > 0" in text, text


def test_the_measured_gain_has_a_reproducible_bootstrap_interval(tmp_path) -> None:
    before, after = [100.0, 104.0, 98.0, 102.0], [110.0, 115.0, 108.0, 112.0]
    lo, hi = gain_interval(before, after, 8)
    assert (lo, hi) == gain_interval(before, after, 8)  # seeded: a rebuilt report agrees
    point = _pooled(after) / _pooled(before) - 1  # each arm's runs pooled: tokens over time
    assert lo <= point <= hi and lo >= 108 / 104 - 1 and hi <= 115 / 98 - 1
    # the median of the runs' gain sits beside it, not in its place
    assert statistics.median(after) / statistics.median(before) - 1 != pytest.approx(point)
    assert gain_interval([100.0], after, 8) is None and gain_interval(before, [1.0], 8) is None
    # the report: the interval beside the measured gain, and whether the projection is in it
    meas = _load("measure_attn_noisy")
    code, doc = ops_report(
        tmp_path,
        *_attn_records(tmp_path / "b", True),
        _write(tmp_path, "measure", meas),
        args=("-c", "32"),
    )
    rows = {r["concurrency"]: r for r in doc["amdahl"]}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| measured interval | predicted inside |" in md
    for c, r in rows.items():
        lv = next(x for x in meas["measure"]["levels"] if x["concurrency"] == c)
        want = gain_interval(lv["before"], lv["after"], c)
        assert (r["measured_lo"], r["measured_hi"]) == pytest.approx(want)
        inside = "yes" if want[0] <= r["gain"] <= want[1] else "no"
        assert f"| {100 * want[0]:+.2f}%..{100 * want[1]:+.2f}% | {inside} |" in md, md


def test_an_audit_whose_parts_do_not_add_up_to_its_window_is_bad_input(tmp_path) -> None:
    meas = _load("measure_attn_noisy")
    audit = {k: {"before_ms": 1.0, "after_ms": 0.8} for k in AUDIT_PARTS}
    audit["window"] = {"before_ms": 11.0, "after_ms": 9.0}  # the parts: 11.0 and 8.8
    meas["measure"]["levels"][0]["audit"] = audit
    path = _write(tmp_path, "measure", meas)
    code, doc = ops_report(tmp_path, *_attn_records(tmp_path, True), path, args=("-c", "32"))
    assert code == 2 and "after_ms: the parts add up to 8.8 ms, not the window's 9" in str(doc)


def test_with_a_recheck_the_measured_gain_is_against_every_baseline_run(tmp_path) -> None:
    # a host that speeds up steadily through the measure: A, A' (100, 102), after (140, 144),
    # A'' (112, 114). Before / after alone counts the drift as the change's (+40.6%); against
    # every baseline run (pooled 106.65 tokens/s: A, A' and A'' sit as much before the after
    # runs as behind them) the gain is +33.1%, and the drift line says both
    meas = _load("measure_attn_noisy")
    for lv in meas["measure"]["levels"]:
        lv["aa"], lv["before"] = [[100.0], [102.0]], [100.0, 102.0]
        lv["after"], lv["recheck"] = [140.0, 144.0], [112.0, 114.0]
    path = _write(tmp_path, "measure", meas)
    code, doc = ops_report(tmp_path, *_attn_records(tmp_path / "b", True), path, args=("-c", "32"))
    assert code in (0, 1, 3), doc
    every = [100.0, 102.0, 112.0, 114.0]
    for r in doc["amdahl"]:
        assert r["measured_gain"] == pytest.approx(_pooled([140.0, 144.0]) / _pooled(every) - 1)
        assert r["measured_gain"] == pytest.approx(0.331143, abs=1e-6)
        assert r["measured_median"] == pytest.approx(142 / 107 - 1)
        assert r["measured_plain"] == pytest.approx(0.405800, abs=1e-6)
        want = gain_interval(every, [140.0, 144.0], r["concurrency"])
        assert (r["measured_lo"], r["measured_hi"]) == pytest.approx(want)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "+33.11% (A/A +2.00%)" in md, md
    assert "| +32.71% |" in md, md  # the median of the runs, beside it
    assert "A'' 113.0 tokens/s against 101.0 in the A/A pair (drift +11.88%)" in md, md
    assert "+40.58% against the A/A pair alone, +33.11% against every baseline run" in md, md
    assert "A'' after it (switched back in),\na design balanced in time" in md
    # the HTML report says what its measured column is, as the markdown does (it had the
    # columns and no word of what "measured" or "median of the runs" computes)
    html = (tmp_path / "out" / "report.html").read_text()
    key = html[html.index('id="predicted-measured-key"') : html.index('id="predicted-measured"')]
    assert "each arm's runs pooled, their output tokens over their time" in key, key
    assert "median of the runs: median tokens/s after / median before - 1" in key, key
    assert "A'' after it (switched back in)" in key, key
    assert '<td class="n">+33.11% (A/A +2.00%)</td>' in html and "+32.71%" in html
    # without a recheck nothing changes: after against the A/A pair, no plain gain apart
    for lv in meas["measure"]["levels"]:
        lv["recheck"] = []
    path = _write(tmp_path / "c", "measure", meas)
    code, doc = ops_report(
        tmp_path / "c", *_attn_records(tmp_path / "d", True), path, args=("-c", "32")
    )
    for r in doc["amdahl"]:
        assert r["measured_gain"] == pytest.approx(
            _pooled([140.0, 144.0]) / _pooled([100.0, 102.0]) - 1
        )
        assert r["measured_plain"] is None


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("recheck", [0.0, 0.0]),
        ("recheck", [-5.0]),
        ("after", [0.0]),
        ("before", [float("nan")]),
        ("recheck", [float("inf")]),
    ],
)
def test_a_run_of_no_tokens_or_a_non_number_is_bad_input(tmp_path, field, bad) -> None:
    # a recheck of zero-token runs once made the measured gain +184% against a median of 50
    meas = _load("measure_attn_noisy")
    meas["measure"]["levels"][0][field] = bad
    path = _write(tmp_path, "measure", meas)
    code, doc = ops_report(tmp_path, *_attn_records(tmp_path / "b", True), path, args=("-c", "32"))
    assert code == 2, doc
    assert field in str(doc) and "tokens/s must be a finite number > 0" in str(doc), doc


def test_a_drift_line_says_what_its_baseline_was(tmp_path) -> None:
    # no A/A pair: "the runs before the switch"; fewer A'' runs than after: not balanced
    meas = _load("measure_attn_noisy")
    for lv in meas["measure"]["levels"]:
        lv["aa"], lv["before"] = [], [100.0, 102.0]
        lv["after"], lv["recheck"] = [140.0, 144.0], [112.0]
    path = _write(tmp_path, "measure", meas)
    ops_report(tmp_path, *_attn_records(tmp_path / "b", True), path, args=("-c", "32"))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "A'' 112.0 tokens/s against 101.0 in the runs before the switch" in md, md
    assert "(not balanced: 1 A'' runs against 2 after)" in md, md


def test_html_shows_the_measured_table_without_a_projection(tmp_path) -> None:
    """A committed rollout whose levels have no projected gain (d1de6e1's attention rollout):
    report.md listed each level's measured gain, its interval, the median of the runs and the
    service's s; report.html left that table out (it sat under the projection's chart), so the
    two reports disagreed. Rebuilt from the committed records, both now carry the same numbers."""
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    run = sorted(root.glob("2026-12-01-d1de6e1-*/rollout-attn/runs/*rollout-local"))[0]
    code, doc = ops_report(tmp_path, str(run))
    assert code in (0, 1, 3), doc
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    measured = [r for r in doc["amdahl"] if r.get("measured_gain") is not None]
    assert measured and all(r.get("gain") is None for r in measured)
    table = html[html.index('id="predicted-measured"') :]
    for r in measured:
        for x in (r["measured_gain"], r["measured_median"], r["measured_lo"], r["measured_hi"]):
            assert f"{100 * x:+.2f}%" in md and f"{100 * x:+.2f}%" in table, (x, r)


ROLLOUTS = REPO / "benchmarks/results/2026-12-01-b3b9d70-h200-rollouts-audit"


def _edited(tmp_path: Path, which: str, edit) -> Path:
    src = next((ROLLOUTS / f"rollout-{which}" / "runs").glob("*rollout-local"))
    dst = tmp_path / which / src.name
    shutil.copytree(src, dst)
    f = dst / "08-measure" / "record.json"
    rec = json.loads(f.read_text())
    edit(rec["measure"]["levels"])
    f.write_text(json.dumps(rec))
    return dst


def _report(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ops", "report", str(run), "--out", str(run) + "-out", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _set(part: str, key: str, value):
    def edit(levels):
        levels[0]["audit"][part][key] = value

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "field"),
    [
        ("missing", lambda L: L[0]["audit"]["window"].pop("after_ms"), "window.after_ms"),
        ("string", _set("tree_build", "before_ms", "abc"), "tree_build.before_ms"),
        ("nan", _set("window", "before_ms", float("nan")), "window.before_ms"),
        ("a list", lambda L: L[0].__setitem__("audit", [1]), "levels.0.audit"),
        ("part null", lambda L: L[0]["audit"].__setitem__("draft", None), "audit.draft"),
    ],
)
def test_a_malformed_audit_is_exit_2_naming_the_file_and_field(tmp_path, name, edit, field):
    run = _edited(tmp_path, "tree", edit)
    p = _report(run)
    assert p.returncode == 2, (name, p.stderr)
    line = one_line(p.stderr)
    assert str(run / "08-measure" / "record.json") in line and field in line, line


def _table(md: str) -> list[str]:
    return [x for x in md.splitlines() if x.startswith("| ") and "window (wall time)" in x]


def test_the_committed_audit_renders_and_agrees_with_its_record(tmp_path) -> None:
    run = _edited(tmp_path, "attn", lambda L: None)
    p = _report(run)
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr  # HOLD, as recorded
    md = (Path(str(run) + "-out") / "report.md").read_text()
    rec = json.loads((run / "08-measure" / "record.json").read_text())
    for lv, line in zip(rec["measure"]["levels"], _table(md), strict=True):
        w = lv["audit"]["window"]
        assert line.startswith(
            f"| {lv['concurrency']} | window (wall time) | {w['before_ms']:.4f} | "
            f"{w['after_ms']:.4f} |"
        ), line
        parts = [v["before_ms"] for k, v in lv["audit"].items() if k != "window"]
        assert sum(parts) == pytest.approx(w["before_ms"], rel=1e-9)
    assert "| -0.0000 |" not in md and "attention (prefill) [the change]" in md


@pytest.mark.parametrize(
    ("name", "edit", "windows"),
    [
        ("empty dict", lambda L: L[0].__setitem__("audit", {}), 2),
        ("one level only", lambda L: [lv.pop("audit") for lv in L[1:]], 1),
    ],
)
def test_an_odd_audit_renders_without_a_traceback(tmp_path, name, edit, windows) -> None:
    run = _edited(tmp_path, "tree", edit)
    p = _report(run)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (name, p.stderr)
    md = (Path(str(run) + "-out") / "report.md").read_text()
    rows = _table(md)
    assert len(rows) == windows, rows


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("negative window", _set("window", "before_ms", -1.0)),
        (
            "zero window",
            lambda L: L[0]["audit"].__setitem__("window", {"before_ms": 0.0, "after_ms": 0.0}),
        ),
    ],
)
def test_a_window_of_no_time_is_bad_input(tmp_path, name, edit) -> None:
    """A window of no (or negative) time predicted a window of -0.9562 ms; the record is now
    refused as malformed (ops.verdict.evidence: a measured window takes time), one line, exit 2."""
    run = _edited(tmp_path, "tree", edit)
    p = _report(run)
    assert p.returncode == 2 and "Traceback" not in p.stderr, (name, p.stderr)
    assert "audit" in p.stderr and "window" in p.stderr, p.stderr
