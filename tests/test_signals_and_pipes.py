"""A deploy whose console reader is gone, or whose operator's session drops (probe37c C4, C5).

`ops deploy ... 2>&1 | head`: once head exits, every write to ops's stdout and stderr fails
(EPIPE). The deploy must go on to its true end: exit 0, the release current and serving, the
record ok (it used to exit 1 mid-deploy with a record that said `crashed`, exit 4). SIGHUP (the
operator's terminal or SSH session closing) and SIGQUIT stop a deploy as Ctrl-C does: the guard
puts the host back, the record is finished (interrupted, 130) instead of `running` forever.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from helpers import REPO
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, steps


def _closed_pipe() -> int:
    """The write end of a pipe whose reader is gone: every write to it fails with EPIPE."""
    r, w = os.pipe()
    os.close(r)
    return w


def deploy_with_no_reader(ops: Ops, *extra: str) -> int:
    """`ops deploy` with stdout and stderr a pipe whose reader is gone: its exit code."""
    w = _closed_pipe()
    try:
        return subprocess.run(
            ops.argv(*ops.deploy_args(*extra)),
            stdout=w,
            stderr=w,
            env=ops.env,
            cwd=REPO,
            timeout=180,
        ).returncode
    finally:
        os.close(w)


def test_a_deploy_whose_reader_is_gone_finishes_with_its_true_exit_code(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", "DELAY = 0  # r2")
    code = deploy_with_no_reader(ops)
    rec = ops.record("deploy")
    assert code == 0, rec
    assert rec["outcome"] == "ok" and rec["exit_code"] == 0, rec
    r2 = ops.current()
    assert r2 != r1 and ops.serving() == r2
    assert steps(rec["results"][0])["postflight"] == "ok"

    # a failing deploy with no reader: its rollback runs, exit 1 (NO-GO), the record says so
    # (wrong answers fail the post-flight at once; a service that never answers takes the
    # checks' request timeout, a minute, to fail the same way)
    commit_change(ops.src, "engine/svc.py", 'default="ok"', 'default="garbage"')
    code = deploy_with_no_reader(ops, "--wait", "5")
    rec = ops.record("deploy")
    assert code == 1 and rec["exit_code"] == 1, rec
    res = rec["results"][0]
    assert steps(res)["rollback"] == "ok" and ops.current() == r2 and ops.serving() == r2


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_hangup_and_quit_stop_a_deploy_as_ctrl_c_does(ops: Ops, sig: int) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", 'default="ok"', 'default="hang"')
    code, _out, err, _took = ops.interrupt_at("postflight ...", "local", sig=sig)
    assert code == 130, err
    assert ops.current() == r1 and ops.serving() == r1
    assert not ops.guard_alive()
    rec = ops.record("deploy")
    assert rec["outcome"] == "interrupted" and rec["exit_code"] == 130, rec
    res = rec["results"][0]
    assert res["outcome"] == "interrupted" and res["failed_step"] == "postflight"
    assert steps(res)["switch"] == "ok" and res["after"] == r1
    assert "switched current back" in err
    # probe37u U6 (low): said as a Ctrl-C nobody pressed; the signal is named
    assert f"interrupted ({signal.Signals(sig).name}) during postflight" in err, err


def test_a_hangup_that_nohup_ignores_stays_ignored(ops: Ops) -> None:
    """Under `nohup` (SIGHUP ignored) a dropped session does not stop the deploy."""
    assert ops.deploy("--bootstrap").returncode == 0
    commit_change(ops.src, "kernels/selftest.py", "DELAY = 0", "DELAY = 0  # r2")
    proc = subprocess.Popen(
        ["nohup", *ops.argv(*ops.deploy_args())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ops.env,
        cwd=REPO,
    )
    try:
        assert proc.stderr is not None
        seen = ""
        while "selftest ..." not in seen:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        proc.send_signal(signal.SIGHUP)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, seen + err
    assert ops.record("deploy")["outcome"] == "ok"
