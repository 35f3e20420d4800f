"""`ops report` on fixed records (tests/fixtures/records): the seed's Amdahl case, every NO-GO
reason and every HOLD cause from a record that has it (a `no_kernel_rows` HOLD names the impls
the bench has), bad records, `--json`, the files."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.verdict.decide import ceiling, projected_gain, step_reduction

RECORDS = Path(__file__).parent / "fixtures" / "records"
SEED = ("preflight_ok", "bench_tree", "profile_tree", "rollout_tree")


def ops_report(tmp_path: Path, *names: str, args: tuple[str, ...] = ()) -> tuple[int, dict]:
    """`ops report --json` in process; returns the exit code and the JSON document."""
    runner = CliRunner()
    paths = [str(RECORDS / n) if not n.startswith("/") else n for n in names]
    res = runner.invoke(
        app,
        ["report", *paths, "--out", str(tmp_path / "out"), "--json", *args],
        env={"OPS_RUNS_DIR": str(tmp_path / "runs")},
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, json.loads(res.stdout)


def codes(doc: dict, key: str) -> list[str]:
    return [r["code"] for r in doc[key]]


def test_seed_numbers() -> None:
    f, s = 0.01, 474.0
    assert round(step_reduction(f, s) * 100, 3) == 0.998  # the step gets 0.998% shorter
    assert round(projected_gain(f, s) * 100, 3) == 1.008  # throughput +1.008%
    assert round(ceiling(f) * 100, 3) == 1.010  # even an infinitely fast kernel: +1.010%
    assert projected_gain(0.0, 5.0) == 0.0 and projected_gain(0.5, 1.0) == pytest.approx(0.0)
    for bad in ((-0.1, 2.0), (1.0, 2.0), (0.5, 0.0), (0.5, -1.0), (float("nan"), 2.0)):
        with pytest.raises(ValueError):
            projected_gain(*bad)
    with pytest.raises(ValueError):
        ceiling(1.0)


def test_seed_case_is_no_go_with_the_exact_numbers(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *SEED, args=("--concurrency", "1"))
    assert code == 1 and doc["verdict"] == "NO-GO"
    assert codes(doc, "failed") == ["gain_below_threshold"] and doc["holds"] == []
    row = next(r for r in doc["amdahl"] if r["concurrency"] == 1)
    assert row["f"] == pytest.approx(0.01) and row["speed"]["s"] == pytest.approx(474.0)
    assert round(row["step_shorter"] * 100, 3) == 0.998
    assert round(row["gain"] * 100, 3) == 1.008
    assert round(row["ceiling"] * 100, 3) == 1.010
    assert row["f_source"] == "measured" and row["clears"] is False
    msg = doc["failed"][0]["message"]
    assert "+1.008%" in msg and "474x" in msg and "+1.010%" in msg and "3.0% threshold" in msg
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# NO-GO: tree_build: reference -> cuda")
    # a record without wall_share: f is the share of the step at batch c, and the report says so
    assert (
        "| 1 (target) | 1.000% (0.980%..1.020%) | measured, share of the step at batch c | 474x"
        in md
    )
    assert "this profile record has no wall_share" in md
    assert "+1.008% (+0.988%..+1.029%) | +1.010% |" in md


def test_full_rollout_dir_with_sub_records_is_go(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, "rollout_attn")
    assert code == 0 and doc["verdict"] == "GO", doc
    assert doc["failed"] == [] and doc["holds"] == [] and doc["target_concurrency"] == 32
    assert {"preflight_passed", "postflight_passed", "identity", "no_interference", "gain"} <= set(
        codes(doc, "passed")
    )
    assert len(doc["records"]) == 7 and all(len(r["sha256"]) == 64 for r in doc["records"])
    by_c = {r["concurrency"]: r for r in doc["amdahl"]}
    assert by_c[1]["gain"] == pytest.approx(projected_gain(0.4, 3.0))
    assert by_c[1]["measured_gain"] == pytest.approx(0.35) and by_c[1]["aa_noise"] == pytest.approx(
        0.01
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "report.html",
        "report.json",
        "report.md",
    ]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| 1 | +36.364% (+34.418%..+38.387%) | +35.00% (A/A +1.00%) | -1.4 pp |" in md
    saved = json.loads((tmp_path / "out" / "report.json").read_text())

    assert saved["verdict"] == "GO" and saved["amdahl"] == doc["amdahl"]


def test_a_deploys_own_flights_read_apart_from_the_rollouts(tmp_path: Path) -> None:
    """A rollout's deploy runs a pre- and post-flight of its own (inputs.by = "deploy"): the
    reasons name them "deploy's preflight" / "deploy's postflight", so two alike lines do not
    read as one printed twice; one A/A run is "1 A/A run"."""
    run = tmp_path / "rollout"
    shutil.copytree(RECORDS / "rollout_attn", run)
    doc = json.loads((run / "01-preflight" / "record.json").read_text())
    doc["inputs"] = {"role": "preflight", "record_golden": False, "by": "deploy"}
    doc["healthcheck"]["modules"]["identity"]["aa_runs"] = 1
    (run / "04-deploy" / "preflight").mkdir()
    (run / "04-deploy" / "preflight" / "record.json").write_text(json.dumps(doc))
    code, out = ops_report(tmp_path, str(run))
    assert code == 0 and out["verdict"] == "GO", out
    said = [r["message"] for r in out["passed"] if r["code"] in ("preflight_passed", "identity")]
    assert any(m.startswith("preflight: ") for m in said), said
    assert any(m.startswith("deploy's preflight: ") and "checks, none failed" in m for m in said)
    assert (
        "deploy's preflight: greedy token identity 100% (8/8) at concurrency 1 after 1 A/A run"
        in said
    ), said
    assert "preflight: greedy token identity 100% (8/8) at concurrency 1 after 2 A/A runs" in said


def test_precision_lines_say_the_interval_and_the_runs_for_the_threshold(tmp_path: Path) -> None:
    """Each measured level: its interval's half-width, and past the threshold about how many
    runs an arm would narrow it to the threshold (n * (half / threshold)^2, rounded up)."""
    code, doc = ops_report(tmp_path, "rollout_attn")
    assert code == 0
    lines = doc["gain_audit"]["precision"]
    assert len(lines) == 3 and all("within the threshold's 3.0" in x for x in lines), lines
    md = (tmp_path / "out" / "report.md").read_text()
    assert "How precisely the load measured the gain" in md
    code, doc = ops_report(tmp_path, "rollout_attn", args=("--threshold", "0.002"))
    for row, line in zip(doc["amdahl"], doc["gain_audit"]["precision"], strict=True):
        half = (row["measured_hi"] - row["measured_lo"]) / 2
        assert half > 0.002, row  # the fixture's intervals are wider than this threshold
        runs = math.ceil(3 * (half / 0.002) ** 2)
        assert line == (
            f"c={row['concurrency']}: the measured gain's 90% interval is +/-{half * 100:.1f} "
            f"points (3 runs after the switch, 3 of the baseline); +/-0.2 (the threshold) "
            f"would take about {runs} runs after and {runs} of the baseline"
        )
    html = (tmp_path / "out" / "report.html").read_text()
    assert '<ul id="precision-lines">' in html and "would take about" in html
    # --threshold 0: the half-width alone, no runs to narrow it to nothing (was a traceback)
    code, doc = ops_report(tmp_path, "rollout_attn", args=("--threshold", "0"))
    lines = doc["gain_audit"]["precision"]
    assert code in (0, 1, 3) and len(lines) == 3, doc
    assert all(x.endswith("3 of the baseline)") for x in lines), lines


NO_GO = {
    "preflight_failed": ("preflight_service_down", "bench_tree", "profile_tree", "rollout_tree"),
    "preflight_failed:unreachable": (
        "preflight_unreachable",
        "bench_tree",
        "profile_tree",
        "rollout_tree",
    ),
    "identity_mismatch": ("preflight_identity_mismatch", *SEED[1:]),
    "postflight_failed": (*SEED, "deploy_ok", "postflight_smoke_fail"),
    "interference": ("preflight_ok", "bench_tripped", "profile_tree", "rollout_tree"),
    "kernel_not_exact": ("preflight_ok", "bench_not_exact", "profile_tree", "rollout_tree"),
    "gain_below_threshold": SEED,
    "ceiling_below_threshold": ("preflight_ok", "bench_no_gpu", "profile_tree", "rollout_tree"),
}


@pytest.mark.parametrize("reason", sorted(NO_GO))
def test_each_no_go_reason(tmp_path: Path, reason: str) -> None:
    code, doc = ops_report(tmp_path, *NO_GO[reason])
    assert code == 1 and doc["verdict"] == "NO-GO"
    assert reason.split(":")[0] in codes(doc, "failed")
    assert all(r["message"] and isinstance(r["evidence"], dict) for r in doc["failed"])


def test_no_gpu_but_the_ceiling_already_decides(tmp_path: Path) -> None:
    """No bench rows: HOLD, unless even an infinitely fast tree build cannot reach 3%."""
    code, doc = ops_report(tmp_path, *NO_GO["ceiling_below_threshold"])
    assert code == 1 and codes(doc, "failed") == ["ceiling_below_threshold"]
    assert codes(doc, "holds") == ["bench_held"]  # still named: the GPU bench is missing
    assert "at most +1.554% (ceiling)" in doc["failed"][0]["message"]
    code, doc = ops_report(tmp_path, *NO_GO["ceiling_below_threshold"], args=("-c", "1"))
    assert "at most +1.031% (ceiling)" in doc["failed"][0]["message"]


def test_no_go_names_every_failed_condition(tmp_path: Path) -> None:
    names = (
        "preflight_identity_mismatch",
        "deploy_ok",
        "postflight_smoke_fail",
        "bench_tripped",
        "profile_tree",
        "rollout_tree",
    )
    code, doc = ops_report(tmp_path, *names)
    assert code == 1
    assert codes(doc, "failed") == [
        "identity_mismatch",
        "postflight_failed",
        "interference",
        "gain_below_threshold",
    ]
    inter = next(r for r in doc["failed"] if r["code"] == "interference")
    assert inter["evidence"]["p50_before_ms"] == 20.1 and inter["evidence"]["p50_during_ms"] == 26.4
    assert "+31.3%" in inter["message"]
    code, doc = ops_report(tmp_path, "preflight_service_down", "bench_not_exact", *SEED[2:])
    assert codes(doc, "failed") == ["preflight_failed", "kernel_not_exact", "gain_below_threshold"]
    assert "service, health" in doc["failed"][0]["message"]


HOLD = {  # on the seed's records with a 0.5% threshold (GO, see below) unless said otherwise
    "no_change": ("preflight_ok", "bench_tree", "profile_tree"),
    "no_preflight": ("bench_tree", "profile_tree", "rollout_tree"),
    "no_postflight": (*SEED, "deploy_ok"),
    "no_identity": ("preflight_no_golden", *SEED[1:]),
    "identity_nondeterministic": ("preflight_nondeterministic", *SEED[1:]),
    "no_bench": ("preflight_ok", "profile_tree", "rollout_tree"),
    "bench_held": ("preflight_ok", "bench_no_gpu", "profile_tree", "rollout_tree"),
    "bench_failed": ("preflight_ok", "bench_refused", "profile_tree", "rollout_tree"),
    "no_probe": ("preflight_ok", "bench_no_probe", "profile_tree", "rollout_tree"),
    "bench_failed:guard": ("preflight_ok", "bench_guard_refused", "profile_tree", "rollout_tree"),
    "bench_failed:crashed": ("preflight_ok", "bench_crashed", "profile_tree", "rollout_tree"),
    "profile_failed_requests": (
        "preflight_ok",
        "bench_tree",
        "profile_failed_requests",
        "rollout_tree",
    ),
    "no_kernel_rows": ("preflight_ok", "bench_topk_only", "profile_tree", "rollout_tree"),
    "no_profile": ("preflight_ok", "bench_tree", "rollout_tree"),
    "no_component_time": ("preflight_ok", "bench_tree", "profile_no_stage", "rollout_tree"),
    "gain_within_noise": ("preflight_ok", "bench_attn", "profile_attn_wide", "rollout_attn_change"),
    "gain_within_noise:aa": (
        "preflight_ok",
        "bench_attn",
        "profile_attn_small",
        "rollout_attn_change",
        "measure_attn_noisy",
    ),
}


def test_seed_records_go_at_a_low_threshold(tmp_path: Path) -> None:
    """The base the HOLD cases start from: nothing held, nothing failed."""
    code, doc = ops_report(tmp_path, *SEED, args=("--threshold", "0.005"))
    assert code == 0 and doc["verdict"] == "GO" and doc["holds"] == doc["failed"] == []


@pytest.mark.parametrize("cause", sorted(HOLD))
def test_each_hold_cause(tmp_path: Path, cause: str) -> None:
    low = () if cause.startswith("gain_within_noise") else ("--threshold", "0.005")
    code, doc = ops_report(tmp_path, *HOLD[cause], args=low)
    assert code == 3 and doc["verdict"] == "HOLD", doc["failed"]
    assert codes(doc, "holds") == [cause.split(":")[0]], doc["holds"]


def test_flights_without_a_role_follow_the_deploy(tmp_path: Path) -> None:
    """A golden recording compares nothing; a healthcheck after the deploy is the post-flight."""
    low = ("--threshold", "0.005")
    code, doc = ops_report(tmp_path, "hc_golden", "hc_compare", *SEED[1:], args=low)
    assert code == 0, doc["holds"]
    ident = [r for r in doc["passed"] if r["code"] == "identity"]
    assert len(ident) == 1 and ident[0]["evidence"]["record"].endswith("hc_compare/record.json")
    code, doc = ops_report(tmp_path, "hc_golden", *SEED[1:], args=low)
    assert code == 3 and codes(doc, "holds") == ["no_identity"]
    assert "recorded, nothing compared" in doc["holds"][0]["message"]
    after = ("hc_golden", "hc_compare", "deploy_ok", "hc_after_deploy", *SEED[1:])
    code, doc = ops_report(tmp_path, *after, args=low)
    assert code == 1 and codes(doc, "failed") == ["postflight_failed"]
    assert doc["failed"][0]["evidence"]["record"].endswith("hc_after_deploy/record.json")


def test_hold_needs_the_target_concurrency_profiled(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *SEED, args=("--concurrency", "4"))
    assert code == 3 and codes(doc, "holds") == ["no_profile_level"]


def test_marginal_gain_goes_only_without_a_b_noise(tmp_path: Path) -> None:
    """f = 5%, s = 3: +3.45% clears 3% on the projection's spread, but not by a 2% A/A noise."""
    base = ("preflight_ok", "bench_attn", "profile_attn_small", "rollout_attn_change")
    code, doc = ops_report(tmp_path, *base)
    assert code == 0 and round(doc["amdahl"][0]["gain"] * 100, 2) == 3.45
    code, doc = ops_report(tmp_path, *base, "measure_attn_noisy")
    assert code == 3 and "A/A +2.00%" in doc["holds"][0]["message"]
    code, doc = ops_report(tmp_path, *base, args=("--threshold", "0.05"))
    assert code == 1 and codes(doc, "failed") == ["gain_below_threshold"]


