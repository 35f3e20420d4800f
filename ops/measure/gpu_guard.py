"""The GPU guard of `ops bench`: may the bench run on GPU N of this host, and how?

Fed by `python -m checks.gpus --json` run on the host (nvidia-smi there, PCI bus order), it
decides before anything runs:

- no nvidia-smi, or no GPU in its answer: HOLD (exit 3), "no GPU on TARGET": the bench
  cannot run, and the record says so;
- GPU N is not on the host: refused (exit 2), naming the GPUs there are;
- GPU N is in use (a compute process on it, the service's own or any other; or memory used
  that no listed process accounts for, as when nvidia-smi cannot see another container's
  processes): refused (exit 2) unless `--allow-shared`;
- the chosen suites need more memory than GPU N has free, or than the cap: refused (exit 2);
  on a shared GPU, a cap or an estimate over half of what is free (SHARED_FRACTION) is refused;
- the service runs on every GPU (tensor parallel, as on the production host): the refusal
  says in one line that every bench there is shared and asks for `--allow-shared`.

Refusals are exit 2: the request itself is unsafe, and changing it (another `--gpu`,
`--allow-shared`, smaller `--batch`) is the fix the hint names. With `--allow-shared` the
bench's memory is capped (`--max-mem-gib`, default: the estimate of what the suites need)
and handed to the bench as `DDTREE_BENCH_MAX_MEM_GIB`.

The memory a suite needs is estimated from the shapes `kernels.bench` allocates (its default
budgets 16,64,128, K 8,64, H 15, V 163840, inputs rotated over at least 192 MiB), plus 1 GiB
for the CUDA context and the allocator's slack; engine_attn's from the two engines its child
builds (the `small` preset's KV pool each, plus a workspace).
"""

from __future__ import annotations

import math
from typing import Any

from checks.docs import GpuProcess, GpusDoc
from ops.sections.bench import Guard

CAP_ENV = "DDTREE_BENCH_MAX_MEM_GIB"
SUITES = ("topk", "tree", "accept", "attn", "engine_attn")
# a bench beside the service (--allow-shared) may take at most this share of the GPU's free
# memory: the rest stays the service's headroom (its KV cache grows, its allocator caches)
SHARED_FRACTION = 0.5
UNLISTED_MIB = 1024  # memory in use beyond the listed processes that makes a GPU "in use"
CONTEXT_BYTES = 1 << 30
H, V, BUDGETS, KS = 15, 163840, (16, 64, 128), (8, 64)
ROTATE = 192 << 20
ATTN_SIZES = (
    (64, 4096, 65, 8),
    (8, 32768, 65, 8),
    (16, 1024, 33, 8),
    (1, 4096, 65, 8),
    (4, 8192, 65, 16),
)  # kernels.bench.attn.SIZES


def _sets(nbytes: int) -> int:
    return max(2, min(64, math.ceil(ROTATE / max(nbytes, 1))))


def _attn_bytes(b: int, prefix: int, t: int, heads: int) -> int:
    length = prefix + t
    kv = b * math.ceil(length / 64) * 64 * 576 * 2
    q = b * t * heads * 576 * 2
    sets = max(1, min(48, math.ceil(200_000_000 / (kv + b * t * heads * 1088 * 2))))
    gathered = b * length * 576 * 2 + b * t * heads * length  # keys + boolean mask, per set
    fp32_check = b * length * (576 + 512) * 4 + b * t * heads * length * 4
    return sets * (kv + q + gathered) + fp32_check


def _row_attn_bytes(b: int, spread: int, layers: int = 4) -> int:
    """The attn suite's decode rows at batch b over the longest default prefix (1024 keys, 17
    rows a request, prefixes spread over `spread` more): every layer's pool of the rotated input
    sets, and the torch path's largest group (keys, their latent copy, scores). Mirrors
    kernels.bench.attn's row_attention_rows and _input_sets (which this torch-free module cannot
    import)."""
    width = math.ceil((1024 + spread + 17) / 64) * 64
    per_set = b * width * 576 * 4
    sets = max(2, min(64, math.ceil(200_000_000 / per_set)))
    group = 64 * width * (576 + 512 + 2 * 8) * 4
    return sets * per_set * layers + sets * b * 17 * 8 * 576 * 4 + group


def _engine_attn_bytes() -> int:
    """engine_attn's child (engine.attn_bench): two engines of the `small` preset, each its
    paged KV pool (4 layers x (32 requests x 33 pages of 64 slots + 2) x 576 fp32, engine.decode)
    and 1.5 GiB for its weights, buffers, graphs and the torch path's workspace. An estimate:
    the child records its peak (`peak_reserved_mib`). On the H200 it read 2450 MiB at batches
    1,8 and a 256-token prompt (e1b490a) and 3510 MiB at batches 1,8,32 and 1024 tokens (0abddba,
    a rollout's bench), over the 2214 and 3238 MiB that workspaces of 0.5 and 1 GiB estimated."""
    pool = 4 * (32 * 33 + 2) * 64 * 576 * 4
    return 2 * (pool + (3 << 29))


