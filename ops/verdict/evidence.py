"""The evidence `ops report` decides from: typed models of the record sections it reads.

Every command writes `runs/<dir>/record.json` (ops.hosts.records): the envelope `schema, command,
target, started, finished, inputs, outcome, exit_code` plus one section per kind of evidence,
under these top-level keys (a record may hold several; a rollout directory may hold one
record per step in sub-directories, e.g. `<rollout>/<nn>-<step>/record.json`):

    healthcheck  ops.measure.healthcheck.HealthReport (pre/post-flight; token identity, A/A runs).
                 Which flight it is: `inputs.role` ("preflight" | "postflight") or the
                 directory name containing "preflight" / "postflight"; without either, a
                 healthcheck after a successful deploy record (by `started`) is a post-flight,
                 any other a pre-flight. One run with `inputs.record_golden` compared nothing.
    bench        BenchSection: `ops bench`'s guard, interference probe, environment, KernelRows.
    profile      ProfileSection: `ops profile`, per concurrency: step time, stage times,
                 tokens/s, accept length; every number says `source`: measured | derived |
                 hook (measured by the SGLang import hook's per-process stage clock).
    measure      MeasureSection: rollout's `measure`, tokens/s before/after the switch, with an
                 A/A pair (two runs of the unchanged service) first.
    change       Change: which component switches from which backend to which (rollout, or
                 `ops report --change`).

Models (extra fields are allowed and kept, so a producer may record more than is read here):

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
- `Value`: one number with its spread and provenance: value (median), p25, p75, n, samples,
  source ("measured" | "derived" | "hook": measured inside the service by the release's
  SGLang import hook, integration.hook), note (how it was derived).
- `ProfileLevel`: concurrency, step_ms: Value, stage_ms {stage: Value} (stages of
  engine.stats.STAGES: draft, topk, tree_build, verify, accept, commit; plus "attention", the
  attention time inside verify, where the profile can tell it), tokens_per_s, accept_length,
  wall_share {stage: Value}: the stage's share of the measured window's wall time (its seconds
  over all the window's steps at any batch size, plus prefill's where it runs there, / the
  window's duration_s), the f of a closed-loop throughput gain. A record made before
  `ops profile` measured it has none: its f falls back to the share of the step at batch c
  (`f_of`).
- `ProfileSection`: target, levels, service (model, backends, config as the service reports),
  incomplete [{concurrency, missing}], failed_requests (the load's failures while profiling),
  interrupted ({levels_left}: a Ctrl-C; the levels that finished are kept).
- `MeasureLevel`: concurrency, aa: [A, A'] tokens/s samples of the unchanged service,
  before / after: tokens/s samples around the switch. `MeasureSection`: change, levels.
- `Change`: component (tree_build | accept | topk | attention), baseline / candidate backend
  (`reference|cpp|cuda`, `torch|cuda`); `bench_map()` names the bench suite, kernel and the
  two impls whose medians give s(c) (tree_build: suite "tree", build_trees, reference ->
  cpu_python, cpp -> cpu_cpp, cuda -> cuda_events); `shape` optionally pins other shape keys
  (e.g. {"budget": 16, "K": 8}); `baseline_impl` / `candidate_impl` override the map.
  `bench_kernel` optionally picks another kernel of the component (BENCH_KERNELS) with its own
  impl names: for `attention`, `row_attention` is the reference engine's own call (suite attn,
  fp32, torch -> torch_rows, cuda -> cuda_rows; shape B, T = budget + 1 rows, L = prefix keys,
  heads, kv_dim, dtype), so a rollout of the engine's attention pins e.g.
  `bench_kernel: row_attention, shape: {T: 17, L: 1024}` (playbooks/rollout-attention.yaml);
  without it, attention's s(c) is the generic tree_verify_attention (bf16) against torch SDPA.

`load_record(path)` reads and validates one record; a missing file, bad JSON or a bad field
raises `BadRecord`, one line naming the file and the field (exit 2). A number no run could
have measured (a 5e-324 tokens/s run, a batch of -inf, NaN A/A runs) is such a bad field; a
number ops does write for "not measured" (a 0 us quartile, a probe p50 of null) is read as
absent. `gather` reads the records one at a time (`read_evidence`: each document is let go
once its sections are models) and refuses records over REPORT_MAX_BYTES in all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from checks.vocabulary import COMPONENTS as VOCAB_COMPONENTS
from checks.vocabulary import HOST_BACKENDS, STEP_STAGES
from ops.errors import OpsError
from ops.files import MIB, FileRefused, read_text_bounded
from ops.hosts.records import RUNNING
from ops.measure.healthcheck import HealthReport

# hook: measured by the SGLang import hook's clock in the service's own processes (a measured
# number: the verdict uses it as it uses "measured"; ops.measure.counters.hook_level)
Source = Literal["measured", "derived", "hook"]
COMPONENTS = tuple(VOCAB_COMPONENTS)  # checks.vocabulary says them once
STAGES = STEP_STAGES  # the stages that add up to a step (attention is inside verify)
M = TypeVar("M", bound=BaseModel)
SECTIONS = ("healthcheck", "bench", "profile", "measure", "change")
RECORD_MAX_BYTES = 64 * MIB  # a rollout's biggest record is a few MB
REPORT_MAX_BYTES = 256 * MIB  # all the records one report reads (a rollout's: a few MB)


class BadRecord(OpsError):
    """A record that cannot be used: names the file and the field."""

    def __init__(self, path: Path | str, field: str, problem: str) -> None:
        super().__init__(f"{path}: {field}: {problem}")
        self.path = str(path)
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "file": self.path, "field": self.field}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class KernelRow(_Open):
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


Ms = Field(ge=0, allow_inf_nan=False)  # a latency: a finite number of ms >= 0


class Probe(_Open):
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


class Guard(_Open):
    ok: bool = True
    verdict: str | None = None  # "ok" | "refused" | "hold"
    message: str = ""  # why it refused or held
    gpu: int | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    processes: list[dict[str, Any]] = Field(default_factory=list)
    service_on_gpu: bool | None = None
    allow_shared: bool = False
    memory_free_mib: float | None = None
    memory_needed_mib: float | None = None
    memory_cap_mib: float | None = None
    findings: list[str] = Field(default_factory=list)


class BenchSection(_Open):
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


class Value(_Open):
    value: float
    p25: float | None = None
    p75: float | None = None
    n: int | None = None
    samples: list[float] = Field(default_factory=list)
    source: Source = "measured"
    note: str = ""

    @property
    def lo(self) -> float:
        return self.p25 if self.p25 is not None else self.value

    @property
    def hi(self) -> float:
        return self.p75 if self.p75 is not None else self.value


class ShadowKind(_Open):
    """The shadow's pairs of one kind of forward, summarised (ops.measure.shadow.summarize)."""

    forwards: int = Field(ge=1)
    s: float = Field(gt=0, allow_inf_nan=False)
    lo: float = Field(gt=0, allow_inf_nan=False)
    hi: float = Field(gt=0, allow_inf_nan=False)
    base_us: float = Field(gt=0, allow_inf_nan=False)
    cand_us: float = Field(gt=0, allow_inf_nan=False)
    base_host_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cand_host_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    warmup: int = Field(default=0, ge=0)  # forwards left out at the window's start (cold)


