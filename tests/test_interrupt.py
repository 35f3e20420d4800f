"""Ctrl-C and lost connections leave nothing running, on `local` and over SSH (real sshd).

`ops loadtest` runs as a real process and gets SIGINT while a level hangs on the service: it
exits 130, its record (outcome "interrupted") holds the level that finished, and the load
generator it started, with everything in its session, is gone. A command over SSH whose
connection is closed or whose sshd child is killed dies on the host too, even one that
ignores TERM.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE, REPO
from helpers.sshd import Sshd, free_port, write_inventory

from ops.errors import HostError
from ops.hosts.inventory import load_inventory
from ops.hosts.local import kill_sessions
from ops.hosts.remote import open_host, watched

FAKE = FAKE_SERVICE


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name (state, ppid, pgrp, session, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def matching(*argv: str, at: int = 0) -> list[int]:
    """Live processes whose argv[at:] starts with `argv` (so neither a wrapper that carries the
    command as one shell string nor `timeout ... COMMAND` matches)."""
    want = list(argv)
    return [p for p in _pids() if _argv(p)[at : at + len(want)] == want and _running(p)]


def session_of(pid: int) -> list[int]:
    """Every live process in `pid`'s session."""
    st = _stat(pid)
    if st is None:
        return []
    return [p for p in _pids() if (s := _stat(p)) and s[3] == st[3] and s[0] != "Z"]


def wait_for(cond: Callable[[], object], timeout: float, what: str) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := cond():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def hanging_service() -> Iterator[int]:
    """The fake service: 3 completions answer (level c=1 with 2 requests and 1 warm-up), the
    rest hang, so the second level never ends on its own."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(port), "--hang-after", "3"],
        start_new_session=True,
    )
    wait_for(lambda: _listening(port), 20, "the fake service")
    yield port
    proc.terminate()
    proc.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _sigint_when(
    argv: list[str],
    ready: Callable[[], object],
    what: str,
    *,
    settle: float,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run `argv`, send it SIGINT `settle` s after `ready()` first holds: (exit code, stdout,
    stderr); never a traceback."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        wait_for(ready, 60, what)
        time.sleep(settle)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def _ctrl_c_in_the_second_level(
    args: list[str], tmp: Path, port: int
) -> tuple[int, str, str, list[int], tuple[str, ...]]:
    """`ops ARGS` (its levels c = 1 and 2 against the hanging service) gets SIGINT while the
    c=2 level's generator hangs: (exit code, stdout, stderr, the generator's session, the
    generator's argv marker)."""
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}
    url = f"http://127.0.0.1:{port}"
    # the checks run as `python -B -S -m checks.NAME` (stdlib only: ops.hosts.dataplane.run_check)
    marker = ("-B", "-S", "-m", "checks.loadtest", "--json", "--url", url, "--concurrency", "2")
    started: list[int] = []

    def generator() -> list[int]:
        gens = matching(*marker, at=1)
        if gens:
            started[:] = session_of(gens[0])  # the generator and what runs it (timeout, bash)
        return gens

    code, out, err = _sigint_when(
        [sys.executable, "-m", "ops", *args],
        generator,
        "the 2nd level's generator",
        settle=0.5,
        env=env,  # its requests are in flight and hang
    )
    assert "Traceback" not in out
    return code, out, err, started, marker


def _interrupt_loadtest(inv: Path, tmp: Path, target: str, port: int) -> None:
    args = [
        "loadtest",
        target,
        "-c",
        "1,2",
        "--requests",
        "2",
        "--output-len",
        "4",
        "--input-len",
        "4",
        "--json",
        "--inventory",
        str(inv),
    ]
    code, out, err, started, marker = _ctrl_c_in_the_second_level(args, tmp, port)
    url = f"http://127.0.0.1:{port}"
    assert code == 130, err
    assert "interrupted: 1 of 2 levels finished" in err and "record: " in err, err  # --json too
    doc = json.loads(out)
    assert doc["ok"] is False and doc["interrupted"] is True
    assert [lv["concurrency"] for lv in doc["levels"]] == [1]
    assert doc["levels"][0]["completed"] == 2 and doc["planned"] == [1, 2]
    record = json.loads((Path(doc["run_dir"]) / "record.json").read_text())
    assert record["outcome"] == "interrupted" and record["exit_code"] == 130
    assert [lv["concurrency"] for lv in record["loadtest"]["levels"]] == [1]
    assert record["loadtest"]["levels"][0]["completed"] == 2
    # nothing we started runs on: the generator (by pid and by its marker) and its session
    wait_for(lambda: not any(_running(p) for p in started), 10, f"{started} to end")
    assert matching(*marker, at=1) == []
    assert matching("-B", "-S", "-m", "checks.loadtest", "--json", "--url", url, at=1) == []


