"""probe37d F1-F4: what a deploy, a rollback and `ops releases` say is what the host is.

- F1: a rollback that switched `current` back but whose restart of the old release failed is
  not "rolled back to X": the result says current is back on X, its service does not serve,
  why, and the next command (`ops deploy` and `ops rollback --to` alike).
- F2: "already current; nothing to do" is never said while the service runs another release.
- F3: an "already current" deploy settles a junk deploy.pending (its recover step) as any
  deploy does, so a later restart is not refused over it.
- F4: a release whose release.json names another id than its directory is listed damaged.

Real processes throughout: the `ops` CLI, the host-side scripts, the stand-in service of
tests/helpers/deploy_ops.py on its own root and port. The old release is made to fail its
restart deterministically: its service refuses to start while a marker file exists (created
after it started), so nothing but ops's own services runs, and the teardown ends those.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, refuse_with_marker, steps
from helpers.local import alive, end_services, stopped


def flat(text: str) -> str:
    return " ".join(text.split())


def new_commit(ops: Ops, n: int) -> None:
    commit_change(ops.src, "engine/svc.py", '"""', f'"""Release {n}. ')


def assert_down_said(ops: Ops, res, result: dict, back_on: str) -> None:
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "Traceback" not in said, said
    assert steps(result).get("rollback") == "fail", result["steps"]
    assert result["outcome"] != "rolled-back", result
    assert f"rolled back to {back_on}" not in said, said
    msg = flat(result["message"])
    assert f"current is back on {back_on}, but its service does not serve" in msg, msg
    assert "refusing to start" in msg or "service failed" in msg or "still failing" in msg, msg
    assert "ops service start local" in msg and "ops rollback local" in msg, msg
    assert ops.current() == back_on


def test_deploy_whose_rollback_restart_fails_is_not_rolled_back(ops: Ops) -> None:
    marker = refuse_with_marker(ops)
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    marker.write_text("")  # r1 keeps serving; neither it nor the next release can start now
    new_commit(ops, 2)
    res = ops.deploy()
    result = ops.record("deploy")["results"][0]
    assert_down_said(ops, res, result, r1)


def test_rollback_to_whose_undo_restart_fails_is_not_rolled_back(ops: Ops) -> None:
    marker = refuse_with_marker(ops)
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    new_commit(ops, 2)
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    marker.write_text("")
    res = ops("rollback", "local", "--to", r1)
    result = ops.record("rollback")["results"][0]
    assert_down_said(ops, res, result, r2)


def test_an_undone_rollback_does_not_say_rolled_back(ops: Ops) -> None:
    """A rollback --to whose release fails its restart is undone: the host is back where it
    started. Its result said "rolled back to <the release it started on>", which reads as the
    rollback done; it says the rollback was undone, and where the host is."""
    marker = refuse_with_marker(ops)
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    guard = (
        f"    if __import__('os').path.exists({str(marker)!r}):\n"
        "        raise SystemExit('refusing to start: marker file')\n"
    )
    commit_change(ops.src, "engine/svc.py", guard, "")  # r2 starts, marker or not
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    marker.write_text("")
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    result = ops.record("rollback")["results"][0]
    # its outcome is `failed`: `rolled-back` read as the rollback done (probe37ad L3)
    assert res.returncode == 1 and result["outcome"] == "failed", said
    assert f"the rollback to {r1} was undone: {r2}, where it started, is current again" in said
    assert "rolled back to" not in said and "rolled-back" not in said, said
    assert ops.current() == r2 and ops.serving() == r2


def installed_not_restarted(ops: Ops) -> tuple[str, str]:
    """r1 deployed and serving; r2 then installed as current with --no-restart."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    new_commit(ops, 2)
    assert ops.deploy("--no-restart").returncode == 0
    r2 = ops.current()
    assert r2 != r1 and ops.serving() == r1
    return r1, r2


def test_already_current_while_the_service_runs_an_older_release_is_not_nothing_to_do(
    ops: Ops,
) -> None:
    r1, r2 = installed_not_restarted(ops)
    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "Traceback" not in said, said
    assert "nothing to do" not in said, said
    result = ops.record("deploy")["results"][0]
    msg = flat(result["message"])
    assert f"its service runs {r1}, not {r2}" in msg, msg
    assert f"{r2} never passed a post-flight" in msg, msg
    # the way with a way back (probe37ab M2: the restart it named had none)
    assert f"`ops rollback local --to {r1}` makes what runs current, then `ops deploy" in msg
    assert ops.serving() == r1  # said, not done: nothing was restarted


