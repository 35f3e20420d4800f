"""The rollout's steps around the switch: `measure` (the A/A pair before, the same load after)
and `deploy` (the candidate: the target's service components with the change applied, through
ops.deploy.deploy's Deployer, so build, self-test, atomic switch, post-flight and rollback all
hold).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from checks.vocabulary import COMPONENT_STAGE
from ops.deploy.deploy import Deployer, DeployOptions
from ops.deploy.result import DeployInterrupted
from ops.hosts.inventory import Target
from ops.hosts.records import RunDir
from ops.hosts.remote import open_host
from ops.measure.counters import STAGES, stage_seconds, window_stages
from ops.measure.loadtest import run_loadtest
from ops.rollout.playbook import DeployStep, MeasureStep
from ops.rollout.steps import Context, Done
from ops.sections.change import Change
from ops.sections.measure import (
    AUDIT_PARTS,
    MeasureLevel,
    MeasurePrecision,
    MeasureSection,
    precision_met,
)
from ops.verdict.amdahl import gain_interval, rate_gain
from ops.verdict.gain_audit import cycles_text, points


def _arm(
    ctx: Context, runs: int, label: str, raw: list[dict[str, Any]], cycle: int = 0
) -> dict[int, list[float]]:
    """`runs` passes of the load over every level (interleaved); tokens/s samples per level.
    Each run also keeps the seconds the service spent in the change's stage during its window
    (where the service reports stage timings: `component` in the raw run) and the measure's
    `cycle` it ran in (0: before the first recheck)."""
    load = ctx.playbook.load
    out: dict[int, list[float]] = {c: [] for c in load.concurrency}
    stage = COMPONENT_STAGE[ctx.change.component] if ctx.change else None
    plan = run_plan(load.concurrency, ctx.arms.requests_per_level)
    for i in range(runs):
        levels = []
        for cs, n in plan:
            rep = run_loadtest(
                ctx.host,
                cs,
                requests=n or load.requests,
                input_len=load.input_len,
                output_len=load.output_len,
                timeout=load.timeout,
                counters=stage is not None,
            )
            levels += rep.levels
        for lv in levels:
            lv = dict(lv)
            window = lv.pop("counters", None)
            comp = stages = None
            if window:
                stages = window_stages(window["start"], window["end"])
                if stage:
                    comp = stage_seconds(window["start"], window["end"], stage)
            raw.append(
                {"arm": label, "run": i, "cycle": cycle, **lv, "component": comp, "stages": stages}
            )
            if lv.get("output_tok_per_s"):
                out[lv["concurrency"]].append(float(lv["output_tok_per_s"]))
        ctx.say(f"{label} run {i + 1}/{runs} done" + (f" (cycle {cycle})" if cycle else ""))
    return out


def run_plan(levels: list[int], sized: dict[int, int]) -> list[tuple[list[int], int]]:
    """The loadtest calls of one pass: (levels, requests; 0: load.requests). All levels in one
    call, or one call per level at the requests the profile sized it to (`sized`, from
    load.run_seconds); a level the profile measured no tokens/s at gets load.requests."""
    if not sized:
        return [(levels, 0)]
    return [([c], sized.get(c, 0)) for c in levels]


# the arms of the release before the candidate: the A/A pair and the recheck's A''
# (ops.verdict.amdahl.baseline_runs: the measured gain's baseline is all of them)
BASELINE_ARMS = ("A", "A'", "A''")


def _level_runs(raw: list[dict[str, Any]], arms: tuple[str, ...], c: int) -> list[dict]:
    """The raw runs of `arms` at concurrency c that produced output tokens."""
    return [r for r in raw if r["arm"] in arms and r["concurrency"] == c and r.get("output_tokens")]


def service_speedup(raw: list[dict[str, Any]], c: int) -> dict[str, float] | None:
    """The change's speedup as the service saw it at concurrency c: the stage's seconds per
    output token on the baseline (BASELINE_ARMS) over after, pooled over the runs (their
    seconds over their tokens, as the measured gain pools them: ops.verdict.amdahl.rate_gain), for
    the
    decode steps, prefill, and both. None where the service reports no stage timings."""

    def per_token(arms: tuple[str, ...], part: str) -> float | None:
        runs = [r for r in _level_runs(raw, arms, c) if r.get("component")]
        seconds = sum(
            r["component"]["steps_s"] + r["component"]["prefill_s"]
            if part == "total"
            else r["component"][part]
            for r in runs
        )
        return seconds / sum(r["output_tokens"] for r in runs) if runs else None

    out = {}
    for part in ("total", "steps_s", "prefill_s"):
        b, a = per_token(BASELINE_ARMS, part), per_token(("after",), part)
        if b is not None and a is not None and a > 0 and b > 0:
            out[part.removesuffix("_s")] = b / a
    return out or None


def _parts(run: dict[str, Any]) -> dict[str, float] | None:
    """A run's window split into parts that add up to it, in seconds: the stages of its decode
    steps (`verify` without the attention inside it, `attention` the steps' attention),
    `step_other` (step time outside the stages: the scheduler's own), prefill's attention and
    the rest of prefill, `idle` (the window's time in neither a step nor a prefill)."""
    st, duration = run.get("stages"), run.get("duration_s")
    if not st or not duration:
        return None
    out = {s: st.get(s, 0.0) for s in STAGES}
    out["verify"] -= out["attention"]
    out["step_other"] = st["steps"] - sum(out.values())
    out["prefill_attention"] = st["prefill_attention"]
    out["prefill_other"] = st["prefill"] - st["prefill_attention"]
    out["idle"] = duration - st["steps"] - st["prefill"]
    out["window"] = duration
    return out


def audit(raw: list[dict[str, Any]], c: int) -> dict[str, dict[str, float]] | None:
    """Where the measured gain at concurrency c came from: per part of the window
    (AUDIT_PARTS), its milliseconds per output token on the baseline (BASELINE_ARMS, as the
    measured gain) and after, means over the runs (so the parts still add up to the window).
    None where the service reports no stage timings."""

    def per_token(arms: tuple[str, ...]) -> dict[str, float] | None:
        runs = [
            (p, r["output_tokens"])
            for r in _level_runs(raw, arms, c)
            if (p := _parts(r)) is not None
        ]
        if not runs:
            return None
        return {k: statistics.fmean(1000 * p[k] / n for p, n in runs) for k in AUDIT_PARTS}

    b, a = per_token(BASELINE_ARMS), per_token(("after",))
    if b is None or a is None:
        return None
    return {k: {"before_ms": b[k], "after_ms": a[k]} for k in AUDIT_PARTS}


class MeasureInterrupted(KeyboardInterrupt):
    """Ctrl-C during a measure: the runs that finished, for the step's record
    (`measure_interrupted`), and, inside the recheck, the release the service was left on."""

    def __init__(self, section: dict[str, Any]) -> None:
        on, where = section.get("service_runs"), section.get("service_runs_from")
        self.detail = f"the service runs {on} ({where})" if on else ""
        if not on and section.get("switch"):
            self.detail = (
                f"a recheck switch was interrupted and the host could not say which "
                f"release is current (`ops releases {section['target']}`)"
            )
        n = len(section["runs"])
        runs = f"{n} run{'s' * (n != 1)} finished"
        super().__init__(f"{runs}; {self.detail}" if self.detail else runs)
        self.section = section

    @property
    def partial_sections(self) -> dict[str, Any]:
        """What an interrupted step's record keeps (ops.rollout.runner)."""
        return {"measure_interrupted": self.section}


def step_measure(ctx: Context, st: MeasureStep, sub: RunDir) -> Done:
    """before: the A/A pair (the unchanged service, the load twice); after: the same load on
    the switched service, as many runs as before. The report sets predicted beside measured.
    Ctrl-C raises MeasureInterrupted with the runs that finished."""
    load, raw = ctx.playbook.load, []
    settings = {
        **load.model_dump(),
        "repeats": st.repeats,
        "tokens_per_s": "output, client side",
        "requests_per_level": ctx.arms.requests_per_level or None,
    }
    dep = ctx.found.deploy
    deployed = st.phase == "after" and dep is not None and dep.ok and dep.release
    ctx.arms.measure_serving = (dep.release, "the deploy's switch") if deployed else None
    try:
        return _measure(ctx, st, raw, settings)
    except KeyboardInterrupt as exc:
        on, where = ctx.arms.measure_serving or (None, None)
        switch = None
        if isinstance(exc, DeployInterrupted):  # inside a switch: the host says where it is
            on, where = exc.result.after, "the host, after the interrupted switch"
            switch = exc.result.message
        elif deployed and ctx.arms.measure_serving is None:  # a 2nd Ctrl-C cut the host's answer
            switch = "a recheck switch was interrupted before the host said where it is"
        section = {
            "target": ctx.target.name,
            "phase": st.phase,
            "settings": settings,
            "runs": raw,
            "service_runs": on,
            "service_runs_from": where if on else None,
        }
        if switch:
            section["switch"] = switch
        raise MeasureInterrupted(section) from exc


def _measure(
    ctx: Context, st: MeasureStep, raw: list[dict[str, Any]], settings: dict[str, Any]
) -> Done:
    load = ctx.playbook.load
    if st.phase == "before":
        a, a2 = _arm(ctx, st.repeats, "A", raw), _arm(ctx, st.repeats, "A'", raw)
        ctx.arms.before = {c: [a[c], a2[c]] for c in load.concurrency}
        ctx.arms.before_runs = raw
        levels = [
            {"concurrency": c, "aa": ctx.arms.before[c], "aa_noise": rate_gain(a[c], a2[c])}
            for c in load.concurrency
        ]
        section = {"target": ctx.target.name, "levels": levels, "settings": settings, "runs": raw}
        noise = [f"c={lv['concurrency']} {_pct(lv['aa_noise'])}" for lv in levels]
        failed = sum(r.get("failed", 0) for r in raw)
        ok = not failed and all(a[c] and a2[c] for c in load.concurrency)
        return Done(
            status="ok" if ok else "fail",
            detail=f"A/A noise: {', '.join(noise)}"
            + (f"; {failed} requests failed" if failed else "")
            + _unsized(ctx),
            outcome="pass" if ok else "fail",
            exit_code=0 if ok else 1,
            sections={"measure_before": section},
            inputs=settings,
        )
    if ctx.arms.before is None:
        return Done(
            status="skip",
            detail="no A/A pair: the before phase did not run",
            outcome="skipped",
            exit_code=0,
            inputs=settings,
        )
    after = _arm(ctx, 2 * st.repeats, "after", raw)
    rc = recheck(ctx, st, raw, after) if st.recheck else Recheck()
    again, recheck_note, precision = rc.again, rc.note, rc.precision
    levels: list[MeasureLevel] = []
    gains: list[str] = []
    missing: list[int] = []
    unread: list[str] = []
    for c in load.concurrency:
        before = ctx.arms.before[c][0] + ctx.arms.before[c][1]
        if not before or not after[c]:
            missing.append(c)
            continue
        try:
            levels.append(
                MeasureLevel(
                    concurrency=c,
                    aa=ctx.arms.before[c],
                    before=before,
                    after=after[c],
                    service_speedup=service_speedup(ctx.arms.before_runs + raw, c),
                    audit=audit(ctx.arms.before_runs + raw, c),  # type: ignore[arg-type]
                    recheck=again.get(c, []),
                )
            )
        except ValidationError as exc:  # a run no measurement gives (a broken timing)
            missing.append(c)
            e = exc.errors()[0]
            unread.append(f"c={c}: {'.'.join(map(str, e['loc']))}: {e['msg']}")
            continue
        gains.append(f"c={c} {_pct(rate_gain(before + again.get(c, []), after[c]))}")
    failed = sum(r.get("failed", 0) for r in raw)
    section = MeasureSection(
        target=ctx.target.name,
        levels=levels,
        settings=settings,
        runs=raw,
        change=ctx.change,
        incomplete=missing,
        failed_requests=failed,
        precision=precision,
    )
    ok = not failed and not missing and not rc.failed
    detail = f"measured gain: {', '.join(gains) or 'none'}"
    detail += f"; {recheck_note}" if recheck_note else ""
    detail += _unsized(ctx)
    detail += f"; {failed} requests failed" if failed else ""
    detail += f"; no samples at c={missing}" if missing else ""
    detail += f"; runs that are no measurement: {'; '.join(unread)}" if unread else ""
    return Done(
        status="ok" if ok else "fail",
        detail=detail,
        outcome="pass" if ok else "fail",
        exit_code=0 if ok else 1,
        sections={"measure" if levels else "measure_incomplete": section.record()},
        inputs=settings,
    )


def _deploy_progress(ctx: Context, prefix: str = "") -> Any:
    """A Deployer's progress callback that tells the rollout's output each step as it ends."""

    def show(name: str, step: Any) -> None:
        if step is not None:
            ctx.say(f"{prefix}{name}: {step.status} ({step.seconds:.1f} s) {step.detail}")

    return show


def half_widths(
    before: dict[int, list[list[float]]],
    again: dict[int, list[float]],
    after: dict[int, list[float]],
) -> dict[int, float | None]:
    """Per level, the half-width of the measured gain's interval as the report computes it
    (ops.verdict.amdahl.gain_interval of `after` against the A/A pair and A''), as a fraction; None
    where there is no interval yet (fewer than two runs a side, or a run with no tokens)."""
    out: dict[int, float | None] = {}
    for c, (a, a2) in before.items():
        ci = gain_interval(a + a2 + again.get(c, []), after.get(c, []), c)
        out[c] = None if ci is None else (ci[1] - ci[0]) / 2
    return out


def _precision_doc(
    st: MeasureStep, ran: int, widths: dict[int, float | None]
) -> MeasurePrecision | None:
    """What the measure's `precision` asked and what it got (None when it asked nothing)."""
    if not st.precision:
        return None
    return MeasurePrecision(
        target=st.precision,
        cycles=st.cycles,
        max_cycles=st.max_cycles,
        cycles_run=ran,
        met=precision_met(widths.values(), st.precision),
        half_width={str(c): h for c, h in widths.items()},
    )


def _precision_note(doc: MeasurePrecision | None) -> str:
    if doc is None:
        return ""
    known = [(h, c) for c, h in doc.half_width.items() if h is not None]
    widest = f"widest {points(max(known)[0])} at c={max(known)[1]}" if known else "no interval"
    target = f"{points(doc.target)} points"
    ran = cycles_text(doc.cycles_run)
    if doc.met:
        return f"; precision {target} met after {ran} ({widest})"
    return f"; precision {target} NOT met in {ran} (max_cycles {doc.max_cycles}; {widest})"


@dataclass
class Recheck:
    """What the drift check came back with: the A'' tokens/s per level, a note for the step's
    detail, the precision's outcome, and whether it left the service off the candidate (the
    measure then fails: its after arm is not the candidate's any more)."""

    again: dict[int, list[float]] = field(default_factory=dict)
    note: str = ""
    precision: MeasurePrecision | None = None
    failed: bool = False


def _holder(release: str) -> str:
    """The host lock's holder while the recheck switches (probe37b: not 'ops rollback')."""
    return f"ops rollout measure (switch to {release})"


def recheck(
    ctx: Context,
    st: MeasureStep,
    raw: list[dict[str, Any]],
    after: dict[int, list[float]] | None = None,
) -> Recheck:
    """The drift check after the switch, `st.cycles` times: back to the release that ran before
    the candidate (ops.deploy.deploy's rollback: switch, restart, post-flight), the load on it once
    more (arm A'', as many runs as the after arm), then the candidate's release back in, and,
    but in the last cycle, its load once more (`after` gets those runs). So A A' | after | A''
    (| after | A'' ...) is balanced in time: ops.verdict.amdahl.baseline_runs. With `st.precision`,
    the cycles go on past `st.cycles` until the measured gain's interval is that narrow at
    every level (half_widths, checked after each A'' arm: the two arms then have as many
    runs), `st.max_cycles` at the most. `Recheck.failed` when the candidate could not be
    switched back in (the service then runs the release the rollback left current, and the
    note names it)."""
    dep = ctx.found.deploy
    if dep is None or not dep.ok or not dep.before or not dep.release:
        return Recheck(note="no recheck: no deployed candidate with a release before it")
    opts = ctx.found.deploy_opts or DeployOptions()  # the deploy step's waits and post-flight
    show = _deploy_progress(ctx, "recheck ")
    assert ctx.change is not None  # a deployed candidate has one
    again: dict[int, list[float]] = {}
    last = st.max_cycles if st.precision and st.max_cycles else st.cycles
    of = f"{st.cycles}" if last == st.cycles else f"{st.cycles} (up to {last})"
    widths: dict[int, float | None] = {}
    k = 0
    for k in range(1, last + 1):
        with open_host(ctx.target) as host:
            ctx.arms.measure_serving = None  # not known again until the switch has answered
            back = Deployer(host, opts, show).rollback(dep.before, _holder(dep.before))
        if not back.ok:
            what = f"switching back to {dep.before} failed ({back.message})"
            if k == 1:
                return Recheck(note=f"no recheck: {what}")
            doc = _precision_doc(st, k - 1, widths)
            if back.after and back.after != dep.release:  # not the candidate that ran before
                ctx.arms.recheck_left_on = back.after
                note = f"FAILED: recheck cycle {k} of {of}: {what}; the service runs {back.after}"
                return Recheck(again, note, doc, failed=True)
            return Recheck(again, f"recheck: cycle {k} of {of} stopped: {what}", doc)
        ctx.arms.measure_serving = (dep.before, "the recheck's last switch")
        ctx.say(f"recheck: {dep.before} is current again; the load once more")
        for c, xs in _arm(ctx, 2 * st.repeats, "A''", raw, cycle=k).items():
            again.setdefault(c, []).extend(xs)
        if st.precision and ctx.arms.before is not None and after is not None:
            widths = half_widths(ctx.arms.before, again, after)
        with open_host(candidate_target(ctx.target, ctx.change)) as host:
            ctx.arms.measure_serving = None
            fwd = Deployer(host, opts, show).rollback(dep.release, _holder(dep.release))
        if not fwd.ok:
            ctx.arms.recheck_left_on = fwd.after or dep.before
            note = (
                f"FAILED to switch the candidate {dep.release} back in after the recheck "
                f"({fwd.message}): the service runs {fwd.after or dep.before}"
            )
            return Recheck(again, note, _precision_doc(st, k, widths), failed=True)
        ctx.arms.measure_serving = (dep.release, "the recheck's last switch")
        done = k >= last or (
            k >= st.cycles and bool(st.precision) and precision_met(widths.values(), st.precision)
        )
        if st.precision and k >= st.cycles:
            shown = ", ".join(
                f"c={c} " + ("n/a" if h is None else points(h)) for c, h in widths.items()
            )
            ctx.say(
                f"recheck: after cycle {k}, the measured gain's interval: {shown} points "
                f"(precision {points(st.precision)})"
            )
        if done:
            break
        if after is not None:
            ctx.say(f"recheck: {dep.release} is current again; the load once more")
            for c, xs in _arm(ctx, 2 * st.repeats, "after", raw, cycle=k).items():
                after.setdefault(c, []).extend(xs)
    doc = _precision_doc(st, k, widths)
    cycles = f" in {k} cycles" if k > 1 else ""
    note = f"recheck: A'' on {dep.before}{cycles}, then {dep.release} current again"
    return Recheck(again, note + _precision_note(doc), doc)


def _unsized(ctx: Context) -> str:
    """Where load.run_seconds asked for sized runs and a level got load.requests instead."""
    load = ctx.playbook.load
    unsized = [c for c in load.concurrency if c not in ctx.arms.requests_per_level]
    if load.run_seconds <= 0 or not unsized:
        return ""
    return (
        f"; load.run_seconds not applied at c={unsized} (the profile measured no tokens/s "
        "there): those levels ran load.requests"
    )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.2f}%"


def candidate_target(target: Target, change: Change) -> Target:
    """The target with its service's components switched to the candidate."""
    comps = {**target.service.components, change.component: change.candidate}
    svc = target.service.model_copy(update={"components": comps})
    return target.model_copy(update={"service": svc})


def step_deploy(ctx: Context, st: DeployStep, sub: RunDir) -> Done:
    assert ctx.change is not None  # the playbook's validation says so
    cand = candidate_target(ctx.target, ctx.change)
    opts = DeployOptions(
        source=Path(st.source) if st.source else None,
        ref=st.ref,
        allow_dirty=st.allow_dirty,
        force=st.force,
        keep=st.keep,
        wait_s=st.wait_s,
        max_tokens=st.max_tokens,
    )
    with open_host(cand) as host:
        res = Deployer(host, opts, _deploy_progress(ctx)).run()
    ctx.found.deploy, ctx.found.deploy_record = res, str(sub.path / "record.json")
    ctx.found.deploy_opts = opts
    for flight in ("preflight", "postflight"):  # the deploy's own checks, as the report reads them
        step = next((s for s in res.steps if s.name == flight and s.data.get("report")), None)
        if step is not None:
            rec = RunDir(sub.path / flight, "healthcheck", sub.target, sub.started)
            rec.path.mkdir()
            golden = bool(step.data.get("recorded_golden"))
            rec.write_record(
                inputs={"role": flight, "record_golden": golden, "by": "deploy"},
                outcome=step.status,
                exit_code=0 if step.status == "ok" else 1,
                healthcheck=step.data["report"],
            )
    inputs = {**opts.model_dump(mode="json"), "components": cand.service.components}
    return Done(
        status="ok" if res.ok else "fail",
        detail=f"{res.outcome}: {res.message}",
        outcome=res.outcome,
        exit_code=0 if res.ok else 1,
        sections={"results": [res.model_dump(mode="json")]},
        inputs=inputs,
    )