def suite_bytes(suite: str, batches: list[int], spread: int = 0) -> int:
    """Peak bytes one suite allocates at the given batch sizes (an estimate, see module doc);
    `spread`: the attn decode rows' prefix spread (`--decode-spread`)."""
    if suite == "topk":
        return max(_sets(b * H * V * 2) * b * H * V * 2 + 2 * b * H * V * 4 for b in batches)
    if suite == "tree":
        return max(8 * b * H * 4096 * 4 * 3 for b in batches)
    if suite == "accept":
        sizes = [(b, n) for b in batches for n in BUDGETS]
        return max(
            _sets(b * (n + 1) * V * 2) * b * (n + 1) * V * 2 + b * (n + 1) * V * 4 for b, n in sizes
        )
    if suite == "attn":  # fixed sizes, then the engine's row attention at each batch
        fixed = max(_attn_bytes(*s) for s in ATTN_SIZES)
        return max(fixed, *(_row_attn_bytes(b, spread) for b in batches))
    if suite == "engine_attn":
        return _engine_attn_bytes()
    raise ValueError(suite)


def memory_needed_mib(suites: list[str], batches: list[int], spread: int = 0) -> float:
    """The suites run one after another and free their buffers: the largest one counts."""
    peak = max(suite_bytes(s, batches, spread) for s in suites)
    # engine_attn's child has a CUDA context of its own beside kernels.bench's
    contexts = 2 if "engine_attn" in suites else 1
    return round((peak + contexts * CONTEXT_BYTES) / 2**20, 1)


def _proc_line(p: GpuProcess, service_pid: int | None) -> str:
    if service_pid is None:
        who = "service pid unknown"
    else:
        who = {True: "the service's own", False: "not the service"}.get(
            p.get("service"), "pid not visible on the host: cannot tell"
        )
    mem = p.get("used_memory_mib")
    return (
        f"pid {p['pid']} {p.get('process_name') or '?'}"
        f"{f' {mem} MiB' if mem is not None else ''} ({who})"
    )


