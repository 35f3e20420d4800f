"""Run records tell the truth about a run, whatever the disk or a kill does to them.

- On a full disk (the runs directory on a 64 KiB tmpfs, filled) a deploy that succeeded is a
  success: exit 0, the summary with the release now current, and one warning line naming the
  record's path and the OS error (ENOSPC) instead of a traceback and exit 1 while the host
  serves the new release. With `--json` the document says so (`record_error`). No half-written
  record and no temp file is left. Any other command alike (`ops facts`).
- A run directory holds a record from its command's start: a deploy killed with SIGKILL in its
  self-test leaves `record.json` with outcome `running` (inputs, start time, its pid), not an
  empty directory; `ops report` reads it and says the run did not finish (HOLD), no traceback.

Real processes throughout: the `ops` CLI, the stand-in release's service (tests/helpers/
deploy_ops.py), a real tmpfs (mounted as root; the test is skipped, saying so, where mount(8) is
not allowed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cli import ops_json, run_ops
from helpers.deploy_ops import Ops
from helpers.local import end_services


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A runs directory on a 64 KiB tmpfs with no space left (a write there gets ENOSPC)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt))
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        (mnt / "runs").mkdir()
        fd = os.open(mnt / "filler", os.O_CREAT | os.O_WRONLY)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        probe = mnt / "runs" / "probe"
        with pytest.raises(OSError) as info:  # the disk is full indeed
            fd = os.open(probe, os.O_CREAT | os.O_WRONLY)
            try:
                os.write(fd, b"x")
                os.fsync(fd)
            finally:
                os.close(fd)
                probe.unlink()
        assert info.value.errno == 28
        yield mnt / "runs"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("warning:")]


def test_a_full_disk_does_not_turn_a_deploy_into_a_failure(tmp_path: Path, full_disk: Path) -> None:
    ops = Ops(tmp_path, runs=full_disk)
    try:
        res = ops.deploy("--bootstrap")
        assert "Traceback" not in res.stderr, res.stderr
        assert res.returncode == 0, (res.stdout, res.stderr)
        release = ops.current()
        assert release and release in res.stdout and "deployed" in res.stdout, res.stdout
        (warning,) = _warnings(res.stderr)
        assert "the run record was not written" in warning, warning
        assert f"{full_disk}/" in warning and "/record.json: " in warning, warning
        assert "No space left on device" in warning, warning
        assert "record: " not in res.stderr  # no record line for a record that is not there
        assert _health(ops.port)  # the host serves the release the output names
        # --json: one document, the result, and what became of the record
        code, doc, err = ops_json("facts", "local", inventory=ops.inventory, env=ops.env)
        assert code == 0 and doc["target"] == "local", doc
        assert "No space left on device" in doc["record_error"], doc
        (warning,) = _warnings(err)
        assert "record.json: No space left on device" in warning and "Traceback" not in err
        # nothing half-written and no temp file: at most empty run directories
        left = [p for p in full_disk.rglob("*") if p.is_file()]
        assert left == [], left
    finally:
        end_services(ops.root)


# The runs directory's disk filled the instant the deploy's prune starts (after its record
# from the start was written): the final record gets ENOSPC.
FILL_AT_PRUNE = """
ROOT, FILL = sys.argv.pop(1), sys.argv.pop(1)
class Popen(real):
    filled = False
    def __init__(self, args, *a, **k):
        if not Popen.filled and f"' prune {ROOT}" in " ".join(map(str, args)):
            Popen.filled = True
            fd = os.open(FILL, os.O_CREAT | os.O_WRONLY)
            try:
                while os.write(fd, b"\\0" * 4096):
                    pass
            except OSError:
                pass
            os.close(fd)
        super().__init__(args, *a, **k)
"""


def test_a_record_left_running_by_a_full_disk_is_said(tmp_path: Path) -> None:
    """probe37bo L1 (low): the runs directory's disk filled during a deploy that then ended
    deployed: the warning said the record was not written, but the record from its start
    stayed, saying `running`, and nothing said so. The warning names it."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt))
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    ops = Ops(tmp_path / "o", runs=mnt / "runs")
    try:
        res = ops.driven(
            FILL_AT_PRUNE, [str(ops.root), str(mnt / "filler")], *ops.deploy_args("--bootstrap")
        )
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        (warning,) = _warnings(res.stderr)
        assert "the run record was not written" in warning, warning
        assert "the record written at its start stays there, `running`" in warning, warning
        (record,) = (mnt / "runs").glob("*-deploy-local/record.json")
        assert json.loads(record.read_text())["outcome"] == "running"
    finally:
        end_services(ops.root)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_sigkill_in_the_selftest_leaves_a_record_that_says_so(tmp_path: Path) -> None:
    ops = Ops(tmp_path)
    ops.slow_selftest(30)
    proc = ops.popen(*ops.deploy_args("--bootstrap"))
    try:
        assert proc.stderr is not None
        seen = ""
        while "selftest ..." not in seen:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert "selftest ..." in seen, seen
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)  # ops itself, as the OOM killer or `kill -9` would
        proc.wait(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the self-test it left behind
        except ProcessLookupError:
            pass
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-deploy-local")
    assert sorted(p.name for p in run.iterdir()) == ["record.json"]  # no temp file beside it
    rec = json.loads((run / "record.json").read_text())
    assert rec["outcome"] == "running" and rec["finished"] is None, rec
    assert rec["exit_code"] is None and rec["pid"] == proc.pid, rec
    assert rec["command"] == "deploy" and rec["target"] == "local" and rec["started"]
    assert rec["inputs"]["target"] == "local" and rec["inputs"]["bootstrap"] is True, rec
    # `ops report` reads it and says it did not finish; no traceback, no bad-record exit 2
    res = run_ops("report", str(run), "--json", env=ops.env)
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    assert res.returncode == 3 and doc["verdict"] == "HOLD", (res.returncode, doc)
    (hold,) = [h for h in doc["holds"] if h["code"] == "unfinished_record"]
    assert "did not finish" in hold["message"] and str(run) in hold["message"], hold
    assert f"pid {proc.pid}" in hold["message"]
    assert "did not finish" in res.stderr  # the line for people, in both modes
    end_services(ops.root)
