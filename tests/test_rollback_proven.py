"""probe37ab H1, M1, M3: a release that passed a post-flight stays open to `rollback --to`, a
failed rollback says whether the service serves as the host says it, a golden set is never
recorded from a host mid-change, and a refused restart reports the service as it is.

- H1: `ops rollback --wait 1` onto a proven release whose engine takes longer to answer: its
  restart "failed", and the rollback marked that proven release rejected for good; every
  `ops rollback --to` it was then refused until rejected.json was deleted by hand. The same
  came of a golden set recorded (`ops healthcheck --record-golden`, which took no lock) from a
  deploy's release before its post-flight: each later rollback failed token identity and
  marked the release it went to rejected. The host side never marks a proven release
  rejected (said in the result), and `--record-golden` takes the host lock and refuses while
  a switch is unproven (deploy.pending).
- M1: a rollback whose checks failed on a service that serves (token identity; or /health a
  moment after a short --wait) said "its service does not serve" and sent the operator to
  `ops service start`. The host is asked.
- M3: `ops service restart --json` refused before it touched anything reported a running,
  healthy service as "failed", healthy false, pid null.

Real processes throughout: the `ops` CLI, the host-side scripts, the stand-in service of
tests/helpers/deploy_ops.py on its own root and port.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, steps

from checks.identity import digest

SLOW_START = "def main() -> None:\n    __import__('time').sleep(4)\n"


def flat(text: str) -> str:
    return " ".join(text.split())


def releases(ops: Ops) -> dict[str, dict]:
    code, doc = ops.json("releases", "local")
    assert code == 0, doc
    return {r["id"]: r for r in doc["releases"]}


def test_a_rollback_cut_short_by_its_wait_keeps_a_proven_release_open(ops: Ops) -> None:
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_START)
    assert ops.deploy("--bootstrap").returncode == 0
    slow = ops.current()
    commit_change(ops.src, "engine/svc.py", SLOW_START, "def main() -> None:\n")
    assert ops.deploy().returncode == 0
    fast = ops.current()
    assert releases(ops)[slow]["proven"] and releases(ops)[fast]["proven"]

    res = ops("rollback", "local", "--wait", "1")  # the slow one answers after 4 s
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and ops.current() == fast, said
    # (still starting when --wait ran out; proven besides: the host side keeps it either way)
    assert f"{slow} was not marked rejected: it was still starting when --wait 1 s" in said
    assert releases(ops)[slow]["rejected"] is None

    res = ops("rollback", "local", "--to", slow)  # with time to answer, it is taken
    assert res.returncode == 0, flat(res.stdout + res.stderr)
    assert ops.current() == slow and ops.serving() == slow


def test_a_rollback_failing_identity_on_a_serving_service_says_it_serves(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    golden = ops.root / "golden" / "golden.json"
    doc = json.loads(golden.read_text())
    for prompt in doc["prompts"]:  # a golden set that neither release answers
        prompt["token_ids"] = [t + 1 for t in prompt["token_ids"]]
    doc["digest"] = digest(doc["prompts"])  # (as if recorded so: one edited is damaged)
    golden.write_text(json.dumps(doc))

    res = ops("rollback", "local")
    said = flat(res.stdout + res.stderr)
    result = ops.record("rollback")["results"][0]
    assert res.returncode == 1 and steps(result).get("rollback") == "fail", said
    msg = flat(result["message"])
    assert f"current is back on {r2} and its service runs (pid " in msg, msg
    assert "/health ok now), but it failed the rollback's checks" in msg, msg
    assert "does not serve" not in msg and "ops healthcheck local" in msg, msg
    assert f"{r1} was not marked rejected: it passed a post-flight before" in msg, msg
    assert ops.current() == r2 and ops.serving() == r2
    listed = releases(ops)
    assert listed[r1]["rejected"] is None and listed[r2]["rejected"] is None, listed


def test_a_golden_set_is_not_recorded_from_a_host_mid_change(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    golden = ops.root / "golden" / "golden.json"
    kept = golden.read_bytes()
    (ops.root / "deploy.pending").write_text("{}")  # a switch not proven yet
    code, doc = ops.json("healthcheck", "local", "--record-golden")
    assert code == 2 and "a switch is not proven yet (deploy.pending)" in doc["message"], doc
    assert golden.read_bytes() == kept
    (ops.root / "deploy.pending").unlink()
    note = {"user": "t", "host": "h", "pid": 1, "purpose": "ops deploy", "since": "now"}
    with open(ops.root / "lock", "a") as lock:  # a deploy holds the host lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        (ops.root / "lock.holder").write_text(json.dumps(note) + "\n")
        code, doc = ops.json("healthcheck", "local", "--record-golden")
        assert code == 2 and "host lock held by" in doc["message"], doc
        assert golden.read_bytes() == kept
        (ops.root / "lock.holder").unlink()
    code, doc = ops.json("healthcheck", "local", "--record-golden")
    assert code == 0 and doc["ok"], doc


def test_a_refused_restart_reports_the_service_as_it_is(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    code, st = ops.json("service", "status", "local")
    assert code == 0 and st["state"] == "active", st
    (ops.root / "deploy.pending").write_text("{}")
    code, refused = ops.json("service", "restart", "local")
    assert code == 1 and refused["blocked_by"] == "pending-unreadable", refused
    assert refused["state"] == "active" and refused["healthy"] is True, refused
    assert refused["pid"] == st["pid"] and "not started: " in refused["detail"], refused
    res = ops("service", "restart", "local")
    assert res.returncode == 1 and ": refused not started: " in flat(res.stdout), res.stdout


def test_a_deploy_cut_short_by_its_wait_goes_back_and_rejects_nothing(ops: Ops) -> None:
    """probe37ac M1 (medium): `ops deploy --wait 1` of a good release whose engine answers
    after a few seconds: its restart failed the wait, the revert's restart of the release
    before failed the same 1 s, the host (serving a moment later) was said not to serve, and
    the good release was marked rejected for good. A revert waits at least the default; a
    release still starting when a short --wait ran out is not marked rejected (said)."""
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", SLOW_START)
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy("--wait", "1")
    said = flat(res.stdout + res.stderr)
    result = ops.record("deploy")["results"][0]
    assert res.returncode == 1 and result["outcome"] == "rolled-back", said
    assert steps(result)["restart"] == "fail" and steps(result)["rollback"] == "ok", said
    r2 = result["release"]
    assert "does not serve" not in said, said
    assert f"{r2} was not marked rejected: it was still starting when --wait 1 s ran out" in said
    assert ops.current() == r1 and ops.serving() == r1
    assert releases(ops)[r2]["rejected"] is None


def test_a_golden_set_is_not_written_through_a_hand_made_link(ops: Ops, tmp_path: Path) -> None:
    """probe37ac L2: `golden/` made a symlink by hand: --record-golden wrote the golden set
    wherever it pointed, outside the root. It is refused, naming the link."""
    assert ops.deploy("--bootstrap").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ops.root / "golden").rename(ops.root / "golden.kept")
    (ops.root / "golden").symlink_to(elsewhere)
    code, doc = ops.json("healthcheck", "local", "--record-golden")
    assert code == 2 and f"{ops.root / 'golden'} is a symlink (to {elsewhere})" in doc["message"]
    assert list(elsewhere.iterdir()) == []


def test_no_golden_set_is_read_through_a_hand_made_link(ops: Ops, tmp_path: Path) -> None:
    """probe37bo M1 (medium): `golden/` a symlink made by hand: the golden set was read through
    it (one outside the root judged the service and passed), and a file there that was no golden
    set was "damaged", with a re-record named as the way on, which is refused through the link.
    Nothing is read through it either: the healthcheck and the deploy's pre-flight name the
    link and its fix (make it a directory, then record), and that way works."""
    assert ops.deploy("--bootstrap").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    (ops.root / "golden").rename(elsewhere)  # a whole golden set, read through the link before
    (ops.root / "golden").symlink_to(elsewhere)
    link = f"{ops.root / 'golden'} is a symlink (to {elsewhere})"
    fix = f"make {ops.root / 'golden'} a directory (move the link aside), then record"
    code, doc = ops.json("healthcheck", "local", "--max-tokens", "3")
    (identity,) = [c for c in doc["checks"] if c["name"] == "identity"]
    assert code == 1 and identity["status"] == "fail", identity
    assert link in identity["detail"] and fix in identity["detail"], identity
    assert "re-record it" not in identity["detail"], identity
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and link in said and fix in said, said
    assert "re-record it" not in said, said
    (ops.root / "golden").unlink()  # the way it names
    (ops.root / "golden").mkdir()
    assert ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "3")[0] == 0
    assert ops.deploy().returncode == 0


def test_a_bootstrap_deploy_records_no_golden_set_through_a_hand_made_link(
    ops: Ops, tmp_path: Path
) -> None:
    """The same link under a first install: a --bootstrap deploy records the golden set in its
    post-flight, and wrote it through the link as well. Its post-flight fails naming the link,
    and the first install is taken back."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ops.root.mkdir()
    (ops.root / "golden").symlink_to(elsewhere)
    res = ops.deploy("--bootstrap")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and f"{ops.root / 'golden'} is a symlink (to {elsewhere})" in said
    assert list(elsewhere.iterdir()) == [] and ops.current() is None, said


def test_a_plain_rollback_goes_to_other_code_than_current(ops: Ops) -> None:
    """probe37at L3 (low): `previous` never passed a post-flight, so a plain rollback took the
    newest proven release, which ran current's very commit: it restarted onto identical code
    and said "rolled back". It takes the newest proven release of other code, and says so."""
    assert ops.deploy("--bootstrap").returncode == 0
    c1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release A. ')
    assert ops.deploy().returncode == 0
    a1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""Release A. ', '"""Release B. ')
    assert ops.deploy().returncode == 0
    b1 = ops.current()
    assert ops.deploy("--ref", "HEAD~1").returncode == 0  # release A again
    a2 = ops.current()
    assert len({c1, a1, b1, a2}) == 4
    (ops.root / "releases" / b1 / "proven.json").unlink()  # previous: never proven
    res = ops("rollback", "local", "--max-tokens", "3")
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 0 and ops.current() == c1 and ops.serving() == c1, said
    assert "so the newest proven release of other code than current was taken" in said, said
