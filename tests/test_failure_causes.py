"""A failure keeps its cause (#39 item 4): the service's own error text rides from the load
generator (tests/test_loadtest.py) to the verdict: a rollout whose profile step failed HOLDs
with the profile's error in the reason, not only "no service profile record"."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "tests" / "fixtures" / "records"
CAUSE = "prompt too long: 1025 tokens; this model's maximum context length is 512"


def test_a_failed_profile_names_its_cause_in_the_hold(tmp_path: Path) -> None:
    run = tmp_path / "rollout_attn"
    shutil.copytree(RECORDS / "rollout_attn", run)
    prof = run / "03-profile" / "record.json"
    doc = json.loads(prof.read_text())
    doc.pop("profile")
    doc.update(outcome="error", exit_code=2, error={"error": "OpsError", "message": CAUSE})
    prof.write_text(json.dumps(doc))
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "ops", "report", str(run), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    holds = {r["code"]: r["message"] for r in json.loads(res.stdout)["holds"]}
    assert (
        holds["no_profile"] == f"no service profile record (the profile failed: {CAUSE}): "
        "f(c) is unknown"
    ), holds
    assert CAUSE in (out / "report.md").read_text()


def test_the_html_reports_health_sections_have_distinct_titles(tmp_path: Path) -> None:
    """A rollout that deployed has its own pre/post-flight and the deploy's: each section is
    titled by who ran it, never two called "preflight" (#39 item 8)."""
    import re

    out = tmp_path / "out"
    run = next(
        (REPO / "benchmarks" / "results").glob(
            "2026-12-03-e30be2b-*/rollout-attn/runs/*-rollout-local"
        )
    )
    res = subprocess.run(
        [sys.executable, "-m", "ops", "report", str(run), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode in (0, 1, 3), res.stderr
    titles = re.findall(r"<h3>([^<]*)</h3>", (out / "report.html").read_text())
    assert len(titles) == 4 and len(titles) == len(set(titles)), titles
    md = (out / "report.md").read_text()
    assert "### deploy's preflight" in md and "### preflight" in md


def test_a_level_with_no_decode_step_names_the_services_error() -> None:
    """The profile's "no decode step" carries the load's own errors (a too-long prompt's 400
    and its text), not only that nothing ran (#39 item 4)."""
    import pytest

    from ops.errors import OpsError
    from ops.measure.profile import measured_level

    lt = {"errors": {f"HTTP 400: {CAUSE}": 4}}
    with pytest.raises(OpsError) as got:
        measured_level(1, {}, {}, lt)  # type: ignore[arg-type]
    assert f"its requests failed: 4 x HTTP 400: {CAUSE}" in got.value.message
