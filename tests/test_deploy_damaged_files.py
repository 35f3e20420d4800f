"""Files on the host that ops keeps, damaged by hand (probe37e E2-E5).

- E2: a release whose service.env is gone is damaged: listed so, refused by a rollback (plain
  or --to), and never started by `ops service start` (its code would run without its
  configuration under its name).
- E3: a `current` whose release directory was deleted (the service still serving from it) is
  never deployed over, --force or not: a failed deploy could only revert to nothing. The
  refusal names `ops rollback` and the proven release it would take.
- E4: a FIFO or directory at `lock` is refused in one line naming it (before: 27 s, then "no
  answer"); a directory or FIFO at deploy.guard or deploy.switch is moved aside by the next
  deploy or rollback, which then works.
- E5: a `previous` whose release is gone, or no `previous` at all, gives way to the newest
  proven release in a plain `ops rollback`, which says so; a `previous` that is a real
  directory made by hand is refused with that release named in the hint.

Real processes throughout: the `ops` CLI on target `local`, the host side, the stand-in
service of tests/helpers/deploy_ops.py.
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
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import run_ops
from helpers.deploy import commit_change
from helpers.deploy_ops import NOISY_CRASH, Ops, one_error_line, pending_record
from helpers.local import wait_unlocked
from helpers.sshd import free_port


def said(res) -> str:
    return " ".join((res.stdout + res.stderr).split())


def service_pid(ops: Ops) -> int:
    return ops.json("service", "status", "local")[1]["pid"]


def forge_pending(ops: Ops, r1: str, r2: str, current_before: dict, **more: object) -> None:
    """A deploy.pending in the shape ops writes (version 2) for a switch from r1 to r2 that no
    deploy settled, naming `current_before` as what current was (forged, as a hand might). r2
    loses its proven.json: a deploy's record naming a proven release is stale (probe37x M2),
    refused whatever else it names."""
    (ops.root / "releases" / r2 / "proven.json").unlink(missing_ok=True)
    doc = pending_record(r1, r2, current_before=current_before, **more)
    (ops.root / "deploy.pending").write_text(json.dumps(doc))


def test_nothing_writes_bytecode_into_a_release(ops: Ops) -> None:
    """probe37t T3 (medium): on a full disk, a host-side check's import wrote a .pyc into the
    current, proven release cut short (CPython's write is one write(2), which a full disk
    shortens), and every later import of that module failed ("EOFError: marshal data too
    short") until someone deleted it by hand. No check, bench or service started by ops
    writes bytecode into a release, so there is none to cut short."""
    r1, r2 = ops.two_releases()
    assert ops("healthcheck", "local", "--max-tokens", "3").returncode == 0
    assert ops("service", "restart", "local").returncode == 0
    env = (ops.root / "releases" / r2 / "service.env").read_text()
    assert "PYTHONDONTWRITEBYTECODE=1" in env.splitlines(), env
    for rel in (r1, r2):
        caches = list((ops.root / "releases" / rel).rglob("__pycache__"))
        assert caches == [], caches


def test_a_release_without_its_service_env_is_damaged_and_never_run(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    env = ops.root / "releases" / r1 / "service.env"
    env.unlink()
    code, doc = ops.json("releases", "local")
    listed = {r["id"]: r for r in doc["releases"]}
    assert "service.env is missing" in (listed[r1]["damaged"] or ""), listed[r1]
    assert listed[r2]["damaged"] is None
    line = one_error_line(ops("rollback", "local", "--max-tokens", "3"))
    assert f"release {r1} is damaged" in line and "service.env" in line, line
    line = one_error_line(ops("rollback", "local", "--to", r1, "--max-tokens", "3"))
    assert "service.env" in line, line
    assert ops.current() == r2 and ops.serving() == r2
    # the current release's own service.env gone: a start refuses, before stopping anything
    (ops.root / "releases" / r2 / "service.env").unlink()
    code, st = ops.json("service", "restart", "local")
    assert code != 0 and "service.env is missing" in st["detail"], st
    assert ops.serving() == r2  # the running service was not stopped


def test_no_deploy_over_a_current_whose_release_was_deleted(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    shutil.rmtree(ops.root / "releases" / r2)  # the service serves on from the deleted cwd
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    for extra in ((), ("--force",)):
        res = ops.deploy(*extra)
        text = said(res)
        assert res.returncode == 1, text
        assert f"release {r2}, whose directory is gone" in text, text
        # (probe37as H1: not the rollback alone, which would stop it with no way back)
        assert f"ops service stop local, then ops rollback local --to {r1}, knowing" in text
    assert os.readlink(ops.root / "current") == f"releases/{r2}"
    code, st = ops.json("service", "status", "local")
    assert st["state"] == "active", st  # the serving host was never stopped
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 2 and "with no way back to it" in said(res), said(res)
    assert ops.json("service", "status", "local")[1]["state"] == "active"
    assert ops("service", "stop", "local").returncode == 0
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and ops.serving() == r1


def test_no_deploy_over_a_current_that_could_not_be_started_again(ops: Ops) -> None:
    """current's service.env gone (or over a MiB): a failed deploy's revert could not restart
    it, so the host that served would end down (probe37f F1, high). The deploy is refused at
    its `current` step, --force or not, naming the cause and the exact rollback."""
    r1, r2 = ops.two_releases()
    env = ops.root / "releases" / r2 / "service.env"
    kept = env.read_bytes()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    for damage, cause in ((Path.unlink, "service.env is missing"), (big, "bytes (at most")):
        damage(env)
        for extra in ((), ("--force",)):
            res = ops.deploy(*extra)
            text = said(res)
            assert res.returncode == 1 and "current: FAIL" in text, text
            assert "could not be started again" in text and cause in text, text
            # it serves: a rollback would stop it with no way back (probe37at H2)
            assert "mend current first; or ops service stop local, then ops rollback local " in (
                text
            ), text
            assert ops.current() == r2
            code, st = ops.json("service", "status", "local")
            assert st["state"] == "active", st  # never stopped
        env.write_bytes(kept)
    res = ops.deploy()  # mended: the broken release is tried, and undone
    assert res.returncode == 1 and ops.current() == r2 and ops.serving() == r2, said(res)


def big(env: Path) -> None:
    env.unlink()
    with open(env, "wb") as f:
        f.truncate(2 << 20)


def test_a_fifo_or_directory_at_lock_is_one_line_naming_it(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    lock = ops.root / "lock"
    for make in (os.mkfifo, os.mkdir):
        lock.unlink() if not lock.is_dir() else lock.rmdir()
        make(lock)
        for args in (("rollback", "local", "--max-tokens", "3"), ("service", "stop", "local")):
            res = ops(*args, timeout=20)  # before: 27 s, then "could not take the lock"
            line = one_error_line(res)
            assert f"{lock} is not a regular file" in line, line
            assert "rm -r" in res.stderr, res.stderr
    assert ops.current() == r2 and ops.serving() == r2


@pytest.mark.parametrize("name", ["deploy.guard", "deploy.switch"])
def test_junk_at_a_deploy_control_file_is_moved_aside(ops: Ops, name: str) -> None:
    r1, r2 = ops.two_releases()
    junk = ops.root / name
    junk.unlink()
    junk.mkdir()
    (junk / "x").write_text("made by hand\n")
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and ops.serving() == r1
    assert f"{name} was a directory: moved aside as {name}.unusable-" in said(res), said(res)
    kept = list(ops.root.glob(f"{name}.unusable-*"))
    assert len(kept) == 1 and (kept[0] / "x").read_text() == "made by hand\n"
    os.unlink(ops.root / name)
    os.mkfifo(ops.root / name)
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3", timeout=60)
    assert res.returncode == 0, said(res)
    assert ops.current() == r2 and f"{name} was a FIFO" in said(res)


def test_a_lost_previous_gives_way_to_the_newest_proven_release(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    prev = ops.root / "previous"
    gone = "releases/20991231T000000Z-abcdef0123"
    prev.unlink()
    prev.symlink_to(gone)  # a previous whose release was deleted
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 0, text
    assert ops.current() == r1 and ops.serving() == r1
    assert "so the newest proven release was taken" in text and "whose directory is gone" in text
    # no previous link at all: the same
    prev.unlink()
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r2 and "no previous link" in said(res)
    # r2 is newer than r1: said as a move forward, not "rolled back" (probe37aj L4)
    assert f"moved forward: {r2} is current" in said(res), said(res)
    assert f"{r2} is newer than {r1}: not a step back" in said(res), said(res)
    # a real directory made by hand: the operator's, refused, the proven release named
    prev.unlink()
    prev.mkdir()
    res = ops("rollback", "local", "--max-tokens", "3")
    line = one_error_line(res)
    assert "no previous release to roll back to" in line, line
    assert f"ops rollback local --to {r1}" in res.stderr, res.stderr  # the name, not TARGET
    assert ops.current() == r2 and prev.is_dir()


def test_many_junk_releases_are_summed_up_not_listed_line_by_line(ops: Ops) -> None:
    """50 id-shaped directories made by hand: `ops releases` warns of 10 and counts the rest
    (--json has them all), and the prune line names 5 and counts the rest (probe37e E8:
    20,000 of them printed 3.5 MB of warnings)."""
    assert ops.deploy("--bootstrap").returncode == 0
    for i in range(50):
        (ops.root / "releases" / f"20000101T0000{i:02d}Z-{i:07x}").mkdir()
    res = ops("releases", "local")
    warned = [ln for ln in res.stderr.splitlines() if "is damaged" in ln]
    assert len(warned) == 10 and "and 40 more damaged releases" in res.stderr, res.stderr
    code, doc = ops.json("releases", "local")
    assert sum(1 for r in doc["releases"] if r["damaged"]) == 50
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    res = ops.deploy("--keep", "2")
    assert res.returncode == 0, said(res)
    prune = next(s for s in ops.record("deploy")["results"][0]["steps"] if s["name"] == "prune")
    assert prune["detail"].endswith("and 45 more (keep 2)"), prune["detail"]
    assert len(prune["data"]["removed"]) == 50


def test_status_says_when_the_service_runs_another_release_than_current(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    code, st = ops.json("service", "status", "local")
    assert st["state"] == "active" and not st.get("warnings"), st
    tmp = ops.root / "current.tmp"
    tmp.symlink_to(f"releases/{r1}")
    tmp.rename(ops.root / "current")  # switched by hand, not restarted
    code, st = ops.json("service", "status", "local")
    assert f"runs release {r2}, not current ({r1})" in " ".join(st.get("warnings", [])), st
    shutil.rmtree(ops.root / "releases" / r2)
    code, st = ops.json("service", "status", "local")
    assert f"runs release {r2}, whose directory was deleted" in " ".join(st["warnings"]), st
    res = ops("service", "status", "local")
    assert "whose directory was deleted" in said(res), said(res)


def test_fifos_at_the_lock_notes_hang_nothing(ops: Ops) -> None:
    """lock.holder and lock.holder.tmp made FIFOs: the healthcheck (which reads the note), a
    rollback (which writes it) and a stop all finish; before, each blocked on the FIFO."""
    r1, r2 = ops.two_releases()
    os.mkfifo(ops.root / "lock.holder")
    os.mkfifo(ops.root / "lock.holder.tmp")
    res = ops("healthcheck", "local", "--max-tokens", "3", timeout=60)
    assert res.returncode == 0, said(res)
    os.unlink(ops.root / "lock.holder.tmp")
    os.mkfifo(ops.root / "lock.holder.tmp")
    res = ops("rollback", "local", "--max-tokens", "3", timeout=90)
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and ops.serving() == r1


def test_the_refusal_names_the_exact_rollback_that_restores_the_newest_release(ops: Ops) -> None:
    """current pointed at nothing while r2 (newest, proven) served and previous is r1: the fix
    named is `ops rollback --to r2`, and it restores r2 (probe37f F2: it said "ops rollback",
    which takes previous, an older release)."""
    r1, r2 = ops.two_releases()
    tmp = ops.root / "current.tmp"
    tmp.symlink_to("nowhere")
    tmp.rename(ops.root / "current")
    res = ops.deploy()
    assert res.returncode == 1, said(res)
    # (it serves r2: named as what it runs, adopted with a way back: probe37at H2's kin)
    assert f"ops rollback local --to {r2} makes what the service runs current" in said(res)
    res = ops("releases", "local")
    assert f"ops rollback local --to {r2}` puts back the newest proven release" in said(res)
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r2 and ops.serving() == r2
    # `previous` is never made a link to nothing (probe37f F7): it still names r1
    assert os.readlink(ops.root / "previous") == f"releases/{r1}"


def test_a_current_that_could_not_restart_is_said_while_it_serves(ops: Ops) -> None:
    """probe37f F9: status warns, while the service still serves, of what the next restart
    would refuse (current pointing at nothing; a FIFO service.env), and that refusal names
    the fix, a whole release put back."""
    r1, r2 = ops.two_releases()
    env = ops.root / "releases" / r2 / "service.env"
    env.unlink()
    os.mkfifo(env)
    code, st = ops.json("service", "status", "local")
    said_st = " ".join(st.get("warnings", []))
    assert st["state"] == "active" and "a restart would be refused" in said_st, st
    assert "not a regular file" in said_st, st
    code, st = ops.json("service", "restart", "local")
    assert code != 0 and "not a regular file" in st["detail"], st
    assert "ops rollback local --to ID" in st["detail"], st
    assert ops.serving() == r2  # never stopped
    tmp = ops.root / "current.tmp"
    tmp.symlink_to("nowhere")
    tmp.rename(ops.root / "current")
    code, st = ops.json("service", "status", "local")
    assert "a restart would be refused: current -> nowhere does not exist" in " ".join(
        st.get("warnings", [])
    ), st
    # a `current` that is a directory but no release was not said at all (probe37ai L2)
    for link, why in ((".", "the remote root itself"), ("releases", "the releases/ directory")):
        tmp.symlink_to(link)
        tmp.rename(ops.root / "current")
        code, st = ops.json("service", "status", "local")
        assert f"refused without --force: current -> {link} resolves to {why}" in " ".join(
            st.get("warnings", [])
        ), st


def test_a_damaged_current_is_said_by_status(ops: Ops) -> None:
    """probe37ak L3: current's release.json made another release's (copied over by hand):
    `ops releases` marks it damaged and a deploy refuses to go on from it, but status said
    nothing. It warns, naming the target's rollback."""
    r1, r2 = ops.two_releases()
    manifest = ops.root / "releases" / r2 / "release.json"
    doc = json.loads(manifest.read_text())
    doc["id"] = "20991231T000000Z-deadbeef00"
    manifest.write_text(json.dumps(doc))
    code, st = ops.json("service", "status", "local")
    warned = " ".join(" ".join(st.get("warnings", [])).split())
    assert st["state"] == "active", st
    assert f"current ({r2}) is a damaged release (its release.json is release 2099" in warned
    assert "ops rollback local --to ID" in warned and "TARGET" not in warned, warned


@pytest.mark.parametrize("inside", ["current", "releases", "current/sub"])
def test_a_remote_root_inside_another_roots_releases_is_refused(ops: Ops, inside: str) -> None:
    """probe37f F10 (low): a target whose remote_root is another root's current (or its
    releases/) had its lock, guard and releases/ written into a live release. probe37i I3
    (low): a deploy's --dry-run approved such a root; it is refused as the lock refuses it."""
    r1, r2 = ops.two_releases()
    before = sorted(p.name for p in (ops.root / "releases" / r2).iterdir())
    inv = ops.tmp / "nested.toml"
    inv.write_text(ops.inventory.read_text().replace(str(ops.root), str(ops.root / inside)))
    res = run_ops("service", "stop", "local", inventory=inv, env=ops.env, timeout=60, cwd=REPO)
    line = one_error_line(res)
    assert f"is inside the releases of the remote root {ops.root}" in line, line
    dry = ("deploy", "local", "--source", str(ops.src), "--dry-run")
    line = one_error_line(run_ops(*dry, inventory=inv, env=ops.env, timeout=60, cwd=REPO))
    assert f"is inside the releases of the remote root {ops.root}" in line, line
    assert sorted(p.name for p in (ops.root / "releases" / r2).iterdir()) == before
    assert ops.serving() == r2


def test_a_rollback_from_a_current_pointing_at_nothing_leaves_a_usable_previous(ops: Ops) -> None:
    """probe37g G1: after a rollback away from a current that pointed at nothing, previous
    named the new current itself, so the next plain rollback said "already current" and did
    nothing (exit 0). Now no previous is left naming current, and a plain rollback, here or on
    a host already in that state, takes the newest other proven release."""
    assert ops.deploy("--bootstrap").returncode == 0
    r0 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    assert ops.deploy().returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n\n")
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    shutil.rmtree(ops.root / "releases" / r2)  # current points at nothing; previous is r1
    # the service still runs r2's deleted code: stopped knowingly first (probe37as H1)
    assert ops("service", "stop", "local").returncode == 0
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, said(res)
    assert not (ops.root / "previous").is_symlink()  # not a link to current itself
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == r0 and ops.serving() == r0, said(res)
    # a host left with previous == current (by an older ops, or by hand): the same
    prev = ops.root / "previous"
    prev.unlink()
    prev.symlink_to(f"releases/{r0}")
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == r1, said(res)
    assert "previous names current itself" in said(res), said(res)


def test_a_run_that_is_no_directory_is_named_with_its_fix(ops: Ops) -> None:
    """probe37g G4: run/ replaced by a regular file: status said 'unreadable pidfile (Not a
    directory)', a restart 'cannot write the pidfile ...: File exists'. Both now name run/
    and the fix; the service is never stopped for it."""
    r1, r2 = ops.two_releases()
    run = ops.root / "run"
    shutil.rmtree(run)
    run.write_text("x\n")
    code, st = ops.json("service", "status", "local")
    assert f"{run} is not a directory (made by hand?)" in st["detail"], st
    code, st = ops.json("service", "restart", "local")
    assert code != 0 and f"{run} is not a directory (made by hand?)" in st["detail"], st
    assert "remove it" in st["detail"]
    run.unlink()
    assert ops.serving() == r2  # never stopped for it
    code, st = ops.json("service", "stop", "local")  # its pidfile went with run/: found so
    assert code == 0 and st["state"] == "inactive", st


def test_a_held_lock_whose_note_is_no_file_says_so(ops: Ops) -> None:
    """probe37g G7: the lock held, lock.holder a FIFO: the refusal said 'a holder that is
    still starting (no note from it yet)'; it says the note is not a regular file."""
    r1, r2 = ops.two_releases()
    os.mkfifo(ops.root / "lock.holder")
    holder = subprocess.Popen(["flock", str(ops.root / "lock"), "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the flock is taken
            with open(ops.root / "lock") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    break
            time.sleep(0.05)
        line = one_error_line(ops("rollback", "local", "--max-tokens", "3", timeout=60))
        assert "its holder's note (lock.holder) is not a regular file" in line, line
    finally:
        holder.kill()
        holder.wait()
    assert ops.current() == r2


def test_what_is_kept_aside_is_trimmed_and_damage_is_worded(ops: Ops) -> None:
    """probe37g G8 (low): deploy.pending.unreadable-* piled up one per recovery; a release.json
    over a MiB was 'missing or not a JSON object'; a damaged release's created column '?Z'."""
    r1, r2 = ops.two_releases()
    for i in range(8):
        (ops.root / f"deploy.pending.unreadable-20260101T00000{i}Z").write_text("{")
    big = ops.root / "releases" / r1 / "release.json"
    with open(big, "r+b") as f:
        f.truncate(2 << 20)
    res = ops("releases", "local")
    assert f"{r1} is damaged: release.json is {2 << 20} bytes" in said(res), said(res)
    row = next(ln for ln in res.stdout.splitlines() if r1 in ln)
    assert "?Z" not in row, row
    res = ops("rollback", "local", "--max-tokens", "3")  # refused (damaged), but prepared
    kept = sorted(p.name for p in ops.root.glob("deploy.pending.unreadable-*"))
    assert kept == [f"deploy.pending.unreadable-20260101T00000{i}Z" for i in range(3, 8)], kept


@pytest.mark.parametrize("bad", ["huge", "nul", "not-utf8"])
def test_a_service_env_a_start_would_refuse_makes_the_release_damaged(ops: Ops, bad: str) -> None:
    """probe37l L5 (low): a release whose service.env is over the MiB a start reads was listed
    whole, and `ops rollback --to` switched to it only to have the restart refuse (undone).
    It is damaged, as a missing one is: refused before anything is switched. probe37bm M2: so
    is one holding a NUL byte or bytes that are not UTF-8 (the failed start then named
    current's service.env, by then the good one, and a stop of the serving service)."""
    r1, r2 = ops.two_releases()
    env = ops.root / "releases" / r1 / "service.env"
    if bad == "huge":
        os.truncate(env, 2 << 20)
        said = "service.env is 2097152 bytes"
    else:
        env.write_bytes(env.read_bytes() + (b"X=\0\n" if bad == "nul" else b"X=\xff\n"))
        said = "service.env holds a NUL byte" if bad == "nul" else "service.env is not UTF-8"
    code, doc = ops.json("releases", "local")
    listed = {r["id"]: r for r in doc["releases"]}
    assert said in (listed[r1]["damaged"] or ""), listed[r1]
    line = one_error_line(ops("rollback", "local", "--to", r1, "--max-tokens", "3"))
    assert f"release {r1} is damaged ({said}" in line, line
    assert ops.current() == r2 and ops.serving() == r2


def test_unreadable_marks_make_a_release_damaged_and_sparse_files_count_what_they_take(
    ops: Ops,
) -> None:
    """probe37i I5 (low): a FIFO at a release's rejected.json left it listed as a good release
    (and named as the newest proven one a rollback --to could take); a sparse proven.json made
    it look 5 GiB. An unreadable rejection mark is damage, and sizes are what the disk holds."""
    r1, r2 = ops.two_releases()
    os.mkfifo(ops.root / "releases" / r1 / "rejected.json")
    os.truncate(ops.root / "releases" / r2 / "proven.json", 1 << 30)
    code, doc = ops.json("releases", "local")
    listed = {r["id"]: r for r in doc["releases"]}
    assert code == 0 and "rejected.json is not a regular file" in (listed[r1]["damaged"] or "")
    assert listed[r2]["size_bytes"] < 64 << 20, listed[r2]["size_bytes"]
    line = one_error_line(ops("rollback", "local", "--max-tokens", "3"))
    assert f"release {r1} is damaged (rejected.json" in line, line
    assert ops.current() == r2 and ops.serving() == r2


@pytest.mark.parametrize(
    "shape",
    [
        "release-link",
        "foreign-etc",
        "aside-releases",
        "previous-aside-release",
        "other-root",
        "aside-link-releases",
        "aside-link-outside",
        "aside-empty-directory",
        "foreign-previous",
    ],
)
def test_a_forged_pending_record_never_points_current_outside_the_releases(
    ops: Ops, tmp_path: Path, shape: str
) -> None:
    """probe37l L1 (high), L2: a deploy.pending written by hand in the shape ops writes, whose
    `current_before` names release R1 with a link to /nonexistent (or a foreign link to /etc
    with no `resolves`): the recover step pointed current at that path (every rollback then
    failed, the fix named did not work), or crashed on the host with a traceback (exit 2). A
    release is put back as releases/<id>; a foreign current no service could start from is
    not what current was: it stays, and the rollback goes on to a release. probe37m M2
    (high): an `aside` naming releases/ (or a `previous_aside` naming a release) had the revert
    rename every release into `current`, and the next rollback stopped the serving service;
    only a <name>.before-<utc> of the root is a place a switch moves things aside to.
    probe37q Q4: a foreign link to a whole release of another root (and a previous of /etc):
    the service was restarted from that other target's code, and every start refused it.
    probe37r R1, R2 (high): an `aside` of the right name that is a link (to releases/, out of
    the root): renamed into `current` (the service restarted on it and left down), or every
    deploy and rollback refused. A switch moves aside only real entries. R2's variant: an
    empty real directory there, the same; only a whole copy of a release is put back (a deploy
    refuses to switch away from anything else). probe37s S2: a foreign `previous` (a link to
    a link): current -> previous, and the next rollback left previous -> previous."""
    r1, r2 = ops.two_releases()
    root = str(ops.root)
    before: dict = {"kind": "release", "id": r1, "link": f"releases/{r1}"}
    prev_before: dict = {"kind": "none"}
    aside = prev_aside = None
    if shape == "release-link":
        before["link"] = "/nonexistent/zz"
    elif shape == "foreign-etc":
        before = {"kind": "foreign", "link": "/etc"}
    elif shape == "foreign-previous":  # probe37s S2: current -> previous, then a loop
        before = {"kind": "foreign", "link": "previous", "exists": True}
    elif shape == "aside-releases":
        before, aside = {"kind": "directory", "path": f"{root}/current"}, f"{root}/releases"
    elif shape == "previous-aside-release":
        prev_before, prev_aside = {"kind": "directory"}, f"{root}/releases/{r1}"
    elif shape.startswith("aside-"):  # the name a switch gives, put there by hand
        before = {"kind": "directory", "path": f"{root}/current"}
        aside = f"{root}/current.before-20260101T000000Z"
        if shape == "aside-link-releases":
            os.symlink(f"{root}/releases", aside)
        elif shape == "aside-empty-directory":
            os.mkdir(aside)
        else:
            os.symlink(str(tmp_path), aside)
    else:  # another target's root, its release whole: what a start needs is all there
        elsewhere = tmp_path / "other-root" / "releases" / r1
        shutil.copytree(ops.root / "releases" / r1, elsewhere, symlinks=True)
        before = {"kind": "foreign", "link": str(elsewhere)}
        prev_before = {"kind": "foreign", "link": "/etc"}
    doc = {
        "version": 2,
        "previous": r1,
        "new": r2,
        "old_previous": None,
        "current_before": before,
        "previous_before": prev_before,
        "aside": aside,
        "previous_aside": prev_aside,
        "by": "deploy",
    }
    (ops.root / "releases" / r2 / "proven.json").unlink()  # (a record of a live switch)
    (ops.root / "deploy.pending").write_text(json.dumps(doc))
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 0 and "Traceback" not in text, text
    assert ops.current() == r1 and ops.serving() == r1, text
    assert os.readlink(ops.root / "current") == f"releases/{r1}"
    assert not (ops.root / "deploy.pending").exists()
    assert sorted(p.name for p in (ops.root / "releases").iterdir()) == sorted([r1, r2])
    if shape.startswith("aside-link") or shape == "aside-empty-directory":
        assert os.path.lexists(str(aside)), "what stood at the aside name is kept as it was"
    previous = ops.root / "previous"
    assert not previous.is_symlink() or os.readlink(previous) not in ("/etc", "previous")
    pid = ops.json("service", "status", "local")[1]["pid"]
    assert os.readlink(f"/proc/{pid}/cwd") == str(ops.root / "releases" / r1)


@pytest.mark.parametrize("junk", ["fifo", "symlink", "logs-symlink"])
def test_a_guard_log_that_is_no_regular_file_never_holds_the_host(
    ops: Ops, tmp_path: Path, junk: str
) -> None:
    """probe37o O2: a FIFO at logs/guard.log. A deploy killed after its switch: its guard put
    the old release back, then hung for good opening the FIFO (tee), holding deploy.guard, and
    every later deploy waited 240 s to be refused "still putting the host back". Now the guard
    writes no log there and ends; a link there gets nothing through it."""
    was = ops.two_releases()[1]
    log = ops.root / "logs" / "guard.log"
    with contextlib.suppress(FileNotFoundError):
        log.unlink()
    elsewhere = tmp_path / "not-the-guard-log.txt"
    elsewhere.write_text("mine\n")
    if junk == "fifo":
        os.mkfifo(log)
    elif junk == "symlink":
        log.symlink_to(elsewhere)
    else:  # probe37v V5: logs/ itself a link: guard.log was written through it
        shutil.rmtree(ops.root / "logs")
        (tmp_path / "other-logs").mkdir()
        (ops.root / "logs").symlink_to(tmp_path / "other-logs")
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    code, _, err, _ = ops.interrupt_at("postflight ...", "local", sig=signal.SIGKILL)
    assert code == -signal.SIGKILL, err
    # the guard puts `was` back, restarts it and ends
    assert wait_unlocked(ops.root / "deploy.guard", 60), "the guard never ended"
    assert ops.current() == was and ops.serving() == was
    assert elsewhere.read_text() == "mine\n"
    if junk == "logs-symlink":
        assert not (tmp_path / "other-logs" / "guard.log").exists(), "written through the link"
    t0 = time.monotonic()
    res = ops.deploy()
    assert res.returncode == 0 and time.monotonic() - t0 < 60, said(res)


def test_json_nested_deeper_than_the_parser_goes_blocks_nothing(ops: Ops) -> None:
    """probe37p P3: host files of deeply nested JSON, under every size cap (a pidfile of 60 KB,
    a deploy.pending or release.json of 100 KB): the host side's parser raised RecursionError,
    and status, restart, deploy, rollback and `ops releases` failed with its traceback until
    the file was deleted by hand. Each is now read as the unreadable file it is."""
    r1, r2 = ops.two_releases()
    pidfile = ops.root / "run" / "ddtree-engine.pid"
    pidfile.write_text("[" * 30000 + "]" * 30000)
    res = ops("service", "status", "local")
    assert "Traceback" not in said(res) and "stale pidfile" in said(res), said(res)
    res = ops("service", "restart", "local")
    assert res.returncode == 0, said(res)
    assert ops.serving() == r2
    (ops.root / "deploy.pending").write_text("[" * 50000 + "]" * 50000)
    res = ops("service", "status", "local")
    assert res.returncode == 0 and "deploy.pending is there but cannot be read" in said(res)
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n\n")
    res = ops.deploy()
    assert res.returncode == 0, said(res)
    (ops.root / "releases" / r1 / "release.json").write_text("[" * 50000 + "]" * 50000)
    res = ops("releases", "local")
    assert res.returncode == 0 and "damaged" in said(res) and "Traceback" not in said(res)
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and ops.serving() == r2, said(res)
    # the host lock's note, read when the lock is held (its first line, 4 KiB at most)
    with open(ops.root / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (ops.root / "lock.holder").write_text("[" * 4000 + "\n")
        res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 2 and "the holder's note is unreadable" in said(res), said(res)


def test_an_environment_variable_exec_would_refuse_never_stops_the_service(ops: Ops) -> None:
    """probe37q Q8: a 200 KB variable in current's service.env (under the MiB read, over the
    128 KiB the kernel lets one variable be): the restart stopped the service, exec failed
    (Argument list too long), nothing served. The restart is now refused before it stops."""
    r1, r2 = ops.two_releases()
    before = ops.json("service", "status", "local")[1]["pid"]
    env = ops.root / "releases" / r2 / "service.env"
    env.write_text(env.read_text() + "BIG=" + "x" * 200_000 + "\n")
    res = ops("service", "restart", "local")
    text = said(res)
    assert res.returncode == 1 and "BIG is 200005 bytes, over the 131072 bytes" in text, text
    assert ops.json("service", "status", "local")[1]["pid"] == before


@pytest.mark.parametrize("damage", ["rejected", "no-service-env"])
def test_a_forged_record_naming_a_rejected_release_never_stops_the_service(
    ops: Ops, damage: str
) -> None:
    """probe37r R6 (high): a deploy.pending in ops's shape whose current_before names a release
    a deploy had rejected: the rollback's recover switched onto it, stopped the serving
    service, and the start failed; no command brought it back. A switch is never made from a
    rejected release, so the record is not what current was: current and the service stay.
    probe37t T2 (high): the same with a release that has no service.env (a deploy refuses to
    switch from one): current was left on it, and every rollback and deploy was refused."""
    r1, r2 = ops.two_releases()
    pid = ops.json("service", "status", "local")[1]["pid"]
    if damage == "rejected":
        (ops.root / "releases" / r1 / "rejected.json").write_text('{"step": "postflight"}')
    else:
        (ops.root / "releases" / r1 / "service.env").unlink()
    forge_pending(ops, r1, r2, {"kind": "release", "id": r1, "link": f"releases/{r1}"})
    res = ops("rollback", "local", "--max-tokens", "3")
    assert "Traceback" not in said(res) and res.returncode in (1, 2), said(res)
    assert ops.current() == r2 and ops.json("service", "status", "local")[1]["pid"] == pid
    assert not (ops.root / "deploy.pending").exists()  # kept aside: nothing blocked by it
    res = ops.deploy()  # the same commit as r2: already current, nothing pending to settle
    assert res.returncode == 0, said(res)


def test_a_record_whose_previous_is_current_leaves_no_previous_naming_current(
    ops: Ops,
) -> None:
    """probe37bd L5: a whole deploy.pending written by hand whose previous_before names the
    release its current_before names: the revert left previous -> that release == current
    (every plain rollback from it would go nowhere). No previous is left naming current."""
    r1, r2 = ops.two_releases()
    r1_state = {"kind": "release", "id": r1, "link": f"releases/{r1}"}
    forge_pending(ops, r1, r2, r1_state, previous_before=r1_state)
    res = ops("rollback", "local", "--max-tokens", "3")
    assert "Traceback" not in said(res), said(res)
    assert ops.current() == r1, said(res)
    prev = ops.root / "previous"
    assert not prev.is_symlink() or os.readlink(prev).split("/")[-1] != r1, os.readlink(prev)


def test_a_forged_record_naming_a_copy_of_a_rejected_release_is_refused(ops: Ops) -> None:
    """probe37t T9 (high): a deploy.pending whose current_before is a foreign link to
    releases/hotfix, a copy of a release a deploy had rejected: the rollback's recover
    restarted the service there and left it down, and every later command failed. A copy of a
    rejected release is no hand-made release a revert goes back to: the record is kept aside,
    and the rollback goes on to the previous release."""
    r1, r2 = ops.two_releases()
    hotfix = ops.root / "releases" / "hotfix"
    shutil.copytree(ops.root / "releases" / r2, hotfix, symlinks=True)
    (hotfix / "rejected.json").write_text('{"step": "postflight"}')
    (hotfix / "engine" / "svc.py").write_text("raise SystemExit('rejected code')\n")
    forge_pending(
        ops,
        r1,
        r2,
        {"kind": "foreign", "link": "releases/hotfix", "exists": True},
        previous_before={"kind": "release", "id": r1, "link": f"releases/{r1}"},
    )
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and "Traceback" not in said(res), said(res)
    assert ops.current() == r1 and ops.serving() == r1
    assert list(ops.root.glob("deploy.pending.refused-*")), "the record is kept for a person"


def test_a_releases_link_to_another_root_is_refused_before_anything_is_sent(
    ops: Ops, tmp_path: Path
) -> None:
    """probe37t T8 (low): `releases/` a symlink to another root's releases: `ops releases`
    listed that root's releases as this target's, and a deploy sent its staging into it
    before its finalize refused. Deploys and rollbacks are refused at their first host step,
    nothing written through the link; `ops releases` warns."""
    other = tmp_path / "other-root" / "releases"
    other.mkdir(parents=True)
    ops.root.mkdir(parents=True, exist_ok=True)
    (ops.root / "releases").symlink_to(other)
    res = ops.deploy("--bootstrap")
    text = said(res)
    assert res.returncode != 0 and "Traceback" not in text, text
    assert f"{ops.root}/releases is a symlink (to {other})" in text, text
    assert list(other.iterdir()) == [], "written through the link"
    res = ops("releases", "local")
    assert "releases/ is a symlink" in said(res), said(res)


@pytest.mark.parametrize("named", ["release-link-out", "damaged-release", "staging-copy"])
def test_a_forged_record_naming_no_release_a_switch_left_is_refused(
    ops: Ops, tmp_path: Path, named: str
) -> None:
    """probe37u U1, U2, U3 (high): a deploy.pending in ops's shape naming as current_before
    (U1) a release id whose releases/<id> is a symlink out of the root, (U2) a release whose
    release.json is not whole, (U3) a foreign link to releases/.staging-foo, a copy that
    recover then removes: the recover switched current there, the service was left down or on
    a link to nothing, and every rollback (--to too) failed at its recover until the record
    was deleted by hand. None is a release a switch moves away from: the record is kept aside
    as refused, and the rollback goes on to the previous release."""
    r1, r2 = ops.two_releases()
    fake = "20200101T000000Z-aaaaaaaaaa"
    before: dict = {"kind": "release", "id": fake, "link": f"releases/{fake}"}
    if named == "release-link-out":
        outside = tmp_path / "outside"
        shutil.copytree(ops.root / "releases" / r1, outside, symlinks=True)
        (ops.root / "releases" / fake).symlink_to(outside)
    elif named == "damaged-release":
        shutil.copytree(ops.root / "releases" / r1, ops.root / "releases" / fake, symlinks=True)
        (ops.root / "releases" / fake / "release.json").write_text("[]")
    else:
        staging = ops.root / "releases" / ".staging-foo"
        shutil.copytree(ops.root / "releases" / r1, staging, symlinks=True)
        before = {"kind": "foreign", "link": "releases/.staging-foo", "exists": True}
    forge_pending(ops, r1, r2, before)
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and "Traceback" not in said(res), said(res)
    assert ops.current() == r1 and ops.serving() == r1
    assert os.readlink(ops.root / "current") == f"releases/{r1}"
    assert list(ops.root.glob("deploy.pending.refused-*")), "the record is kept for a person"


def test_a_forged_record_for_a_switch_the_host_is_not_in_moves_nothing(ops: Ops) -> None:
    """probe37v V2 (medium): a deploy.pending in ops's shape, whole, naming a proven release
    as current_before, but whose `new` is not where current points: the next deploy's recover
    switched the serving, proven current to the record's current_before and restarted the
    service there. A switch leaves current on its `new` (or, dead part way, on what it was):
    a record that describes neither is no switch the host is in. It is kept aside, current and
    the service stay, and the deploy goes on."""
    r1, r2 = ops.two_releases()
    pid = ops.json("service", "status", "local")[1]["pid"]
    forge_pending(
        ops,
        r1,
        "20200101T000000Z-aaaaaaaaaa",
        {"kind": "release", "id": r1, "link": f"releases/{r1}"},
    )
    res = ops.deploy()  # r2's own commit: nothing to do once the record is set aside
    text = said(res)
    assert res.returncode == 0 and "Traceback" not in text, text
    assert "describes a switch from releases/" in text and "current left as it is" in text, text
    assert ops.current() == r2 and ops.json("service", "status", "local")[1]["pid"] == pid
    assert list(ops.root.glob("deploy.pending.refused-*")), "the record is kept for a person"


@pytest.mark.parametrize("record", ["forged", "made", "cut"])
def test_a_record_whose_current_before_is_not_what_previous_names_is_refused(
    ops: Ops, record: str
) -> None:
    """probe37bj M1 (medium): a deploy killed with its guard after its switch from r2 to r3;
    its record's current_before then edited to r1, an older proven release. The next rollback
    put r1 back as "a switch no deploy settled": the host went to a release it was not on. A
    switch links previous to what current was: a record naming another than previous does is
    refused, kept aside, and the rollback goes to previous (r2), as it would with no record.
    The record as the switch wrote it (`made`), or as one cut before its previous link
    (`cut`: previous still the one before), is put back as before."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy().returncode == 0
    r3 = ops.current()
    assert os.readlink(ops.root / "previous") == f"releases/{r2}"
    before = r1 if record == "forged" else r2
    forge_pending(
        ops,
        before,
        r3,
        {"kind": "release", "id": before, "link": f"releases/{before}"},
        previous_before={"kind": "release", "id": r1, "link": f"releases/{r1}"},
    )
    if record == "cut":
        os.unlink(ops.root / "previous")
        os.symlink(f"releases/{r1}", ops.root / "previous")
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 0 and "Traceback" not in text, text
    assert ops.current() == r2 and ops.serving() == r2, text
    refused = list(ops.root.glob("deploy.pending.refused-*"))
    if record == "forged":
        assert refused, "the record is kept for a person"
        assert (
            f"deploy.pending describes a switch from releases/{r1} to {r3}, but previous is "
            f"releases/{r2}, where that switch leaves releases/{r1}" in text
        ), text
    else:
        assert not refused and f"current {r3} -> {r2}" in text, text


def test_a_deploy_record_whose_release_was_proven_moves_nothing(ops: Ops) -> None:
    """probe37x M2 (medium): a stale deploy.pending (whole, by a deploy) whose `new` is the
    proven current and whose `previous` a release that never served: the next deploy's recover
    switched the host off its proven current onto that release and restarted it there. A
    deploy removes its record before it marks its release proven, so such a record is no
    switch to undo: it is kept aside as refused, current and the service stay."""
    r1, r2 = ops.two_releases()
    (ops.root / "releases" / r1 / "proven.json").unlink()  # r1: as if it never served
    pid = ops.json("service", "status", "local")[1]["pid"]
    (ops.root / "deploy.pending").write_text(json.dumps(pending_record(r1, r2)))
    # probe37ag L2: status called the proven current "taken for never proven" for it
    warned = " ".join(ops.json("service", "status", "local")[1].get("warnings", []))
    assert f"names a deploy of {r2}, which passed a post-flight since" in warned, warned
    assert "never proven" not in warned, warned
    res = ops.deploy()  # r2's own commit: nothing to do once the record is set aside
    text = said(res)
    assert res.returncode == 0 and f"names a deploy of {r2}, which was proven since" in text, text
    assert ops.current() == r2 and ops.json("service", "status", "local")[1]["pid"] == pid
    assert list(ops.root.glob("deploy.pending.refused-*")), "the record is kept for a person"


def test_no_rollback_to_a_never_proven_release_from_a_current_it_could_not_come_back_to(
    ops: Ops,
) -> None:
    """probe37x H2 (high): current's service.env gone (serving all the same), `ops rollback
    --to` a release that never served and fails at start: the switch went ahead, the start
    failed, and the revert could not come back to current (damaged): no service. Such a
    rollback is refused before anything is stopped. probe37at H2 (high): so, while it serves,
    is one to a proven release (had that failed to start, no service either): each names the
    way that keeps one, current mended first (or a stop made knowingly), and a rollback from
    the mended current goes ahead."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    assert ops.deploy("--no-restart").returncode == 0  # installed, never started: unproven
    r3 = ops.current()
    assert ops("rollback", "local", "--to", r2, "--max-tokens", "3").returncode == 0
    pid = ops.json("service", "status", "local")[1]["pid"]
    env = ops.root / "releases" / r2 / "service.env"
    kept = env.read_bytes()
    env.unlink()
    res = ops("rollback", "local", "--to", r3, "--max-tokens", "3")
    line = one_error_line(res)
    assert f"release {r3} never passed a post-flight" in line, line
    way = f"mend current first; or ops service stop local, then ops rollback local --to {r1}"
    assert way in " ".join(res.stderr.split()), res.stderr
    assert ops.current() == r2 and ops.json("service", "status", "local")[1]["pid"] == pid
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 2 and way in " ".join(res.stderr.split()), said(res)
    assert ops.current() == r2 and ops.json("service", "status", "local")[1]["pid"] == pid
    env.write_bytes(kept)  # mended
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and ops.serving() == r1


def test_a_rejected_previous_gives_way_to_the_newest_proven_release(ops: Ops) -> None:
    """probe37y L5 (low): a plain rollback whose `previous` was rejected was refused ("deploy a
    fixed commit instead"), where a lost previous gives way to the newest proven release. It
    gives way the same, and says so."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy().returncode == 0
    r3 = ops.current()
    (ops.root / "releases" / r2 / "rejected.json").write_text('{"step": "postflight"}')
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 0 and f"previous ({r2}) was rejected" in text, text
    assert ops.current() == r1 and ops.serving() == r1 and r3 != r1


def test_a_rollback_finishing_a_settled_switch_says_what_it_did(ops: Ops) -> None:
    """probe37u U5 (low): a rollback killed in its recover left the record settled (current
    switched back to r1, the service still on r2); the next rollback said "rolled back: r1 is
    current and healthy (was r1, never proven)", naming the proven release it went back to
    as the never-proven one. It says an earlier switch back was finished."""
    r1, r2 = ops.two_releases()
    (ops.root / "current").unlink()
    (ops.root / "current").symlink_to(f"releases/{r1}")  # switched back; no restart yet
    record = {"settled": True, "current": r1, "by": "deploy"}
    (ops.root / "deploy.pending").write_text(json.dumps(record))
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, said(res)
    assert f"was {r1}, never proven" not in said(res), said(res)
    assert "died before its restart, done now" in said(res), said(res)


def test_a_settled_record_naming_nothing_put_back_is_said_one_way(ops: Ops) -> None:
    """probe37ap L2 (low): a settled deploy.pending with no `current` (written by hand): status
    and a restart took it for a put-back whose restart never came, and said both that and
    "the service runs it"; the rollback's recover then set it aside as "put back on null".
    Each says one thing: a record naming no release put back, not this host's switch."""
    r1, r2 = ops.two_releases()
    record = {"version": 2, "previous": r1, "new": r2, "old_previous": None, "settled": True}
    (ops.root / "deploy.pending").write_text(json.dumps({**record, "by": "rollback"}))
    code, st = ops.json("service", "status", "local")
    warned = " ".join(" ".join(st.get("warnings", [])).split())
    assert "a put-back onto no release, but current is" in warned and "stale" in warned, st
    assert "never came" not in warned and "its restart was done" not in warned, st
    text = said(ops("service", "restart", "local"))
    assert "never came" not in text and "its restart was done" not in text, text
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert "names no release current was put back on, but current is" in text, text
    assert "null" not in text, text
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, text


def test_a_record_the_revert_cannot_read_whole_is_said_so_by_status_too(ops: Ops) -> None:
    """probe37aq L3 (low): a forged deploy.pending whose previous_before is null: status and a
    restart called it a rollback that died before its post-flight ("ops rollback finishes
    it"), while the rollback's recover set it aside as not whole. One rule reads it now (the
    host scripts share ops/hostside/pending.py): each says it cannot be read whole, and why."""
    r1, r2 = ops.two_releases()
    doc = pending_record(r1, r2, previous_before=None, by="rollback")
    (ops.root / "deploy.pending").write_text(json.dumps(doc))
    why = "cannot be read whole (its previous_before is not a state)"
    code, st = ops.json("service", "status", "local")
    warned = " ".join(" ".join(st.get("warnings", [])).split())
    assert why in warned and "died before" not in warned, st
    text = said(ops("service", "restart", "local"))
    assert why in text and "died before" not in text, text
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert "deploy.pending could not be read whole (its previous_before is not a state)" in (
        text
    ), text
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, text


def test_a_recover_whose_restart_fails_never_blocks_a_rollback_to(ops: Ops) -> None:
    """probe37v V7, V8 (high): a recover put back a release whose start fails (a record
    naming a hand-made copy that crashes; or, before V3's refusal, a current installed with
    --no-restart): the record stayed settled, and every rollback, `--to` a proven release too,
    failed at its recover until deploy.pending was deleted by hand. `rollback --to` names where
    the operator wants the host: it goes there."""
    r1, r2 = ops.two_releases()
    hotfix = ops.root / "releases" / "hotfix"
    shutil.copytree(ops.root / "releases" / r2, hotfix, symlinks=True)
    (hotfix / "proven.json").unlink(missing_ok=True)
    (hotfix / "engine" / "svc.py").write_text("raise SystemExit('hotfix crash')\n")
    forge_pending(ops, r1, r2, {"kind": "foreign", "link": "releases/hotfix", "exists": True})
    res = ops("rollback", "local", "--max-tokens", "3", "--wait", "5")
    assert res.returncode == 1 and "service restarted on it: failed" in said(res), said(res)
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and ops.serving() == r1
    assert not (ops.root / "deploy.pending").exists()


def test_a_failed_recover_says_where_the_host_was_and_is(ops: Ops) -> None:
    """probe37t T2's table (low): a rollback whose recover step failed showed "(none)" as the
    release before, though the host had been on one. Its result names the switch it put back:
    from the release current was on, to the one it put back."""
    r1, r2 = ops.two_releases()
    svc = ops.root / "releases" / r1 / "engine" / "svc.py"
    svc.write_text("raise SystemExit('this start fails')\n")  # r1 no longer starts
    forge_pending(ops, r1, r2, {"kind": "release", "id": r1, "link": f"releases/{r1}"})
    code, out = ops.json("rollback", "local", "--max-tokens", "3", "--wait", "5")
    result = out["results"][0]
    assert code == 1 and result["failed_step"] == "recover", result
    assert result["before"] == r2 and result["after"] == r1, result


def test_a_tree_nested_thousands_deep_in_a_release_blocks_nothing(ops: Ops) -> None:
    """probe37r R4: directories nested 3000 deep inside an old release made `ops releases`,
    deploys and rollbacks fail with RecursionError (its size was walked recursively)."""
    r1, _ = ops.two_releases()
    nest = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
    subprocess.run([sys.executable, "-c", nest], cwd=ops.root / "releases" / r1, check=True)
    try:
        res = ops("releases", "local")
        assert res.returncode == 0 and r1 in said(res), said(res)
        commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
        res = ops.deploy()
        assert res.returncode == 0, said(res)
    finally:  # rm(1), not a recursive rmtree (pytest's own cleanup would meet the depth)
        subprocess.run(["rm", "-rf", str(ops.root / "releases" / r1 / "d")], check=False)


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_a_hand_made_copy_as_current_is_said_by_status(ops: Ops, where: str) -> None:
    """probe37al L2: `current` switched by hand to a copy of the release the service runs
    (`cp -a releases/ID copy`): a deploy refuses it without --force, but status said nothing.
    It warns, and the rollback it names makes what runs current again. probe37bp L1 (low): a
    copy outside the root was said to need --force, which a deploy refuses there too."""
    r1, r2 = ops.two_releases()
    copy = ops.root / "copy1" if where == "inside" else ops.tmp / "outside" / "copy1"
    shutil.copytree(ops.root / "releases" / r2, copy, symlinks=True)
    tmp = ops.root / "current.tmp"
    tmp.symlink_to("copy1" if where == "inside" else copy)
    tmp.rename(ops.root / "current")
    code, st = ops.json("service", "status", "local")
    warned = " ".join(" ".join(st.get("warnings", [])).split())
    assert code == 0 and st["state"] == "active", st
    shown = "copy1" if where == "inside" else str(copy)
    assert f"runs release {r2}, but current is {shown}, a copy made by hand" in warned, st
    assert ("refuses it without --force" in warned) == (where == "inside"), warned
    if where == "outside":
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
        assert ops.deploy("--force").returncode == 1  # refused, as the warning says
    assert f"ops rollback local --to {r2} makes what runs current" in warned, st
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r2 and ops.serving() == r2
    code, st = ops.json("service", "status", "local")
    assert code == 0 and not st.get("warnings"), st


def test_a_releases_link_is_said_by_status(ops: Ops, tmp_path: Path) -> None:
    """probe37ao L5 (low): with `releases/` a symlink, `ops releases` warned and every deploy
    and rollback was refused, but status said only "active". It warns while the service
    serves."""
    r1, r2 = ops.two_releases()
    other = tmp_path / "elsewhere"
    (ops.root / "releases").rename(other)
    (ops.root / "releases").symlink_to(other)
    code, st = ops.json("service", "status", "local")
    warned = " ".join(" ".join(st.get("warnings", [])).split())
    assert st["state"] == "active", st
    assert f"releases/ is a symlink to {other}" in warned and "are refused" in warned, st


def test_entries_with_a_release_name_that_are_no_release_are_said(ops: Ops, tmp_path: Path) -> None:
    """probe37ar L2 (low): a symlink (or a file) at a release id's name under releases/ was
    left out of `ops releases` with no word, and `rollback --to` it said only "no release".
    Both say what it is; nothing is followed, and the target outside is left alone."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    victim = tmp_path / "victim"
    shutil.copytree(ops.root / "releases" / r1, victim, symlinks=True)
    link, plain = "20200101T000000Z-aaaaaaaaaa", "20200101T000001Z-bbbbbbbbbb"
    (ops.root / "releases" / link).symlink_to(victim)
    (ops.root / "releases" / plain).write_text("not a release\n")
    res = ops("releases", "local")
    text = said(res)
    assert res.returncode == 0, text
    assert f"releases/{link} is a symlink (not a release)" in text, text
    assert f"releases/{plain} is not a directory (not a release)" in text, text
    code, doc = ops.json("releases", "local")
    assert [r["id"] for r in doc["releases"]] == [r1], doc
    assert {r["id"]: r["kind"] for r in doc["not_releases"]} == {
        link: "a symlink",
        plain: "not a directory",
    }, doc
    line = one_error_line(ops("rollback", "local", "--to", link, "--max-tokens", "3"))
    assert f"releases/{link} is a symlink (not one ops installed)" in line, line
    assert ops.current() == r1 and ops.serving() == r1
    assert (victim / "release.json").is_file()


def test_a_service_env_edited_by_hand_is_said_by_ops_releases(ops: Ops) -> None:
    """probe37ao L4 (low): a release whose service.env was edited by hand was listed as it was
    installed, with nothing said. release.json records the hash of the service.env installed;
    `ops releases` says which differ now (and lists them as they are: a rollback onto one
    still runs, and is proven or not by its checks)."""
    r1, r2 = ops.two_releases()
    env = ops.root / "releases" / r1 / "service.env"
    env.write_text(env.read_text() + "DDTREE_EXTRA=1\n")
    res = ops("releases", "local")
    text = said(res)
    assert res.returncode == 0, text
    assert f"{r1}'s service.env was changed since it was installed" in text, text
    assert f"{r2}'s service.env" not in text, text
    code, doc = ops.json("releases", "local")
    assert {r["id"]: r["env_edited"] for r in doc["releases"]} == {r1: True, r2: False}, doc


def test_a_release_whose_code_was_edited_by_hand_is_said_by_releases_and_rollback(
    ops: Ops,
) -> None:
    """probe37bd M3 (medium), (a): a release's code edited by hand (a file release.json lists
    changed, a sitecustomize.py added) was listed clean by `ops releases`, and a rollback went
    to it without a word. Both say which files changed since it was installed; what a running
    service writes (run/) is not counted."""
    r1, r2 = ops.two_releases()
    time.sleep(2.5)  # (past the slack on release.json's time)
    home = ops.root / "releases" / r1
    code = home / "engine" / "svc.py"
    code.write_text(code.read_text() + "# edited by hand\n")
    (home / "sitecustomize.py").write_text("x = 1\n")
    res = ops("releases", "local")
    text = said(res)
    assert f"{r1}'s files were changed since it was installed" in text, text
    assert "engine/svc.py, sitecustomize.py (added)" in text and f"{r2}'s files" not in text, text
    code_, doc = ops.json("releases", "local")
    edited = {r["id"]: r["code_edited"] for r in doc["releases"]}
    assert edited == {r1: ["engine/svc.py", "sitecustomize.py (added)"], r2: []}, edited
    res = ops("rollback", "local", "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 0 and ops.serving() == r1, text
    assert (
        f"{r1}'s files were changed since it was installed (by hand?): engine/svc.py, "
        "sitecustomize.py (added): it passed this post-flight as it is now" in text
    ), text


def test_a_revert_onto_code_edited_during_the_deploy_names_the_edit(ops: Ops) -> None:
    """probe37bd M3 (medium), (b): current's code edited by hand during a deploy, after its
    `current` step: the deploy failed, its revert restarted the service onto the edit, which
    did not start, and nothing named the edit. The result names it as the likely cause."""
    r1, r2 = ops.two_releases()
    ops.slow_selftest(3)
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    proc, seen = ops.popen_at("selftest ...", *ops.deploy_args())
    code = ops.root / "releases" / r2 / "engine" / "svc.py"
    code.write_text("raise SystemExit('broken by hand')\n" + code.read_text())
    out, err = proc.communicate(timeout=180)
    text = " ".join((seen + out + err).split())
    assert proc.returncode == 1 and f"current is back on {r2}" in text, text
    assert f"{r2}'s files were changed since it was installed (by hand?): engine/svc.py" in text


def test_no_deploy_or_rollback_stops_a_service_whose_current_env_was_edited_since(
    ops: Ops,
) -> None:
    """probe37au H1 (high): current's service.env edited by hand so that it no longer starts,
    while the service ran on with the environment it started with. A deploy of a crashing
    commit passed its `current` step, failed at restart, and its revert restarted current
    with the edit: the host was left down. Both a deploy (--force or not) and a rollback are
    now refused before anything stops, naming the edit (its key, never its value) and the way
    on; once the file is put back, the same deploy fails and goes back to the serving release.
    An edit the service was restarted on is no longer one it never ran with."""
    r1, r2 = ops.two_releases()
    before = service_pid(ops)
    env = ops.root / "releases" / r2 / "service.env"
    installed = env.read_text()
    env.write_text(installed + "PYTHONHOME=/nonexistent/secret-value\n")  # no python starts
    code, st = ops.json("service", "status", "local")
    assert "service.env was edited after the service started (PYTHONHOME" in str(st), st
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    for extra in ((), ("--force",)):
        res = ops.deploy(*extra)
        text = said(res)
        assert res.returncode == 1 and "current: FAIL" in text, text
        assert "(PYTHONHOME not as it runs)" in text and "secret-value" not in text, text
        assert "put back what changed as it was (current's service.env and files" in text, text
        assert service_pid(ops) == before and ops.current() == r2, text
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    text = said(res)
    assert res.returncode == 2 and "a rollback would stop it with no way back" in text, text
    assert "put back what changed as it was" in text, text
    assert service_pid(ops) == before, text
    env.write_text(installed)  # put back: the deploy runs, fails, and goes back to r2
    res = ops.deploy()
    text = said(res)
    assert res.returncode == 1 and "restart: FAIL" in text, text
    assert ops.current() == r2 and ops.serving() == r2, text
    # an edit no key shows (a line removed), made after the start, is told by its hash
    time.sleep(2.5)
    env.write_text(installed.replace("PYTHONDONTWRITEBYTECODE=1\n", ""))
    code, st = ops.json("service", "status", "local")
    assert "it is not as installed, and no key shows how it runs" in str(st), st
    # restarted on the edit, the service runs it: nothing untried is said any more
    assert ops("service", "restart", "local").returncode == 0
    code, st = ops.json("service", "status", "local")
    assert st["state"] == "active" and "edited after" not in str(st), st


def test_no_deploy_or_rollback_stops_a_service_whose_current_code_was_changed_since(
    ops: Ops,
) -> None:
    """probe37au H1's kin: current's code (a file release.json lists) edited by hand after the
    service started, so that it no longer starts: a failed deploy would restart the service
    on it. Refused as the edited service.env is, naming the file; a file whose bytes are as
    installed (its mode changed, say) is no change."""
    r1, r2 = ops.two_releases()
    before = service_pid(ops)
    time.sleep(2.5)  # (a change is one made a while after the start: /proc's start is coarse)
    code = ops.root / "releases" / r2 / "engine" / "svc.py"
    code.chmod(0o644)  # its ctime moves, its bytes do not
    code_, st = ops.json("service", "status", "local")
    assert "after the service started" not in str(st), st
    installed = code.read_text()
    code.write_text(installed.replace("def main() -> None:\n", "def main() -> None:\n    1/0\n"))
    code_, st = ops.json("service", "status", "local")
    assert "current's code was changed after the service started (engine/svc.py)" in str(st), st
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    res = ops.deploy("--force")
    text = said(res)
    assert res.returncode == 1 and "current: FAIL" in text, text
    assert "(engine/svc.py): a restart, or a revert to current" in text, text
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 2 and "a rollback would stop it with no way back" in said(res)
    assert service_pid(ops) == before and ops.current() == r2
    code.write_text(installed)  # put back: as installed again, whatever its time
    code_, st = ops.json("service", "status", "local")
    assert "after the service started" not in str(st), st
    aside = code.with_name("svc.py.away")  # removed (moved away: probe37av H1's variant)
    code.rename(aside)
    code_, st = ops.json("service", "status", "local")
    was = "current's code was changed after the service started (engine/svc.py (removed), "
    assert was + "engine/svc.py.away (added))" in str(st), st  # (a name it never ran: az M1)
    aside.rename(code)
    code_, st = ops.json("service", "status", "local")
    assert "after the service started" not in str(st), st
    away = code.parent.with_name("engine.away")  # its whole directory gone
    code.parent.rename(away)
    code_, st = ops.json("service", "status", "local")
    assert "started (engine/__main__.py (removed), engine/svc.py (removed)" in str(st), st
    away.rename(code.parent)
    code_, st = ops.json("service", "status", "local")
    assert "after the service started" not in str(st), st


def test_code_moved_into_current_as_a_directory_is_a_change_too(ops: Ops) -> None:
    """probe37bg H1 (high): a directory prepared before the service started, renamed into
    current after it (an engine/ of edited code; a site/ with a sitecustomize.py), keeps its
    files' own times, so nothing looked at it: a failed deploy went back onto it and the host
    was left with no service. A file under a directory changed since the start counts."""
    r1, r2 = ops.two_releases()
    release = ops.root / "releases" / r2
    evil = ops.tmp / "engine.prepared"
    shutil.copytree(release / "engine", evil)
    svc = evil / "svc.py"
    svc.write_text("raise SystemExit('prepared')\n" + svc.read_text())
    site = ops.tmp / "site.prepared"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise SystemExit('prepared')\n")
    time.sleep(1)
    assert ops("service", "restart", "local").returncode == 0  # started after they were made
    time.sleep(2.5)  # (a change is one made a while after the start: /proc's start is coarse)
    (release / "engine").rename(ops.tmp / "engine.orig")
    evil.rename(release / "engine")
    code, st = ops.json("service", "status", "local")
    assert "current's code was changed after the service started (engine/svc.py)" in str(st), st
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy("--dry-run")
    assert res.returncode != 0 and "current: FAIL" in said(res), said(res)
    (release / "engine").rename(evil)
    (ops.tmp / "engine.orig").rename(release / "engine")  # as installed: no change
    code, st = ops.json("service", "status", "local")
    assert "after the service started" not in str(st), st
    site.rename(release / "site")
    code, st = ops.json("service", "status", "local")
    assert "changed after the service started (site/sitecustomize.py (added))" in str(st), st
    assert ops.current() == r2 and ops.serving() == r2


def test_file_names_that_are_no_text_are_printed_escaped(ops: Ops) -> None:
    """probe37bg L2: a file added to a release with an escape sequence or a newline in its name
    reached the operator's terminal raw (it cleared it, recoloured it, split the warning)."""
    r1, r2 = ops.two_releases()
    time.sleep(2.5)  # (a change is one made a while after the start: /proc's start is coarse)
    engine = ops.root / "releases" / r2 / "engine"
    (engine / "\x1b[2Jevil").write_text("")
    (engine / "a\nb.py").write_text("")
    # probe37bm L2 (low): a byte that is no UTF-8 was shown as \udcff, no byte on disk
    (engine / os.fsdecode(b"bad\xffname")).write_text("")
    for args in (("service", "status", "local"), ("releases", "local")):
        res = ops(*args)
        text = res.stdout + res.stderr
        assert "\x1b" not in text and "a\nb.py" not in text, text
        flat = " ".join(text.split())
        assert "engine/\\x1b[2Jevil (added)" in flat and "engine/a\\nb.py (added)" in flat, flat
        assert "engine/bad\\xffname (added)" in flat and "udc" not in flat, flat


def test_a_deploy_of_currents_commit_over_its_edited_files_installs_it_anew(ops: Ops) -> None:
    """A deploy of the commit current holds, its files edited by hand since installed, said
    "already current; nothing to do": the host did not run the commit as built. It installs
    the commit anew, and says why."""
    r1, r2 = ops.two_releases()
    time.sleep(2.5)  # (an edit is one made a while after the install: ctimes are coarse)
    code = ops.root / "releases" / r2 / "engine" / "svc.py"
    code.write_text(code.read_text() + "# edited by hand\n")
    assert ops("service", "restart", "local").returncode == 0  # runs the edit now
    res = ops.deploy()
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0 and ops.current() not in (r1, r2), text
    assert f"{r2}, current, holds the same commit, but its files were changed" in text, text
    assert "(by hand?): engine/svc.py: installed anew" in text and "nothing to do" not in text, text


def test_no_deploy_stops_a_service_whose_current_gained_a_file_since(ops: Ops) -> None:
    """probe37az M1 (medium): a file release.json does not list, added to current after the
    service started (a sitecustomize.py, which Python runs at every start from the release's
    PYTHONPATH), was not looked at: a failed deploy restarted the service on it, and the
    host was left down. Refused as an edited file is, naming it; what the service itself
    writes while it runs (run/) and ops's own files are no change; once the file is gone, the
    deploy fails and goes back to the serving release."""
    r1, r2 = ops.two_releases()
    before = service_pid(ops)
    time.sleep(2.5)  # (a change is one made a while after the start: /proc's start is coarse)
    release = ops.root / "releases" / r2
    (release / "run" / "counters").mkdir(parents=True, exist_ok=True)
    (release / "run" / "counters" / "1.bin").write_bytes(b"\0" * 64)  # the hook's, as it runs
    (release / "proven.json").write_text((release / "proven.json").read_text())
    code_, st = ops.json("service", "status", "local")
    assert "after the service started" not in str(st), st
    added = release / "sitecustomize.py"
    added.write_text("raise SystemExit(7)\n")  # no start of r2 would come up
    code_, st = ops.json("service", "status", "local")
    assert "the service started (sitecustomize.py (added))" in str(st), st
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    for extra in ((), ("--force",)):
        res = ops.deploy(*extra)
        text = said(res)
        assert res.returncode == 1 and "current: FAIL" in text, text
        assert "(sitecustomize.py (added)): a restart, or a revert to current" in text, text
        assert service_pid(ops) == before and ops.current() == r2, text
    added.unlink()
    res = ops.deploy()
    text = said(res)
    assert res.returncode == 1 and "restart: FAIL" in text, text
    assert ops.current() == r2 and ops.serving() == r2, text


def test_no_deploy_stops_a_service_whose_command_the_inventory_changed_since(ops: Ops) -> None:
    """probe37au H1's kin: the inventory's service.command edited after the service started,
    to one that does not start: a deploy restarted the service with it, failed (rejecting a
    blameless release), and its revert started the same command: the host was left down.
    Refused before anything stops, as a changed service.env is; once the command is the one
    the service runs, the deploy goes on."""
    r1, r2 = ops.two_releases()
    before = service_pid(ops)
    was = ops.inventory.read_text()
    ops.inventory.write_text(was.replace("engine/svc.py --port", "engine/nothing.py --port"))
    code, st = ops.json("service", "status", "local")
    assert "the service runs another command than the inventory's service.command" in str(st)
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy()
    text = said(res)
    assert res.returncode == 1 and "current: FAIL" in text, text
    assert "the inventory's service.command" in text, text
    assert service_pid(ops) == before and ops.current() == r2, text
    ops.inventory.write_text(was)
    res = ops.deploy()
    assert res.returncode == 0, said(res)
    assert ops.current() not in (r1, r2)


def test_a_service_whose_port_the_inventory_moved_is_said_so_not_starting(ops: Ops) -> None:
    """probe37ba M1 (medium): the inventory's port edited while the service ran: status said
    "activating" (asked on the new port, where nothing listens; probe37bi L1: it still did,
    before the warning, and now says "unknown", not starting), a deploy said "start it",
    and the start said "already running", exit 1: the way named never got out. Each says the
    command changed since the service started and the way on (the inventory put back, or a
    restart on the new one)."""
    ops.two_releases()
    before = service_pid(ops)
    was = ops.inventory.read_text()
    ops.inventory.write_text(was.replace(f":{ops.port}'", f":{free_port()}'"))
    changed = "the service runs another command than the inventory's service.command"
    code, st = ops.json("service", "status", "local")
    assert st["state"] == "unknown" and changed in str(st), st  # not "activating" (bi-L1)
    assert "(not starting: it runs another command than now)" in st["detail"], st
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy()
    text = said(res)
    # (its `current` step refuses first since probe37bd H1: a revert restarts what never ran)
    assert res.returncode == 1 and "current: FAIL" in text and changed in text, text
    assert "start it (ops service start" not in text, text
    res = ops("service", "start", "local")
    text = said(res)
    assert res.returncode == 1 and changed in text, text
    assert service_pid(ops) == before
    ops.inventory.write_text(was)  # put back: the deploy goes on
    res = ops.deploy()
    assert res.returncode == 0, said(res)


def test_a_rollback_never_stops_a_service_whose_port_the_inventory_moved(ops: Ops) -> None:
    """probe37bd H1 (high): the inventory's port (and command) edited while the service served
    current; a rollback, refused with the port unchanged, read the service as not serving (it
    does not answer on the new port) and went on: its restart failed on the new command, its
    revert too, and both ports answered nothing. Any restart runs the new command, whatever
    release it starts: the rollback, and a deploy --force past its pre-flight, are refused
    before anything is stopped, naming the command change and the way on."""
    r1, r2 = ops.two_releases()
    before = service_pid(ops)
    was = ops.inventory.read_text()
    moved = was.replace(f":{ops.port}'", f":{free_port()}'").replace(
        "--port {port}'", "--port {port} --no-such-flag'"
    )
    assert moved.count("--no-such-flag") == 1 and moved != was
    ops.inventory.write_text(moved)
    changed = "the service runs another command than the inventory's service.command"
    for to in ((), ("--to", r1)):
        res = ops("rollback", "local", *to, "--max-tokens", "3")
        text = said(res)
        assert res.returncode == 2 and changed in text, text
        assert "ops service restart local" in text, text  # the new command tried knowingly
        assert service_pid(ops) == before and ops.current() == r2, text
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy("--force")
    text = said(res)
    assert res.returncode == 1 and "current: FAIL" in text and changed in text, text
    assert service_pid(ops) == before and ops.current() == r2, text
    ops.inventory.write_text(was)  # put back: the old port answers, the rollback goes on
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, said(res)
    assert ops.current() == r1 and ops.serving() == r1


def test_a_path_in_service_env_is_the_commands_not_the_process_managers(ops: Ops) -> None:
    """probe37bd M1 (medium): a `PATH` line added to current's service.env, then `ops service
    restart`: the service was stopped, then not started ("cannot run the command: No such file
    or directory: 'bash'"): the process manager looked its own bash up on the service's PATH.
    It finds bash on its own; the service runs with the PATH it was given."""
    ops.two_releases()
    env = ops.root / "current" / "service.env"
    env.write_text(env.read_text() + "PATH=/nonexistent/bin\n")
    code, st = ops.json("service", "restart", "local")
    assert code == 0 and st["state"] == "active", st
    environ = Path(f"/proc/{st['pid']}/environ").read_bytes().split(b"\0")
    assert b"PATH=/nonexistent/bin" in environ


def test_a_service_env_line_with_no_name_is_refused_before_anything_stops(ops: Ops) -> None:
    """probe37bd M2 (medium): a line `=value` in current's service.env: a restart ran with it,
    then read the file as edited since the start (a blank name, in no environment), so every
    deploy was refused, and the way it named (a restart, then deploy) never cleared it. The
    line is refused as a NUL byte is: by a restart before it stops anything, naming the line."""
    ops.two_releases()
    before = service_pid(ops)
    env = ops.root / "current" / "service.env"
    kept = env.read_text()
    env.write_text(kept + "=novalue\n")
    no_name = f"{env}: line {len(kept.splitlines()) + 1} has no name before its '='"
    code, st = ops.json("service", "restart", "local")
    assert code != 0 and no_name in st["detail"] and service_pid(ops) == before, st
    code, st = ops.json("service", "status", "local")
    assert any(no_name in w for w in st["warnings"]), st
    env.write_text(kept)
    code, st = ops.json("service", "restart", "local")
    assert code == 0 and not st.get("warnings"), st


def test_a_hung_self_test_is_a_failed_step_within_its_bound_and_says_it_runs(ops: Ops) -> None:
    """probe37bd M4 (medium): a self-test that hangs held the host lock for 10 minutes in
    silence, then ended as a bare `error:` (exit 2) with no steps in the record and its
    staging directory left. The target's selftest_timeout bounds it; meanwhile the deploy says
    the step still runs; then the step fails, the staging is removed, the host is as before."""
    r1, r2 = ops.two_releases()
    before = service_pid(ops)
    ops.inventory.write_text(
        ops.inventory.read_text().replace(
            "[targets.local]\n", "[targets.local]\nselftest_timeout = 6\n"
        )
    )
    ops.slow_selftest(300)
    t0 = time.monotonic()
    proc, seen = ops.popen_at("selftest ...", *ops.deploy_args())
    time.sleep(1)
    running = staging_procs(f"{ops.root}/releases/.staging")
    out, err = proc.communicate(timeout=120)
    text = " ".join((seen + out + err).split())
    assert running, "the self-test was seen running in its staging directory"
    assert proc.returncode == 1 and time.monotonic() - t0 < 60, text
    assert "selftest still runs (3 s; stopped at 6 s)" in text, text
    assert "selftest: FAIL" in text and "did not end in 6 s" in text, text
    steps_seen = [s["name"] for s in ops.record("deploy")["results"][0]["steps"]]
    assert steps_seen[-1] == "selftest", steps_seen
    assert sorted(p.name for p in (ops.root / "releases").iterdir()) == sorted([r1, r2])
    assert ops.current() == r2 and service_pid(ops) == before
    staging = f"{ops.root}/releases/.staging"
    assert staging_procs(staging) == []  # the self-test was stopped, not left to run


def staging_procs(staging: str) -> list[int]:
    """The processes whose directory is under `staging` (a self-test runs in its release's)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd").startswith(staging):
                found.append(int(pid))
    return found
