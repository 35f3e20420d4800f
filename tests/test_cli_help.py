"""`ops --help` and `ops service --help` list one whole line per command at 80 columns (no
summary cut with "..."), and `ops hosts` shows each target's service URL and remote root whole
(#39: the first hour, items 2 and 9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def ops(*args: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "ops", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", "OPS_RUNS_DIR": "/nonexistent", **(env or {})},
        cwd=REPO,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("group", [(), ("service",)])
def test_every_summary_is_whole_on_one_line(group: tuple[str, ...]) -> None:
    text = ops(*group, "--help")
    commands = text.split("Commands:", 1)[1].rstrip().splitlines()[1:]
    assert len(commands) >= (13 if not group else 4), text
    for line in commands:
        assert not line.rstrip().endswith("..."), line
        assert len(line) <= 78 and line.rstrip().endswith("."), line


def test_hosts_shows_url_and_root_whole(tmp_path: Path) -> None:
    root = tmp_path / "a-rather-long-directory-name-for-the-remote-root" / "of-this-target"
    inv = tmp_path / "ops.toml"
    inv.write_text(
        "[targets.local]\n"
        f"remote_root = '{root}'\n"
        "[targets.local.service]\n"
        "url = 'http://127.0.0.1:31999'\n"
    )
    text = ops("hosts", "--inventory", str(inv))
    assert "http://127.0.0.1:31999" in text and str(root) in text, text


def test_releases_on_an_empty_host_is_a_sentence(tmp_path: Path) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text(f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n")
    text = ops("releases", "local", "--inventory", str(inv), env={"OPS_RUNS_DIR": str(tmp_path)})
    assert "no releases on local" in text and "ops deploy local" in text, text


def test_a_decide_step_shows_its_own_verdict() -> None:
    """The rollout table's decide row shows what decide said (GO), though the report after a
    noisy measure says HOLD (new-user pass: "decide | HOLD | GO" contradicted itself)."""
    from ops.cli.rollout import _mark

    assert "GO[/]" in _mark("decide", "ok", "HOLD", "GO") and "HOLD" not in _mark(
        "decide", "ok", "HOLD", "GO"
    )
    assert "NO-GO" in _mark("report", "fail", "NO-GO", "NO-GO: ceiling_below_threshold")
    assert "FAIL" in _mark("bench", "fail", "NO-GO", "the bench failed")


def test_bench_without_a_gpu_and_report_paths_read_whole(tmp_path: Path) -> None:
    """`ops bench` on a host with no GPU says "(no GPU)", not a "GPU -" header; `ops report`
    prints one whole report path a line, copyable at 80 columns (#39 item 9)."""
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        "[targets.local.service]\nurl = 'http://127.0.0.1:9'\n"
    )
    env = {
        **os.environ,
        "COLUMNS": "80",
        "OPS_RUNS_DIR": str(tmp_path / "runs"),
        "PATH": "/usr/bin:/bin",
    }
    res = subprocess.run(
        [sys.executable, "-m", "ops", "bench", "local", "-i", str(inv)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 3 and "bench local (no GPU)" in res.stdout, res.stdout + res.stderr
    assert "GPU -" not in res.stdout
    out = tmp_path / ("a-rather-long-directory-name-" * 3) / "out"
    records = REPO / "tests" / "fixtures" / "records" / "rollout_attn"
    res = subprocess.run(
        [sys.executable, "-m", "ops", "report", str(records), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("report: ")]
    assert [ln.removeprefix("report: ") for ln in lines] == [
        str(out / f"report.{f}") for f in ("md", "html", "json")
    ], res.stderr
