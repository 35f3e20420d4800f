"""The JSON documents the `checks.*` modules print, as stdlib TypedDicts (no third-party import).

The control plane reads a module's document through these types (`typing.cast` of the parsed
JSON; nothing is validated twice); each module's docstring says which one it prints and what
its keys mean. Keys a document has only in some outcomes are `NotRequired`. Every document has
`ok` and `module`; bad input (exit 2) is `BadInput` from any module.
"""

from typing import Any, Literal, NotRequired, TypedDict


class BadInput(TypedDict):
    """Exit 2 from any module: the arguments (or the golden file) are wrong."""

    ok: Literal[False]
    module: str
    error: str  # "bad_input", "bad_golden"
    message: str


# -- checks.health ---------------------------------------------------------------------------
class HealthCheckRow(TypedDict):
    name: str  # health | health_generate | models | smoke | server_info
    status: Literal["pass", "fail", "skip"]
    detail: str
    http: NotRequired[dict[str, Any]]  # status, latency, body excerpt (checks.http summary)
    evidence: NotRequired[str]  # on a failure: what the service answered
    models: NotRequired[list[str]]  # models: the ids /v1/models lists
    avg_spec_accept_length: NotRequired[float | None]  # server_info: what the service reports
    latency_ms: NotRequired[float]  # smoke: the completion's latency
    text: NotRequired[str]  # smoke: what it answered
    token_ids: NotRequired[list[int] | None]  # smoke: its token ids, where the service gives them


class HealthDoc(TypedDict):
    ok: bool
    module: str
    url: str
    failed: list[str]
    checks: list[HealthCheckRow]


# -- checks.identity -------------------------------------------------------------------------
class PromptRow(TypedDict):
    id: str
    kind: str | None
    compared: Literal["ids", "text"]
    match: bool
    first_divergence: int | None
    golden_continuation: NotRequired[list[int] | str]
    got_continuation: NotRequired[list[int] | str]
    self_consistent: bool


class IdentityDoc(TypedDict):
    """Compare (`--golden`), record (`--record-golden`) or a failed request (`error`)."""

    ok: bool
    module: str
    error: NotRequired[str]  # "request_failed"
    message: NotRequired[str]
    evidence: NotRequired[str]
    # --record-golden
    recorded: NotRequired[int]
    path: NotRequired[str]
    kept: NotRequired[str | None]
    golden: NotRequired[dict[str, Any]]  # the golden set itself (schema ddtree-ops/golden/v1)
    # --golden
    concurrency: NotRequired[int]
    total: NotRequired[int]
    matched: NotRequired[int]
    identity_pct: NotRequired[float]
    mismatched: NotRequired[list[str]]
    nondeterministic: NotRequired[list[str]]
    aa_runs: NotRequired[int]
    golden_model: NotRequired[str | None]
    service: NotRequired[dict[str, Any]]
    warnings: NotRequired[list[str]]
    prompts: NotRequired[list[PromptRow]]


# -- checks.gpus -----------------------------------------------------------------------------
class GpuProcess(TypedDict):
    pid: int | None
    gpu_uuid: str
    gpu_bus_id: str | None
    used_memory_mib: int | None
    process_name: str | None
    service: NotRequired[bool | None]  # a descendant of --service-pid (None: pid not visible)


class GpuRow(TypedDict):
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    memory_free_mib: int | None
    utilization_pct: int | None
    sm_clock_mhz: int | None
    temperature_c: int | None
    throttle_reasons: list[str]
    driver_version: str | None
    compute_cap: str | None
    arch: str | None  # sm_90 for compute capability 9.0
    processes: list[GpuProcess]


class GpusDoc(TypedDict):
    ok: bool
    module: str
    device_order: str  # always PCI_BUS_ID
    service_pid: int | None
    problems: list[str]
    available: bool  # nvidia-smi found
    reason: NotRequired[str]  # why not available
    error: NotRequired[str]  # nvidia-smi hung or failed
    gpus: list[GpuRow]


# -- checks.loadtest -------------------------------------------------------------------------
class Dist(TypedDict):
    """Milliseconds; None without samples."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None


class AcceptLength(TypedDict):
    value: float | None
    source: str  # where the service reported it, or "not reported by the service"


class Counters(TypedDict):
    """One snapshot of the service's counters (`checks.probe.counters`)."""

    at: float  # unix time
    server_info: dict[str, Any] | None
    server_info_status: int | str | None
    metrics: dict[str, float] | None  # /metrics samples by name{labels}, buckets left out
    metrics_status: int | str | None


