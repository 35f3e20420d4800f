"""`python -m engine.attn_bench`: the engine's own attention stage as kernels.bench rows.

Bad input (an empty, directory or unreachable `--json`, a prompt past the model's context, a
max budget or seed past its range) is one `error:` line and exit 2 with nothing on stdout, and an
earlier result at `--json` is left as it was; a batch size given twice runs once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.cli import one_line

from ops.sections.bench import KernelRow

ROOT = Path(__file__).resolve().parent.parent

SHAPE_KEYS = {"B", "L", "heads", "kv_dim", "dtype", "layers", "preset"}
TINY = ["--device", "cpu", "--preset", "tiny"]
HUGE = "99999999999999999999"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.attn_bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _rows(doc: dict) -> list[KernelRow]:
    return [KernelRow.model_validate(r) for r in doc["results"]]


def test_cpu_rows_validate_as_kernel_rows(tmp_path) -> None:
    out = tmp_path / "attn.json"
    p = _run(
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--impls",
        "torch",
        "--batch",
        "1",
        "2",
        "--steps",
        "3",
        "--warm",
        "1",
        "--prompt-len",
        "24",
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # exactly one JSON document on stdout
    assert json.loads(out.read_text()) == doc
    assert doc["command"].startswith("python -m engine.attn_bench")
    assert doc["config"]["impls"] == ["torch"] and "environment" in doc
    rows = _rows(doc)
    decode = [r for r in rows if r.kernel == "row_attention"]
    prefill = [r for r in rows if r.kernel == "row_attention_prefill"]
    assert [r.batch for r in decode] == [1, 2] and [r.batch for r in prefill] == [1]
    for r in rows:
        assert r.suite == "attn" and r.impl == "torch_engine" and r.mode == "engine_stage"
        assert r.median_us > 0 and r.p25_us <= r.median_us <= r.p75_us
        assert SHAPE_KEYS <= set(r.shape) and r.shape["L"] == 24
        assert r.refcheck is None and not r.speedup  # one impl: nothing to compare
    for r in decode:
        assert r.reps == 3 and r.shape["T"] == 13 and r.shape["prefix_span"] == 64
    assert prefill[0].reps == 3  # one prefill per sequence: 1 + 2
    # the batch of 2 decodes from staggered prefixes: L - 1 and L - 1 + 64 // 2
    two = next(r for r in decode if r.batch == 2)
    assert two.model_extra["kv_len_first"] == [23, 55]
    assert two.model_extra["kv_len_last"][0] > 23


@pytest.mark.parametrize(
    "args, words",
    [
        (["--batch", "0"], "--batch must be >= 1"),
        (["--impls", "nope"], "invalid choice"),
        (["--impls", "cuda"], "needs --device cuda"),
        (["--steps", "100"], "past this model's context"),
        (["--prompt-len", "1"], "--prompt-len must be >= 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str, capsys) -> None:
    # in this process (a subprocess each costs a torch import; one below runs the real CLI)
    from engine import attn_bench

    code = attn_bench.main(["--device", "cpu", "--preset", "tiny", "--prompt-len", "24", *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], err


def test_bad_input_from_the_command_line_is_one_line_and_exit_2() -> None:
    p = _run("--device", "cpu", "--preset", "tiny", "--batch", "0")
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--batch must be >= 1" in lines[0], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.gpu
def test_gpu_both_impls_carry_speedup_and_refcheck() -> None:
    # fp32 matmuls: torch's bmm then computes fp32 as the CUDA kernel does (under TF32 a near
    # tie may break differently between the backends; the bench records that, not fails)
    p = _run(
        "--device",
        "cuda",
        "--preset",
        "small",
        "--batch",
        "1",
        "8",
        "--steps",
        "4",
        "--warm",
        "1",
        "--prompt-len",
        "256",
        "--matmul",
        "fp32",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = _rows(doc)
    for kernel, batches in (("row_attention", [1, 8]), ("row_attention_prefill", [1])):
        for impl in ("torch_engine", "cuda_engine"):
            got = [r for r in rows if r.kernel == kernel and r.impl == impl]
            assert [r.batch for r in got] == batches, (kernel, impl)
            for r in got:
                assert r.median_us > 0 and r.refcheck is True
                if impl == "cuda_engine":
                    assert r.speedup["torch_engine"] > 0
    assert doc["refcheck"] == {"1": True, "8": True}


def test_cpu_same_prompt_keeps_the_batch_at_one_prefix() -> None:
    """`--same-prompt --prefix-span 0` is a load of one prompt: every request commits the same
    tokens, so the batch starts and stays at one prefix (the rollout's layout)."""
    p = _run(
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--batch",
        "3",
        "--steps",
        "3",
        "--warm",
        "1",
        "--prompt-len",
        "64",
        "--prefix-span",
        "0",
        "--same-prompt",
    )
    assert p.returncode == 0, p.stderr
    (step,) = [r for r in json.loads(p.stdout)["results"] if r["kernel"] == "row_attention"]
    assert step["shape"]["same_prompt"] is True and step["shape"]["prefix_span"] == 0
    first, last = step["kv_len_first"], step["kv_len_last"]
    assert first[0] == first[1] and last[0] == last[1] and last[0] > first[0]
    # golden prompts cycled instead: the requests accept different lengths and drift apart
    p = _run(
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--batch",
        "3",
        "--steps",
        "3",
        "--warm",
        "1",
        "--prompt-len",
        "64",
        "--prefix-span",
        "0",
    )
    (step,) = [r for r in json.loads(p.stdout)["results"] if r["kernel"] == "row_attention"]
    assert "same_prompt" not in step["shape"]


@pytest.mark.gpu
def test_gpu_engine_attn_suite_rows() -> None:
    """`kernels.bench --suite engine_attn`: engine.attn_bench in a child, its rows (both impls,
    decode at each batch and the prefill, mode engine_stage) in kernels.bench's document, the
    batch in lockstep, the child's peak memory under the guard's estimate."""
    from ops.measure.gpu_guard import suite_bytes

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.bench",
            "--json",
            "--suite",
            "engine_attn",
            "--batch",
            "1,8",
            "--prefix-len",
            "256",
            "--engine-max-budget",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    rows = _rows(doc)
    for kernel, batches in (("row_attention", [1, 8]), ("row_attention_prefill", [1])):
        for impl in ("torch_engine", "cuda_engine"):
            got = [r for r in rows if r.kernel == kernel and r.impl == impl]
            assert [r.batch for r in got] == batches, (kernel, impl)
            assert all(r.median_us > 0 and r.mode == "engine_stage" for r in got)
    for r in doc["results"]:
        if r["kernel"] == "row_attention":
            assert r["shape"]["T"] == 17 and r["shape"]["same_prompt"] is True
            assert r["kv_len_last"][0] == r["kv_len_last"][1]  # one prefix, start to end
        assert "--same-prompt" in r["engine_command"]
    assert doc["refcheck_failed"] == []  # engine_refcheck is recorded, never a failure
    peak = max(r["engine_peak_reserved_mib"] for r in doc["results"])
    assert 0 < peak * 2**20 < suite_bytes("engine_attn", [1, 8])


def test_engine_attn_suite_passes_the_service_config_and_the_childs_errors() -> None:
    """The suite's child command line carries the engine as configured (a spread drops
    --same-prompt); a prompt past the preset's context is refused before any child runs; a
    child that fails (here: CUDA asked of a CPU-only torch) is a SuiteError with its exit code
    and its one line."""
    import torch

    from engine.bench_suite import SuiteError, engine_argv, engine_attn_suite
    from kernels.bench import BenchConfig

    cfg = BenchConfig([1, 32], prefix_lens=[1024], engine_max_budget=0, matmul="fp32")
    argv = engine_argv(cfg, 1024)
    assert argv[1:3] == ["-m", "engine.attn_bench"] and "--same-prompt" in argv
    assert argv[argv.index("--batch") + 1 : argv.index("--prompt-len")] == ["1", "32"]
    assert argv[argv.index("--max-budget") + 1] == "0"
    assert argv[argv.index("--matmul") + 1] == "fp32"
    spread = BenchConfig([1], prefix_lens=[64], decode_spread=16)
    argv = engine_argv(spread, 64)
    assert "--same-prompt" not in argv and argv[argv.index("--prefix-span") + 1] == "16"
    assert "--max-budget" not in argv  # None: the preset's own
    with pytest.raises(ValueError, match="past the small engine's context"):  # before a child
        engine_attn_suite(BenchConfig([1], prefix_lens=[4096]))
    if torch.cuda.is_available():
        return  # the child below would run
    with pytest.raises(SuiteError) as exc:  # a real child, refusing --device cuda here
        engine_attn_suite(BenchConfig([1], prefix_lens=[64]))
    assert exc.value.code == 2 and "CUDA is not available" in str(exc.value)
    assert str(exc.value).startswith("engine_attn (L=64): engine.attn_bench exited 2: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-preset", "nope"], "--engine-preset 'nope': unknown; known: small, tiny"),
        (["--engine-max-budget", "99999"], "--engine-max-budget must be <= 4096"),
        (["--prefix-len", "999999"], "--prefix-len 999999 left out"),
        (["--batch", "100"], "--batch 100 is past the small engine's 64"),
    ],
)
def test_kernels_bench_checks_the_engine_settings_on_any_host(args, message) -> None:
    """engine_attn's settings are checked before any suite runs, on a CPU host too (not only
    once a child runs on a GPU): one line, exit 2."""
    p = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--json", "--suite", "engine_attn", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [f"error: {p.stderr.strip()[7:]}"]
    assert message in p.stderr


