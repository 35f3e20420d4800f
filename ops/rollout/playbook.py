"""Rollout playbooks: the YAML schema (pydantic) and the validation of a playbook as a whole.

A playbook names the change, the decision's threshold, the load the service is driven with,
and the steps in order (`ops.rollout.runner` runs them):

    name: rollout
    change: {component: tree_build, baseline: reference, candidate: cuda}
    threshold: 0.03                  # projected end-to-end gain needed for GO
    load: {concurrency: [1, 8, 32], requests: 0, input_len: 32, output_len: 32}
    steps:
      - {step: healthcheck, name: preflight}
      - {step: bench}
      - {step: decide}
      - {step: deploy, when: go}
      - {step: report}

Step kinds: healthcheck (role preflight | postflight), bench, profile, decide, measure (phase
before | after), deploy, report. Every step takes `name` (default: its kind; unique),
`when` (the gate: always | go: the decide step said GO | deployed: the deploy step put the
candidate in place) and `on_fail` (continue | stop: skip to the report). The whole playbook,
overrides applied (ops.rollout.playbook_load: files, names, `--set`), is validated before anything
runs; a mistake is one line naming the step and the field (`PlaybookError`, exit 2).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from checks.vocabulary import MAX_TOKENS as MAX_TOKENS_GOLDEN
from ops.deploy.result import MAX_KEEP
from ops.errors import OpsError
from ops.hosts.inventory import COMPONENT_KINDS
from ops.measure.bench import MAX_BENCH_S
from ops.measure.loadtest import (
    MAX_CONCURRENCY,
    MAX_REQUEST_TIMEOUT_S,
    MAX_REQUESTS,
    MAX_TOKENS,
)
from ops.measure.profile import MAX_BUDGET, MAX_DEPTH, MAX_TOPK
from ops.sections.change import Change, check_bench_kernel
from ops.service.managers import MAX_WAIT_S
from ops.verdict.numbers import NoBoolNumbers

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}\Z")
Gate = Literal["always", "go", "deployed"]


class PlaybookError(OpsError):
    """A playbook that cannot run: one line naming the file, the step and the field."""

    def __init__(self, where: str, field: str, problem: str, step: str | None = None) -> None:
        """`step`: the step's name where the problem is in one."""
        super().__init__(f"{where}: {field}: {problem}")
        self.step, self.field = step, field

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "step": self.step, "field": self.field}


class _Strict(NoBoolNumbers):
    # no `.inf` / `.nan` in any number (YAML has both): the CLI's own options refuse them too
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _levels(v: Any) -> Any:
    """`1,8,32` (a --set string) or a single integer as a list of levels."""
    if isinstance(v, str):
        try:
            return [int(x) for x in v.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"takes integers like 1,8,32, got {v!r}") from None
    return [v] if isinstance(v, int) else v


class Load(_Strict):
    """The load the profile and the measure steps drive the service with (the same for both)."""

    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] = Field(
        default=[1, 8, 32], min_length=1
    )
    requests: int = Field(default=0, ge=0, le=MAX_REQUESTS)  # per level (0: 4 x level)
    # > 0: `measure` sizes each level's requests so one run lasts about this many seconds at
    # the tokens/s the profile measured there (short runs are noisy: the A/A pair says how much),
    # and the profile sizes its own windows so (after a pilot of `requests`: ops.measure.profile)
    run_seconds: float = Field(default=0.0, ge=0, le=1800)  # a run is one loadtest call (1 h)
    input_len: int = Field(default=32, ge=1, le=MAX_TOKENS)
    output_len: int = Field(default=32, ge=1, le=MAX_TOKENS)
    timeout: float = Field(default=120.0, gt=0, le=MAX_REQUEST_TIMEOUT_S)

    _split = field_validator("concurrency", mode="before")(_levels)

    @model_validator(mode="after")
    def _shape(self) -> Load:
        """A request's prompt and output fit the loadtest's cap (checked here, before any step
        runs, not by the host at the profile)."""
        total = self.input_len + self.output_len
        if total > MAX_TOKENS:
            raise ValueError(
                f"input_len + output_len = {total} tokens: over {MAX_TOKENS}, the loadtest's cap"
            )
        return self


