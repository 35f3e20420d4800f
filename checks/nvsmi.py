"""Parse `nvidia-smi --query-* --format=csv` output into GPU and process rows (stdlib only).

Works with or without units in the values ("518 MiB" or "518") and with header names as
nvidia-smi prints them ("memory.used [MiB]"). Drivers that renamed
`clocks_throttle_reasons.active` to `clocks_event_reasons.active` are read under either name;
the bitmask is decoded to reason names. Rows come back in PCI bus order, the order that
`CUDA_DEVICE_ORDER=PCI_BUS_ID` gives CUDA device indices. Shared by `checks.gpus` (on the
host) and `ops facts` (control plane).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import asdict, dataclass, field
from typing import Any

# The fields `checks.gpus` asks for; `facts` asks for the short list (works on old drivers).
GPU_FIELDS = (
    "index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu,clocks.sm,"
    "temperature.gpu,clocks_throttle_reasons.active,driver_version,compute_cap"
)
GPU_FIELDS_SHORT = "index,uuid,name,pci.bus_id,memory.used,memory.total,driver_version"
APPS_FIELDS = "pid,gpu_uuid,gpu_bus_id,used_memory,process_name"

# NVML clocks event (throttle) reason bits.
REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU is being slowed by something other than being idle.
BAD_REASONS = {
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_pct: int | None = None
    sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    driver_version: str | None = None
    compute_cap: str | None = None

    @property
    def arch(self) -> str | None:
        """`sm_90` for compute capability 9.0."""
        if not self.compute_cap or not re.fullmatch(r"\d+\.\d+", self.compute_cap):
            return None
        major, minor = self.compute_cap.split(".")
        return f"sm_{major}{minor}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arch": self.arch}


@dataclass
class GpuProcess:
    pid: int
    gpu_uuid: str
    gpu_bus_id: str | None = None
    used_memory_mib: int | None = None
    process_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(header: str) -> str:
    key = re.sub(r"\s*\[.*\]\s*$", "", header.strip())
    return key.replace("clocks_event_reasons", "clocks_throttle_reasons").replace(".", "_")


def _value(text: str) -> str | None:
    text = text.strip()
    if text in ("", "[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]"):
        return None
    return text


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.match(r"^(\d+)(?:\.\d+)?(?:\s*(?:MiB|MHz|%|C))?$", text)
    return int(m.group(1)) if m else None


def decode_reasons(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        mask = int(text, 16)
    except ValueError:
        return []
    return [name for bit, name in REASON_BITS.items() if mask & bit]


def _rows(csv_text: str) -> list[dict[str, str | None]]:
    lines = [ln for ln in csv_text.splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    header = [_key(h) for h in next(reader)]
    return [dict(zip(header, (_value(v) for v in row), strict=False)) for row in reader]


def parse_gpus(csv_text: str) -> list[Gpu]:
    """GPUs from `--query-gpu=... --format=csv[,nounits]` (with header), in PCI bus order."""
    gpus = []
    for row in _rows(csv_text):
        gpus.append(
            Gpu(
                index=_int(row.get("index")) or 0,
                uuid=row.get("uuid") or "",
                name=row.get("name") or "",
                pci_bus_id=row.get("pci_bus_id"),
                memory_used_mib=_int(row.get("memory_used")),
                memory_total_mib=_int(row.get("memory_total")),
                utilization_pct=_int(row.get("utilization_gpu")),
                sm_clock_mhz=_int(row.get("clocks_sm") or row.get("clocks_current_sm")),
                temperature_c=_int(row.get("temperature_gpu")),
                throttle_reasons=decode_reasons(row.get("clocks_throttle_reasons_active")),
                driver_version=row.get("driver_version"),
                compute_cap=row.get("compute_cap"),
            )
        )
    return sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))


def parse_apps(csv_text: str) -> list[GpuProcess]:
    """Compute processes from `--query-compute-apps=... --format=csv` (with header)."""
    procs = []
    for row in _rows(csv_text):
        pid = _int(row.get("pid"))
        if pid is None:
            continue
        procs.append(
            GpuProcess(
                pid=pid,
                gpu_uuid=row.get("gpu_uuid") or "",
                gpu_bus_id=row.get("gpu_bus_id"),
                used_memory_mib=_int(row.get("used_memory") or row.get("used_gpu_memory")),
                process_name=row.get("process_name"),
            )
        )
    return procs