class WindowCounters(TypedDict):
    """`checks.loadtest --counters`: snapshots bracketing the measured window (`duration_s`)."""

    start: Counters  # taken after the warm-up, before the first measured request is sent
    end: Counters  # taken after the last measured request completed
    start_lead_s: float  # from `start` coming back to the first measured request going out
    end_lag_s: float  # from the last measured request's completion to asking for `end`


class LevelDoc(TypedDict):
    concurrency: int
    completed: int
    failed: int
    errors: dict[str, int]  # error -> requests that met it
    duration_s: float
    request_per_s: float | None
    output_tok_per_s: float | None
    output_tokens: int
    ttft_ms: Dist
    tpot_ms: Dist
    itl_ms: Dist
    e2e_ms: Dist
    accept_length: AcceptLength
    requests: NotRequired[int]  # added by ops.measure.loadtest: measured requests
    warmup: NotRequired[int]  # added by ops.measure.loadtest: uncounted requests first
    counters: NotRequired[WindowCounters]  # with --counters


class LoadtestDoc(TypedDict):
    ok: bool
    module: str
    url: str
    error: NotRequired[str]  # "crashed"
    message: NotRequired[str]
    requests: NotRequired[int]
    warmup: NotRequired[int]
    input_len: NotRequired[int]
    output_len: NotRequired[int]
    level: NotRequired[LevelDoc]


# -- checks.probe ----------------------------------------------------------------------------
class Phase(TypedDict):
    n: int
    answered: int
    failed: int
    ms: list[float]
    p25_ms: float | None
    p50_ms: float | None
    p75_ms: float | None
    errors: list[str]


class CmdRun(TypedDict):
    argv: list[str]
    pid: int
    rc: int | None
    killed: bool
    timed_out: bool
    duration_s: float
    document: dict[str, Any] | None  # CMD's stdout when it is one JSON document
    stdout_tail: str
    stderr_tail: str


class ProbeDoc(TypedDict):
    ok: bool
    module: str
    measured: bool
    unmeasured_reason: str | None
    threshold: float
    limit_ms: float | None
    request: dict[str, Any]
    during_request_timeout_s: float | None
    interval_s: float
    window: int
    before: Phase
    during: Phase  # plus at_s: when each request was sent
    after: Phase
    tripped: bool
    stopped_early: bool
    trip: dict[str, Any] | None  # the stop rule that fired: why, at_s, limit_ms, reason
    warnings: list[str]
    cmd: CmdRun


class ShadowDoc(TypedDict):
    """`checks.shadow`: the service's answer to arming (or disarming) its shadow."""

    ok: bool
    module: str
    offered: bool | None
    status: int | None
    shadow: dict[str, Any] | None
    message: str | None


class CountersDoc(Counters):
    """`checks.probe --counters`: one snapshot of the service's counters."""

    ok: bool
    module: str


# -- checks.hook_counters --------------------------------------------------------------------
class HookShadow(TypedDict):
    """One function's shadow in one process (the candidate timed beside the stock)."""

    every: int  # 1 call in `every` compared
    compared: int
    mismatched: int
    stock_s: float  # over the compared calls
    cand_s: float
    cand_errors: int  # the candidate raised where the stock answered (each also a mismatch)
    overhead_s: float  # the shadow's own time: candidate, copies, comparison
    saved: int  # mismatching cases written for replay
    pairs: int  # pairs written in all
    ring: NotRequired[list[list[int]]]  # with --pairs: [index, stock_ns, cand_ns], oldest first


class HookFunction(TypedDict):
    calls: int
    seconds: float  # in the function that serves (stock or drop-in), over all its calls
    errors: int  # calls that raised
    shadow: HookShadow | None


class HookProcess(TypedDict):
    file: str
    pid: int
    start_ticks: int
    created: float  # unix time
    components: dict[str, HookFunction]  # tree_build, accept


class HookCountersDoc(TypedDict):
    """`checks.hook_counters`: the import hook's counters of every live process of a service."""

    ok: bool
    module: str
    run_dir: str
    release: str
    at: float  # unix time of the read
    files: int
    live: int
    dead: int  # files of processes gone (or pids now another process's): skipped
    unreadable: list[dict[str, str]]  # file, why
    processes: list[HookProcess]
    mismatched: int  # over the live processes
    mismatch_files: list[str]  # saved cases in run_dir (hook-mismatch-<pid>-<component>-<n>.json)
    mismatch_cases: list[dict[str, Any]]  # the first few: file, component, candidate, difference
    status: dict[str, Any] | None  # the hook's hook-status.json
