"""Start and stop a real reference-engine process (`python -m engine`) for tests.

    eng = start_engine(tmp_path, preset="tiny", mode="ddtree", extra_args=("--budget", "8"))
    ... requests to eng.url ...
    eng.stop()

The process listens on a free loopback port; `start_engine` returns once `/health` answers 200
(and raises with the log's tail if the process dies or never gets healthy). Its output goes to
`eng.log_path`. Only the standard library is used here (and `free_port` from `.sshd`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .sshd import free_port


def health_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of GET {url}/health, or None if nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return None


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    port: int
    url: str
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; safe to call twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_engine(
    tmp_path: Path,
    *,
    preset: str = "tiny",
    mode: str = "ddtree",
    extra_args: Sequence[str] = (),
    timeout: float = 90.0,
    wait_healthy: bool = True,
) -> EngineProcess:
    """Start `python -m engine` on a free port; wait for /health 200 unless told not to."""
    port = free_port()
    log_path = Path(tmp_path) / f"engine-{mode}-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--preset",
        preset,
        "--mode",
        mode,
        *extra_args,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    eng = EngineProcess(proc, port, f"http://127.0.0.1:{port}", log_path)
    if not wait_healthy:
        return eng
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}:\n{eng.log_tail()}")
        if health_status(eng.url) == 200:
            return eng
        time.sleep(0.05)  # up about 2.5 s after the start (its torch import)
    eng.stop()
    raise RuntimeError(f"engine not healthy after {timeout:.0f} s:\n{eng.log_tail()}")
