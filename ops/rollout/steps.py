"""The steps of a rollout, one function per step kind (`healthcheck`, `bench`, `profile`,
`decide`, `report` here; `measure` and `deploy` in ops.rollout.switch), each calling the code
its own command runs.

A step gets the rollout's `Context` and returns `Done`: its status, a one-line detail, and the
record sections the report reads (ops.verdict.evidence); the runner (ops.rollout.runner) writes
them into the
step's directory with the `change`. Every number comes from the service or the host; nothing is
estimated here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from checks.vocabulary import COMPONENT_STAGE, HOST_BACKENDS
from ops.deploy.deploy import DeployResult
from ops.hosts.inventory import Target
from ops.hosts.records import RunDir
from ops.hosts.remote import Host
from ops.measure.bench import BenchOptions, run_bench
from ops.measure.healthcheck import golden_on_host, run_healthcheck
from ops.measure.profile import ProfileOptions, run_profile, sized
from ops.measure.shadow import shadow_lines
from ops.rollout.playbook import (
    BenchStep,
    DecideStep,
    HealthcheckStep,
    Playbook,
    ProfileStep,
    ReportStep,
)
from ops.sections.change import Change
from ops.sections.health import HealthReport
from ops.sections.profile import ProfileLevel
from ops.verdict.decide import Decision, Reason, decide
from ops.verdict.evidence import gather
from ops.verdict.reports import build, summary, write_reports

Status = Literal["ok", "fail", "hold", "skip", "error", "interrupted"]
VERDICT_STATUS: dict[str, Status] = {"GO": "ok", "NO-GO": "fail", "HOLD": "hold"}


class Done(BaseModel):
    """What a step did: status, one line, the record's outcome / exit code / sections."""

    status: Status
    detail: str
    outcome: str
    exit_code: int
    sections: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, Any] = Field(default_factory=dict)


@dataclass
class Found:
    """What the steps so far found, for the gates and the later steps: the bench's outcome (the
    shadow is armed only after a pass), the decision, the candidate's deploy (and its options,
    which measure's recheck reuses), the report's summary and files."""

    bench_outcome: str | None = None
    decision: Decision | None = None
    deploy: DeployResult | None = None
    deploy_opts: Any = None
    deploy_record: str = ""
    report: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)


@dataclass
class Arms:
    """The measure steps' state: the A/A pair per level and its raw runs, each level's sized
    requests (load.run_seconds, from the profile), which release the service runs while a
    measure does (and how that is known: "the deploy's switch", "the recheck's last switch";
    None before the candidate's deploy), and where a failed recheck left the service."""

    before: dict[int, list[list[float]]] | None = None
    before_runs: list[dict[str, Any]] = field(default_factory=list)
    requests_per_level: dict[int, int] = field(default_factory=dict)
    measure_serving: tuple[str, str] | None = None
    recheck_left_on: str | None = None


@dataclass
class Context:
    """The rollout as it goes: what it is (target, host, playbook, run, the change), what its
    steps found (`found`) and the measure's arms (`arms`)."""

    target: Target
    host: Host
    playbook: Playbook
    run: RunDir
    say: Callable[[str], None]
    change: Change | None = None
    found: Found = field(default_factory=Found)
    arms: Arms = field(default_factory=Arms)


def _health(rep: HealthReport, what: str) -> tuple[Status, str]:
    ident = next((c for c in rep.checks if c.name == "identity"), None)
    idt = f"; identity: {ident.detail}" if ident is not None and ident.detail else ""
    if rep.ok:
        return "ok", f"{what}: healthy{idt}"
    return "fail", f"{what}: failed {', '.join(rep.failed)}{idt}"


