"""The host side's leftovers from the second hostile pass (probe37b B4, B5, B9).

- B5: `ops service restart` (and `start`) with `current` pointing at a directory that is no
  release (the root itself, `releases/`, a directory inside a release, a path outside the
  root) is refused in one line before anything is stopped; --force lets it through.
- B4: `ops service start` with nothing deployed and a command that needs a release says no
  release is current and how to deploy one.
- B9: a FIFO or an oversized `service.env` is refused by a start at once; the pidfile's
  temporary files that dead runs left are removed, one a live process may be using never;
  a `deploy.pending` left by a dead deploy and a dead guard makes a restart refuse (naming
  `ops rollback`), and --force restarts with a warning on stderr and in --json; a live guard
  is never raced; a stray `releases/.staging-*` symlink is unlinked, never followed, and the
  deploy goes on.

Real processes throughout: the `ops` CLI, the host-side scripts, the stand-in service run
from `current/` by ops's process manager (tests/helpers/deploy_ops.py's `Ops`).
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
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, guard_shells, kill_guard_and_ops, pending_record
from helpers.local import stopped


def relink(root: Path, dest: str) -> None:
    """`current -> dest` switched by hand, as an operator would (ln -sfn)."""
    tmp = root / ".current.hand"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(dest)
    os.replace(tmp, root / "current")


def said(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    return " ".join((res.stdout + res.stderr).split())


def status(ops: Ops) -> dict:
    return ops.json("service", "status", "local")[1]


@pytest.mark.parametrize("where", [".", "releases", "releases/{r1}/engine", "outside"])
def test_current_that_is_no_release_stops_nothing(ops: Ops, tmp_path: Path, where: str) -> None:
    """B5: before, the restart stopped the healthy service, then the command failed from the
    wrong directory and the host was left down."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    assert r1
    pid = status(ops)["pid"]
    if where == "outside":
        dest = tmp_path / "elsewhere" / r1  # a whole release, but not under the root
        shutil.copytree(ops.root / "releases" / r1, dest, symlinks=True)
        where = str(dest)
    where = where.format(r1=r1)
    relink(ops.root, where)
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 1, text
    assert f"current -> {where} resolves to" in text and "not stopped" in text, text
    assert "ops rollback local" in text, text
    st = status(ops)
    assert st["state"] == "active" and st["pid"] == pid, st  # the same process serves
    # a start of a stopped service is refused the same way, and starts nothing
    ops.stop()
    res = ops("service", "start", "local")
    text = said(res)
    assert res.returncode == 1 and f"current -> {where} resolves to" in text, text
    assert status(ops)["state"] == "inactive"
    if where.startswith("/"):  # outside the root, but a whole release: --force runs it
        code, doc = ops.json("service", "start", "local", "--force")
        assert code == 0 and doc["state"] == "active", doc
        assert any("--force" in w and "outside the remote root" in w for w in doc["warnings"])
        assert ops.serving() == r1 and os.readlink(f"/proc/{doc['pid']}/cwd") == where
    # what the refusal names puts it right
    relink(ops.root, f"releases/{r1}")
    assert ops("service", "restart", "local").returncode == 0
    assert ops.serving() == r1


def test_start_with_nothing_deployed_says_so(ops: Ops) -> None:
    """B4: the command (it needs a release: engine/svc.py) ran from the remote root and failed
    with only "process N exited"."""
    code, doc = ops.json("service", "start", "local", "--wait", "10")
    assert code == 1 and doc["state"] != "active", doc
    assert "no release is current on local" in doc["detail"], doc
    assert "ops deploy local --bootstrap" in doc["detail"], doc
    res = ops("service", "start", "local", "--wait", "10")
    text = said(res)
    assert res.returncode == 1 and "ops deploy local --bootstrap" in text, text


@pytest.mark.parametrize("junk", ["fifo", "huge"])
def test_a_fifo_or_huge_service_env_refuses_a_start_at_once(ops: Ops, junk: str) -> None:
    """B9: a FIFO service.env is refused by a start at once, as by a restart (read
    non-blocking since 1c267e5: this keeps it so for the start); a service.env over a MiB was
    cut at a MiB without a word."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    ops.stop()
    env = ops.root / "releases" / str(r1) / "service.env"
    env.unlink()
    if junk == "fifo":
        os.mkfifo(env)
    else:
        env.write_text("A=1\n" + "# padding\n" * 120_000)
    t0 = time.monotonic()
    res = ops("service", "start", "local", "--wait", "5")
    assert time.monotonic() - t0 < 60
    text = said(res)
    assert res.returncode == 1, text
    why = "is not a regular file" if junk == "fifo" else "bytes (at most 1048576 are read)"
    assert why in text, text
    assert status(ops)["state"] == "inactive"


def test_stale_pidfile_temporaries_are_removed_live_ones_kept(ops: Ops) -> None:
    """B9: `run/<name>.pid.tmpPID` files that interrupted or failed starts left piled up.
    A dead PID's, or one whose PID is a process started after the file was written (a reused
    pid), goes at the next status, start or stop; one whose PID may be its writer stays."""
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = next((ops.root / "run").glob("*.pid"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen(["sleep", "120"])
    reused = subprocess.Popen(["sleep", "120"])
    try:
        time.sleep(0.1)
        tmp = {k: Path(f"{pidfile}.tmp{p.pid}") for k, p in (("dead", dead), ("live", live))}
        tmp["reused"] = Path(f"{pidfile}.tmp{reused.pid}")
        for path in tmp.values():
            path.write_text(" " * 1024)
        hour_ago = time.time() - 3600  # written long before its pid's process started
        os.utime(tmp["reused"], (hour_ago, hour_ago))
        other = pidfile.parent / "notes.tmp1"  # not a pidfile's temporary: never touched
        other.write_text("x")
        assert status(ops)["state"] == "active"
        assert not tmp["dead"].exists() and not tmp["reused"].exists()
        assert tmp["live"].exists() and other.exists() and pidfile.exists()
        live.kill()
        live.wait()
        res = ops("service", "restart", "local")  # the restart's own stays until it is renamed
        assert res.returncode == 0, said(res)
        assert not tmp["live"].exists()
        # and the stopped service's pidfile, kept as the next start's room (probe37h H1); the
        # restart's lock (one restart at a time, probe37n N3)
        assert sorted(p.name for p in pidfile.parent.iterdir()) == sorted(
            [pidfile.name, f"{pidfile.name}.room", f"{pidfile.name}.restart", other.name]
        )
    finally:
        for p in (live, reused):
            p.kill()
            p.wait()


def test_a_dead_deploys_pending_switch_is_not_restarted_silently(ops: Ops) -> None:
    """B9: with deploy.pending left by a dead deploy and a dead guard, `ops service restart`
    restarted the never-proven release without a word. Now it refuses and names the rollback
    (which puts the host back and proves it); --force restarts it with a warning."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    kill_guard_and_ops(ops, "postflight ...")
    r2 = ops.current()
    assert r2 != r1 and (ops.root / "deploy.pending").exists()
    pid = status(ops)["pid"]
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 1 and "deploy.pending is there" in text, text
    assert f"release {r2}" in text and "ops rollback local" in text, text
    assert "not stopped" in text and status(ops)["pid"] == pid
    # status says so too (stderr, and --json)
    res = ops("service", "status", "local")
    assert "warning: deploy.pending is there" in said(res), said(res)
    assert any("never proven" in w for w in status(ops)["warnings"])
    # --force: restarted, and said on stderr and in --json
    res = ops("service", "restart", "local", "--force")
    assert res.returncode == 0, said(res)
    assert "warning:" in res.stderr and "anyway (--force)" in said(res), res.stderr
    code, doc = ops.json("service", "restart", "local", "--force")
    assert code == 0 and any("anyway (--force)" in w for w in doc["warnings"]), doc
    assert status(ops)["pid"] != pid and ops.serving() == r2
    # the rollback the refusal names puts the host back; then nothing is said any more
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and not (ops.root / "deploy.pending").exists()
    code, doc = ops.json("service", "restart", "local")
    assert code == 0 and doc["warnings"] == [], doc
    assert ops.serving() == r1


