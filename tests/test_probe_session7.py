"""Session 7's new-user probe: the regressions found in engine.attn_bench (user mistakes one
line + exit 2; results never lost or silently not written).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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
