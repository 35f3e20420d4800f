"""probe37b B9/B13 leftovers: what a deploy says must be what the host is.

- A full disk at the restart: the new release's restart cannot happen and stops nothing, the
  rollback switches current back over the old service that never stopped: its step is ok
  ("restored"), not "FAIL ... service failed; checks pass again".
- A deploy of the release already current over a stopped service says the service does not
  serve and how to start it, and does not exit 0.
- The host lock held by a switch that is not `ops rollback` names its holder for what it is.
- A restart whose result is lost while the host's guard, left alone, put the host back: the
  rollback asks the host where current is instead of saying "nothing to switch back to:
  current is <the new release>". (The probe cut the SSH connection; here, deterministically on
  `local`, the guard is cut off from ops by ending its `cat`, the read of ops's end of the
  link, and then the host-side process of the restart is killed, so its result is lost.)

Real processes throughout: the `ops` CLI, the host-side scripts, the stand-in service of
tests/helpers/deploy_ops.py, a tmpfs for the full disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, steps
from helpers.local import end_services
from test_deploy_unowned import fill, ops_on, small_disk  # noqa: F401 - small_disk: a fixture

SLOW_START = ("engine/svc.py", "def main() -> None:\n", "def main() -> None:\n    time.sleep(4)\n")


def flat(text: str) -> str:
    return " ".join(text.split())


def status(ops: Ops) -> dict:
    return ops.json("service", "status", "local")[1]


def test_full_disk_at_restart_the_rollback_step_says_restored(
    small_disk: Path,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    ops = ops_on(small_disk, tmp_path)
    try:
        assert ops.deploy("--bootstrap").returncode == 0
        r1, pid = ops.current(), status(ops)["pid"]
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
        filled: list[Path] = []
        code, out, err, _ = ops.interrupt_at(
            "switch: ok", "local", sig=0, first=lambda: filled.append(fill(small_disk, 3))
        )
        said = flat(out + err)
        result = ops.record("deploy")["results"][0]
        if steps(result).get("restart") == "ok":
            pytest.skip("the restart found room on the disk this time: nothing to check")
        assert code == 1 and "Traceback" not in said, said
        rollback = next(s for s in result["steps"] if s["name"] == "rollback")
        assert rollback["status"] == "ok", rollback
        assert "restored: its service was never stopped" in rollback["detail"], rollback
        assert f"it still runs {r1} and is healthy" in rollback["detail"], rollback
        assert "rollback: ok" in said and "rollback: FAIL" not in said, said
        assert result["outcome"] == "rolled-back" and f"rolled back to {r1}" in said, said
        assert ops.current() == r1
        st = status(ops)
        assert st["state"] == "active" and st["pid"] == pid, st  # never stopped
    finally:
        end_services(ops.root)


def test_already_current_over_a_stopped_service_says_so(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    ops.stop()
    res = ops.deploy()
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "Traceback" not in said, said
    assert f"release {r1}" in said and "is already current, but its service is inactive" in said
    assert "nothing was installed or started; `ops service start local` starts it" in said, said
    assert status(ops)["state"] == "inactive"  # not started behind the operator's back
    result = ops.record("deploy")["results"][0]
    assert (result["outcome"], result["failed_step"]) == ("failed", "service"), result
    # --no-restart: the service is left alone by design, so nothing is wrong
    res = ops.deploy("--no-restart")
    assert res.returncode == 0 and "already current; nothing to do" in flat(res.stdout), res
    # serving again: the plain no-op it always was
    assert ops("service", "start", "local").returncode == 0
    res = ops.deploy()
    assert res.returncode == 0 and "already current; nothing to do" in flat(res.stdout), res


# The Deployer's rollback as the rollout's measure runs it for its recheck (ops.rollout.switch),
# with the holder it names; the restart of the release it switches to takes 4 s.
RECHECK_SWITCH = """
import sys
from ops.deploy.deploy import Deployer, DeployOptions
from ops.hosts.inventory import load_inventory
from ops.hosts.remote import open_host
from ops.rollout.switch import _holder
inv, to = sys.argv[1], sys.argv[2]
with open_host(load_inventory(inv).target("local")) as host:
    res = Deployer(host, DeployOptions(max_tokens=3), lambda n, s: print(n, flush=True)).rollback(
        to, _holder(to)
    )
