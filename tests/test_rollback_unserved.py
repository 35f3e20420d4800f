"""probe37ae H1, M1, M2: a rollback comes back to what the service ran, a rollback cut off is
made again to where it was going, and a switch put back onto what the service already runs is
not restarted for nothing.

- H1: after `--no-restart` installs (current and previous never served; the service on the
  proven release before them), a rollback whose target failed to start went back to `current`
  and restarted the service there: down, or on code nobody ran. The rollback first makes the
  release the service runs current (no restart), so a failure comes back to it; a rollback
  `--to` that very release is then only that, proven by a post-flight.
- M1: `ops rollback --to X` killed with its guard: the next plain rollback put the switch back
  and then went to `previous`, not to X, where the operator was going.
- M2: a settled deploy.pending (current already put back) whose restart had been done: status
  said its restart never came, and the next rollback restarted a serving service. One naming
  another release than current was followed all the same.

Real processes throughout: the `ops` CLI, the host-side scripts and guard, the stand-in service
of tests/helpers/deploy_ops.py on its own root and port.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from helpers.deploy import commit_change
from helpers.deploy_ops import (
    Ops,
    kill_guard_and_ops,
    pending_record,
    refuse_with_marker,
    steps,
)


def flat(text: str) -> str:
    return " ".join(text.split())


def pid(ops: Ops) -> int:
    return ops.json("service", "status", "local")[1]["pid"]


def settled_record(ops: Ops, current: str) -> str:
    """A settled deploy.pending (current put back onto `current`, its restart due) written
    as the host side writes it: what `ops service status` warns of it."""
    record = {"settled": True, "current": current, "by": "deploy"}
    (ops.root / "deploy.pending").write_text(json.dumps(record))
    code, st = ops.json("service", "status", "local")
    return flat(" ".join(st.get("warnings", [])))


def two_unserved(ops: Ops) -> tuple[str, str, str, Path]:
    """r1 deployed and serving; c2 and c3 installed after it with --no-restart (current c3,
    previous c2), both failing at start once the marker exists: (r1, c2, c3, marker)."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    marker = refuse_with_marker(ops)
    assert ops.deploy("--no-restart").returncode == 0
    c2 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy("--no-restart").returncode == 0
    c3 = ops.current()
    assert r1 and c2 and c3 and len({r1, c2, c3}) == 3 and ops.serving() == r1
    return r1, c2, c3, marker


