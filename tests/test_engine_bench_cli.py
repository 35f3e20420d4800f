"""`python -m engine.bench` from the command line, on a CPU with the tiny preset.

A bad or out-of-range value (concurrency, identity tokens, row chunk, prompt length, preset,
matmul, sets, repeats, rounds, max budget, max tokens, time budget, an unwritable `--json`) is
one `error:` line and exit 2 before anything runs, in process and from the command line (each
of these once hung, crashed with a traceback, overflowed after the run started, or printed
argparse's usage block). A CPU run records its matmul and repeats, runs AR and DDTree
interleaved with each run's own account, reports the middle run, and a spent `--time-budget`
skips every level, recorded and printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.cli import exit_code, one_line

from engine import bench as engine_bench

ROOT = Path(__file__).resolve().parents[1]
HUGE = "99999999999999999999"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


ENGINE_BENCH = ["--device", "cpu", "--preset", "tiny", "--max-tokens", "8"]


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
    assert exit_code(engine_bench.main, [*ENGINE_BENCH, *extra, "--json", str(out)]) == 2
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
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert (doc["matmul"], doc["repeats"]) == ("fp32", 2)
    load = doc["sets"]["cpu-kernels"]["load"]
    assert [(r["mode"], r["concurrency"]) for r in load] == [
        ("ar", 1),
        ("ddtree", 1),
        ("ar", 2),
        ("ddtree", 2),
    ]
    assert all(len(r["tokens_per_s_runs"]) == 2 for r in load)


def test_engine_bench_interleaved_repeats_and_time_budget(tmp_path, capsys) -> None:
    base = [
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--max-tokens",
        "6",
        "--identity-tokens",
        "3",
        "--concurrency",
        "1",
        "2",
    ]
    out = tmp_path / "b.json"
    assert engine_bench.main([*base, "--repeats", "3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["repeats"] == 3
    load = doc["sets"]["cpu-kernels"]["load"]
    assert [(r["mode"], r["concurrency"]) for r in load] == [
        ("ar", 1),
        ("ddtree", 1),
        ("ar", 2),
        ("ddtree", 2),
    ]
    for r in load:
        runs = r["tokens_per_s_runs"]
        assert len(runs) == 3 and r["tokens_per_s"] == sorted(runs)[1], r
        # every run's own account: CPU seconds, collections per generation, stage means
        detail = r["runs"]
        assert [d["tokens_per_s"] for d in detail] == runs, detail
        for d in detail:
            assert 0 < d["cpu_s"] and len(d["gc_collections"]) == 3, d
            assert d["stage_mean_ms"]["step"] > 0 and d["stage_mean_ms"]["verify"] > 0, d
        assert r["same_outputs_every_run"] and r["completed"]
    # a spent time budget skips every level for both modes, recorded
    assert (
        engine_bench.main([*base, "--repeats", "2", "--time-budget", "0", "--json", str(out)]) == 0
    )
    load = json.loads(out.read_text())["sets"]["cpu-kernels"]["load"]
    assert load == [
        {"mode": m, "concurrency": c, "skipped": "time"} for c in (1, 2) for m in ("ar", "ddtree")
    ]
    table = capsys.readouterr().out  # the skipped levels are in the printed table too
    assert table.count("skipped (--time-budget)") == 4, table
    # an even --repeats reports the lower middle run, never the faster of two
    assert engine_bench.main([*base[:-2], "1", "--repeats", "2", "--json", str(out)]) == 0
    for r in json.loads(out.read_text())["sets"]["cpu-kernels"]["load"]:
        assert r["tokens_per_s"] == min(r["tokens_per_s_runs"]), r
    # a budget that is not a number of seconds is one line and exit 2, before anything runs
    for bad in ("nan", "-5", "inf"):
        assert engine_bench.main([*base, "--time-budget", bad, "--json", str(out)]) == 2
        assert "--time-budget must be a number of seconds >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--max-budget", HUGE], "--max-budget must be at most 4096"),
        (["--rounds", "1001"], "--rounds must be at most 1000"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--rounds", "two"], "--rounds"),
        (["--concurrency", "1", HUGE], "--concurrency must be at most 1024"),
        (["--repeats", "1001"], "--repeats must be at most 1000"),
        (["--row-chunk", HUGE], "--row-chunk must be at most 65536"),
        (["--max-tokens", HUGE], "past the tiny preset's context (512 tokens)"),
        (["--max-tokens", "468"], "--max-tokens 468: with the 45-token prompts past"),
        (["--prompt-len", "600"], "the 600-token prompts past"),
        (["--identity-tokens", "500"], "--identity-tokens 500"),
    ],
)
def test_engine_bench_refuses_huge_values(
    tmp_path: Path, args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.bench import main

    argv = ["--preset", "tiny", "--device", "cpu", *args, "--json", str(tmp_path / "b.json")]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors (a non-integer)
        code = exc.code
    assert code == 2 and words in one_line(capsys.readouterr().err)


def test_engine_bench_bad_values_from_the_command_line_are_one_line() -> None:
    bad = (["--max-budget", HUGE], ["--rounds", "two"], ["--rounds", "-1"])

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return _run(
            "-m", "engine.bench", "--preset", "tiny", "--device", "cpu", *args, "--json", "x"
        )

    # each run imports torch (~3 s of one core) before it reads its flags: run them together
    with ThreadPoolExecutor(len(bad)) as pool:
        runs = list(pool.map(run, bad))
    for args, r in zip(bad, runs, strict=True):
        assert r.returncode == 2 and args[0] in one_line(r.stderr)
