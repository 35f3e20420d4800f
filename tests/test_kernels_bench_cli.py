"""`python -m kernels.bench` from the command line, on a CPU (the tree suite).

A bad value (reps, k, budget, tree scale, matmul, decode spread, stage piece, stage shape,
batch) is one `error:` line naming the flag and exit 2, with nothing on stdout, where it once
printed argparse's usage block or a Python error ("invalid literal for int()"); `--matmul` is
recorded in the document's config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import exit_code, one_line

from kernels import bench as kernels_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--reps", "0"], "--reps must be >= 1"),
        (["--k", "0"], "--k takes top-k sizes >= 1"),
        (["--budget", "0"], "--budget takes node budgets >= 1"),
        (["--tree-scale", "nan"], "--tree-scale must be a finite number > 0"),
        (["--matmul", "bogus"], "invalid choice: 'bogus'"),  # was argparse's usage block
        (["--decode-spread", "-1"], "--decode-spread takes 0 .. 65536 tokens"),
        (["--stage-piece-us", "nan"], "--stage-piece-us takes 0 .. 100000 us"),
    ],
)
def test_kernels_bench_bad_input(capsys, extra, says) -> None:
    argv = ["--json", "--suite", "tree", "--batch", "1", *extra]
    assert exit_code(kernels_bench.main, argv) == 2
    captured = capsys.readouterr()
    assert says in one_line(captured.err)
    assert captured.out == ""


def test_kernels_bench_matmul_recorded_on_cpu(capsys) -> None:
    argv = ["--json", "--suite", "tree", "--batch", "1", "--budget", "16", "--k", "8"]
    assert kernels_bench.main([*argv, "--quick", "--reps", "2", "--matmul", "fp32"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["matmul"] == "fp32"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a,b,c", "--stage-shape takes comma-separated integers, got 'a,b,c'"),
        ("7,16", "--stage-shape takes H,K,BUDGET >= 1 like 7,16,16: (7, 16)"),
    ],
)
def test_bench_names_a_bad_stage_shape(value: str, words: str) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.bench",
            "--suite",
            "tree",
            "--stage-shape",
            value,
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"error: {words}"


@pytest.mark.parametrize("value", ["0", ",", "1,0,8"])
def test_bench_refuses_a_batch_below_one(value: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--suite", "tree", "--batch", value, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().startswith("error: --batch takes batch sizes >= 1 like 1,8,64")