def test_ctrl_c_stops_the_load_generator_locally(tmp_path: Path, hanging_service: int) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        f"[targets.local.service]\nurl = 'http://127.0.0.1:{hanging_service}'\n"
    )
    _interrupt_loadtest(inv, tmp_path, "local", hanging_service)


def test_ctrl_c_stops_the_load_generator_over_ssh(
    sshd: Sshd, tmp_path: Path, hanging_service: int
) -> None:
    inv = write_inventory(tmp_path / "ops.toml", sshd, tmp_path / "roots")
    with inv.open("a") as f:
        f.write(f"\n[targets.loop.service]\nurl = 'http://127.0.0.1:{hanging_service}'\n")
    target = load_inventory(inv).target("loop")
    release = tmp_path / "release"
    release.mkdir()
    subprocess.run(["cp", "-r", str(REPO / "checks"), str(release)], check=True)
    with open_host(target) as host:
        host.put_tree(release, f"{target.remote_root}/current")
    _interrupt_loadtest(inv, tmp_path, "loop", hanging_service)


def test_ctrl_c_keeps_the_profile_levels_that_finished(
    tmp_path: Path, hanging_service: int
) -> None:
    """`ops profile -c 1,2` against a service whose second level hangs: SIGINT in that level
    exits 130 with the record line and a complete record, the c=1 level kept (derived: the fake
    service has no stage timings), c=2 listed as interrupted; the generator is gone."""
    inv = tmp_path / "ops.toml"
    url = f"http://127.0.0.1:{hanging_service}"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        f"[targets.local.service]\nurl = '{url}'\n"
    )
    args = [
        "profile",
        "local",
        "-c",
        "1,2",
        "--requests",
        "2",
        "--output-len",
        "4",
        "--input-len",
        "4",
        "--accept-length",
        "2",
        "--budget",
        "8",
        "--json",
        "--inventory",
        str(inv),
    ]
    code, out, err, started, marker = _ctrl_c_in_the_second_level(args, tmp_path, hanging_service)
    assert code == 130, err
    assert "interrupted: c=2 not profiled (Ctrl-C)" in err, err
    assert "HOLD" not in err  # the interrupted level is said once, as interrupted
    doc = json.loads(out)  # --json: the section as the record has it, and its run directory
    assert doc["ok"] is False and doc["interrupted"] == {"levels_left": [2]}
    record = json.loads((Path(doc["run_dir"]) / "record.json").read_text())
    assert record["outcome"] == "interrupted" and record["exit_code"] == 130
    prof = record["profile"]
    assert [lv["concurrency"] for lv in prof["levels"]] == [1]
    assert prof["levels"][0]["method"] == "derived" and prof["levels"][0]["load"]["completed"] == 2
    assert prof["interrupted"] == {"levels_left": [2]}
    # a report from that record: its target is still the highest level asked for (c=2, not
    # the c=1 that finished), which was not profiled, and it says why
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops",
            "report",
            doc["run_dir"],
            "--out",
            str(tmp_path / "rep"),
            "--change",
            "tree_build:reference->cuda",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rdoc = json.loads(rep.stdout)
    assert rdoc["target_concurrency"] == 2 and rdoc["verdict"] == "HOLD", rdoc
    held = {h["code"]: h["message"] for h in rdoc["holds"]}
    assert held["no_profile_level"] == (
        "concurrency 2 was not profiled (profiled: [1]); the profile was interrupted (Ctrl-C) "
        "before it"
    ), rep.stdout
    assert prof["incomplete"] == [
        {
            "concurrency": 2,
            "missing": ["interrupted (Ctrl-C) before this level finished"],
            "pilot": None,
        }
    ]
    wait_for(lambda: not any(_running(p) for p in started), 10, f"{started} to end")
    assert matching(*marker, at=1) == []


