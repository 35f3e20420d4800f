"""The process manager's service log stays bounded (probe37aa H1, high).

The service wrote `logs/<name>.log` itself, with no size limit: a release that flooded its
output (3.5 GiB in 10 s) filled the disk under the remote root, and with it ops's own lock,
pidfile and releases. The service now writes into a pipe; a log keeper of the process manager
writes the log, rotates it past LOG_CAP (one `<log>.1` kept), and drops output (then says how
much) while the disk has under LOG_ROOM free. The keeper is no service process: it ends with
the service's output, and no stop, status or stray rule counts it.

Real processes throughout: the `ops` CLI, the host side, a flooding stand-in that serves
tests/helpers/fake_service.py; the full-disk test a real tmpfs (mounted as root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from helpers import FAKE_SERVICE as FAKE
from helpers.local import ServiceCli, alive, end_services, small_tmpfs

from ops.hostside.procman import LOG_CAP, LOG_ROOM

# serves the stand-in while a thread writes its output as fast as the pipe takes it
FLOOD = f"""
import runpy, sys, threading
block = ("flood " * 15 + "\\n").encode() * 700
def flood():
    while True:
        sys.stdout.buffer.write(block)
        sys.stdout.buffer.flush()
threading.Thread(target=flood, daemon=True).start()
sys.argv = [{str(FAKE)!r}, "--port", sys.argv[1]]
runpy.run_path({str(FAKE)!r}, run_name="__main__")
"""
CHUNK = 1 << 16  # what the keeper reads at once (a file may pass the cap by this, and a line)


def flooding(tmp_path: Path, root: Path | None = None) -> ServiceCli:
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    return ServiceCli(tmp_path, stop_timeout=2, root=root, command=f"{{python}} {script} {{port}}")


def keepers(log: Path) -> list[int]:
    """The live log keepers of `log` (their command line names it after `keep-log`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"keep-log" in argv and str(log).encode() in argv and alive(int(entry)):
            found.append(int(entry))
    return found


def until(what, wait_s: float = 60.0) -> bool:
    end = time.time() + wait_s
    while time.time() < end:
        if what():
            return True
        time.sleep(0.1)
    return False


def first_line(path: Path) -> str:
    with open(path, "rb") as f:
        return f.readline(200).decode("utf-8", "replace")


def between_rotations(read, path: Path):  # noqa: ANN001, ANN201
    """`read(path)` of a log the keeper may be rotating at that instant (renamed away, not yet
    opened again: the one CI failure of this test), tried again for up to 5 s."""
    end = time.time() + 5
    while True:
        try:
            return read(path)
        except FileNotFoundError:
            if time.time() > end:
                raise
            time.sleep(0.01)


def test_a_flooding_service_keeps_its_log_under_the_cap(tmp_path: Path) -> None:
    svc = flooding(tmp_path)
    log = svc.root / "logs" / "svc.log"
    old = log.with_name("svc.log.1")
    try:
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        pid = st["pid"]
        # rotated twice: the file kept is itself a rotated one (it begins with ops's line)
        rotated = until(lambda: old.exists() and " ops: log past " in first_line(old), 30)
        size = log.stat().st_size if log.exists() else 0
        assert rotated, f"the log was never rotated: {size >> 20} MiB"
        for path in (log, old):
            size = between_rotations(lambda p: p.stat().st_size, path)
            assert size <= LOG_CAP + CHUNK + 200, (path, size)
        lines = [between_rotations(first_line, path) for path in (old, log)]
        assert any("svc.log.1" in line for line in lines), lines
        code, st = svc("service", "status", "local")
        assert code == 0 and st["state"] == "active" and st["pid"] == pid, st
        assert not st.get("unmanaged"), st  # the keeper is not taken for the service
        assert len(keepers(log)) == 1
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive" and not alive(pid), st
        assert all("keep-log" not in s["to"] for s in st["signals"]), st["signals"]
        assert until(lambda: not keepers(log), 10), "the keeper outlived the service"
    finally:
        end_services(svc.root)
        for path in (log, old):  # (the 128 MiB it wrote)
            path.unlink(missing_ok=True)


def test_a_stopped_log_keeper_is_said_and_ends_with_its_service(tmp_path: Path) -> None:
    """probe37ax L3 (low): a log keeper stopped by SIGSTOP was said by no status, and a restart
    left it stopped for good on the old log (one more per restart). Status names it and its
    `kill -CONT`; a restart or stop continues it, and it ends with its service's output."""
    svc = ServiceCli(tmp_path)
    log = svc.root / "logs" / "svc.log"
    try:
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        for verb in ("restart", "stop"):
            [keeper] = keepers(log)
            os.kill(keeper, signal.SIGSTOP)
            code, st = svc("service", "status", "local")
            said = " ".join(" ".join(st.get("warnings", [])).split())
            assert f"log keeper (pid {keeper}) is stopped" in said, st
            assert f"kill -CONT {keeper}" in said, said
            code, st = svc("service", verb, "local")
            assert code == 0, st
            assert until(lambda k=keeper: not alive(k), 10), f"the stopped keeper outlived {verb}"
        assert not keepers(log) and st["state"] == "inactive", st
        # killed, it was said by nothing (probe37bb L1): the output no longer kept
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        [keeper] = keepers(log)
        os.kill(keeper, signal.SIGKILL)
        assert until(lambda: not alive(keeper), 10)
        code, st = svc("service", "status", "local")
        said = " ".join(" ".join(st.get("warnings", [])).split())
        assert "its log keeper is gone (killed?)" in said and "ops service restart" in said, st
    finally:
        end_services(svc.root)


# serves the stand-in, writing a line of output for each request it answers
LOGGING = f"""
import http.server, runpy, sys
send = http.server.BaseHTTPRequestHandler.send_response
def logged(self, *args, **kwargs):
    sys.stderr.write("request " + "." * 250 + "\\n")
    sys.stderr.flush()
    return send(self, *args, **kwargs)
http.server.BaseHTTPRequestHandler.send_response = logged
sys.argv = [{str(FAKE)!r}, "--port", sys.argv[1]]
runpy.run_path({str(FAKE)!r}, run_name="__main__")
"""


def test_a_service_blocked_by_its_stopped_keeper_is_said_so(tmp_path: Path) -> None:
    """probe37ay M2 (medium): the log keeper stopped, the service's pipe filled (a line per
    request) and the service blocked on its next write: status said "activating ... /health:
    timed out", a deploy "start it", a start "already running", none naming the keeper. Status
    names it and its `kill -CONT`; a restart ends it and serves again."""
    script = tmp_path / "logging.py"
    script.write_text(LOGGING)
    svc = ServiceCli(tmp_path, stop_timeout=2, command=f"{{python}} {script} {{port}}")
    log = svc.root / "logs" / "svc.log"
    try:
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        [keeper] = keepers(log)
        os.kill(keeper, signal.SIGSTOP)
        url = f"http://127.0.0.1:{svc.port}/health"
        for _ in range(3000):  # until the pipe is full and the service blocks on a write
            try:
                urllib.request.urlopen(url, timeout=1).read()
            except OSError:
                break
        else:
            raise AssertionError("the service never blocked")
        code, st = svc("service", "status", "local")
        said = " ".join(st["detail"].split())
        assert st["state"] == "activating", st
        assert f"log keeper (pid {keeper}) is stopped" in said and f"kill -CONT {keeper}" in said
        code, st = svc("service", "restart", "local")
        assert code == 0 and st["state"] == "active", st
        assert until(lambda: not alive(keeper), 10), "the stopped keeper outlived the restart"
    finally:
        end_services(svc.root)


def test_a_flooding_service_never_fills_the_roots_disk(tmp_path: Path) -> None:
    disk = small_tmpfs(tmp_path, "8m")
    try:
        (disk / "filler").write_bytes(b"x" * (3 << 20))
        svc = flooding(tmp_path, root=disk / "root")
        log = svc.root / "logs" / "svc.log"

        def free() -> int:
            st = os.statvfs(disk)
            return st.f_bavail * st.f_frsize

        try:
            code, st = svc("service", "start", "local")
            assert code == 0 and st["state"] == "active", st
            assert until(lambda: free() < LOG_ROOM + (256 << 10), 30), free()
            time.sleep(1.0)  # the flood goes on
            assert free() >= LOG_ROOM - 2 * CHUNK, free()
            # ops's own files still have room: a restart writes the lock, the pidfile, the log
            code, st = svc("service", "restart", "local")
            assert code == 0 and st["state"] == "active", st
            (disk / "filler").unlink()  # room again: what was dropped is said in the log
            said = " bytes of the service's output dropped: the disk had under 1 MiB free"
            assert until(lambda: said.encode() in log.read_bytes()[-(4 << 20) :], 30)
            code, st = svc("service", "stop", "local")
            assert code == 0 and st["state"] == "inactive", st
        finally:
            end_services(svc.root)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
