"""`Ops`: the real `ops` CLI at 80 columns on target `local` with a release that deploys in
seconds, and a group `fleet` of that one target.

The releases come from a small git repository (`make_source`): `engine/svc.py` is
tests/helpers/fake_service.py (the service, run from `current/`, so a commit can break it),
`kernels/selftest.py` a stand-in self-test that passes after `DELAY` seconds (0 as made;
`Ops.slow_selftest` commits a longer one; the real self-test and the real engine are proven in
test_deploy.py). The target has its own remote root and port; the records go to `runs`
(default `<tmp>/runs`). The CLI runs from this checkout (`python -m ops` with the repository
as its working directory).

`steps(result)` is one host's result's steps (name -> status); `one_error_line(res)` asserts a
command failed as a user mistake does (exit 2, one `error:` line, no traceback) and returns
the line. `NOISY_CRASH` replaces the service's `main` with one that prints start-up noise and
then dies of a SyntaxError.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import FAKE_SERVICE, REPO
from .cli import ops_json, run_ops
from .deploy import commit_change, git
from .sshd import free_port

SELFTEST = '''"""Stand-in self-test (tests/helpers/deploy_ops.py)."""
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


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


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


def driver(body: str) -> str:
    """A script that runs this checkout's real ops (its CLI, argv after the marks) with every
    command it starts on `local` made by the class `Popen` that `body` defines on `real`
    (subprocess.Popen): it acts on the host command whose arguments carry a mark. `body`
    first takes its marks from sys.argv (`sys.argv.pop(1)`)."""
    return (
        "import json, os, signal, subprocess, sys, threading, time\n"
        'sys.path.insert(0, ".")  # run from the checkout: its ops, not an installed one\n'
        "import ops.hosts.local as local\n"
        "real = subprocess.Popen\n"
        f"{body}"
        "local.subprocess.Popen = Popen\n"
        "from ops.cli import main\n"
        'sys.argv = ["ops", *sys.argv[1:]]\n'
        "main()\n"
    )


class Ops:
    """The real `ops` CLI at 80 columns on `local` (own root, own port) and a group `fleet`,
    releases from `make_source`, records in `runs`."""

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
            "[groups]\n"
            "fleet = ['local']\n"
        )
        self.env = {**os.environ, "OPS_RUNS_DIR": str(self.runs), "COLUMNS": "80"}
        self.env.pop("OPS_INVENTORY", None)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "ops", *args, "--inventory", str(self.inventory)]

    def driven(
        self, body: str, marks: list[str], *args: str, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """`ops ARGS` run by `driver(body)`, which takes `marks` first."""
        script = self.tmp / "driver.py"
        script.write_text(driver(body))
        return subprocess.run(
            [sys.executable, str(script), *marks, *self.argv(*args)[3:]],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=REPO,
            timeout=timeout,
        )

    def second_deploy_driven(
        self, body: str, marks: list[str]
    ) -> tuple[str, subprocess.CompletedProcess[str]]:
        """A first release deployed (`--bootstrap`), then a second one's deploy run by
        `driver(body)` with `marks`: (the first's id, that deploy's result)."""
        assert self.deploy("--bootstrap").returncode == 0
        first = self.current()
        assert first
        commit_change(self.src, "engine/svc.py", '"""', '"""Release two. ')
        return first, self.driven(body, marks, *self.deploy_args(), timeout=120)

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_ops(*args, inventory=self.inventory, env=self.env, timeout=timeout, cwd=REPO)

    def json(self, *args: str) -> tuple[int, dict]:
        inv, env = self.inventory, self.env
        code, doc, _ = ops_json(*args, inventory=inv, env=env, timeout=120, cwd=REPO)
        return code, doc

    def deploy_args(self, *extra: str, target: str = "local") -> tuple[str, ...]:
        return ("deploy", target, "--source", str(self.src), "--max-tokens", "3", *extra)

    def deploy(self, *extra: str, target: str = "local") -> subprocess.CompletedProcess[str]:
        return self(*self.deploy_args(*extra, target=target))

    def popen(self, *args: str, sigint_ignored: bool = False) -> subprocess.Popen[str]:
        """`ops ARGS` started in a session of its own (so a test can end what it left); with
        `sigint_ignored`, as a script's background job starts: SIGINT ignored."""
        return subprocess.Popen(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )

    def popen_at(self, marker: str, *args: str) -> tuple[subprocess.Popen[str], str]:
        """`ops ARGS` started (`popen`) and its stderr read until `marker` shows: (it, what
        it said so far)."""
        proc = self.popen(*args)
        assert proc.stderr is not None
        seen = ""
        while marker not in seen and (line := proc.stderr.readline()):
            seen += line
        assert marker in seen, seen
        return proc, seen

    def interrupt_at(
        self,
        marker: str,
        *extra: str,
        sig: int = signal.SIGINT,
        delay: float = 0.0,
        first: Callable[[], None] | None = None,
    ) -> tuple[int, str, str, float]:
        """Start a deploy, send `sig` once `marker` shows on stderr: (exit, stdout, stderr, s).
        The deploy starts with `sig` at its default action: a shell's background job (a CI
        started with `&`) inherits SIGQUIT (and SIGINT) ignored, and ops keeps an inherited
        ignore, as under nohup."""
        proc = subprocess.Popen(
            self.argv("deploy", *extra, "--source", str(self.src), "--max-tokens", "3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, "PYTHONFAULTHANDLER": "1"},  # SIGABRT below: where it hung
            cwd=REPO,
            preexec_fn=(
                (lambda: signal.signal(sig, signal.SIG_DFL))
                if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
                else None  # (0: no signal; SIGKILL, SIGSTOP: no action to set)
            ),
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
            # its Python stack goes to stderr first: a deploy that never answered the signal
            # (one clean-clone CI run, not reproduced in 500 tries) says where it was
            proc.send_signal(signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
        return proc.returncode, out, seen + err, time.monotonic() - t0

    def slow_selftest(self, seconds: int) -> None:
        """The release's self-test takes `seconds` from the next commit on."""
        commit_change(self.src, "kernels/selftest.py", "DELAY = 0", f"DELAY = {seconds}")

    def two_releases(self) -> tuple[str, str]:
        """Two releases deployed and proven, the second current: their ids."""
        assert self.deploy("--bootstrap").returncode == 0
        first = self.current()
        commit_change(self.src, "engine/svc.py", '"""', '"""Release two. ')
        assert self.deploy().returncode == 0
        second = self.current()
        assert first and second and first != second
        return first, second

    def current(self) -> str | None:
        link = self.root / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def record(self, command: str) -> dict:
        runs = sorted(self.runs.glob(f"*-{command}-*"))
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


def refuse_with_marker(ops: Ops) -> Path:
    """From the next commit on, the service exits at start while the returned marker file
    exists (a release that served can be made to fail its next start)."""
    marker = ops.tmp / "refuse-start"
    commit_change(
        ops.src,
        "engine/svc.py",
        "def main() -> None:\n",
        "def main() -> None:\n"
        f"    if __import__('os').path.exists({str(marker)!r}):\n"
        "        raise SystemExit('refusing to start: marker file')\n",
    )
    return marker


def pending_record(previous: str, new: str, **extra: object) -> dict:
    """A whole deploy.pending as a switch from release `previous` to release `new` writes it
    (no earlier previous; `extra` replaces or adds keys: `by`, `old_previous`)."""
    return {
        "version": 2,
        "previous": previous,
        "new": new,
        "old_previous": None,
        "current_before": {"kind": "release", "id": previous, "link": f"releases/{previous}"},
        "previous_before": {"kind": "none"},
        "aside": None,
        "previous_aside": None,
        "by": "deploy",
        **extra,
    }


def steps(result: dict) -> dict[str, str]:
    """One host's result's steps: name -> status."""
    return {s["name"]: s["status"] for s in result["steps"]}


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line of a command that failed as a user mistake (exit 2, no
    traceback)."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


def guard_shells(root: Path) -> list[int]:
    """The revert guards' shells of the remote root `root` (each leads its process group): by
    their script's first words, never by a mention of deploy.guard (the process manager's
    source, sent as an argument with the root's paths, names the file too)."""
    return host_shells(f"exec 8>>{root}/deploy.guard".encode(), root)


def lock_holder_shells(root: Path) -> list[int]:
    """The host lock's holder shells for `root`: by their script's first words."""
    return host_shells(b"command -v flock", root)


def host_shells(head: bytes, root: Path) -> list[int]:
    """The `bash -c SCRIPT` processes whose script starts with `head` and names `root`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        script = argv[2] if argv[1:2] == [b"-c"] and len(argv) > 2 else b""
        if script.startswith(head) and str(root).encode() in script:
            found.append(int(pid))
    return found


def kill_guard_and_ops(
    ops: Ops,
    marker: str,
    guard_sig: int = signal.SIGKILL,
    verb: str = "deploy",
    extra: tuple[str, ...] = (),
) -> list[int]:
    """A deploy whose ops AND revert guard die at `marker` (an OOM kill, a reboot of the
    guard's shell): nobody is left to put the host back. With `guard_sig` SIGSTOP, the guard
    is stopped instead (a debugger, a job-control slip); `verb` rollback: an `ops rollback`
    (with `extra`: `--to ID`) instead of a deploy. The guard's process groups."""
    groups: list[int] = []
    args = ("--source", str(ops.src)) if verb == "deploy" else extra
    proc = subprocess.Popen(
        ops.argv(verb, "local", *args, "--max-tokens", "3"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ops.env,
        cwd=REPO,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith(marker):
            break
    for pid in guard_shells(ops.root):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, guard_sig)
            groups.append(pid)
    proc.kill()
    proc.communicate()
    return groups