def test_a_restart_onto_an_unproven_current_is_refused_without_force(ops: Ops) -> None:
    """probe37ab M2 (medium): current installed with --no-restart (a release whose engine exits
    at start), the service healthy on the proven release before it: `ops service restart`,
    which status named as the way to run current, stopped the healthy service and left it
    down, with no way back. An operator's restart that would move the service from a proven
    release onto a current that never passed a post-flight is refused, naming the way with a
    way back; --force restarts onto it as it is."""
    r1, r2 = installed_not_restarted(ops)
    code, st = ops.json("service", "status", "local")
    said = " ".join(st.get("warnings", []))
    assert f"runs release {r1}, not current ({r2})" in said and "rollback" in said, st
    # the target's name and the release, never a literal TARGET (probe37aj L1)
    assert f"ops rollback local --to {r1} makes it current" in said and "TARGET" not in said
    code, st = ops.json("service", "restart", "local")
    assert code == 1 and st["blocked_by"] == "unproven" and st["state"] == "active", st
    assert f"current ({r2}) never passed a post-flight, and the service runs {r1}" in st["detail"]
    assert "ops rollback local --to the release it runs" in st["detail"], st
    assert ops.serving() == r1  # never stopped
    code, st = ops.json("service", "restart", "local", "--force")
    assert code == 0 and st["state"] == "active", st
    assert any("restarted it anyway (--force)" in w for w in st["warnings"]), st
    assert ops.serving() == r2


def test_a_restart_onto_a_rejected_current_says_it_failed_a_post_flight(ops: Ops) -> None:
    """probe37bd L4: current switched by hand to a release a deploy rejected: the refusal said
    it "never passed a post-flight", not that it failed one."""
    r1, r2 = installed_not_restarted(ops)
    why = {"step": "postflight", "detail": "post-flight failed: identity", "at": "2026-12-07"}
    (ops.root / "releases" / r2 / "rejected.json").write_text(json.dumps(why))
    code, st = ops.json("service", "restart", "local")
    failed = f"current ({r2}) failed a post-flight (a deploy rejected it), and the service runs"
    assert code == 1 and f"{failed} {r1}" in st["detail"], st
    assert ops.serving() == r1  # never stopped


def test_no_deploy_over_a_current_the_service_does_not_run(ops: Ops) -> None:
    """probe37v V3 (high): current installed with --no-restart (a release whose engine exits
    at start), the service still healthy on the release before it. The next deploy passed its
    pre-flight, failed, and its revert went back to current and restarted the service there:
    down. A deploy over a current the service does not run is refused, --force or not,
    naming both ways on; nothing is stopped."""
    r1, r2 = installed_not_restarted(ops)
    new_commit(ops, 3)
    for extra in ((), ("--force",)):
        res = ops.deploy(*extra)
        said = flat(res.stdout + res.stderr)
        assert res.returncode == 1 and f"the service runs {r1}, not current ({r2}" in said, said
        assert f"ops rollback local --to {r1}" in said, said
        # probe37y M2 (medium): it did not say current never served, and named the restart
        # (which takes the service down, with no way back) first
        assert f"{r2} never passed a post-flight: `ops rollback local --to {r1}`" in said, said
        assert ops.current() == r2 and ops.serving() == r1


