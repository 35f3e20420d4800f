"""A real OpenSSH server on 127.0.0.1 for tests: temp host and user keys, free port, temp config.

Logs in as the user running the tests (root in CI) with a key made for the run; the host key
goes into a temp known_hosts, so tests exercise strict host-key checking for real. The login
user's ~/.bashrc is not run for each command (`SetEnv SHLVL=1`, see the config).
`write_inventory` writes an ops.toml whose target `loop` is that server.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True
    )


@dataclass
class Sshd:
    """A running sshd and what a client needs to reach it."""

    dir: Path
    port: int
    user: str
    user_key: Path
    host_pub: str
    known_hosts: Path
    proc: subprocess.Popen[bytes]

    def known_hosts_line(self) -> str:
        kind, b64 = self.host_pub.split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {b64}\n"

    def log(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_sshd(base: Path) -> Sshd:
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd not installed (apt-get install openssh-server)")
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    keygen(base / "host_ed25519", "test-host")
    keygen(base / "user_ed25519", "test-user")
    shutil.copy(base / "user_ed25519.pub", base / "authorized_keys")
    os.chmod(base / "authorized_keys", 0o600)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation directory
    port = free_port()
    (base / "sshd_config").write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {base}/host_ed25519
PidFile {base}/sshd.pid
AuthorizedKeysFile {base}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
UseDNS no
MaxStartups 50
MaxSessions 50
Subsystem sftp internal-sftp
LogLevel VERBOSE
# bash runs ~/.bashrc for a top-level shell started by sshd (SHLVL unset) even when it is not
# interactive; a bashrc without the distributions' usual non-interactive guard (one running
# `pyenv init`: ~0.2 s) then costs that on each of a deploy's ~30 commands. SHLVL=1 makes
# every session's shell a nested one, as on a host whose bashrc has the guard.
SetEnv SHLVL=1
"""
    )
    host_pub = (base / "host_ed25519.pub").read_text().strip()
    known = base / "known_hosts"
    with open(base / "sshd.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(base / "sshd_config")], stdout=log, stderr=log
        )
    server = Sshd(
        dir=base,
        port=port,
        user=getpass.getuser(),
        user_key=base / "user_ed25519",
        host_pub=host_pub,
        known_hosts=known,
        proc=proc,
    )
    known.write_text(server.known_hosts_line())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {server.log()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"sshd did not come up: {server.log()}")


def write_inventory(path: Path, server: Sshd, remote_root: Path, **overrides: object) -> Path:
    """An ops.toml with target `loop` (the sshd) and `local`, both rooted under tmp dirs."""
    fields = {
        "address": "127.0.0.1",
        "port": server.port,
        "user": server.user,
        "ssh_key": str(server.user_key),
        "known_hosts": str(server.known_hosts),
        "connect_timeout": 5,
        "python": sys.executable,
        "remote_root": str(remote_root / "loop"),
        "gpus": 0,
    }
    fields.update(overrides)
    lines = ["[targets.loop]"]
    lines += [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in fields.items()]
    lines += ["", "[targets.local]", f"remote_root = {str(remote_root / 'local')!r}"]
    lines += ["", "[groups]", 'both = ["local", "loop"]', ""]
    path.write_text("\n".join(lines))
    return path
