"""`python -m checks.gpus` as a real process, fed by a stand-in nvidia-smi that replays output
recorded on a real 2x H200 host (one GPU busy), and with no nvidia-smi at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from checks.nvsmi import decode_reasons

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2-gpu1-busy"


def run_gpus(path: str, *args: str) -> tuple[int, dict]:
    res = subprocess.run(
        [sys.executable, "-m", "checks.gpus", "--json", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PATH": path},
        timeout=60,
    )
    return res.returncode, json.loads(res.stdout)


def stand_in(tmp_path: Path, gpu_csv: str) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gpu.csv").write_text(gpu_csv)
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$CUDA_DEVICE_ORDER" = PCI_BUS_ID ] || { echo "device order not set" >&2; exit 9; }\n'
        'case "$1" in\n'
        f"  --query-gpu=*) cat {bindir}/gpu.csv ;;\n"
        f"  --query-compute-apps=*) cat {FIXTURE}/query-compute-apps.csv ;;\n"
        "  *) exit 4 ;;\nesac\n"
    )
    script.chmod(0o755)
    return f"{bindir}:/usr/bin:/bin"


def test_recorded_h200_host(tmp_path: Path) -> None:
    code, doc = run_gpus(
        stand_in(tmp_path, (FIXTURE / "query-gpu.csv").read_text()), "--expect", "2"
    )
    assert code == 0 and doc["ok"] and doc["available"]
    g0, g1 = doc["gpus"]
    assert (g0["index"], g0["pci_bus_id"], g1["uuid"]) == (
        0,
        "00000000:00:06.0",
        "GPU-4a159795-65c4-9dc6-6b6c-855e4f7b58f8",
    )
    assert (g1["memory_used_mib"], g1["utilization_pct"], g1["sm_clock_mhz"]) == (4095, 100, 1980)
    assert g1["temperature_c"] == 46 and g1["throttle_reasons"] == []
    # the busy process also opened a context on GPU 0: both GPUs list it
    assert [p["used_memory_mib"] for p in g0["processes"]] == [518]
    assert [p["used_memory_mib"] for p in g1["processes"]] == [4086]


def test_wrong_count_and_thermal_slowdown_fail(tmp_path: Path) -> None:
    rows = (
        (FIXTURE / "query-gpu.csv")
        .read_text()
        .replace("0x0000000000000000, 208", "0x0000000000000060, 208")
    )
    code, doc = run_gpus(stand_in(tmp_path, rows), "--expect", "8")
    assert code == 1 and not doc["ok"]
    assert "expected 8 GPUs, nvidia-smi shows 2" in doc["problems"]
    assert any("GPU 1" in p and "hw_thermal_slowdown" in p for p in doc["problems"])


def test_no_nvidia_smi_is_a_fact(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, doc = run_gpus(str(tmp_path / "empty"))
    assert code == 0 and doc["available"] is False and doc["gpus"] == []


def test_decode_reasons() -> None:
    assert decode_reasons("0x0000000000000001") == ["gpu_idle"]
    assert decode_reasons("0x44") == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons("N/A") == [] and decode_reasons(None) == []