def test_a_failed_rollback_over_unserved_installs_comes_back_to_what_served(ops: Ops) -> None:
    r1, c2, c3, marker = two_unserved(ops)
    marker.write_text("")  # c2 and c3 now exit at start; r1 does not
    res = ops("rollback", "local", "--to", c2, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    result = ops.record("rollback")["results"][0]
    assert res.returncode == 1, said
    assert steps(result).get("adopt") == "ok" and steps(result).get("restart") == "fail", said
    # before: back to c3 (never served), restarted there: down
    assert ops.current() == r1 and ops.serving() == r1, said
    assert f"the rollback to {c2} was undone: {r1}, where it started, is current again" in said
    assert (ops.root / "previous").is_symlink()


def test_a_plain_rollback_over_unserved_installs_stops_at_what_serves(ops: Ops) -> None:
    """probe37ai H1: after two --no-restart installs, a plain rollback adopted the release the
    service ran and then went on to `previous`, the first install, which had never served:
    forward onto code nobody ran, called "rolled back". A plain rollback goes back, never
    forward: it stops at what serves, and names `--to` for the other."""
    r1, c2, c3, _ = two_unserved(ops)
    before = pid(ops)
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0, said
    # (probe37ap L5: named so, of a `previous` the adopt has moved since)
    stopped = f"previous, as it was ({c2}), never passed a post-flight, so the rollback stopped"
    assert stopped in said, said
    assert f"ops rollback local --to {c2} goes there" in said, said
    assert ops.current() == r1 and pid(ops) == before


def test_a_rollback_to_the_release_the_service_runs_does_not_restart_it(ops: Ops) -> None:
    r1, c2, c3, _ = two_unserved(ops)
    before = pid(ops)
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    result = ops.record("rollback")["results"][0]
    assert res.returncode == 0 and result["outcome"] == "switched", said
    assert "restart" not in steps(result), result["steps"]
    assert f"the service already ran {r1}: not restarted" in said, said
    assert ops.current() == r1 and pid(ops) == before
    code, st = ops.json("service", "status", "local")
    assert not any("not current" in w for w in st.get("warnings", [])), st


def test_a_plain_rollback_after_a_killed_rollback_to_ends_on_its_target(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy().returncode == 0
    r3 = ops.current()  # previous: r2
    kill_guard_and_ops(ops, "postflight", verb="rollback", extra=("--to", r1))
    record = json.loads((ops.root / "deploy.pending").read_text())
    assert record["by"] == "rollback" and record["new"] == r1, record
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0, said
    # before: the switch was undone, then made to previous (r2), not where it was going
    assert ops.current() == r1 and ops.serving() == r1, said
    assert f"an earlier rollback to {r1}, cut off, was made again" in said, said
    assert r3 != r1


def test_a_cut_off_rollback_to_a_release_rejected_since_is_not_made_again(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    before = pid(ops)
    # a rollback to r1 switched, r1's restart failed (rejected), and it died putting r2 back
    (ops.root / "deploy.pending").write_text(
        json.dumps(pending_record(r2, r1, by="rollback", old_previous=r1))
    )
    (ops.root / "current").unlink()
    (ops.root / "current").symlink_to(f"releases/{r1}")
    (ops.root / "releases" / r1 / "rejected.json").write_text('{"step": "restart"}')
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1, said
    assert f"{r1} was rejected, so it was not made again" in said, said
    # put back onto r2, which the service runs all along: not restarted (M2)
    assert ops.current() == r2 and pid(ops) == before, said
    assert "the service already runs it: not restarted" in said, said


def test_a_settled_put_back_the_service_already_runs_is_not_restarted(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    before = pid(ops)
    warned = settled_record(ops, r2)
    assert "the service runs it (its restart was done)" in warned, warned
    assert "died before restarting" not in warned, warned
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0, said
    assert "the service already ran it, and its record was cleared" in said, said
    assert f"current {r2} -> {r2}" not in said, said  # (probe37ah L3: no put-back onto itself)
    assert ops.current() == r2 and pid(ops) == before
    assert not (ops.root / "deploy.pending").exists()


def test_a_settled_record_naming_another_release_is_set_aside(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    warned = settled_record(ops, r1)
    assert f"names a put-back onto {r1}, but current is {r2}: a stale record" in warned, warned
    res = ops("service", "restart", "local")
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == r2
    before = pid(ops)
    res = ops("rollback", "local", "--to", r2, "--max-tokens", "3")  # already current
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0 and "already current" in said, said
    assert f"says current was put back on {r1}, but current is {r2}" in said, said
    assert ops.current() == r2 and pid(ops) == before
    assert list(ops.root.glob("deploy.pending.refused-*"))


def stopped_over_unserved(ops: Ops, both: bool = False) -> tuple[str, str, Path]:
    """r1 deployed and proven; c2 installed after it with --no-restart (never served, fails at
    start once the marker exists; with `both`, r1 too); the service then stopped
    (maintenance): (r1, c2, marker)."""
    marker = refuse_with_marker(ops) if both else ops.tmp / "refuse-start"
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    if both:
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    else:
        refuse_with_marker(ops)
    assert ops.deploy("--no-restart").returncode == 0
    c2 = ops.current()
    assert r1 and c2 and r1 != c2
    ops.stop()
    return r1, c2, marker


def test_a_killed_rollback_from_an_unserved_current_leaves_its_release_serving(ops: Ops) -> None:
    """probe37ag H2 (high): ops killed after a `rollback --to` a proven release had restarted
    the service on it (the service was stopped, current a --no-restart install that never
    served): its guard switched back to that current and restarted the service there: down.
    Such a switch has nothing to go back to, and is made final at once."""
    r1, c2, marker = stopped_over_unserved(ops)
    marker.write_text("")  # c2 fails at start; r1 (made before the marker's check) does not
    proc, seen = ops.popen_at(
        "postflight ...", "rollback", "local", "--to", r1, "--max-tokens", "3"
    )
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while ops.guard_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "no way back" in seen, seen
    assert ops.current() == r1 and ops.serving() == r1, seen
    assert not (ops.root / "deploy.pending").exists()


def test_a_rollback_killed_with_its_guard_from_an_unserved_current_is_not_put_back(
    ops: Ops,
) -> None:
    """probe37ag H1 (high): the same rollback killed with its guard: the next plain rollback's
    recover put the switch back onto the never-served current and restarted the service there:
    down, and every later plain rollback failed the same way. No record is left to put back:
    the host stays on the release that serves, and a plain rollback is an ordinary one."""
    r1, c2, marker = stopped_over_unserved(ops)
    marker.write_text("")
    kill_guard_and_ops(ops, "postflight", verb="rollback", extra=("--to", r1))
    assert not (ops.root / "deploy.pending").exists()
    assert ops.current() == r1 and ops.serving() == r1
    # previous (c2) never served: a plain rollback does not go there (probe37ak M2); no
    # recover step either
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 2 and "recover" not in said, said
    assert f"previous ({c2}) never passed a post-flight, and no other release did" in said
    assert ops.current() == r1 and ops.serving() == r1, said


def test_a_failed_rollback_with_no_way_back_says_where_it_stays(ops: Ops) -> None:
    r1, c2, marker = stopped_over_unserved(ops, both=True)
    (ops.root / "releases" / r1 / "proven.json").unlink()  # r1: as if it never served either
    marker.write_text("")  # every release fails at start now
    res = ops("rollback", "local", "--to", r1, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1, said
    assert f"current stays {r1}: current before it, {c2}, never passed a post-flight" in said
    assert "so there was nothing to go back to; the service is now" in said, said
    assert ops.current() == r1 and not (ops.root / "deploy.pending").exists()


def test_a_dead_no_restart_deploys_switch_is_put_back_without_a_restart(ops: Ops) -> None:
    """probe37ah H1 (high): r1 serving; c2 installed with --no-restart (never ran, fails at
    start); a second --no-restart deploy (c3) killed with its guard after its switch. The next
    plain rollback's recover put current back onto c2 and restarted the serving service there:
    down, and every later plain rollback failed the same way. A put-back onto a release that
    never passed a post-flight, while the service serves a third, does not restart it; the
    rollback then makes what serves current."""
    r1, c2, c3, marker = two_unserved(ops)
    # what the killed deploy of c3 leaves: its switch recorded, never made final
    record = pending_record(c2, c3, old_previous=r1)
    (ops.root / "deploy.pending").write_text(json.dumps(record))
    marker.write_text("")
    before = pid(ops)
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0, said
    assert f"the service runs {r1}, and {c2} never passed a post-flight" in said, said
    assert ops.current() == r1 and pid(ops) == before, said
    assert not (ops.root / "deploy.pending").exists()


def test_a_rollback_to_a_current_the_service_does_not_run_goes_there_with_a_way_back(
    ops: Ops,
) -> None:
    """probe37ak M1: `rollback --to C`, C current but installed with --no-restart (the service
    on r1), said "already current", exit 0; with the service stopped, the same, silent. Asked
    for C, the host ends on C: what serves is made current first (a way back), then C is
    switched to, restarted and proven. With no service running it is exit 1, naming the
    start."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy("--no-restart").returncode == 0
    c2 = ops.current()
    assert ops.serving() == r1
    res = ops("rollback", "local", "--to", c2, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    result = ops.record("rollback")["results"][0]
    assert res.returncode == 0 and result["outcome"] == "switched", said
    assert steps(result).get("adopt") == "ok" and steps(result).get("postflight") == "ok", said
    assert ops.current() == c2 and ops.serving() == c2, said
    assert (ops.root / "releases" / c2 / "proven.json").exists()
    ops.stop()  # maintenance: current is what was asked for, but nothing serves it
    res = ops("rollback", "local", "--to", c2, "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1, said
    assert f"release {c2} is already current, but its service is inactive" in said, said
    assert "ops service start local" in said and ops.current() == c2, said
    code, st = ops.json("service", "status", "local")
    assert st["state"] == "inactive", st  # the rollback started nothing


def test_a_plain_rollback_never_goes_to_a_previous_that_never_served(ops: Ops) -> None:
    """probe37ak M2: after a --no-restart install was left by an adopt, `previous` named it
    (never served), and the next plain rollback "moved forward" onto it, restarting the service
    on code nobody ran (down, where it failed at start). A plain rollback takes the newest
    proven release instead, said; with none, it is refused, naming `--to`."""
    r1, r2 = ops.two_releases()
    marker = refuse_with_marker(ops)
    assert ops.deploy("--no-restart").returncode == 0
    c3 = ops.current()
    marker.write_text("")  # c3 fails at start (r1 and r2 do not: they predate the guard)
    assert ops("rollback", "local", "--max-tokens", "3").returncode == 0  # adopts r2
    assert ops.current() == r2 and os.readlink(ops.root / "previous") == f"releases/{c3}"
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0, said
    assert f"previous ({c3}) never passed a post-flight, so the newest proven" in said, said
    assert ops.current() == r1 and ops.serving() == r1, said


def test_a_plain_rollback_from_an_edited_current_never_names_a_previous_that_never_served(
    ops: Ops,
) -> None:
    """probe37bo M1 (medium): as above, with current's service.env edited by hand while the
    service runs: the plain rollback was refused (right: a failed one could not come back), but
    its way on was to stop the service and roll back `--to` the previous that never served,
    with no way back, and the proven release was never named. The refusal weighs the newest
    proven release, as the plain rollback would go there."""
    r1, r2 = ops.two_releases()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    assert ops.deploy("--no-restart").returncode == 0
    c3 = ops.current()
    assert ops("rollback", "local", "--to", r2, "--max-tokens", "3").returncode == 0  # adopts
    assert ops.current() == r2 and os.readlink(ops.root / "previous") == f"releases/{c3}"
    env = ops.root / "releases" / r2 / "service.env"
    env.write_text(env.read_text() + "FOO=bar\n")
    before = pid(ops)
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 2 and "Traceback" not in said, said
    assert f"if {r1} then failed to start" in said and f"--to {c3}" not in said, said
    assert ops.current() == r2 and pid(ops) == before  # nothing stopped, nothing switched


def test_a_plain_rollback_with_no_proven_release_to_go_to_is_refused(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy("--no-restart").returncode == 0
    c2 = ops.current()
    assert ops("rollback", "local", "--max-tokens", "3").returncode == 0  # adopts r1
    before = pid(ops)
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode not in (0, 4) and "Traceback" not in said, said
    assert f"previous ({c2}) never passed a post-flight, and no other release did" in said
    assert f"ops rollback local --to {c2}" in said, said
    assert ops.current() == r1 and pid(ops) == before