class Shadow(_Open):
    """A profile level's shadow window (engine.shadow, ops.measure.shadow): the candidate timed
    beside
    the serving backend on the service's own forwards; `error` when it did not run."""

    offered: bool | None = True  # None: the arm got no answer (it says nothing of /shadow)
    component: str = "attention"
    baseline: str | None = None
    candidate: str | None = None
    error: str | None = None
    step: ShadowKind | None = None
    prefill: ShadowKind | None = None


class ProfileLevel(_Open):
    concurrency: int = Field(ge=1)
    shadow: Shadow | None = None
    step_ms: Value
    stage_ms: dict[str, Value] = Field(default_factory=dict)
    tokens_per_s: Value | None = None
    accept_length: Value | None = None
    wall_share: dict[str, Value] = Field(default_factory=dict)
    # the mean over the level's steps of the batch's length spread (longest - shortest, tokens)
    batch_spread: Value | None = None

    @field_validator("batch_spread")
    @classmethod
    def _spread(cls, v: Value | None) -> Value | None:
        if v is not None and not 0 <= v.value < float("inf"):
            raise ValueError(f"a length spread is >= 0 tokens, got {v.value!r}")
        return v

    @field_validator("step_ms")
    @classmethod
    def _step_time(cls, v: Value) -> Value:
        _check_seconds("", v)
        return v

    @field_validator("tokens_per_s")
    @classmethod
    def _rate(cls, v: Value | None) -> Value | None:
        """A level's tokens/s is a finite number > 0 (a level that made no tokens has none)."""
        if v is not None:
            _check_value(v, lambda x: math.isfinite(x) and x > 0, "tokens/s is a finite number > 0")
        return v

    @field_validator("stage_ms")
    @classmethod
    def _stage_times(cls, v: dict[str, Value]) -> dict[str, Value]:
        for stage, t in v.items():
            _check_seconds(f"{stage}.", t)
        return v

    @field_validator("wall_share")
    @classmethod
    def _shares(cls, v: dict[str, Value]) -> dict[str, Value]:
        """A share of the wall time is in [0, 1], and its part in prefill is a part of it."""
        for stage, share in v.items():
            for key in ("value", "p25", "p75"):
                x = getattr(share, key)
                if x is not None and not 0 <= x <= 1:
                    raise ValueError(f"{stage}.{key}: a share of the wall time is in [0, 1], "
                                     f"got {x!r}")  # fmt: skip
            pre = (share.model_extra or {}).get("prefill")
            if pre is None:
                continue
            if isinstance(pre, bool) or not isinstance(pre, int | float):
                raise ValueError(f"{stage}.prefill: must be a number, got {pre!r}")
            if not 0 <= pre <= share.value:
                raise ValueError(f"{stage}.prefill: the part in prefill is in [0, the share "
                                 f"{share.value!r}], got {pre!r}")  # fmt: skip
        return v

    @property
    def batch(self) -> int:
        b = (self.model_extra or {}).get("batch")
        return int(b) if isinstance(b, int) else self.concurrency

    def f_of(self, stage: str) -> tuple[Value, Literal["wall", "step"]] | None:
        """f(c) of `stage` and what it is a share of: the measured window's wall time where
        the record has it, else the step at batch c (stage / step, IQR ends crossed)."""
        if stage in self.wall_share:
            return self.wall_share[stage], "wall"
        comp = self.stage_ms.get(stage)
        step = self.step_ms
        if comp is None or step.value <= 0:
            return None
        f = Value(
            value=comp.value / step.value,
            p25=min(comp.lo / step.hi, comp.value / step.value) if step.hi > 0 else None,
            p75=comp.hi / step.lo if step.lo > 0 else None,
            source="derived" if "derived" in (comp.source, step.source) else "measured",
            note=f"{stage} / step at batch {self.batch}",
        )
        return f, "step"


