"""The `profile` section: per concurrency level, the step time, the stage times and their wall
shares (the f of the Amdahl model), tokens/s and accept length, each a `Value` saying its
source; the shadow's windows (`Shadow`, s measured on the service's own forwards); as
ops.measure.profile builds it and ops.verdict reads it.

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
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator

from ops.sections.common import OpenModel, Value, check_seconds, check_value


class ShadowKind(OpenModel):
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


class Shadow(OpenModel):
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
    # the SGLang import hook's shadow (ops.measure.shadow.hook_shadow): "hook", its setting
    # (e.g. "shadow:tree_build=cpp/8"), and the calls it compared and found different
    source: str | None = None
    setting: str | None = None
    compared: int | None = None
    mismatched: int | None = None


class ProfileLevel(OpenModel):
    concurrency: int = Field(ge=1)
    shadow: Shadow | None = None
    # how its numbers were had: "measured" (the service's stage clock), "hook" (f from the
    # SGLang import hook, the step derived), "derived" (f from a CPU baseline over the step)
    method: str | None = None
    missing: list[str] = Field(default_factory=list)  # what it lacks for a decision
    f_basis: str | None = None  # what f is a share of, in words (a derived level)
    hook: dict[str, Any] | None = None  # the import hook's reading (ops.measure.counters)
    load: dict[str, Any] | None = None  # the load of its measured window (checks.loadtest)
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
        check_seconds("", v)
        return v

    @field_validator("tokens_per_s")
    @classmethod
    def _rate(cls, v: Value | None) -> Value | None:
        """A level's tokens/s is a finite number > 0 (a level that made no tokens has none)."""
        if v is not None:
            check_value(v, lambda x: math.isfinite(x) and x > 0, "tokens/s is a finite number > 0")
        return v

    @field_validator("stage_ms")
    @classmethod
    def _stage_times(cls, v: dict[str, Value]) -> dict[str, Value]:
        for stage, t in v.items():
            check_seconds(f"{stage}.", t)
        return v

    @field_validator("wall_share")
    @classmethod
    def _shares(cls, v: dict[str, Value]) -> dict[str, Value]:
        """A share of the wall time is in [0, 1], and its part in prefill is a part of it."""
        for stage, share in v.items():
            for key in ("value", "p25", "p75"):
                x = getattr(share, key)
                if x is not None and not 0 <= x <= 1:
                    raise ValueError(
                        f"{stage}.{key}: a share of the wall time is in [0, 1], got {x!r}"
                    )
            pre = (share.model_extra or {}).get("prefill")
            if pre is None:
                continue
            if isinstance(pre, bool) or not isinstance(pre, int | float):
                raise ValueError(f"{stage}.prefill: must be a number, got {pre!r}")
            if not 0 <= pre <= share.value:
                raise ValueError(
                    f"{stage}.prefill: the part in prefill is in [0, the share "
                    f"{share.value!r}], got {pre!r}"
                )
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


class ProfileInterruption(OpenModel):
    """A profile Ctrl-C stopped: the levels it did not finish (each also in `incomplete`)."""

    levels_left: list[int] = Field(default_factory=list)

    @field_validator("levels_left")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError(f"concurrency levels are >= 1, got {v!r}")
        return v


class Incomplete(OpenModel):
    """A level that cannot serve a decision, and what it lacks (in words)."""

    concurrency: int = Field(ge=1)
    missing: list[str] = Field(default_factory=list)
    pilot: dict[str, Any] | None = None  # the uncounted run that sized its window, if it failed


class ShadowNotTimed(OpenModel):
    """A level whose shadow gave no s, and why."""

    concurrency: int = Field(ge=1)
    why: str


class ShadowMismatched(OpenModel):
    """A level whose hook shadow saw the candidate answer otherwise than the stock."""

    concurrency: int = Field(ge=1)
    component: str
    mismatched: int = Field(ge=0)
    compared: int = Field(ge=0)


class ProfileSection(OpenModel):
    target: str
    url: str | None = None
    levels: list[ProfileLevel]
    service: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)  # ops.measure.profile.ProfileOptions
    incomplete: list[Incomplete] = Field(default_factory=list)
    failed_requests: int = 0  # requests of the load that failed while profiling
    # Ctrl-C: {"levels_left": [c, ...]}, each also in `incomplete`; the levels that finished stay
    interrupted: ProfileInterruption | None = None
    # no HTTP answer from the service at the start (e.g. "connection refused"): no level ran
    service_down: str | None = None
    # a shadow an earlier, killed ops left armed, disarmed before this profile (engine.shadow)
    shadow_found_armed: dict[str, Any] | None = None
    shadow_not_timed: list[ShadowNotTimed] = Field(default_factory=list)
    shadow_mismatched: list[ShadowMismatched] = Field(default_factory=list)
    shadow_not_armed: str | None = None  # a rollout's profile: why its shadow was not asked

    def level(self, c: int) -> ProfileLevel | None:
        return next((lv for lv in self.levels if lv.concurrency == c), None)
