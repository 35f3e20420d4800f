"""Bad input to this session's bench and diagnosis commands: one line on stderr and exit 2.

Probed on a CPU host: `python -m engine.bench`, `python -m kernels.bench` and
`python -m engine --check`. Each case here hung, crashed with a
traceback, printed argparse's usage block, or ran and reported nothing before its fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.scripts import one_line

from engine import bench as engine_bench
from kernels import bench as kernels_bench

ROOT = Path(__file__).resolve().parents[1]


def _exit_code(fn, argv: list[str]) -> int:
    """main(argv)'s exit status, whether it returns it or argparse's error exits with it."""
    try:
        return fn(argv)
    except SystemExit as exc:
        return int(exc.code)  # type: ignore[arg-type]


ENGINE_BENCH = ["--device", "cpu", "--preset", "tiny", "--max-tokens", "8"]
ENGINE_BENCH += ["--identity-tokens", "4", "--repeats", "1", "--concurrency", "1"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--concurrency", "0"], "--concurrency must be at least 1, got 0"),  # hung 600 s a run
        (["--concurrency", "1", "-1"], "--concurrency must be at least 1, got -1"),  # exit 0
        (["--identity-tokens", "0"], "--identity-tokens"),  # a vacuous identity check
        (["--row-chunk", "0"], "--row-chunk"),  # ZeroDivisionError, exit 1
        (["--prompt-len", "-1"], "--prompt-len"),
        (["--preset", "bogus"], "invalid choice: 'bogus'"),  # exit 1 after the run started
        (["--matmul", "bogus"], "invalid choice: 'bogus'"),  # argparse's usage block
        (["--sets", "cuda"], "--sets cuda needs --device cuda"),  # nothing ran, exit 0
        (["--repeats", "0"], "--repeats must be at least 1"),
    ],
)
def test_engine_bench_bad_input(tmp_path, capsys, extra, says) -> None:
    out = tmp_path / "e.json"
    assert _exit_code(engine_bench.main, [*ENGINE_BENCH, *extra, "--json", str(out)]) == 2
    assert says in one_line(capsys.readouterr().err)


def test_engine_bench_unwritable_json_fails_before_running(tmp_path, capsys) -> None:
    bad = tmp_path / "missing" / "e.json"
    assert engine_bench.main([*ENGINE_BENCH, "--json", str(bad)]) == 2  # was a traceback
    assert "--json" in one_line(capsys.readouterr().err)


def test_engine_bench_cpu_run_records_matmul_and_repeats(tmp_path) -> None:
    out = tmp_path / "e.json"
    argv = [*ENGINE_BENCH, "--repeats", "2", "--concurrency", "1", "2", "--matmul", "fp32"]
    proc = subprocess.run(
        [sys.executable, "-m", "engine.bench", *argv, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert (doc["matmul"], doc["repeats"]) == ("fp32", 2)
    load = doc["sets"]["cpu-kernels"]["load"]
    assert [(r["mode"], r["concurrency"]) for r in load] == [
        ("ar", 1), ("ddtree", 1), ("ar", 2), ("ddtree", 2)
    ]  # fmt: skip
    assert all(len(r["tokens_per_s_runs"]) == 2 for r in load)


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
    assert _exit_code(kernels_bench.main, argv) == 2
    captured = capsys.readouterr()
    assert says in one_line(captured.err)
    assert captured.out == ""


def test_kernels_bench_matmul_recorded_on_cpu(capsys) -> None:
    argv = ["--json", "--suite", "tree", "--batch", "1", "--budget", "16", "--k", "8"]
    assert kernels_bench.main([*argv, "--quick", "--reps", "2", "--matmul", "fp32"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["matmul"] == "fp32"


def test_engine_check_abbreviated_still_prints_its_json_document() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "--chec", "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--port" in one_line(proc.stderr)
    assert json.loads(proc.stdout) == {
        "ok": False,
        "error": "argument --port: must be in [1, 65535], got 0",
    }