def test_a_live_guard_is_never_raced_even_with_force(ops: Ops) -> None:
    """deploy.pending while a guard holds deploy.guard (it is putting the host back now): a
    restart would race it, so it is refused, --force or not, and nothing is stopped."""
    assert ops.deploy("--bootstrap").returncode == 0
    pid = status(ops)["pid"]
    (ops.root / "deploy.pending").write_text("{}")
    fd = os.open(ops.root / "deploy.guard", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for extra in ((), ("--force",)):
            res = ops("service", "restart", "local", *extra)
            text = said(res)
            assert res.returncode == 1 and "putting the host back now" in text, text
            assert status(ops)["pid"] == pid
        # status does not warn while a guard lives (a running deploy holds one too)
        assert status(ops)["warnings"] == []
    finally:
        os.close(fd)
    (ops.root / "deploy.pending").unlink()
    assert ops("service", "restart", "local").returncode == 0


def test_a_restart_beside_a_stopped_guard_says_how_to_let_it_go_on(ops: Ops) -> None:
    """probe37q Q2 (low): a revert guard stopped (SIGSTOP) while it held deploy.guard: a
    restart said the guard "is putting the host back now; try again when it is done", which
    would never come. It names the stopped process and `kill -CONT`, as deploy and rollback
    do; nothing is stopped."""
    assert ops.deploy("--bootstrap").returncode == 0
    pid = status(ops)["pid"]
    (ops.root / "deploy.pending").write_text("{}")
    hold = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    hold += "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"
    guard = subprocess.Popen(
        [sys.executable, "-c", hold, str(ops.root / "deploy.guard")], stdout=subprocess.PIPE
    )
    try:
        assert guard.stdout is not None and guard.stdout.readline() == b"held\n"
        os.kill(guard.pid, signal.SIGSTOP)
        text = said(ops("service", "restart", "local"))
        assert f"stopped (pid {guard.pid})" in text and f"kill -CONT {guard.pid}" in text, text
        assert "try again when it is done" not in text, text
        assert status(ops)["pid"] == pid
    finally:
        guard.kill()
        guard.communicate()
    (ops.root / "deploy.pending").unlink()


def test_a_stopped_service_is_said_to_be_stopped(ops: Ops) -> None:
    """probe37q Q3 / probe37r R9 (low): a service stopped by SIGSTOP was shown "activating ...
    /health: timed out", as if it were starting. Status says it is stopped and how to let it
    run, at once (no /health wait on a process that cannot answer)."""
    assert ops.deploy("--bootstrap").returncode == 0
    pid = status(ops)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        st = status(ops)
        assert time.monotonic() - t0 < 10, "status waited on a stopped service"
        assert f"pid {pid} is stopped" in st["detail"] and f"kill -CONT {pid}" in st["detail"]
        # probe37u U7 (low): a deploy's pre-flight waited 61 s on it, then advised a start,
        # which does nothing for a running process: it names the stopped pid, at once
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
        t0 = time.monotonic()
        text = said(ops.deploy())
        assert time.monotonic() - t0 < 40, text
        assert f"kill -CONT {pid} lets it run, then deploy again" in text, text
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status(ops).get("state") == "active"
    # probe37ap L4 (low): a stop of a stopped service sent TERM, which waits till the process
    # runs, then waited its whole grace for a KILL; it is woken (CONT, as systemd does) and
    # takes its TERM at once
    os.kill(pid, signal.SIGSTOP)
    code, st = ops.json("service", "stop", "local")
    sent = [s["signal"] for s in st.get("signals", [])]
    assert code == 0 and sent == ["SIGTERM", "SIGCONT"] and "(TERM)" in st["detail"], st


def test_the_log_quoted_is_the_last_start_s(ops: Ops) -> None:
    """probe37q Q12 (low): the status of a service that is not running quoted the log's last
    lines, twenty of ops's own "=== ... ops start:" markers of earlier starts and nothing of
    the service. It quotes the last start's output, from its marker on, which is on a line of
    its own (probe37v V6's kin)."""
    assert ops.deploy("--bootstrap").returncode == 0
    for _ in range(3):
        assert ops("service", "restart", "local").returncode == 0
    # a run whose last words had no newline (killed mid-line): the next start's marker was
    # glued to them, never found, and the run before was quoted as the last start's output
    (log,) = (ops.root / "logs").glob("*.log")
    with open(log, "a") as f:
        f.write("cut mid-line")
    assert ops("service", "restart", "local").returncode == 0
    os.kill(status(ops)["pid"], signal.SIGKILL)  # gone: a stale pidfile, the log quoted
    time.sleep(0.5)
    evidence = status(ops)["evidence"]
    assert evidence, "no log quoted"
    marks = [line for line in evidence if " ops start: " in line]
    assert len(marks) == 1 and evidence[0] == marks[0], evidence
    assert not any("cut mid-line" in line for line in evidence), evidence


def test_a_stray_staging_symlink_is_unlinked_not_followed(ops: Ops, tmp_path: Path) -> None:
    """B9: a hand-made `releases/.staging-<id>` pointing outside the root blocked every deploy
    ("... is not inside ..."). The link goes (what it points at stays) and the deploy goes on."""
    assert ops.deploy("--bootstrap").returncode == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    link = ops.root / "releases" / ".staging-20261205T000000Z-abcdef1234"
    link.symlink_to(outside)
    dangling = ops.root / "releases" / ".incoming.x"
    dangling.symlink_to(tmp_path / "nowhere")
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy()
    assert res.returncode == 0, said(res)
    assert not os.path.lexists(link) and not os.path.lexists(dangling)
    assert (outside / "keep.txt").read_text() == "mine\n"
    assert ops.serving() == ops.current()


STUB_SYSTEMCTL = """#!/bin/bash
# stand-in sudo / systemctl / journalctl: records each call; the unit is always active
echo "$(basename "$0") $*" >> "$STUB_CALLS"
if [ "$(basename "$0")" = sudo ]; then shift; exec "$@"; fi
[ "$1" = is-active ] && echo active
exit 0
"""


def test_systemd_start_and_restart_are_vetted_on_the_host_first(tmp_path: Path) -> None:
    """The same refusals for a systemd unit: asked of the host (the process manager's host
    side, `vet`) before any systemctl call."""
    stub, root = tmp_path / "bin", tmp_path / "root"
    stub.mkdir()
    for name in ("sudo", "systemctl", "journalctl"):
        (stub / name).write_text(STUB_SYSTEMCTL)
        (stub / name).chmod(0o755)
    (root / "releases" / "r").mkdir(parents=True)
    (root / "releases" / "r" / "release.json").write_text("{}")
    relink(root, ".")
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{root}'\n[targets.local.service]\n"
        "name = 'unit'\nmanager = 'systemd'\nurl = 'http://127.0.0.1:9'\n"
    )
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{stub}:{os.environ['PATH']}",
        "STUB_CALLS": str(calls),
        "OPS_RUNS_DIR": str(tmp_path / "runs"),
    }
    env.pop("OPS_INVENTORY", None)

    def ops(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "ops", *args, "--inventory", str(inv)]
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)

    def systemctl_verbs() -> list[str]:
        lines = calls.read_text().splitlines() if calls.exists() else []
        return [ln.split()[3] for ln in lines if ln.startswith("sudo -n systemctl")]

    for verb in ("start", "restart"):
        res = ops("service", verb, "local", "--wait", "0")
        text = said(res)
        assert res.returncode == 1 and "current -> . resolves to the remote root" in text, text
    assert systemctl_verbs() == []
    relink(root, "nowhere")  # a link to nothing: the unit would be stopped, then not start
    for verb in ("start", "restart"):
        res = ops("service", verb, "local", "--wait", "0")
        text = said(res)
        assert res.returncode == 1 and "current -> nowhere does not exist" in text, text
    assert systemctl_verbs() == []
    relink(root, "releases/r")
    (root / "deploy.pending").write_text('{"new": "r"}')  # the switch to current, unproven
    res = ops("service", "restart", "local", "--wait", "0")
    text = said(res)
    assert res.returncode == 1 and "deploy.pending is there" in text, text
    assert "ops rollback local" in text and systemctl_verbs() == []
    res = ops("service", "restart", "local", "--wait", "0", "--force")
    assert "anyway (--force)" in said(res) and systemctl_verbs() == ["restart"], said(res)


