"""`ops facts` for real: over the loopback sshd and on `local`, a GPU host seen through a stand-in
nvidia-smi that replays output recorded on a real 2x H200 host, and missing tools as facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from helpers.sshd import Sshd

from checks.nvsmi import parse_apps, parse_gpus
from ops.hosts.facts import gather_facts
from ops.hosts.inventory import Target
from ops.hosts.local import LocalHost

FIXTURE = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2-gpu1-busy"


def ops(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "ops", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def test_parse_recorded_nvidia_smi() -> None:
    gpus = parse_gpus((FIXTURE / "query-gpu.csv").read_text())
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[1].uuid == "GPU-4a159795-65c4-9dc6-6b6c-855e4f7b58f8"
    assert (gpus[1].memory_used_mib, gpus[1].memory_total_mib) == (4095, 143771)
    assert gpus[0].pci_bus_id == "00000000:00:06.0" and gpus[0].name == "NVIDIA H200"
    apps = parse_apps((FIXTURE / "query-compute-apps.csv").read_text())
    assert [(a.pid, a.used_memory_mib) for a in apps] == [(558, 518), (558, 4086)]


def test_gpus_come_back_in_pci_bus_order() -> None:
    text = (
        "index, uuid, name, pci.bus_id, memory.used, memory.total, driver_version, compute_cap\n"
        "0, GPU-b, NVIDIA RTX PRO 6000, 00000000:41:00.0, 10, 97887, 580.1, 12.0\n"
        "1, GPU-a, NVIDIA RTX PRO 6000, 00000000:01:00.0, 10, 97887, 580.1, 12.0\n"
    )
    gpus = parse_gpus(text)
    assert [g.uuid for g in gpus] == ["GPU-a", "GPU-b"]
    assert gpus[0].arch == "sm_120"


@pytest.fixture
def fake_gpu_path(tmp_path: Path) -> str:
    """A bin dir whose nvidia-smi prints the recorded H200 rows as `--format=csv,nounits` would."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    rows = (FIXTURE / "query-gpu.csv").read_text().splitlines()[1:]
    lines = [
        "index, uuid, name, pci.bus_id, memory.used [MiB], memory.total [MiB], "
        "driver_version, compute_cap"
    ]
    for r in rows:
        c = [x.strip() for x in r.split(",")]
        lines.append(
            ", ".join(
                [c[0], c[1], c[2], c[3], c[4].split()[0], c[5].split()[0], "580.159.04", "9.0"]
            )
        )
    (bindir / "rows.csv").write_text("\n".join(lines) + "\n")
    script = bindir / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\n[ "$CUDA_DEVICE_ORDER" = PCI_BUS_ID ] || exit 9\ncat {bindir}/rows.csv\n'
    )
    script.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def test_facts_local_with_gpus_and_inventory_warnings(
    tmp_path: Path, fake_gpu_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", fake_gpu_path)
    target = Target(
        name="local",
        python=sys.executable,
        remote_root=str(tmp_path / "r" / "s"),
        gpus=8,
        cuda_arch="sm_120",
    )
    facts = gather_facts(LocalHost(target))
    assert [g.uuid[:12] for g in facts.gpus] == ["GPU-989a41cf", "GPU-4a159795"]
    assert facts.nvidia_smi.found and facts.nvidia_smi.version == "580.159.04"
    assert facts.gpus[0].arch == "sm_90"
    assert facts.python.found and facts.python.version == sys.version.split()[0]
    assert facts.disk is not None and facts.disk.path == str(tmp_path) and facts.disk.free_bytes
    assert facts.service.state == "inactive"
    assert "inventory says gpus = 8, nvidia-smi shows 2" in facts.warnings
    assert "inventory says cuda_arch = sm_120, GPUs are ['sm_90']" in facts.warnings


def test_missing_tools_are_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = Target(name="local", python="/nonexistent/python3", remote_root=str(tmp_path))
    host = LocalHost(target)
    facts = gather_facts(host)
    assert not facts.python.found and "not found" in (facts.python.error or "")
    assert "python /nonexistent/python3 not found on the host" in facts.warnings
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no CUDA tool on it
    facts = gather_facts(host)
    assert not facts.nvidia_smi.found and facts.gpus == []


def test_cli_facts_over_ssh_json_and_record(inventory_file: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "OPS_RUNS_DIR": str(runs)}
    res = ops("facts", "loop", "--json", "--inventory", str(inventory_file), env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["target"] == "loop" and doc["python"]["found"] and doc["kernel"].startswith("Linux")
    assert doc["service"]["manager"] == "process"
    record = json.loads((Path(doc["run_dir"]) / "record.json").read_text())
    assert record["command"] == "facts" and record["outcome"] == "ok"
    assert record["facts"]["hostname"] == doc["hostname"]


def test_cli_facts_unreachable_is_one_line_exit_2(sshd: Sshd, tmp_path: Path) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f'[targets.down]\naddress = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'ssh_key = "{sshd.user_key}"\nknown_hosts = "{tmp_path}/empty_known_hosts"\n'
    )
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}
    res = ops("facts", "down", "--inventory", str(inv), env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.splitlines()[0].startswith("error: down: connect: host key of [127.0.0.1]:")
    (run,) = (tmp_path / "runs").iterdir()
    record = json.loads((run / "record.json").read_text())
    assert record["outcome"] == "error" and record["error"]["error"] == "HostKeyError"
