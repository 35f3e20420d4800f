"""probe37b B12: `ops deploy GROUP` and an impatient operator. Ctrl-C, then Ctrl-C again and
again while the hosts are put back: only the first is taken, every host's guard finishes, and
the table (and the record) has each host's result with where it was left, never "interrupted
(Ctrl-C) before a result" with an empty record.

Real processes: the `ops` CLI in its own session, SIGINTs sent to it, target `local` (ops's
process manager, the stand-in service of tests/helpers/deploy_ops.py) and target `loop` over
the loopback sshd (tests/helpers/sshd.py).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from pathlib import Path

from helpers import REPO
from helpers.deploy import commit_change, git
from helpers.deploy_ops import Ops, steps
from helpers.local import end_services
from helpers.sshd import Sshd, free_port

# the stand-in's post-flight answers never come (health still answers)
HANG = ("engine/svc.py", 'default="ok"', 'default="hang"')


def impatient(ops: Ops, marker: str, *args: str) -> tuple[int, str, str]:
    """`ops deploy ARGS`; once `marker` shows on stderr, SIGINT, then SIGINT every 0.1 s until
    it exits (at most 20): (exit, stdout, stderr)."""
    proc = ops.popen("deploy", *args, "--source", str(ops.src), "--max-tokens", "3")
    assert proc.stderr is not None
    seen = ""
    try:
        while marker not in seen:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert marker in seen, seen
        time.sleep(0.2)
        for _ in range(20):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.1)
            if proc.poll() is not None:
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, seen + err


def commit_all(src: Path, msg: str) -> None:
    git(src, "add", "-A")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", msg)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_second_ctrl_c_in_a_group_keeps_every_hosts_result(ops: Ops) -> None:
    """The probe's repro: group `fleet` = [local], Ctrl-C again and again during the
    post-flight."""
    assert ops.deploy("--bootstrap", target="fleet").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, *HANG)
    code, out, err = impatient(ops, "local: postflight ...", "fleet")
    said = flat(out + err)
    assert code == 130, said
    assert "before a result" not in said and "Traceback" not in said, said
    # the table's row and the host's line: where it was left, asked of the host
    assert "interrupted during postflight: the host's guard switched current back to" in said
    assert f"back to {r1} and restarted the service; service active" in said, said
    record = ops.record("deploy")
    assert record["outcome"] == "interrupted" and record["exit_code"] == 130, record
    (result,) = record["results"]
    assert result["target"] == "local" and result["outcome"] == "interrupted", result
    assert steps(result)["switch"] == "ok" and steps(result)["interrupted"] == "fail", result
    assert result["before"] == r1 and result["after"] == r1, result
    assert ops.current() == r1 and ops.serving() == r1


def test_second_ctrl_c_in_a_wave_reports_each_host_where_it_was_left(
    ops: Ops, sshd: Sshd, tmp_path: Path
) -> None:
    """Group [local, loop]: the canary `local` deploys the new release; `loop` (over SSH), in
    the next wave, hangs in its post-flight (the new release hangs there only) and gets Ctrl-C
    after Ctrl-C. Exit 130; each host has its row: local deployed, loop interrupted and put back
    by its guard, on the release it had, its service active."""
    loop_root, loop_port = tmp_path / "loop-root", free_port()
    mode = '--mode "$(cat engine/mode 2>/dev/null || echo ok)"'
    ops.inventory.write_text(
        ops.inventory.read_text().split("[groups]")[0] + "[targets.loop]\n"
        f"address = '127.0.0.1'\nport = {sshd.port}\nuser = '{sshd.user}'\n"
        f"ssh_key = '{sshd.user_key}'\nknown_hosts = '{sshd.known_hosts}'\n"
        f"python = '{sys.executable}'\nremote_root = '{loop_root}'\n"
        "[targets.loop.service]\n"
        f"url = 'http://127.0.0.1:{loop_port}'\n"
        f"command = {json.dumps('{python} engine/svc.py --port {port} ' + mode)}\n"
        "stop_timeout = 2\n"
        "[groups]\nfleet = ['local', 'loop']\n"
    )
    # over SSH the checks run from the release: it carries them, as a real one does
    shutil.copytree(REPO / "checks", ops.src / "checks", ignore=shutil.ignore_patterns("__py*"))
    commit_all(ops.src, "checks")
    try:
        res = ops.deploy("--bootstrap", target="fleet")
        assert res.returncode == 0, res.stdout + res.stderr
        r1, loop_r1 = ops.current(), (loop_root / "current").readlink().name  # each its own id
        (ops.src / "engine" / "mode").write_text("hang\n")  # loop's service reads it; local's not
        commit_all(ops.src, "hang")
        code, out, err = impatient(ops, "loop: postflight ...", "fleet")
        said = flat(out + err)
        assert code == 130, said
        assert "before a result" not in said and "Traceback" not in said, said
        record = ops.record("deploy")
        assert record["outcome"] == "interrupted", record
        by = {r["target"]: r for r in record["results"]}
        assert by["local"]["outcome"] == "deployed", by["local"]
        r2 = by["local"]["after"]
        assert r2 != r1 and ops.current() == r2
        loop = by["loop"]
        assert loop["outcome"] == "interrupted" and loop["after"] == loop_r1, loop
        assert steps(loop)["switch"] == "ok", loop
        back = f"back to {loop_r1} and restarted the service; service active"
        assert back in loop["message"], loop
        table = flat(out)  # its rows: host, release before, outcome
        assert f"local {r1} deployed" in table and f"loop {loop_r1} interrupted" in table, out
        assert (loop_root / "current").readlink().name == loop_r1
        code, st = ops.json("service", "status", "loop")
        assert st["state"] == "active" and Path(st["runs_from"]).name == loop_r1, st
    finally:
        end_services(loop_root)
