"""`ops deploy` / `releases` / `rollback` as a new user types them and as a hostile one does:
user mistakes are one line and exit 2; Ctrl-C (SIGINT) or SIGTERM at any step leaves the host
on its previous release and serving, with a complete record; a release whose service does not
start is rolled back with the service's own error as evidence; the tables fit 80 columns.

The target is `local` with its own remote root and port. The releases come from a small git
repository: `engine/svc.py` is tests/helpers/fake_service.py (the service, run from
`current/`, so a commit can break it), `kernels/selftest.py` a stand-in that passes (the real
self-test and the real engine are proven in test_deploy.py); each test commits the change it
needs.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE
from helpers.cli import ops_json, run_ops
from helpers.deploy import commit_change, git
from helpers.local import end_services
from helpers.sshd import free_port

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent  # the CLI runs from here: `python -m ops` is this checkout's ops
SELFTEST = '''"""Stand-in self-test (tests/test_deploy_hostile.py)."""
import json
import time

DELAY = 0
time.sleep(DELAY)
print(json.dumps({"ok": True, "gpu": "skipped: stand-in", "ops": []}))
'''
NOISY_CRASH = (
    "def main() -> None:\n"
    "    import sys\n"
    "    for i in range(30):\n"
    "        print(f'loading shard {i} of 30', file=sys.stderr, flush=True)\n"
    "    exec('def broken(:')\n"
)
TERM_DEAF = (
    "def main() -> None:\n"
    "    import signal\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    time.sleep(3600)\n"
)
ID = r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{10}"


def make_source(tmp: Path) -> Path:
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


class Ops:
    """The real `ops` CLI at 80 columns on `local` (own root, own port) and a group `fleet`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.src = tmp, make_source(tmp)
        self.root, self.port = tmp / "root", free_port()
        self.inventory = tmp / "ops.toml"
        self.inventory.write_text(
            "[targets.local]\n"
            f"remote_root = '{self.root}'\n"
            "[targets.local.service]\n"
            f"url = 'http://127.0.0.1:{self.port}'\n"
            "command = '{python} engine/svc.py --port {port}'\n"
            "stop_timeout = 2\n"
            "[groups]\n"
            "fleet = ['local']\n"
        )
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs"), "COLUMNS": "80"}
        self.env.pop("OPS_INVENTORY", None)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "ops", *args, "--inventory", str(self.inventory)]

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_ops(*args, inventory=self.inventory, env=self.env, timeout=timeout, cwd=REPO)

    def json(self, *args: str) -> tuple[int, dict]:
        inv, env = self.inventory, self.env
        code, doc, _ = ops_json(*args, inventory=inv, env=env, timeout=120, cwd=REPO)
        return code, doc

    def deploy(self, *extra: str, target: str = "local") -> subprocess.CompletedProcess[str]:
        return self("deploy", target, "--source", str(self.src), "--max-tokens", "3", *extra)

    def interrupt_at(
        self,
        marker: str,
        *extra: str,
        sig: int = signal.SIGINT,
        delay: float = 0.0,
        first: Callable[[], None] | None = None,
    ) -> tuple[int, str, str, float]:
        """Start a deploy, send `sig` once `marker` shows on stderr: (exit, stdout, stderr, s)."""
        proc = subprocess.Popen(
            self.argv("deploy", *extra, "--source", str(self.src), "--max-tokens", "3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=REPO,
        )
        assert proc.stderr is not None
        seen = ""
        while marker not in seen:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert marker in seen, seen
        time.sleep(delay)
        if first is not None:
            first()
        proc.send_signal(sig)
        t0 = time.monotonic()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return proc.returncode, out, seen + err, time.monotonic() - t0

    def current(self) -> str | None:
        link = self.root / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def record(self, command: str) -> dict:
        runs = sorted((self.tmp / "runs").glob(f"*-{command}-*"))
        return json.loads((runs[-1] / "record.json").read_text())

    def serving(self, seconds: float = 20) -> str:
        """Wait until the service is active; the release its process runs from."""
        deadline = time.monotonic() + seconds
        while True:
            code, st = self.json("service", "status", "local")
            if st.get("state") == "active" or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert st.get("state") == "active", st
        return Path(os.readlink(f"/proc/{st['pid']}/cwd")).name

    def stop(self) -> None:
        self("service", "stop", "local")

    def guard_alive(self) -> bool:
        """A deploy's guard holds deploy.guard for as long as it lives."""
        fd = os.open(self.root / "deploy.guard", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    yield o
    end_services(o.root)


def steps(result: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in result["steps"]}


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


def test_user_mistakes_are_one_line_and_exit_2(ops: Ops, tmp_path: Path) -> None:
    line = one_error_line(ops.deploy("--ref", "deadbeef0", "--dry-run"))
    assert "--ref deadbeef0" in line and "no such commit" in line
    line = one_error_line(ops.deploy("--ref=--output=/tmp/x", "--dry-run"))
    assert "--ref" in line and "not a git revision" in line
    plain = tmp_path / "plain"
    plain.mkdir()
    for bad in (plain, ops.inventory):
        res = ops("deploy", "local", "--source", str(bad), "--dry-run")
        line = one_error_line(res)
        assert f"--source {bad}" in line and ("not a git checkout" in line or "directory" in line)
    line = one_error_line(ops("rollback", "fleet"))
    assert "'fleet' is a group" in line and "one target" in line, line
    line = one_error_line(ops("deploy", "nosuch"))
    assert "unknown target or group 'nosuch'" in line and "fleet" in line
    assert not ops.root.exists()


def test_new_user_story_at_80_columns(ops: Ops) -> None:
    res = ops.deploy("--bootstrap")
    assert res.returncode == 0, res.stderr
    r1 = ops.current()
    assert r1 and r1 in res.stdout  # the id whole on one line: it can be copied into --to
    assert "current: (none) -> " + r1 in res.stderr
    assert re.search(r"record: \S+-deploy-local/record.json\n", res.stderr)  # never wrapped
    golden = json.loads((ops.root / "golden" / "golden.json").read_text())
    assert golden["max_tokens"] == 3  # --max-tokens reaches the checks
    assert ops.record("deploy")["inputs"]["max_tokens"] == 3
    # pre-flight refuses a dead service (--bootstrap is no way around it once a release is
    # current) and the result says where the host is; --force is visible
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy("--dry-run")  # the plan says what it would switch from; touches nothing
    assert res.returncode == 0 and f"current: {r1} -> releases/" in res.stdout, res.stdout
    assert "service.env: DDTREE_RELEASE_ID=" in res.stdout and ops.current() == r1
    ops.stop()
    res = ops.deploy("--bootstrap")
    assert res.returncode == 1 and "use --force" in res.stdout
    assert ops.record("deploy")["results"][0]["before"] == r1
    res = ops.deploy("--force")
    assert res.returncode == 0, res.stderr
    assert "preflight:forced" in res.stdout
    r2 = ops.current()
    assert r2 != r1 and r2 in res.stdout and r1 in res.stdout
    res = ops("releases", "local")
    assert res.returncode == 0 and r1 in res.stdout and r2 in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    # a rollback says it is one, and where its record is
    res = ops("rollback", "local")
    assert res.returncode == 0 and ops.current() == r1, res.stderr
    assert "rollback" in res.stdout and "deployed" not in res.stdout
    assert re.search(r"record: \S+-rollback-local/record.json", res.stderr)
    rec = ops.record("rollback")
    assert rec["outcome"] == "switched"
    assert "prune" not in steps(rec["results"][0])  # a rollback deletes no release


def test_interrupts_before_and_after_the_switch(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    assert ops.serving() == r1
    # Ctrl-C in the self-test (before the switch): nothing changed, the record says where
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", "DELAY = 30")
    code, out, err, took = ops.interrupt_at("selftest ...", "local")
    assert code == 130 and took < 10, err
    assert ops.current() == r1 and ops.serving() == r1
    rec = ops.record("deploy")
    assert rec["outcome"] == "interrupted" and rec["exit_code"] == 130
    res = rec["results"][0]
    assert res["outcome"] == "interrupted" and res["failed_step"] == "selftest"
    assert steps(res)["send"] == "ok" and "interrupted" in steps(res)
    assert "interrupted during selftest" in err and r1 in err
    staging = f".staging-{res['release']}"
    assert (ops.root / "releases" / staging).is_dir()  # left for the next deploy to remove
    # SIGTERM after the switch (post-flight hangs): the guard switches back and restarts
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 30", "DELAY = 0")
    commit_change(ops.src, "engine/svc.py", 'default="ok"', 'default="hang"')
    held: list[bool] = []
    code, out, err, took = ops.interrupt_at(
        "postflight ...", "local", sig=signal.SIGTERM, first=lambda: held.append(ops.guard_alive())
    )
    assert code == 130 and took < 15, err
    assert held == [True] and not ops.guard_alive()  # the next deploy waits for a live guard
    assert ops.current() == r1 and ops.serving() == r1
    res = ops.record("deploy")["results"][0]
    assert steps(res)["switch"] == "ok" and res["failed_step"] == "postflight"
    assert res["after"] == r1 and "switched current back" in err
    (send,) = [s for s in res["steps"] if s["name"] == "send"]
    assert send["data"]["cleaned"] == [staging]  # the first interrupt's half-sent release
    # Ctrl-C in a group deploy stops the host's step in progress, not after the wave
    code, out, err, took = ops.interrupt_at("local: postflight ...", "fleet", delay=0.5)
    assert code == 130 and took < 15, err
    assert ops.current() == r1 and ops.serving() == r1
    res = ops.record("deploy")["results"][0]
    assert res["outcome"] == "interrupted" and res["after"] == r1


def test_broken_release_rolls_back_and_interrupted_rollback_still_serves(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    # a release whose service dies at start: restart fails, rollback, its error is evidence
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    res = ops.deploy("--wait", "5")
    assert res.returncode == 1 and ops.current() == r1, res.stderr
    assert "SyntaxError" in res.stderr  # the service's own last words, not its start-up noise
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "restart" and steps(result)["rollback"] == "ok"
    (restart,) = [s for s in result["steps"] if s["name"] == "restart"]
    assert any("SyntaxError" in line for line in restart["evidence"])
    assert ops.serving() == r1
    # it is marked as rejected, and no rollback goes back to it
    r2 = result["release"]
    res = ops("releases", "local")
    assert re.search(rf"rejected +{r2}", res.stdout), res.stdout
    line = one_error_line(ops("rollback", "local", "--to", r2))
    assert f"release {r2} failed its restart" in line
    # a release that never serves and ignores TERM; Ctrl-C while the rollback stops it
    commit_change(ops.src, "engine/svc.py", NOISY_CRASH, TERM_DEAF)
    code, out, err, took = ops.interrupt_at("rollback ...", "local", "--wait", "2", delay=0.5)
    assert code == 130, err
    assert ops.current() == r1 and ops.serving() == r1
