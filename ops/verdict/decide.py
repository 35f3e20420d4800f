"""The decision: GO / NO-GO / HOLD over typed evidence, from the Amdahl rows (ops.verdict.amdahl).

`projected_gain(f, s)` (ops.verdict.amdahl, named here too) is the end-to-end throughput gain when a
fraction `f` of the time gets `s` times faster; f(c) is the component's share of the profile's
measured window's wall time, or for a record without it the share of the step at batch c.
`ceiling(f)` is the gain if it took no time at all. `decide(evidence, ...)` is a pure function
of the records (ops.verdict.evidence): every failed condition becomes a NO-GO reason, every missing
or
too-noisy piece of evidence a HOLD cause; GO only when there are none (NO-GO wins over HOLD: a
failed condition decides whatever else is missing).

    NO-GO  preflight_failed, postflight_failed, identity_mismatch, interference, deploy_failed
           (added by a rollout's report step: the candidate's deploy failed),
           kernel_not_exact, gain_below_threshold, ceiling_below_threshold (no s(c) needed:
           even an infinitely fast component cannot clear the threshold)
    HOLD   no_change, no_preflight, no_postflight (deployed, not checked), no_identity,
           identity_nondeterministic, no_bench (not for a CPU candidate the shadow timed),
           bench_failed, bench_held (e.g. no GPU),
           no_probe, no_kernel_rows, no_profile, profile_failed_requests, no_profile_level,
           no_component_time, gain_within_noise, unfinished_record (a run that did not finish:
           its record, written at its start, was never replaced; a rollout's own record is
           only its index, and its report step reads it while it runs: not a cause)

Rendering is ops.verdict.render; building and writing a report is ops.verdict.reports; the
command line is ops.cli.report.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ops.measure.healthcheck import aa_runs_text
from ops.sections.bench import BenchSection, Probe
from ops.sections.change import Change

# re-exported: the report's formulas are named ops.verdict.decide.*
from ops.verdict.amdahl import (
    AmdahlRow,
    SpeedRow,
    _pct,
    amdahl_rows,
    bench_impls,
    ceiling,
    effective_change,
    projected_gain,
    projected_gain_parts,
    shadow_speed,
    speedup_at,
    step_reduction,
    times,
)
from ops.verdict.evidence import Evidence, HealthEntry, unfinished_line

__all__ = [
    "EXIT_OF",
    "AmdahlRow",
    "Decision",
    "Reason",
    "SpeedRow",
    "Verdict",
    "amdahl_rows",
    "ceiling",
    "decide",
    "effective_change",
    "projected_gain",
    "projected_gain_parts",
    "speedup_at",
    "step_reduction",
    "times",
]

Verdict = Literal["GO", "NO-GO", "HOLD"]
EXIT_OF = {"GO": 0, "NO-GO": 1, "HOLD": 3}


class Reason(BaseModel):
    """One failed condition (NO-GO) or missing / noisy evidence (HOLD), or a passed check."""

    code: str
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class Decision(BaseModel):
    verdict: Verdict
    exit_code: int
    threshold: float
    target_concurrency: int | None
    change: Change | None
    failed: list[Reason]  # NO-GO reasons: every failed condition
    holds: list[Reason]  # HOLD causes: missing or too-noisy evidence
    passed: list[Reason]  # conditions that held, for the report
    amdahl: list[AmdahlRow]


class _Tally:
    def __init__(self) -> None:
        self.failed: list[Reason] = []
        self.holds: list[Reason] = []
        self.passed: list[Reason] = []

    def fail(self, code: str, message: str, **evidence: Any) -> None:
        self.failed.append(Reason(code=code, message=message, evidence=evidence))

    def hold(self, code: str, message: str, **evidence: Any) -> None:
        self.holds.append(Reason(code=code, message=message, evidence=evidence))

    def ok(self, code: str, message: str, **evidence: Any) -> None:
        self.passed.append(Reason(code=code, message=message, evidence=evidence))


def _flights(ev: Evidence, t: _Tally) -> None:
    for role in ("preflight", "postflight"):
        entries = ev.flights(role)
        if not entries:
            if role == "preflight":
                t.hold("no_preflight", "no pre-flight healthcheck record")
            elif ev.deployed:
                t.hold("no_postflight", "the candidate was deployed but no post-flight was run")
            continue
        for h in entries:
            if h.report is None:
                t.fail(f"{role}_failed", f"{h.name} did not run: {h.error}", record=h.path)
                continue
            bad = [c for c in h.report.checks if c.status == "fail" and c.name != "identity"]
            if bad:
                names = ", ".join(c.name for c in bad)
                t.fail(
                    f"{role}_failed",
                    f"{h.name} checks failed: {names}",
                    record=h.path,
                    checks={c.name: c.detail for c in bad},
                )
            else:
                t.ok(f"{role}_passed", f"{h.name}: {len(h.report.checks)} checks, none failed")
        skipped = {h.path: (h.name, why) for h in entries if (why := _identity_skipped(h))}
        for path, (name, why) in skipped.items():
            t.hold("no_identity", f"{name}: {why}", record=path)
        checked = [h for h in entries if h.report is not None and h.path not in skipped]
        compared = [h for h in checked if not h.golden_recorded]
        for h in compared:
            _identity(h.name, h.path, h.report.modules.get("identity") if h.report else None, t)
        if not compared and any(h.golden_recorded for h in checked):
            t.hold("no_identity", f"{role}: the golden set was recorded, nothing compared with it")


def _identity_skipped(h: HealthEntry) -> str | None:
    """Why the flight could not check token identity (its identity check skipped), or None."""
    if h.report is None or h.report.modules.get("identity"):
        return None
    check = next((c for c in h.report.checks if c.name == "identity"), None)
    if check is None or check.status != "skip":
        return None
    if check.detail == "service not healthy":
        return (
            f"could not check greedy token identity: the service was not healthy "
            f"(failed: {', '.join(c.name for c in h.report.checks if c.status == 'fail')})"
        )
    return f"greedy token identity not checked: {check.detail}"


def _identity(role: str, path: str, data: dict[str, Any] | None, t: _Tally) -> None:
    if not data or "identity_pct" not in data:
        t.hold(
            "no_identity", f"{role}: no greedy token-identity result (no golden set?)", record=path
        )
        return
    n = data.get("aa_runs", 0)
    aa = f" after {aa_runs_text(n)}" if n else " (no A/A run)"
    ev = {
        "record": path,
        "identity_pct": data["identity_pct"],
        "concurrency": data.get("concurrency", 1),
    }
    if data.get("mismatched"):
        t.fail(
            "identity_mismatch",
            f"{role}: greedy token identity {data['identity_pct']}% at concurrency 1; "
            f"differs on {', '.join(data['mismatched'])}",
            **ev,
            mismatched=data["mismatched"],
        )
    if data.get("nondeterministic"):
        t.hold(
            "identity_nondeterministic",
            f"{role}: the service disagrees with itself on "
            f"{', '.join(data['nondeterministic'])}{aa}",
            **ev,
        )
    if not data.get("mismatched") and not data.get("nondeterministic"):
        t.ok(
            "identity",
            f"{role}: greedy token identity 100% "
            f"({data.get('matched')}/{data.get('total')}) at concurrency 1{aa}",
            **ev,
        )


def _one_bench(path: str, b: BenchSection, t: _Tally) -> None:
    for why in b.hold_reasons:
        t.hold("bench_held", f"bench: {why}", record=path)
    bad = list(b.refcheck_failed) or [
        f"{r.kernel} {r.impl} {r.shape}" for r in b.rows if r.refcheck is False
    ]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        t.fail(
            "kernel_not_exact",
            f"the kernel differs from its reference: {bad[0]}{more}",
            record=path,
            rows=bad,
        )
    p = b.probe
    tripped = b.interference is True or (p is not None and (p.tripped or p.stopped_early))
    rise = None
    if p is not None and p.p50_before_ms and p.p50_during_ms is not None:
        rise = p.p50_during_ms / p.p50_before_ms - 1
    if tripped:
        p = p or Probe()
        t.fail(
            "interference",
            f"the service's p50 latency rose {_pct(rise, 1)} during the "
            f"bench (threshold {p.threshold:.0%}); bench stopped early: {p.stopped_early}",
            record=path,
            p50_before_ms=p.p50_before_ms,
            p50_during_ms=p.p50_during_ms,
            p50_after_ms=p.p50_after_ms,
        )
    elif p is None:
        if b.rows:
            t.hold("no_probe", "the bench ran without an interference probe", record=path)
    elif p.during_ms:
        t.ok(
            "no_interference",
            f"probe p50 {_pct(rise, 1)} during the bench (threshold {p.threshold:.0%})",
            record=path,
        )
    if not b.ok and not (tripped or bad or b.hold_reasons):
        if b.guard is not None and not b.guard.ok:
            t.hold(
                "bench_failed",
                f"the GPU guard refused the bench: {b.guard.message}",
                record=path,
                guard=b.guard.verdict,
            )
        else:
            why = "; ".join(b.reasons) or "the bench says it failed"
            t.hold("bench_failed", f"the bench failed: {why}", record=path)


def _shadowed(ev: Evidence, change: Change) -> bool:
    """The profile ran the shadow of exactly this change at some level (and it gave an s)."""
    levels = ev.profile.levels if ev.profile is not None else []
    return any(shadow_speed(lv, change, "step") is not None for lv in levels)


def _bench(ev: Evidence, change: Change | None, t: _Tally) -> None:
    # a host candidate: no GPU bench can time it; where the shadow did, on the service's own
    # traffic, a bench that could not run (no GPU: held, no rows) says nothing against it
    cpu = change is not None and change.runs_on_cpu and _shadowed(ev, change)
    if cpu and change is not None:
        t.ok(
            "cpu_candidate",
            f"{change.candidate} runs on the CPU: its s is the shadow's, "
            "measured on the service's own traffic (no GPU bench needed)",
        )
    for path, msg in ev.bench_errors:
        if not cpu:
            t.hold("bench_failed", f"the bench did not run: {msg}", record=path)
    if not ev.bench and not ev.bench_errors and not cpu:
        t.hold("no_bench", "no GPU bench record")
    for path, b in ev.bench:
        if cpu and not b.rows and not b.reasons and not b.refcheck_failed:
            continue  # it could not run here: nothing it says counts against the shadow's s
        _one_bench(path, b, t)
    if cpu or (change is not None and ev.bench and not any(b.rows for _, b in ev.bench)):
        return  # s comes from the shadow / held above: no rows at all
    if change is not None and ev.bench and speedup_at(ev, change, 1) is None:
        suite, kernel, base, cand = change.bench_map()
        have = sorted(bench_impls(ev, suite, kernel))
        t.hold(
            "no_kernel_rows",
            f"the bench has no {suite}/{kernel} rows of both {base} "
            f"and {cand}"
            + (f" with {change.shape}" if change.shape else "")
            + (f" (its impls there: {', '.join(have)})" if have else ""),
        )


def _gain(ev: Evidence, rows: list[AmdahlRow], c: int | None, th: float, t: _Tally) -> None:
    if ev.profile is None:
        failed = ev.profile_errors[-1][1] if ev.profile_errors else ""
        why = f" (the profile failed: {failed})" if failed else ""  # the cause, not only a HOLD
        t.hold("no_profile", f"no service profile record{why}: f(c) is unknown")
        return
    if ev.profile.failed_requests:
        t.hold(
            "profile_failed_requests",
            f"{ev.profile.failed_requests} requests failed while "
            "the service was profiled: its step times are not trustworthy",
        )
    if not rows:
        why = " (its requests failed)" if ev.profile.failed_requests else ""
        if ev.profile.service_down:
            why = f" (the service did not answer: {ev.profile.service_down})"
        elif ev.profile.interrupted:
            why = " (interrupted: Ctrl-C)"
        t.hold("no_profile_level", f"the profile measured no level{why}: f(c) is unknown")
        return
    row = next((r for r in rows if r.concurrency == c), None)
    if row is None:
        have = [r.concurrency for r in rows]
        left = ev.profile.interrupted.levels_left if ev.profile.interrupted else []
        cut = "; the profile was interrupted (Ctrl-C) before it" if c in left else ""
        t.hold("no_profile_level", f"concurrency {c} was not profiled (profiled: {have}){cut}")
        return
    if row.f is None:
        t.hold("no_component_time", f"c={c}: {row.note}")
        return
    if row.gain is None or row.gain_lo is None or row.gain_hi is None:
        # no speedup (held by the bench checks); but if even an infinitely fast component
        # cannot clear the threshold, no bench can change the answer
        top = ceiling(row.f_hi if row.f_hi is not None else row.f)
        if top < th:
            t.fail(
                "ceiling_below_threshold",
                f"at c={c} the component is {row.f:.2%} of the "
                f"{'measured wall time' if row.f_basis == 'wall' else 'step'}: even infinitely "
                f"fast it gains at most {_pct(top)} (ceiling), below "
                f"the {th:.1%} threshold",
                concurrency=c,
                f=row.f,
                ceiling=top,
                threshold=th,
            )
        return
    ev_ = {
        "concurrency": c,
        "f": row.f,
        "s": row.speed.s if row.speed else None,
        "gain": row.gain,
        "gain_lo": row.gain_lo,
        "gain_hi": row.gain_hi,
        "ceiling": row.ceiling,
        "aa_noise": row.aa_noise,
        "threshold": th,
    }
    what = (
        f"projected gain at c={c} {_pct(row.gain)} ({_pct(row.gain_lo)} .. "
        f"{_pct(row.gain_hi)}; f = {row.f:.2%}, s = {times(ev_['s'])}, ceiling "
        f"{_pct(row.ceiling)})"
    )
    noise = row.aa_noise or 0.0
    if row.gain_hi < th:
        t.fail("gain_below_threshold", f"{what} is below the {th:.1%} threshold", **ev_)
    elif row.clears:
        t.ok("gain", f"{what} clears the {th:.1%} threshold by more than the noise", **ev_)
    else:
        t.hold(
            "gain_within_noise",
            f"{what} does not clear the {th:.1%} threshold by more "
            f"than the noise (A/A {_pct(row.aa_noise, 2)})"
            if noise
            else f"{what}: the {th:.1%} threshold lies within its spread",
            **ev_,
        )


def decide(ev: Evidence, threshold: float = 0.03, concurrency: int | None = None) -> Decision:
    """GO / NO-GO / HOLD with every reason; pure over the evidence."""
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold!r}")
    t = _Tally()
    change = effective_change(ev, ev.change)
    if change is None:
        t.hold("no_change", "no change named (a rollout's `change` record, or --change)")
    for rec in ev.unfinished:
        if rec.command != "rollout":
            t.hold("unfinished_record", unfinished_line(rec), record=rec.path)
    _flights(ev, t)
    _bench(ev, change, t)
    rows = amdahl_rows(ev, change, threshold) if change else []
    if concurrency is None and ev.profile is not None and ev.profile.levels:
        # the highest level asked for: one a Ctrl-C left unprofiled is still the target (a
        # verdict at a lower level than the user asked about would read as the answer)
        left = ev.profile.interrupted.levels_left if ev.profile.interrupted else []
        concurrency = max([lv.concurrency for lv in ev.profile.levels] + left)
    if change is not None:
        _gain(ev, rows, concurrency, threshold, t)
    verdict: Verdict = "NO-GO" if t.failed else "HOLD" if t.holds else "GO"
    return Decision(
        verdict=verdict,
        exit_code=EXIT_OF[verdict],
        threshold=threshold,
        target_concurrency=concurrency,
        change=change,
        failed=t.failed,
        holds=t.holds,
        passed=t.passed,
        amdahl=rows,
    )