class ChangeSpec(_Strict):
    """Which component switches from which backend to which (inventory backend names)."""

    component: str  # one of checks.vocabulary.COMPONENTS
    baseline: str
    candidate: str
    shape: dict[str, int | str] = Field(default_factory=dict)  # pins bench shape keys for s(c)
    bench_kernel: str | None = (
        None  # the bench kernel giving s(c) (ops.sections.change.BENCH_KERNELS)
    )
    baseline_impl: str | None = None  # the bench impls giving s(c), where not the kernel's map
    candidate_impl: str | None = None

    @field_validator("component")
    @classmethod
    def _component(cls, v: str) -> str:
        if v not in COMPONENT_KINDS:
            raise ValueError(f"unknown component {v!r}; known: {' | '.join(COMPONENT_KINDS)}")
        return v

    @model_validator(mode="after")
    def _kinds(self) -> ChangeSpec:
        check_bench_kernel(self.component, self.bench_kernel)
        kinds = COMPONENT_KINDS[self.component]
        for field in ("baseline", "candidate"):
            if getattr(self, field) not in kinds:
                raise ValueError(
                    f"{field}: {self.component} has no backend {getattr(self, field)!r} "
                    f"({' | '.join(kinds)})"
                )
        if self.baseline == self.candidate:
            raise ValueError(f"candidate: the same as the baseline ({self.baseline!r})")
        return self

    def to_change(self) -> Change:
        return Change(**self.model_dump())

    @property
    def label(self) -> str:
        return f"{self.component}: {self.baseline} -> {self.candidate}"


class StepBase(_Strict):
    name: str = ""
    when: Gate = "always"
    on_fail: Literal["continue", "stop"] = "continue"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v and not NAME_RE.match(v):
            raise ValueError("lower-case letters, digits, '-', '_' (at most 40)")
        return v


class HealthcheckStep(StepBase):
    step: Literal["healthcheck"]
    role: Literal["preflight", "postflight"] | None = None  # default: from the step's name
    golden: Literal["auto", "compare", "record"] = "auto"  # auto: record first where none is
    aa_runs: int = Field(default=0, ge=0, le=10)
    max_tokens: int = Field(default=32, ge=1, le=MAX_TOKENS_GOLDEN)
    timeout: float = Field(default=30.0, gt=0, le=MAX_REQUEST_TIMEOUT_S)


class BenchStep(StepBase):
    step: Literal["bench"]
    gpu: int | None = Field(default=None, ge=0)  # default: the target's bench_gpu
    # default: the change's suite
    suites: list[Literal["topk", "tree", "accept", "attn", "engine_attn"]] | None = None
    batches: list[Annotated[int, Field(ge=1, le=4096)]] | None = None  # default: load levels
    allow_shared: bool = False
    probe_threshold: float = Field(default=0.10, ge=0)
    probe_interval: float = Field(default=0.05, ge=0, le=60)  # s between probe requests
    max_mem_gib: float | None = Field(default=None, gt=0)
    timeout: float = Field(default=1800.0, gt=0, le=MAX_BENCH_S)
    # attn decode rows: the requests' prefixes spread over this many tokens past L (0: all at
    # L). Not the load's output length: the load sends one prompt, so its requests advance
    # together, and a batch spread over 64 tokens costs the torch path 40-51% more
    # (benchmarks/NOTES-attention.md at abb2881)
    decode_spread: int = Field(default=0, ge=0, le=65536)

    _split = field_validator("batches", mode="before")(_levels)


class ProfileStep(StepBase):
    step: Literal["profile"]
    accept_length: float | None = Field(default=None, ge=1)  # derived path, no service value
    budget: int = Field(default=64, ge=1, le=MAX_BUDGET)  # derived path: the CPU baseline's
    topk: int = Field(default=8, ge=1, le=MAX_TOPK)  # shape, within the tree builder's limits
    depth: int = Field(default=15, ge=1, le=MAX_DEPTH)
    # the change's candidate timed beside the serving backend on the service's own forwards, in
    # a load window of its own per level (engine.shadow, ops.measure.shadow), where the service
    # offers
    # it (the reference engine, for attention and the tree build): s from the service itself,
    # the bench's beside
    shadow: bool = True
    shadow_forwards: int = Field(default=5000, ge=1, le=20000)


class DecideStep(StepBase):
    step: Literal["decide"]


