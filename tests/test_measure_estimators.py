"""benchmarks/measure_estimators.py over the committed rollouts: both estimators, their
intervals from the same draws, and a bad directory as exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "measure_estimators.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_every_committed_level_both_ways() -> None:
    res = _run("--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows, s = doc["rows"], doc["summary"]
    assert s["levels"] == len(rows) >= 60
    assert s["pooled_narrower"] + s["as_wide"] + s["pooled_wider"] == s["with_intervals"]
    for r in rows:
        # the pooled gain is the ratio of the arms' harmonic means; both estimates lie between
        # the extreme pairs of runs, and each lies inside its own interval
        lo, hi = r["pooled_interval"]
        assert lo - 1e-9 <= r["pooled"] <= hi + 1e-9, r
        mlo, mhi = r["median_interval"]
        assert mlo - 1e-9 <= r["median"] <= mhi + 1e-9, r
    text = _run()
    assert text.returncode == 0 and f"{s['levels']} levels" in text.stdout


def test_a_missing_directory_is_exit_2_in_one_line(tmp_path) -> None:
    res = _run(str(tmp_path / "nowhere"))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "not a directory" in res.stderr