def test_a_rollout_interrupted_in_its_profile_keeps_the_levels_that_finished(
    tmp_path: Path, hanging_service: int
) -> None:
    """The same Ctrl-C inside `ops rollout`'s profile step: the rollout exits 130, and the
    step's record (outcome interrupted) keeps the c=1 level, so `ops report` can still read it."""
    inv = tmp_path / "ops.toml"
    url = f"http://127.0.0.1:{hanging_service}"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        f"[targets.local.service]\nurl = '{url}'\n"
    )
    book = tmp_path / "profile-only.yaml"
    book.write_text(
        "name: profile-only\nchange: {component: tree_build, baseline: reference, "
        "candidate: cuda}\nload: {concurrency: [1, 2], requests: 2, input_len: 4, "
        "output_len: 4}\nsteps:\n  - step: profile\n    shadow: false\n    accept_length: 2\n"
        "    budget: 8\n"
    )
    args = ["rollout", "local", "--playbook", str(book), "--inventory", str(inv)]
    code, out, err, _, _ = _ctrl_c_in_the_second_level(args, tmp_path, hanging_service)
    assert code == 130, out + err
    (step,) = (tmp_path / "runs").glob("*-rollout-local/*-profile/record.json")
    record = json.loads(step.read_text())
    assert record["outcome"] == "interrupted" and record["exit_code"] == 130
    assert [lv["concurrency"] for lv in record["profile"]["levels"]] == [1]
    assert record["profile"]["interrupted"] == {"levels_left": [2]}


@pytest.fixture
def mute_service() -> Iterator[int]:
    """A port that accepts connections and never answers: every HTTP request to it hangs
    until its own timeout."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        yield srv.getsockname()[1]


@pytest.mark.parametrize("command", ["profile", "healthcheck"])
def test_ctrl_c_before_any_result_says_so_and_where_the_record_is(
    tmp_path: Path, mute_service: int, command: str
) -> None:
    """SIGINT while the command's first request to the service hangs: exit 130, one line that
    it was interrupted, the record line, and with --json the JSON document; the profile's
    record lists every level as not profiled."""
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        f"[targets.local.service]\nurl = 'http://127.0.0.1:{mute_service}'\n"
    )
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    more = ["-c", "1,2"] if command == "profile" else []
    argv = [sys.executable, "-m", "ops", command, "local", *more, "--json", "--inventory", str(inv)]
    url = f"http://127.0.0.1:{mute_service}"
    code, out, err = _sigint_when(
        argv,
        lambda: [p for p in _pids() if url in _argv(p) and "-S" in _argv(p)],
        "the first check, on the mute port",
        settle=1.0,
        env=env,
    )
    assert code == 130, err
    doc = json.loads(out)
    assert doc["ok"] is False, doc
    assert "record: " in err and doc["run_dir"] in err.replace("\n", "")
    record = json.loads((Path(doc["run_dir"]) / "record.json").read_text())
    assert record["outcome"] == "interrupted" and record["exit_code"] == 130
    if command == "profile":
        assert "interrupted: c=1, 2 not profiled (Ctrl-C)" in err, err
        assert record["profile"]["interrupted"] == {"levels_left": [1, 2]}
        assert record["profile"]["levels"] == []
    else:
        assert "interrupted (Ctrl-C) before a result" in err, err
        assert doc["outcome"] == "interrupted"


def test_ctrl_c_in_a_command_without_a_record_still_says_so(tmp_path: Path) -> None:
    """`ops releases` waiting on a host that never answers (its python a script that sleeps):
    SIGINT gives exit 130, one 'interrupted' line and, with --json, one JSON document (typer
    would otherwise end it as a silent 130). (It used to read a named pipe as a record; ops
    now refuses a record that is not a regular file before reading it.)"""
    slow = tmp_path / "slowpy"
    nap = f"{60 + os.getpid() % 997 / 1000:.3f}"  # this test's own: no other `sleep 60`
    slow.write_text(f"#!/bin/sh\nexec sleep {nap}\n")
    slow.chmod(0o755)
    inv = tmp_path / "ops.toml"
    inv.write_text(f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\npython = '{slow}'\n")
    argv = [sys.executable, "-m", "ops", "releases", "local", "--json", "--inventory", str(inv)]
    code, out, err = _sigint_when(argv, lambda: matching("sleep", nap), "ops releases", settle=0.5)
    assert code == 130, err
    assert "interrupted (Ctrl-C)" in err, err
    assert json.loads(out) == {"ok": False, "outcome": "interrupted"}


def test_ctrl_c_while_ops_starts_is_never_a_traceback() -> None:
    """SIGINT at moments through `ops`'s start-up once Python itself is up (the interpreter's
    own start is CPython's: a signal there is not ours to word): the CLI's imports, the
    command. Never a traceback: 130 with one line, or the command's own end."""
    boot = (
        "import runpy, sys; sys.argv = ['ops', 'hosts']; print('up', file=sys.stderr, "
        "flush=True); runpy.run_module('ops', run_name='__main__')"
    )
    for delay in (0.02, 0.05, 0.1, 0.2, 0.3):
        proc = subprocess.Popen(
            [sys.executable, "-c", boot], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stderr is not None and proc.stderr.readline() == "up\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        if 'File "<string>", line 1, in <module>\nKeyboardInterrupt' in err:
            continue  # it landed in this test's own boot line, before `ops` ran at all
        assert "Traceback" not in err, (delay, err)
        # 0 or -SIGINT: the command had done its work (the signal met its exit)
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, err)
        if proc.returncode == 130:
            assert err.strip().endswith("interrupted (Ctrl-C)") or "interrupted" in err, err


