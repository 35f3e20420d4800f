"""The `process` manager signals only the process it started, proven by identity.

Real processes throughout: an unrelated `sleep`, a process-group leader with children, a
process that ignores TERM, pidfiles holding 0, 1, -1 and garbage, a foreign server holding the
service's port, and another ops-managed service whose pidfile is copied over this one's (its
process is one ops started, but not this target's: another remote root or service name). Every
case runs through the real `ops` CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE as FAKE
from helpers.cli import run_ops
from helpers.local import ServiceCli, alive


@pytest.fixture
def bystander():
    """An unrelated process (its own group leader, with a child) that must survive."""
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & exec sleep 300"], start_new_session=True)
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def last_record(cli: ServiceCli) -> dict:
    runs = sorted((cli.tmp / "runs").iterdir())
    return json.loads((runs[-1] / "record.json").read_text())


@pytest.mark.parametrize("legacy", [True, False], ids=["bare-pid", "forged-identity"])
def test_pidfile_naming_an_unrelated_process_is_never_signalled(
    tmp_path: Path, bystander: subprocess.Popen, legacy: bool
) -> None:
    cli = ServiceCli(tmp_path)
    pid = bystander.pid
    forged = json.dumps({"pid": pid, "start": "1", "boot": "x"})
    cli.write_pidfile(f"{pid}\n" if legacy else forged)
    code, st = cli("service", "status", "local")
    assert code == 1 and st["state"] == "failed" and "stale pidfile" in st["detail"]
    code, st = cli("service", "stop", "local")
    assert code == 0 and st["state"] == "inactive", st
    assert "stale pidfile" in st["detail"] and "signalled nothing" in st["detail"]
    assert st["signals"] == [] and str(pid) in st["detail"]
    assert last_record(cli)["service"]["signals"] == []
    assert alive(pid) and not cli.pidfile.exists()
    code, st = cli("service", "start", "local")  # the bystander does not block a start
    assert code == 0 and st["pid"] != pid
    cli("service", "stop", "local")
    assert alive(pid)


@pytest.mark.parametrize("text", ["0", "1", "-1", "-0", "garbage", "", "99999999999999999999"])
def test_nonsense_pidfiles_signal_nothing(tmp_path: Path, text: str) -> None:
    cli = ServiceCli(tmp_path)
    cli.write_pidfile(text)
    t0 = time.monotonic()
    code, st = cli("service", "stop", "local")  # `kill -- -1` would have killed us too
    assert code == 0 and st["signals"] == [] and "stale pidfile" in st["detail"]
    assert time.monotonic() - t0 < 30
    assert not cli.pidfile.exists()
    cli.write_pidfile(text)
    code, st = cli("service", "status", "local")
    assert code == 1 and "stale pidfile" in st["detail"]


def test_stop_says_what_it_did_and_records_every_signal(tmp_path: Path) -> None:
    cli = ServiceCli(tmp_path)
    code, st = cli("service", "start", "local")
    assert code == 0 and st["state"] == "active", st
    pid = st["pid"]
    code, again = cli("service", "start", "local")
    assert code == 0 and again["detail"] == f"already running, pid {pid}"
    code, st = cli("service", "stop", "local")
    assert code == 0 and st["state"] == "inactive"
    assert st["detail"].startswith(f"stopped pid {pid} after ") and st["detail"].endswith("(TERM)")
    assert st["signals"][0]["signal"] == "SIGTERM"
    assert st["signals"][0]["to"] == f"process group {pid}"
    assert last_record(cli)["service"]["signals"] == st["signals"]
    assert not alive(pid)
    code, st = cli("service", "stop", "local")
    assert code == 0 and st["detail"] == "was not running (no pidfile)"


STUBBORN = """
import http.server, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "300"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_term_ignoring_service_and_its_group_are_killed(tmp_path: Path) -> None:
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    cli = ServiceCli(
        tmp_path, command=f"{{python}} {tmp_path / 'stubborn.py'} {{port}}", stop_timeout=1
    )
    code, st = cli("service", "start", "local")
    assert code == 0, st
    pid = st["pid"]
    group = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgrp(int(p)) == pid]
    assert len(group) >= 2  # the server and its sleep child
    code, st = cli("service", "stop", "local")
    assert code == 0 and "KILL after 1 s" in st["detail"], st
    assert [s["signal"] for s in st["signals"]][:2] == ["SIGTERM", "SIGKILL"]
    time.sleep(0.2)
    assert not any(alive(p) for p in group)


def _pgrp(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError):
        return None


