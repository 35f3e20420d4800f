"""The same service management and healthcheck over SSH (real sshd on loopback): the checks run
on the host from `<remote_root>/current`, exactly as they do on a real target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import FAKE_SERVICE, REPO
from helpers.cli import ops_json
from helpers.sshd import Sshd, free_port, write_inventory

from ops.hosts.inventory import load_inventory
from ops.hosts.remote import open_host


def run_ops(inv: Path, env: dict[str, str], *args: str) -> tuple[int, dict]:
    code, doc, _ = ops_json(*args, inventory=inv, env=env)
    return code, doc


def test_healthcheck_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    port = free_port()
    inv = write_inventory(tmp_path / "ops.toml", sshd, tmp_path / "roots")
    fake = FAKE_SERVICE
    with inv.open("a") as f:
        f.write(
            "\n[targets.loop.service]\nname = 'fake'\n"
            f"url = 'http://127.0.0.1:{port}'\n"
            f'command = "{{python}} {fake} --port {{port}}"\n'
        )
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    code, doc = run_ops(inv, env, "healthcheck", "loop")
    assert code == 2 and doc["error"] == "HostError" and "no release at" in doc["message"]

    release = tmp_path / "release"
    release.mkdir()
    subprocess.run(["cp", "-r", str(REPO / "checks"), str(release)], check=True)
    # a release says what it is: `ops service start` refuses a current without a release.json
    (release / "release.json").write_text(json.dumps({"id": "hand-made", "git_sha": "0" * 40}))
    target = load_inventory(inv).target("loop")
    with open_host(target) as host:
        host.put_tree(release, f"{target.remote_root}/current")
    try:
        code, st = run_ops(inv, env, "service", "start", "loop")
        assert code == 0 and st["state"] == "active"
        assert run_ops(inv, env, "healthcheck", "loop", "--record-golden")[0] == 0
        assert (Path(target.remote_root) / "golden" / "golden.json").is_file()
        code, rep = run_ops(inv, env, "healthcheck", "loop")
        assert code == 0 and rep["modules"]["identity"]["identity_pct"] == 100.0
    finally:
        code, st = run_ops(inv, env, "service", "stop", "loop")
    assert code == 0 and st["state"] == "inactive"


def test_a_host_that_drops_the_handshake_is_one_line(sshd: Sshd, tmp_path: Path) -> None:
    """A port that accepts and closes at once (a dying sshd): paramiko's transport thread
    printed its own traceback on stderr before ops's one line (probe37h, seen with the
    loopback sshd killed mid-deploy)."""
    import socket
    import struct
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def drop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            time.sleep(0.2)  # the client's transport thread is reading the banner by now
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset, before any banner

    threading.Thread(target=drop, daemon=True).start()
    inv = write_inventory(tmp_path / "ops.toml", sshd, tmp_path / "roots")
    inv.write_text(inv.read_text().replace(f"port = {sshd.port}", f"port = {srv.getsockname()[1]}"))
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "ops", "releases", "loop", "--inventory", str(inv)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
    finally:
        srv.close()
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "Exception (client)" not in res.stderr, res.stderr
    assert res.stderr.count("error:") == 1, res.stderr
