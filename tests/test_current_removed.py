"""probe37af H1, H2, M2, L1: a `current` removed by hand while the service runs a release, and a
deploy started beside another's restart.

- H1: `current` removed (the service still serving release R): a deploy took the host for a
  first install, its restart failed, and its rollback ("first install removed") stopped the
  service, with nothing to go back to. It is refused, --force or --bootstrap or not, naming
  `ops rollback --to R`, which makes R current without a restart.
- H2: the same host: `ops service restart` started the service from the remote root, outside
  every release. An operator's start or restart with no `current` where releases/ holds
  releases is refused (status says so first), stopping nothing.
- M2: a deploy started while another deploy restarted the service ran its pre-flight, found
  the service down and said "start it ... or --force". It names the lock's holder instead.
- L1: a rollback from no `current` said "(was None)".

Real processes throughout: the `ops` CLI, the host-side scripts, the stand-in service of
tests/helpers/deploy_ops.py on its own root and port.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops


def flat(text: str) -> str:
    return " ".join(text.split())


def pid(ops: Ops) -> int:
    return ops.json("service", "status", "local")[1]["pid"]


CRASH = "def main() -> None:\n    raise SystemExit('crash at start')\n"


def test_a_deploy_over_a_removed_current_leaves_the_serving_release_alone(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    before = pid(ops)
    (ops.root / "current").unlink()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", CRASH)
    for extra in ((), ("--force",), ("--bootstrap",)):
        res = ops.deploy(*extra)
        said = flat(res.stdout + res.stderr)
        assert res.returncode == 1, said
        assert f"there is no current, but the service runs release {r2}" in said, said
        assert f"ops rollback local --to {r2}` makes it current" in said, said
        assert pid(ops) == before and not (ops.root / "current").exists(), said
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0 and "not restarted" in said, said
    # no "(none) never served" for a current removed by hand (probe37aj L2)
    assert "(there was no current: removed by hand?)" in said and "(none) never" not in said
    assert ops.current() == r2 and pid(ops) == before


def test_an_operator_restart_with_no_current_among_releases_is_refused(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    before = pid(ops)
    (ops.root / "current").unlink()
    code, st = ops.json("service", "status", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert f"the service runs release {r2}, but there is no current" in warned, st
    code, st = ops.json("service", "restart", "local")
    assert code == 1 and st["blocked_by"] == "current" and st["state"] == "active", st
    assert "there is no current, but releases/ holds 2 release(s)" in st["detail"], st
    assert pid(ops) == before  # never stopped
    ops.stop()
    code, st = ops.json("service", "start", "local")
    assert code == 1 and st["blocked_by"] == "current", st
    # a plain rollback from no current: to previous, and said without a Python None
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0 and "there was no current" in said, said
    assert "None" not in said and ops.current() == r1 and ops.serving() == r1, said


def test_a_deploy_beside_another_deploys_restart_names_the_lock_holder(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    slow = "def main() -> None:\n    __import__('time').sleep(6)\n"
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", slow)
    first, seen = ops.popen_at("restart ...", *ops.deploy_args())
    try:
        commit_change(ops.src, "engine/svc.py", '"""', '"""Another commit. ')
        res = ops.deploy()  # the service is down for the first one's restart
        said = flat(res.stdout + res.stderr)
        assert res.returncode == 2 and "host lock held by" in said, said
        assert "ops deploy" in said and "service unhealthy" not in said, said
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, seen + err  # the first ran to its end untouched
    assert ops.serving() == ops.current()


@pytest.mark.parametrize("how", ["moved", "removed"])
def test_a_release_gone_under_its_service_keeps_an_unproven_current_from_taking_over(
    ops: Ops, tmp_path: Path, how: str
) -> None:
    """probe37ao H1 (high): the service runs proven release r2; current is a --no-restart
    install that never ran (it crashes at start); then r2's directory is moved out of releases/
    (or removed) by hand. Status said nothing, an operator's restart stopped the service and
    left it down on the crash, and so did a failed deploy's revert. Status now warns, the
    restart and the deploy are refused and stop nothing. probe37as H1 (high): the rollback they
    named (to a proven release) stopped the service too, with no way back had that release
    failed to start; it is refused as well, and each names the way that has one: the moved
    directory put back (then made current), or a stop made knowingly before the rollback."""
    r1, r2 = ops.two_releases()
    before = pid(ops)
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", CRASH)
    assert ops.deploy("--no-restart").returncode == 0
    bad = ops.current()
    assert bad not in (r1, r2) and pid(ops) == before
    if how == "moved":
        (ops.root / "releases" / r2).rename(tmp_path / "gone-r2")
    else:
        shutil.rmtree(ops.root / "releases" / r2)
    code, st = ops.json("service", "status", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert st["state"] == "active", st
    gone = "was moved out of releases/" if how == "moved" else "was deleted under it"
    assert f"runs release {r2}, whose directory {gone}" in warned, st
    assert f"current ({bad}) never passed a post-flight" in warned, st
    res = ops("service", "restart", "local")
    said = flat(res.stdout + res.stderr)
    assert res.returncode != 0 and "no way back" in said and pid(ops) == before, said
    commit_change(ops.src, "engine/svc.py", "raise SystemExit('crash at start')", "raise")
    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and f"the service runs {r2}, whose directory is gone" in said
    assert f"ops service stop local, then ops rollback local --to {r1}" in said, said
    assert pid(ops) == before and ops.current() == bad
    for to in ((), ("--to", r1)):
        res = ops("rollback", "local", *to, "--max-tokens", "3")
        said = flat(res.stdout + res.stderr)
        assert res.returncode == 2 and "a rollback would stop it with no way back" in said, said
        assert pid(ops) == before and ops.current() == bad
    if how == "moved":
        home = ops.root / "releases" / r2
        assert (
            f"mv -T {tmp_path / 'gone-r2'} {home} puts it back, then ops rollback local --to {r2}"
            in (said)
        ), said
        (tmp_path / "gone-r2").rename(home)
        res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
        assert res.returncode == 0, flat(res.stdout + res.stderr)
        assert ops.current() == r2 and ops.serving() == r2 and pid(ops) == before
    else:
        assert "mv " not in said, said
        assert ops("service", "stop", "local").returncode == 0
        res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
        assert res.returncode == 0, flat(res.stdout + res.stderr)
        assert ops.current() == r1 and ops.serving() == r1


def test_a_stopped_service_never_lets_a_deploy_count_on_an_unproven_current(ops: Ops) -> None:
    """probe37ar M1 (medium): current a --no-restart install that never ran, the service
    stopped for maintenance: `deploy --force` of a crashing commit took that current as its
    way back, failed at restart, and its rollback started the never-run release, called
    "rolled back". It is refused at `current`, --force or not, naming the rollback to the
    release the service last ran (probe37at L2: not the newest proven one, which `service
    start` did not name), and nothing is started."""
    r1, r2 = ops.two_releases()
    assert ops("rollback", "local", "--to", r1, "--max-tokens", "3").returncode == 0
    commit_change(ops.src, "engine/svc.py", '"""', '"""Never run. ')
    assert ops.deploy("--no-restart").returncode == 0
    unproven = ops.current()
    assert ops("service", "stop", "local").returncode == 0
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", CRASH)
    res = ops.deploy("--force")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and f"current ({unproven}) never passed a post-flight" in said
    assert f"ops rollback local --to {r1}` makes the release it last ran current" in said
    assert ops.current() == unproven
    code, st = ops.json("service", "status", "local")
    assert st["state"] == "inactive" and st["last_ran"] == r1, st
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r1 and ops.serving() == r1


def test_a_release_directory_renamed_under_its_service_is_said_by_the_id_it_is(ops: Ops) -> None:
    """probe37ap L6 (low): the directory of the release the service ran was renamed by hand
    inside releases/; status said the service ran the new name "not current" and named
    `ops service restart`, which was refused. It says which release runs, from where, and how
    to put it back."""
    r1, r2 = ops.two_releases()
    renamed = "20200101T000000Z-" + r2.rsplit("-", 1)[1]
    (ops.root / "releases" / r2).rename(ops.root / "releases" / renamed)
    code, st = ops.json("service", "status", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert st["state"] == "active", st
    assert f"runs releases/{renamed}, whose release.json is release {r2}'s" in warned, warned
    assert f"mv -T releases/{renamed} releases/{r2} puts it back" in warned, warned
    assert "ops service restart runs current" not in warned, warned
    (ops.root / "releases" / renamed).rename(ops.root / "releases" / r2)
    code, st = ops.json("service", "status", "local")
    assert code == 0 and not st.get("warnings"), st


def test_a_current_made_a_file_by_hand_names_the_release_that_runs(ops: Ops) -> None:
    """probe37ao L5 (low): with `current` replaced by a regular file, status said a restart
    would be refused, but not which release the service runs nor the way back. It names both,
    and that way back works."""
    r1, r2 = ops.two_releases()
    (ops.root / "current").unlink()
    (ops.root / "current").write_text("not a release\n")
    code, st = ops.json("service", "status", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert f"the service runs release {r2}, but current is a file (made by hand?)" in warned, st
    assert f"ops rollback local --to {r2} makes it current (the file moved aside)" in warned, st
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r2 and ops.serving() == r2
    assert list(ops.root.glob("current.before-*")), "the file is kept aside"


def test_a_stop_then_a_start_never_does_what_a_restart_refuses(ops: Ops) -> None:
    """probe37as M1 (medium): current a --no-restart install that never ran (it crashes at
    start), the service on proven r2. `ops service restart` is refused (no way back), but
    `ops service stop` then `ops service start` made the same move, unwarned, and left the
    host down. The stop warns, status warns, and the start (and a restart of the stopped
    service) is refused without --force, naming the rollback to what it last ran."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", CRASH)
    assert ops.deploy("--no-restart").returncode == 0
    bad = ops.current()
    code, st = ops.json("service", "stop", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert code == 0 and st["state"] == "inactive", st
    said = f"current ({bad}) never passed a post-flight, and the service last ran {r2}"
    assert said in warned and "an operator's start is refused without --force" in warned, st
    code, st = ops.json("service", "status", "local")
    assert f"a start would be refused: {said}" in flat(" ".join(st.get("warnings", []))), st
    for verb in ("start", "restart"):
        res = ops("service", verb, "local")
        text = flat(res.stdout + res.stderr)
        assert res.returncode != 0 and said in text, text
        assert "ops rollback local --to the release it last ran" in text, text
        assert ops.json("service", "status", "local")[1]["state"] == "inactive"
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r2 and ops.serving() == r2
    # a stop and a start of a proven current: nothing said, nothing refused
    code, st = ops.json("service", "stop", "local")
    assert code == 0 and not st.get("warnings"), st
    assert ops("service", "start", "local").returncode == 0 and ops.serving() == r2


def test_a_current_linked_to_nothing_by_hand_is_no_bar_to_what_serves(ops: Ops) -> None:
    """probe37as L1 (low): `current` a link to nothing, made by hand, the service on proven
    r2 and `previous` a release that never passed a post-flight: a plain rollback refused
    ("a failed rollback could not come back to current"), naming a restart onto another
    release, where with `current` removed it adopted what serves. It adopts here too (no
    restart), and status names the release that runs."""
    r1, r2 = ops.two_releases()
    (ops.root / "releases" / r1 / "proven.json").unlink()  # previous: never proven
    before = pid(ops)
    link = ops.root / "current"
    link.unlink()
    link.symlink_to("nowhere")
    code, st = ops.json("service", "status", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert f"the service runs release {r2}, but current is no directory" in warned, st
    assert f"ops rollback local --to {r2} makes it current" in warned, st
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0, said
    assert ops.current() == r2 and ops.serving() == r2 and pid(ops) == before, said


def test_a_restart_refused_for_a_current_linked_to_nothing_names_the_rollback_that_adopts(
    ops: Ops,
) -> None:
    """probe37bc M1 (medium): `current` a link to nothing, made by hand, the service on proven
    r2. `ops service restart` was refused (right), but named `ops service stop`, then `ops
    rollback --to ID`: an outage nobody needed, where `ops rollback --to r2` alone makes what
    serves current with no restart. The refusal names that rollback; followed, the host is on
    r2 with the same process, and a restart then goes through."""
    r1, r2 = ops.two_releases()
    before = pid(ops)
    link = ops.root / "current"
    link.unlink()
    link.symlink_to("nowhere")
    res = ops("service", "restart", "local")
    said = flat(res.stdout + res.stderr)
    assert res.returncode != 0 and pid(ops) == before, said
    assert f"the service runs release {r2}, but current is no directory" in said, said
    assert f"ops rollback local --to {r2} makes it current" in said, said
    assert "ops service stop" not in said, said
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0 and "not restarted" in said, said
    assert ops.current() == r2 and ops.serving() == r2 and pid(ops) == before, said
    res = ops("service", "restart", "local")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.serving() == r2 and pid(ops) != before


@pytest.mark.parametrize("how", ["renamed", "damaged"])
def test_a_rollback_never_stops_a_service_it_could_not_come_back_to(ops: Ops, how: str) -> None:
    """probe37at H1, H2 (high), M1: the service on proven r2, then r2's directory renamed inside
    releases/ (H1), or r2's release.json damaged (H2): nothing could start what serves again,
    yet a rollback stopped it, and when its release failed to start the host was left down;
    the deploy's refusal named that very rollback. Both now refuse before anything stops and
    name the way that keeps a way back: the mv that puts a renamed directory back, or a stop
    made knowingly first."""
    r1, r2 = ops.two_releases()
    before = pid(ops)
    home = ops.root / "releases" / r2
    if how == "renamed":
        home.rename(ops.root / "releases" / "junk")
    else:
        (home / "release.json").write_text("{")
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", "def main() -> None:\n\n")
    res = ops.deploy("--force")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "current: FAIL" in said and pid(ops) == before, said
    if how == "renamed":
        assert f"mv -T {ops.root}/releases/junk {home} puts it back" in said, said
    for to in ((), ("--to", r1)):
        res = ops("rollback", "local", *to, "--max-tokens", "3")
        said = flat(res.stdout + res.stderr)
        assert res.returncode == 2 and "a rollback would stop it with no way back" in said, said
        assert pid(ops) == before, said
    if how == "renamed":
        assert f"mv -T {ops.root}/releases/junk {home} puts it back" in said, said
        (ops.root / "releases" / "junk").rename(home)
    else:
        assert (
            f"mend current first; or ops service stop local, then ops rollback local --to {r1}"
            in (said)
        ), said
        assert ops("service", "stop", "local").returncode == 0
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r1 and ops.serving() == r1


def test_a_plain_rollback_from_a_current_that_is_a_file_names_the_rollback_that_adopts(
    ops: Ops,
) -> None:
    """probe37aw L2 (low): `current` replaced by a regular file while the service served r2: a
    plain rollback was refused naming only a mend or a stop first (an outage), though `ops
    service status` named `ops rollback --to r2`, which makes what serves current with no
    restart. The refusal names that rollback too; followed, the host is on r2 and current again
    (the file moved aside), and a plain rollback then goes to r1."""
    r1, r2 = ops.two_releases()
    before = pid(ops)
    (ops.root / "current").unlink()
    (ops.root / "current").write_text("not a release\n")
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 2 and pid(ops) == before, said
    assert f"ops rollback local --to {r2} makes what the service runs current" in said, said
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r2 and ops.serving() == r2
    res = ops("rollback", "local", "--max-tokens", "3")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r1 and ops.serving() == r1


def test_two_release_directories_swapped_by_hand_name_a_way_back_that_nests_nothing(
    ops: Ops,
) -> None:
    """probe37ax M1 (medium): r1's and r2's directories swapped by hand while the service ran
    r2: the refusals and status named `mv releases/r1 releases/r2`, which, releases/r2 being
    there, moved r1 inside it (releases/r2/r1): the proven r1 was gone from releases/. The
    way named moves the taken directory aside first, with `mv -T` (which never nests);
    followed, both releases are back and the service never stopped."""
    r1, r2 = ops.two_releases()
    before = pid(ops)
    rel = ops.root / "releases"
    (rel / r2).rename(rel / "swap")
    (rel / r1).rename(rel / r2)
    (rel / "swap").rename(rel / r1)
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "current: FAIL" in said and pid(ops) == before, said
    assert f"{rel / r2} is taken by another directory" in said, said
    code, st = ops.json("service", "status", "local")
    warned = flat(" ".join(st.get("warnings", [])))
    assert f"releases/{r2} is taken by another directory (swapped by hand?)" in warned, warned
    for cmd in (
        ["mv", "-T", f"releases/{r2}", f"releases/{r2}.aside"],
        ["mv", "-T", f"releases/{r1}", f"releases/{r2}"],
        ["mv", "-T", f"releases/{r2}.aside", f"releases/{r1}"],
    ):
        subprocess.run(cmd, cwd=ops.root, check=True)
    code, doc = ops.json("releases", "local")
    assert {r["id"]: r["damaged"] for r in doc["releases"]} == {r1: None, r2: None}, doc
    assert ops.current() == r2 and ops.serving() == r2 and pid(ops) == before
