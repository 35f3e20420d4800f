"""Processes of the service that no pidfile names (probe37c C2, C3, C7).

- C2: a release whose service daemonizes (double fork + setsid) left its daemon serving after
  the deploy failed, the old release could not start ("port in use"), and `ops service
  status` said inactive. The process manager now finds the service's processes by their
  environment (DDTREE_OPS_ROOT and DDTREE_OPS_SERVICE, which its start sets): a stop stops
  them, a start finds the port held by one and stops it, a start whose process exited and
  left one running stops it and says so, and status reports one (unmanaged, its pid and
  release). A process whose environment does not name both this root and this service is
  never signalled.
- C3: a pidfile over 4 KiB (a long remote root) is read whole.
- C7: `ops service stop` on a read-only remote root stops the service (the lock cannot be
  written there, so nobody holds it), saying what it could not do.

Real processes throughout: the `ops` CLI, the host side, tests/helpers/fake_service.py; the
daemonizing stand-in is a small script written here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE as FAKE
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops
from helpers.local import ServiceCli, alive, end_services, fill_to_the_last_block, small_tmpfs

DAEMON = f"""
import os, runpy, sys
if os.fork() > 0:
    os._exit(0)
os.setsid()
if os.fork() > 0:
    os._exit(0)
sys.argv = [{str(FAKE)!r}, "--port", sys.argv[1]]
runpy.run_path({str(FAKE)!r}, run_name="__main__")
"""


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(
        item.decode("utf-8", "replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item
    )


def of_root(root: Path) -> list[int]:
    """Live processes whose environment says they are a service of `root` (any name)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            if environ(int(entry)).get("DDTREE_OPS_ROOT") == str(root):
                found.append(int(entry))
    return found


