"""Session 7's new-user probe: the regressions found in engine.attn_bench,
benchmarks/engine_aging.py and benchmarks/steps-ab.sh (user mistakes one line + exit 2; results
never lost or silently not written; a failed A/B round named in a summary that is still written).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.scripts import load_benchmark

from ops.verdict.evidence import KernelRow

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--device", "cpu", "--preset", "tiny"]


def _py(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def _in_process(main, argv: list[str], capsys) -> subprocess.CompletedProcess:
    """main(argv) in this process (no torch import per case): its exit code and output."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's error path
        rc = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, out, err)


def _one_line_exit_2(p: subprocess.CompletedProcess, words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr


# --- engine.attn_bench ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--json", ""], "needs a file path"),  # was: silently not written, exit 0
        (["--json", "{tmp}"], "is a directory"),
        (["--json", "{tmp}/no/such/x.json"], "no such directory"),
        (["--prompt-len", "512"], "--prompt-len 512: past this model's context (512)"),
    ],
)
def test_attn_bench_bad_input(tmp_path, capsys, args: list[str], words: str) -> None:
    from engine.attn_bench import main

    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    p = _in_process(main, [*TINY, "--prompt-len", "8", "--batch", "1", *args], capsys)
    _one_line_exit_2(p, words)
    assert p.stdout == ""


def test_attn_bench_repeated_batch_and_earlier_result_kept(tmp_path) -> None:
    kept, out = tmp_path / "kept.json", tmp_path / "attn.json"
    for path in (kept, out):
        path.write_text('{"earlier": 1}\n')
    # the two runs (each imports torch, ~3 s of one core) go together, each on its own file
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(_py, "-m", "engine.attn_bench", *TINY, "--prompt-len", "8", "--steps",
                          "999", "--json", str(kept))  # fmt: skip
        good = pool.submit(_py, "-m", "engine.attn_bench", *TINY, "--prompt-len", "8", "--steps",
                           "1", "--warm", "0", "--prefix-span", "0", "--batch", "2", "2", "1",
                           "--json", str(out))  # fmt: skip
        p = bad.result()
        # a bad run leaves an earlier result as it was (the up-front check truncated it)
        _one_line_exit_2(p, "past this model's context")
        assert json.loads(kept.read_text()) == {"earlier": 1}
        p = good.result()
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert json.loads(out.read_text()) == doc
    rows = [KernelRow.model_validate(r) for r in doc["results"]]
    # one row per shape: `--batch 2 2 1` runs batch 2 once (two rows of one shape before)
    assert [r.batch for r in rows if r.kernel == "row_attention"] == [2, 1]
    assert doc["config"]["batch"] == [2, 1]
    assert [r.reps for r in rows if r.kernel == "row_attention_prefill"] == [3]


# --- benchmarks/engine_aging.py ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--preset", "huge", "--json", "{tmp}/a.json"], "invalid choice: 'huge'"),  # traceback
        (["--json", "{tmp}"], "is a directory"),  # was a traceback after every run
        (["--json", "{tmp}/no/such/a.json"], "cannot write there"),
        (["--json", ""], "needs a file path"),
        (["--max-tokens", "100000", "--json", "{tmp}/a.json"], "past this model's context"),
        ([], "required: --json"),  # was argparse's 4-line usage block
        (["--runs", "0", "--json", "{tmp}/a.json"], "--runs must be at least 1"),
        (["--device", "banana", "--json", "{tmp}/a.json"], "bad --device"),
    ],
)
def test_engine_aging_bad_input(tmp_path, capsys, args: list[str], words: str) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    p = _in_process(load_benchmark("engine_aging").main, [*TINY, *args], capsys)
    _one_line_exit_2(p, words)
    assert not (tmp_path / "a.json").exists()


