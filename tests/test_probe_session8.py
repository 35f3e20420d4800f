"""Session 8's new flags fed bad input as a new user would: each mistake is one `error:` line and
exit 2 before anything heavy runs (a huge tree budget used to pass `python -m engine --check`
and then overflow the KV cache's allocation once the port was bound); a playbook's measure.cycles
refuses true/false and says when the step's phase cannot alternate."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import REPO
from helpers.scripts import one_line

from ops.rollout.playbook import PlaybookError
from ops.rollout.playbook_load import load_playbook

HUGE = "99999999999999999999"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--budget", HUGE],
        ["--max-budget", HUGE],
        ["--max-budget", "4097"],
        ["--budget", "-1"],
        ["--seed", HUGE],
        ["--max-batch-size", HUGE],
        ["--threads", HUGE],
        ["--load-delay", "1e20"],
    ],
)
def test_engine_check_refuses_a_budget_past_the_cap(args: list[str]) -> None:
    r = _run("-m", "engine", "--preset", "tiny", "--port", "1", *args, "--check")
    assert r.returncode == 2
    assert "--" in one_line(r.stderr) and json.loads(r.stdout)["ok"] is False


def test_engine_check_takes_the_largest_budget() -> None:
    r = _run("-m", "engine", "--preset", "tiny", "--port", "1", "--max-budget", "4096", "--check")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True, r.stderr


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


def test_attn_bench_refuses_a_huge_max_budget(capsys: pytest.CaptureFixture[str]) -> None:
    from engine import attn_bench

    argv = ["--device", "cpu", "--preset", "tiny", "--prompt-len", "24", "--max-budget", HUGE]
    assert attn_bench.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--max-budget must be <= 4096" in one_line(err)
    assert attn_bench.main([*argv[:-2], "--seed", HUGE]) == 2
    assert "--seed must be in" in one_line(capsys.readouterr().err)


def _measure(tmp: Path, after: str, before: str = "") -> PlaybookError:
    path = tmp / "pb.yaml"
    path.write_text(
        "change: {component: tree_build, baseline: reference, candidate: cuda}\nsteps:\n"
        "  - step: profile\n"
        f"  - step: measure\n    phase: before\n{before}"
        "  - step: deploy\n"
        f"  - step: measure\n    phase: after\n{after}"
        "  - step: report\n"
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(path))
    assert "\n" not in info.value.message
    return info.value


def test_measure_cycles_refuses_true_and_the_before_phase(tmp_path: Path) -> None:
    e = _measure(tmp_path, "    recheck: true\n    cycles: true\n")
    assert e.field == "cycles" and "not true/false" in e.message
    e = _measure(tmp_path, "", before="    cycles: 2\n")
    assert e.field == "cycles" and "phase 'after'" in e.message
    e = _measure(tmp_path, "    cycles: 2\n")
    assert e.field == "cycles" and "recheck: true" in e.message
    e = _measure(tmp_path, "    repeats: false\n")
    assert e.field == "repeats" and "not true/false" in e.message
    with pytest.raises(PlaybookError) as info:
        load_playbook("rollout", ["measure.recheck=true", "measure.cycles=true"])
    assert "not true/false" in info.value.message and "(from --set)" in info.value.message
    with pytest.raises(PlaybookError) as info:
        load_playbook("rollout", ["bench.probe_interval=true"])
    assert info.value.field == "probe_interval" and "not true/false" in info.value.message
    good = load_playbook("rollout", ["measure.recheck=true", "measure.cycles=2"])
    assert [s.cycles for s in good.steps if s.step == "measure"][-1] == 2