def step_healthcheck(ctx: Context, st: HealthcheckStep, sub: RunDir) -> Done:
    """Pre- or post-flight; `golden: auto` records the golden set first where there is none
    (in its own record, `golden/`, so the report shows the recording) and then compares."""
    host = ctx.host
    have = host.run(["test", "-f", golden_on_host(host)], warn=True, step="golden set").ok
    record_first = st.golden == "record" or (st.golden == "auto" and not have)
    kw: dict[str, Any] = {"timeout": st.timeout, "max_tokens": st.max_tokens}
    if record_first:
        ctx.say("recording the golden set (none on the host yet)" if not have else "recording")
        rep0 = run_healthcheck(host, record_golden=True, **kw)
        what = "golden set recorded" if rep0.ok else "recording the golden set"
        status, detail = _health(rep0, f"{st.role}, {what}")
        inputs = {"role": st.role, "record_golden": True, **kw}
        result = {"outcome": "pass" if rep0.ok else "fail", "exit_code": 0 if rep0.ok else 1}
        if st.golden == "record" or not rep0.ok:  # nothing to compare: this is the record
            return Done(
                status=status,
                detail=detail,
                inputs=inputs,
                sections={"healthcheck": rep0.model_dump()},
                **result,
            )
        rec = RunDir(sub.path / "golden", "healthcheck", sub.target, sub.started)
        rec.path.mkdir()
        rec.write_record(inputs=inputs, healthcheck=rep0.model_dump(), **result)
    rep = run_healthcheck(host, aa_runs=st.aa_runs, **kw)
    status, detail = _health(rep, st.role or "healthcheck")
    return Done(
        status=status,
        detail=detail,
        outcome="pass" if rep.ok else "fail",
        exit_code=0 if rep.ok else 1,
        sections={"healthcheck": rep.model_dump()},
        inputs={
            "role": st.role,
            "record_golden": False,
            "golden_recorded_first": record_first,
            "aa_runs": st.aa_runs,
            **kw,
        },
    )


BENCH_STATUS: dict[str, Status] = {
    "pass": "ok",
    "hold": "hold",
    "no-go": "fail",
    "fail": "fail",
    "refused": "fail",
}


def step_bench(ctx: Context, st: BenchStep, sub: RunDir) -> Done:
    suites = list(st.suites or [ctx.change.bench_map()[0]])  # type: ignore[union-attr]
    opts = BenchOptions(
        gpu=st.gpu if st.gpu is not None else ctx.target.bench_gpu,
        suites=suites,
        batches=st.batches or ctx.playbook.load.concurrency,
        allow_shared=st.allow_shared,
        threshold=st.probe_threshold,
        probe_interval=st.probe_interval,
        max_mem_gib=st.max_mem_gib,
        timeout=st.timeout,
        decode_spread=st.decode_spread,
    )
    o = run_bench(ctx.host, opts, ctx.say)
    ctx.found.bench_outcome = o.outcome
    detail = o.message or f"{len(o.section.rows)} kernel rows, no interference"
    return Done(
        status=BENCH_STATUS[o.outcome],
        detail=f"{o.outcome}: {detail}",
        outcome=o.outcome,
        exit_code=o.code,
        sections={"bench": o.section.record()},
        inputs=opts.model_dump(),
    )


def sized_requests(levels: list[ProfileLevel], seconds: float, output_len: int) -> dict[int, int]:
    """Requests per level so one run lasts about `seconds` at the profiled output tokens/s
    (at least the level's concurrency); empty when `seconds` is 0 or nothing was measured."""
    out = {}
    for lv in levels:
        c = lv.concurrency
        n = sized(c, lv.tokens_per_s.value if lv.tokens_per_s else None, seconds, output_len)
        if n is not None:
            out[c] = n
    return out


