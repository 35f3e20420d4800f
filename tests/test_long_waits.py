"""No wait on a host is silent past its heartbeat: every host command that runs long says it
still runs and when it is stopped (probe37bf M1: a hung host python held a deploy 5 minutes
after `package: ok`, and a restart onto a service that never answers was silent for its whole
wait; and Ctrl-C then asked the hung host where it was for 5 more minutes). OPS_HEARTBEAT_S
(2 s here) sets the period the tests wait for; 60 s is the default."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, one_error_line, steps

from ops.hosts.remote import still_runs


def hanging_python(ops: Ops) -> Path:
    """The target's `python` from now on: a program that never ends (a hung interpreter)."""
    hang = ops.tmp / "hangpy"
    hang.write_text("#!/bin/bash\nexec sleep 100000\n")
    hang.chmod(0o755)
    ops.inventory.write_text(
        ops.inventory.read_text().replace(
            "[targets.local]\n", f"[targets.local]\npython = '{hang}'\n"
        )
    )
    return hang


def test_a_hung_host_python_is_said_each_beat_by_a_deploy_and_by_releases(ops: Ops) -> None:
    ops.two_releases()
    hanging_python(ops)
    ops.env["OPS_HEARTBEAT_S"] = "2"
    for args, said in (
        (ops.deploy_args(), "releases list still runs (2 s; stopped at 300 s)"),
        (("releases", "local"), "releases list on local still runs (2 s; stopped at 300 s)"),
    ):
        t0 = time.monotonic()
        proc, seen = ops.popen_at("still runs", *args)
        assert said in seen and time.monotonic() - t0 < 30, seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # asked where the host is: 30 s at most
        assert proc.returncode == 130, seen + out + err
        if args[0] == "deploy":
            text = " ".join(err.split())
            assert "could not ask the host where it is" in text, text
            assert "did not finish in 30 s" in text, text


def test_a_restart_onto_a_service_that_never_answers_says_it_still_waits(ops: Ops) -> None:
    r1, r2 = ops.two_releases()
    commit_change(  # the next release's service lives, but never opens its port
        ops.src,
        "engine/svc.py",
        "def main() -> None:\n",
        "def main() -> None:\n    __import__('time').sleep(100000)\n",
    )
    ops.env["OPS_HEARTBEAT_S"] = "2"
    res = ops.deploy("--wait", "8")
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 1, text
    assert "restart still runs (2 s; stopped at " in text, text
    assert "restart still runs (6 s; stopped at " in text, text  # each beat, not once
    result = ops.record("deploy")["results"][0]
    assert steps(result)["restart"] == "fail" and ops.current() == r2, result


def test_a_heartbeat_that_is_no_period_is_refused_in_one_line(ops: Ops) -> None:
    for bad in ("abc", "0", "nan", "1e9"):
        ops.env["OPS_HEARTBEAT_S"] = bad
        line = one_error_line(ops("releases", "local"))
        assert "OPS_HEARTBEAT_S" in line and "from 1 to 3600" in line, line


def test_a_restart_not_waited_for_is_started_not_failed(ops: Ops) -> None:
    """probe37be L2: `ops service restart --wait 0` called a service still starting "failed",
    exit 1, though it served a moment later."""
    commit_change(
        ops.src,
        "engine/svc.py",
        "def main() -> None:\n",
        "def main() -> None:\n    __import__('time').sleep(4)\n",
    )
    assert ops.deploy("--bootstrap").returncode == 0
    code, st = ops.json("service", "restart", "local", "--wait", "0")
    assert code == 0 and st["state"] == "activating", st
    assert "/health not waited for (--wait 0)" in st["detail"], st
    assert ops.serving() == ops.current()


def test_a_heartbeat_past_its_bound_says_the_stop_is_under_way() -> None:
    """probe37bg M3: a command past its bound (a connection's own wait before it) was said
    "(77 s; stopped at 60 s)", a stop that had not happened."""
    assert still_runs("x", 30, 60) == "x still runs (30 s; stopped at 60 s)"
    assert still_runs("x", 77, 60) == "x still runs (77 s; past its 60 s: being stopped)"
