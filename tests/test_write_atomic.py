"""`checks.atomic.write_atomic`, the one atomic write the data plane and the control plane share:
whole files, mode 0600, nothing left behind on failure; and the SGLang hook that imports it
stays light (standard library, `integration` and `checks` only)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from checks.atomic import write_atomic
from checks.identity import keep_previous
from ops.hosts.records import RunDir


def test_writes_whole_file_in_new_directory_mode_0600_no_temp_left(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "golden.json"
    write_atomic(path, b"first")
    write_atomic(path, b"second, longer than the first")
    assert path.read_bytes() == b"second, longer than the first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["golden.json"]


def test_failed_replace_removes_temp_and_keeps_target(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    target.mkdir()  # rename(2) of a file over a directory fails
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        write_atomic(target, b"{}")
    assert (target / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_golden_and_run_record_use_it(tmp_path: Path) -> None:
    golden = tmp_path / "golden.json"
    write_atomic(golden, b'{"v": 1}')
    kept = keep_previous(golden)
    write_atomic(golden, b'{"v": 2}')
    assert kept is not None and json.loads(kept.read_text()) == {"v": 1}
    assert json.loads(golden.read_text()) == {"v": 2}
    run = RunDir.create("test", "local", root=tmp_path / "runs")
    dest = run.write_json("record.json", {"ok": True})
    assert json.loads(dest.read_text()) == {"ok": True}
    assert [p.name for p in run.path.iterdir()] == ["record.json"]


def test_hook_imports_only_stdlib_integration_and_checks() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import integration.hook\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - {'integration', 'checks'} - set(sys.stdlib_module_names)))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