def test_change_from_the_command_line(tmp_path: Path) -> None:
    code, doc = ops_report(
        tmp_path, *SEED[:3], args=("--change", "tree_build:cpp->cuda", "--concurrency", "1")
    )
    assert code == 1 and doc["change"]["baseline"] == "cpp"
    assert doc["amdahl"][0]["speed"]["s"] == pytest.approx(12.0)  # cpu_cpp 6 us / 0.5 us


BAD = {
    "missing dir": ("/nonexistent/run", "/nonexistent/run/record.json: no such file"),
    "missing file": ("/nonexistent/x.json", "/nonexistent/x.json: no such file"),
    "bad json": ("bad_json", "bad_json/record.json: (document): not JSON"),
    "missing field": ("bad_missing_field", "bad_missing_field/record.json: bench.rows.0.median_us"),
    "no envelope": ("bad_envelope", "bad_envelope/record.json: command: field required"),
    "bad change": ("bad_change", "bad_change/record.json: change.candidate"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_exit_2_naming_file_and_field(tmp_path: Path, case: str) -> None:
    name, want = BAD[case]
    code, doc = ops_report(tmp_path, "preflight_ok", name)
    assert code == 2 and doc["ok"] is False and doc["error"] == "BadRecord"
    assert want in doc["message"], doc["message"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_a_record_that_is_no_file_is_named_as_such(tmp_path: Path) -> None:
    """A run directory whose record.json is a directory or a FIFO: it is there, and said to be
    no regular file (not "no such file")."""
    for kind, make in (("a directory", os.mkdir), ("a FIFO", os.mkfifo)):
        run = tmp_path / kind.split()[1]
        run.mkdir()
        make(run / "record.json")
        code, doc = ops_report(tmp_path, str(run))
        assert code == 2 and doc["error"] == "BadRecord"
        assert f"record.json: not a regular file ({kind})" in doc["message"], doc["message"]


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("--threshold", "1.5"), "--threshold must be in [0, 1)"),
        (("--format", "pdf"), "--format takes md,html"),
        (("--change", "tree_build:reference->fpga"), "candidate"),
        (("--shape", "budget=16"), "--shape needs --change"),
    ],
)
def test_bad_options_exit_2(tmp_path: Path, args: tuple[str, ...], want: str) -> None:
    code, doc = ops_report(tmp_path, *SEED, args=args)
    assert code == 2 and want in doc["message"]


