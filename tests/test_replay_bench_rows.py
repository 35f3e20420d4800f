"""benchmarks/replay_bench_rows.py on the committed forward-sampler rollout: its own rows give
back its own projection; the unspread rows of the same lease give the replay committed beside
it; a missing input is exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "replay_bench_rows.py"
RESULTS = ROOT / "benchmarks" / "results" / "2026-12-03-328fe7e-h200-rollouts-forward-sampler"


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
        timeout=120, cwd=ROOT,
    )  # fmt: skip


def _predicted(report: Path) -> list[str]:
    lines = report.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("| c | predicted |"))
    return [ln.split("|")[2].split()[0] for ln in lines[i + 2 : i + 5]]


def test_replay_with_its_own_rows_and_with_the_unspread_rows(tmp_path: Path) -> None:
    run = next((RESULTS / "rollout-attn" / "runs").glob("*-rollout-local"))
    assert _predicted(run / "report.md") == ["+31.425%", "+39.523%", "+42.014%"]
    own = tmp_path / "own.json"
    rows = json.loads((run / "02-bench" / "record.json").read_text())["bench"]["rows"]
    own.write_text(json.dumps({"results": rows}))
    res = _run(run, own, tmp_path / "same")
    assert res.returncode == 0, res.stderr
    assert "32 row_attention* rows replaced by 32" in res.stdout
    assert _predicted(tmp_path / "same" / "report.md") == _predicted(run / "report.md")
    res = _run(run, RESULTS / "stage-variants" / "kb-spread0-piece300.json", tmp_path / "flat")
    assert res.returncode == 0, res.stderr
    got = _predicted(tmp_path / "flat" / "report.md")
    assert got == ["+30.748%", "+29.412%", "+26.746%"]
    assert got == _predicted(RESULTS / "replay-unspread" / "report.md")
    bad = _run(tmp_path / "nowhere", own, tmp_path / "x")
    assert bad.returncode == 2 and "error: needs" in bad.stderr and not (tmp_path / "x").exists()
    for text in ("{not json", '{"rows": []}', "[1, 2]", '{"results": null}', '{"results": [1]}'):
        junk = tmp_path / "junk.json"
        junk.write_text(text)
        bad = _run(run, junk, tmp_path / "y")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, (text, bad.stderr)
        assert "not a bench record / a kernels.bench --json document" in bad.stderr, text
        assert not (tmp_path / "y").exists(), text  # nothing half-written