def test_already_current_settles_a_junk_pending_record(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    (ops.root / "deploy.pending").write_text("{}")
    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0 and "already current" in said, said
    result = ops.record("deploy")["results"][0]
    assert steps(result).get("recover") == "ok", result["steps"]
    assert not (ops.root / "deploy.pending").exists()
    assert list(ops.root.glob("deploy.pending.unreadable-*"))
    res = ops("service", "restart", "local")
    assert res.returncode == 0, res.stdout + res.stderr
    assert ops.current() == r1 and ops.serving() == r1


def test_release_whose_manifest_names_another_id_is_damaged(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    new_commit(ops, 2)
    assert ops.deploy().returncode == 0
    r2 = ops.current()
    # r2's directory replaced by a copy of r1 (as the probe did by hand): its id is r1's
    rel2 = ops.root / "releases" / r2
    man1 = json.loads((ops.root / "releases" / r1 / "release.json").read_text())
    (rel2 / "release.json").write_text(json.dumps(man1))
    code, doc = ops.json("releases", "local")
    cur = next(r for r in doc["releases"] if r["id"] == r2)
    assert cur["current"] and cur["damaged"] and r1 in cur["damaged"], cur
    res = ops("releases", "local")
    assert "damaged" in res.stdout, res.stdout  # in the table's mark, beside "current"
    assert f"{r2} is damaged" in flat(res.stderr), res.stderr


def descendants(top: int) -> list[int]:
    """Every process below `top` (its children, theirs, ...)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
    found, frontier = [], {top}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier}
        found += sorted(frontier)
    return found


def cmdline_of(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace")
    return ""


@pytest.fixture
def loop(tmp_path: Path):
    """`Ops` with a target `loop` over a loopback sshd of this test's own (to be cut), its own
    root and port; yields (ops, server, root)."""
    import shutil
    import sys

    from helpers import REPO
    from helpers.deploy import git
    from helpers.sshd import free_port, start_sshd

    server = start_sshd(tmp_path / "sshd")
    ops = Ops(tmp_path / "o")
    root, port = tmp_path / "loop-root", free_port()
    ops.inventory.write_text(
        ops.inventory.read_text().split("[groups]")[0] + "[targets.loop]\n"
        f"address = '127.0.0.1'\nport = {server.port}\nuser = '{server.user}'\n"
        f"ssh_key = '{server.user_key}'\nknown_hosts = '{server.known_hosts}'\n"
        f"python = '{sys.executable}'\nremote_root = '{root}'\n"
        "[targets.loop.service]\n"
        f"url = 'http://127.0.0.1:{port}'\n"
        "command = '{python} engine/svc.py --port {port}'\n"
        "stop_timeout = 2\n"
    )
    # over SSH the checks run from the release: it carries them, as a real one does
    shutil.copytree(REPO / "checks", ops.src / "checks", ignore=shutil.ignore_patterns("__py*"))
    git(ops.src, "add", "-A")
    git(ops.src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "checks")
    try:
        yield ops, server, root
    finally:
        server.proc.kill()
        server.proc.wait()
        end_services(root)
        end_services(ops.root)


def cut_at(ops: Ops, server, marker: str, delay: float = 0.0) -> tuple[int, str, str]:
    """A deploy to `loop`; `delay` s after `marker` shows on stderr, the sshd and its sessions
    are killed (no new connection, ops's own cut): (exit, stdout, stderr)."""

    proc = ops.popen("deploy", "loop", "--source", str(ops.src), "--max-tokens", "3")
    assert proc.stderr is not None
    seen = ""
    while marker not in seen:
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    time.sleep(delay)
    cut(server)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, seen + err


def cut(server) -> None:  # noqa: ANN001
    """The loopback sshd and its sessions killed: no new connection, every one cut."""
    import signal

    sessions = [  # the connection's sshd processes, not the commands they run
        pid
        for pid in descendants(server.proc.pid)
        if "sshd" in cmdline_of(pid).split("\0")[0]  # its argv[0]: never a command it runs
    ]
    server.proc.send_signal(signal.SIGKILL)  # the listener: no new connection
    for pid in sessions:  # its sessions: ops's connection is cut
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_link_lost_after_the_switch_is_never_called_rolled_back(loop) -> None:
    """probe37g G2: the SSH server gone right after the switch (the restart and the rollback
    cannot reach the host): the outcome was `rolled-back` with `-> (none)`, though the rollback
    step failed and where `current` is was unknown. Now `failed`, `after` says unknown; the
    host's guard puts it back on the old release, serving."""
    ops, server, root = loop
    res = ops.deploy("--bootstrap", target="loop")
    assert res.returncode == 0, res.stdout + res.stderr
    r1 = (root / "current").readlink().name
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    code, out, err = cut_at(ops, server, "switch: ok")
    assert code == 2, flat(out + err)  # the host unreachable: exit 2, not a verdict (at-L4)
    result = ops.record("deploy")["results"][0]
    assert result["outcome"] == "failed", result
    assert result["after"] == "unknown (the host did not answer)", result
    assert "rolled-back" not in out and "-> (none)" not in flat(out), out
    deadline = time.monotonic() + 60  # the guard, left alone, puts the host back
    while (root / "current").readlink().name != r1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (root / "current").readlink().name == r1


def test_a_link_lost_once_the_post_flight_passed_says_where_the_host_may_be(loop) -> None:
    """probe37k K1: the SSH link cut right after `postflight: ok` (the commit, the prune):
    exit 2, one bare line (`releases commit: no result`, `prune: refused`), a record with no
    steps and no word of where the host was, though the guard had put the old release back or
    the new one stood. The result is one of: deployed (the commit landed; a prune that could
    not run is skipped), or failed with `after` unknown, naming both possibilities."""
    ops, server, root = loop
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    r1 = (root / "current").readlink().name
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    code, out, err = cut_at(ops, server, "postflight: ok")
    said = flat(out + err)
    assert "Traceback" not in said and "error:" not in said, said
    result = ops.record("deploy")["results"][0]
    r2 = result["release"]
    assert result["steps"] and result["outcome"] in ("deployed", "failed"), result
    if result["outcome"] == "failed":
        assert code == 1 and result["failed_step"] == "commit", result
        assert result["after"] == "unknown (the host did not answer)", result
        assert f"the host's guard put {r1} back" in flat(result["message"]), result["message"]
    else:
        assert code == 0 and result["after"] == r2, result
    deadline = time.monotonic() + 60  # the guard, left alone, settles the host
    while (root / "deploy.pending").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    now = (root / "current").readlink().name
    assert now in (r1, r2) and not (root / "deploy.pending").exists()
    if result["outcome"] == "deployed":
        assert now == r2


def test_a_link_lost_during_the_selftest_says_so(loop) -> None:
    """probe37g G8: the SSH server gone while the self-test ran: the error said only 'printed
    no JSON document (exit -1): (no output)'; it says the connection was lost. Nothing was
    switched."""
    ops, server, root = loop
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    r1 = (root / "current").readlink().name
    ops.slow_selftest(5)
    code, out, err = cut_at(ops, server, "selftest ...", delay=2.0)  # the 5 s self-test runs
    said = flat(out + err)
    assert code == 2 and "the connection to the host was lost" in said, said  # (bj-L4: 1)
    assert (root / "current").readlink().name == r1


def test_a_link_lost_during_the_rollbacks_restart_is_unknown_not_down(loop) -> None:
    """probe37j J1: the SSH link cut while the rollback restarted the old release: the result
    said its service 'does not serve' and named ops service start / ops rollback, while the
    host's guard had it serving again within seconds. What came back was no answer at all:
    the result says current is back and whether it serves is unknown."""
    ops, server, root = loop
    slow = "def main() -> None:\n    time.sleep(2)\n"  # the old release: 2 s to start
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow)
    assert ops.deploy("--bootstrap", "--wait", "30", target="loop").returncode == 0
    r1 = (root / "current").readlink().name
    broken = "def main() -> None:\n    raise SystemExit('boom')\n"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", broken)
    code, out, err = cut_at(ops, server, "rollback ...", delay=1.0)  # in the old one's start
    said = flat(out + err)
    assert code == 1, said
    result = ops.record("deploy")["results"][0]
    assert result["outcome"] == "failed", result
    assert "whether its service serves is unknown" in result["message"], result["message"]
    assert "does not serve" not in result["message"], result["message"]
    assert (root / "current").readlink().name == r1


def test_a_restart_whose_link_is_cut_between_stop_and_start_still_starts(loop) -> None:
    """probe37m M8 (high): `ops service restart` over SSH with its link cut (or ops killed)
    after the host had stopped the service and before it started it: the host's watcher ended
    the process manager there, and the service stayed down until someone ran a start. The
    restart's stop and start are done by a worker of its own session, to their end."""
    import urllib.request

    ops, server, root = loop
    marker = ops.tmp / "got-term"
    slow_stop = (  # the service takes its time to stop: the cut lands in the restart's stop
        "def main() -> None:\n"
        "    import signal as _s, time as _t\n"
        "    def _term(*_a):\n"
        f"        open({str(marker)!r}, 'a').close()\n"
        "        _t.sleep(1.5)\n"
        "        raise SystemExit(0)\n"
        "    _s.signal(_s.SIGTERM, _term)\n"
    )
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow_stop)
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    pidfile = root / "run" / "ddtree-engine.pid"
    old = json.loads(pidfile.read_text())["pid"]
    section = ops.inventory.read_text().split("[targets.loop.service]")[1]
    url = section.split("url = '")[1].split("'")[0] + "/health"
    proc = ops.popen("service", "restart", "loop")
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the restart never stopped the service"
    cut(server)  # the host has begun the stop; its start is still to come
    proc.communicate(timeout=120)

    def serving_anew() -> bool:  # a new process in the pidfile, and /health answered
        try:
            if json.loads(pidfile.read_text())["pid"] == old:
                return False
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except (OSError, ValueError, KeyError):
            return False

    deadline = time.monotonic() + 60
    while not serving_anew() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serving_anew(), "the restart never started the service again"
    assert not alive(old)


def test_a_link_cut_in_a_deploys_restart_leaves_the_old_release_serving(loop) -> None:
    """probe37n N3 (high): the link cut while the deploy's restart ran on the host: that
    restart went on (it must not stop half way), and the guard's restart of the old release
    ran at the same time; the two left no service. Restarts of a service run one at a time on
    the host: the guard's comes last, and the old release serves."""
    import urllib.request

    ops, server, root = loop
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    r1 = (root / "current").readlink().name
    slow = "def main() -> None:\n    time.sleep(2)\n"  # the new release: 2 s to start
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow)
    cut_at(ops, server, "restart ...", delay=1.0)
    section = ops.inventory.read_text().split("[targets.loop.service]")[1]
    url = section.split("url = '")[1].split("'")[0] + "/health"

    def settled() -> bool:
        if (root / "deploy.pending").exists() or (root / "current").readlink().name != r1:
            return False
        try:
            pid = json.loads((root / "run" / "ddtree-engine.pid").read_text())["pid"]
            with urllib.request.urlopen(url, timeout=2) as r:
                ok = r.status == 200
        except (OSError, ValueError, KeyError):
            return False
        return ok and os.readlink(f"/proc/{pid}/cwd").endswith(r1)

    deadline = time.monotonic() + 90
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert settled(), "the old release does not serve"
    time.sleep(3)  # and stays so: no restart is left to undo it
    assert settled(), "the old release stopped serving"