def test_default_run_dir_and_one_line_errors_in_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    cmd = [sys.executable, "-m", "ops", "report"]
    res = subprocess.run(
        [*cmd, *(str(RECORDS / n) for n in SEED), "--format", "md"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 1, res.stderr
    assert "NO-GO" in res.stdout and "gain_below_threshold" in res.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-report-h200")
    assert sorted(p.name for p in run.iterdir()) == ["record.json", "report.json", "report.md"]
    rec = json.loads((run / "record.json").read_text())
    assert rec["command"] == "report" and rec["outcome"] == "NO-GO" and rec["exit_code"] == 1
    assert rec["decision"]["verdict"] == "NO-GO"
    # a report dir given back as input is skipped, not mistaken for evidence
    res = subprocess.run(
        [*cmd, str(run), *(str(RECORDS / n) for n in SEED), "--out", str(tmp_path / "again")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 1
    res = subprocess.run(
        [*cmd, str(RECORDS / "bad_missing_field")], capture_output=True, text=True, env=env
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad_missing_field/record.json: bench.rows.0.median_us" in lines[0]


def test_profile_table_says_means_and_the_batch_each_level_ran_at(tmp_path: Path) -> None:
    """The profile records means (no IQR); a level at c=32 on an engine of max batch 8 ran at
    batch 8, and the table shows it."""
    doc = json.loads((RECORDS / "profile_tree" / "record.json").read_text())
    for lv in doc["profile"]["levels"]:
        lv["batch"] = min(lv["concurrency"], 8)
        for v in (lv["step_ms"], *lv["stage_ms"].values()):
            v.pop("p25"), v.pop("p75")
    prof = tmp_path / "profile_capped"
    prof.mkdir()
    (prof / "record.json").write_text(json.dumps(doc))
    ops_report(tmp_path, "preflight_ok", "bench_tree", str(prof), "rollout_tree")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "the mean over the level's steps at the batch it ran at" in md
    assert "median, IQR ends in brackets" not in md
    assert "| c | batch | step |" in md
    steps = {lv["concurrency"]: lv["step_ms"]["value"] for lv in doc["profile"]["levels"]}
    assert f"| 32 | 8 | {steps[32]:.3g} |" in md and f"| 8 | 8 | {steps[8]:.3g} |" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<th>c</th><th>batch</th><th>step ms</th>" in html
    assert f'<tr><td>32</td><td class="n">8</td><td class="n">{steps[32]:.3g}</td>' in html


def _with(tmp_path: Path, fixture: str, name: str, edit) -> str:
    """A copy of a fixture record under tmp_path/name, `edit` applied to its document."""
    doc = json.loads((RECORDS / fixture / "record.json").read_text())
    edit(doc)
    d = tmp_path / name
    d.mkdir()
    (d / "record.json").write_text(json.dumps(doc))
    return str(d)


def test_the_threshold_comes_from_the_records_unless_given(tmp_path: Path) -> None:
    """A rollout decided at --set threshold=0.015 rebuilds to the same verdict from its records
    alone; --threshold still overrides; records decided at two thresholds are exit 2."""

    def at(t: float):
        return lambda doc: doc["inputs"].update(resolved={"threshold": t})

    base = ("preflight_ok", "bench_attn", "profile_attn_small")
    code, doc = ops_report(tmp_path, *base, "rollout_attn_change")  # +3.45% against 3%
    assert code == 0 and doc["threshold"] == 0.03
    rollout = _with(tmp_path, "rollout_attn_change", "r5", at(0.05))
    code, doc = ops_report(tmp_path, *base, rollout)
    assert code == 1 and doc["threshold"] == 0.05, doc["threshold"]
    assert codes(doc, "failed") == ["gain_below_threshold"]
    code, doc = ops_report(tmp_path, *base, rollout, args=("--threshold", "0.03"))
    assert code == 0 and doc["threshold"] == 0.03
    other = _with(tmp_path, "rollout_attn_change", "r2", at(0.02))
    code, doc = ops_report(tmp_path, *base, rollout, other)
    assert code == 2 and "decided at different thresholds (0.02 in " in doc["message"], doc


def test_an_empty_out_is_exit_2_not_the_current_directory(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        ["report", *(str(RECORDS / n) for n in SEED), "--out", "", "--json"],
        env={"OPS_RUNS_DIR": str(tmp_path / "runs")},
    )
    assert res.exit_code == 2 and "--out: an empty path" in json.loads(res.stdout)["message"]
    assert not Path("report.md").exists() or Path("report.md").stat().st_mtime < 0


def test_a_passed_profile_without_its_levels_is_a_bad_record(tmp_path: Path) -> None:
    """Not a missing profile (HOLD no_profile): a record that says it passed and holds none."""
    prof = _with(tmp_path, "profile_tree", "p", lambda doc: doc.pop("profile"))
    code, doc = ops_report(tmp_path, "preflight_ok", "bench_tree", prof, "rollout_tree")
    assert code == 2 and doc["error"] == "BadRecord" and doc["field"] == "profile", doc
    assert "a profile that passed records its levels" in doc["message"]


@pytest.mark.parametrize(
    ("precision", "want"),
    [
        (
            {"target": 0.03, "cycles_run": 3, "met": True, "half_width": {"1": 0.05}},
            "met is True, but its half-widths against its target 0.03 say False",
        ),
        (
            {
                "target": 0.03,
                "cycles_run": 9,
                "max_cycles": 3,
                "met": False,
                "half_width": {"1": 0.05},
            },
            "cycles_run 9 is above max_cycles 3",
        ),
        (
            {
                "target": 0.03,
                "cycles": 2,
                "cycles_run": 1,
                "max_cycles": 1,
                "met": False,
                "half_width": {"1": 0.05},
            },
            "max_cycles 1 is below cycles 2",
        ),
        (
            {"target": 0.03, "cycles_run": 1, "met": False, "half_width": {"abc": 0.05}},
            "a level is a concurrency",
        ),
        (
            {"target": 0.03, "cycles_run": 1, "met": False, "half_width": {"1": -0.5}},
            "a half-width is a finite number >= 0",
        ),
    ],
)
def test_a_measure_precision_that_contradicts_itself_is_a_bad_record(
    tmp_path: Path, precision: dict, want: str
) -> None:
    rec = _with(
        tmp_path, "measure_attn_noisy", "m", lambda doc: doc["measure"].update(precision=precision)
    )
    code, doc = ops_report(tmp_path, "preflight_ok", "bench_attn", "profile_attn_small", rec)
    assert code == 2 and "measure.precision" in doc["message"] and want in doc["message"], doc


def test_no_kernel_rows_names_the_impls_the_bench_has(tmp_path: Path) -> None:
    code, doc = ops_report(
        tmp_path,
        "preflight_ok",
        "bench_topk_only",
        "profile_tree",
        "rollout_tree",
        args=("--threshold", "0.005"),
    )
    (hold,) = [h for h in doc["holds"] if h["code"] == "no_kernel_rows"]
    assert "(its impls there:" not in hold["message"]  # it has no tree rows at all
    change = json.loads((RECORDS / "rollout_attn_change" / "record.json").read_text())
    change["change"]["baseline_impl"] = "nonsense_impl"
    d = tmp_path / "recs" / "change"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps(change))
    code, doc = ops_report(tmp_path, "preflight_ok", "bench_attn", "profile_attn_wall", str(d))
    (hold,) = [h for h in doc["holds"] if h["code"] == "no_kernel_rows"]
    assert "rows of both nonsense_impl and cuda" in hold["message"], hold
    assert "(its impls there: cuda, cuda_graph, torch_sdpa)" in hold["message"], hold
