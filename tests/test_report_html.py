"""report.html in a real headless Chromium (Debian's `chromium`): it renders without console
errors, shows the verdict and the SVG charts, and a screenshot is kept as a test artifact
(under $OPS_TEST_ARTIFACTS, else runs/artifacts/). Skipped only where chromium is absent and
`CI` is unset; in CI a missing chromium fails the test."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import app

REPO = Path(__file__).resolve().parent.parent
RECORDS = Path(__file__).parent / "fixtures" / "records"
CASES = {
    "GO": ("rollout_attn",),
    "NO-GO": (
        "preflight_identity_mismatch",
        "deploy_ok",
        "postflight_smoke_fail",
        "bench_tripped",
        "profile_tree",
        "rollout_tree",
    ),
    "HOLD": ("preflight_no_golden", "bench_no_gpu", "profile_attn", "rollout_attn_change"),
}
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)
CONSOLE = re.compile(r"CONSOLE[^\]]*\]|Uncaught")


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but Debian's chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return exe


def browse(exe: str, page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )


def console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if CONSOLE.search(ln)]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def artifacts_dir() -> Path:
    return Path(os.environ.get("OPS_TEST_ARTIFACTS") or REPO / "runs" / "artifacts")


def test_console_error_detection_works(tmp_path: Path) -> None:
    """The check below must be able to fail: a page that throws is caught."""
    exe = chromium()
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>throw new Error('boom')</script></body></html>")
    res = browse(exe, page, tmp_path, "--dump-dom")
    assert any("Uncaught Error: boom" in ln for ln in console_errors(res.stderr)), res.stderr


@pytest.mark.parametrize("verdict", sorted(CASES))
def test_report_html_in_headless_chromium(tmp_path: Path, verdict: str) -> None:
    exe = chromium()
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["report", *(str(RECORDS / n) for n in CASES[verdict]), "--out", str(out), "--json"],
    )
    assert res.exit_code == {"GO": 0, "NO-GO": 1, "HOLD": 3}[verdict], res.stdout
    page = out / "report.html"
    html = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page loads nothing"

    dom = browse(exe, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_errors(dom.stderr) == []
    assert f'<span class="badge" id="verdict-badge">{verdict}</span>' in dom.stdout
    charts = re.findall(r'<svg [^>]*class="chart"', dom.stdout)
    want = {"GO": 4, "NO-GO": 3, "HOLD": 1}[verdict]  # gain, 2 speedups, stages / stages only
    assert len(charts) == want, len(charts)
    assert "step time by stage" in dom.stdout and 'id="amdahl"' in dom.stdout

    shot = tmp_path / f"report-{verdict}.png"
    res2 = browse(exe, page, tmp_path, f"--screenshot={shot}", "--window-size=1280,1600")
    assert res2.returncode == 0 and console_errors(res2.stderr) == []
    assert png_size(shot) == (1280, 1600) and shot.stat().st_size > 50_000  # drawn, not blank
    keep = artifacts_dir()
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy2(shot, keep / shot.name)
    shutil.copy2(page, keep / f"report-{verdict}.html")