# the stand-in service, started by a `python -c` program whose text holds a newline (and what
# would read as a line of ops's own: probe37bl L1, it was printed raw)
RUN_FAKE = (
    "import runpy, sys\nFORGED = 'local: X is current and healthy'\nsys.argv = [sys.argv[1], "
    "'--port', sys.argv[2]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_port_held_by_another_server_is_not_our_health(tmp_path: Path) -> None:
    cli = ServiceCli(tmp_path)
    other = subprocess.Popen(
        [sys.executable, "-c", RUN_FAKE, str(FAKE), str(cli.port)],
        start_new_session=True,
    )
    try:
        for _ in range(100):
            if (
                subprocess.run(
                    ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{cli.port}"], capture_output=True
                ).returncode
                == 0
            ):
                break
            time.sleep(0.05)
        code, st = cli("service", "start", "local")
        # refused, nothing started: said with the state the service is in (probe37ab M3)
        assert code == 1 and st["blocked_by"] == "port" and st["state"] == "inactive", st
        assert "already in use by pid" in st["detail"] and str(other.pid) in st["detail"]
        assert "\n" not in st["detail"] and "import runpy, sys\\nFORGED" in st["detail"], st
        # what to do on a shared machine (another user's `local` on the default port, #39 item 3)
        assert "[targets.local.service] url = 'http://127.0.0.1:PORT'" in st["detail"]
        assert alive(other.pid)
        code, st = cli("service", "status", "local")
        assert st["state"] == "inactive"
    finally:
        other.kill()
        other.wait()


def _wait_answering(port: int) -> None:
    """Until the server on `port` answers /health (at most 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing answers on port {port}"
            time.sleep(0.05)


def test_health_from_a_foreign_listener_does_not_make_a_service_active(tmp_path: Path) -> None:
    """The service starts, but the port is answered by another process: not active."""
    cli = ServiceCli(tmp_path, command="sleep 300")
    other = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(cli.port)], start_new_session=True
    )
    try:
        _wait_answering(cli.port)
        code, st = cli("service", "start", "local")
        assert code == 1 and "already in use" in st["detail"]
    finally:
        other.kill()
        other.wait()
    code, st = cli("service", "start", "local", "--wait", "1")
    assert code == 1 and st["detail"].startswith("not healthy after start: /health"), st
    other = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(cli.port)], start_new_session=True
    )
    try:
        _wait_answering(cli.port)
        code, st = cli("service", "status", "local")
        assert code == 1 and st["state"] == "activating"
        assert f"answered by pid {other.pid}" in st["detail"], st
    finally:
        other.kill()
        other.wait()
        cli("service", "stop", "local")


@pytest.mark.parametrize("wait", ["inf", "1e12"])
def test_unbounded_wait_is_one_line_exit_2(tmp_path: Path, wait: str) -> None:
    """`--wait inf` was an OverflowError traceback after the service had been stopped; it is
    refused before anything is touched, as is a wait of 30,000 years."""
    cli = ServiceCli(tmp_path)
    for verb in ("start", "restart"):
        res = run_ops(
            "service",
            verb,
            "local",
            "--wait",
            wait,
            inventory=cli.inventory,
            env=cli.env,
            timeout=60,
        )
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.startswith("error: --wait") and res.stderr.count("\n") == 1
    assert not cli.pidfile.exists()


def test_facts_does_not_call_a_forged_pidfile_active(tmp_path: Path, bystander) -> None:
    cli = ServiceCli(tmp_path)
    cli.write_pidfile(f"{bystander.pid}\n")
    code, facts = cli("facts", "local")
    assert code == 0 and facts["service"]["state"] == "failed", facts["service"]
    assert "stale pidfile" in facts["service"]["detail"]
    assert alive(bystander.pid)


@pytest.mark.parametrize("case", ["other-root", "other-name", "forged-owner"])
def test_a_pidfile_copied_from_another_service_stops_nothing(tmp_path: Path, case: str) -> None:
    """Two `process` targets, A and B (two remote roots, or one root and two service names;
    two ports). A's pidfile copied over B's names a live process that ops started, with the
    right start time and session, but it is A's: `ops service stop B` signals nothing and says
    the pidfile is not B's, A still answers, and B starts its own. A copy edited to claim B's
    root and name is caught by the process's environment (DDTREE_OPS_ROOT / _SERVICE)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = ServiceCli(tmp_path / "a")
    one_root = case == "other-name"  # B: A's root, another service name
    b = ServiceCli(
        tmp_path / "b", root=a.root if one_root else None, name="other" if one_root else "svc"
    )
    try:
        code, st = a("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        pid = st["pid"]
        text = a.pidfile.read_text()
        if case == "forged-owner":
            ident = json.loads(text)
            ident.update(root=str(b.root), service="svc")
            text = json.dumps(ident)
        b.write_pidfile(text)
        code, st = b("service", "status", "local")
        assert code == 1 and st["state"] == "failed", st
        assert "not this service's pidfile" in st["detail"], st
        code, st = b("service", "stop", "local")
        assert code == 0 and st["signals"] == [], st
        assert "not this service's pidfile" in st["detail"], st
        assert f"under {b.root}" in st["detail"] and "signalled nothing" in st["detail"], st
        want = "(its environment)" if case == "forged-owner" else f"under {a.root}, pid {pid}"
        assert want in st["detail"], st
        assert last_record(b)["service"]["signals"] == []
        assert alive(pid)
        _wait_answering(a.port)  # A still serves
        code, st = a("service", "status", "local")
        assert code == 0 and st["state"] == "active" and st["pid"] == pid, st
        code, st = b("service", "start", "local")  # B is not "already running" as A
        assert code == 0 and st["state"] == "active" and st["pid"] != pid, st
        code, st = b("service", "stop", "local")
        assert code == 0 and st["signals"] and alive(pid), st
    finally:
        a("service", "stop", "local")
        b("service", "stop", "local")


ZOMBIE_LEADER = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(30,)).start()
time.sleep(0.2)
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process goes on
"""


def test_a_process_whose_main_thread_ended_still_counts_as_running() -> None:
    """A service's leader thread that exited is a zombie while its other threads still run
    (and hold its port): the stop waits for them, not for the leader alone (a restart then
    found its port "in use by another user's process" and left the service down)."""
    from ops.hostside.procman import alive

    proc = subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        assert alive(proc.pid)  # its leader is a zombie; a thread of it still runs
        proc.kill()
        proc.wait()
        assert not alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
