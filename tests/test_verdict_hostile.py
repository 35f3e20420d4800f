"""`ops report` and `ops rollout` under hostile input and Ctrl-C, through the real CLI: every
user mistake is one line on stderr and exit 2 (no traceback); Ctrl-C is exit 130 with a record
saying so and nothing left running."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli import run_ops
from helpers.sshd import free_port

RECORDS = Path(__file__).parent / "fixtures" / "records"
SEED = ("preflight_ok", "bench_tree", "profile_tree", "rollout_tree")
ROOT = Path(__file__).resolve().parent.parent


def ops(tmp: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs"), "COLUMNS": "80"}
    return run_ops(*args, env=env, timeout=timeout, cwd=ROOT)


def one_line_exit_2(res: subprocess.CompletedProcess[str], want: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr and "Error:" not in res.stderr, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("hint:")]
    assert len(lines) == 1, res.stderr
    assert want in lines[0], lines[0]


def seed(tmp: Path) -> list[str]:
    return [str(RECORDS / n) for n in SEED]


def test_report_out_that_is_a_file_or_unwritable_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = ops(tmp_path, "report", *seed(tmp_path), "--out", str(afile), "--format", "md")
    one_line_exit_2(res, "not a directory")
    assert afile.read_text() == "x"
    res = ops(tmp_path, "report", *seed(tmp_path), "--out", "/proc/nope", "--format", "md")
    one_line_exit_2(res, "/proc/nope")
    res = ops(tmp_path, "report", *seed(tmp_path), "--out", str(tmp_path / "new" / "dir"))
    assert res.returncode == 1, res.stderr  # a new directory is made: the seed is NO-GO
    assert (tmp_path / "new" / "dir" / "report.md").is_file()


def test_report_record_not_utf8_or_too_deep_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "record.json").write_bytes(b"\xff\xfe\x00garbage")
    one_line_exit_2(ops(tmp_path, "report", str(bad)), "not UTF-8")
    (bad / "record.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_exit_2(ops(tmp_path, "report", str(bad)), "nested too deeply")


def _bomb(field: str) -> str:
    """Ten levels of nine aliases each: 9**10 names if anything walks it whole."""
    lines = ["steps:", "  - step: bench", f"    {field}: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"  - step: bench\n    {field}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (b"\xd1\x8f\xff\x00\x01binary", "not UTF-8"),
        (("x: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "nested too deeply"),
        (_bomb("name").encode(), "name"),
        (_bomb("step").encode(), "step"),
        (b"", "must be a mapping"),
    ],
    ids=["binary", "deep", "bomb-name", "bomb-step", "empty"],
)
def test_bad_playbook_files_are_one_line(tmp_path: Path, content: bytes, want: str) -> None:
    pb = tmp_path / "pb.yaml"
    pb.write_bytes(content)
    t0 = time.monotonic()
    res = ops(tmp_path, "rollout", "local", "--playbook", str(pb))
    one_line_exit_2(res, want)
    assert time.monotonic() - t0 < 20
    assert not (tmp_path / "runs").exists()  # validated whole before anything ran


def test_playbook_that_is_a_directory_says_so(tmp_path: Path) -> None:
    res = ops(tmp_path, "rollout", "local", "--playbook", str(tmp_path))
    one_line_exit_2(res, "is a directory")


def _left_for(port: int) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [ln for ln in ps.splitlines() if str(port) in ln and "ps -eo" not in ln]


def test_ctrl_c_during_rollout_is_130_with_the_step_recorded(tmp_path: Path) -> None:
    # a "service" that takes connections and never answers: the pre-flight waits on it
    port = free_port()
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    url = f"http://127.0.0.1:{port}"
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        f"[targets.local.service]\nurl = '{url}'\n"
    )
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "80"}
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ops", "rollout", "local", "-i", str(inv)]
            + ["--playbook", "healthcheck-only"],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 20
        while "preflight (healthcheck) ..." not in err_path.read_text():
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        # well inside the pre-flight: its first request waits on the silent service (a
        # connection in the listening socket's queue, never accepted, makes it readable)
        assert select.select([sock], [], [], 20)[0], err_path.read_text()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        sock.close()
    stderr = err_path.read_text()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "preflight: interrupted" in stderr, stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert f"record: {run}/record.json" in stderr, stderr
    rec = json.loads((run / "record.json").read_text())
    assert rec["outcome"] == "interrupted" and rec["exit_code"] == 130
    assert [(s["name"], s["status"]) for s in rec["steps"]] == [("preflight", "interrupted")]
    step = json.loads((run / "01-preflight" / "record.json").read_text())
    assert step["outcome"] == "interrupted"
    deadline = time.monotonic() + 0.5
    while _left_for(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _left_for(port) == []  # nothing of the rollout left running (within 0.5 s)
