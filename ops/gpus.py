"""Parse `nvidia-smi --query-* --format=csv` output into typed GPU and process rows.

Works with or without units in the values ("518 MiB" or "518") and with header names as
nvidia-smi prints them ("memory.used [MiB]"). Rows come back in PCI bus order, the order
`CUDA_DEVICE_ORDER=PCI_BUS_ID` gives CUDA device indices.
"""

from __future__ import annotations

import csv
import io
import re

from pydantic import BaseModel

GPU_QUERY = "index,uuid,name,pci.bus_id,memory.used,memory.total,driver_version,compute_cap"
GPU_QUERY_OLD = "index,uuid,name,pci.bus_id,memory.used,memory.total,driver_version"
APPS_QUERY = "pid,gpu_uuid,gpu_bus_id,used_memory,process_name"


class Gpu(BaseModel):
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    driver_version: str | None = None
    compute_cap: str | None = None

    @property
    def arch(self) -> str | None:
        """`sm_90` for compute capability 9.0."""
        if not self.compute_cap or not re.fullmatch(r"\d+\.\d+", self.compute_cap):
            return None
        major, minor = self.compute_cap.split(".")
        return f"sm_{major}{minor}"


class GpuProcess(BaseModel):
    pid: int
    gpu_uuid: str
    gpu_bus_id: str | None = None
    used_memory_mib: int | None = None
    process_name: str | None = None


def _key(header: str) -> str:
    return re.sub(r"\s*\[.*\]\s*$", "", header.strip()).replace(".", "_")


def _value(text: str) -> str | None:
    text = text.strip()
    if text in ("", "[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]"):
        return None
    return text


def _mib(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.match(r"^(\d+)(?:\s*MiB)?$", text)
    return int(m.group(1)) if m else None


def _rows(csv_text: str) -> list[dict[str, str | None]]:
    lines = [ln for ln in csv_text.splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    header = [_key(h) for h in next(reader)]
    return [dict(zip(header, (_value(v) for v in row), strict=False)) for row in reader]


def parse_gpus(csv_text: str) -> list[Gpu]:
    """GPUs from `--query-gpu=...--format=csv[,nounits]` (with header), in PCI bus order."""
    gpus = []
    for row in _rows(csv_text):
        gpus.append(
            Gpu(
                index=int(row.get("index") or 0),
                uuid=row.get("uuid") or "",
                name=row.get("name") or "",
                pci_bus_id=row.get("pci_bus_id"),
                memory_used_mib=_mib(row.get("memory_used")),
                memory_total_mib=_mib(row.get("memory_total")),
                driver_version=row.get("driver_version"),
                compute_cap=row.get("compute_cap"),
            )
        )
    return sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))


def parse_apps(csv_text: str) -> list[GpuProcess]:
    """Compute processes from `--query-compute-apps=...--format=csv` (with header)."""
    procs = []
    for row in _rows(csv_text):
        if not row.get("pid"):
            continue
        procs.append(
            GpuProcess(
                pid=int(row["pid"] or 0),
                gpu_uuid=row.get("gpu_uuid") or "",
                gpu_bus_id=row.get("gpu_bus_id"),
                used_memory_mib=_mib(row.get("used_memory") or row.get("used_gpu_memory")),
                process_name=row.get("process_name"),
            )
        )
    return procs
