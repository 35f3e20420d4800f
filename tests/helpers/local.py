"""`Ops`: the real `ops` CLI against target `local`, rooted in a temp dir, its service on a free
port under ops's own `process` manager: the stand-in service (`helpers/fake_service.py`) in a
given mode, or any command (None: the built-in reference-engine command). Records go to the
temp dir's `runs/`.

`end_services(root)`: a teardown's end of the services ops started under a remote root.
`stopped(ids)`: processes (or process groups) held by SIGSTOP for a `with` body.
`small_tmpfs`, `fill_to_the_last_block`: a small disk, and filling it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from ops.hostside.procman import read_pidfile, verify

from . import FAKE_SERVICE
from .cli import ops_json, run_ops
from .sshd import free_port


@contextlib.contextmanager
def stopped(ids: Iterable[int], send: Callable[[int, int], None] = os.kill) -> Iterator[None]:
    """SIGSTOP each of `ids` (pids; process groups with `send=os.killpg`) for the `with` body,
    then SIGCONT those still there."""
    ids = list(ids)
    for i in ids:
        send(i, signal.SIGSTOP)
    try:
        yield
    finally:
        for i in ids:
            with contextlib.suppress(ProcessLookupError):
                send(i, signal.SIGCONT)


def end_services(root: Path, wait_s: float = 20.0) -> None:
    """A test's teardown: each service ops's `process` manager started under `root` (a pidfile
    in `root/run/`, on this machine, also for a target over the loopback sshd) is killed with
    its process group at once. The pidfile's identity is checked first as ops's own stop checks
    it (`ops.hostside.procman.verify`: the same pid, start time and boot, still its session's
    leader), so nothing else is ever signalled. Teardowns asserted nothing about the
    `ops service stop` they ran here (~1 s each: the CLI's start-up, a graceful stop).
    A restart still running on the host (one whose link a test cut goes on to its end, as a
    revert guard does) is waited for first, up to `wait_s`: else it starts a service after
    this teardown, left behind."""
    _settle(Path(root), wait_s)
    for pidfile in sorted((Path(root) / "run").glob("*.pid")):
        ident, _ = read_pidfile(str(pidfile))
        if ident is None or verify(ident) is not None:
            continue  # no service of ours runs from it (gone, or a stale pidfile)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ident["pid"], signal.SIGKILL)


def _settle(root: Path, wait_s: float) -> None:
    """Wait until no revert guard holds `deploy.guard` and no restart holds its lock (each
    holds its flock until it is done), `wait_s` at most in all."""
    deadline = time.monotonic() + wait_s
    for lock in [root / "deploy.guard", *sorted((root / "run").glob("*.pid.restart"))]:
        if not wait_unlocked(lock, deadline - time.monotonic()):
            return


def wait_unlocked(lock: Path, wait_s: float) -> bool:
    """Wait until nobody holds an flock on `lock` (`wait_s` at most): whether that came. A
    file that is not there, or cannot be locked (a FIFO a test put there), holds nobody."""
    deadline = time.monotonic() + wait_s
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
            except OSError:
                return True
    finally:
        os.close(fd)


class Ops:
    """Runs the real `ops` CLI against one inventory, with records in a temp dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.inventory = tmp / "ops.toml"
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}

    def configure(self, mode: str = "ok", salt: str = "", ids: str = "inline") -> None:
        """The `local` service is helpers/fake_service.py in the given mode."""
        command = (
            f"{{python}} {FAKE_SERVICE} --port {{port}} --mode {mode} --salt '{salt}' --ids {ids}"
        )
        self.configure_service(command, name="fake")

    def configure_service(self, command: str | None, name: str | None = None) -> None:
        """`local` on our port and roots; `command` None keeps the built-in engine command."""
        self.inventory.write_text(
            "[targets.local]\n"
            f"remote_root = '{self.tmp / 'root'}'\n"
            "[targets.local.service]\n"
            + (f"name = '{name}'\n" if name else "")
            + f"url = 'http://127.0.0.1:{self.port}'\n"
            + (f'command = "{command}"\n' if command else "")
        )

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_ops(*args, inventory=self.inventory, env=self.env)

    def stop(self) -> None:
        """A test's teardown: the service ends (`end_services`)."""
        end_services(self.tmp / "root")

    def json(self, *args: str) -> tuple[int, dict]:
        code, doc, _ = ops_json(*args, inventory=self.inventory, env=self.env)
        return code, doc


def alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ServiceCli:
    """`local` with its own root and port, `command` (default: the fake service) run by ops's
    process manager; calling it runs `ops ARGS --json` and asserts no traceback."""

    def __init__(
        self,
        tmp: Path,
        command: str | None = None,
        stop_timeout: float = 20,
        *,
        root: Path | None = None,
        name: str = "svc",
    ) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.root = root or tmp / "root"
        self.inventory = tmp / "ops.toml"
        command = command or f"{{python}} {FAKE_SERVICE} --port {{port}}"
        self.inventory.write_text(
            "[targets.local]\n"
            f"remote_root = '{self.root}'\n"
            "[targets.local.service]\n"
            f"name = '{name}'\n"
            f"url = 'http://127.0.0.1:{self.port}'\n"
            f'command = "{command}"\n'
            f"stop_timeout = {stop_timeout}\n"
        )
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}
        self.pidfile = self.root / "run" / f"{name}.pid"

    def __call__(self, *args: str) -> tuple[int, dict]:
        code, doc, err = ops_json(*args, inventory=self.inventory, env=self.env, timeout=120)
        assert "Traceback" not in err, err
        return code, doc

    def write_pidfile(self, text: str) -> None:
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.write_text(text)


def small_tmpfs(tmp_path: Path, size: str) -> Path:
    """A tmpfs of `size` at tmp_path/disk (the test is skipped where mounting is not allowed);
    the test unmounts it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)])
    if res.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    return disk


def fill_to_the_last_block(disk: Path) -> None:
    fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, b"x" * 4096)
    os.close(fd)
