"""benchmarks/stage_exposure.py refuses arguments it cannot use before it needs a GPU: one line
and exit 2 (a --reps of 1 failed in its quartiles after a whole shape's GPU run)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


BAD = (("--reps", "1"), ("--pieces", "100,-5"), ("--sets", "0"))


@pytest.fixture(scope="module")
def bad_runs() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """Each of BAD's runs of the script, started together: each pays its torch import (~3 s,
    one core each), so on a 2-core host the three take the time of about two, not three."""

    def run(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "benchmarks/stage_exposure.py", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    with ThreadPoolExecutor(len(BAD)) as pool:
        return dict(zip(BAD, pool.map(run, BAD), strict=True))


@pytest.mark.parametrize("args", BAD)
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], bad_runs: dict) -> None:
    r = bad_runs[args]
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.count("\n") == 1 and "--reps takes >= 2" in r.stderr, r.stderr


@pytest.mark.gpu
def test_every_sampler_row_carries_its_host_and_gpu_parts(tmp_path: Path) -> None:
    """On a GPU: each shape's samplers (hidden, exposed, piece100; torch and cuda) give a row
    whose two parts, the plan's host time and the calls' GPU time, are both there and add up
    to about the sample's median; the printout has a `parts` line per shape."""
    out = tmp_path / "se.json"
    r = subprocess.run([sys.executable, "benchmarks/stage_exposure.py", "--reps", "3", "--sets",
                        "1", "--pieces", "100", "--json", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["sets"] == 1 and doc["reps"] == 3
    assert len(doc["rows"]) == 4 * 6  # 4 shapes x (hidden, exposed, piece100) x (torch, cuda)
    for row in doc["rows"]:
        assert row["host_us"] > 0 and row["gpu_us"] > 0, row
        assert 0.8 < (row["host_us"] + row["gpu_us"]) / row["median_us"] < 1.25, row
    assert r.stdout.count("parts host+GPU us:") == 4, r.stdout
