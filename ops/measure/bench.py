"""`ops bench`: the kernel benchmark on one GPU of a live host, guarded and interference-probed.

In order, all on the host: `checks.gpus` (nvidia-smi) feeds the guard (`ops.measure.gpu_guard`),
which
may refuse (exit 2) or HOLD (exit 3, no GPU) before anything runs; then `checks.probe` runs
`python -m kernels.bench --json ...` from the data-plane directory under
`CUDA_VISIBLE_DEVICES=N CUDA_DEVICE_ORDER=PCI_BUS_ID` (and the memory cap, when shared) while
it times a short greedy request to the service before, during and after; a rise of the p50
past the threshold kills the bench at once and the run is NO-GO (exit 1).

Outcomes: pass (0); no-go (1, interference); fail (1, the bench failed or a kernel's answer
differs from the reference); refused (2); hold (3: no GPU, or the service did not answer the
probe, so interference could not be measured). The section is built as the record's model,
`ops.sections.bench.BenchSection`, and dumped from it; rows the bench printed that are not
kernel rows (a NaN time, a batch of 0) fail the run, named, instead of reaching the record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, Field, ValidationError

from checks.docs import GpusDoc, ProbeDoc
from ops.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_HOLD, EXIT_OK, OpsError
from ops.hosts.dataplane import data_plane_dir, run_check
from ops.hosts.remote import Host
from ops.measure.gpu_guard import CAP_ENV, SUITES, evaluate
from ops.sections.bench import BenchRun, BenchSection, KernelRow, Probe, TableLine
from ops.service.managers import manager_for
from ops.verdict.service_cost import service_cost

OOM = "CUDA out of memory"  # torch's words for a failed allocation (torch.OutOfMemoryError)
PROBE_MARGIN_S = 180  # the probe's own phases (before/after) on top of the bench's time

# impl names of kernels.bench rows, by role in the table
OURS = ("cuda_events", "cuda", "cuda_rows", "cuda_stage", "cuda_engine")
GRAPH = ("cuda_graph",)
TORCH = ("torch", "torch_sdpa", "torch_argmax", "torch_rows", "torch_engine")
SIZE_KEYS = {
    "B": "B",
    "batch": "B",
    "budget": "n",
    "K": "K",
    "prefix": "L",
    "L": "L",
    "tree_rows": "T",
    "T": "T",
}


MAX_BENCH_S = 86_400.0  # a bench's time limit: a day is past any suite


class BenchOptions(BaseModel):
    gpu: int | None  # None: the target has no bench_gpu; the guard asks for --gpu
    suites: list[str]
    batches: list[int]
    allow_shared: bool = False
    threshold: float = 0.10
    # seconds between the probe's requests: the default keeps the service busy part of the
    # time; on a GPU the bench shares with the service (--allow-shared) a longer pause keeps
    # the probe's own load out of the bench's timings
    probe_interval: float = Field(default=0.05, ge=0)
    max_mem_gib: float | None = None
    timeout: float = Field(default=1800.0, gt=0, le=MAX_BENCH_S)
    # attn: the decode rows' requests' prefixes spread over this many tokens past L
    # (`kernels.bench --decode-spread`; a playbook's bench.decode_spread); 0: every request at L
    decode_spread: int = Field(default=0, ge=0, le=65536)


class BenchOutcome(BaseModel):
    code: int
    outcome: str
    message: str = ""
    hint: str | None = None
    section: BenchSection


def parse_list(text: str, flag: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise OpsError(f"{flag} needs at least one value, got {text!r}")
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise OpsError(f"{flag}: unknown {bad[0]!r}; known: {', '.join(allowed)}")
    return items


def parse_suites(text: str) -> list[str]:
    return parse_list(text, "--suite", SUITES)


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(x) for x in parse_list(text, "--batch")]
    except ValueError:
        raise OpsError(f"--batch takes integers like 1,8,64, got {text!r}") from None
    if any(b < 1 or b > 4096 for b in batches):
        raise OpsError(f"--batch sizes must be in 1..4096, got {text!r}")
    return batches


def service_pid(host: Host) -> int | None:
    """The service's main pid where its manager knows it (process: pidfile; systemd: MainPID)."""
    svc = host.target.service
    if svc.manager == "systemd":
        res = host.run(
            ["systemctl", "show", "-p", "MainPID", "--value", svc.name],
            warn=True,
            step="service pid",
        )
        text = res.stdout.strip()
        return int(text) if res.ok and text.isdigit() and int(text) > 0 else None
    st = manager_for(host).status()
    return st.pid if st.state in ("active", "activating") else None