@pytest.mark.parametrize("when", ["between-commands", "in-a-command"])
def test_a_host_that_stops_answering_is_given_up_on_in_seconds(loop, when: str) -> None:
    """probe37z M1 (medium): the SSH server frozen (SIGSTOP: a hung host, a black-holed
    network) at the post-flight. The rollback found the host did not answer; ops then went on
    for about 155 s in silence, each best-effort command after it (the reject, the asking where
    the host was left) waiting out a channel's open timeout of its own, then the guard's end for
    122 s. Once two commands in a row have not been answered, each later one (and a host
    process's end) gets one short look. A command in flight when the host froze (here a 30 s
    self-test) waited out its whole deadline: a command quiet for twice the connect_timeout
    is checked on with a new channel. After the thaw, the host is on the release it was on."""
    ops, server, root = loop
    ops.inventory.write_text(
        ops.inventory.read_text().replace(
            "[targets.loop.service]", "connect_timeout = 3\n[targets.loop.service]"
        )
    )
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    r1 = (root / "current").readlink().name
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    if when == "in-a-command":
        ops.slow_selftest(30)
    marker = "postflight ..." if when == "between-commands" else "selftest ..."
    proc, seen = ops.popen_at(marker, "deploy", "loop", "--source", str(ops.src))
    if when == "in-a-command":
        time.sleep(1.0)  # the self-test's channel is open, its command runs
    frozen = [server.proc.pid] + [
        pid for pid in descendants(server.proc.pid) if "sshd" in cmdline_of(pid).split("\0")[0]
    ]
    t0 = time.monotonic()
    with stopped(frozen):
        out, err = proc.communicate(timeout=150)
        took = time.monotonic() - t0
    said = flat(out + seen + err)
    # the link's trouble in the self-test: exit 2, a host ops could not act on (probe37bj L4)
    assert proc.returncode == (1 if when == "between-commands" else 2), said
    assert "Traceback" not in said and took < 30, (took, said)
    result = ops.record("deploy")["results"][0]
    if when == "between-commands":
        assert "the host did not answer" in said, said
        assert result["outcome"] == "failed" and result["after"].startswith("unknown"), result
    else:
        assert "the host stopped answering" in said, said
        assert result["outcome"] == "failed" and result["failed_step"] == "selftest", result
    deadline = time.monotonic() + 60  # thawed, the guard sees ops gone and puts r1 back
    while (root / "current").readlink().name != r1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (root / "current").readlink().name == r1