def evaluate(
    gpus_doc: GpusDoc,
    gpu: int | None,
    *,
    target: str,
    suites: list[str],
    batches: list[int],
    allow_shared: bool,
    max_mem_gib: float | None,
    service_pid: int | None,
    inventory_gpus: int = 0,
    spread: int = 0,
) -> Guard:
    """Decide from the host's `checks.gpus` document whether GPU `gpu` may be benchmarked.
    Where nvidia-smi cannot list the GPUs, the inventory's `gpus` (when set) still tells a GPU
    that is not there (refused, exit 2) from a host it cannot see into (HOLD)."""
    rows = gpus_doc.get("gpus") or []
    brief = [
        {k: g.get(k) for k in ("index", "name", "uuid", "pci_bus_id", "memory_free_mib")}
        for g in rows
    ]
    res = Guard(
        verdict="ok",
        ok=True,
        gpu=gpu,
        gpus=brief,
        service_pid=service_pid,
        allow_shared=allow_shared,
    )
    if not gpus_doc.get("available") or gpus_doc.get("error") or not rows:
        why = gpus_doc.get("reason") or gpus_doc.get("error") or "nvidia-smi lists no GPU"
        if gpu is not None and inventory_gpus and gpu >= inventory_gpus:
            return _refuse(
                res,
                f"{target} has no GPU {gpu}: its inventory says gpus = {inventory_gpus} "
                f"(0-{inventory_gpus - 1}); nvidia-smi could not list them ({why})",
                "pick one of them with --gpu (the target's bench_gpu is the default)",
            )
        return _hold(res, f"no GPU on {target} ({why})")
    mine = next((g for g in rows if g.get("index") == gpu), None)
    have = ", ".join(str(g.get("index")) for g in rows)
    if gpu is None:
        return _refuse(
            res,
            f"which GPU of {target}? give --gpu N; its GPUs (PCI bus order): {have}",
            f"or set bench_gpu in [targets.{target}]",
        )
    if mine is None:
        return _refuse(
            res,
            f"{target} has no GPU {gpu}; its GPUs (PCI bus order): {have}",
            "pick one of them with --gpu (the target's bench_gpu is the default)",
        )
    res.gpu_info = {k: v for k, v in mine.items() if k != "processes"}
    procs = list(mine.get("processes") or [])
    res.processes = procs
    res.service_on_gpu = any(p.get("service") for p in procs) if service_pid is not None else None
    used, total = mine.get("memory_used_mib"), mine.get("memory_total_mib")
    res.memory_free_mib = mine.get("memory_free_mib")
    if res.memory_free_mib is None and used is not None and total is not None:
        res.memory_free_mib = total - used
    res.findings.append(
        f"GPU {gpu}: {mine.get('name')} {mine.get('uuid')} at {mine.get('pci_bus_id')}, "
        f"{used} / {total} MiB used, {mine.get('utilization_pct')}% busy"
    )
    listed = sum(p.get("used_memory_mib") or 0 for p in procs)
    unlisted = (used or 0) - listed
    lines = [_proc_line(p, service_pid) for p in procs]
    if procs:
        res.findings.append(f"{len(procs)} process(es) on GPU {gpu}: " + "; ".join(lines))
    else:
        res.findings.append(f"no compute process on GPU {gpu}")
    if unlisted > UNLISTED_MIB:
        res.findings.append(
            f"{unlisted} MiB used on GPU {gpu} by processes nvidia-smi does not list "
            "(another container or pid namespace?)"
        )
    res.in_use = bool(procs) or unlisted > UNLISTED_MIB
    need = memory_needed_mib(suites, batches, spread)
    res.memory_needed_mib = need
    at = f"at batch {','.join(map(str, batches))}"
    res.findings.append(
        f"the suites {','.join(suites)} {at} need about {need / 1024:.1f} GiB (estimate); "
        f"{_gib(res.memory_free_mib)} free"
    )
    if res.in_use and not allow_shared:
        who = "the service" if res.service_on_gpu else "another process"
        detail = "; ".join(lines) or f"{unlisted} MiB in use"
        if res.service_on_gpu and _service_everywhere(rows):
            return _refuse(
                res,
                f"GPU {gpu} on {target} is in use by the service ({detail}), and the service "
                f"runs on every GPU of {target} ({len(rows)}; tensor parallel): a bench there "
                f"always shares one with it, so pass --allow-shared to bench GPU {gpu} beside "
                "the service (memory-capped, the interference probe watching it)",
                f"pass --allow-shared to bench GPU {gpu} beside the service; docs/performance.md "
                "says what a shared bench measured costing the service",
            )
        return _refuse(
            res,
            f"GPU {gpu} on {target} is in use by {who} ({detail}): refusing to benchmark on it",
            f"pick a free GPU with --gpu N, or pass --allow-shared to share GPU {gpu} with a "
            "memory-capped bench watched by the interference probe",
        )
    free = res.memory_free_mib
    if free is not None and need > free:
        return _refuse(
            res,
            f"GPU {gpu} on {target} has {_gib(free)} free; the suites need about "
            f"{need / 1024:.1f} GiB",
            "benchmark fewer or smaller sizes (--suite, --batch) or pick another GPU",
        )
    if allow_shared and res.in_use:
        cap = max_mem_gib * 1024 if max_mem_gib is not None else math.ceil(need / 1024) * 1024
        res.memory_cap_mib = cap
        res.cap_env = {CAP_ENV: f"{cap / 1024:g}"}
        res.findings.append(
            f"--allow-shared: GPU {gpu} is shared; the bench's memory is capped at "
            f"{cap / 1024:g} GiB ({CAP_ENV}) and the probe watches the service"
        )
        if cap < need:
            res.findings.append(
                f"warning: the cap {cap / 1024:g} GiB is below the estimate "
                f"{need / 1024:.1f} GiB: the bench may run out of memory"
            )
        room = None if free is None else free * SHARED_FRACTION
        if room is not None and max(cap, need) > room:
            what = "the cap" if cap >= need else "the suites' estimate"
            return _refuse(
                res,
                f"GPU {gpu} on {target} has {_gib(free)} free; a bench beside the service may "
                f"take at most {SHARED_FRACTION:.0%} of it ({_gib(room)}), and {what} is "
                f"{max(cap, need) / 1024:.1f} GiB",
                "benchmark fewer or smaller sizes (--suite, --batch), or lower --max-mem-gib",
            )
    elif max_mem_gib is not None:
        res.memory_cap_mib = max_mem_gib * 1024
        res.cap_env = {CAP_ENV: f"{max_mem_gib:g}"}
        res.findings.append(f"the bench's memory is capped at {max_mem_gib:g} GiB ({CAP_ENV})")
    return res


def _service_everywhere(rows: list[dict[str, Any]]) -> bool:
    """Every GPU of the host has one of the service's processes on it (tensor parallel)."""
    return bool(rows) and all(any(p.get("service") for p in g.get("processes") or []) for g in rows)


def _gib(mib: float | None) -> str:
    return "? GiB" if mib is None else f"{mib / 1024:.1f} GiB"


def _refuse(res: Guard, message: str, hint: str) -> Guard:
    res.verdict, res.ok, res.message, res.hint = "refused", False, message, hint
    res.findings.append(f"refused: {message}")
    return res


def _hold(res: Guard, message: str) -> Guard:
    res.verdict, res.ok, res.message = "hold", False, message
    res.findings.append(f"HOLD: {message}")
    return res
