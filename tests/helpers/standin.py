"""`StandIn`: the real `ops deploy` on target `local` with a release that deploys in seconds.

The release comes from a small git repository (as in tests/test_deploy_hostile.py):
`engine/svc.py` is tests/helpers/fake_service.py, the service, run from `current/`;
`kernels/selftest.py` a stand-in self-test that passes after `DELAY` seconds (0 as made;
`slow_selftest` commits a longer one). The target has its own remote root and port; the
records go to `runs` (default `<tmp>/runs`). The CLI runs from this checkout (`python -m ops`
with the repository as its working directory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import FAKE_SERVICE, REPO
from .cli import ops_json, run_ops
from .deploy import commit_change, git
from .sshd import free_port

SELFTEST = '''"""Stand-in self-test (tests/helpers/standin.py)."""
import json
import time

DELAY = 0
time.sleep(DELAY)
print(json.dumps({"ok": True, "gpu": "skipped: stand-in", "ops": []}))
'''


def make_source(tmp: Path) -> Path:
    """A git repository holding the stand-in service and self-test, one commit."""
    src = tmp / "src"
    (src / "engine").mkdir(parents=True)
    (src / "kernels").mkdir()
    shutil.copy2(FAKE_SERVICE, src / "engine" / "svc.py")
    (src / "engine" / "__main__.py").write_text("raise SystemExit('stand-in: run engine/svc.py')\n")
    (src / "kernels" / "__init__.py").write_text("")
    (src / "kernels" / "selftest.py").write_text(SELFTEST)
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "first")
    return src


class StandIn:
    """The real `ops` CLI on `local` (own root, own port), releases from `make_source`."""

    def __init__(self, tmp: Path, runs: Path | None = None) -> None:
        self.tmp, self.src = tmp, make_source(tmp)
        self.root, self.port = tmp / "root", free_port()
        self.runs = runs or tmp / "runs"
        self.inventory = tmp / "ops.toml"
        self.inventory.write_text(
            "[targets.local]\n"
            f"remote_root = '{self.root}'\n"
            "[targets.local.service]\n"
            f"url = 'http://127.0.0.1:{self.port}'\n"
            "command = '{python} engine/svc.py --port {port}'\n"
            "stop_timeout = 2\n"
        )
        self.env = {**os.environ, "OPS_RUNS_DIR": str(self.runs), "COLUMNS": "80"}
        self.env.pop("OPS_INVENTORY", None)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "ops", *args, "--inventory", str(self.inventory)]

    def deploy_args(self, *extra: str) -> tuple[str, ...]:
        return ("deploy", "local", "--source", str(self.src), "--max-tokens", "3", *extra)

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_ops(*args, inventory=self.inventory, env=self.env, timeout=timeout, cwd=REPO)

    def json(self, *args: str) -> tuple[int, dict, str]:
        return ops_json(*args, inventory=self.inventory, env=self.env, timeout=120, cwd=REPO)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """`ops ARGS` started in a session of its own (so a test can end what it left)."""
        return subprocess.Popen(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=REPO,
            start_new_session=True,
        )

    def slow_selftest(self, seconds: int) -> None:
        commit_change(self.src, "kernels/selftest.py", "DELAY = 0", f"DELAY = {seconds}")

    def current(self) -> str | None:
        link = self.root / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None