def test_ctrl_c_during_the_imports_counts_when_started_with_sigint_ignored() -> None:
    """probe37aq L1 (low): ops started with SIGINT ignored (a script's background job) took
    SIGINT as Ctrl-C only once its imports were done; one sent in the first tenths of a
    second was lost, and the command ran on. The driver holds the CLI's import for 5 s and
    sends SIGINT in it."""
    boot = (
        "import importlib.abc, runpy, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "class Slow(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'ops.cli':\n"
        "            print('importing', file=sys.stderr, flush=True)\n"
        "            time.sleep(5)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Slow())\n"
        "sys.argv = ['ops', 'hosts']\n"
        "runpy.run_module('ops', run_name='__main__')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", boot],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.stderr is not None and proc.stderr.readline() == "importing\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip() == "interrupted (Ctrl-C)", err


def test_ctrl_c_while_options_are_parsed_is_one_line() -> None:
    """typer turns a Ctrl-C that lands outside a command's own run (here: its options being
    parsed) into a silent exit 130. ops says it. The driver raises what the SIGINT handler
    raises, at the point a signal only hits about 1 run in 75 (the test above)."""
    boot = (
        "import runpy, sys\n"
        "from typer.core import TyperCommand\n"
        "parse = TyperCommand.parse_args\n"
        "def interrupted(self, ctx, args):\n"
        "    if self.name == 'hosts':\n"
        "        raise KeyboardInterrupt\n"
        "    return parse(self, ctx, args)\n"
        "TyperCommand.parse_args = interrupted\n"
        "sys.argv = ['ops', 'hosts']\n"
        "runpy.run_module('ops', run_name='__main__')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", boot], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert res.stderr.strip() == "interrupted (Ctrl-C)", res.stderr


def _sshd_ancestor(pid: int, listener: int) -> int:
    """The sshd process that serves the session `pid` runs in (not the listening daemon)."""
    p = pid
    while p > 1:
        st = _stat(p)
        assert st is not None, f"lost the process chain at {p}"
        p = int(st[1])
        if _argv(p)[:1] and _argv(p)[0].startswith("sshd") and p != listener:
            return p
    raise AssertionError(f"no sshd above {pid}")


@pytest.mark.parametrize("how", ["close the connection", "kill the sshd child"])
def test_lost_connection_leaves_nothing_on_the_host(
    sshd: Sshd, inventory_file: Path, how: str
) -> None:
    host = open_host(load_inventory(inventory_file).target("loop"))
    arg = f"97.{os.getpid()}{len(how)}"
    # bash and its sleep both ignore TERM: the host must fall back to KILL
    script = f"trap '' TERM; sleep {arg}; echo never"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            host.run(["bash", "-c", script], timeout=300)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        (sleeper,) = wait_for(lambda: matching("sleep", arg), 30, "the remote sleep")
        started = session_of(sleeper)
        if how == "close the connection":
            host.close()
        else:
            os.kill(_sshd_ancestor(sleeper, sshd.proc.pid), signal.SIGKILL)
        worker.join(30)
        assert not worker.is_alive(), "run() did not notice the lost connection"
        assert len(errors) == 1 and isinstance(errors[0], HostError), errors
        wait_for(lambda: not any(_running(p) for p in started), 15, f"{started} to end")
        assert matching("sleep", arg) == []
    finally:
        host.close()
        for p in matching("sleep", arg):
            os.kill(p, signal.SIGKILL)


def test_local_fallback_kills_the_watcher_and_the_command_session() -> None:
    """When the watcher does not end by itself (a second Ctrl-C), ops kills from here."""
    arg = f"96.{os.getpid()}"
    watcher = subprocess.Popen(
        ["bash", "-c", watched(f"timeout 60 bash -c 'sleep {arg}; :'")],
        stdin=subprocess.PIPE,  # held open: the watcher itself would wait forever
        start_new_session=True,
    )
    try:
        (sleeper,) = wait_for(lambda: matching("sleep", arg), 30, "the sleep")
        started = [watcher.pid, *session_of(sleeper)]
        assert len(started) == 4  # the watcher, timeout, bash, sleep
        kill_sessions(watcher.pid)
        watcher.wait(10)
        wait_for(lambda: not any(_running(p) for p in started), 10, f"{started} to end")
    finally:
        assert watcher.stdin is not None
        watcher.stdin.close()
        for p in matching("sleep", arg):
            os.kill(p, signal.SIGKILL)
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def test_data_on_stdin_still_arrives_whole(inventory_file: Path) -> None:
    inv = load_inventory(inventory_file)
    data = os.urandom(3_000_000) + b"\0end"
    for name in ("local", "loop"):
        with open_host(inv.target(name)) as host:
            res = host.run(["sha256sum"], stdin=data)
            assert res.stdout.split()[0] == hashlib.sha256(data).hexdigest()
            res = host.run(["bash", "-c", "cat >/dev/null; echo read all"], stdin=data)
            assert res.stdout == "read all\n"
            assert host.run(["bash", "-c", "wc -c"]).stdout.strip() == "0"


def test_a_command_that_ends_at_once_keeps_its_exit_status() -> None:
    """probe37h M1: the watcher read the coprocess's pid and pipe after `coproc` had started it;
    bash unsets them once the coprocess has ended, so a command that ended first came back
    as a failure (`r: ambiguous redirect`, `wait: '': not a pid`) after it had run: about 1 in
    10 of these runs, 8 at a time, before. The coprocess now waits for the watcher's word."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[int, int, bytes] | None:
        proc = subprocess.Popen(  # stdin held open, as ops holds it: its end means "go away"
            ["bash", "-c", watched(f"exit {i % 3}", 2)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"ab")
        proc.stdin.flush()
        rc = proc.wait(30)
        proc.stdin.close()
        err = proc.stderr.read()
        proc.stderr.close()
        return None if rc == i % 3 and not err else (i, rc, err[-200:])

    with ThreadPoolExecutor(8) as pool:
        failed = [f for f in pool.map(one, range(400)) if f]
    assert not failed, failed[:5]


@pytest.mark.parametrize("name", ["local", "loop"])
def test_a_command_that_ended_while_ops_was_stopped_is_no_timeout(
    inventory_file: Path, name: str
) -> None:
    """probe37o O4: ops stopped (SIGSTOP, Ctrl-Z) past a command's deadline while the command
    ended on time: its answer, already sent, was read as a timeout (exit 124), and a deploy
    rolled back a healthy release for a post-flight that "could not run". The command here
    stops its own caller and answers; the caller is resumed after the deadline."""
    driver = (  # the transport's own wait (`_exec`), with a deadline short enough to pass
        "import os\n"
        "from ops.hosts.inventory import load_inventory\n"
        "from ops.hosts.remote import open_host\n"
        f"target = load_inventory({str(inventory_file)!r}).target({name!r})\n"
        "with open_host(target) as host:\n"
        "    cmd = f'kill -STOP {os.getpid()}; echo done'\n"
        "    rc, out, _ = host._exec(cmd, stdin=None, deadline_s=1.0)\n"
        "print(rc, out.value().decode().strip())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        while (st := _stat(proc.pid)) is not None and st[0] != "T":
            assert time.monotonic() < deadline, "the command never stopped its caller"
            time.sleep(0.05)
        time.sleep(2)  # past the 1 s deadline
    finally:
        proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert out.split() == ["0", "done"], (out, err)