def test_engine_aging_runs_record_how_they_finished(tmp_path) -> None:
    out = tmp_path / "aging.json"
    p = _py("benchmarks/engine_aging.py", *TINY, "--runs", "1", "--fresh", "1",
            "--max-tokens", "4", "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("engine_aging.py --device cpu")
    kinds = [r["kind"] for r in doc["runs"]]
    assert kinds == ["same decoder", "fresh decoder", "same decoder, this thread"]
    for r in doc["runs"][:2]:  # the scheduler's runs: each request ended at --max-tokens
        assert r["completed"] is True and r["finish_reasons"] == ["length"]


# --- benchmarks/steps-ab.sh -------------------------------------------------------------------

# Stands in for python3 on the GPU parts only (the kernel build and engine_steps.py, which need
# CUDA); the summary's Python runs on the real interpreter. Round 2 of base fails with no JSON,
# round 2 of new leaves a truncated JSON.
STUB = """#!/bin/bash
if [ "$1" = -m ] && [ "$2" = kernels.build ]; then echo '{"ok": true}'; exit 0; fi
if [ "$1" = benchmarks/engine_steps.py ]; then
  out=${@: -1}
  case "$out" in
    *steps-base-2.json) echo "CUDA error: boom"; exit 3 ;;
    *steps-new-2.json) printf '{"runs": [' > "$out"; exit 0 ;;
  esac
  v=1.5; case "$out" in *new*) v=1.25 ;; esac
  ar='{"mode": "ar", "wall_ms_median": 2.0}'
  printf '{"runs": [%s, {"mode": "ddtree", "wall_ms_median": %s}]}' "$ar" "$v" > "$out"
  exit 0
fi
exec REAL "$@"
"""


def _steps_ab(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("OUT", "BASE_DIR", "ROUNDS")}
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "steps-ab.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**full, **env},
    )


@pytest.mark.parametrize(
    "env, words",
    [
        ({"BASE_DIR": "x"}, "OUT is not set"),
        ({"OUT": "o"}, "BASE_DIR is not set"),
        ({"OUT": "o", "BASE_DIR": "nope"}, "has no benchmarks/engine_steps.py"),
        ({"OUT": "o", "BASE_DIR": "{base}", "ROUNDS": "two"}, "ROUNDS must be a whole number"),
        ({"OUT": "{base}/benchmarks/engine_steps.py/x", "BASE_DIR": "{base}"}, "cannot create"),
        ({"OUT": "o", "BASE_DIR": str(ROOT)}, "BASE_DIR is this tree itself"),
    ],
)
def test_steps_ab_bad_arguments(tmp_path, env: dict[str, str], words: str) -> None:
    base = tmp_path / "base dir"
    (base / "benchmarks").mkdir(parents=True)
    (base / "benchmarks" / "engine_steps.py").write_text("")
    env = {k: v.replace("{base}", str(base)) for k, v in env.items()}
    p = _steps_ab(env, tmp_path)
    _one_line_exit_2(p, words)
    assert not (tmp_path / "o").exists() or words == "BASE_DIR is this tree itself"


def test_steps_ab_failed_rounds_are_named_in_the_summary(tmp_path) -> None:
    base = tmp_path / "base snap"  # a space in every path
    (base / "benchmarks").mkdir(parents=True)
    (base / "benchmarks" / "engine_steps.py").write_text("")
    bin_dir = tmp_path / "stub bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(STUB.replace("REAL", sys.executable))
    stub.chmod(0o755)
    env = {"OUT": "out dir", "BASE_DIR": "base snap", "ROUNDS": "3", "PATH": f"{bin_dir}:"
           + os.environ["PATH"]}  # fmt: skip
    p = _steps_ab(env, tmp_path)
    assert p.returncode == 1, p.stderr  # rounds are missing
    out = tmp_path / "out dir"
    summary = (out / "summary.txt").read_text()
    assert summary == p.stdout
    assert "base ar     rounds 2.000 / 2.000 ms, median 2.000 ms (2 of 3 rounds)" in summary
    assert "new  ddtree rounds 1.250 / 1.250 ms, median 1.250 ms (2 of 3 rounds)" in summary
    assert "missing: base round 2 (no file; log steps-base-2.txt)" in summary
    assert "missing: new round 2 (unreadable" in summary
    assert "CUDA error: boom" in (out / "steps-base-2.txt").read_text()
    assert "steps base round 2 rc=3" in p.stderr
    cmd = (out / "command.txt").read_text()
    assert "BASE_DIR=" + str(base).replace(" ", "\\ ") in cmd  # re-runnable as written
