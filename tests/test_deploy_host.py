"""The host side of releases (ops/hostside/releases.py) as it runs on a host: switch and revert keep
`current` / `previous` right, and no input reaches outside the remote root."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.deploy.deploy import DEPLOY_HOST_SOURCE

IDS = [f"20260101T00000{i}Z-aaaaaaa{i}" for i in range(1, 5)]


def host(*args: str, stdin: str = "", guard: bool = True) -> tuple[int, dict]:
    """The host side run as ops runs it; a pending switch with a live revert guard beside it
    (a process holding deploy.guard, as the deploy's guard does), unless `guard` is False."""
    holder = None
    if guard and args[0] == "switch" and "pending" in args:
        lock = Path(args[1]) / "deploy.guard"
        hold = (
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"
        )  # one process (a killed flock(1) would leave its sleeping child holding the lock)
        holder = subprocess.Popen(
            [sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    try:
        res = subprocess.run(
            [sys.executable, "-c", DEPLOY_HOST_SOURCE, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        if holder is not None:
            holder.kill()
            holder.communicate()
    return res.returncode, json.loads(res.stdout)


def links(root: Path) -> tuple[str | None, str | None]:
    def one(name: str) -> str | None:
        p = root / name
        return p.readlink().name if p.is_symlink() else None

    return one("current"), one("previous")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for rid in IDS:  # a whole release, as finalize leaves one (a revert goes to no other)
        (tmp_path / "releases" / rid).mkdir(parents=True)
        (tmp_path / "releases" / rid / "service.env").write_text("")
        manifest = {"id": rid, "git_sha": "0" * 40, "created": "2026-01-01", "components": {}}
        manifest["selftest"] = {"ok": True}
        (tmp_path / "releases" / rid / "release.json").write_text(json.dumps(manifest))
    return tmp_path


def test_switch_commit_revert(root: Path) -> None:
    r = str(root)
    assert host("switch", r, IDS[0], "pending")[1] == {"previous": None, "current": IDS[0]}
    host("commit", r)
    host("switch", r, IDS[1], "pending")
    host("commit", r)
    assert links(root) == (IDS[1], IDS[0])
    host("switch", r, IDS[2], "pending")
    assert links(root) == (IDS[2], IDS[1]) and (root / "deploy.pending").exists()
    assert host("revert", r)[1] == {"reverted": True, "current": IDS[1], "by": "deploy"}
    assert links(root) == (IDS[1], IDS[0]) and not (root / "deploy.pending").exists()
    assert host("revert", r)[1] == {"reverted": False}  # nothing pending: nothing to do


def test_first_install_is_retired_only_after_the_service_stopped(root: Path) -> None:
    """A revert never unlinks a first install's `current` (its service may run from it): it
    says first_install, the caller stops the service, then `retire` unlinks it."""
    host("switch", str(root), IDS[0], "pending")
    code, doc = host("revert", str(root))
    assert code == 0 and doc["first_install"] is True and doc["reverted"] is False
    assert links(root) == (IDS[0], None) and (root / "deploy.pending").exists()
    assert host("retire", str(root), IDS[1])[0] == 2  # not the pending first install
    assert host("retire", str(root), IDS[0])[1]["retired"] == IDS[0]
    assert links(root) == (None, None) and not (root / "deploy.pending").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("switch", "{root}", "../../etc"),
        ("switch", "{root}", "/etc"),
        ("switch", "{root}", "20990101T000000Z-deadbeef"),  # well-formed, absent
        ("remove", "{root}", "../releases"),
        ("reject", "{root}", "../../etc"),
        ("reject", "{root}", "20990101T000000Z-deadbeef"),  # well-formed, absent
        ("finalize", "{root}", "../../x", IDS[3]),
        ("finalize", "{root}", ".staging-x", "not-an-id"),
        ("list", "/"),
        ("list", "relative/root"),
        ("bogus", "{root}"),
    ],
)
def test_hostile_input_is_refused(root: Path, args: tuple[str, ...]) -> None:
    code, doc = host(*(a.format(root=root) for a in args))
    assert code == 2 and doc["error"]
    assert sorted(p.name for p in (root / "releases").iterdir()) == IDS


def test_remove_and_prune_spare_current_and_previous(root: Path) -> None:
    r = str(root)
    host("switch", r, IDS[0])
    host("switch", r, IDS[1])
    code, doc = host("remove", r, IDS[1])
    assert code == 2 and "current or previous" in doc["error"]
    assert host("prune", r, "2")[1] == {"removed": []}  # the two oldest are current, previous
    assert host("prune", r, "1")[1] == {"removed": [IDS[2]]}
    assert sorted(p.name for p in (root / "releases").iterdir()) == [IDS[0], IDS[1], IDS[3]]


def test_prune_spares_every_release_still_in_use(root: Path) -> None:
    """probe37t T1 (high): after a --force deploy from `current -> releases/ID/.` (a link of
    another shape, to the release the host was on), `previous` named it so, and prune deleted
    it. Prune keeps (and remove refuses) any release that a link of the root or a running
    service (a pidfile under run/ names it) points into, by where it resolves."""
    r = str(root)
    host("switch", r, IDS[3])
    (root / "previous").symlink_to(f"releases/{IDS[0]}/.")
    (root / "current.before-20260101T000000Z").symlink_to(str(root / "releases" / IDS[1]))
    service = subprocess.Popen(["sleep", "60"], cwd=root / "releases" / IDS[2])
    try:
        (root / "run").mkdir()
        (root / "run" / "svc.pid").write_text(json.dumps({"pid": service.pid}))
        code, doc = host("remove", r, IDS[0])  # previous, whatever its link's shape
        assert code == 2 and "current or previous" in doc["error"], doc
        code, doc = host("remove", r, IDS[1])
        assert code == 2 and "current.before-20260101T000000Z points into it" in doc["error"]
        code, doc = host("remove", r, IDS[2])
        assert code == 2 and f"pid {service.pid}" in doc["error"], doc
        assert host("prune", r, "1")[1] == {"removed": []}
    finally:
        service.kill()
        service.wait()
    assert host("prune", r, "1")[1] == {"removed": [IDS[2]]}  # its service gone


def test_prune_spares_a_release_a_process_runs_from_with_no_pidfile(root: Path) -> None:
    """probe37aq H1 (high): the service's pidfile removed by hand (status still finds the
    service, unmanaged) and its release never proven: `deploy --no-restart --keep 2` pruned the
    release it ran from. Prune keeps (and remove refuses) any release a live process runs
    from, pidfile or not."""
    r = str(root)
    host("switch", r, IDS[3])
    service = subprocess.Popen(["sleep", "60"], cwd=root / "releases" / IDS[1] / ".")
    try:
        code, doc = host("remove", r, IDS[1])
        assert code == 2 and f"pid {service.pid}, which runs from it" in doc["error"], doc
        assert host("prune", r, "1")[1] == {"removed": [IDS[0], IDS[2]]}
    finally:
        service.kill()
        service.wait()
    assert host("prune", r, "1")[1] == {"removed": [IDS[1]]}  # its process gone


def test_prune_spares_the_release_a_hand_made_copy_runs_from(root: Path) -> None:
    """probe37an L5 (low): `current -> copyA`, a hand-made copy of a release whose service.env
    still names its original's directory (PYTHONPATH, the hook's site/): a prune deleted the
    original, leaving the copy a revert may go back to naming a directory that is gone. Prune
    keeps (and remove refuses) a release that the service.env of a copy in the root names,
    through a link or as a directory a switch moved aside."""
    r = str(root)
    host("switch", r, IDS[3])
    for copy, original in (("copyA", IDS[0]), ("current.before-20260101T000000Z", IDS[1])):
        (root / copy).mkdir()
        rel = root / "releases" / original
        (root / copy / "service.env").write_text(f"PYTHONPATH={rel}/site:{rel}\nA=1\n")
    (root / "previous").symlink_to("copyA")
    code, doc = host("remove", r, IDS[0])
    assert code == 2 and "service.env (a copy of a release)" in doc["error"], doc
    code, doc = host("remove", r, IDS[1])
    assert code == 2 and "current.before-20260101T000000Z's service.env" in doc["error"], doc
    assert host("prune", r, "1")[1] == {"removed": [IDS[2]]}
    (root / "previous").unlink()
    shutil.rmtree(root / "copyA")
    assert host("prune", r, "1")[1] == {"removed": [IDS[0]]}  # no copy names it now


def test_prepare_removes_what_dead_deploys_left(root: Path) -> None:
    for name in (".staging-" + IDS[3], ".incoming.abc123"):
        (root / "releases" / name).mkdir()
    assert host("prepare", str(root))[1]["removed"] == [".incoming.abc123", ".staging-" + IDS[3]]


def test_finalize_is_one_rename(root: Path) -> None:
    staging = root / "releases" / ".staging-new"
    staging.mkdir()
    (staging / "f").write_text("x")
    rid = "20260102T000000Z-bbbbbbb1"
    doc = json.dumps({"release_json": "{}", "service_env": "A=1\n"})
    assert host("finalize", str(root), ".staging-new", rid, stdin=doc)[1] == {"release": rid}
    assert (root / "releases" / rid / "service.env").read_text() == "A=1\n"
    assert not staging.exists()
    assert host("finalize", str(root), ".staging-new", rid, stdin=doc)[0] == 2


def test_revert_settle_keeps_the_guard_restarting(root: Path) -> None:
    """The automatic rollback switches back at once but keeps deploy.pending ('settled') until
    the service is restarted on the old release: a guard that runs meanwhile still restarts."""
    r = str(root)
    host("switch", r, IDS[0])
    host("switch", r, IDS[1], "pending")
    assert host("revert", r, "settle")[1] == {"reverted": True, "current": IDS[0], "by": "deploy"}
    assert links(root)[0] == IDS[0] and (root / "deploy.pending").exists()
    assert host("list", r)[1]["pending"] is True
    # the guard's revert: nothing left to switch, but it says reverted (so it restarts)
    assert host("revert", r)[1] == {"reverted": True, "current": IDS[0], "by": "deploy"}
    assert links(root)[0] == IDS[0] and not (root / "deploy.pending").exists()
    # or the rollback finishes and commits
    host("switch", r, IDS[1], "pending")
    host("revert", r, "settle")
    done = host("commit", r)[1]
    assert done["pending"] is True and done["current_state"]["id"] == IDS[0], done
    assert host("revert", r)[1] == {"reverted": False}


def test_prepare_waits_for_a_guard_and_puts_back_an_unsettled_switch(root: Path) -> None:
    """A guard holds deploy.guard while it lives: the next deploy waits for it (or is refused
    after WAIT_S); a deploy.pending that no guard settled (host rebooted mid-deploy) is put
    back before anything else happens."""
    r = str(root)
    host("switch", r, IDS[0])
    host("switch", r, IDS[1], "pending")  # ... and then the deploy and its guard died
    holder = subprocess.Popen(["flock", str(root / "deploy.guard"), "sleep", "1.5"])
    try:
        time.sleep(0.3)
        code, doc = host("prepare", r, "0.2")
        assert code == 2 and "still putting the host back" in doc["error"]
        assert links(root)[0] == IDS[1]  # refused: nothing touched
        code, doc = host("prepare", r)
    finally:
        holder.wait()
    assert code == 0 and doc["guard_waited_s"] >= 0.5
    assert doc["put_back"] == {"from": IDS[1], "to": IDS[0], "restart": True, "by": "deploy"}
    assert links(root)[0] == IDS[0] and not (root / "deploy.pending").exists()


def test_a_pending_switch_needs_a_live_guard(root: Path) -> None:
    """probe37b B13: a deploy's switch that reaches the host after its guard has gone (ops's
    SSH connection dropped: the guard reverted nothing and exited) switches nothing, so no
    release is left current with no one to revert it; with the guard alive it switches."""
    r = str(root)
    host("switch", r, IDS[0])
    code, doc = host("switch", r, IDS[1], "pending", guard=False)
    assert code == 2 and "no revert guard" in doc["error"], doc
    assert links(root)[0] == IDS[0] and not (root / "deploy.pending").exists()
    code, doc = host("switch", r, IDS[1], "pending")
    assert code == 0 and links(root)[0] == IDS[1] and (root / "deploy.pending").exists()


def test_a_host_side_exception_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """probe37l L2: ops's own host-side code raising (a KeyError on a hand-edited record) came
    back as exit 2, the bad-input code, with the host's multi-line traceback. It is one line
    naming the exception, exit 4 (a bug in ops)."""
    from ops.deploy.host_actions import host_json
    from ops.errors import EXIT_INTERNAL, HostSideBug
    from ops.hosts.inventory import Target
    from ops.hosts.local import LocalHost

    host = LocalHost(Target(name="local", python=sys.executable, remote_root=str(tmp_path)))
    with pytest.raises(HostSideBug) as caught:
        host_json(host, "def f(d):\n    return d['resolves']\nf({})\n", [], "releases list")
    said = caught.value.message
    assert caught.value.exit_code == EXIT_INTERNAL and "\n" not in said, said
    assert "releases list" in said and "KeyError: 'resolves'" in said, said


def test_the_revert_guard_fits_one_argument_of_the_remote_shell() -> None:
    """The guard's script carries both host-side scripts (the revert and the restart). Over SSH
    a whole command is one argument of the remote shell, and Linux caps one argument at
    128 KiB (MAX_ARG_STRLEN): sent as plain text they had grown to within 1.5 KiB of it, and
    the process manager's log keeper took them past it (every deploy failed: "Argument list
    too long"). They are sent packed; the longest remote root and a long command still fit."""
    from ops.deploy.host_actions import guard_script
    from ops.hosts.inventory import MAX_REMOTE_ROOT, Service, Target

    root = "/" + "r" * (MAX_REMOTE_ROOT - 1)
    command = "{python} -m engine.serve --port {port} " + "--flag x " * 400
    t = Target(name="t", remote_root=root, service=Service(command=command))
    size = len(guard_script(t, restart=True).encode())
    assert size < 128 << 10, f"{size} bytes"