print(res.outcome, flush=True)
"""


def test_a_deploy_refused_during_a_measure_switch_names_the_measure(
    ops: Ops, tmp_path: Path
) -> None:
    commit_change(ops.src, *SLOW_START)  # each release's restart takes 4 s
    assert ops.deploy("--bootstrap", "--wait", "30").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    assert ops.deploy("--wait", "30").returncode == 0
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release three. ')
    driver = tmp_path / "switch.py"
    driver.write_text(RECHECK_SWITCH)
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(ops.inventory), r1],
        stdout=subprocess.PIPE,
        text=True,
        env=ops.env,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        while "restart" not in seen:  # the lock is held from before the switch to the end
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        res = ops.deploy("--force")
    finally:
        out, _ = proc.communicate(timeout=120)
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 2 and "host lock held by" in said, said
    assert f"ops rollout measure (switch to {r1})" in said, said
    assert "ops rollback" not in said, said
    assert out.strip().endswith("switched"), seen + out


def _procs() -> list[tuple[int, int, list[str]]]:
    """(pid, parent pid, argv) of every live process."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            argv = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if stat[0] != "Z":
            found.append((int(p), int(stat[1]), argv[:-1]))
    return found


def _wait(cond, seconds: float, what: str):  # noqa: ANN001, ANN202
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if value := cond():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("old", ["fast", "slow"])
def test_a_restart_whose_result_is_lost_asks_where_the_guard_left_the_host(
    ops: Ops, old: str
) -> None:
    """The deploy's restart result lost, the guard put the host back. probe37y M1 (medium):
    the guard's restart is not waited for, and an old release still starting (slow) was said
    "does not serve" though it served seconds later: it is waited for, up to --wait."""
    if old == "slow":
        commit_change(ops.src, *SLOW_START)  # r1 too takes 4 s to answer /health
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    if old == "slow":
        commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    else:
        commit_change(ops.src, *SLOW_START)  # the new release's restart waits 4 s for /health
    guard_mark = f"{ops.root}/deploy.guard"

    pidfile = f"{ops.root}/run/ddtree-engine.pid"

    def cut_off() -> None:
        def restarts() -> list[int]:  # the process manager's restart: the deploy's own, not
            found = {  # the worker it forks (same argv) to do the restart to its end
                p: parent
                for p, parent, argv in _procs()
                if argv[1:3] == ["-S", "-c"] and "restart" in argv and pidfile in argv
            }
            return [p for p, parent in found.items() if parent not in found]

        (restart,) = _wait(restarts, 30, "the deploy's restart on the host")
        procs = _procs()
        guards = {p for p, _, argv in procs if any(guard_mark in a for a in argv)}
        (cat,) = [p for p, parent, argv in procs if argv == ["cat"] and parent in guards]
        os.kill(cat, signal.SIGKILL)  # the guard takes ops for gone: it puts the host back
        _wait(lambda: ops.current() == r1, 30, "the guard's revert")
        os.kill(restart, signal.SIGKILL)  # the deploy's own restart dies: its result is lost

    code, out, err, _ = ops.interrupt_at("restart ...", "local", sig=0, first=cut_off)
    said = flat(out + err)
    # its host-side command killed: exit 2, the host's trouble, not a verdict (probe37at L4)
    assert code == 2 and "Traceback" not in said, said
    assert "nothing to switch back to" not in said, said
    result = ops.record("deploy")["results"][0]
    rollback = next(s for s in result["steps"] if s["name"] == "rollback")
    assert f"current is {r1}: the host's guard put it back" in rollback["detail"], rollback
    assert rollback["status"] == "ok" and "service active" in rollback["detail"], rollback
    assert result["after"] == r1 and f"rolled back to {r1} (by the host's guard)" in said, said
    assert ops.current() == r1 and ops.serving() == r1


