"""benchmarks/stage_exposure.py refuses arguments it cannot use before it needs a GPU: one line
and exit 2 (a --reps of 1 failed in its quartiles after a whole shape's GPU run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["--reps", "1"], ["--pieces", "100,-5"]])
def test_bad_arguments_are_one_line_and_exit_2(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "benchmarks/stage_exposure.py", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.count("\n") == 1 and "--reps takes >= 2" in r.stderr, r.stderr