def test_kernels_bench_leaves_out_prompt_lengths_past_the_engines_context() -> None:
    """The tiny preset's 512-token context holds L=64 but not the default 1024: that length is
    left out with a note in the document; the rest would run (CPU: the suite needs CUDA)."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.bench",
            "--json",
            "--suite",
            "engine_attn",
            "--engine-preset",
            "tiny",
            "--batch",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    notes = json.loads(p.stdout)["notes"]
    assert notes[0].startswith("engine_attn: --prefix-len 1024 left out")
    assert "past the tiny engine's context (512)" in notes[0]
    assert not any("--prefix-len 64 " in n for n in notes)


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
        bad = pool.submit(
            _py,
            "-m",
            "engine.attn_bench",
            *TINY,
            "--prompt-len",
            "8",
            "--steps",
            "999",
            "--json",
            str(kept),
        )
        good = pool.submit(
            _py,
            "-m",
            "engine.attn_bench",
            *TINY,
            "--prompt-len",
            "8",
            "--steps",
            "1",
            "--warm",
            "0",
            "--prefix-span",
            "0",
            "--batch",
            "2",
            "2",
            "1",
            "--json",
            str(out),
        )
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


def test_attn_bench_refuses_a_huge_max_budget(capsys: pytest.CaptureFixture[str]) -> None:
    from engine import attn_bench

    argv = ["--device", "cpu", "--preset", "tiny", "--prompt-len", "24", "--max-budget", HUGE]
    assert attn_bench.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--max-budget must be <= 4096" in one_line(err)
    assert attn_bench.main([*argv[:-2], "--seed", HUGE]) == 2
    assert "--seed must be in" in one_line(capsys.readouterr().err)