def test_a_stopped_guard_is_named_at_once_not_waited_for(ops: Ops) -> None:
    """probe37h L3 (low): a deploy's guard stopped (SIGSTOP) after its ops was killed made
    every rollback wait 240 s in silence, then say the guard 'is still putting the host back',
    naming no process. It is refused at once, naming the stopped process and kill -CONT; once
    continued, the guard puts the host back and the rollback finds nothing to undo."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    groups = kill_guard_and_ops(ops, "switch: ok", guard_sig=signal.SIGSTOP)
    assert groups and ops.guard_alive()
    try:
        t0 = time.monotonic()
        res = ops("rollback", "local", "--max-tokens", "3")
        text = said(res)
        assert res.returncode == 2 and time.monotonic() - t0 < 60, text
        assert "is stopped, so it cannot put the host back: kill -CONT " in text, text
        assert str(groups[0]) in text, text
        # status said nothing of it while the service served (probe37ao M1)
        st = status(ops)
        warned = " ".join(" ".join(st.get("warnings", [])).split())
        assert st.get("state") == "active" and f"kill -CONT {groups[0]}" in warned, st
        assert "puts the release before back and restarts the service" in warned, st
    finally:
        for pgid in groups:
            os.killpg(pgid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while ops.guard_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ops.current() == r1 and ops.serving() == r1
    assert not (ops.root / "deploy.pending").exists()


def holding(path: Path) -> list[int]:
    """The processes (other than this one) with `path` open."""
    want, found = path.stat(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                st = os.stat(f"/proc/{entry}/fd/{fd}")
                if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                    found.append(int(entry))
                    break
    return found


def test_a_guard_whose_link_stays_open_is_named_not_waited_for(ops: Ops) -> None:
    """probe37ay M1 (medium): a deploy's SSH session froze after its switch; once its lock
    holder was ended (as the lock's refusal said), every rollback waited 240 s, then said the
    guard "is still putting the host back", though it had not begun: it still waited for its
    link to ops to close. Status said nothing. Here the link is held open by that deploy's ops,
    stopped (SIGSTOP), its lock holder killed. The rollback is refused within seconds, naming
    the guard's `cat` whose end lets it put the host back; status says so; once that `cat` is
    killed the guard puts the host back."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    proc, seen = ops.popen_at("switch: ok", *ops.deploy_args())
    os.kill(proc.pid, signal.SIGSTOP)  # its links to its guard and its lock holder stay open
    try:
        for pid in holding(ops.root / "lock"):  # the lock's holder ended, the link not
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        (shell,) = guard_shells(ops.root)
        (cat,) = [
            p
            for p in holding(ops.root / "deploy.guard")
            if Path(f"/proc/{p}/cmdline").read_bytes() == b"cat\0"
            and Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[1] == str(shell)
        ]
        t0 = time.monotonic()
        res = ops("rollback", "local", "--max-tokens", "3")
        text = said(res)
        assert res.returncode == 2 and time.monotonic() - t0 < 60, text
        assert "has not begun to put the host back" in text, text
        assert f"kill {cat} ends the wait" in text and "still putting" not in text, text
        st = status(ops)
        warned = " ".join(" ".join(st.get("warnings", [])).split())
        assert "no deploy holds the host lock" in warned and f"kill {cat}" in warned, st
        os.kill(cat, signal.SIGKILL)  # the link's end: the guard puts the host back
        deadline = time.monotonic() + 60
        while ops.guard_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ops.current() == r1 and ops.serving() == r1
        assert not (ops.root / "deploy.pending").exists()
    finally:
        proc.kill()
        proc.communicate()


def test_a_dead_rollback_is_said_as_one_and_finished_by_the_next(ops: Ops) -> None:
    """probe37k K7: ops rollback and its guard both killed in the rollback's restart: the
    pending record was called 'a deploy died ... never proven' (the rollback's target had
    passed post-flights before), and the next plain `ops rollback` undid the dead rollback,
    putting back the release the operator was leaving. The record says a rollback died; the
    next rollback undoes the half-done switch, makes it again and proves it."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    kill_guard_and_ops(ops, "restart ...", verb="rollback")
    assert ops.current() == r1 and (ops.root / "deploy.pending").exists()
    code, st = ops.json("service", "status", "local")
    warned = " ".join(st.get("warnings", []))
    assert f"a rollback to release {r1} died before it passed its post-flight" in warned, st
    assert "a deploy died" not in warned and "passed a post-flight before" in warned, st
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 1 and "ops rollback local finishes it" in text, text
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 0, text
    assert f"put back a switch no rollback settled: current {r1} -> {r2}" in text, text
    assert ops.current() == r1 and ops.serving() == r1  # where the operator was going
    assert not (ops.root / "deploy.pending").exists()


def test_an_unreadable_pending_record_is_not_called_a_never_proven_release(ops: Ops) -> None:
    """probe37d F3: a deploy.pending that names no release ({}) made a restart say 'current was
    never proven', which nothing on the host says. It is refused as what it is: unreadable."""
    assert ops.deploy("--bootstrap").returncode == 0
    (ops.root / "deploy.pending").write_text("{}")
    pid = status(ops)["pid"]
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 1 and "cannot be read" in text, text
    assert "never proven" not in text and "ops rollback local" in text, text
    assert "TARGET" not in text  # probe37i I6: the fix named with the target, once
    assert status(ops)["pid"] == pid  # nothing stopped
    # probe37k K2: current was proven; the refusal says so and calls nothing unproven, and
    # names the way that keeps it (--force; a deploy sets the record aside, current kept)
    assert "current's release passed a post-flight before" in text, text
    assert "unproven" not in text and "--force starts current as it is" in text, text
    assert "the next deploy sets the record aside without moving current" in text, text
    res = ops("service", "restart", "local", "--force")
    assert res.returncode == 0, said(res)


@pytest.mark.parametrize("junk", ["fifo", "symlink", "logs-symlink"])
def test_a_log_that_is_no_regular_file_never_keeps_the_service_down(
    ops: Ops, tmp_path: Path, junk: str
) -> None:
    """probe37e E1, E6: a FIFO as the service's log hung the start with the service already
    stopped (a restart, a deploy and its rollback: minutes down); a symlink as the log sent the
    service's output into whatever file it named. Now the start writes no log, says so, and the
    service runs. probe37r R7: `logs/` itself a symlink (to another target's logs) was
    followed. probe37s S3: the lost log was said only under --json; it is a warning now."""
    assert ops.deploy("--bootstrap").returncode == 0
    log = ops.root / "logs" / "ddtree-engine.log"
    log.unlink()
    elsewhere = tmp_path / "not-the-log.txt"
    elsewhere.write_text("mine\n")
    if junk == "fifo":
        os.mkfifo(log)
    elif junk == "symlink":
        log.symlink_to(elsewhere)
    else:
        shutil.rmtree(ops.root / "logs")
        (tmp_path / "other-logs").mkdir()
        (ops.root / "logs").symlink_to(tmp_path / "other-logs")
    t0 = time.monotonic()
    code, doc = ops.json("service", "restart", "local")
    assert time.monotonic() - t0 < 60  # no wait on a reader that never comes
    assert code == 0 and doc["state"] == "active", doc
    assert any("log not written" in a for a in doc["warnings"]), doc
    assert elsewhere.read_text() == "mine\n"  # the linked file got nothing
    if junk == "logs-symlink":
        assert not any((tmp_path / "other-logs").iterdir()), "a log written through the link"
    text = said(ops("service", "restart", "local"))
    assert "log not written" in text, text
    # said by status too while it lasts, not only by the start (probe37ar L3)
    code, st = ops.json("service", "status", "local")
    warned = " ".join(" ".join(st.get("warnings", [])).split())
    assert code == 0 and "the service's output is not kept" in warned, st
    if junk == "logs-symlink":
        assert f"{ops.root}/logs is a symlink" in warned, st


# A service that takes 1.5 s to stop after its TERM: a restart's stop is a window to hit
SLOW_STOP = (
    "def main() -> None:\n"
    "    import signal as _s, time as _t\n"
    "    def _term(*_a):\n"
    "        _t.sleep(1.5)\n"
    "        raise SystemExit(0)\n"
    "    _s.signal(_s.SIGTERM, _term)\n"
)


def test_ctrl_c_in_a_restart_never_leaves_the_service_down(ops: Ops) -> None:
    """probe37n N1 (high): Ctrl-C while `ops service restart` stopped a slow-stopping service:
    the status ops asked for then removed the restart's pidfile reservation (a room file
    renamed in keeps its old time, taken for a dead run's), so the start could not record its
    process, killed it, and the service stayed down. N2: the restart's worker ignored TERM, and
    every service it started inherited that (each later stop was a KILL). Each Ctrl-C here
    lands in the stop; the service serves again from a new process that takes TERM."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    for delay in (0.0, 0.4, 0.8):  # after the worker holds the restart lock: in its stop
        # (a fixed delay from ops's start landed before the restart began on a loaded CI)
        before = status(ops)["pid"]
        proc = ops.popen("service", "restart", "local")
        _seen_restart_worker(pidfile)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        st = _serving_again(ops, before)
        with open(f"/proc/{st['pid']}/status") as f:
            ignored = int(next(ln for ln in f if ln.startswith("SigIgn:")).split()[1], 16)
        assert not ignored & (1 << (signal.SIGTERM - 1)), f"pid {st['pid']} ignores TERM"


def _processes() -> Iterator[tuple[int, list[bytes], list[str]]]:
    """Each live process: pid, argv, and its /proc stat fields after the name (state, ppid,
    pgrp, session, ...)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        yield int(p), argv, stat


def _restart_worker(pidfile: str) -> int | None:
    """The process manager's restart worker for `pidfile`: the fork of the restart command (same
    argv) that does the stop and the start in a session of its own (it leads that session)."""
    for pid, argv, stat in _processes():
        manager = argv[1:3] == [b"-S", b"-c"] and b"restart" in argv  # (not `timeout` above)
        if manager and pidfile.encode() in argv and stat[3:4] == [str(pid)]:
            return pid
    return None


def _seen_restart_worker(pidfile: str) -> int:
    """The restart worker for `pidfile`, waited for (30 s at most) until it holds the restart
    lock: a worker stopped between its fork and its lock holds nothing (the last landing CI's
    run stopped one there, and the next restart rightly went ahead)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        worker = _restart_worker(pidfile)
        if worker is not None and _holds(worker, pidfile + ".restart"):
            return worker
        time.sleep(0.02)
    raise AssertionError("no restart worker seen holding the restart lock")


def _stopped_while_it_ends(proc: subprocess.Popen[str], pid: int) -> tuple[str, float]:
    """Stop `pid` (SIGSTOP) and wait up to 60 s for `proc` to end; `pid` is continued after
    (where it still lives). What `proc` said, and the seconds it took."""
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    took = time.monotonic() - t0
    return said(subprocess.CompletedProcess(proc.args, proc.returncode, out, err)), took


def _restart_watcher(ops_pid: int, pidfile: str) -> int | None:
    """The watcher (ops.hosts.remote.WATCH) that ops's restart command runs under: ops's child,
    `bash -c WATCH ops-watch N COMMAND`, its command the process manager's restart of
    `pidfile`."""
    for pid, argv, stat in _processes():
        if stat[1:2] == [str(ops_pid)] and argv[3:4] == [b"ops-watch"] and len(argv) > 5:
            if b" restart " in argv[5] and pidfile.encode() in argv[5]:
                return pid
    return None


def test_a_stopped_watcher_is_not_waited_for_once_its_restart_ended(ops: Ops) -> None:
    """probe37w W2 (medium): the watcher that a host command runs under stopped (SIGSTOP)
    during `ops service restart`: the restart was done in seconds, but the stopped watcher
    could neither reap it nor exit, and held its output open; ops waited to the command's
    deadline, 326 s, in silence. The command's end is read from the zombie the watcher cannot
    reap: ops reports the restart as soon as it is done. (Local target only: over SSH the
    watcher runs on the host, out of ops's sight.)"""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    before = status(ops)["pid"]
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc = ops.popen("service", "restart", "local")
    deadline, watcher = time.monotonic() + 30, None
    while watcher is None and time.monotonic() < deadline:
        watcher = _restart_watcher(proc.pid, pidfile)
        time.sleep(0.01)
    assert watcher is not None, "no watcher seen around the restart"
    # the service takes 1.5 s to stop: the restart is not done
    text, took = _stopped_while_it_ends(proc, watcher)
    assert proc.returncode == 0 and took < 30, text
    st = status(ops)
    assert st.get("state") == "active" and st.get("pid") != before, st


def _worker_gone(pidfile: str) -> None:
    """Wait (30 s at most) until no restart worker for `pidfile` is left: one let go on ends."""
    deadline = time.monotonic() + 30
    while _restart_worker(pidfile) is not None:
        assert time.monotonic() < deadline, "the continued restart worker never finished"
        time.sleep(0.1)


def _holds(pid: int, path: str) -> bool:
    """Whether process `pid` holds an flock on `path` (/proc/locks, by the file's inode)."""
    try:
        ino = os.stat(path).st_ino
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    held = [f.split() for f in locks if "->" not in f]  # "->": a waiter, not a holder
    return any(f[1] == "FLOCK" and f[4] == str(pid) and f[5].endswith(f":{ino}") for f in held)


def test_a_killed_restart_worker_never_leaves_the_service_down(ops: Ops) -> None:
    """probe37o O3: a kill -9 (the OOM killer's signal) of the restart's worker while it stopped
    the service: nothing started it again ("the restart's worker gave no result", exit 2, the
    service down). The restart is now made again, and ops says why."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    before = status(ops)["pid"]
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    time.sleep(0.5)  # in its stop: the old service takes 1.5 s to go after its TERM
    os.kill(worker, signal.SIGKILL)
    out, err = proc.communicate(timeout=90)
    text = said(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert proc.returncode == 0, text
    assert "the restart's worker was killed (signal 9)" in text and "restarted again" in text
    st = status(ops)
    assert st.get("state") == "active" and st["pid"] != before, st


@pytest.mark.parametrize("whole", [True, False], ids=["its-group", "its-shell"])
def test_a_stopped_guard_does_not_hold_a_proven_deploy(ops: Ops, whole: bool) -> None:
    """probe37l L4 (low, found again by later passes): the revert guard stopped (SIGSTOP) during
    the post-flight; the deploy passed and committed, then waited about 122 s in silence for a
    guard that had nothing left to do. It now lets it go within seconds. probe37ap L3 (low):
    it then said the guard stayed stopped, also where the one stopped was ended: it says
    which."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
    groups = guard_shells(ops.root)
    assert groups, "no guard seen"
    with stopped(groups, os.killpg if whole else os.kill):
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=180)
        took = time.monotonic() - t0
    assert proc.returncode == 0, seen + err
    assert took < 40, f"the deploy took {took:.0f} s after its post-flight began"
    assert ops.serving() == ops.current()
    # and says so: the next deploy or rollback is refused while it stays stopped (ah-L3)
    said_ = " ".join((seen + out + err).split())
    if whole:  # a process of its group, stopped, still holds deploy.guard: named
        assert "while it stays so, the next deploy or rollback is refused" in said_, said_
        assert "and kill -CONT" in said_ and "(pid " in said_, said_
    else:  # its shell alone, killed when let go: nothing stays stopped
        ended = "did not end when let go (stopped: SIGSTOP, a debugger?) and was ended"
        assert ended in said_, said_


def test_a_stopped_guard_does_not_hold_a_rolled_back_deploy(ops: Ops) -> None:
    """probe37bb M1 (medium): the revert guard stopped (SIGSTOP) during a post-flight that
    failed: the deploy rolled back, made its switch back final, then waited about 140 s in
    silence for the guard, holding the host lock, and its result never named the guard. With
    nothing left to put back, the guard is let go as a settled one is, and said."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(  # other tokens: its post-flight fails token identity
        ops.src, "engine/svc.py", "        salt = self.salt\n", "        salt = self.salt + 'x'\n"
    )
    proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
    groups = guard_shells(ops.root)
    assert groups, "no guard seen"
    with stopped(groups, os.killpg):
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=300)
        took = time.monotonic() - t0
    said_ = " ".join((seen + out + err).split())
    assert proc.returncode == 1 and f"rolled back to {r1}" in said_, said_
    assert took < 60, f"the deploy took {took:.0f} s after its post-flight began"
    assert "its revert guard did not end when let go" in said_, said_
    assert ops.current() == r1 and ops.serving() == r1


def test_a_stopped_restart_is_named_by_the_next_one(ops: Ops) -> None:
    """probe37p P4: a restart's worker stopped (SIGSTOP) holds the service's restart lock; every
    later restart (an operator's, a deploy's, its rollback's, a guard's) waited for it in
    silence until its host command timed out, minutes each. The next restart now says at once
    which process is stopped and how to let it go on, and stops nothing."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    first = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    os.kill(worker, signal.SIGSTOP)
    try:
        first.kill()  # the operator gives up on it
        first.communicate(timeout=30)
        before = status(ops)
        # status says it too (probe37bk L1: only the refused restart named it)
        warned = " ".join(before.get("warnings", []))
        assert f"(pid {worker}) is stopped (SIGSTOP)" in warned, before
        assert f"a restart would be refused: kill -CONT {worker} lets it finish" in warned, before
        t0 = time.monotonic()
        res = ops("service", "restart", "local", timeout=60)
        text = said(res)
        assert res.returncode == 1 and time.monotonic() - t0 < 20, text
        assert f"(pid {worker})" in text and f"is stopped: kill -CONT {worker}" in text, text
        assert status(ops).get("pid") == before.get("pid")  # nothing stopped by it
        # probe37r R3: a stop goes on, and says the stopped restart would start it again
        text = said(ops("service", "stop", "local"))
        assert f"(pid {worker}) is stopped (SIGSTOP)" in text and f"kill -9 {worker}" in text
    finally:
        os.kill(worker, signal.SIGCONT)
    _worker_gone(pidfile)  # let go on, the first restart finishes
    res = ops("service", "restart", "local", timeout=60)
    assert res.returncode == 0, said(res)


def test_sigterm_stops_a_service_command_as_ctrl_c_does(ops: Ops) -> None:
    """probe37p P5: SIGTERM (`kill`, a CI timeout) to `ops service restart` killed it outright,
    exit 143 with nothing said, though 130 is documented for it; a deploy already took it as
    Ctrl-C. Every command does now: one line, its record, 130; the restart goes on to its end."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    before = status(ops)["pid"]
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc = ops.popen("service", "restart", "local")
    _seen_restart_worker(pidfile)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    text = said(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert proc.returncode == 130 and "interrupted" in text and "record:" in text, text
    deadline = time.monotonic() + 20
    while (st := status(ops)).get("state") != "active" or st.get("pid") == before:
        assert time.monotonic() < deadline, st
        time.sleep(0.2)


def test_a_restart_whose_own_worker_is_stopped_says_so_at_once(ops: Ops) -> None:
    """probe37t T4 (medium), probe37s S1: the restart's own worker stopped (SIGSTOP) after it
    stopped the service: the restart waited in silence until its host command timed out
    (about 5 minutes), then said only "printed no result (exit 124)", the service down. It
    now ends within seconds naming the stopped worker, `kill -CONT`, and the service's state;
    let go on, the worker finishes the restart."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    first = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    time.sleep(0.5)  # in its stop: the old service takes 1.5 s to go after its TERM
    os.kill(worker, signal.SIGSTOP)
    try:
        out, err = first.communicate(timeout=60)
        text = said(subprocess.CompletedProcess(first.args, first.returncode, out, err))
        assert first.returncode == 2, text
        assert f"(pid {worker}) is stopped" in text and f"kill -CONT {worker}" in text, text
        assert "the service is now" in text, text
    finally:
        os.kill(worker, signal.SIGCONT)
    _worker_gone(pidfile)
    assert status(ops).get("state") == "active"


def test_a_restart_whose_process_manager_is_stopped_ends_in_seconds(ops: Ops) -> None:
    """probe37af M1 (medium): the process manager of `ops service restart` itself (not its
    worker) stopped (SIGSTOP): ops waited for its command's timeout, 352 s, in silence, and
    every deploy, rollback and restart meanwhile was refused for the host lock. The command
    runs under a watch that ends a process manager stopped for 5 s and says so; ops then says
    where the service is, and lets the lock go. The worker, in a session of its own, finishes
    the restart."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    first = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    manager = next(  # the worker's parent: the restart command's own process manager
        int(stat[1]) for pid, argv, stat in _processes() if pid == worker
    )
    text, took = _stopped_while_it_ends(first, manager)
    assert first.returncode == 2 and took < 30, text
    assert f"the process manager (pid {manager}) on the host stayed stopped" in text, text
    assert "it was ended" in text and "the service is now" in text, text
    _worker_gone(pidfile)
    assert status(ops).get("state") == "active"
    res = ops("service", "restart", "local")  # the lock went with it
    assert res.returncode == 0, said(res)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _restart_under_way(ops: Ops) -> tuple[subprocess.Popen[str], str, tuple[int, ...]]:
    """`ops service restart` of a slow-stopping service, under way: its process, the pidfile,
    and its host side: the restart's worker, the process manager, the stop watch's shell and
    the command's `timeout`."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    first = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    manager = _parent(worker)
    shell = _parent(manager)
    timeout = _parent(shell)
    assert Path(f"/proc/{timeout}/comm").read_text().strip() == "timeout"
    return first, pidfile, (worker, manager, shell, timeout)


def test_a_restart_whose_worker_and_command_wrappers_are_stopped_ends_in_seconds(
    ops: Ops,
) -> None:
    """probe37ai M1 (medium): a SIGSTOP by pattern caught the restart's worker, the command's
    `timeout` and ops's outer watcher at once: the process manager said the worker was stopped
    within seconds, but the stopped `timeout` held the command's output, and the restart held
    the host lock for 431 s. The stop watch also ends a `timeout` left stopped."""
    first, pidfile, (worker, _, _, timeout) = _restart_under_way(ops)
    watcher = _parent(timeout)
    stopped = (worker, timeout, watcher)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        out, err = first.communicate(timeout=60)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    text = said(subprocess.CompletedProcess(first.args, first.returncode, out, err))
    assert first.returncode == 2 and time.monotonic() - t0 < 30, text
    assert f"(pid {worker}) is stopped" in text and f"kill -CONT {worker}" in text, text
    _worker_gone(pidfile)
    assert status(ops).get("state") == "active"


@pytest.mark.parametrize("stopped", ["by-pattern", "process-group"])
def test_a_restart_whose_whole_command_is_stopped_ends_in_seconds(ops: Ops, stopped: str) -> None:
    """probe37bi M1 (medium): a SIGSTOP by pattern caught the restart command's `timeout`, its
    stop watch's shell and its process manager (not the watch's loop): the loop ended the
    process manager after 5 s, but the stopped shell and `timeout` held the command, and the
    deploy held the host lock 375 s, its beats saying only "still runs". A whole process group
    stopped (`kill -STOP -PGID`) left nothing of the command to end itself. Every command now
    runs under a watcher that ends it once all of its processes stay stopped for 5 s, and says
    so; ops then says where the service is, and the lock goes with the command."""
    first, pidfile, (_, manager, shell, timeout) = _restart_under_way(ops)
    t0 = time.monotonic()
    if stopped == "by-pattern":
        for pid in (timeout, shell, manager):
            os.kill(pid, signal.SIGSTOP)
    else:
        os.killpg(timeout, signal.SIGSTOP)
    try:
        out, err = first.communicate(timeout=60)
    finally:
        first.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(timeout, signal.SIGCONT)
    text = said(subprocess.CompletedProcess(first.args, first.returncode, out, err))
    assert first.returncode == 2 and time.monotonic() - t0 < 30, text
    assert "stayed stopped (SIGSTOP or a debugger)" in text, text
    if stopped == "process-group":
        assert f"every process of the command on the host (pid {timeout} " in text, text
    assert "the service is now" in text, text
    _worker_gone(pidfile)  # the worker, in a session of its own, finishes the restart
    assert status(ops).get("state") == "active"
    res = ops("service", "restart", "local")  # the lock went with it
    assert res.returncode == 0, said(res)


def test_ctrl_c_says_when_the_guard_could_not_restart(ops: Ops) -> None:
    """probe37r R10 (low): a deploy Ctrl-C'd while its restart's worker was stopped (SIGSTOP):
    the guard switched current back, its restart was refused (the stopped worker holds the
    restart lock), and ops said the guard had "restarted the service". It says what the
    guard's log says: the restart did not start it."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc, seen = ops.popen_at("restart ...", *ops.deploy_args())
    worker = _seen_restart_worker(pidfile)
    os.kill(worker, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        text = " ".join((seen + out + err).split())
        assert proc.returncode == 130, text
        assert f"switched current back to {r1}" in text, text
        assert "its restart did not start the service" in text, text
        assert "and restarted the service" not in text, text
    finally:
        os.kill(worker, signal.SIGCONT)
    _worker_gone(pidfile)


def test_a_resumed_restart_never_sweeps_away_the_service_started_meanwhile(ops: Ops) -> None:
    """probe37q Q1 (high): a restart's worker stopped (SIGSTOP; or only slow, its link lost)
    while it waited for the process it started; the operator stopped that one and started
    the service again. Resumed, the worker took the operator's new process for a stray its own
    start had left (it daemonized), TERMed it, and the host had no service. The process the
    pidfile names is now never a stray."""
    slow_start = "def main() -> None:\n    time.sleep(3)\n"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow_start)
    assert ops.deploy("--bootstrap", "--wait", "30").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    first = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    time.sleep(1.5)  # its stop is done (TERM) and its start waits the 3 s for /health
    os.kill(worker, signal.SIGSTOP)
    try:
        first.kill()
        first.communicate(timeout=30)
        assert ops("service", "stop", "local").returncode == 0
        res = ops("service", "start", "local", timeout=60)
        assert res.returncode == 0, said(res)
        started = status(ops)["pid"]
    finally:
        os.kill(worker, signal.SIGCONT)
    _worker_gone(pidfile)
    st = status(ops)
    assert st.get("state") == "active" and st.get("pid") == started, st


def test_a_directory_at_the_pidfile_never_leaves_the_service_down(ops: Ops) -> None:
    """probe37q Q5 (high): a directory at the pidfile's path (made by hand). A restart stopped
    the serving service, started the new one, could not record it ("Is a directory") and
    killed it: nothing served. The directory is now moved aside before anything stops."""
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = ops.root / "run" / "ddtree-engine.pid"
    pidfile.unlink()
    pidfile.mkdir()
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 0 and "was a directory: moved aside as" in text, text
    st = status(ops)
    assert st.get("state") == "active" and pidfile.is_file(), st


def test_a_run_directory_that_is_a_symlink_is_never_followed(ops: Ops, tmp_path: Path) -> None:
    """probe37q Q7: run/ made a symlink to another target's run directory: `ops service start`
    replaced that target's pidfile through it (its service then showed stale and unmanaged).
    The link is moved aside; the other directory is left as it was."""
    assert ops.deploy("--bootstrap").returncode == 0
    other = tmp_path / "other-run"
    other.mkdir()
    theirs = other / "ddtree-engine.pid"
    theirs.write_text('{"pid": 1, "start": "1", "note": "another target\\u0027s"}')
    kept = theirs.read_text()
    run = ops.root / "run"
    shutil.move(run, tmp_path / "our-run")
    run.symlink_to(other)
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 0 and "was a symlink to" in text and "moved aside" in text, text
    assert not run.is_symlink() and (run / "ddtree-engine.pid").is_file()
    assert theirs.read_text() == kept and sorted(p.name for p in other.iterdir()) == [theirs.name]
    assert status(ops).get("state") == "active"


def test_a_restart_whose_process_manager_is_killed_says_where_the_service_is(ops: Ops) -> None:
    """probe37aa L3: the host side of `ops service restart` killed (kill -9) while its worker
    stopped the service: ops said only "process manager printed no result", nothing of the
    service, which the worker (in a session of its own) went on to restart. The error now says
    the service's state, asked of the host after the loss."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc = ops.popen("service", "restart", "local")
    worker = _seen_restart_worker(pidfile)
    # its parent: the process manager's first process, which waits for the worker's result
    parent = int(Path(f"/proc/{worker}/stat").read_text().rpartition(")")[2].split()[1])
    os.kill(parent, signal.SIGKILL)  # the worker is stopping the service (1.5 s)
    out, err = proc.communicate(timeout=60)
    text = said(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert proc.returncode != 0 and "printed no result" in text, text
    assert "the service is now " in text, text


def test_a_deploy_whose_restart_manager_is_killed_exits_2_not_a_verdict(ops: Ops) -> None:
    """probe37at L4 (low): the host-side process manager of a deploy's restart killed (kill
    -9): the deploy rolled back and rightly did not reject the release, but exited 1, which a
    script reads as a verdict on the release. A host-side command killed is exit 2, as the
    exit codes say; the result still says where the host was left."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc = ops.popen(*ops.deploy_args())
    worker = _seen_restart_worker(pidfile)
    parent = int(Path(f"/proc/{worker}/stat").read_text().rpartition(")")[2].split()[1])
    os.kill(parent, signal.SIGKILL)  # the worker is stopping the service (1.5 s)
    out, err = proc.communicate(timeout=180)
    text = said(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert proc.returncode == 2 and "printed no result" in text, text
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "restart" and result["outcome"] == "rolled-back", result
    code, doc = ops.json("releases", "local")
    assert all(r["rejected"] is None for r in doc["releases"]), doc
    assert ops.current() == r1 and ops.serving() == r1


def test_a_pending_record_that_is_not_this_hosts_switch_blocks_no_restart(ops: Ops) -> None:
    """probe37ad M4 (medium): a stale or forged deploy.pending whose `new` is not current (a
    proven, serving release): status called current never proven, a restart was refused for
    it, and the refusal named a rollback that moved the service off current. Such a record is
    said as stale; a restart goes ahead on current, which stays where it is."""
    r1, r2 = ops.two_releases()
    (ops.root / "deploy.pending").write_text(json.dumps(pending_record(r2, r1)))
    code, st = ops.json("service", "status", "local")
    warned = " ".join(st.get("warnings", []))
    assert f"deploy.pending names a switch to {r1}, but current is {r2}: a stale" in warned, st
    assert "never proven" not in warned, st
    res = ops("service", "restart", "local")
    assert res.returncode == 0, said(res)
    assert ops.current() == r2 and ops.serving() == r2


def test_sigint_stops_a_restart_started_with_sigint_ignored(ops: Ops) -> None:
    """probe37an L2: a script's background job starts with SIGINT ignored (`ops ... &` in a
    non-interactive shell). A deploy still took SIGINT as Ctrl-C, but `ops service restart`
    ran on and exited 0. Every command now takes it: exit 130, said, and the restart's
    worker still brings the service back."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_STOP)
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    before = status(ops)["pid"]
    proc = ops.popen("service", "restart", "local", sigint_ignored=True)
    _seen_restart_worker(pidfile)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in stderr, (proc.returncode, stderr)
    _serving_again(ops, before)


def _serving_again(ops: Ops, before: int) -> dict:
    """The service's status once it is active from another process than `before` (20 s at
    most), asserted."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        st = status(ops)
        if st.get("state") == "active" and st.get("pid") != before:
            break
        time.sleep(0.2)
    assert st.get("state") == "active" and st["pid"] != before, st
    return st


def test_a_deploy_settles_a_dead_rollbacks_switch_before_it_weighs_current(ops: Ops) -> None:
    """probe37au L1 (low): a rollback --to r1, killed with its guard after its switch, left
    current on r1 while the service still ran r2, and a deploy.pending. The next deploy's
    `current` step blamed a --no-restart install and named a restart (which the record
    refuses) and stopped there. A deploy now settles the record first (its recover step puts
    the switch back: the service runs r2), then weighs current and goes on; its dry run says
    so instead of failing."""
    r1, r2 = ops.two_releases()
    # what the dead rollback left, as it writes it (a kill timed to its switch races the
    # restart's worker, which goes on in a session of its own)
    record = pending_record(
        r2,
        r1,
        by="rollback",
        old_previous=r1,
        previous_before={"kind": "release", "id": r1, "link": f"releases/{r1}"},
    )
    (ops.root / "deploy.pending").write_text(json.dumps(record))
    relink(ops.root, f"releases/{r1}")
    assert ops.current() == r1 and ops.serving() == r2
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy("--dry-run")
    text = said(res)
    assert res.returncode == 0 and "--no-restart" not in text, text
    assert "a deploy.pending is left by a deploy or rollback that died" in text, text
    res = ops.deploy()
    text = said(res)
    assert res.returncode == 0, text
    assert f"put back a switch no rollback settled: current {r1} -> {r2}" in text, text
    new = ops.current()
    assert new not in (r1, r2) and ops.serving() == new, text


SLOW_START = "def main() -> None:\n    import time as _t\n    _t.sleep(4)\n"


def test_a_deploy_is_never_rolled_back_while_its_new_release_serves(ops: Ops) -> None:
    """probe37av M1 (medium): the deploy's restart worker stopped (SIGSTOP) once it had started
    the new release: the restart failed, the switch went back, but the rollback's restart could
    not happen (the stopped worker holds the restart), and let go on, the worker started the
    new release. The deploy said `rolled-back`, before and after the old release, "unchanged",
    while the service ran code that never passed a post-flight. Its outcome is `failed` now,
    naming what runs and the restart that puts current's release back."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_START)
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    proc = ops.popen(*ops.deploy_args("--json"))
    worker = _seen_restart_worker(pidfile)
    time.sleep(1.5)  # the old service stopped, the new one started (it serves after 4 s)
    os.kill(worker, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        os.kill(worker, signal.SIGCONT)
    text = said(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    (result,) = json.loads(out)["results"]
    assert result["outcome"] == "failed" and "rolled back to" not in text, text
    assert f"current is back on {r1}, but the service still runs" in text, text
    assert f"ops service restart local runs {r1}" in text, text
    assert proc.returncode in (1, 2) and ops.current() == r1, text
    _worker_gone(pidfile)
    assert ops("service", "restart", "local").returncode == 0
    assert ops.serving() == r1


def test_a_host_python_that_hangs_is_said_to_have_hung(tmp_path: Path) -> None:
    """probe37be M3 (medium): the target's `python` hung (here a script that sleeps): `ops
    service status` waited its 60 s, then said "process manager printed no result (exit 124):
    no output", never that the command timed out nor which program hung."""
    hang = tmp_path / "hangpy"
    hang.write_text("#!/bin/bash\nexec sleep 1000\n")
    hang.chmod(0o755)
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\npython = '{hang}'\n"
        "[targets.local.service]\nurl = 'http://127.0.0.1:9'\n"
    )
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("OPS_INVENTORY", None)
    argv = [sys.executable, "-m", "ops", "service", "status", "local", "--inventory", str(inv)]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    text = said(res)
    assert res.returncode == 2, text
    assert f"{hang} did not finish in 60 s and was stopped (does the host's python hang?" in text