def release_id(host: Host, cwd: str) -> str:
    """The release the bench runs from: `current`'s target, or the checkout's git sha on local."""
    if host.target.is_local:
        res = host.run(["git", "-C", cwd, "rev-parse", "HEAD"], warn=True, step="release id")
        sha = res.stdout.strip()
        return f"checkout {sha[:12]}" if res.ok and sha else f"checkout {cwd} (no git)"
    res = host.run(["readlink", "-f", cwd], warn=True, step="release id")
    return res.stdout.strip().rsplit("/", 1)[-1] if res.ok else "unknown"


def bench_argv(python: str, opts: BenchOptions, engine: list[str] | None = None) -> list[str]:
    argv = [
        python,
        "-B",  # no bytecode written into the release (host_actions run_module says why)
        "-m",
        "kernels.bench",
        "--json",
        "--suite",
        ",".join(opts.suites),
        "--batch",
        ",".join(map(str, opts.batches)),
    ]
    if {"attn", "engine_attn"} & set(opts.suites) and opts.decode_spread:
        argv += ["--decode-spread", str(opts.decode_spread)]
    if "engine_attn" in opts.suites and engine:
        argv += engine
    return argv


def engine_flags(host: Host) -> list[str]:
    """kernels.bench's flags for the engine_attn suite: the reference engine built as the
    service runs it (preset, mode, max tree budget, CUDA graphs, matmul precision), read from
    the service's /get_server_info. A service that does not report them (not the reference
    engine, e.g. SGLang) cannot be mirrored: OpsError (exit 2)."""
    t = host.target
    res = run_check(host, "checks.probe", ["--url", t.service.url, "--counters"], timeout=60)
    info = res.data.get("server_info")
    status = res.data.get("server_info_status")
    if not isinstance(info, dict) and not isinstance(status, int):  # no HTTP answer at all
        raise OpsError(
            f"{t.name}: --suite engine_attn reads the engine's config from the service, and "
            f"{t.service.url} did not answer ({status})",
            hint=f"is the service up? ops healthcheck {t.name}; ops service start {t.name}",
        )
    info = info if isinstance(info, dict) else {}
    engine = (info.get("config") or {}).get("engine") or {}
    if not isinstance(info.get("preset"), str) or not isinstance(engine.get("max_budget"), int):
        raise OpsError(
            f"{t.name}: --suite engine_attn benches the reference engine as its service runs "
            f"it, and the service at {t.service.url} does not report its engine "
            "(/get_server_info: no preset and config.engine.max_budget)",
            hint="--suite attn times the engine's attention call without the engine",
        )
    graphs = (info.get("cuda_graphs") or {}).get("enabled", True)
    return [
        "--engine-preset",
        info["preset"],
        "--engine-mode",
        str(info.get("mode") or "ddtree"),
        "--engine-max-budget",
        str(engine["max_budget"]),
        "--engine-graphs",
        "on" if graphs else "off",
        "--matmul",
        "fp32" if info.get("matmul") == "fp32" else "tf32",
    ]