def _check_value(t: Value, ok: Callable[[float], bool], what: str, where: str = "") -> None:
    """`t`'s value and its spread each pass `ok`, or a ValueError saying `what` it must be."""
    for key in ("value", "p25", "p75"):
        x = getattr(t, key)
        if x is not None and not ok(x):
            raise ValueError(f"{where}{key}: {what}, got {x!r}")


def _check_seconds(where: str, t: Value) -> None:
    """A time is a finite number >= 0 (its spread too): a negative one would make f negative."""
    _check_value(t, lambda x: math.isfinite(x) and x >= 0, "a time is a number >= 0", where)


class ProfileInterruption(_Open):
    """A profile Ctrl-C stopped: the levels it did not finish (each also in `incomplete`)."""

    levels_left: list[int] = Field(default_factory=list)

    @field_validator("levels_left")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError(f"concurrency levels are >= 1, got {v!r}")
        return v


class ProfileSection(_Open):
    target: str
    levels: list[ProfileLevel]
    service: dict[str, Any] = Field(default_factory=dict)
    incomplete: list[dict[str, Any]] = Field(default_factory=list)  # {concurrency, missing}
    failed_requests: int = 0  # requests of the load that failed while profiling
    # Ctrl-C: {"levels_left": [c, ...]}, each also in `incomplete`; the levels that finished stay
    interrupted: ProfileInterruption | None = None
    # no HTTP answer from the service at the start (e.g. "connection refused"): no level ran
    service_down: str | None = None

    def level(self, c: int) -> ProfileLevel | None:
        return next((lv for lv in self.levels if lv.concurrency == c), None)


class Change(_Open):
    component: Literal["tree_build", "accept", "topk", "attention"]
    baseline: str
    candidate: str
    shape: dict[str, Any] = Field(default_factory=dict)
    baseline_impl: str | None = None
    candidate_impl: str | None = None
    bench_kernel: str | None = None  # another kernel of the component's (BENCH_KERNELS)

    @field_validator("baseline", "candidate")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in BACKEND_IMPL:
            raise ValueError(f"unknown backend {v!r}; known: {sorted(BACKEND_IMPL)}")
        return v

    @model_validator(mode="after")
    def _kernel(self) -> Change:
        check_bench_kernel(self.component, self.bench_kernel)
        return self

    def bench_map(self) -> tuple[str, str, str, str]:
        """(suite, kernel, baseline impl, candidate impl) of the bench rows giving s(c)."""
        suite, kernel, impls = BENCH_MAP[self.component]
        if self.bench_kernel is not None:
            _, suite, kernel, impls = BENCH_KERNELS[self.bench_kernel]
        base = self.baseline_impl or impls.get(self.baseline, BACKEND_IMPL[self.baseline])
        cand = self.candidate_impl or impls.get(self.candidate, BACKEND_IMPL[self.candidate])
        return suite, kernel, base, cand

    @property
    def label(self) -> str:
        return f"{self.component}: {self.baseline} -> {self.candidate}"

    @property
    def runs_on_cpu(self) -> bool:
        """The candidate is a host (CPU) backend: no GPU bench times it; the shadow on the
        service's own traffic gives its s (ops.verdict.amdahl, ops.verdict.decide)."""
        return self.candidate in HOST_BACKENDS