def end_all(root: Path) -> None:
    """Teardown: the services under `root` (pidfiles), then any process whose environment
    names `root`, a directory of this test's own."""
    end_services(root)
    for pid in of_root(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def svc(tmp_path: Path):
    s = ServiceCli(tmp_path, stop_timeout=2)
    yield s
    end_all(s.root)


def test_unmanaged_service_is_reported_then_stopped_by_start_and_stop(svc: ServiceCli) -> None:
    code, st = svc("service", "start", "local")
    assert code == 0 and st["state"] == "active", st
    first = st["pid"]
    svc.pidfile.unlink()  # the pidfile lost: the service runs on, named by no pidfile
    code, st = svc("service", "status", "local")
    assert st["state"] == "active" and st["pid"] == first, st
    assert "unmanaged" in st["detail"] and f"pid {first}" in st["detail"], st
    assert [p["pid"] for p in st["unmanaged"]] == [first]
    # a start finds the port held by this service's own process: stops it, starts anew
    code, st = svc("service", "start", "local")
    assert code == 0 and st["state"] == "active", st
    second = st["pid"]
    assert second != first and not alive(first)
    assert any(f"stopped pid {first}" in a for a in st["actions"]), st
    svc.pidfile.unlink()
    code, st = svc("service", "stop", "local")
    assert code == 0 and st["state"] == "inactive", st
    assert f"stopped pid {second}" in st["detail"] and "unmanaged" in st["detail"], st
    assert {"signal": "SIGTERM", "to": f"pid {second}"}.items() <= st["signals"][0].items()
    assert not alive(second) and of_root(svc.root) == []


ZOMBIE_LEADER = f"""
import ctypes, runpy, sys, threading
sys.argv = [{str(FAKE)!r}, "--port", sys.argv[1]]
serve = lambda: runpy.run_path({str(FAKE)!r}, run_name="__main__")
threading.Thread(target=serve).start()
ctypes.CDLL(None).pthread_exit(None)  # the leader thread ends; the service thread serves on
"""


def test_a_service_whose_leader_thread_exited_is_seen_and_stopped(tmp_path: Path) -> None:
    """A process whose leader thread exited (a zombie in /proc/PID/stat) while another thread
    serves is a running service: the pidfile's process is proven alive, the port's holder is
    named through its threads, and a start and a stop stop it before going on (the CI flake of
    e7be20e: a stray taken for gone while its last thread still held the port)."""
    (tmp_path / "zl.py").write_text(ZOMBIE_LEADER)
    svc = ServiceCli(tmp_path, stop_timeout=2, command=f"{{python}} {tmp_path / 'zl.py'} {{port}}")
    try:
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        first = st["pid"]
        with open(f"/proc/{first}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"  # the case under test
        svc.pidfile.unlink()
        code, st = svc("service", "status", "local")
        assert st["state"] == "active" and st["pid"] == first, st
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        second = st["pid"]
        assert second != first and not alive(first)
        svc.pidfile.unlink()
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive", st
        assert f"stopped pid {second}" in st["detail"], st
        assert not alive(second) and of_root(svc.root) == []
    finally:
        end_all(svc.root)


def test_a_stale_pidfile_beside_an_unmanaged_service_says_both(svc: ServiceCli) -> None:
    code, st = svc("service", "start", "local")
    assert code == 0, st
    pid = st["pid"]
    svc.pidfile.write_text("garbage")
    code, st = svc("service", "status", "local")
    # serving, as with no pidfile at all (probe37h M2: it said failed, exit 1, and named stop)
    assert code == 0 and st["state"] == "active", st
    assert "stale pidfile" in st["detail"] and f"pid {pid}" in st["detail"], st
    assert st["pid"] == pid and [p["pid"] for p in st["unmanaged"]] == [pid], st
    code, st = svc("service", "stop", "local")
    assert code == 0 and st["state"] == "inactive" and not alive(pid), st
    assert not svc.pidfile.exists()


def test_only_processes_proven_this_service_are_signalled(svc: ServiceCli) -> None:
    """Both variables must name this root and this service; anything else lives on."""
    other_root = str(svc.tmp / "other")
    envs = [
        {"DDTREE_OPS_ROOT": str(svc.root), "DDTREE_OPS_SERVICE": "other"},
        {"DDTREE_OPS_ROOT": other_root, "DDTREE_OPS_SERVICE": "svc"},
        {"DDTREE_OPS_SERVICE": "svc"},
        {"DDTREE_OPS_ROOT": str(svc.root)},
    ]
    bystanders = [
        subprocess.Popen(["sleep", "300"], env={**os.environ, **e}, start_new_session=True)
        for e in envs
    ]
    try:
        code, st = svc("service", "status", "local")
        assert st["state"] == "inactive" and not st.get("unmanaged"), st
        code, st = svc("service", "start", "local")
        assert code == 0, st
        pid = st["pid"]
        svc.pidfile.unlink()
        code, st = svc("service", "stop", "local")
        assert code == 0 and f"stopped pid {pid}" in st["detail"], st
        assert not alive(pid)
        assert all(alive(b.pid) for b in bystanders)
        assert all(s["to"] == f"pid {pid}" for s in st["signals"]), st["signals"]
    finally:
        for b in bystanders:
            b.kill()
            b.wait()


def test_a_daemonizing_service_that_fails_its_start_leaves_nothing_running(tmp_path: Path) -> None:
    (tmp_path / "daemon.py").write_text(DAEMON)
    svc = ServiceCli(
        tmp_path, stop_timeout=2, command=f"{{python}} {tmp_path / 'daemon.py'} {{port}}"
    )
    try:
        code, st = svc("service", "start", "local")
        assert code == 1 and st["state"] != "active", st
        assert "exited, leaving pid" in st["detail"] and "daemonized" in st["detail"], st
        assert "stopped them" in st["detail"]
        assert of_root(svc.root) == []
        code, st = svc("service", "status", "local")
        assert st["state"] != "active" and not st.get("unmanaged"), st
    finally:
        end_all(svc.root)


DAEMONIZE = (
    "def main() -> None:\n"
    "    import os\n"
    "    if os.fork() > 0:\n"
    "        os._exit(0)\n"
    "    os.setsid()\n"
    "    if os.fork() > 0:\n"
    "        os._exit(0)\n"
)


def test_deploy_of_a_daemonizing_release_leaves_the_old_release_serving(tmp_path: Path) -> None:
    """probe37c C2's repro: the rejected release's daemon must not keep serving."""
    ops = Ops(tmp_path)
    try:
        res = ops.deploy("--bootstrap")
        assert res.returncode == 0, res.stdout + res.stderr
        good = ops.current()
        assert ops.serving() == good
        commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", DAEMONIZE)
        res = ops.deploy()
        assert res.returncode == 1, res.stdout + res.stderr
        assert ops.current() == good
        assert ops.serving() == good  # the old release serves: its start was not refused
        left = {environ(p).get("DDTREE_RELEASE_ID") for p in of_root(ops.root)}
        assert left == {good}, left
    finally:
        end_all(ops.root)


# a daemon that also sheds the environment ops marks its service with (what an `env -i` or a
# sudo wrapper in its start path does): found by where it runs and what it holds, the port
DAEMONIZE_BARE = (
    "def main() -> None:\n"
    "    import os\n"
    "    import sys\n"
    "    import time\n"
    "    if 'DDTREE_OPS_ROOT' in os.environ:\n"
    "        if os.fork() > 0:\n"
    "            os._exit(0)\n"
    "        os.setsid()\n"
    "        if os.fork() > 0:\n"
    "            os._exit(0)\n"
    "        env = {k: v for k, v in os.environ.items() if not k.startswith('DDTREE_')}\n"
    "        script = os.path.abspath(sys.argv[0])\n"
    "        os.chdir('/')\n"  # daemon(3)'s way: out of the release directory
    "        env['SLOW'] = '1'\n"
    "        os.execve(sys.executable, [sys.executable, script, *sys.argv[1:]], env)\n"
    "    if os.environ.get('SLOW'):\n"
    "        time.sleep(3)\n"  # a slow import: the port is taken late
)


def _in_releases(root: Path) -> dict[int, str]:
    """Live processes running a release of `root` (from its directory, or its script named by
    path): pid -> release."""
    releases, found = str((root / "releases").resolve()) + "/", {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            with contextlib.suppress(OSError):
                cwd = os.readlink(f"/proc/{entry}/cwd") + "/"
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
                for where in (cwd, *argv):
                    if where.startswith(releases):
                        found[int(entry)] = where[len(releases) :].split("/", 1)[0]
    return found


def test_a_daemon_that_sheds_its_environment_is_stopped_with_its_release(
    tmp_path: Path,
) -> None:
    """probe37w W1 (high): a release whose engine daemonized and re-executed itself without
    the DDTREE_OPS_* environment: its start "exited", the sweep for the service's strays (by
    environment) found nothing, the rejected release's daemon kept the port and served, and
    the release before could not start again; status said "failed". A process holding the
    service's port that runs from one of this root's releases is this service: the failed
    start stops it, and the release before serves again. probe37x H1, M1: a daemon that takes
    the port late (a slow import) was found only once it held it, after the rollback had
    started the release before, which then could not bind: no service at all. The failed
    start's orphans running from its release are its daemon: stopped before anything else.
    """
    ops = Ops(tmp_path)
    try:
        res = ops.deploy("--bootstrap")
        assert res.returncode == 0, res.stdout + res.stderr
        good = ops.current()
        commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", DAEMONIZE_BARE)
        res = ops.deploy()
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 1 and "it daemonized" in text, text
        assert ops.current() == good
        assert ops.serving() == good
        left = set(_in_releases(ops.root).values())
        assert left == {good}, left
        # probe37x M1: installed without a restart, then restarted: the same, said and stopped
        # (--force: a restart from a proven release onto one never proven is refused without)
        assert ops.deploy("--no-restart").returncode == 0
        code, st = ops.json("service", "restart", "local", "--force")
        assert code == 1 and "it daemonized" in st["detail"], st
        assert _in_releases(ops.root) == {}, "the daemonizing release still runs"
    finally:
        end_all(ops.root)
        for pid in _in_releases(ops.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_port_s_holder_running_from_a_release_is_this_service(tmp_path: Path) -> None:
    """W1's rule on its own: a process with none of the service's environment that holds the
    service's port and runs from one of this root's releases is said as this service,
    unmanaged, by status, and stopped by `ops service stop`; a process that runs from a
    release but holds no port (a shell cd'd there) is left alone."""
    ops = Ops(tmp_path)
    bare = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_")}
    procs: list[subprocess.Popen] = []
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        good = ops.current()
        assert ops("service", "stop", "local").returncode == 0
        release = ops.root / "releases" / good
        argv = [sys.executable, "engine/svc.py", "--port", str(ops.port)]
        for cmd in (argv, ["sleep", "120"]):
            procs.append(subprocess.Popen(cmd, cwd=release, env=bare, start_new_session=True))
        daemon, shell = procs
        deadline = time.monotonic() + 20
        while True:
            code, st = ops.json("service", "status", "local")
            if st.get("unmanaged") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [p["pid"] for p in st.get("unmanaged", [])] == [daemon.pid], st
        assert st["unmanaged"][0]["release"] == good, st
        code, st = ops.json("service", "stop", "local")
        assert code == 0 and f"pid {daemon.pid}" in st["detail"], st
        assert daemon.wait(timeout=20) is not None
        assert shell.poll() is None, "a process that holds no port was signalled"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        end_all(ops.root)


def test_a_pidfile_over_4_kib_is_read_whole(svc: ServiceCli) -> None:
    """probe37c C3: a long root made the pidfile longer than the 4 KiB read."""
    code, st = svc("service", "start", "local")
    assert code == 0, st
    pid = st["pid"]
    ident = json.loads(svc.pidfile.read_text())
    ident["note"] = "x" * 6000  # what a ~2,000-byte root's cwd and root fields made it
    svc.pidfile.write_text(json.dumps(ident))
    code, st = svc("service", "status", "local")
    assert code == 0 and st["state"] == "active" and st["pid"] == pid, st
    assert not st.get("unmanaged"), st
    code, st = svc("service", "stop", "local")
    assert code == 0 and st["detail"].startswith(f"stopped pid {pid} "), st
    assert not alive(pid)


@pytest.mark.parametrize("environ", ["other", "empty", "empty-in-logs"])
def test_a_forged_pidfile_never_gets_an_unrelated_process_signalled(
    svc: ServiceCli, environ: str
) -> None:
    """probe37g G5: a pidfile rewritten to name an unrelated process (its pid, its exact start
    time, this boot) made `ops service stop` kill it. A process whose environment names no
    service of ops is not the pidfile's service: the pidfile is stale, nothing is signalled.
    probe37l L6: a process whose environment reads empty (a daemon that rewrote it with
    setproctitle, as sshd does) was taken on the pidfile's word; it is not this service unless
    it runs under the root."""
    code, st = svc("service", "start", "local")
    assert code == 0, st
    ident = json.loads(svc.pidfile.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_OPS_")}
    cwd = "/"
    if environ.startswith("empty"):
        env = {}
    if environ == "empty-in-logs":  # probe37m M7: under the root, but where no service runs
        cwd = str(svc.root / "logs")
    other = subprocess.Popen(["/bin/sleep", "300"], env=env, start_new_session=True, cwd=cwd)
    try:
        with open(f"/proc/{other.pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        svc.pidfile.write_text(json.dumps({**ident, "pid": other.pid, "start": int(start)}))
        code, st = svc("service", "stop", "local")
        why = "names no service of ops" if environ == "other" else "shows no environment"
        assert environ == "other" or "not in a release of" in st["detail"], st
        assert why in st["detail"], st
        assert alive(other.pid) and other.poll() is None  # never signalled
        assert not alive(ident["pid"])  # the real service: found by its environment, stopped
    finally:
        other.kill()
        other.wait()


@contextlib.contextmanager
def read_only(path: Path):
    """`path` bind-mounted read-only over itself (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to bind-mount a read-only remote root")
    if subprocess.run(["mount", "--bind", str(path), str(path)]).returncode != 0:
        pytest.skip("mount --bind is not permitted here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_stop_on_a_read_only_root_stops_the_service(svc: ServiceCli) -> None:
    """probe37c C7: the stop writes nothing; the lock and the pidfile it cannot touch."""
    code, st = svc("service", "start", "local")
    assert code == 0, st
    pid = st["pid"]
    with read_only(svc.root):
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive", st
        assert st["detail"].startswith(f"stopped pid {pid} "), st
        said = " ".join(st["warnings"])
        assert "Read-only file system" in said and "without the host lock" in said, said
        assert not alive(pid)
        code, st = svc("service", "restart", "local")  # a change is still refused
        assert code != 0 and "Read-only file system" in json.dumps(st), st
        # the pidfile left is no crash's (probe37an L1: status called the stop "failed")
        code, st = svc("service", "status", "local")
        assert st["state"] == "inactive" and "root is read-only" in st["detail"], st
        assert f"names pid {pid}, which is gone" in st["detail"], st
    code, st = svc("service", "status", "local")
    assert st["state"] != "active", st


def test_stop_on_a_full_root_stops_the_service(tmp_path: Path) -> None:
    """probe37f F4: on a full remote root (a runaway log) the lock's note cannot be written;
    a stop holds the lock without it and stops the service, saying so. probe37k K8: the start
    after it was refused at the lock, the disk still full, so the service stayed down; it
    holds the lock the same way and starts in the room the stop kept. probe37w W3: a command
    that needs its note is refused saying the disk is full."""
    disk = small_tmpfs(tmp_path, "1m")
    svc = ServiceCli(tmp_path, stop_timeout=2, root=disk / "root")
    try:
        code, st = svc("service", "start", "local")
        assert code == 0, st
        pid = st["pid"]
        (svc.root / "lock.holder").unlink(missing_ok=True)
        fill_to_the_last_block(disk)
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive", st
        said = " ".join(st["warnings"])
        assert "note was not written" in said and "No space left" in said, said
        assert not alive(pid)
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        assert "note was not written" in " ".join(st["warnings"]), st
        pid = st["pid"]
        code, st = svc("service", "restart", "local")  # no room for a second pidfile: refused
        assert code == 1 and "the service was not stopped" in st["detail"], st
        assert alive(pid)
        # probe37w W3 (low): a rollback, which needs its note, was refused as a root "full,
        # read-only or not ours", hinted to be made writable: it says the disk is full
        code, doc = svc("rollback", "local")
        said = json.dumps(doc)
        assert code == 2 and "the remote root's disk is full" in said, said
        assert "free space on the disk of" in said, said
    finally:
        end_all(svc.root)
        subprocess.run(["umount", "-l", str(disk)])


CHATTY = f"""
import runpy, sys
print("x" * 65536, flush=True)  # a service's first words: to a log on a full disk, ENOSPC
sys.argv = [{str(FAKE)!r}, "--port", sys.argv[1]]
runpy.run_path({str(FAKE)!r}, run_name="__main__")
"""


def test_a_start_on_a_full_disk_keeps_no_log_rather_than_fail(tmp_path: Path) -> None:
    """probe37x M3 (medium): on a full remote root, `ops service stop` then `start`: the
    service's own first write to its log (stdout) failed with ENOSPC and it died; every start
    failed, and the evidence quoted an earlier start's log. The service's output goes to the
    log keeper (probe37aa H1), which drops it while the disk has under 1 MiB free (said in a
    warning), so the service runs."""
    disk = small_tmpfs(tmp_path, "4m")
    (tmp_path / "chatty.py").write_text(CHATTY)
    command = f"{{python}} -u {tmp_path / 'chatty.py'} {{port}}"
    svc = ServiceCli(tmp_path, command=command, stop_timeout=2, root=disk / "root")
    try:
        code, st = svc("service", "start", "local")
        assert code == 0, st
        fill_to_the_last_block(disk)
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive", st
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        said = " ".join(st["warnings"])
        full = "its disk is full" in said or re.search(
            r"its disk has \d+ bytes free \(under 1 MiB\)", said
        )
        assert full and "output is dropped" in said, said
        time.sleep(0.5)
        code, again = svc("service", "status", "local")
        assert again["state"] == "active" and again["pid"] == st["pid"], again
    finally:
        end_all(svc.root)
        subprocess.run(["umount", "-l", str(disk)])


def test_stop_on_a_read_only_root_with_nothing_running(svc: ServiceCli) -> None:
    (svc.root / "run").mkdir(parents=True)
    (svc.root / "lock").touch()
    with read_only(svc.root):
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive", st
        assert st["detail"] == "was not running (no pidfile)", st
        assert any("without the host lock" in w for w in st["warnings"]), st


def test_a_stop_racing_a_lock_holder_on_a_read_only_root_is_refused(svc: ServiceCli) -> None:
    """A read-only root whose lock someone already holds (taken before it went read-only):
    the stop is refused naming the holder, as it is on a writable root."""
    code, st = svc("service", "start", "local")
    assert code == 0, st
    holder = subprocess.Popen(
        ["flock", str(svc.root / "lock"), "sleep", "300"], start_new_session=True
    )
    try:
        for _ in range(100):
            probe = subprocess.run(["flock", "-n", str(svc.root / "lock"), "true"])
            if probe.returncode != 0:
                break
            time.sleep(0.05)
        with read_only(svc.root):
            code, st = svc("service", "stop", "local")
            assert code != 0 and "LockHeld" in json.dumps(st), st
            assert alive(st.get("pid") or 0) or of_root(svc.root)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_a_start_path_that_resets_the_environment_keeps_its_service(tmp_path: Path) -> None:
    """probe37aa H2 (high): `env -i PATH=... {python} ...` (or sudo, a pyenv shim under env -i)
    gives the service an environment of its own that names no service of ops. The pidfile's
    process (same pid, start time and session: it only exec'd) was then read as "not started by
    ops": the start said it exited and daemonized and stopped it, and a restart or a deploy
    (and its rollback) left the host with no service. Without ops's variables, the pidfile's
    process is the service where it runs from a release of this root (or the root), as for an
    empty environment."""
    svc = ServiceCli(
        tmp_path,
        stop_timeout=2,
        command=f"env -i PATH=/usr/bin:/bin {{python}} {FAKE} --port {{port}}",
    )
    pids: list[int] = []
    try:
        code, st = svc("service", "start", "local")
        assert code == 0 and st["state"] == "active", st
        pids.append(st["pid"])
        code, st = svc("service", "restart", "local")
        assert code == 0 and st["state"] == "active" and "daemonized" not in st["detail"], st
        pids.append(st["pid"])
        assert not alive(pids[0]) and alive(pids[1])
        code, st = svc("service", "status", "local")
        assert code == 0 and st["state"] == "active" and st["pid"] == pids[1], st
        assert not st.get("unmanaged"), st
        code, st = svc("service", "stop", "local")
        assert code == 0 and st["state"] == "inactive" and not alive(pids[1]), st
    finally:
        end_all(svc.root)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
