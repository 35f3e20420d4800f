"""`ops facts`: what is on a target (OS, python, nvcc, GPUs, disk, service), in one round trip.

A fixed probe script runs on the host and prints marked sections; each section's exit code
comes back with it, so a missing tool (no nvidia-smi, no nvcc, no systemd) is a fact in the
report, never a crash. The facts are compared with what the inventory claims (GPU count,
CUDA arch) and every disagreement is listed under `warnings`.
"""

from __future__ import annotations

import json
import re
import shlex

from pydantic import BaseModel, Field

from checks.nvsmi import GPU_FIELDS, GPU_FIELDS_SHORT, Gpu, parse_gpus
from ops.hosts.inventory import Target
from ops.hosts.remote import HOST_PYTHON_MIN, Host, python_version, shell_path, too_old
from ops.service.managers import PROCMAN_SOURCE, pidfile

MARK = "@@ops-facts"


class Tool(BaseModel):
    """A program on the host: where it is and what version it says it is, or why not."""

    found: bool
    path: str | None = None
    version: str | None = None
    error: str | None = None


class Disk(BaseModel):
    path: str
    free_bytes: int | None = None
    total_bytes: int | None = None


class ServiceState(BaseModel):
    name: str
    manager: str
    state: str  # active | inactive | failed | unknown | ...
    detail: str | None = None


class Facts(BaseModel):
    target: str
    hostname: str | None = None
    os: str | None = None
    kernel: str | None = None
    python: Tool
    nvcc: Tool
    nvidia_smi: Tool
    gpus: list[Gpu] = Field(default_factory=list)
    disk: Disk | None = None
    service: ServiceState
    warnings: list[str] = Field(default_factory=list)


def probe_script(target: Target) -> str:
    """The bash script that gathers every fact; all target-derived words are quoted."""
    py = shlex.quote(target.python)
    root = shell_path(target.remote_root)
    svc = target.service
    if svc.manager == "systemd":
        service = f"systemctl is-active {shlex.quote(svc.name)} 2>&1"
    else:
        # the process manager's own status: a pid counts only when its identity is proven
        service = (
            f"{py} -c {shlex.quote(PROCMAN_SOURCE)} status "
            f"{shell_path(pidfile(target))} {shlex.quote(svc.url)}"
        )
    sections = {
        "hostname": "hostname",
        "kernel": "uname -srm",
        "os": '. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"',
        "python": f"command -v {py} && {py} --version 2>&1",
        "nvcc": (
            "n=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) && "
            'echo "$n" && "$n" --version | grep -i release'
        ),
        "nvidia_smi": "command -v nvidia-smi",
        "gpus": (
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID; "
            f"nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,nounits 2>/dev/null || "
            f"nvidia-smi --query-gpu={GPU_FIELDS_SHORT} --format=csv,nounits"
        ),
        "disk": (
            f'd={root}; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; '
            'echo "$d"; df -Pk "$d" | tail -n 1'
        ),
        "service": service,
    }
    parts = []
    for name, cmd in sections.items():
        parts.append(f'echo "{MARK} {name}"; ( {cmd} ) 2>&1; echo "{MARK}-rc $?"')
    return "\n".join(parts)


def parse_sections(stdout: str) -> dict[str, tuple[int, str]]:
    """{section: (rc, text)} from the probe's marked output."""
    out: dict[str, tuple[int, str]] = {}
    name: str | None = None
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(f"{MARK}-rc ") and name is not None:
            out[name] = (int(line.split()[-1]), "\n".join(lines).strip())
            name, lines = None, []
        elif line.startswith(MARK + " "):
            name, lines = line[len(MARK) + 1 :].strip(), []
        elif name is not None:
            lines.append(line)
    return out