# The host-side switch's result lost: the shell ops runs it in is killed (as a dropped SSH
# connection would end it), inside the real `ops` process (the driver wraps subprocess.Popen
# for the one command whose arguments carry MARK; everything else runs as it is). "start": the
# instant it starts. "late": once the switch runs under it (found by its argv, stopped while
# its shell is killed, then let go on), so the switch is made and prints its whole result to
# ops, which sees the shell's exit by a signal (the last landing CI's run met this by chance:
# "switch: refused; current is still R1", though the switch had been made).
KILL_SHELL = """
MARK, WHEN = sys.argv.pop(1), sys.argv.pop(1)

def the_switch(root):
    for p in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if argv[1:3] == [b"-S", b"-c"] and argv[4:6] == [b"switch", root.encode()]:
            return int(p)

def late(shell, root):
    while (pid := the_switch(root)) is None:
        time.sleep(0.001)
    os.kill(pid, signal.SIGSTOP)
    shell.kill()
    shell.wait()
    os.kill(pid, signal.SIGCONT)

class Popen(real):
    def __init__(self, args, *a, **k):
        super().__init__(args, *a, **k)
        if MARK in " ".join(map(str, args)):
            if WHEN == "start":
                self.kill()
            else:
                threading.Thread(target=late, args=(self, MARK.split()[-1]), daemon=True).start()
"""


@pytest.mark.parametrize("when", ["start", "late"])
def test_a_switch_whose_result_is_lost_asks_where_current_is(
    ops: Ops, tmp_path: Path, when: str
) -> None:
    r1, res = ops.second_deploy_driven(KILL_SHELL, [f"' switch {ops.root}", when])
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "Traceback" not in said, said
    result = ops.record("deploy")["results"][0]
    assert result["failed_step"] == "switch" and result["after"] == r1, result
    assert f"current is {r1} (asked of the host once its guard was done)" in said, said
    assert "current is still" not in said, said
    assert ops.current() == r1 and ops.serving() == r1


# ops killed (SIGKILL) the instant before it starts its restart: the switch is made, the
# service never touched (the driver wraps subprocess.Popen; the process manager's restart
# runs under its stop watch, `procman-watch`, which the guard's own restart does not)
KILL_BEFORE_RESTART = """
PIDFILE = sys.argv.pop(1)

class Popen(real):
    def __init__(self, args, *a, **k):
        text = " ".join(map(str, args))
        if "procman-watch" in text and f" restart {PIDFILE} " in text:
            os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(args, *a, **k)
"""