BACKEND_IMPL = {
    "reference": "cpu_python",
    "cpp": "cpu_cpp",
    "cuda": "cuda_events",
    "torch": "torch",
}
BENCH_MAP: dict[str, tuple[str, str, dict[str, str]]] = {
    "tree_build": ("tree", "build_trees", {}),
    "accept": ("accept", "greedy_accept", {}),
    "topk": ("topk", "topk_logprobs", {}),
    "attention": ("attn", "tree_verify_attention", {"torch": "torch_sdpa", "cuda": "cuda"}),
}
# kernel -> (component, suite, kernel, impls): what `Change.bench_kernel` may name
BENCH_KERNELS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "build_trees": ("tree_build", *BENCH_MAP["tree_build"]),
    "tree_verify_attention": ("attention", *BENCH_MAP["attention"]),
    "row_attention": ("attention", "attn", "row_attention",
                      {"torch": "torch_rows", "cuda": "cuda_rows"}),
    # the engine's tree-build STAGE as it calls it (kernels.tree_stage: the upload, the kernel
    # and the copy back into numpy trees), not the kernel alone: what the stage's time shrinks by
    "tree_build_stage": ("tree_build", "tree", "tree_build_stage",
                         {"reference": "reference_stage", "cuda": "cuda_stage"}),
}  # fmt: skip


# component -> the bench kernel timing the engine's whole STAGE (boundary copies included):
# s(c) comes from it when a change names no bench_kernel and the bench has its rows for both
# ends of the change (ops.verdict.decide.effective_change)
STAGE_KERNELS = {"tree_build": "tree_build_stage"}

# stage kernel -> {backend: impl} where the service's accept backend is "cuda" (the profile's
# service.backends.accept): a host tree builder's stage then ends by uploading its trees for
# the CUDA accept (engine.backends; kernels.tree_stage.reference_stage_to_device), so that
# stage, upload included, is what the change swaps (ops.verdict.amdahl.effective_change). cpp has no
# stage row: its change keeps the kernel rows.
CUDA_ACCEPT_IMPLS: dict[str, dict[str, str]] = {
    "tree_build_stage": {"reference": "reference_stage_to_device"},
}

# bench kernel -> the kernel timing the same change where it runs in prefill: a wall share's
# prefill part (ops.measure.profile) is projected with that kernel's speedup (ops.verdict.decide)
PREFILL_KERNELS = {"row_attention": "row_attention_prefill"}


def check_bench_kernel(component: str, kernel: str | None) -> None:
    """ValueError unless `kernel` is None or a bench kernel of `component` (BENCH_KERNELS)."""
    if kernel is None:
        return
    known = sorted(k for k, v in BENCH_KERNELS.items() if v[0] == component)
    if BENCH_KERNELS.get(kernel, ("",))[0] != component:
        names = " | ".join(known) or "none"
        raise ValueError(f"bench_kernel: {kernel!r} is not a bench kernel of {component} ({names})")


# the parts of a measured window that add up to it (ms per output token each;
# ops.rollout.switch.audit makes them, ops.verdict.gain_audit shows them)
AUDIT_PARTS = ("draft", "topk", "tree_build", "verify", "attention", "accept", "commit",
               "step_other", "prefill_attention", "prefill_other", "idle", "window")  # fmt: skip
AUDIT_MAX_MS = 1e6  # no part of a window is anywhere near 1000 s per output token


class AuditPart(_Open):
    """One part of a measured window (ops.rollout.switch.audit): ms per output token."""

    before_ms: float
    after_ms: float

    @field_validator("before_ms", "after_ms", mode="before")
    @classmethod
    def _ms(cls, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"expected a number of milliseconds, got {v!r}")
        if not math.isfinite(v) or abs(v) > AUDIT_MAX_MS:
            raise ValueError(f"expected a finite number of milliseconds (|x| <= 1e6), got {v!r}")
        return float(v)


