"""A remote root that cannot be written is said so, not taken for a lock someone holds.

The host lock (`ops.hosts.remote.Host.lock`: flock on `<remote_root>/lock`, and the holder's note
`lock.holder`) used to read a lock file it could not open as "host lock held by a holder that
is still starting". On a read-only root (a real read-only bind mount, EROFS) every command that
takes the lock is one line, exit 2: `cannot write in remote root ROOT (full, read-only or not ours):
ROOT/lock: Read-only file system`, with a hint, and no traceback; the root is left as it was.
The mount needs root (this test runs as root in CI); it is skipped, saying why, where
mount(8) is not allowed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE
from helpers.cli import ops_json, run_ops
from helpers.sshd import free_port


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def ro_root(tmp_path: Path) -> Iterator[Path]:
    """A remote root with a lock file and a release dir in it, bind-mounted read-only on
    itself (unmounted after the test)."""
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "lock").touch()  # one that an earlier deploy left: it exists, yet cannot be opened
    res = _mount("--bind", str(root), str(root))
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    try:
        res = _mount("-o", "remount,ro,bind", str(root))
        if res.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {res.stderr.strip()}")
        with pytest.raises(OSError) as info:  # read-only indeed, even for root
            os.open(root / "lock", os.O_WRONLY | os.O_APPEND)
        assert info.value.strerror == "Read-only file system"
        yield root
    finally:
        subprocess.run(["umount", str(root)], capture_output=True)


def _inventory(tmp: Path, root: Path) -> Path:
    inv = tmp / "ops.toml"
    inv.write_text(
        "[targets.local]\n"
        f"remote_root = '{root}'\n"
        "[targets.local.service]\n"
        "name = 'svc'\n"
        f"url = 'http://127.0.0.1:{free_port()}'\n"
        f"command = '{{python}} {FAKE_SERVICE} --port {{port}}'\n"
    )
    return inv


# `stop` goes on without the lock on a read-only root (probe37c C7: tests/test_service_orphans.py)
@pytest.mark.parametrize("verb", ["start", "restart"])
def test_a_read_only_root_is_one_line_not_a_lock_held(
    tmp_path: Path, ro_root: Path, verb: str
) -> None:
    inv = _inventory(tmp_path, ro_root)
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    code, doc, err = ops_json("service", verb, "local", inventory=inv, env=env, timeout=60)
    assert code == 2, (code, doc, err)
    assert doc["error"] == "HostError" and doc["step"] == "lock", doc
    want = (
        f"cannot write in remote root {ro_root} (full, read-only or not ours): "
        f"{ro_root}/lock: Read-only"
    )
    assert want in doc["message"], doc["message"]
    assert "still starting" not in doc["message"] and "held" not in doc["message"]
    assert "writable" in doc["hint"]
    res = run_ops("service", verb, "local", inventory=inv, env=env, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == f"error: local: lock: {want} file system", lines
    assert lines[1].startswith("hint: ") and len(lines) == 2, lines
    assert sorted(p.name for p in ro_root.iterdir()) == ["lock", "run"]  # untouched