def test_a_frozen_ssh_session_is_left_for_a_new_one(loop, tmp_path: Path) -> None:
    """probe37bn M1 (medium): the deploy's SSH session frozen (its sshd session processes
    stopped; the listener up) while the host switched: ops waited 2 minutes for a revert guard
    that could not act (it waits for a pipe the frozen session holds open), then asked where
    current was over the frozen link and said "current unknown", `-> (none)`; the host stayed
    switched to the unproven release with deploy.pending, its guard and lock holder waiting.
    ops now leaves a frozen connection for a new one: it lets its guard and lock holder go from
    there, waits for the guard's switch back, and asks the host. All before the thaw."""
    import stat
    import sys

    ops, server, root = loop
    mark = tmp_path / "switching"
    slow = tmp_path / "python"  # the host's python: its `switch` waits 4 s, then makes it
    slow.write_text(
        "#!/bin/bash\n"
        f'for a in "$@"; do [ "$a" = switch ] && {{ : > {mark}; sleep 4; }}; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    inv = ops.inventory.read_text().replace(f"python = '{sys.executable}'", f"python = '{slow}'")
    ops.inventory.write_text(
        inv.replace("[targets.loop.service]", "connect_timeout = 3\n[targets.loop.service]")
    )
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    r1 = (root / "current").readlink().name
    pid = ops.json("service", "status", "loop")[1]["pid"]
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    mark.unlink()  # (the first deploy's switch)
    proc, seen = ops.popen_at("switch ...", "deploy", "loop", "--source", str(ops.src))
    deadline = time.monotonic() + 30
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists(), seen
    sessions = [  # the connection's sshd processes: the listener still takes new ones
        pid for pid in descendants(server.proc.pid) if "sshd" in cmdline_of(pid).split("\0")[0]
    ]
    assert sessions
    t0 = time.monotonic()
    with stopped(sessions):
        out, err = proc.communicate(timeout=150)
        took = time.monotonic() - t0
        said = flat(seen + out + err)
        assert proc.returncode == 1 and "Traceback" not in said, said
        assert took < 60, (took, said)
        result = ops.record("deploy")["results"][0]
        assert result["failed_step"] == "switch" and result["after"] == r1, result
        assert f"current is {r1} (asked of the host once its guard was done)" in said, said
        assert (root / "current").readlink().name == r1
        assert not (root / "deploy.pending").exists()
        code, doc = ops.json("service", "status", "loop")
        assert code == 0 and doc["pid"] == pid and doc["state"] == "active", doc  # kept
        res = ops("releases", "loop")  # the host lock is free: its holder was let go
        assert res.returncode == 0 and "lock" not in res.stderr, res.stderr


def test_a_post_flight_cut_off_by_a_lost_link_rejects_nothing(loop) -> None:
    """probe37ah M1 (medium): the SSH sessions cut (the listener up) during a deploy's
    post-flight: its checks never ran, the guard put the old release back, and the new release
    was marked rejected for good ("failed its postflight", "deploy a fixed commit"). A lost
    link is the link's trouble: the release is not rejected, and `rollback --to` takes it."""
    import signal

    ops, server, root = loop
    assert ops.deploy("--bootstrap", target="loop").returncode == 0
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    args = ("deploy", "loop", "--source", str(ops.src), "--max-tokens", "3")
    proc, seen = ops.popen_at("postflight ...", *args)
    for pid in descendants(server.proc.pid):  # the sessions only: new connections still come
        if "sshd" in cmdline_of(pid).split("\0")[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    said = flat(seen + out + err)
    assert proc.returncode == 2, said  # the link's trouble: exit 2, not a verdict (at-L4)
    r2 = ops.record("deploy")["results"][0]["release"]
    code, doc = ops.json("releases", "loop")
    rel = next(r for r in doc["releases"] if r["id"] == r2)
    assert rel["rejected"] is None and not rel["current"], doc
