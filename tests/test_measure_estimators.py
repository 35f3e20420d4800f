"""benchmarks/measure_estimators.py over the committed rollouts: both estimators, their
intervals from the same draws, and a bad directory as exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def _one_rollout(root: Path) -> Path:
    """A copy of one committed rollout's run dir (its report and its measure record) under root,
    laid out as benchmarks/results is; returns the copied run dir."""
    src = sorted((ROOT / "benchmarks" / "results").glob("*/rollout-*/runs/*rollout-local"))[0]
    run = root / "x" / "rollout-y" / "runs" / src.name
    (run / "08-measure").mkdir(parents=True)
    (run / "report.json").write_text((src / "report.json").read_text())
    measure = sorted(src.glob("0*-measure/record.json"))[-1]
    (run / "08-measure" / "record.json").write_text(measure.read_text())
    return run


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "case, words",
    [
        ("truncated record", "not readable JSON"),
        ("malformed report", "not readable JSON"),
        ("report without amdahl", "no 'amdahl' list"),
        ("report amdahl null", "no 'amdahl' list"),
        ("report a list", "not a JSON object"),
        ("level without before", "level c=1 is malformed (before"),
        ("empty dir", "no measured level"),
        ("a file", "not a directory"),
    ],
)
def test_bad_input_is_exit_2_in_one_line(tmp_path, case, words) -> None:
    """Each of these was a traceback (exit 1) before: JSONDecodeError, KeyError, TypeError,
    pydantic's ValidationError, or a summary of no levels formatting None."""
    target = tmp_path / "results"
    target.mkdir()
    if case == "a file":
        target = tmp_path / "a-file"
        target.write_text("")
    elif case != "empty dir":
        run = _one_rollout(target)
        # the copy is good as it is: the script reads it (the edits below are what break it)
        assert _run(str(target)).returncode == 0
        record, report = run / "08-measure" / "record.json", run / "report.json"
        if case == "truncated record":
            record.write_text(record.read_text()[:200])
        elif case == "malformed report":
            report.write_text('{"amdahl": [')
        elif case == "report without amdahl":
            _edit(report, lambda d: d.pop("amdahl"))
        elif case == "report amdahl null":
            _edit(report, lambda d: d.update(amdahl=None))
        elif case == "report a list":
            report.write_text("[1, 2]")
        elif case == "level without before":
            _edit(record, lambda d: d["measure"]["levels"][0].pop("before"))
    for args in ((str(target),), ("--json", str(target))):
        res = _run(*args)
        assert res.returncode == 2 and res.stdout == "", (case, res.stderr)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr
        assert words in res.stderr and "Traceback" not in res.stderr, res.stderr