class MeasureStep(StepBase):
    step: Literal["measure"]
    phase: Literal["before", "after"]  # before: the A/A pair; after: the same load, switched
    repeats: int = Field(default=1, ge=1, le=20)  # load runs per arm (A, A', after, A'')
    # after only: then switch back to the release before the candidate, run the load once
    # more (A'': did the unchanged service drift while the rollout ran?) and switch the
    # candidate back in (ops.rollout.switch.recheck)
    recheck: bool = False
    # with recheck: how many times the two releases alternate after the switch (each cycle:
    # the baseline's release back in for an A'' arm, then the candidate's for one more `after`
    # arm but in the last cycle), each arm on a freshly started service. 1: A A' | after | A''.
    # More cycles spread both arms over more processes and over the whole measure, so neither a
    # slow process nor a slow spell of the host falls on one arm alone.
    cycles: int = Field(default=1, ge=1, le=10)
    # with recheck: after `cycles`, the releases go on alternating until the measured gain's 90%
    # interval is within +/- `precision` at every level (a fraction: 0.03 is 3 points; the
    # report's interval, ops.verdict.amdahl.gain_interval), `max_cycles` cycles at the most. 0: off.
    # The stop looks at the interval's width alone, never at the gain, so it does not pick a
    # gain; the report says whether the precision was met and in how many cycles.
    precision: float = Field(default=0.0, ge=0.0, lt=1.0, allow_inf_nan=False)
    max_cycles: int | None = Field(default=None, ge=1, le=50, validate_default=True)

    @field_validator("recheck")
    @classmethod
    def _recheck_after(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("phase") != "after":
            raise ValueError("only a measure step of phase 'after' can recheck")
        return v

    @field_validator("cycles")
    @classmethod
    def _cycles_recheck(cls, v: int, info: ValidationInfo) -> int:
        if v > 1 and info.data.get("phase") != "after":
            raise ValueError("only a measure step of phase 'after' alternates cycles")
        if v > 1 and not info.data.get("recheck"):
            raise ValueError(
                "cycles > 1 alternates the releases after the switch: it needs recheck: true"
            )
        return v

    @field_validator("precision")
    @classmethod
    def _precision_recheck(cls, v: float, info: ValidationInfo) -> float:
        if v > 0 and not info.data.get("recheck"):
            raise ValueError(
                "precision adds cycles of the releases alternating after the "
                "switch: it needs recheck: true (and phase: after)"
            )
        return v

    @field_validator("max_cycles")
    @classmethod
    def _max_cycles(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None:
            if info.data.get("precision"):
                raise ValueError("precision needs max_cycles: the most cycles to run for it")
            return v
        if not info.data.get("precision"):
            raise ValueError(
                "max_cycles bounds the cycles that precision adds: set precision (e.g. 0.03) too"
            )
        cycles = info.data.get("cycles") or 1
        if v < cycles:
            raise ValueError(f"{v} is below cycles ({cycles}): the measure runs cycles first")
        return v


class DeployStep(StepBase):
    step: Literal["deploy"]
    source: str | None = None
    ref: str | None = None
    allow_dirty: bool = False
    force: bool = False
    keep: int = Field(default=5, ge=2, le=MAX_KEEP)
    wait_s: float = Field(default=180.0, gt=0, le=MAX_WAIT_S)
    max_tokens: int = Field(default=32, ge=1, le=MAX_TOKENS_GOLDEN)


class ReportStep(StepBase):
    step: Literal["report"]
    formats: list[Literal["md", "html"]] = Field(default=["md", "html"], min_length=1)


STEP_KINDS: dict[str, type[StepBase]] = {
    "healthcheck": HealthcheckStep,
    "bench": BenchStep,
    "profile": ProfileStep,
    "decide": DecideStep,
    "measure": MeasureStep,
    "deploy": DeployStep,
    "report": ReportStep,
}
AnyStep = (
    HealthcheckStep | BenchStep | ProfileStep | DecideStep | MeasureStep | DeployStep | ReportStep
)


class Playbook(_Strict):
    name: str = "rollout"
    description: str = ""
    change: ChangeSpec | None = None
    threshold: float = Field(default=0.03, ge=0, lt=1)
    # one of load.concurrency (only those are profiled); default: the highest level
    target_concurrency: int | None = Field(default=None, ge=1)
    load: Load = Field(default_factory=Load)
    steps: list[Any] = Field(min_length=1)
    path: str = ""

    def step_list(self) -> list[AnyStep]:
        return list(self.steps)


def _msg(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field"
    msg = err["msg"].removeprefix("Value error, ")
    given = "input" in err and err["input"] is not None  # None: the field was left out
    if given and not isinstance(err["input"], dict | list) and "got" not in msg:
        msg += f" (got {err['input']!r})"
    return msg


def _loc(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(document)"


def validate_playbook(
    raw: dict[str, Any], where: str, touched: set[tuple] | None = None
) -> Playbook:
    """The whole playbook checked: fields, each step, then their order; `touched` names the
    (step, field) pairs a --set override wrote, so an error can say it came from there."""
    touched = touched or set()
    try:
        pb = Playbook.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        head = str(e["loc"][0]) if e["loc"] else ""
        mine = any(s is None and f.split(".")[0] == head for s, f in touched)
        raise PlaybookError(where, _loc(e), _msg(e) + (" (from --set)" if mine else "")) from None
    c = pb.target_concurrency
    if c is not None and c not in pb.load.concurrency:
        mine = any(s is None and f == "target_concurrency" for s, f in touched)
        levels = ", ".join(map(str, pb.load.concurrency))
        problem = f"{c} is not one of load.concurrency ({levels}): only those are profiled"
        problem += " (from --set)" if mine else ""
        raise PlaybookError(where, "target_concurrency", problem)
    pb.steps = [_step(where, i, s, touched) for i, s in enumerate(pb.steps, 1)]
    check_order(where, pb)
    return pb


def _step(where: str, i: int, raw: Any, touched: set[tuple]) -> AnyStep:
    if not isinstance(raw, dict):
        raise PlaybookError(f"{where}: step {i}", "step", "must be a mapping like {step: bench}")
    kind = raw.get("step")
    if not isinstance(kind, str | None):  # never str() a value: it may be a YAML alias bomb
        raise PlaybookError(
            f"{where}: step {i}", "step", f"must be a step kind, not a {_kind(kind)}"
        )
    name = raw.get("name") or kind
    if not isinstance(name, str):
        raise PlaybookError(f"{where}: step {i}", "name", f"must be a string, not a {_kind(name)}")
    label = f"step {i} {name!r}"
    if kind not in STEP_KINDS:
        known = ", ".join(STEP_KINDS)
        problem = f"unknown step {kind!r} (known: {known})" if kind else f"missing (one of {known})"
        raise PlaybookError(f"{where}: {label}", "step", problem, name)
    try:
        st = STEP_KINDS[kind].model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        field = _loc(e)
        from_set = (name, field.split(".")[0]) in touched
        msg = _msg(e) + (" (from --set)" if from_set else "")
        raise PlaybookError(f"{where}: {label}", field, msg, name) from None
    st.name = st.name or kind
    if isinstance(st, HealthcheckStep) and st.role is None:
        roles = [r for r in ("preflight", "postflight") if r in st.name]
        if len(roles) != 1:
            problem = (
                "a healthcheck step needs role: preflight | postflight, "
                "or a name containing 'preflight' or 'postflight'"
            )
            raise PlaybookError(f"{where}: {label}", "role", problem, st.name)
        st.role = roles[0]  # type: ignore[assignment]
    return st


def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list"}.get(type(value), type(value).__name__)


def check_order(where: str, pb: Playbook) -> None:
    """What only the whole playbook can say: unique names, gates with their source, order."""
    seen: dict[str, int] = {}
    kinds: list[str] = []
    for i, st in enumerate(pb.step_list(), 1):
        field, problem = _order_problem(pb, i, st, seen, kinds)
        if problem:
            raise PlaybookError(f"{where}: step {i} {st.name!r}", field, problem, st.name)
        seen[st.name] = i
        kinds.append(st.step)


def _order_problem(
    pb: Playbook, i: int, st: AnyStep, seen: dict[str, int], kinds: list[str]
) -> tuple[str, str]:
    """(field, problem) of step i given the steps before it; problem "" when it is fine."""
    if st.name in seen:
        return "name", f"used by step {seen[st.name]} too (names must be unique)"
    if st.when == "go" and "decide" not in kinds:
        return "when", "'go' needs a decide step before this one"
    if st.when == "deployed" and "deploy" not in kinds:
        return "when", "'deployed' needs a deploy step before this one"
    if st.step in kinds and st.step in ("decide", "deploy", "report"):
        return "step", f"only one {st.step} step per playbook"
    if isinstance(st, MeasureStep):
        phases = [p.phase for p in pb.step_list()[: i - 1] if isinstance(p, MeasureStep)]
        if st.phase in phases:
            return "phase", f"a second measure phase {st.phase!r}"
        if st.phase == "after" and "before" not in phases:
            return "phase", "'after' needs a measure step with phase 'before' earlier"
        if st.phase == "before" and "deploy" in kinds:
            return "phase", "'before' must come before the deploy step"
        if pb.load.run_seconds > 0 and "profile" not in kinds:
            return "load.run_seconds", (
                f"{pb.load.run_seconds:g} s sizes measure's runs from the tokens/s a profile "
                "step measured, and no profile step comes before this one (add one, or set "
                "load.requests instead)"
            )
    needs = isinstance(st, DeployStep) or (isinstance(st, BenchStep) and not st.suites)
    if needs and pb.change is None:
        return "change", f"the {st.step} step needs the playbook's `change`"
    if st.step == "report" and i != len(pb.steps):
        return "step", "the report must be the last step"
    return "", ""
