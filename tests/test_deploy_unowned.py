"""Hosts ops does not fully own: a `current` switched by hand, a tampered `deploy.pending`, a
damaged `release.json`, a `current` outside the root or a real directory, a full disk, a
killed rollback, a port held by another program. The rule each test checks: the host always
ends on a runnable release it was on, or on the new one, and every release command still works.

Real processes throughout: the `ops` CLI, the host-side scripts, the stand-in service run from
`current/` by ops's process manager (tests/helpers/deploy_ops.py's `Ops`), a tmpfs for the
full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO
from helpers.deploy import commit_change
from helpers.deploy_ops import (
    NOISY_CRASH,
    Ops,
    kill_guard_and_ops,
    lock_holder_shells,
    one_error_line,
    pending_record,
    steps,
)
from helpers.local import end_services

# the stand-in's post-flight answers never come
HANG = ("engine/svc.py", 'default="ok"', 'default="hang"')


def relink(root: Path, dest: str) -> None:
    """`current -> dest` switched by hand, as an operator would (ln -sfn)."""
    tmp = root / ".current.hand"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(dest)
    os.replace(tmp, root / "current")


def no_traceback(text: str) -> bool:
    """No traceback of ops's own (the service's, quoted as indented evidence, may be there)."""
    return not any(line.startswith("Traceback") for line in text.splitlines())


def healthy(ops: Ops) -> None:
    """The service answers the golden set (token-identical) from where it runs now."""
    res = ops("healthcheck", "local", "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr


def test_hand_pointed_current_survives_a_failed_deploy(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    assert r1
    shutil.copytree(ops.root / "releases" / r1, ops.root / "releases" / "hotfix", symlinks=True)
    relink(ops.root, "releases/hotfix")
    assert ops("service", "restart", "local").returncode == 0
    assert ops.serving() == "hotfix"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    # refused without --force, naming what it found; a dry run says the same
    for extra in ((), ("--dry-run",)):
        res = ops.deploy(*extra)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "current is releases/hotfix (a symlink ops did not make)" in res.stderr
        assert "--force" in res.stderr and no_traceback(res.stderr)
        assert os.readlink(ops.root / "current") == "releases/hotfix"
    # with --force the failed release is rolled back to exactly the hand-made link
    res = ops.deploy("--force", "--wait", "5")
    assert res.returncode == 1 and no_traceback(res.stderr), res.stderr
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "restart" and steps(result)["rollback"] == "ok"
    assert "rolled back to releases/hotfix" in result["message"]
    assert os.readlink(ops.root / "current") == "releases/hotfix"
    assert ops.serving() == "hotfix"
    healthy(ops)


def test_a_pending_record_whose_id_ends_in_a_newline_is_not_whole(ops: Ops) -> None:
    """probe37bp L2 (low): a deploy.pending edited so its ids end in a newline was read as
    whole (a release id's pattern ended in `$`, which matches before a final newline), and the
    raw newline split the warning in two. It is not whole: said on one line, set aside."""
    r1, r2 = ops.two_releases()
    record = pending_record(r1 + "\n", r2 + "\n")
    (ops.root / "deploy.pending").write_text(json.dumps(record))
    res = ops("releases", "local")
    assert res.returncode == 0 and f"{r2}\n" not in res.stderr, res.stderr  # one line
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and no_traceback(res.stderr), res.stderr
    (recover,) = [
        s for s in ops.record("rollback")["results"][0]["steps"] if s["name"] == "recover"
    ]
    assert "its new release is not a release id" in recover["detail"], recover
    assert list(ops.root.glob("deploy.pending.unreadable-*"))
    assert ops.current() == r1 and ops.serving() == r1


def test_empty_pending_record_is_never_a_first_install(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    (ops.root / "deploy.pending").write_text("{}")
    # `ops releases` still works and says a record is there
    res = ops("releases", "local")
    assert res.returncode == 0 and r1 in res.stdout, res.stderr
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    res = ops.deploy("--wait", "5")
    assert res.returncode == 1 and no_traceback(res.stderr), res.stderr
    result = ops.record("deploy")["results"][0]
    (recover,) = [s for s in result["steps"] if s["name"] == "recover"]
    assert (
        "could not be read whole" in recover["detail"]
        and "current left as it is" in (recover["detail"])
    )
    assert steps(result)["rollback"] == "ok" and result["after"] == r1
    assert ops.current() == r1 and ops.serving() == r1
    assert list(ops.root.glob("deploy.pending.unreadable-*"))  # kept for a person to read
    assert not (ops.root / "deploy.pending").exists()
    healthy(ops)


def test_damaged_release_json_blocks_no_command(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    old = ops.root / "releases" / ("20200101T000000Z-" + r1.split("-")[1])
    shutil.copytree(ops.root / "releases" / r1, old, symlinks=True)
    (old / "release.json").write_text("[]")
    (ops.root / "releases" / r1 / "release.json").write_text('{"selftest": "yes"}')
    code, doc = ops.json("releases", "local")
    assert code == 0
    damaged = {r["id"]: r["damaged"] for r in doc["releases"] if r["damaged"]}
    assert set(damaged) == {old.name, r1}, doc
    res = ops("releases", "local")
    assert res.returncode == 0 and f"{r1} is damaged" in res.stderr
    assert ops.deploy("--dry-run").returncode == 0
    line = one_error_line(ops("rollback", "local"))  # previous is r1: damaged, refused
    assert f"release {r1} is damaged" in line
    # a new deploy works beside them, and the rollback to an intact release works
    commit_change(ops.src, "engine/svc.py", '"""Release two. ', '"""Release three. ')
    res = ops.deploy()
    assert res.returncode == 0, res.stderr
    res = ops("rollback", "local", "--to", r2)
    assert res.returncode == 0 and ops.current() == r2, res.stderr
    healthy(ops)


def test_current_outside_the_root_is_not_an_ops_release(ops: Ops, tmp_path: Path) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    assert r1
    outside = tmp_path / "elsewhere" / r1  # an id-shaped name, other code
    shutil.copytree(ops.root / "releases" / r1, outside, symlinks=True)
    relink(ops.root, str(outside))
    code, doc = ops.json("releases", "local")
    assert code == 0 and doc["current"] is None and not any(r["current"] for r in doc["releases"])
    assert doc["current_state"]["kind"] == "foreign"
    res = ops.deploy()  # the same commit: not "already current"
    assert res.returncode == 1 and "already current" not in res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert "a symlink ops did not make" in text and "could not put back" in text, text
    assert os.readlink(ops.root / "current") == str(outside)


@pytest.mark.parametrize(
    "what", ["empty-directory", "another-root", "damaged-release", "rejected-release"]
)
def test_a_current_no_revert_could_put_back_is_refused_even_forced(
    ops: Ops, tmp_path: Path, what: str
) -> None:
    """probe37r R2's variant, from the other side: a revert puts back only a whole copy of a
    release (a forged record naming an empty directory had a rollback restart on it and leave
    the service down). So a deploy never switches away from a current it could not come back
    to, --force or not: an empty real directory, a link to another root's release. It says
    why and how on, and touches nothing; before, --force switched, and a failed deploy could
    only have left the new release in place."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    pid = ops.json("service", "status", "local")[1]["pid"]
    if what == "damaged-release":  # probe37u U2: a revert refuses a damaged release
        (ops.root / "releases" / str(r1) / "release.json").write_text("[]")
    elif what == "rejected-release":  # probe37u U8: and a rejected one: the service was left down
        (ops.root / "releases" / str(r1) / "rejected.json").write_text('{"at": "x"}')
    else:
        (ops.root / "current").unlink()  # the service runs on, from the release it started in
    if what == "empty-directory":
        (ops.root / "current").mkdir()
    elif what == "another-root":
        elsewhere = tmp_path / "other-root" / "releases" / str(r1)
        shutil.copytree(ops.root / "releases" / str(r1), elsewhere, symlinks=True)
        relink(ops.root, str(elsewhere))
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy("--force")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 1 and no_traceback(res.stderr), text
    assert "which a failed deploy could not put back" in text, text
    if what in ("damaged-release", "rejected-release"):
        assert f"mend releases/{r1}" in text, text
        # probe37x L3 (low): `ops releases` showed the rejected current as a plain current
        listed = " ".join(ops("releases", "local").stdout.split())
        flaw = "damaged" if what == "damaged-release" else "rejected"
        assert "current" in listed and flaw in listed, listed  # (wrapped in its column)
        return
    assert f"ops rollback local --to {r1}" in text, text
    assert steps(ops.record("deploy")["results"][0])["current"] == "fail"
    assert len(list((ops.root / "releases").iterdir())) == 1  # nothing sent, nothing switched
    assert ops.json("service", "status", "local")[1]["pid"] == pid
    res = ops("rollback", "local", "--to", str(r1), "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, res.stderr


def table_steps_whole(ops: Ops, table: str) -> None:
    """probe37bm L1 (low): a `current` that is no symlink, described in the table's release
    cell (which never wrapped), squeezed the steps column at 80 columns until its words were
    cut ("package:o"). Each step of the record stands whole in the table."""
    words = " ".join(table.split()).split()
    for name, status in steps(ops.record("deploy")["results"][0]).items():
        assert {f"{name}:{status}", f"{name}:forced"} & set(words), (name, status, table)


def test_current_as_a_real_directory_comes_back_whole(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    assert r1
    ops.stop()
    (ops.root / "current").unlink()
    shutil.copytree(ops.root / "releases" / r1, ops.root / "current", symlinks=True)
    assert ops("service", "start", "local").returncode == 0
    assert ops.serving() == "current"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    res = ops.deploy()
    assert res.returncode == 1 and "a real directory, not a symlink" in res.stderr, res.stderr
    table_steps_whole(ops, res.stdout)
    res = ops.deploy("--force", "--wait", "5")
    assert res.returncode == 1 and no_traceback(res.stderr), res.stderr
    assert steps(ops.record("deploy")["results"][0])["rollback"] == "ok"
    table_steps_whole(ops, res.stdout)
    cur = ops.root / "current"
    assert cur.is_dir() and not cur.is_symlink() and not (ops.root / "deploy.pending").exists()
    assert ops.serving() == "current"
    healthy(ops)
    res = ops("releases", "local")
    assert res.returncode == 0 and "pending" not in res.stderr
    # a good release goes over it with --force; the directory is kept as previous
    commit_change(ops.src, "engine/svc.py", NOISY_CRASH, "def main() -> None:\n")
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy("--force")
    assert res.returncode == 0, res.stderr
    assert ops.current() and ops.serving() == ops.current()
    assert os.readlink(ops.root / "previous").startswith(str(ops.root / "current.before-"))


def test_prune_keeps_proven_releases_over_unproven_ones(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r0 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release one. ')
    assert ops.deploy().returncode == 0
    r1 = ops.current()
    # two deploys stopped in their post-flight: switched back by the guard, never proven
    commit_change(ops.src, *HANG)
    unproven = []
    for n in range(2):
        commit_change(ops.src, "engine/svc.py", '"""', f'"""Try {n}. ')
        code, _, err, _ = ops.interrupt_at("postflight ...", "local", sig=signal.SIGTERM)
        assert code == 130 and ops.current() == r1, err
        unproven.append(ops.record("deploy")["results"][0]["release"])
    res = ops("releases", "local")
    assert all(f"unproven {u}" in " ".join(res.stdout.split()) for u in unproven), res.stdout
    commit_change(ops.src, HANG[0], HANG[2], HANG[1])
    assert ops.deploy("--keep", "3").returncode == 0
    r4 = ops.current()
    left = sorted(p.name for p in (ops.root / "releases").iterdir())
    assert left == sorted([r0, r1, r4]), left  # old code kept the unproven, pruned r0


def test_releases_marks_an_unproven_current_and_previous(ops: Ops) -> None:
    """probe37ay L1 (low): `ops releases` marked an unproven release "unproven" only where it
    was neither current nor previous: the rows of those two said their role alone, and a plain
    rollback, which goes to the newest proven release, skipped that previous unannounced. And
    probe37az L1 (low): a --no-restart deploy said the service still ran the current before
    its switch, a release that never ran."""
    assert ops.deploy("--bootstrap").returncode == 0
    r0 = ops.current()
    installed = []
    for n in range(2):  # installed, never restarted: never passed a post-flight
        commit_change(ops.src, "engine/svc.py", '"""', f'"""Release {n}. ')
        assert ops.deploy("--no-restart").returncode == 0
        installed.append(ops.current())
        # what still serves is r0, never the current before (probe37az L1: the second said
        # the first, which never ran)
        skip = [s for s in ops.record("deploy")["results"][0]["steps"] if s["name"] == "restart"]
        assert f"the service still runs {r0} until restarted" in skip[0]["detail"], skip
    wide = {**ops.env, "COLUMNS": "200"}  # (at 80, a mark of two words folds onto two lines)
    res = subprocess.run(ops.argv("releases", "local"), capture_output=True, text=True, env=wide)
    text = " ".join(res.stdout.split())
    assert res.returncode == 0, text
    assert f"previous unproven {installed[0]}" in text, text
    assert f"current unproven {installed[1]}" in text, text
    assert f"unproven {r0}" not in text, text  # proven by its post-flight


def test_failed_deploys_are_pruned_but_the_last_one(ops: Ops) -> None:
    """probe37av L3 (low): failed deploys were never pruned (prune ran only after a deploy
    that passed): a retry loop added a release each time, whatever --keep said, until the
    root's disk was full. A deploy that fails and rolls back prunes too, keeping the release
    it just rejected (its evidence) and never the proven ones --keep keeps."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    failed = []
    for n in range(2):
        commit_change(ops.src, "engine/svc.py", '"""', f'"""Try {n}. ')
        res = ops.deploy("--keep", "2")
        assert res.returncode == 1 and ops.current() == r2, res.stdout + res.stderr
        failed.append(ops.record("deploy")["results"][0]["release"])
    left = sorted(p.name for p in (ops.root / "releases").iterdir())
    assert left == sorted([r1, r2, failed[-1]]), left
    assert (ops.root / "releases" / failed[-1] / "rejected.json").is_file()
    assert ops.serving() == r2


def test_a_release_linked_in_another_shape_is_that_release(ops: Ops) -> None:
    """probe37t T1 (high): `current -> releases/A/.` (the release A, written by hand with a
    trailing "/."), previous -> B. A deploy (with --force: the link read as one ops did not
    make) switched from it, and its prune deleted A, the release the host had been on;
    `previous` dangled and the next rollback went to B. The link is release A, whatever its
    shape: the deploy needs no --force, previous names A after it, and A is kept."""
    assert ops.deploy("--bootstrap").returncode == 0
    a = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release B. ')
    assert ops.deploy().returncode == 0
    b = ops.current()
    relink(ops.root, f"releases/{a}/.")
    assert ops("service", "restart", "local").returncode == 0 and ops.serving() == a
    (ops.root / "previous").unlink()
    (ops.root / "previous").symlink_to(f"releases/{b}")
    commit_change(ops.src, "engine/svc.py", '"""Release B. ', '"""Release C. ')
    res = ops.deploy("--keep", "2", "--force")  # (the old code asked for it)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (ops.root / "releases" / a).is_dir() and os.readlink(ops.root / "previous").endswith(a)
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == a and ops.serving() == a, res.stderr


def test_a_switch_from_no_release_never_makes_it_previous(ops: Ops) -> None:
    """probe37t T6 (low): `current -> releases` (a hand's link to no release), then
    `ops rollback --to R1`: previous was made `-> releases`, and every later plain rollback
    was refused. previous names only a release, or a copy of one, that a rollback could take."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy().returncode == 0
    relink(ops.root, "releases")
    res = ops("rollback", "local", "--to", str(r1), "--max-tokens", "3")
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, res.stderr
    previous = ops.root / "previous"
    assert not previous.is_symlink() or os.readlink(previous) != "releases"


def test_finalized_release_interrupted_before_its_switch_is_named(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", "DELAY = 1")
    holder: list[subprocess.Popen] = []

    def hold_guard() -> None:  # the deploy's guard then waits for deploy.guard: after finalize
        lock = str(ops.root / "deploy.guard")
        holder.append(subprocess.Popen(["flock", lock, "sleep", "20"]))

    proc = subprocess.Popen(
        ops.argv("deploy", "local", "--source", str(ops.src), "--max-tokens", "3"),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ops.env,
    )
    try:
        seen = ""
        assert proc.stderr is not None
        while "selftest ..." not in seen:
            seen += proc.stderr.readline()
        hold_guard()
        while "finalize:" not in seen:
            seen += proc.stderr.readline()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        for h in holder:
            h.kill()
            h.wait()
    assert proc.returncode == 130, seen + err
    rid = ops.record("deploy")["results"][0]["release"]
    assert f"release {rid} is in place, never switched to" in seen + err
    assert "half-sent" not in seen + err
    assert ops.current() == r1


def test_second_ctrl_c_during_restart_keeps_the_steps(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    slow = "def main() -> None:\n    time.sleep(4)\n"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow)

    proc = subprocess.Popen(
        ops.argv("deploy", "local", "--source", str(ops.src), "--max-tokens", "3"),
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ops.env,
    )
    seen = ""
    assert proc.stderr is not None
    while "restart ..." not in seen:
        seen += proc.stderr.readline()
    time.sleep(0.3)
    for _ in range(20):  # an impatient user: Ctrl-C again and again while ops puts things back
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
        if proc.poll() is not None:
            break
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    result = ops.record("deploy")["results"][0]
    assert steps(result).get("switch") == "ok", result
    assert ops.current() == r1 and ops.serving() == r1


@contextlib.contextmanager
def squatting(port: int, *argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """Another program on the service's port for the block (`argv`; default an HTTP server
    that answers 404s), once it takes connections."""
    argv = argv or (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_port_held_by_a_program_that_never_answers_holds_no_rollback(ops: Ops) -> None:
    """probe37be L1: a program that takes connections on the service's port and never answers
    held the rollback's checks 60 s, though its restart had already been refused for the port:
    the checks would only have asked that program. They are not run, and it is said."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    ops.stop()
    silent = (  # listens; accepts nothing, answers nothing
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {ops.port})); s.listen(64); time.sleep(120)"
    )
    with squatting(ops.port, sys.executable, "-c", silent):
        res = ops.deploy("--force", "--wait", "3")
    assert res.returncode == 2, res.stdout + res.stderr
    result = ops.record("deploy")["results"][0]
    (back,) = [s for s in result["steps"] if s["name"] == "rollback"]
    assert (
        back["seconds"] < 30 and "no checks run: another program holds its port" in back["detail"]
    ), back
    assert ops.current() == r1


def test_a_first_install_a_held_port_undid_is_said_kept_not_rejected(ops: Ops) -> None:
    """probe37bg L1: a first install undone because another program held the port was said
    "kept as rejected", though nothing rejected it (the cause was the host's): said as kept,
    not rejected; `ops releases` lists it unproven."""
    with squatting(ops.port):
        res = ops.deploy("--bootstrap", "--wait", "3")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and "the first install was undone" in text, text
    assert "it is kept, not rejected" in text and "kept as rejected" not in text, text
    code, doc = ops.json("releases", "local")
    assert [r["rejected"] for r in doc["releases"]] == [None], doc


def test_killed_rollback_still_marks_the_release_rejected(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    code, _, err, _ = ops.interrupt_at("rollback ...", "local", "--wait", "3", sig=signal.SIGKILL)
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while ops.guard_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ops.current() == r1 and ops.serving() == r1
    code, doc = ops.json("releases", "local")
    rejected = [r["id"] for r in doc["releases"] if r["rejected"]]
    assert len(rejected) == 1 and rejected[0] != r1, doc


def test_port_held_by_another_program_does_not_reject_the_release(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    ops.stop()
    with squatting(ops.port) as squatter:  # another program on its port (answers 404s)
        # said by status, and by the pre-flight's way on (probe37bh L1: "not running" alone,
        # and a start named that the port would refuse)
        code, st = ops.json("service", "status", "local")
        held = f"is in use by pid {squatter.pid}"
        assert held in st["detail"] and "a start would be refused" in st["detail"], st
        res = ops.deploy()
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 1 and "another program holds its port" in text, text
        res = ops.deploy("--force", "--wait", "3")
    # the host's trouble, not a verdict on the release: exit 2 (probe37aw L3: it was 1)
    assert res.returncode == 2, res.stdout + res.stderr
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "restart" and "already in use" in res.stderr
    # the rollback's restart met the same port: its cause said once (probe37ay L3: 2-3 times)
    assert result["message"].count("already in use") == 1, result["message"]
    assert "rollback failed: service failed (the same cause)" in result["message"], result
    assert ops.current() == r1
    code, doc = ops.json("releases", "local")
    assert not any(r["rejected"] for r in doc["releases"]), doc


def test_a_rollback_onto_a_port_another_program_holds_is_refused_before_any_switch(
    ops: Ops,
) -> None:
    """probe37bj M2 (medium): a rollback --to a proven release, from an unproven current the
    service never ran (so no way back), met another program on the stopped service's port:
    its restart failed, and the way on named another release or "deploy a fixed commit",
    which meet the same port. probe37bk L2: a plain rollback switched and came back for a
    start `ops service start` already refused. Both are refused before anything is switched,
    naming the port's holder and its way on."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy("--no-restart").returncode == 0  # installed, never started: unproven
    r3 = ops.current()
    ops.stop()
    with squatting(ops.port) as squatter:
        for to in (("--to", r1), ()):
            res = ops("rollback", "local", *to, "--max-tokens", "3")
            text = " ".join((res.stdout + res.stderr).split())
            assert res.returncode == 2 and "Traceback" not in text, text
            assert "another program holds its port" in text, text
            assert f"in use by pid {squatter.pid}" in text, text
            assert "stop that program, or give the service a free port" in text, text
            assert f"then ops rollback local{' --to ' + r1 if to else ''}" in text, text
            assert "deploy a fixed commit" not in text, text
            assert ops.current() == r3
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")  # the port free: it goes
    assert res.returncode == 0 and ops.current() == r1 and ops.serving() == r1, res.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MiB tmpfs as the remote root's disk (skipped where mounting is not allowed)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def ops_on(disk: Path, tmp_path: Path) -> Ops:
    """`Ops` whose remote root is on `disk` (the small tmpfs)."""
    ops = Ops(tmp_path / "o")
    ops.root = disk / "root"
    text = ops.inventory.read_text().replace(str(tmp_path / "o" / "root"), str(ops.root))
    ops.inventory.write_text(text)
    return ops


def fill(disk: Path, hold_s: float = 0.0) -> Path:
    """Fill the disk to its last byte (64 KiB writes, then 4 KiB, then single bytes); with
    `hold_s`, keep taking whatever is freed for that long (a log that keeps growing)."""
    filler = disk / "filler"

    def take(f: Any) -> None:
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass

    f = open(filler, "ab", buffering=0)  # noqa: SIM115 - closed by the thread below
    take(f)

    def keep() -> None:
        end = time.monotonic() + hold_s
        while time.monotonic() < end:
            take(f)
            time.sleep(0.001)
        f.close()

    threading.Thread(target=keep, daemon=True).start()
    return filler


def test_full_disk_at_send_is_a_failed_step(small_disk: Path, tmp_path: Path) -> None:
    """probe37f F8: a send that fails on a full disk was a bare `error:` (no step, a record
    without steps); it is the `send` step failing, nothing switched. Exit 2, a host ops could
    not act on, as documented; not 1, a verdict on the release (probe37ar L1). tar's first
    error is said and the rest counted (probe37bc L1: one line per file of the release)."""
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
        filler = fill(small_disk)
        os.truncate(filler, filler.stat().st_size - 8192)  # room for the lock's note only
        res = ops.deploy()
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and no_traceback(res.stderr), text
        assert "send: FAIL" in text and "No space left" in text, text
        assert f"(free space under {ops.root}" in text, text  # probe37i I4: the fix named
        # tar's first refusal, the rest counted: one line each per file was said (bc L1)
        assert text.count("Cannot write") == 2, text  # the step's line and the result's
        steps_seen = [s["name"] for s in ops.record("deploy")["results"][0]["steps"]]
        assert steps_seen[-1] == "send", steps_seen
        # one line, so the console (a step's first line) shows the cause and the fix (bd L2)
        sent = ops.record("deploy")["results"][0]["steps"][-1]["detail"]
        assert "\n" not in sent and "No space left" in sent and "(free space under" in sent
        filler.unlink()
        assert ops.current() == r1 and ops.serving() == r1
        assert [p.name for p in (ops.root / "releases").iterdir()] == [r1]
    finally:
        end_services(ops.root)


def test_full_disk_at_a_rollbacks_switch_is_the_hosts_trouble(
    small_disk: Path, tmp_path: Path
) -> None:
    """probe37av L1 (low): a switch that failed on a full disk (a rollback's, with room left
    for its lock's note only; a deploy's, the disk filled after its finalize) exited 1, a
    verdict on the release, where send and finalize failing the same way exit 2. It exits 2
    too, naming the fix; current and the service stay where they were."""
    ops = ops_on(small_disk, tmp_path)
    try:
        r1, r2 = ops.two_releases()
        filler = fill(small_disk)
        os.truncate(filler, filler.stat().st_size - 4096)  # room for the lock's note only
        res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and no_traceback(res.stderr), text
        assert "switch: FAIL" in text and "No space left" in text, text
        switch = ops.record("rollback")["results"][0]["steps"][-1]
        assert switch["detail"].count("(free space under") == 1, switch  # probe37ax L1: twice
        filler.unlink()
        assert ops.current() == r2 and ops.serving() == r2
    finally:
        end_services(ops.root)


def test_full_disk_at_a_deploys_switch_gives_the_release_room_back(
    small_disk: Path, tmp_path: Path
) -> None:
    """probe37ax L1, L2 (low): a deploy whose switch its full disk refused said the fix twice
    and left its finalized release in releases/, never switched to: one more per retry, on the
    disk that was full. The fix is said once, and the release is removed (its room); current
    and the service stay where they were."""
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
        proc = ops.popen("deploy", "local", "--source", str(ops.src), "--max-tokens", "3")
        assert proc.stderr is not None
        seen = ""
        while "finalize: ok" not in seen:  # held there while the disk fills
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        proc.send_signal(signal.SIGSTOP)
        filler = fill(small_disk)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
        text = " ".join((out + seen + err).split())
        assert proc.returncode == 2 and no_traceback(err), text
        assert "switch: FAIL" in text and "No space left" in text, text
        switch = ops.record("deploy")["results"][0]["steps"][-1]
        assert switch["name"] == "switch", switch
        assert switch["detail"].count(f"(free space under {ops.root}") == 1, switch
        assert "never switched to, was removed (its room)" in text, text
        assert [p.name for p in (ops.root / "releases").iterdir()] == [r1]
        filler.unlink()
        assert ops.current() == r1 and ops.serving() == r1
    finally:
        end_services(ops.root)


def test_disk_full_after_a_failed_restart_still_brings_the_old_release_back(
    small_disk: Path, tmp_path: Path
) -> None:
    """probe37h H1 (high): the new release's restart failed, then the disk filled; the
    rollback's restart of the old release needed one new block for its pidfile and was refused,
    leaving the host down. A stopped or dead service's pidfile is kept as room (`.room`) that
    the next start takes by a rename: the old release serves again, the disk still full."""
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
        proc = ops.popen("deploy", "local", "--source", str(ops.src), "--max-tokens", "3")
        assert proc.stderr is not None
        seen = ""
        while "restart: FAIL" not in seen:
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        filler, held_until = fill(small_disk, hold_s=10), time.monotonic() + 10  # before the
        # rollback; every block freed meanwhile is taken too
        out, err = proc.communicate(timeout=120)
        said = " ".join((out + seen + err).split())
        assert proc.returncode == 1 and no_traceback(err), said
        result = ops.record("deploy")["results"][0]
        assert result["outcome"] == "rolled-back", said
        assert ops.current() == r1 and ops.serving() == r1  # the disk still full
        # its rejection could not be written either: said (probe37i I1), not left unsaid
        r2 = result["release"]
        assert not (ops.root / "releases" / r2 / "rejected.json").exists()
        assert f"{r2} could not be marked rejected" in result["message"], result["message"]
        time.sleep(max(0.0, held_until - time.monotonic()))  # the filler lets go
        filler.unlink()
    finally:
        end_services(ops.root)


def test_disk_full_at_a_failed_post_flight_says_the_mark_it_could_not_write(
    small_disk: Path, tmp_path: Path
) -> None:
    """probe37be M1 (medium): the disk filled during a post-flight that failed: the release
    could not be marked rejected, and the try after the rollback read the current the rollback
    itself had moved as "moved while its post-flight ran (the host's guard?)": the mark was
    given up, the disk never named, and `ops rollback --to` stayed open to it unsaid."""
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", 'default=""', 'default="bad"')  # other tokens
        proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
        filler, held_until = fill(small_disk, hold_s=10), time.monotonic() + 10
        out, err = proc.communicate(timeout=120)
        said = " ".join((out + seen + err).split())
        assert proc.returncode == 1 and no_traceback(err), said
        result = ops.record("deploy")["results"][0]
        r2 = result["release"]
        assert ops.current() == r1 and ops.serving() == r1, said
        assert f"{r2} could not be marked rejected" in result["message"], result["message"]
        assert "while its post-flight ran" not in result["message"], result["message"]
        time.sleep(max(0.0, held_until - time.monotonic()))
        filler.unlink()
    finally:
        end_services(ops.root)


def test_full_disk_at_finalize_is_one_line(small_disk: Path, tmp_path: Path) -> None:
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
        commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", "DELAY = 1")
        filled: list[Path] = []
        code, _, err, _ = ops.interrupt_at(
            "selftest ...", "local", sig=0, first=lambda: filled.append(fill(small_disk))
        )
        assert code == 2 and no_traceback(err), err  # the host's disk, not the release
        assert "finalize failed" in err and "No space left" in err
        assert f"(free space under {ops.root}" in " ".join(err.split()), err
        assert ops.current() == r1
        left = [p.name for p in (ops.root / "releases").iterdir()]
        assert left == [r1], left  # the staging directory went with the failure
        assert not list(ops.root.glob("deploy.pending*"))
        filled[0].unlink()
        assert ops.serving() == r1
        healthy(ops)
    finally:
        end_services(ops.root)


def test_full_disk_during_the_rollback_leaves_no_stray_file(
    small_disk: Path, tmp_path: Path
) -> None:
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
        filled: list[Path] = []
        code, _, err, _ = ops.interrupt_at(
            "restart ...",
            "local",
            "--wait",
            "3",
            sig=0,
            first=lambda: filled.append(fill(small_disk)),
        )
        assert code == 1 and no_traceback(err), err
        deadline = time.monotonic() + 30
        while ops.guard_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not list(ops.root.glob("deploy.pending.tmp*"))
        assert ops.current() == r1  # the deploy, or its guard, put it back
        filled[0].unlink()
        assert ops("service", "restart", "local").returncode == 0
        assert ops.serving() == r1
        healthy(ops)
    finally:
        end_services(ops.root)


# A Ctrl-C that lands the instant the host's command has been started (after the fork, before
# `_exec` is inside the try that stops it): the driver sends SIGINT to ops itself right there.
INTERRUPT_AT_START = """
MARK = sys.argv.pop(1)
class Popen(real):
    def __init__(self, args, *a, **k):
        super().__init__(args, *a, **k)
        if MARK in " ".join(map(str, args)) and not os.environ.get("FIRED"):
            os.environ["FIRED"] = "1"
            os.kill(os.getpid(), signal.SIGINT)
"""


def test_ctrl_c_once_the_commit_landed_says_proven(ops: Ops, tmp_path: Path) -> None:
    """probe37l L3 (low): a Ctrl-C landing after the host had made the switch final, before
    its answer was read, said the release was 'switched, not proven' (proven.json there, no
    deploy.pending). The host is asked: it was proven and switched to."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    # the commit runs to its end on the host; the interrupt comes before ops reads its answer
    driver = INTERRUPT_AT_START.replace(
        "        super().__init__(args, *a, **k)\n",
        "        super().__init__(args, *a, **k)\n"
        '        if MARK in " ".join(map(str, args)):\n'
        "            self.wait()\n",
        1,
    )
    args = ["deploy", "local", "--source", str(ops.src), "--max-tokens", "3"]
    res = ops.driven(driver, [f"' commit {ops.root}"], *args, timeout=120)
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 130 and no_traceback(res.stderr), said
    r2 = ops.current()
    assert (ops.root / "releases" / r2 / "proven.json").exists()
    assert f"{r2} was proven and switched to before the interrupt" in said, said
    assert "not proven" not in said, said
    assert ops.serving() == r2


@pytest.mark.parametrize("verb", ["deploy", "rollback"])
def test_ctrl_c_as_the_switch_starts_leaves_no_unproven_current(
    ops: Ops, tmp_path: Path, verb: str
) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    if verb == "rollback":
        commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
        assert ops.deploy().returncode == 0
    before = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n\n")
    args = ["deploy", "local", "--source", str(ops.src), "--max-tokens", "3"]
    if verb == "rollback":
        args = ["rollback", "local", "--max-tokens", "3"]
    for _ in range(3):  # the race it closes was lost about 3 times in 5
        res = ops.driven(INTERRUPT_AT_START, [f"' switch {ops.root}"], *args, timeout=120)
        assert res.returncode == 130, res.stdout + res.stderr
        time.sleep(1.0)  # a command that escaped would finish its switch meanwhile
        assert not (ops.root / "deploy.pending").exists(), res.stderr
        assert ops.current() == before, res.stderr
        assert ops.serving() == before
    healthy(ops)


# The remote root made read-only (a bind mount) the instant the host command whose arguments
# carry MARK is started, inside the real `ops` process (the driver wraps subprocess.Popen).
READ_ONLY_AT_START = """
MARK, ROOT = sys.argv.pop(1), sys.argv.pop(1)
class Popen(real):
    def __init__(self, args, *a, **k):
        if MARK in " ".join(map(str, args)) and not getattr(Popen, "done", False):
            Popen.done = True
            subprocess.run(["mount", "--bind", ROOT, ROOT], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", ROOT], check=True)
        super().__init__(args, *a, **k)
"""


def deploy_read_only_at(
    ops: Ops, tmp_path: Path, mark: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """A deploy during which the remote root turns read-only as the host command whose
    arguments hold `mark` starts (skipped where bind mounts are not allowed). The caller
    unmounts ops.root."""
    if subprocess.run(["mount", "--bind", str(tmp_path), str(tmp_path)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    subprocess.run(["umount", "-l", str(tmp_path)], check=True)
    args = ["deploy", "local", "--source", str(ops.src), "--max-tokens", "3", *extra]
    return ops.driven(READ_ONLY_AT_START, [mark, str(ops.root)], *args)


@pytest.mark.parametrize("step", ["commit", "prune"])
def test_a_root_made_read_only_after_the_post_flight_is_a_result_not_an_error(
    ops: Ops, tmp_path: Path, step: str
) -> None:
    """probe37k K1: the remote root read-only (or the link lost) once the release had passed
    its post-flight: the commit or the prune raised, exit 2 with one bare line, a record with
    no steps and no word of where the host was. A prune that cannot run is skipped (the release
    stands, exit 0); a commit that cannot is a failed step whose result says the release is
    current and serving, and what a later deploy does; the next deploy, on a mended host, ends
    proven on it."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release one. ')
    assert ops.deploy().returncode == 0  # three releases with this one: --keep 2 prunes one
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    try:
        res = deploy_read_only_at(ops, tmp_path, f"' {step} {ops.root}", "--keep", "2")
        said = " ".join((res.stdout + res.stderr).split())
        assert no_traceback(res.stderr) and "error:" not in said, said
        result = ops.record("deploy")["results"][0]
        r2 = result["release"]
        assert r2 != r1 and ops.current() == r2 and ops.serving() == r2, said
        if step == "prune":
            assert res.returncode == 0 and result["outcome"] == "deployed", said
            assert steps(result)["prune"] == "skip" and "Read-only file system" in said, said
            assert "the next deploy prunes" in said, said
            return
        assert res.returncode == 1 and result["outcome"] == "failed", said
        assert result["failed_step"] == "commit" and result["after"] == r2, result
        assert f"{r2} passed its post-flight, but it could not be made final" in said, said
        assert f"(make {ops.root} writable again" in said, said
        assert f"{r2} is current, but deploy.pending stays" in said, said
    finally:
        subprocess.run(["umount", "-l", str(ops.root)], capture_output=True)
    if step == "commit":  # probe37q Q6 / probe37t T7: status said "a deploy died before ..."
        warned = " ".join(ops.json("service", "status", "local")[1]["warnings"])
        assert (
            "could not write its commit" in warned and "died before" not in warned.split("(", 1)[0]
        ), warned
    res = ops.deploy()  # the same commit, a release of its own
    assert res.returncode == 0, res.stdout + res.stderr
    r3 = ops.current()
    assert r3.split("-")[1] == r2.split("-")[1] and ops.serving() == r3
    assert (ops.root / "releases" / r3 / "proven.json").exists()


def test_a_root_made_read_only_at_the_rollback_names_the_fix(ops: Ops, tmp_path: Path) -> None:
    """probe37k K3 (low): the root read-only as a failed deploy's rollback began: nothing could
    switch back (the failed release serves on), and the line said only 'could not roll back:
    current is X'. It says why and the command that puts the old release back once mended;
    that command does."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", 'default=""', 'default="other"')  # answers differ
    try:  # the deploy's own revert ("settle"), not its guard's
        res = deploy_read_only_at(ops, tmp_path, f"' revert {ops.root} settle")
        said = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 1 and no_traceback(res.stderr), said
        r2 = ops.record("deploy")["results"][0]["release"]
        assert "could not roll back (" in said and "Read-only file system" in said, said
        assert f"ops rollback local --to {r1} puts it back" in said, said
        assert ops.current() == r2
    finally:
        subprocess.run(["umount", "-l", str(ops.root)], capture_output=True)
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() == r1 and ops.serving() == r1


def service_state(ops: Ops) -> tuple[dict, str | None]:
    """`ops service status` as JSON, and the release the service's process runs from."""
    _, st = ops.json("service", "status", "local")
    try:
        cwd = Path(os.readlink(f"/proc/{st['pid']}/cwd")).name
    except (KeyError, OSError):
        cwd = None
    return st, cwd


def port_owner(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_disk_full_at_restart_never_leaves_a_service_ops_cannot_see(
    small_disk: Path, tmp_path: Path
) -> None:
    """The disk fills as the restart begins (a log growing, say). Before: the new release's
    service started, its pidfile could not be written, and it served unseen and unstoppable
    while `current` said the old one. Now the restart stops nothing unless the new start has
    its pidfile's room on disk, and a start that cannot record its process ends it."""
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
        filled: list[Path] = []
        code, out, err, _ = ops.interrupt_at(
            "switch: ok", "local", sig=0, first=lambda: filled.append(fill(small_disk, 4))
        )
        assert code in (0, 1) and no_traceback(err), err
        deadline = time.monotonic() + 30
        while ops.guard_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        st, runs_from = service_state(ops)
        assert st.get("state") == "active", st  # seen by ops, on the disk still full
        assert runs_from == ops.current(), (runs_from, ops.current(), err)
        if code == 1:
            assert runs_from == r1 and "No space left" in err, err
        filled[0].unlink()
        assert not list((ops.root / "run").glob("*.tmp*"))
        healthy(ops)
    finally:
        end_services(ops.root)


@pytest.fixture
def ro_run(ops: Ops):
    """After a bootstrap deploy: the root's run/ made read-only by a bind mount."""
    assert ops.deploy("--bootstrap").returncode == 0
    run = ops.root / "run"
    res = subprocess.run(["mount", "--bind", str(run), str(run)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {res.stderr.decode().strip()}")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(run)], check=True)
    yield ops
    subprocess.run(["umount", "-l", str(run)], capture_output=True)


def third_release_keeping_two(ops: Ops) -> str:
    """A third release deployed with --keep 2 (the first is then pruned): what it said."""
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy("--keep", "2")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, text
    return text


def test_prune_never_descends_into_a_mount_in_a_release(ops: Ops) -> None:
    """probe37bg H2 (high): a directory bind-mounted into an old release (a models directory,
    say): the prune emptied it, then said "not done" (the mount point itself was busy). A
    release holding a mount point is kept, said, and nothing of the mount is removed."""
    r1, r2 = ops.two_releases()
    outside = ops.tmp / "models"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"keep")
    inside = ops.root / "releases" / r1 / "models"
    inside.mkdir()
    res = subprocess.run(["mount", "--bind", str(outside), str(inside)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {res.stderr.decode().strip()}")
    try:
        text = third_release_keeping_two(ops)
        assert f"{r1} holds a mount point ({inside}): not removed" in text, text
        assert (outside / "weights.bin").read_bytes() == b"keep"
        assert (ops.root / "releases" / r1).is_dir()
    finally:
        subprocess.run(["umount", "-l", str(inside)], capture_output=True)


def test_a_release_that_cannot_be_removed_blocks_no_prune(ops: Ops) -> None:
    """probe37bh M1 (medium): one file of an old release made immutable (chattr +i): every
    later prune failed on it ("the next deploy prunes", never true), and the release was left
    half removed, listed as damaged. It is taken out of the releases whole, what cannot go is
    said with its path, and the rest is pruned; once it can go, the next prune removes it."""
    r1, r2 = ops.two_releases()
    stuck = ops.root / "releases" / r1 / "engine" / "svc.py"
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    aside = ops.root / "releases" / f".pruning-{r1}"
    try:
        text = third_release_keeping_two(ops)
        assert f"{r1} was taken out, but not all of it could be removed" in text, text
        assert f"what is left is at {aside}" in text, text
        code, doc = ops.json("releases", "local")
        assert r1 not in [r["id"] for r in doc["releases"]], doc
        assert not any(r.get("damaged") for r in doc["releases"]), doc
    finally:
        subprocess.run(["chattr", "-i", str(aside / "engine" / "svc.py")], capture_output=True)
        subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release four. ')
    res = ops.deploy("--keep", "2")
    assert res.returncode == 0 and not aside.exists(), res.stdout + res.stderr


def test_read_only_run_dir_keeps_the_service_running(ro_run: Ops) -> None:
    ops = ro_run
    r1 = ops.current()
    res = ops("service", "restart", "local")
    assert res.returncode == 1 and no_traceback(res.stderr), res.stdout + res.stderr
    assert "Read-only file system" in res.stdout + res.stderr
    assert "not stopped" in res.stdout + res.stderr
    assert service_state(ops)[1] == r1
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy()
    assert res.returncode == 1 and no_traceback(res.stderr), res.stderr
    assert ops.current() == r1
    st, runs_from = service_state(ops)
    assert st.get("state") == "active" and runs_from == r1, st
    rejected = list((ops.root / "releases").glob("*/rejected.json"))
    assert rejected == [], "a host's trouble is not the release's fault"
    healthy(ops)


def test_current_as_a_file_restart_stops_nothing(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    (ops.root / "current").unlink()
    (ops.root / "current").write_text("not a release\n")
    res = ops("service", "restart", "local")
    assert res.returncode == 1 and no_traceback(res.stdout + res.stderr), res.stderr
    assert "is not a directory" in res.stdout and "not stopped" in res.stdout, res.stdout
    st, runs_from = service_state(ops)
    assert st.get("state") == "active" and runs_from == r1, st
    relink(ops.root, f"releases/{r1}")
    dangling = ops.root / "releases" / "gone"
    relink(ops.root, str(dangling))
    res = ops("service", "restart", "local")
    assert res.returncode == 1 and "does not exist" in res.stdout, res.stdout + res.stderr
    assert service_state(ops)[0].get("state") == "active"


def test_a_fifo_as_pidfile_never_hangs(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    pidfile = next((ops.root / "run").glob("*.pid"))
    text = pidfile.read_text()
    pidfile.unlink()
    os.mkfifo(pidfile)
    try:
        t0 = time.monotonic()
        code, st = ops.json("service", "status", "local")
        assert time.monotonic() - t0 < 20
        # serving all the same: active (unmanaged), the pidfile said (probe37h M2)
        assert code == 0 and st["state"] == "active", st
        assert "stale pidfile: not a regular file" in st.get("detail", ""), st
    finally:
        pidfile.unlink()
        pidfile.write_text(text)


def test_ctrl_c_during_a_restart_says_where_the_service_is(ops: Ops) -> None:
    slow = "def main() -> None:\n    time.sleep(3)\n"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow)
    assert ops.deploy("--bootstrap", "--wait", "30").returncode == 0
    proc = subprocess.Popen(
        ops.argv("service", "restart", "local"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ops.env,
        cwd=REPO,
    )
    deadline = time.monotonic() + 30
    while not port_owner(ops.port) and time.monotonic() < deadline:
        time.sleep(0.05)  # the old service serves ...
    while port_owner(ops.port) and time.monotonic() < deadline:
        time.sleep(0.05)  # ... until the restart's stop; then the new one sleeps 3 s
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    said = " ".join(err.split())
    now = re.search(r"the service is now (\w+)", said)
    assert now and now[1] in ("active", "activating", "inactive", "failed"), said
    if now[1] == "activating":  # starting already: no start named (probe37aj L3)
        assert "ops service status local tells once it is up" in said, said
        assert "ops service start" not in said, said
    elif now[1] != "active":
        assert "ops service start local" in said, said
    rec = ops.record("service-restart")
    assert "the service is now" in rec["error"]["message"], rec


def test_a_stray_previous_does_not_block_rollback_forever(ops: Ops) -> None:
    """`previous` made a real directory by hand: a failed deploy puts it back as it was; a
    good one keeps it aside and `previous` names the release it replaced, so a plain
    `ops rollback` works again (before: "no previous release ... switch to it by hand")."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    stray = ops.root / "previous"
    stray.mkdir()
    (stray / "note.txt").write_text("made by hand\n")
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    assert ops.deploy().returncode == 1
    assert stray.is_dir() and not stray.is_symlink() and ops.current() == r1
    commit_change(ops.src, "engine/svc.py", NOISY_CRASH, "def main() -> None:\n")
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    assert r2 != r1 and os.readlink(ops.root / "previous").endswith(r1)
    kept = list(ops.root.glob("previous.before-*"))
    assert len(kept) == 1 and (kept[0] / "note.txt").read_text() == "made by hand\n"
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() == r1 and ops.serving() == r1


def test_a_hand_made_current_kept_as_previous_is_named_as_what_it_is(ops: Ops) -> None:
    """probe37i I2 (low): a rollback away from a hand-made current keeps it as `previous`
    (the operator's, for --to or by hand); the next plain rollback's refusal called that link
    "a symlink ops did not make", though ops made it. It says what it is, and the fix."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    shutil.copytree(ops.root / "releases" / r2, ops.root / "releases" / "hotfix", symlinks=True)
    relink(ops.root, "releases/hotfix")
    # the service runs the hand-made current (one it does not run is made current first)
    assert ops("service", "restart", "local", "--force").returncode == 0
    assert ops.serving() == "hotfix"
    assert ops("rollback", "local", "--max-tokens", "3").returncode == 0
    assert ops.current() == r1 and os.readlink(ops.root / "previous") == "releases/hotfix"
    res = ops("rollback", "local", "--max-tokens", "3")
    line = one_error_line(res)
    said = " ".join(line.split())
    assert "(previous is releases/hotfix, not a release ops installed: a link made by" in said
    # the rollback above made that link (probe37an L4: the refusal only blamed a person)
    assert "a deploy or a rollback switched away from" in said, said
    assert "did not make" not in line and f"ops rollback local --to {r2}" in res.stderr, line
    assert ops.current() == r1 and ops.serving() == r1


def test_dead_guard_then_rollback_undoes_exactly_the_unproven_release(ops: Ops) -> None:
    """Before: the recover step put `current` back without a restart (the service kept
    running the unproven release), then the rollback went one release further back."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n\n")
    kill_guard_and_ops(ops, "postflight ...")
    r3 = ops.current()
    assert r3 != r2 and (ops.root / "deploy.pending").exists() and ops.serving() == r3
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() == r2 and ops.serving() == r2  # one back, and running it
    assert f"was {r3}, never proven" in " ".join(res.stdout.split()), res.stdout


def test_dead_guard_then_failing_deploy_leaves_service_on_current(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    kill_guard_and_ops(ops, "postflight ...")
    failing = 'print(json.dumps({"ok": False, "ops": []}))\nraise SystemExit(1)'
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", failing)
    res = ops.deploy()
    assert res.returncode == 1, res.stdout + res.stderr
    assert ops.current() == r1 and ops.serving() == r1  # not the unproven one any more


def test_dead_guard_then_a_deploy_of_what_was_before_says_the_recover_moved_the_host(
    ops: Ops,
) -> None:
    """probe37ap L1 (low): after a dead deploy and guard, a deploy of the commit from before
    found it current once its recover step had put the switch back and restarted the service,
    and said "(unchanged)" and "nothing to do". It says the recover step moved the host."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    kill_guard_and_ops(ops, "postflight ...")
    r2 = ops.current()
    assert r2 != r1 and ops.serving() == r2
    code, doc = ops.json("deploy", "local", "--source", str(ops.src), "--ref", "HEAD~1")
    res = doc["results"][0]
    assert code == 0 and res["outcome"] == "already-current", doc
    assert res["before"] == r2 and res["after"] == r1, res
    assert f"put back a switch no deploy settled ({r2} -> {r1})" in res["message"], res
    assert ops.current() == r1 and ops.serving() == r1


def test_rollback_to_an_empty_or_huge_id_is_one_short_line(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    res = ops("rollback", "local", "--to", "")
    assert res.returncode == 2 and "--to needs a release id" in res.stderr, res.stderr
    res = ops("rollback", "local", "--to", "A" * 100000)
    assert res.returncode == 2 and len(res.stderr) < 2000, len(res.stderr)
    assert ops.current() == r1


def test_deploying_an_older_commit_says_it_is_a_downgrade(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    assert ops.deploy().returncode == 0
    res = ops.deploy("--ref", "HEAD~1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "a downgrade: git" in " ".join(res.stderr.split()), res.stderr
    res = ops.deploy()  # forward again: no notice
    assert res.returncode == 0 and "downgrade" not in res.stderr, res.stderr


def test_ctrl_c_in_the_recover_step_never_loses_the_restart(ops: Ops) -> None:
    """After a dead deploy and a dead guard, a rollback Ctrl-C'd in its recover step: the
    switch put back stays recorded until its restart is done, so the host either runs what
    current says, or the next command restarts it (before: current named one release, the
    never-proven one served, and nothing on the host would fix it)."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n\n")
    kill_guard_and_ops(ops, "postflight ...")
    assert ops.serving() != r2
    proc = subprocess.Popen(
        ops.argv("rollback", "local", "--max-tokens", "3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ops.env,
        cwd=REPO,
    )
    assert proc.stderr is not None
    seen = ""
    while "recover ..." not in seen:
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    if ops.serving() == ops.current():  # the held Ctrl-C let the restart finish
        assert ops.current() == r2 and not (ops.root / "deploy.pending").exists()
        return
    assert (ops.root / "deploy.pending").exists()  # recorded: the next command restarts it
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() == r2 and ops.serving() == r2


@pytest.mark.parametrize("junk", [b"A=1\x00B=2\n", b"A=\xff\xfe\n", "fifo"])
def test_a_damaged_service_env_stops_nothing(ops: Ops, junk: bytes | str) -> None:
    """current/service.env with a NUL byte, bytes that are not UTF-8, or a FIFO: the restart
    says why in one line and the running service is left running (before: a host-side
    traceback after the stop, the service down; a FIFO hung the restart for minutes)."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    env = ops.root / "releases" / r1 / "service.env"
    env.unlink()
    if junk == "fifo":
        os.mkfifo(env)
    else:
        env.write_bytes(junk)
    t0 = time.monotonic()
    res = ops("service", "restart", "local")
    assert time.monotonic() - t0 < 30
    out = res.stdout + res.stderr
    assert res.returncode == 1 and no_traceback(out) and "not stopped" in out, out
    assert ops.serving() == r1


def test_a_rollback_whose_restart_cannot_happen_says_what_serves(
    small_disk: Path, tmp_path: Path
) -> None:
    """probe37b B11: the disk fills as the deploy's own rollback starts; its restart cannot
    reserve the pidfile's room, so it stops nothing and the failed release keeps serving. The
    result says so, never "rolled back to <old>" while the failed release answers."""
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1 = ops.current()
        salt = ("engine/svc.py", 'default=""', 'default="other"')
        commit_change(ops.src, *salt)  # its answers differ: the post-flight fails
        filled: list[Path] = []
        code, out, err, _ = ops.interrupt_at(
            "rollback ...", "local", sig=0, first=lambda: filled.append(fill(small_disk, 10))
        )
        said = " ".join((out + err).split())
        runs = service_state(ops)[1]  # at once, the disk still full: the guard cannot restart
        assert code == 1 and no_traceback(err), err
        if runs != r1:
            assert f"still runs {runs}" in said, said
        else:
            assert f"rolled back to {r1}" in said, said
        deadline = time.monotonic() + 30
        while ops.guard_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(10)  # the filler's hold ends (it keeps taking freed space until then)
        filled[0].unlink()
        res = ops("service", "restart", "local")
        assert res.returncode == 0, res.stdout + res.stderr
        assert ops.serving() == ops.current() == r1
    finally:
        end_services(ops.root)


def test_a_stopped_deploy_holding_the_lock_is_named_with_its_fix(ops: Ops) -> None:
    """probe37o O1: a deploy stopped (SIGSTOP, Ctrl-Z) at its post-flight holds the host lock;
    every other command was refused naming only its pid. The refusal now says it is stopped and
    names `kill -CONT`, which lets it finish."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        res = ops("rollback", "local", "--max-tokens", "3")
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and f"pid {proc.pid} is stopped" in text, text
        assert f"kill -CONT {proc.pid} lets it finish" in text, text
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, seen + err


def test_a_deploy_stopped_by_ctrl_z_is_named_with_the_fix_that_resumes_it(ops: Ops) -> None:
    """probe37bf L2: Ctrl-Z stops the deploy's whole process group; caught starting a child at
    its post-flight, ops reads D (the child is the stopped one), and the refusal did not say it
    was stopped. It says so, and the `kill -CONT` it names resumes the deploy to its end."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
    os.killpg(proc.pid, signal.SIGSTOP)  # what a terminal's Ctrl-Z does
    try:
        time.sleep(0.5)
        res = ops("rollback", "local", "--max-tokens", "3")
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and f"pid {proc.pid} is stopped" in text, text
        fix = text.split("kill -CONT ", 1)[1].split(" lets it finish")[0]
        if fix.startswith("-- -"):  # the group, as the shell's fg continues it
            assert fix == f"-- -{proc.pid} (its process group)", fix
            os.killpg(proc.pid, signal.SIGCONT)
        else:
            assert fix == str(proc.pid), fix
            os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)  # the way named lets it finish
        assert proc.returncode == 0, seen + err
    finally:
        with contextlib.suppress(ProcessLookupError):  # (ended: nothing left to continue)
            os.killpg(proc.pid, signal.SIGCONT)


def test_a_lock_file_removed_under_its_holder_shuts_the_next_deploy_out(ops: Ops) -> None:
    """probe37bg M1: `lock` removed by hand while a deploy held it: a second deploy took a
    flock on a new file, ran beside the first and swept its staging; the first then failed
    with "no staging directory". The second is refused, naming the holder of the removed
    file; the first runs to its end."""
    assert ops.deploy("--bootstrap").returncode == 0
    ops.slow_selftest(6)
    proc, seen = ops.popen_at("selftest ...", *ops.deploy_args())
    (ops.root / "lock").unlink()
    res = ops("rollback", "local", "--max-tokens", "3")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and "through a lock file removed since" in text, text
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, seen + err
    assert ops.deploy().returncode == 0  # its holder gone: the lock is free again


def signal_lock_holders(ops: Ops, sig: signal.Signals) -> list[int]:
    """Send `sig` to the process group of each host-side lock holder (there is one)."""
    holders = lock_holder_shells(ops.root)
    assert holders, "no lock holder seen"
    for pid in holders:
        os.killpg(pid, sig)
    return holders


def test_a_deploy_whose_host_lock_is_lost_switches_nothing(ops: Ops) -> None:
    """probe37q Q11: the host process holding a deploy's host lock killed (the OOM killer): the
    flock went with it, a second deploy could start beside the first, and the first went on
    as if it held the lock. It now stops before its switch, saying so; current is untouched
    by it. probe37s S4: a rollback ran meanwhile, and the deploy said "current is still R2"
    of a host on R1: where current is now is asked of the host."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy().returncode == 0
    assert ops.current() != r1
    ops.slow_selftest(8)
    proc, seen = ops.popen_at("selftest ...", *ops.deploy_args())
    signal_lock_holders(ops, signal.SIGKILL)
    res = ops("rollback", "local", "--max-tokens", "3")  # beside the deploy, in its self-test
    assert res.returncode == 0 and ops.current() == r1, res.stdout + res.stderr
    out, err = proc.communicate(timeout=120)
    text = " ".join((seen + out + err).split())
    assert proc.returncode == 1 and "the host lock was lost" in text, text
    # (what the host said when asked: r1 once the rollback is done, r2 if it was still going)
    assert re.search(r"current is \S+ \(asked of the host\)", text), text
    assert "current is still" not in text, text
    assert ops.current() == r1 and ops.serving() == r1


def test_a_stopped_lock_holder_whose_ops_is_gone_is_named(ops: Ops) -> None:
    """probe37r R5: the host process holding a deploy's lock stopped (SIGSTOP), then its ops
    killed: every later command was refused naming only the dead ops's pid, and the stopped
    holder never let go. The refusal names the stopped holder and `kill -CONT`."""
    assert ops.deploy("--bootstrap").returncode == 0
    ops.slow_selftest(5)
    proc, _ = ops.popen_at("selftest ...", *ops.deploy_args())
    holders = signal_lock_holders(ops, signal.SIGSTOP)
    try:
        proc.kill()
        proc.communicate(timeout=30)
        res = ops("rollback", "local", "--max-tokens", "3")
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and "is stopped (SIGSTOP)" in text, text
        named = text.split("kill -CONT ", 1)[-1].split()
        assert "kill -CONT" in text and str(holders[0]) in named, text
    finally:
        for pid in holders:
            os.killpg(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30  # let go on, it ends (its ops is gone)
    while lock_holder_shells(ops.root):
        assert time.monotonic() < deadline, "the holder never ended"
        time.sleep(0.2)
    assert ops("service", "restart", "local").returncode == 0  # the lock is free again


def test_a_lock_lost_after_the_switch_prunes_nothing_and_says_so(ops: Ops) -> None:
    """probe37z L1 (low): the host lock's holder killed after the switch: the deploy finished,
    its prune included, without the lock and without a word of it. The commit stands (the
    post-flight passed); the prune, which deletes, is skipped and says why."""
    assert ops.deploy("--bootstrap").returncode == 0
    for n in ("two", "three"):
        commit_change(ops.src, "engine/svc.py", '"""', f'"""Release {n}. ')
        assert ops.deploy().returncode == 0
    before = sorted(p.name for p in (ops.root / "releases").iterdir())
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release four. ')
    proc, seen = ops.popen_at("restart ...", *ops.deploy_args(), "--keep", "2")
    signal_lock_holders(ops, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    text = " ".join((seen + out + err).split())
    assert proc.returncode == 0, text
    prune = steps(ops.record("deploy")["results"][0])["prune"]
    assert prune == "skip" and "prune: skip" in text and "the host lock was lost" in text, text
    after = sorted(p.name for p in (ops.root / "releases").iterdir())
    assert set(before) <= set(after), (before, after)  # nothing removed


def test_a_deploy_whose_current_was_moved_during_its_post_flight_says_so(ops: Ops) -> None:
    """probe37aw L1 (low): current moved by hand (to r1) while a deploy's post-flight ran, which
    passed: the deploy said "r3 is current and healthy", its record after = r3, while current
    named r1 (a restart would run r1). It says where current is, and the rollback that makes
    its release current again."""
    r1, r2 = ops.two_releases()
    commit_change(  # each completion takes a while: the post-flight lasts seconds
        ops.src,
        "engine/svc.py",
        "    def do_POST(self) -> None:  # noqa: N802\n",
        "    def do_POST(self) -> None:  # noqa: N802\n        time.sleep(0.1)\n",
    )
    proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
    r3 = ops.current()
    relink(ops.root, f"releases/{r1}")
    out, err = proc.communicate(timeout=180)
    said = " ".join((seen + out + err).split())
    assert proc.returncode == 0 and f"{r3} is current and healthy" not in said, said
    assert f"but current was moved to {r1} meanwhile" in said, said
    assert f"ops rollback local --to {r3} makes {r3} current" in said, said
    assert ops.record("deploy")["results"][0]["after"] == r1
    assert ops.current() == r1 and ops.serving() == r3


def test_a_post_flight_whose_current_was_moved_under_it_rejects_nothing(ops: Ops) -> None:
    """probe37am M1 (medium, a race): the SSH link lost during a post-flight; the host's guard
    put the old release back and restarted its service while the post-flight's identity check
    still ran, which then got "connection refused" and marked the good release rejected
    ("deploy a fixed commit"), blocking `rollback --to` it. A post-flight that fails while
    `current` no longer names its release did not judge that release. Here the guard's move
    is made by hand: current put back on r2 and the new release's process killed mid-check."""
    r1, r2 = ops.two_releases()
    commit_change(  # each completion takes a while: the post-flight lasts seconds
        ops.src,
        "engine/svc.py",
        "    def do_POST(self) -> None:  # noqa: N802\n",
        "    def do_POST(self) -> None:  # noqa: N802\n        time.sleep(0.3)\n",
    )
    proc, seen = ops.popen_at("postflight ...", *ops.deploy_args())
    r3 = ops.current()
    relink(ops.root, f"releases/{r2}")
    os.kill(ops.json("service", "status", "local")[1]["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    said = " ".join((seen + out + err).split())
    assert proc.returncode == 1, said
    assert r3 != r2 and not (ops.root / "releases" / r3 / "rejected.json").exists(), said
    assert f"{r3} was not marked rejected: current was moved to {r2}" in said, said
    assert ops.current() == r2 and ops.serving() == r2, said