def test_a_guard_leaves_alone_a_service_that_runs_what_it_put_back(
    ops: Ops, tmp_path: Path
) -> None:
    """probe37bl M1 (medium): ops gone after its switch, before its restart: the guard put
    current back and restarted the service, which ran that release all along (with a real
    engine, a model reload nobody needed). The guard now restarts it only where it does not
    run what current is; here its pid stays, and guard.log says it was not restarted."""
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    pid = ops.json("service", "status", "local")[1]["pid"]
    commit_change(ops.src, "engine/svc.py", '"""', '"""Release two. ')
    pidfile = str(ops.root / "run" / "ddtree-engine.pid")
    args = ["deploy", "local", "--source", str(ops.src), "--max-tokens", "3"]
    res = ops.driven(KILL_BEFORE_RESTART, [pidfile], *args, timeout=120)
    assert res.returncode == -signal.SIGKILL, flat(res.stdout + res.stderr)
    deadline = time.monotonic() + 60  # the guard sees ops gone and puts the host back
    while (ops.guard_alive() or (ops.root / "deploy.pending").exists()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert ops.current() == r1 and ops.serving() == r1
    assert ops.json("service", "status", "local")[1]["pid"] == pid  # not restarted
    log = (ops.root / "logs" / "guard.log").read_text()
    assert "ops went away before its switch was proven" in log, log
    assert '"kept": true' in log and "not restarted" in log, log


# Ctrl-C the instant the host's finalize has renamed the release into place, before ops reads
# its answer (the driver wraps subprocess.Popen for the finalize command, watches releases/
# for the new id and sends ops itself SIGINT).
CUT_FINALIZE = """
MARK, ROOT = sys.argv.pop(1), sys.argv.pop(1)

def cut_once_in_place(before):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = set(os.listdir(os.path.join(ROOT, "releases")))
        if any(not n.startswith(".") for n in now - before):
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.001)

class Popen(real):
    def __init__(self, args, *a, **k):
        ours = MARK in " ".join(map(str, args))
        before = set(os.listdir(os.path.join(ROOT, "releases"))) if ours else None
        super().__init__(args, *a, **k)
        if ours:
            threading.Thread(target=cut_once_in_place, args=(before,), daemon=True).start()
"""


def test_a_finalize_cut_after_its_rename_names_the_release_in_place(
    ops: Ops, tmp_path: Path
) -> None:
    """probe37ao L2 (low): SIGTERM during `finalize` said "the next deploy removes the
    half-sent release", though the release had been renamed into releases/ (no staging left).
    The interrupt asks the host, and names the release in place, which prune removes."""
    r1, res = ops.second_deploy_driven(CUT_FINALIZE, [f"' finalize {ops.root}", str(ops.root)])
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 130 and "during finalize" in said, said
    new = [p.name for p in (ops.root / "releases").iterdir() if p.name not in (r1,)]
    assert len(new) == 1 and f"release {new[0]} is in place, never switched to" in said, said
    assert "half-sent" not in said, said
    assert ops.current() == r1 and ops.serving() == r1


# From the deploy's restart on, every process-manager restart and status on the host fails
# before it runs (its shell exits 9: the process manager killed, as probe37ax did by SIGKILL
# again and again): nothing is stopped, so the old release serves throughout.
PROCMAN_DOWN = """
ROOT = sys.argv.pop(1)
class Popen(real):
    down = False
    def __init__(self, args, *a, **k):
        said = " ".join(map(str, args))
        Popen.down = Popen.down or f"' restart {ROOT}" in said
        if Popen.down and "procman-watch" in said and (
            f"' restart {ROOT}" in said or f"' status {ROOT}" in said
        ):
            args = ["bash", "-c", "exit 9"]
        super().__init__(args, *a, **k)
"""


# The service stopped (SIGSTOP) from outside the instant its post-flight starts: at the first
# process-manager status after the deploy's restart has answered, the pid its pidfile names.
STOP_IN_POSTFLIGHT = """
ROOT = sys.argv.pop(1)
class Popen(real):
    restart, done = None, False
    def __init__(self, args, *a, **k):
        said = " ".join(map(str, args))
        ours = "procman-watch" in said and f"' status {ROOT}" in said
        if ours and Popen.restart is not None and Popen.restart.poll() is not None:
            Popen.restart = None
            pid = json.load(open(f"{ROOT}/run/ddtree-engine.pid"))["pid"]
            os.kill(pid, signal.SIGSTOP)
        super().__init__(args, *a, **k)
        if "procman-watch" in said and f"' restart {ROOT}" in said and not Popen.done:
            Popen.restart, Popen.done = self, True  # the deploy's (never the rollback's)
"""


def test_a_release_whose_service_was_stopped_from_outside_is_not_rejected(ops: Ops) -> None:
    """probe37bn L1 (low): the new release's service stopped by SIGSTOP from outside during its
    post-flight: the post-flight said so, the rollback was right, but the release was marked
    rejected (blaming its code, and refusing `rollback --to` it). It is not marked, and the
    line says why."""
    r1, res = ops.second_deploy_driven(STOP_IN_POSTFLIGHT, [str(ops.root)])
    said = flat(res.stdout + res.stderr)
    assert res.returncode == 1 and "Traceback" not in said, said
    result = ops.record("deploy")["results"][0]
    r2 = result["release"]
    assert result["failed_step"] == "postflight" and result["after"] == r1, result
    assert f"{r2} was not marked rejected: its service (pid" in said, said
    assert "from outside while its post-flight ran" in said, said
    assert not (ops.root / "releases" / r2 / "rejected.json").exists()
    assert ops.current() == r1 and ops.serving() == r1


def test_a_rollback_whose_status_goes_unanswered_never_says_the_service_is_down(
    ops: Ops, tmp_path: Path
) -> None:
    """probe37ax M2 (medium): the deploy's restart and its rollback's failed (the process
    manager killed), and the status asked after went unanswered: the result said "its service
    does not serve" and named `ops rollback`, while the old release served all along. It says
    the state could not be told, and names `ops service status`."""
    r1, res = ops.second_deploy_driven(PROCMAN_DOWN, [str(ops.root)])
    said = flat(res.stdout + res.stderr)
    assert res.returncode in (1, 2) and "Traceback" not in said, said
    message = ops.record("deploy")["results"][0]["message"]
    assert f"current is back on {r1}; whether its service serves could not be told" in message
    assert "does not serve" not in message, message
    assert "ops service status local" in message, message
    assert ops.current() == r1 and ops.serving() == r1
