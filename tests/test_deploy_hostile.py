"""`ops deploy` / `releases` / `rollback` as a new user types them and as a hostile one does:
user mistakes are one line and exit 2; Ctrl-C (SIGINT) or SIGTERM at any step leaves the host
on its previous release and serving, with a complete record; a release whose service does not
start is rolled back with the service's own error as evidence; the tables fit 80 columns.

The target is `local` with its own remote root and port, the releases the stand-in's
(tests/helpers/deploy_ops.py: `engine/svc.py` is tests/helpers/fake_service.py, run from
`current/`, so a commit can break it; `kernels/selftest.py` a stand-in that passes); each test
commits the change it needs.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from helpers.deploy import commit_change
from helpers.deploy_ops import NOISY_CRASH, Ops, one_error_line, steps

TERM_DEAF = (
    "def main() -> None:\n"
    "    import signal\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    time.sleep(3600)\n"
)
ID = r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{10}"


def test_user_mistakes_are_one_line_and_exit_2(ops: Ops, tmp_path: Path) -> None:
    line = one_error_line(ops.deploy("--ref", "deadbeef0", "--dry-run"))
    assert "--ref deadbeef0" in line and "no such commit" in line
    line = one_error_line(ops.deploy("--ref", os.fsdecode(b"a\xffb"), "--dry-run"))
    assert "--ref 'a\\xffb': no such commit" in line, line  # the byte (probe37bm L2)
    line = one_error_line(ops.deploy("--ref=--output=/tmp/x", "--dry-run"))
    assert "--ref" in line and "not a git revision" in line
    plain = tmp_path / "plain"
    plain.mkdir()
    for bad in (plain, ops.inventory):
        res = ops("deploy", "local", "--source", str(bad), "--dry-run")
        line = one_error_line(res)
        assert f"--source {bad}" in line and ("not a git checkout" in line or "directory" in line)
    line = one_error_line(ops("rollback", "fleet"))
    assert "'fleet' is a group" in line and "one target" in line, line
    line = one_error_line(ops("deploy", "nosuch"))
    assert "unknown target or group 'nosuch'" in line and "fleet" in line
    assert not ops.root.exists()


def test_new_user_story_at_80_columns(ops: Ops) -> None:
    res = ops.deploy("--bootstrap")
    assert res.returncode == 0, res.stderr
    r1 = ops.current()
    assert r1 and r1 in res.stdout  # the id whole on one line: it can be copied into --to
    assert "current: (none) -> " + r1 in res.stderr
    assert re.search(r"record: \S+-deploy-local/record.json\n", res.stderr)  # never wrapped
    golden = json.loads((ops.root / "golden" / "golden.json").read_text())
    assert golden["max_tokens"] == 3  # --max-tokens reaches the checks
    assert ops.record("deploy")["inputs"]["max_tokens"] == 3
    # pre-flight refuses a dead service (--bootstrap is no way around it once a release is
    # current) and the result says where the host is; --force is visible
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    res = ops.deploy("--dry-run")  # the plan says what it would switch from; touches nothing
    assert res.returncode == 0 and f"current: {r1} -> releases/" in res.stdout, res.stdout
    assert "service.env: DDTREE_RELEASE_ID=" in res.stdout and ops.current() == r1
    ops.stop()
    res = ops.deploy("--bootstrap")
    assert res.returncode == 1 and "(ops service start local) and deploy again" in res.stdout
    assert ops.record("deploy")["results"][0]["before"] == r1
    res = ops.deploy("--force")
    assert res.returncode == 0, res.stderr
    assert "preflight:forced" in res.stdout
    r2 = ops.current()
    assert r2 != r1 and r2 in res.stdout and r1 in res.stdout
    res = ops("releases", "local")
    assert res.returncode == 0 and r1 in res.stdout and r2 in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    # a rollback says it is one, and where its record is
    res = ops("rollback", "local")
    assert res.returncode == 0 and ops.current() == r1, res.stderr
    assert "rollback" in res.stdout and "deployed" not in res.stdout
    assert re.search(r"record: \S+-rollback-local/record.json", res.stderr)
    rec = ops.record("rollback")
    assert rec["outcome"] == "switched"
    assert "prune" not in steps(rec["results"][0])  # a rollback deletes no release


def test_interrupts_before_and_after_the_switch(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    assert ops.serving() == r1
    # Ctrl-C in the self-test (before the switch): nothing changed, the record says where
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", "DELAY = 30")
    code, out, err, took = ops.interrupt_at("selftest ...", "local")
    assert code == 130 and took < 10, err
    assert ops.current() == r1 and ops.serving() == r1
    rec = ops.record("deploy")
    assert rec["outcome"] == "interrupted" and rec["exit_code"] == 130
    res = rec["results"][0]
    assert res["outcome"] == "interrupted" and res["failed_step"] == "selftest"
    assert steps(res)["send"] == "ok" and "interrupted" in steps(res)
    assert "interrupted during selftest" in err and r1 in err
    staging = f".staging-{res['release']}"
    assert (ops.root / "releases" / staging).is_dir()  # left for the next deploy to remove
    # SIGTERM after the switch (post-flight hangs): the guard switches back and restarts
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 30", "DELAY = 0")
    commit_change(ops.src, "engine/svc.py", 'default="ok"', 'default="hang"')
    held: list[bool] = []
    code, out, err, took = ops.interrupt_at(
        "postflight ...", "local", sig=signal.SIGTERM, first=lambda: held.append(ops.guard_alive())
    )
    assert code == 130 and took < 15, err
    assert held == [True] and not ops.guard_alive()  # the next deploy waits for a live guard
    assert ops.current() == r1 and ops.serving() == r1
    res = ops.record("deploy")["results"][0]
    assert steps(res)["switch"] == "ok" and res["failed_step"] == "postflight"
    assert res["after"] == r1 and "switched current back" in err
    (send,) = [s for s in res["steps"] if s["name"] == "send"]
    assert send["data"]["cleaned"] == [staging]  # the first interrupt's half-sent release
    # Ctrl-C in a group deploy stops the host's step in progress, not after the wave
    code, out, err, took = ops.interrupt_at("local: postflight ...", "fleet", delay=0.5)
    assert code == 130 and took < 15, err
    assert ops.current() == r1 and ops.serving() == r1
    res = ops.record("deploy")["results"][0]
    assert res["outcome"] == "interrupted" and res["after"] == r1


def test_broken_release_rolls_back_and_interrupted_rollback_still_serves(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    # a release whose service dies at start: restart fails, rollback, its error is evidence
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", NOISY_CRASH)
    res = ops.deploy("--wait", "5")
    assert res.returncode == 1 and ops.current() == r1, res.stderr
    assert "SyntaxError" in res.stderr  # the service's own last words, not its start-up noise
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "restart" and steps(result)["rollback"] == "ok"
    (restart,) = [s for s in result["steps"] if s["name"] == "restart"]
    assert any("SyntaxError" in line for line in restart["evidence"])
    assert ops.serving() == r1
    # it is marked as rejected, and no rollback goes back to it
    r2 = result["release"]
    res = ops("releases", "local")
    assert re.search(rf"rejected +{r2}", res.stdout), res.stdout
    line = one_error_line(ops("rollback", "local", "--to", r2))
    assert f"release {r2} failed its restart" in line
    # a release that never serves and ignores TERM; Ctrl-C while the rollback stops it
    commit_change(ops.src, "engine/svc.py", NOISY_CRASH, TERM_DEAF)
    code, out, err, took = ops.interrupt_at("rollback ...", "local", "--wait", "2", delay=0.5)
    assert code == 130, err
    assert ops.current() == r1 and ops.serving() == r1


def test_an_ops_toml_beside_the_data_plane_does_not_block_a_deploy(ops: Ops) -> None:
    """docs/inventory.md puts ops.toml where `ops` runs, the checkout: an untracked file a
    release does not carry (ops.toml, notes) is no uncommitted change of the release; one in
    the data plane still is."""
    (ops.src / "ops.toml").write_text("# my inventory\n")
    (ops.src / "notes.txt").write_text("todo\n")
    res = ops.deploy("--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    (ops.src / "engine" / "scratch.py").write_text("x = 1\n")
    res = ops.deploy("--dry-run")
    assert res.returncode == 2 and "uncommitted changes (?? engine/scratch.py" in res.stderr
