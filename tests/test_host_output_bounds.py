"""What ops reads of a host command's output is bounded (probe37c C1).

A release whose service wrote a GiB without a newline to its log made `ops deploy` read the
log's `tail -n 40` whole, keep it as evidence and render it: 23.6 GB, OOM-killed. Every host
command's stdout is kept up to STDOUT_MAX and its stderr up to STDERR_MAX (head and tail, the
cut said); a module's JSON over the bound is refused in one line; a deploy step's evidence lines
are a few hundred characters at most. Here with 64 MiB + 1 byte, never GiBs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.deploy import commit_change
from helpers.deploy_ops import Ops, steps
from helpers.local import end_services

from ops.errors import ModuleOutputError
from ops.hosts.inventory import load_inventory
from ops.hosts.remote import STDERR_MAX, STDOUT_MAX, open_host

# the release's service: its log grows by 64 MiB + 1 NUL bytes (no newline), then it exits
BIG_LOG = (
    "def main() -> None:\n"
    "    import os, sys\n"
    "    sys.stdout.flush()\n"
    "    block = bytes(1 << 20)\n"  # (its output goes through the log keeper's pipe)
    f"    for _ in range({STDOUT_MAX >> 20}):\n"
    "        os.write(1, block)\n"
    f"    os.write(1, bytes({STDOUT_MAX + 1 - (STDOUT_MAX >> 20 << 20)}))\n"
    "    sys.exit(3)\n"
)


def _local(tmp: Path):
    inv = tmp / "ops.toml"
    inv.write_text(f"[targets.local]\nremote_root = '{tmp / 'root'}'\n")
    return open_host(load_inventory(str(inv)).target("local"))


def test_a_command_output_over_the_bound_keeps_head_and_tail_and_says_the_cut(
    tmp_path: Path,
) -> None:
    with _local(tmp_path) as host:
        script = (
            f"head -c {STDOUT_MAX // 2} /dev/zero | tr '\\0' a; printf B; "
            f"head -c {STDOUT_MAX // 2} /dev/zero | tr '\\0' c; printf Z; "
            f"head -c {STDERR_MAX + 1} /dev/zero | tr '\\0' e >&2"
        )
        res = host.run(["bash", "-c", script], timeout=120)
    assert res.stdout_cut == 2 and res.stderr_cut == 1
    assert len(res.stdout) < STDOUT_MAX + 200 and len(res.stderr) < STDERR_MAX + 200
    assert res.stdout.startswith("a" * 1000) and res.stdout.endswith("c" * 1000 + "Z")
    assert "B" not in res.stdout  # the middle is what was dropped
    assert f"ops cut 2 bytes of {STDOUT_MAX + 2}" in res.stdout
    assert f"ops cut 1 bytes of {STDERR_MAX + 1}" in res.stderr


def test_a_hosts_result_line_is_read_whole_or_not_at_all(tmp_path: Path) -> None:
    """The last line of a host command's stdout is its JSON result (`Result.last_json`): an
    integer past the digits Python converts, a cut line, no output, each reads as no result,
    never an exception (probe37az M2: one was an internal error, exit 4)."""
    lines = {
        'echo note; echo \'{"ok": true, "n": 3}\'': {"ok": True, "n": 3},
        f"echo '{{\"n\": {'9' * 5000}}}'": None,
        "echo '{\"ok\": tr'": None,
        "true": None,
    }
    with _local(tmp_path) as host:
        for script, want in lines.items():
            res = host.run(["bash", "-c", script])
            assert res.last_json() == want, script
        res = host.run(["bash", "-c", 'echo \'{"said": "ops rollback TARGET"}\''])
        assert res.last_json(lambda line: line.replace("TARGET", "local")) == {
            "said": "ops rollback local"
        }


def test_output_within_the_bound_is_whole(tmp_path: Path) -> None:
    with _local(tmp_path) as host:
        res = host.run(["bash", "-c", f"head -c {STDOUT_MAX} /dev/zero | tr '\\0' x"])
    assert res.stdout_cut == 0 and res.stdout == "x" * STDOUT_MAX


def test_a_module_printing_over_the_bound_is_refused_in_one_line(tmp_path: Path) -> None:
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "huge.py").write_text(
        f"import sys\nsys.stdout.write('{{\"pad\": \"' + 'x' * {STDOUT_MAX} + '\"}}')\n"
    )
    with _local(tmp_path) as host, pytest.raises(ModuleOutputError) as exc:
        host.run_module("huge", cwd=str(mod), timeout=120)
    line = exc.value.message
    assert "\n" not in line and len(line) < 300, line[:300]
    assert f"over the {STDOUT_MAX >> 20} MiB" in line


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    yield o
    end_services(o.root)


def test_a_service_log_line_of_64_mib_is_evidence_of_a_few_hundred_characters(ops: Ops) -> None:
    assert ops.deploy("--bootstrap").returncode == 0
    r1 = ops.current()
    commit_change(ops.src, "engine/svc.py", "def main() -> None:\n", BIG_LOG)
    res = ops.deploy("--wait", "5")
    assert res.returncode == 1, res.stderr[-2000:]
    assert ops.current() == r1 and ops.serving() == r1
    assert len(res.stdout) + len(res.stderr) < 200_000  # what it printed, not the log
    runs = sorted(ops.runs.glob("*-deploy-*"))
    record = runs[-1] / "record.json"
    assert record.stat().st_size < 1_000_000
    result = json.loads(record.read_text())["results"][0]
    assert result["failed_step"] == "restart" and steps(result)["rollback"] == "ok"
    (restart,) = [s for s in result["steps"] if s["name"] == "restart"]
    assert restart["evidence"] and all(len(x) < 600 for x in restart["evidence"])
    assert any("more characters cut" in x for x in restart["evidence"])
