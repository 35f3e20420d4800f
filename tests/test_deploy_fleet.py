"""Group deploys over three real sshd instances (canary, then waves; the first failure stops
the rollout and every host's outcome is reported), and the systemd manager's drop-in and
calls against stand-in `sudo` / `systemctl` / `journalctl` that record their arguments.

The services are tests/helpers/fake_service.py, whose greedy output depends on its `--salt`;
here the salt is the release's `DDTREE_ENGINE_BACKENDS` (from service.env), so switching a
component changes the output exactly as a component that breaks token identity would.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE as FAKE
from helpers.cli import ops_json
from helpers.deploy import Deploy, commit_change, make_source
from helpers.sshd import Sshd, free_port, start_sshd

SALTED = f'{{python}} {FAKE} --port {{port}} --salt "$DDTREE_ENGINE_BACKENDS"'


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory):
    servers = [start_sshd(tmp_path_factory.mktemp(f"sshd{i}")) for i in range(3)]
    yield servers
    for s in servers:
        s.stop()


def test_group_canary_then_waves_stop_at_first_failure(
    tmp_path: Path, three: list[Sshd], cpp_cache: Path
):
    src = make_source(tmp_path)
    hosts = {
        f"h{i}": {"sshd": s, "root": tmp_path / f"root{i}", "port": free_port(), "command": SALTED}
        for i, s in enumerate(three, start=1)
    }
    d = Deploy(tmp_path, hosts, src, cache=cpp_cache)
    d.write(groups={"fleet": ["h1", "h3", "h2"]})
    try:
        code, doc, err = d.deploy("fleet", "--bootstrap")
        assert code == 0, err
        assert [r["outcome"] for r in doc["results"]] == ["deployed"] * 3
        first = {n: d.current(n) for n in hosts}
        # h3 switches a component: its service's greedy output changes -> post-flight fails
        hosts["h3"]["components"] = {"tree_build": "cpp"}
        d.write(groups={"fleet": ["h1", "h3", "h2"]})
        commit_change(src, "engine/golden.py", '"""', '"""Release two. ')
        code, doc, err = d.deploy("fleet")
        assert code == 1, err
        by = {r["target"]: r for r in doc["results"]}
        assert [r["target"] for r in doc["results"]] == ["h1", "h3", "h2"]
        assert by["h1"]["outcome"] == "deployed" and d.current("h1") != first["h1"]
        assert by["h3"]["outcome"] == "rolled-back" and by["h3"]["failed_step"] == "postflight"
        assert d.current("h3") == first["h3"]
        assert by["h2"]["failed_step"] == "not reached" and d.current("h2") == first["h2"]
        assert by["h2"]["outcome"] == "not-reached", by["h2"]  # not `failed` (probe37ak L2)
        assert not any(s["name"] == "send" for s in by["h2"]["steps"])
    finally:
        d.stop_all()


STANDIN_SUDO = """#!/bin/bash
# stand-in sudo: records its arguments, maps /etc/systemd to the sandbox, runs the command
echo "sudo $*" >> "$STUB_ROOT/calls"
[ "$1" = "-n" ] || { echo "sudo: a password is required" >&2; exit 1; }
shift
args=()
for a in "$@"; do args+=("${a//\\/etc\\/systemd/$STUB_ROOT/etc/systemd}"); done
exec "${args[@]}"
"""

STANDIN_SYSTEMCTL = """#!/bin/bash
# stand-in systemctl: records its arguments; runs the unit's service from the drop-in's env
echo "systemctl $*" >> "$STUB_ROOT/calls"
unit="${@: -1}"
pidf="$STUB_ROOT/$unit.pid"
running() { [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; }
case "$1" in
  is-active) if running; then echo active; else echo inactive; exit 3; fi ;;
  daemon-reload) ;;
  stop) running && kill "$(cat "$pidf")"; rm -f "$pidf" ;;
  start|restart)
    running && { kill "$(cat "$pidf")"; sleep 0.3; }
    envfile=$(sed -n 's/^EnvironmentFile=//p' "$STUB_ROOT"/etc/systemd/system/"$unit".d/*.conf)
    set -a; . "$envfile"; set +a
    setsid "$STUB_PY" "$STUB_FAKE" --port "$STUB_PORT" --salt "$DDTREE_ENGINE_BACKENDS" \\
      >> "$STUB_ROOT/$unit.log" 2>&1 < /dev/null &
    echo $! > "$pidf" ;;
esac
"""

STANDIN_JOURNALCTL = """#!/bin/bash
echo "journalctl $*" >> "$STUB_ROOT/calls"
cat "$STUB_ROOT"/*.log 2>/dev/null
"""


def test_systemd_bootstrap_installs_the_dropin_and_restarts_through_sudo(
    tmp_path: Path, cpp_cache: Path
):
    stub = tmp_path / "stub"
    (stub / "bin").mkdir(parents=True)
    for name, text in [
        ("sudo", STANDIN_SUDO),
        ("systemctl", STANDIN_SYSTEMCTL),
        ("journalctl", STANDIN_JOURNALCTL),
    ]:
        path = stub / "bin" / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    port = free_port()
    src = make_source(tmp_path)
    root = tmp_path / "root"
    shutil.copytree(cpp_cache, root / "cache")  # as Deploy(cache=...) does
    inv = tmp_path / "ops.toml"
    inv.write_text(
        "[targets.local]\n"
        f"remote_root = '{root}'\n"
        "[targets.local.service]\n"
        "name = 'sglang-test'\nmanager = 'systemd'\n"
        f"url = 'http://127.0.0.1:{port}'\n"
    )
    env = {
        **os.environ,
        "PATH": f"{stub / 'bin'}:{os.environ['PATH']}",
        "STUB_ROOT": str(stub),
        "STUB_PY": sys.executable,
        "STUB_FAKE": str(FAKE),
        "STUB_PORT": str(port),
        "OPS_RUNS_DIR": str(tmp_path / "runs"),
    }
    import subprocess

    def ops(*args: str) -> tuple[int, dict, str]:
        return ops_json(*args, inventory=inv, env=env)

    try:
        code, doc, err = ops(
            "deploy", "local", "--source", str(src), "--bootstrap", "--max-tokens", "4"
        )
        assert code == 0, (doc, err)
        dropin = stub / "etc/systemd/system/sglang-test.d/ddtree-ops.conf"
        assert dropin.read_text().splitlines()[-1] == (
            f"EnvironmentFile={root}/current/service.env"
        )
        (step,) = [s for s in doc["results"][0]["steps"] if s["name"] == "drop-in"]
        assert step["data"]["path"] == "/etc/systemd/system/sglang-test.d/ddtree-ops.conf"
        calls = (stub / "calls").read_text().splitlines()
        assert "sudo -n tee /etc/systemd/system/sglang-test.d/ddtree-ops.conf" in calls
        assert "sudo -n systemctl daemon-reload" in calls
        assert "sudo -n systemctl restart sglang-test" in calls
        assert "systemctl is-active sglang-test" in calls
        # sudo only for the service manager: every sudo call is systemctl or the drop-in
        sudo = [c for c in calls if c.startswith("sudo ")]
        assert all(
            c.split()[2] in ("systemctl", "journalctl") or "/etc/systemd/system/" in c for c in sudo
        ), sudo
    finally:
        subprocess.run(["bash", "-c", f"kill $(cat {stub}/sglang-test.pid) 2>/dev/null"])