def _check_audit(audit: dict[str, AuditPart]) -> dict[str, AuditPart]:
    """A window of time before and after, and where every part is there, parts that add up to
    it (they are means over the same runs: equal but for rounding)."""
    window = audit.get("window")
    if window is None:
        return audit
    if not (window.before_ms > 0 and window.after_ms > 0):
        raise ValueError("window: a measured window takes time before and after (> 0 ms)")
    if all(p in audit for p in AUDIT_PARTS):
        for when in ("before_ms", "after_ms"):
            parts = sum(getattr(audit[p], when) for p in AUDIT_PARTS if p != "window")
            whole = getattr(window, when)
            if abs(parts - whole) > 1e-6 * max(abs(whole), 1e-9) + 1e-9:
                raise ValueError(
                    f"{when}: the parts add up to {parts:.6g} ms, not the window's {whole:.6g}"
                )
    return audit


RATES = (1e-6, 1e9)  # the tokens/s of a run the report takes: outside it, a broken timing
MAX_RUNS = 1000  # runs of one arm (each a loadtest call): the bootstrap resamples them 2000 times


class MeasureLevel(_Open):
    concurrency: int = Field(ge=1)
    aa: list[Annotated[list[float], Field(max_length=MAX_RUNS)]] = Field(
        default_factory=list, max_length=MAX_RUNS, description="[A, A'] tokens/s samples"
    )
    before: list[float] = Field(min_length=1, max_length=MAX_RUNS)
    after: list[float] = Field(min_length=1, max_length=MAX_RUNS)
    # the change's stage as the service saw it: seconds per output token before / after
    # ("total", "steps", "prefill"; ops.rollout.switch.service_speedup), where it reports them
    service_speedup: dict[str, float] | None = None
    # where the gain came from: per part of the window, ms per output token before / after
    # (ops.rollout.switch.audit: {"window": {"before_ms": .., "after_ms": ..}, "draft": ..})
    audit: dict[str, AuditPart] | None = None
    # the recheck's arm A'': the same load on the release before the candidate, switched back
    # after the measure (ops.rollout.switch.recheck): did the unchanged service drift?
    recheck: list[float] = Field(default_factory=list, max_length=MAX_RUNS)

    @field_validator("before", "after", "recheck")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        """A run's tokens/s: finite and > 0 (a run that made no tokens is not a sample), within
        RATES (a rate like 5e-324 is a broken timing: its reciprocal overflows)."""
        lo, hi = RATES
        for i, x in enumerate(v):
            if not (math.isfinite(x) and lo <= x <= hi):
                raise ValueError(f"run {i}: tokens/s must be a finite number > 0 (in "
                                 f"[{lo:g}, {hi:g}]), got {x!r}")  # fmt: skip
        return v

    @field_validator("aa")
    @classmethod
    def _aa_rates(cls, v: list[list[float]]) -> list[list[float]]:
        for i, arm in enumerate(v):
            try:
                cls._rates(arm)
            except ValueError as exc:
                raise ValueError(f"arm {i}: {exc}") from None
        return v

    @field_validator("audit")
    @classmethod
    def _audit(cls, v: dict[str, AuditPart] | None) -> dict[str, AuditPart] | None:
        return None if v is None else _check_audit(v)

    @field_validator("service_speedup")
    @classmethod
    def _speedups(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """A speedup is a ratio of two positive times: finite and > 0."""
        for part, x in (v or {}).items():
            if not (math.isfinite(x) and x > 0):
                raise ValueError(f"{part}: a speedup is a number > 0, got {x!r}")
        return v


def precision_met(widths: Iterable[float | None], target: float) -> bool:
    """A measure's precision is met: there are levels, and each one's interval (half-width, a
    fraction; None: no interval yet) is within the target."""
    widths = list(widths)
    return bool(widths) and all(h is not None and h <= target for h in widths)


class MeasurePrecision(_Open):
    """What a measure's `precision` asked (ops.rollout.switch._precision_doc) and what it got."""

    target: float = Field(gt=0, lt=1)
    cycles: int = Field(default=1, ge=1)
    cycles_run: int = Field(ge=0)
    max_cycles: int | None = Field(default=None, ge=1)
    met: bool
    half_width: dict[str, float | None] = Field(default_factory=dict)

    @field_validator("half_width")
    @classmethod
    def _widths(cls, v: dict[str, float | None]) -> dict[str, float | None]:
        for c, h in v.items():
            if not c.isdigit() or int(c) < 1:
                raise ValueError(f"a level is a concurrency (an integer >= 1), got {c!r}")
            if h is not None and not (math.isfinite(h) and h >= 0):
                raise ValueError(f"c={c}: a half-width is a finite number >= 0, got {h}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> MeasurePrecision:
        """The record agrees with itself: it could have been written by the measure."""
        if self.max_cycles is not None and self.max_cycles < self.cycles:
            raise ValueError(f"max_cycles {self.max_cycles} is below cycles {self.cycles}")
        if self.max_cycles is not None and self.cycles_run > self.max_cycles:
            raise ValueError(f"cycles_run {self.cycles_run} is above max_cycles {self.max_cycles}")
        met = precision_met(self.half_width.values(), self.target)
        if self.met != met:
            raise ValueError(
                f"met is {self.met}, but its half-widths against its target {self.target} say {met}"
            )
        return self


class MeasureSection(_Open):
    target: str
    change: Change | None = None
    levels: list[MeasureLevel]
    precision: MeasurePrecision | None = None


class Record(_Open):
    """One `record.json`'s envelope, with the extras the report reads (ENVELOPE_EXTRAS); its
    sections are read apart (`read_evidence`), so no record's bulk is kept."""

    schema_: str = Field(alias="schema")
    command: str
    target: str
    started: str
    finished: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    outcome: str
    exit_code: int | None = Field(...)  # None only in a record of a run that did not finish
    path: str = ""

    @model_validator(mode="after")
    def _finished_has_code(self) -> Record:
        if self.exit_code is None and not self.unfinished:
            raise ValueError(f"exit_code: null in a record whose outcome is {self.outcome!r} "
                             f"(only a run that did not finish has none)")  # fmt: skip
        return self

    @property
    def unfinished(self) -> bool:
        """Written at its command's start and never replaced (ops.hosts.records): it runs still, or
        was killed before its end."""
        return self.outcome == RUNNING


def unfinished_line(rec: Record) -> str:
    """What the report says of a record whose run did not finish."""
    pid = (rec.model_extra or {}).get("pid")
    by = f" (pid {pid})" if isinstance(pid, int) else ""
    return (f"{rec.path}: `ops {rec.command}` on {rec.target} started {rec.started}{by} and did "
            "not finish (killed, or still running): it holds no result")  # fmt: skip


def _loc(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(document)"


ENVELOPE_EXTRAS = ("decision", "pid")  # a decide step's decision (its threshold); an unfinished pid


def load_record(path: Path) -> tuple[Record, dict[str, Any]]:
    """The record's envelope and its raw document; BadRecord names the file and the field."""
    try:
        text = read_text_bounded(path, max_bytes=RECORD_MAX_BYTES, what="record")
    except FileRefused as exc:
        raise BadRecord(path, "record.json", exc.problem) from None
    except FileNotFoundError:
        raise BadRecord(path, "record.json", "no such file") from None
    except OSError as exc:
        raise BadRecord(path, "record.json", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise BadRecord(path, "(document)", f"not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRecord(path, "(document)", f"not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise BadRecord(path, "(document)", "not a record: nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRecord(path, "(document)", "not a JSON object")
    keep = (*Record.model_fields, "schema", *ENVELOPE_EXTRAS)
    rec = validate(path, Record, {k: v for k, v in doc.items() if k in keep})
    rec.path = str(path)
    return rec, doc


def validate(path: Path | str, model: type[M], data: Any, prefix: str = "") -> M:
    """model.model_validate(data), a failure turned into BadRecord naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(p for p in (prefix, _loc(e)) if p)
        msg = e["msg"].removeprefix("Value error, ")  # our own validator's words, as written
        raise BadRecord(path, field, msg[:1].lower() + msg[1:]) from None


class Identity(_Open):
    """The fields of a healthcheck's `modules.identity` (checks.identity) that the report reads."""

    aa_runs: int = Field(default=0, ge=0, strict=True)
    identity_pct: float = Field(default=0, ge=0, le=100, allow_inf_nan=False)
    matched: int = Field(default=0, ge=0, strict=True)
    total: int = Field(default=0, ge=0, strict=True)
    concurrency: int = Field(default=1, ge=1, strict=True)
    mismatched: list[str] = Field(default_factory=list)
    nondeterministic: list[str] = Field(default_factory=list)


class HealthEntry(BaseModel):
    """One healthcheck record as a pre- or post-flight."""

    role: Literal["preflight", "postflight"]
    path: str
    outcome: str
    report: HealthReport | None = None  # None when the healthcheck itself errored
    error: str = ""
    golden_recorded: bool = False  # it recorded the golden set: its identity compared nothing
    by: str = ""  # the command that ran it as one of its steps ("deploy"), "" for its own step

    @property
    def name(self) -> str:
        """How the report names this flight: "preflight", or "deploy's preflight" for the one a
        deploy ran inside a rollout, so a rollout's two pre-flights read apart; the run that
        recorded the golden set says so ("preflight recording the golden set"), apart from the
        run that then compared with it."""
        name = f"{self.by}'s {self.role}" if self.by else self.role
        return f"{name} recording the golden set" if self.golden_recorded else name


class Evidence(BaseModel):
    """Everything the report reads, gathered from the records given."""

    records: list[Record] = Field(default_factory=list)
    target: str = ""
    health: list[HealthEntry] = Field(default_factory=list)
    bench: list[tuple[str, BenchSection]] = Field(default_factory=list)
    bench_errors: list[tuple[str, str]] = Field(default_factory=list)
    # profiles that ended in an error: (record, the error's own words), for the HOLD's reason
    profile_errors: list[tuple[str, str]] = Field(default_factory=list)
    profile: ProfileSection | None = None
    profile_path: str = ""
    measure: MeasureSection | None = None
    change: Change | None = None
    change_path: str = ""
    deployed: bool = False
    unfinished: list[Record] = Field(default_factory=list)  # runs that did not finish

    def flights(self, role: str) -> list[HealthEntry]:
        return [h for h in self.health if h.role == role]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # load_record says what is wrong with it


def record_files(paths: list[Path]) -> list[Path]:
    """record.json files in the given run dirs (and their sub-dirs), or the files themselves;
    BadRecord when they hold more than REPORT_MAX_BYTES in all (naming the biggest run dir)."""
    found: list[Path] = []
    sizes: dict[Path, int] = {}
    for p in paths:
        if not p.exists():
            where = p if p.suffix == ".json" else p / "record.json"
            raise BadRecord(where, "record.json", "no such file or directory")
        if p.is_dir():
            subs = sorted(p.rglob("record.json"))
            if not subs:
                raise BadRecord(p / "record.json", "record.json", "no such file")
        else:
            subs = [p]
        sizes[p] = sum(_size(f) for f in subs if f not in found)
        found += subs
    total = sum(sizes.values())
    if total > REPORT_MAX_BYTES:
        big = max(sizes, key=lambda p: sizes[p])
        of = f" (of {total / MIB:.0f} MiB in all)" if len(sizes) > 1 else ""
        raise BadRecord(big, "record.json", f"too big to report on: its records hold "
                        f"{sizes[big] / MIB:.0f} MiB{of}, over the {REPORT_MAX_BYTES // MIB} MiB "
                        "one report reads")  # fmt: skip
    return list(dict.fromkeys(found))


def _role(rec: Record, path: Path) -> Literal["preflight", "postflight"] | None:
    """The flight a healthcheck record says it is: inputs.role, else its directory's name."""
    role = rec.inputs.get("role")
    if role in ("preflight", "postflight"):
        return role
    for part in reversed(path.parts[-3:-1]):
        if "postflight" in part:
            return "postflight"
        if "preflight" in part:
            return "preflight"
    return None


class Read(BaseModel):
    """What the report takes from one record: its envelope, its sections as models, and the
    error it holds (a command that failed); the parsed document itself is not kept."""

    rec: Record
    health: HealthReport | None = None
    bench: BenchSection | None = None
    profile: ProfileSection | None = None
    measure: MeasureSection | None = None
    change: Change | None = None
    has_health: bool = False
    error: str = ""


def read_evidence(f: Path) -> Read:
    """One record read and its sections validated; BadRecord on any unusable part. A report's
    own record and one of a run that did not finish are read for their envelope alone."""
    rec, doc = load_record(f)
    got = Read(rec=rec, has_health="healthcheck" in doc, error=_error_text(doc))
    if rec.command == "report" or rec.unfinished:
        return got
    path = Path(rec.path)
    if "healthcheck" in doc:
        got.health = validate(path, HealthReport, doc["healthcheck"], "healthcheck")
        ident = got.health.modules.get("identity")
        if ident is not None:
            validate(path, Identity, ident, "healthcheck.modules.identity")
    if "bench" in doc:
        got.bench = validate(path, BenchSection, doc["bench"], "bench")
        check_speedups(path, got.bench)
    if "profile" in doc:
        got.profile = validate(path, ProfileSection, doc["profile"], "profile")
    elif rec.command == "profile" and rec.exit_code == 0:  # a profile that passed has one
        raise BadRecord(path, "profile", "missing: a profile that passed records its levels")
    if "measure" in doc:
        got.measure = validate(path, MeasureSection, doc["measure"], "measure")
    if doc.get("change") is not None:
        got.change = validate(path, Change, doc["change"], "change")
    return got


def gather(paths: list[Path], change: Change | None = None) -> Evidence:
    """Read every record under `paths` into one Evidence; BadRecord on any unusable record.
    Each record's document is let go once its sections are models (`read_evidence`)."""
    loaded = [read_evidence(f) for f in record_files(paths)]
    loaded = [r for r in loaded if r.rec.command != "report"]
    loaded.sort(key=lambda r: r.rec.started)
    ev = Evidence(change=change)
    ev.unfinished = [r.rec for r in loaded if r.rec.unfinished]  # evidence of nothing
    loaded = [r for r in loaded if not r.rec.unfinished]
    ev.records = [r.rec for r in loaded]
    targets = sorted({r.target for r in ev.records})
    if len(targets) > 1:
        raise BadRecord(ev.records[0].path, "target", f"records of several targets {targets}")
    ev.target = targets[0] if targets else ""
    for got in loaded:
        rec = got.rec
        path = Path(rec.path)
        if rec.command == "deploy" and rec.exit_code == 0:
            ev.deployed = True
        if got.has_health or rec.command == "healthcheck":
            role = _role(rec, path) or ("postflight" if ev.deployed else "preflight")
            entry = HealthEntry(role=role, path=rec.path, outcome=rec.outcome)
            entry.golden_recorded = rec.inputs.get("record_golden") is True
            if isinstance(rec.inputs.get("by"), str):
                entry.by = rec.inputs["by"]
            entry.report = got.health
            if not got.has_health:
                entry.error = got.error
            ev.health.append(entry)
        if got.bench is not None:
            ev.bench.append((rec.path, got.bench))
        elif rec.command == "bench":
            ev.bench_errors.append((rec.path, got.error))
        if got.profile is None and rec.command == "profile" and got.error:
            ev.profile_errors.append((rec.path, got.error))
        if got.profile is not None:  # a later profile replaces the levels it measured again
            prof = got.profile
            if ev.profile is not None:
                keep = {lv.concurrency: lv for lv in ev.profile.levels}
                keep.update({lv.concurrency: lv for lv in prof.levels})
                prof.levels = [keep[c] for c in sorted(keep)]
            ev.profile, ev.profile_path = prof, rec.path
        if got.measure is not None:
            ev.measure = got.measure
        if got.change is not None:
            ch = got.change
            if change is None and ev.change is not None and ev.change.label != ch.label:
                raise BadRecord(
                    path, "change", f"{ch.label} but {ev.change_path}: {ev.change.label}"
                )
            if change is None:
                ev.change, ev.change_path = ch, rec.path
    return ev


MAX_SPEEDUP = 1e9  # a kernel a billion times faster than its baseline is a broken timing


def check_speedups(path: Path | str, bench: BenchSection) -> None:
    """Every speed-up the report takes from these rows (one row's median over another's, of the
    same kernel and shape, and their IQR ends; a row's own `speedup`) is a finite number in
    (0, MAX_SPEEDUP]: a time like 5e-324 us divides to inf (or near it), which no chart, table
    or gain can hold. BadRecord names the row's field that makes it so."""
    rows = bench.rows
    for i, r in enumerate(rows):
        for base, x in r.speedup.items():
            if not (math.isfinite(x) and 0 < x <= MAX_SPEEDUP):
                raise BadRecord(path, f"bench.rows.{i}.speedup.{base}",
                                f"a speed-up is a finite number in (0, {MAX_SPEEDUP:g}], "
                                f"got {x!r}")  # fmt: skip
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        key = r.kernel + json.dumps(r.shape, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    for idx in groups.values():
        for i in idx:  # rows[i] as the candidate: each of its times under each other impl's
            cand = rows[i]
            times = {"median_us": cand.median_us, "p25_us": cand.p25_us, "p75_us": cand.p75_us}
            for field, den in times.items():
                if den is None or den <= 0:
                    continue  # no time: the report takes no speed-up from it
                for j in (j for j in idx if rows[j].impl != cand.impl):
                    base = rows[j]
                    s = max(base.median_us, base.hi_us) / den
                    if not (math.isfinite(s) and s <= MAX_SPEEDUP):
                        x = f"a {s:g}x" if math.isfinite(s) else "an infinite"
                        raise BadRecord(
                            path,
                            f"bench.rows.{i}.{field}",
                            f"{den!r} us is no measured time: it makes {x} speed-up "
                            f"over {base.impl} (bench.rows.{j}, {base.median_us:g} us), above "
                            f"{MAX_SPEEDUP:g}x",
                        )


def _error_text(doc: dict[str, Any]) -> str:
    e = doc.get("error")
    if isinstance(e, dict):
        return str(e.get("message") or e.get("error") or e)
    return f"outcome {doc.get('outcome')!r}, exit {doc.get('exit_code')}"
