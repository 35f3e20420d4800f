"""The `bench` section: `ops bench`'s rows (`KernelRow`, one per row of `python -m kernels.bench
--json`), its GPU guard's findings (`Guard`), its interference probe (`Probe`) and the whole
section (`BenchSection`), as ops.measure.bench builds it and ops.verdict reads it.

- `KernelRow` mirrors a row of `python -m kernels.bench --json` ("results"): suite, kernel,
  impl ("cuda_events" | "cuda_graph" | "cuda" | "cpu_python" | "cpu_cpp" | "torch" | ...),
  shape (`B` or `batch` is the batch size; budget, K, H, ...), median_us, p25_us, p75_us,
  iqr_us, reps, mode, and for CUDA rows `speedup` {baseline impl: x}.
- `Probe`: threshold (fraction, 0.10 = +10% p50), before/during/after latency samples in ms
  and their p50s, `tripped` (p50 during > before * (1 + threshold)), `stopped_early`.
- `Guard`: the GPU guard's findings: gpu, gpus present, processes on it, service_on_gpu,
  allow_shared, memory free/needed/cap (MiB), findings (one line each), ok.
- `BenchSection`: target, gpu, cuda_visible_devices, guard, probe, environment, rows,
  refcheck_failed, hold_reasons (e.g. ["no GPU on local"]: why no GPU rows exist), ok,
  reasons (why not ok), interference (True: the probe tripped).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from ops.sections.common import Ms, OpenModel


class KernelRow(OpenModel):
    suite: str
    kernel: str
    impl: str
    shape: dict[str, Any]
    median_us: float = Field(ge=0, allow_inf_nan=False)
    p25_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    p75_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    iqr_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    reps: int | None = None
    mode: str | None = None
    speedup: dict[str, float] = Field(default_factory=dict)
    refcheck: bool | None = None
    # a stage row's two parts (kernels.bench's attention stage rows): the plan on the host
    # clock and the calls on the GPU, each a median over the samples
    host_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    gpu_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    @field_validator("p25_us", "p75_us")
    @classmethod
    def _quartile(cls, v: float | None) -> float | None:
        """A 0 us quartile (under the timer's resolution) is unmeasured: the median stands in."""
        return v or None

    @field_validator("shape")
    @classmethod
    def _batch(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in ("B", "batch"):
            b = v.get(key)
            if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
                raise ValueError(f"{key}: a batch size is an integer >= 1, got {b!r}")
        return v

    @property
    def batch(self) -> int | None:
        b = self.shape.get("B", self.shape.get("batch"))
        return int(b) if b is not None else None

    @property
    def lo_us(self) -> float:
        return self.p25_us if self.p25_us is not None else self.median_us

    @property
    def hi_us(self) -> float:
        return self.p75_us if self.p75_us is not None else self.median_us


class ProbeWindow(OpenModel):
    """One of the probe's three windows (before, during, after the bench)."""

    ms: list[Annotated[float, Ms]] = Field(default_factory=list)
    p50_ms: Annotated[float, Ms] | None = None
    n: int = Field(default=0, ge=0)


class Probe(OpenModel):
    """None for a p50: the probe had no sample in that window (the report says unmeasured)."""

    threshold: float = Field(default=0.10, ge=0, allow_inf_nan=False)
    before_ms: list[Annotated[float, Ms]] = Field(default_factory=list)
    during_ms: list[Annotated[float, Ms]] = Field(default_factory=list)
    after_ms: list[Annotated[float, Ms]] = Field(default_factory=list)
    p50_before_ms: Annotated[float, Ms] | None = None
    p50_during_ms: Annotated[float, Ms] | None = None
    p50_after_ms: Annotated[float, Ms] | None = None
    tripped: bool = False
    stopped_early: bool = False
    # checks.probe's own document beside the lists above (a record older than them lacks them)
    before: ProbeWindow | None = None
    during: ProbeWindow | None = None
    after: ProbeWindow | None = None
    measured: bool | None = None
    limit_ms: float | None = None
    warnings: list[str] = Field(default_factory=list)


class Guard(OpenModel):
    """The GPU guard's findings (ops.measure.gpu_guard.evaluate builds it)."""

    ok: bool = True
    verdict: str | None = None  # "ok" | "refused" | "hold"
    message: str = ""  # why it refused or held
    hint: str | None = None
    gpu: int | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    gpu_info: dict[str, Any] | None = None
    processes: list[dict[str, Any]] = Field(default_factory=list)
    service_pid: int | None = None
    service_on_gpu: bool | None = None
    in_use: bool = False
    allow_shared: bool = False
    memory_free_mib: float | None = None
    memory_needed_mib: float | None = None
    memory_cap_mib: float | None = None
    cap_env: dict[str, str] = Field(default_factory=dict)  # the bench's memory cap, as env
    findings: list[str] = Field(default_factory=list)


class TableLine(OpenModel):
    """One line of the bench's console table: a (kernel, shape) with ours and each baseline."""

    suite: str
    kernel: str
    shape: dict[str, Any]
    size: str = ""
    speedup: dict[str, float] = Field(default_factory=dict)
    ours_us: float | None = None
    ours_iqr_us: float | None = None
    graph_us: float | None = None
    cpu_python_us: float | None = None
    cpu_cpp_us: float | None = None
    torch_us: float | None = None
    torch_impl: str | None = None


class BenchRun(OpenModel):
    """How `kernels.bench` ended under the probe (checks.probe's `cmd`), its output's tails."""

    argv: list[str] = Field(default_factory=list)
    rc: int | None = None
    killed: bool = False
    timed_out: bool = False
    duration_s: float | None = None
    stderr_tail: str = ""
    stdout_tail: str = ""


class BenchSection(OpenModel):
    target: str
    gpu: int | None = None
    cuda_visible_devices: str | None = None
    guard: Guard | None = None
    probe: Probe | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    rows: list[KernelRow] = Field(default_factory=list)
    refcheck_failed: list[str] = Field(default_factory=list)
    hold_reasons: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)  # why ok is False (e.g. the bench crashed)
    interference: bool | None = None  # True: the probe tripped; None: not measured
    ok: bool = True
    # how it was asked and run (the report reads none of these; the console and --json do)
    suites: list[str] = Field(default_factory=list)
    batches: list[int] = Field(default_factory=list)
    threshold: float | None = None
    decode_spread: int = 0
    engine_flags: dict[str, Any] | None = None
    command: str | None = None
    service_cost: dict[str, Any] | None = None  # ops.verdict.service_cost (None: no samples)
    table: list[TableLine] = Field(default_factory=list)
    bench_run: BenchRun | None = None
    memory_cap: dict[str, Any] | None = None  # {env, acknowledged_by_bench}
