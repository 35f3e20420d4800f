"""Host over a real sshd on loopback and as a local subprocess: one code path, same answers.

Covers: the same data-plane module gives the same JSON on `local` and over SSH; arguments
arrive unmangled; failures and timeouts (the command is killed on the host too); directory
trees arrive whole and are never overwritten; the host lock refuses a second holder over SSH
and says who holds it; each connection error (refused, silent, wrong key, changed host key,
unknown host key) is a specific ops error; a module that prints no JSON is reported; a command
that floods its stdout, or whose every process is stopped, is ended within seconds, and said.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO
from helpers.sshd import Sshd

from ops.errors import (
    AuthenticationFailed,
    CommandFailed,
    CommandTimedOut,
    HostKeyError,
    LockHeld,
    ModuleOutputError,
    Unreachable,
)
from ops.hosts.inventory import Target, load_inventory
from ops.hosts.local import LocalHost
from ops.hosts.remote import FLOOD_RC, Host, open_host

NASTY = "a b 'c' \"d\" $(touch /tmp/ops-pwned) `id` ; rm -rf / \\ \n ünï"


@pytest.fixture
def hosts(inventory_file: Path) -> Iterator[tuple[Host, Host]]:
    inv = load_inventory(inventory_file)
    local, ssh = open_host(inv.target("local")), open_host(inv.target("loop"))
    yield local, ssh
    local.close()
    ssh.close()


def test_same_module_json_local_and_ssh(hosts: tuple[Host, Host]) -> None:
    local, ssh = hosts
    a = local.run_module("checks.ping", ["--data", NASTY], cwd=str(REPO))
    b = ssh.run_module("checks.ping", ["--data", NASTY], cwd=str(REPO))
    assert a.rc == b.rc == 0
    assert a.data == b.data
    assert a.data["data"] == NASTY and a.data["cwd"] == str(REPO)
    assert not os.path.exists("/tmp/ops-pwned")


def test_module_failure_and_bad_input_travel_back(hosts: tuple[Host, Host]) -> None:
    for host in hosts:
        failed = host.run_module("checks.ping", ["--fail"], cwd=str(REPO))
        assert failed.rc == 1 and failed.data["ok"] is False
        bad = host.run_module("checks.ping", ["--no-such-flag"], cwd=str(REPO))
        assert bad.rc == 2 and bad.data["error"] == "bad_input"


def test_module_without_json_is_an_error(hosts: tuple[Host, Host]) -> None:
    for host in hosts:
        # `python -m platform` is a real module that prints a plain line, not JSON
        with pytest.raises(ModuleOutputError, match="module platform: printed no JSON"):
            host.run_module("platform", cwd=str(REPO))


def test_run_result_failure_and_warn(hosts: tuple[Host, Host]) -> None:
    for host in hosts:
        ok = host.run(["printf", "%s", NASTY])
        assert ok.ok and ok.stdout == NASTY and ok.host == host.name
        with pytest.raises(CommandFailed) as info:
            host.run(["bash", "-c", "echo boom >&2; exit 3"])
        assert info.value.result.rc == 3 and "boom" in info.value.message
        res = host.run(["bash", "-c", "exit 3"], warn=True)
        assert res.rc == 3 and not res


def test_timeout_kills_the_command_on_the_host(hosts: tuple[Host, Host]) -> None:
    for i, host in enumerate(hosts):
        marker = f"31.{os.getpid()}{i}"
        t0 = time.monotonic()
        with pytest.raises(CommandTimedOut) as info:
            host.run(["sleep", marker], timeout=1)
        assert time.monotonic() - t0 < 10
        assert info.value.result.timed_out
        time.sleep(0.3)
        left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True)
        assert left.returncode == 1, "the timed-out command is still running on the host"


def _gone(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1


def test_a_command_flooding_its_output_is_ended_at_once(hosts: tuple[Host, Host]) -> None:
    """probe37bj L2: a target `python` that is `yes` was read for its whole deadline (300 s,
    its output long past what ops keeps). Past twice STDOUT_MAX the command is ended."""
    for i, host in enumerate(hosts):
        marker = f"flood-{os.getpid()}-{i}"
        t0 = time.monotonic()
        res = host.run(["yes", marker], timeout=300, warn=True)
        assert time.monotonic() - t0 < 60 and res.rc == FLOOD_RC and not res.timed_out, res.rc
        assert "printed more than 128 MiB and was ended there (a flood)" in res.stderr
        time.sleep(0.5)
        assert _gone(f"yes {marker}"), "the flood still runs on the host"


@pytest.mark.parametrize("watcher", ["running", "stopped"])
def test_a_command_whose_every_process_is_stopped_is_ended(
    hosts: tuple[Host, Host], watcher: str
) -> None:
    """probe37bi M1: every process of a host command stopped (`kill -STOP -PGID`) held ops to
    the command's deadline. Its watcher ends it once all stay stopped for 5 s, and says so.
    probe37bk M1: a pattern that also stopped the watcher (its command line holds the
    command's) left nothing on the host to end it: on `local`, ops ends them itself."""
    for i, host in enumerate(hosts if watcher == "running" else hosts[:1]):
        marker = f"41.{os.getpid()}{i}"

        def stop_it(marker: str = marker) -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                found = subprocess.run(["pgrep", "-f", f"^sleep {marker}"], capture_output=True)
                pids = [int(p) for p in found.stdout.split()]
                if pids:
                    leader = os.getsid(min(pids))  # the command's session: `timeout` leads it
                    if watcher == "stopped":
                        parent = Path(f"/proc/{leader}/stat").read_text().rpartition(")")[2]
                        os.killpg(os.getpgid(int(parent.split()[1])), signal.SIGSTOP)
                    os.killpg(leader, signal.SIGSTOP)
                    return
                time.sleep(0.05)

        threading.Thread(target=stop_it, daemon=True).start()
        t0 = time.monotonic()
        res = host.run(["bash", "-c", f"sleep {marker}; echo never"], timeout=120, warn=True)
        assert time.monotonic() - t0 < 30 and res.rc in (137, -9), (res.rc, res.stderr)
        assert "never" not in res.stdout
        assert "every process of the command " in res.stderr, res.stderr
        assert "stayed stopped (SIGSTOP or a debugger) for 5 s" in res.stderr, res.stderr
        time.sleep(0.5)
        assert _gone(f"sleep {marker}"), "the stopped command is still on the host"


def test_put_tree_whole_and_never_overwrites(hosts: tuple[Host, Host], tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.bin").write_bytes(os.urandom(300_000))
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"junk")
    for host in hosts:
        dest = tmp_path / f"dest-{host.name}" / "release-1"
        host.put_tree(src, str(dest))
        assert (dest / "sub" / "data.bin").read_bytes() == (src / "sub" / "data.bin").read_bytes()
        assert os.access(dest / "run.sh", os.X_OK)
        assert not (dest / "__pycache__").exists()
        with pytest.raises(CommandFailed, match="refusing to overwrite"):
            host.put_tree(src, str(dest))
        assert sorted(p.name for p in dest.parent.iterdir()) == ["release-1"]  # no temp left


def test_lock_refuses_second_holder_over_ssh(hosts: tuple[Host, Host]) -> None:
    _, ssh = hosts
    with ssh.lock("deploy ct200") as me:
        other = open_host(ssh.target)
        try:
            with pytest.raises(LockHeld) as info, other.lock("bench"):
                pass
        finally:
            other.close()
        held = info.value
        assert held.holder["purpose"] == "deploy ct200"
        assert held.holder["since"] == me["since"] and held.holder["pid"] == os.getpid()
        assert "held by" in held.message and me["since"] in held.message
    with ssh.lock("after release"):  # released on exit
        pass


def _outside_holder(root: str, script: str) -> subprocess.Popen[bytes]:
    """A real process that takes the host lock the way ops does, then runs `script`."""
    Path(root).mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["bash", "-c", f"exec 9>>lock; flock 9; echo locked; {script}"],
        cwd=root,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
    return proc


def _end(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, 9)
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def _refused_by_noted_holder(host: Host, note: dict | str, first: str = "") -> tuple[LockHeld, int]:
    """What a lock request is refused with while an outside holder (running `first`, then
    writing `note`, a dict or a note's text, as the holder note) holds the lock; and that
    holder's pid."""
    text = note if isinstance(note, str) else json.dumps(note)
    write = f"printf '%s\\n' {shlex.quote(text)} > lock.holder"
    holder = _outside_holder(host.target.remote_root, f"{first}{write}; sleep 60")
    try:
        with pytest.raises(LockHeld) as info, host.lock("second"):
            pass
    finally:
        _end(holder)
        (Path(host.target.remote_root) / "lock.holder").unlink(missing_ok=True)
    return info.value, holder.pid


def test_lock_holder_that_writes_no_note_is_named(hosts: tuple[Host, Host]) -> None:
    """probe37r R8 (low): a lock held by a process that is no ops (a flock by hand) read "a
    holder that is still starting"; it names the processes holding it, by pid and name."""
    for host in hosts:  # the holder took the flock but never writes its note
        holder = _outside_holder(host.target.remote_root, "sleep 60")
        try:
            with pytest.raises(LockHeld) as info, host.lock("second"):
                pass
        finally:
            _end(holder)
        message = info.value.message
        assert f"host lock held by pid {holder.pid} (" in message, message  # (sleep: exec'd)
        assert "which wrote no holder note: not an ops" in message, message
        assert "?" not in message.replace("tool?", "") and info.value.holder["starting"] is True


def test_a_lock_whose_ops_here_has_ended_names_the_holder_left_on_the_host(
    hosts: tuple[Host, Host],
) -> None:
    """probe37av L2 (low): an SSH link froze under a deploy; the ops that held the lock ended,
    its holder on the host lived on with the session: the next command said "held by ... pid
    N" (that dead ops) and no way on. It says that ops has ended, names the holder left on the
    host and what ends it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    note = {
        "user": "ann",
        "host": socket.gethostname(),
        "pid": dead.pid,
        "purpose": "ops deploy x",
        "since": "t0",
    }
    for host in hosts:
        refused, holder = _refused_by_noted_holder(host, note)
        message = refused.message
        assert f"that ops (pid {dead.pid}, on this machine) has ended" in message, message
        assert f"held on the host by pid {holder} there" in message, message
        assert f"kill {holder}" in message, message


def test_a_lock_note_with_an_integer_too_long_to_read_is_no_crash(
    hosts: tuple[Host, Host],
) -> None:
    """probe37az M2's kin: a holder note (a file on the host, editable by hand) holding an
    integer of 5000 digits, past the 4300 Python converts, raised ValueError where the lock's
    refusal is worded: it is said as a note that cannot be read."""
    note = '{"user": "ann", "host": "op1", "pid": ' + "9" * 5000 + ', "purpose": "x"}'
    for host in hosts:
        refused, _ = _refused_by_noted_holder(host, note)
        assert "host lock held; the holder's note is unreadable" in refused.message
        assert len(refused.message) < 1000, refused.message  # (the note is cut, not quoted)


def test_lock_holder_note_written_late_is_waited_for(hosts: tuple[Host, Host]) -> None:
    note = {"user": "ann", "host": "op1", "pid": 4242, "purpose": "slow", "since": "t0"}
    for host in hosts:
        refused, _ = _refused_by_noted_holder(host, note, first="sleep 0.8; ")
        assert "host lock held by ann@op1 pid 4242 (slow) since t0" in refused.message
        assert refused.holder == note


def test_lock_is_host_wide_across_transports(hosts: tuple[Host, Host]) -> None:
    _, ssh = hosts
    same_root = LocalHost(Target(name="local", remote_root=ssh.target.remote_root))
    with same_root.lock("local holder"), pytest.raises(LockHeld, match="local holder"):
        with ssh.lock("ssh holder"):
            pass


def test_lock_dies_with_its_connection(hosts: tuple[Host, Host]) -> None:
    _, ssh = hosts
    holder = open_host(ssh.target)
    cm = holder.lock("crashed operator")
    cm.__enter__()
    holder.close()  # the operator vanishes without releasing
    deadline = time.monotonic() + 10
    while True:
        try:
            with ssh.lock("next"):
                break
        except LockHeld:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _target(sshd: Sshd, tmp_path: Path, **kw: object) -> Target:
    fields: dict[str, object] = {
        "name": "loop",
        "address": "127.0.0.1",
        "port": sshd.port,
        "user": sshd.user,
        "ssh_key": str(sshd.user_key),
        "known_hosts": str(sshd.known_hosts),
        "connect_timeout": 2,
        "remote_root": str(tmp_path / "root"),
    }
    fields.update(kw)
    return Target.model_validate(fields)


def _connect(target: Target) -> None:
    with open_host(target) as host:
        host.run(["true"])


def test_connection_refused_is_unreachable(sshd: Sshd, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(Unreachable, match="cannot connect"):
            _connect(_target(sshd, tmp_path, port=port))


def test_silent_server_times_out_within_bound(sshd: Sshd, tmp_path: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    conns: list[socket.socket] = []
    t = threading.Thread(target=lambda: conns.append(srv.accept()[0]), daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Unreachable):
            _connect(_target(sshd, tmp_path, port=srv.getsockname()[1], connect_timeout=1))
        assert time.monotonic() - t0 < 8
    finally:
        for c in conns:
            c.close()
        srv.close()


def test_wrong_key_is_authentication_failure(sshd: Sshd, tmp_path: Path) -> None:
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(AuthenticationFailed, match="refused our key"):
        _connect(_target(sshd, tmp_path, ssh_key=str(key)))


def test_changed_host_key_is_refused_even_with_accept_new(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "fake_host"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, b64 = (tmp_path / "fake_host.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n")
    for policy in ("strict", "accept-new"):
        with pytest.raises(HostKeyError, match="HOST KEY MISMATCH"):
            _connect(_target(sshd, tmp_path, known_hosts=str(known), host_key_policy=policy))


def test_unknown_host_key_strict_refuses_accept_new_records(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    with pytest.raises(HostKeyError, match="is not in"):
        _connect(_target(sshd, tmp_path, known_hosts=str(known)))
    assert not known.exists()
    _connect(_target(sshd, tmp_path, known_hosts=str(known), host_key_policy="accept-new"))
    assert known.read_text() == sshd.known_hosts_line()
    _connect(_target(sshd, tmp_path, known_hosts=str(known)))  # now strict passes