def _tool(rc_text: tuple[int, str] | None, missing: str) -> Tool:
    if rc_text is None:
        return Tool(found=False, error="probe did not run")
    rc, text = rc_text
    lines = text.splitlines()
    if rc != 0 or not lines:
        return Tool(found=False, error=missing if not text else f"{missing}: {lines[-1]}"[:300])
    version = lines[1].strip() if len(lines) > 1 else None
    if version:
        m = re.search(r"release ([0-9.]+)", version) or re.search(r"Python ([0-9.]+\S*)", version)
        version = m.group(1) if m else version
    return Tool(found=True, path=lines[0].strip(), version=version)


def gather_facts(host: Host) -> Facts:
    """Connect (if needed), run the probe once, and type what came back."""
    target = host.target
    result = host.run_script(probe_script(target), timeout=60, step="facts")
    sec = parse_sections(result.stdout)

    def text(name: str) -> str | None:
        rc_text = sec.get(name)
        return rc_text[1] if rc_text and rc_text[0] == 0 and rc_text[1] else None

    nvsmi = _tool(sec.get("nvidia_smi"), "nvidia-smi not found")
    gpus: list[Gpu] = []
    if nvsmi.found and text("gpus"):
        gpus = parse_gpus(text("gpus") or "")
        if gpus and gpus[0].driver_version:
            nvsmi = nvsmi.model_copy(update={"version": gpus[0].driver_version})
    elif nvsmi.found:
        nvsmi = nvsmi.model_copy(update={"error": (sec.get("gpus") or (0, ""))[1][:300] or None})
    disk = _disk(sec.get("disk"))
    state_line = (sec.get("service") or (1, "unknown"))[1].splitlines() or ["unknown"]
    state, _, detail = state_line[-1].partition(" ")
    if state_line[-1].startswith("{"):  # the process manager's JSON status
        try:
            doc = json.loads(state_line[-1])
            state, detail = str(doc.get("state", "unknown")), str(doc.get("detail", ""))
        except ValueError:  # (JSONDecodeError; an integer too long)
            state, detail = "unknown", state_line[-1][:200]
    facts = Facts(
        target=target.name,
        hostname=text("hostname"),
        os=text("os"),
        kernel=text("kernel"),
        python=_tool(sec.get("python"), f"{target.python} not found"),
        nvcc=_tool(sec.get("nvcc"), "nvcc not found"),
        nvidia_smi=nvsmi,
        gpus=gpus,
        disk=disk,
        service=ServiceState(
            name=target.service.name,
            manager=target.service.manager,
            state=state or "unknown",
            detail=detail or None,
        ),
    )
    facts.warnings.extend(compare_with_inventory(target, facts))
    return facts


def _disk(rc_text: tuple[int, str] | None) -> Disk | None:
    if not rc_text or rc_text[0] != 0:
        return None
    lines = rc_text[1].splitlines()
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    try:
        return Disk(path=lines[0], total_bytes=int(cols[1]) * 1024, free_bytes=int(cols[3]) * 1024)
    except (IndexError, ValueError):
        return Disk(path=lines[0])


def compare_with_inventory(target: Target, facts: Facts) -> list[str]:
    """What the inventory says that the host contradicts."""
    warnings = []
    if target.gpus and len(facts.gpus) != target.gpus:
        warnings.append(f"inventory says gpus = {target.gpus}, nvidia-smi shows {len(facts.gpus)}")
    archs = {g.arch for g in facts.gpus if g.arch}
    if target.cuda_arch and archs and archs != {target.cuda_arch}:
        warnings.append(f"inventory says cuda_arch = {target.cuda_arch}, GPUs are {sorted(archs)}")
    if not facts.python.found:
        warnings.append(f"python {target.python} not found on the host")
    elif too_old(python_version(facts.python.version or "")):
        need = ".".join(map(str, HOST_PYTHON_MIN))
        warnings.append(
            f"python {target.python} is {facts.python.version}: ops's data plane needs "
            f"Python {need}+ (set `python` in the inventory)"
        )
    return warnings
