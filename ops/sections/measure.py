"""The `measure` section: a rollout's tokens/s before and after the switch at each level, with
the A/A pair of the unchanged service first, the recheck, where the gain came from (`audit`)
and the precision the measure asked for and got; as ops.rollout.switch builds it and
ops.verdict reads it.

- `MeasureLevel`: concurrency, aa: [A, A'] tokens/s samples of the unchanged service,
  before / after: tokens/s samples around the switch. `MeasureSection`: change, levels.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from ops.sections.change import Change
from ops.sections.common import OpenModel

# the parts of a measured window that add up to it (ms per output token each;
# ops.rollout.switch.audit makes them, ops.verdict.gain_audit shows them)
AUDIT_PARTS = (
    "draft",
    "topk",
    "tree_build",
    "verify",
    "attention",
    "accept",
    "commit",
    "step_other",
    "prefill_attention",
    "prefill_other",
    "idle",
    "window",
)
AUDIT_MAX_MS = 1e6  # no part of a window is anywhere near 1000 s per output token


class AuditPart(OpenModel):
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


class MeasureLevel(OpenModel):
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
                raise ValueError(
                    f"run {i}: tokens/s must be a finite number > 0 (in "
                    f"[{lo:g}, {hi:g}]), got {x!r}"
                )
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


class MeasurePrecision(OpenModel):
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


class MeasureSection(OpenModel):
    target: str
    change: Change | None = None
    levels: list[MeasureLevel]
    precision: MeasurePrecision | None = None
    # how it ran (ops.rollout.switch): its settings, every loadtest run of every arm, the levels
    # with no samples on a side, and the requests that failed
    settings: dict[str, Any] = Field(default_factory=dict)
    runs: list[dict[str, Any]] = Field(default_factory=list)
    incomplete: list[int] = Field(default_factory=list)
    failed_requests: int = Field(default=0, ge=0)