def step_profile(ctx: Context, st: ProfileStep, sub: RunDir) -> Done:
    load, ch = ctx.playbook.load, ctx.change
    derived = ch.component if ch is not None and ch.component in ("tree_build", "accept") else None
    # the candidate runs inside the live service only once the bench has checked it against
    # the references (a kernel that faults would take the service down with it)
    shadowable = ch is not None and ch.component in ("attention", "tree_build") and st.shadow
    shadow_why = None
    # a host (CPU) candidate cannot fault the GPU, and no GPU bench times it: it is armed
    # unless its bench ran and failed (a wrong answer)
    on_cpu = ch is not None and ch.candidate in HOST_BACKENDS
    if on_cpu and ctx.found.bench_outcome in (None, "pass", "hold", "skip"):
        pass
    elif shadowable and ctx.found.bench_outcome != "pass":
        shadow_why = (
            f"shadow not armed: the bench did not pass ({ctx.found.bench_outcome or 'not run'})"
        )
        shadowable = False
    opts = ProfileOptions(
        levels=load.concurrency,
        requests=load.requests,
        input_len=load.input_len,
        output_len=load.output_len,
        timeout=load.timeout,
        accept_length=st.accept_length,
        component=derived or "tree_build",
        baseline="cpp" if ch is not None and ch.baseline == "cpp" else "python",
        budget=st.budget,
        topk=st.topk,
        depth=st.depth,
        shadow=f"{ch.component}={ch.candidate}" if shadowable and ch is not None else None,
        shadow_forwards=st.shadow_forwards,
        run_seconds=load.run_seconds,  # f over windows as long as measure's runs
    )
    sec = run_profile(ctx.host, opts, lambda c: ctx.say(f"c={c} done"))
    ctx.arms.requests_per_level = sized_requests(sec.levels, load.run_seconds, load.output_len)
    shares = []
    stage = COMPONENT_STAGE[ch.component] if ch is not None else None
    for lv in sec.levels:
        wall = lv.wall_share.get(stage or "")
        v = lv.stage_ms.get(stage or "")
        if wall is not None:
            shares.append(f"c={lv.concurrency} {wall.value:.2%} of the wall time")
        elif v is not None and lv.step_ms.value > 0:
            f = v.value / lv.step_ms.value
            shares.append(f"c={lv.concurrency} {f:.2%} of {lv.step_ms.value:.1f} ms")
    detail = f"{len(sec.levels)} levels"
    if stage is not None:
        detail = f"f(c) of {stage}: " + (", ".join(shares) or "no such stage time in the profile")
    if load.run_seconds > 0:
        detail += f" (windows of about {load.run_seconds:g} s, after a pilot)"
    shadows = shadow_lines(sec)
    if shadow_why:
        sec.shadow_not_armed = shadow_why
        shadows.insert(0, shadow_why)
    if shadows:
        detail += "; " + "; ".join(shadows)
    if sec.service_down:
        status, code, outcome = "fail", 1, "fail"
        detail = f"the service did not answer ({sec.service_down}): no level was run"
    elif sec.failed_requests:
        status, code, outcome = "fail", 1, "fail"
        detail += f"; {sec.failed_requests} requests failed"
    elif sec.incomplete:
        status, code, outcome = "hold", 3, "hold"
        detail += f"; incomplete at c={[i.concurrency for i in sec.incomplete]}"
    else:
        status, code, outcome = "ok", 0, "pass"
    return Done(
        status=status,
        detail=detail,
        outcome=outcome,
        exit_code=code,  # type: ignore[arg-type]
        sections={"profile": sec.record()},
        inputs=opts.model_dump(),
    )


def _reasons(d: Decision) -> str:
    codes = [r.code for r in d.failed] or [r.code for r in d.holds]
    return f"{d.verdict}" + (f": {', '.join(dict.fromkeys(codes))}" if codes else "")


def step_decide(ctx: Context, st: DecideStep, sub: RunDir) -> Done:
    pb = ctx.playbook
    d = decide(gather([ctx.run.path]), pb.threshold, pb.target_concurrency)
    ctx.found.decision = d
    return Done(
        status=VERDICT_STATUS[d.verdict],
        detail=_reasons(d),
        outcome=d.verdict,
        exit_code=d.exit_code,
        sections={"decision": d.model_dump(mode="json")},
        inputs={"threshold": pb.threshold, "concurrency": pb.target_concurrency},
    )


def step_report(ctx: Context, st: ReportStep, sub: RunDir) -> Done:
    pb = ctx.playbook
    ev, d, sources = build(
        [ctx.run.path], threshold=pb.threshold, concurrency=pb.target_concurrency, change=None
    )
    amended = []
    if ctx.found.deploy is not None and not ctx.found.deploy.ok:
        d.failed.append(
            Reason(
                code="deploy_failed",
                message=f"the candidate's deploy failed at {ctx.found.deploy.failed_step}: "
                f"{ctx.found.deploy.message}",
                evidence={"record": ctx.found.deploy_record, "outcome": ctx.found.deploy.outcome},
            )
        )
        d.verdict, d.exit_code = "NO-GO", 1
        amended.append("deploy_failed")
    ctx.found.files = write_reports(ctx.run.path, st.formats, ev, d, sources)
    ctx.found.report = summary(d, sources)
    return Done(
        status=VERDICT_STATUS[d.verdict],
        detail=_reasons(d),
        outcome=d.verdict,
        exit_code=d.exit_code,
        inputs={"threshold": pb.threshold, "formats": st.formats},
        sections={
            "decision": ctx.found.report,
            "files": ctx.found.files,
            "amended_by_rollout": amended,
        },
    )
