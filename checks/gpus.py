"""`python -m checks.gpus --json [--expect N]`: this host's GPUs (PCI bus order) and who uses them.

Per GPU: index, UUID, name, memory used/total/free, utilisation, SM clock, temperature, active
throttle reasons, and the compute processes on it. With `--service-pid P`, each process says
whether it is the service's own (P itself or a descendant of P, from /proc on this host).
No nvidia-smi is a fact (`available: false`, exit 0), not a failure. The GPUs are called sane
unless nvidia-smi fails, the count differs from `--expect`, a hardware or thermal slowdown is
active, or a GPU runs hotter than `--max-temp`; each problem is listed with its evidence, and
exit is 1.

Prints (`checks.docs.GpusDoc`):
    ok            bool   no problem
    available     bool   nvidia-smi is there (`reason` says why not)
    error         str    nvidia-smi hung or failed (a problem)
    device_order  str    PCI_BUS_ID: indices are nvidia-smi's, in bus order
    service_pid   int|None   the --service-pid the processes were matched against
    problems      list   one line per problem
    gpus          list   one `GpuRow` per GPU: index, uuid, name, pci_bus_id, memory
                         used/total/free (MiB), utilization_pct, sm_clock_mhz, temperature_c,
                         throttle_reasons, driver_version, compute_cap, arch (sm_XY), and
                         processes (`GpuProcess`: pid, used_memory_mib, process_name, service)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser
from checks.nvsmi import APPS_FIELDS, BAD_REASONS, GPU_FIELDS, Gpu, parse_apps, parse_gpus


def nvidia_smi(query: str, fields: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return subprocess.run(
        ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def problems(gpus: list[Gpu], expect: int | None, max_temp: int) -> list[str]:
    found = []
    if expect is not None and len(gpus) != expect:
        found.append(f"expected {expect} GPUs, nvidia-smi shows {len(gpus)}")
    for g in gpus:
        bad = sorted(BAD_REASONS.intersection(g.throttle_reasons))
        if bad:
            found.append(f"GPU {g.index} ({g.uuid}): clocks slowed by {', '.join(bad)}")
        if g.temperature_c is not None and g.temperature_c > max_temp:
            found.append(f"GPU {g.index} ({g.uuid}): {g.temperature_c} C > {max_temp} C")
    return found


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc/PID/stat, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def descends_from(pid: int, ancestor: int) -> bool | None:
    """Is `pid` the process `ancestor` or one of its descendants (by the parent chain)?

    None when `pid` is not visible here (gone, or nvidia-smi reports the pids of another pid
    namespace, as in a container): then nobody can tell from this host.
    """
    if pid != ancestor and not os.path.exists(f"/proc/{pid}"):
        return None
    seen: set[int] = set()
    cur: int | None = pid
    while cur is not None and cur > 1 and cur not in seen:
        if cur == ancestor:
            return True
        seen.add(cur)
        cur = parent_pid(cur)
    return False


def free_mib(g: Gpu) -> int | None:
    if g.memory_total_mib is None or g.memory_used_mib is None:
        return None
    return max(0, g.memory_total_mib - g.memory_used_mib)


def inventory(timeout: float, service_pid: int | None = None) -> dict[str, Any]:
    """Everything nvidia-smi says, or why there is nothing to say."""
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "gpus": []}
    try:
        res = nvidia_smi("gpu", GPU_FIELDS, timeout)
        apps = nvidia_smi("compute-apps", APPS_FIELDS, timeout)
    except subprocess.TimeoutExpired:
        return {"available": True, "error": f"nvidia-smi hung for {timeout:g}s", "gpus": []}
    if res.returncode != 0:
        text = (res.stderr or res.stdout).strip()[-300:]
        return {
            "available": True,
            "error": f"nvidia-smi exited {res.returncode}: {text}",
            "gpus": [],
        }
    gpus = parse_gpus(res.stdout)
    procs = parse_apps(apps.stdout) if apps.returncode == 0 else []
    rows = []
    for g in gpus:
        mine = [p.to_dict() for p in procs if p.gpu_uuid == g.uuid]
        for p in mine:
            p["service"] = None if service_pid is None else descends_from(p["pid"], service_pid)
        rows.append({**g.to_dict(), "memory_free_mib": free_mib(g), "processes": mine})
    return {"available": True, "gpus": rows, "_parsed": gpus}


def main(argv: list[str] | None = None) -> None:
    p = parser("checks.gpus", "GPU inventory and sanity via nvidia-smi.")
    p.add_argument("--expect", type=int, default=None, help="the GPU count the host should have")
    p.add_argument("--max-temp", type=int, default=90, help="hottest acceptable GPU (C)")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument(
        "--service-pid", default=None, help="mark the processes that are this pid or its children"
    )
    args = p.parse_args(argv)
    service_pid = None
    if args.service_pid not in (None, ""):
        if not re.fullmatch(r"[1-9][0-9]*", args.service_pid):
            p.error(f"--service-pid must be a process id, got {args.service_pid!r}")
        service_pid = int(args.service_pid)
    inv = inventory(args.timeout, service_pid)
    parsed: list[Gpu] = inv.pop("_parsed", [])
    found: list[str] = []
    if inv.get("error"):
        found.append(inv["error"])
    elif inv["available"]:
        found += problems(parsed, args.expect, args.max_temp)
    exit_json(
        {
            "ok": not found,
            "module": "checks.gpus",
            "device_order": "PCI_BUS_ID",
            "service_pid": service_pid,
            "problems": found,
            **inv,
        },
        EXIT_FAIL if found else EXIT_PASS,
    )


if __name__ == "__main__":
    main()