def run_bench(
    host: Host, opts: BenchOptions, progress: Callable[[str], None] = lambda s: None
) -> BenchOutcome:
    t = host.target
    section = BenchSection(
        target=t.name,
        gpu=opts.gpu,
        cuda_visible_devices=None if opts.gpu is None else str(opts.gpu),
        suites=opts.suites,
        batches=opts.batches,
        threshold=opts.threshold,
        decode_spread=opts.decode_spread,
    )
    progress("service pid")
    pid = service_pid(host)
    progress("GPUs (nvidia-smi)")
    args = ["--service-pid", str(pid)] if pid else []
    gpus = cast(GpusDoc, run_check(host, "checks.gpus", args).data)
    guard = evaluate(
        gpus,
        opts.gpu,
        target=t.name,
        suites=opts.suites,
        batches=opts.batches,
        allow_shared=opts.allow_shared,
        max_mem_gib=opts.max_mem_gib,
        service_pid=pid,
        inventory_gpus=t.gpus,
        spread=opts.decode_spread,
    )
    section.guard = guard
    section.environment = environment(gpus, guard.gpu_info, opts.gpu, guard.processes)
    if guard.verdict == "hold":
        section.ok, section.hold_reasons = False, [guard.message]
        return BenchOutcome(code=EXIT_HOLD, outcome="hold", message=guard.message, section=section)
    if guard.verdict == "refused":
        section.ok = False
        return BenchOutcome(
            code=EXIT_BAD_INPUT,
            outcome="refused",
            message=guard.message,
            hint=guard.hint,
            section=section,
        )
    cwd = data_plane_dir(host)
    section.environment["release"] = release_id(host, cwd)
    env = {"CUDA_VISIBLE_DEVICES": str(opts.gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.update(guard.cap_env)
    section.environment["bench_env"] = env
    if "engine_attn" in opts.suites:
        progress("the service's engine config (engine_attn)")
        engine = engine_flags(host)
        section.engine_flags = engine
    else:
        engine = None
    cmd = bench_argv(t.python, opts, engine)
    section.command = " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd)
    probe_args = [
        "--url",
        t.service.url,
        "--threshold",
        str(opts.threshold),
        "--interval",
        str(opts.probe_interval),
        "--max-seconds",
        str(opts.timeout),
        "--",
        *cmd,
    ]
    progress(f"kernels.bench on GPU {opts.gpu}, probing the service")
    res = host.run_module(
        "checks.probe", probe_args, cwd=cwd, env=env, timeout=opts.timeout + PROBE_MARGIN_S
    )
    if res.rc == 2:
        raise OpsError(f"{t.name}: checks.probe: {res.data.get('message', 'bad input')}")
    return conclude(section, cast(ProbeDoc, res.data), guard.cap_env)


def conclude(section: BenchSection, probe: ProbeDoc, cap: dict[str, str]) -> BenchOutcome:
    """Turn the probe's document (with the bench's inside) into the section and the outcome."""
    cmd = probe["cmd"]
    doc = cmd.get("document") or {}
    rows, unread = kernel_rows(doc.get("results") or [])
    section.probe = probe_section(probe)
    section.service_cost = service_cost(probe["before"]["ms"], probe["during"]["ms"])
    section.rows = rows
    section.table = kernel_table(rows)
    section.refcheck_failed = [str(x) for x in doc.get("refcheck_failed") or []]
    section.environment["bench"] = doc.get("env")
    section.bench_run = BenchRun(
        argv=cmd["argv"],
        rc=cmd["rc"],
        killed=cmd["killed"],
        timed_out=cmd["timed_out"],
        duration_s=cmd["duration_s"],
        stderr_tail=(cmd.get("stderr_tail") or "")[-2000:],
        stdout_tail=(cmd.get("stdout_tail") or "")[-2000:],
    )
    if cap:
        # kernels.bench acknowledges a cap it enforced with a `memory_cap` key in its document
        section.memory_cap = {"env": cap, "acknowledged_by_bench": "memory_cap" in doc}
    if probe["tripped"]:
        trip = probe.get("trip") or {}
        why = trip.get("reason") or (
            f"p50 during {probe['during']['p50_ms']:.2f} ms > {probe['limit_ms']:.2f} ms"
        )
        return _ends(section, EXIT_FAIL, "no-go", [f"interference: {why}"], interference=True)
    section.interference = False if probe["measured"] else None
    reasons = _failures(cmd, cap, section.refcheck_failed, unread)
    if reasons:
        return _ends(section, EXIT_FAIL, "fail", reasons)
    if not rows:  # e.g. no CUDA device where it ran: nothing measured is no evidence
        notes = "; ".join(doc.get("notes") or []) or "no suite produced a row"
        return _ends(section, EXIT_HOLD, "hold", [f"the bench gave no rows: {notes}"])
    if not probe["measured"]:
        why = probe.get("unmeasured_reason") or "the service did not answer the probe"
        return _ends(section, EXIT_HOLD, "hold", [f"interference not measured: {why}"])
    section.ok, section.reasons = True, []
    return BenchOutcome(code=EXIT_OK, outcome="pass", section=section)


def _failures(
    cmd: dict[str, Any], cap: dict[str, str], refcheck_failed: list[str], unread: list[str]
) -> list[str]:
    """Why the bench itself failed: killed on time, its exit, a wrong answer, a row unread."""
    reasons: list[str] = []
    stderr = cmd.get("stderr_tail") or ""
    if cmd["timed_out"]:
        reasons.append(f"the bench ran past {cmd['duration_s']:.0f} s and was killed")
    elif cmd["rc"] != 0:
        tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
        if OOM in stderr:  # the bench's own process: never the service's
            limit = f" (its cap {cap[CAP_ENV]} GiB)" if cap.get(CAP_ENV) else ""
            reasons.append(f"the bench ran out of GPU memory{limit}: {tail[0][:300]}")
        else:
            reasons.append(f"the bench exited {cmd['rc']}: {tail[0]}")
    if refcheck_failed:
        reasons.append(
            "a kernel's answer differs from the reference: " + "; ".join(refcheck_failed[:5])
        )
    if unread:
        reasons.append(
            f"the bench printed {len(unread)} row(s) that are no kernel row: {unread[0]}"
        )
    return reasons


def _ends(
    section: BenchSection, code: int, outcome: str, reasons: list[str], interference: bool = False
) -> BenchOutcome:
    """The outcome of a bench that did not pass: a HOLD's reasons are its hold_reasons."""
    section.ok = False
    if interference:
        section.interference = True
    if code == EXIT_HOLD:
        section.hold_reasons = reasons
    else:
        section.reasons = reasons
    return BenchOutcome(code=code, outcome=outcome, message=reasons[0], section=section)


def kernel_rows(results: list[Any]) -> tuple[list[KernelRow], list[str]]:
    """The bench's rows as the record's model, and one line for each row that is not one."""
    rows: list[KernelRow] = []
    unread: list[str] = []
    for i, r in enumerate(results):
        try:
            rows.append(KernelRow.model_validate(r))
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(x) for x in e["loc"]) or "(row)"
            name = f"{r.get('kernel')}/{r.get('impl')}" if isinstance(r, dict) else f"#{i}"
            unread.append(f"row {i} ({name}): {where}: {e['msg']}")
    return rows, unread


def probe_section(probe: ProbeDoc) -> Probe:
    """The probe as the record's model: its three windows' samples and p50s lifted out, the rest
    of checks.probe's document kept beside them."""
    b, d, a = probe["before"], probe["during"], probe["after"]
    return Probe.model_validate(
        {
            **{k: v for k, v in probe.items() if k not in ("cmd", "ok", "module")},
            "before_ms": b["ms"],
            "during_ms": d["ms"],
            "after_ms": a["ms"],
            "p50_before_ms": b["p50_ms"],
            "p50_during_ms": d["p50_ms"],
            "p50_after_ms": a["p50_ms"],
        }
    )


def environment(
    gpus: GpusDoc,
    info: dict[str, Any] | None,
    gpu: int | None,
    procs: list[dict[str, Any]],
) -> dict[str, Any]:
    info = info or {}
    return {
        "gpu_name": info.get("name"),
        "gpu_uuid": info.get("uuid"),
        "pci_bus_id": info.get("pci_bus_id"),
        "driver": info.get("driver_version"),
        "sm_clock_mhz": info.get("sm_clock_mhz"),
        "temperature_c": info.get("temperature_c"),
        "throttle_reasons": info.get("throttle_reasons"),
        "CUDA_VISIBLE_DEVICES": None if gpu is None else str(gpu),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "other_processes": procs,
        "nvidia_smi": "available" if gpus.get("available") else gpus.get("reason"),
    }


def size_label(shape: dict[str, Any]) -> str:
    return " ".join(f"{SIZE_KEYS[k]}{v}" for k, v in shape.items() if k in SIZE_KEYS)


def kernel_table(rows: list[KernelRow]) -> list[TableLine]:
    """One line per (kernel, shape): ours (median, IQR), graph, both CPU baselines, torch."""
    groups: dict[tuple[str, str, str], TableLine] = {}
    for r in rows:
        key = (r.suite, r.kernel, json.dumps(r.shape, sort_keys=True))
        g = groups.setdefault(
            key, TableLine(suite=r.suite, kernel=r.kernel, shape=r.shape, size=size_label(r.shape))
        )
        impl, med = r.impl, r.median_us
        if impl in OURS:
            g.ours_us, g.ours_iqr_us = med, r.iqr_us
            g.speedup = dict(r.speedup)
        elif impl in GRAPH:
            g.graph_us = med
        elif impl in ("cpu_python", "reference_stage"):  # the stage's baseline: the Python one
            g.cpu_python_us = med
        elif impl == "cpu_cpp":
            g.cpu_cpp_us = med
        elif impl in TORCH:
            g.torch_us, g.torch_impl = med, impl
    return list(groups.values())
