"""The decision: the Amdahl model per concurrency and GO / NO-GO / HOLD over typed evidence.

`projected_gain(f, s)` is the end-to-end throughput gain when a fraction `f` of the time gets
`s` times faster; f(c) is the component's share of the profile's measured window's wall time
(`ProfileLevel.wall_share`), or for a record without it the share of the step at batch c.
`ceiling(f)` is the gain if it took no time at all. `decide(evidence, ...)` is a pure function
of the records (ops.evidence): every failed condition becomes a NO-GO reason, every missing or
too-noisy piece of evidence a HOLD cause; GO only when there are none (NO-GO wins over HOLD: a
failed condition decides whatever else is missing).

    NO-GO  preflight_failed, postflight_failed, identity_mismatch, interference,
           kernel_not_exact, gain_below_threshold, ceiling_below_threshold (no s(c) needed:
           even an infinitely fast component cannot clear the threshold)
    HOLD   no_change, no_preflight, no_postflight (deployed, not checked), no_identity,
           identity_nondeterministic, no_bench, bench_failed, bench_held (e.g. no GPU),
           no_probe, no_kernel_rows, no_profile, profile_failed_requests, no_profile_level,
           no_component_time, gain_within_noise

Rendering is ops.render; the command line is ops.cli_report.
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import BaseModel, Field

from ops.evidence import (
    COMPONENT_STAGE,
    PREFILL_KERNELS,
    STAGE_KERNELS,
    BenchSection,
    Change,
    Evidence,
    HealthEntry,
    KernelRow,
    Probe,
)

Verdict = Literal["GO", "NO-GO", "HOLD"]
F_BASIS = {
    "wall": "share of the measured window's wall time",
    "step": "share of the step at batch c",
}
EXIT_OF = {"GO": 0, "NO-GO": 1, "HOLD": 3}


def _check_f(f: float) -> None:
    if not 0 <= f < 1:
        raise ValueError(f"f must be in [0, 1), got {f!r}")


def projected_gain(f: float, s: float) -> float:
    """End-to-end throughput gain 1/((1-f) + f/s) - 1 when a fraction f gets s times faster."""
    _check_f(f)
    if not s > 0:
        raise ValueError(f"s must be > 0, got {s!r}")
    return 1.0 / ((1.0 - f) + f / s) - 1.0


def ceiling(f: float) -> float:
    """The gain if the component took no time at all: 1/(1-f) - 1."""
    _check_f(f)
    return 1.0 / (1.0 - f) - 1.0


def step_reduction(f: float, s: float) -> float:
    """How much shorter the step gets: f - f/s (0.00998 for f = 1%, s = 474)."""
    return 1.0 - 1.0 / (1.0 + projected_gain(f, s))


class Reason(BaseModel):
    """One failed condition (NO-GO) or missing / noisy evidence (HOLD), or a passed check."""

    code: str
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class SpeedRow(BaseModel):
    """s(c): the candidate's speedup over the baseline at batch c, with its IQR-end spread."""

    batch: int
    s: float
    lo: float
    hi: float
    baseline_us: float
    candidate_us: float
    note: str = ""


class AmdahlRow(BaseModel):
    concurrency: int
    f: float | None = None
    f_lo: float | None = None
    f_hi: float | None = None
    f_source: str = ""  # measured | derived
    f_basis: Literal["wall", "step"] | None = None  # what f is a share of (F_BASIS)
    speed: SpeedRow | None = None
    f_prefill: float | None = None  # the part of f in prefill, projected at prefill_speed
    prefill_speed: SpeedRow | None = None
    gain: float | None = None
    gain_lo: float | None = None
    gain_hi: float | None = None
    step_shorter: float | None = None
    ceiling: float | None = None
    measured_gain: float | None = None
    service_speedup: dict[str, float] | None = None  # the stage's s as the service saw it
    aa_noise: float | None = None
    clears: bool | None = None
    note: str = ""


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


def _spread(vals: list[float]) -> tuple[float, float]:
    return min(vals), max(vals)


def _rows(ev: Evidence, change: Change) -> list[KernelRow]:
    suite, kernel, _, _ = change.bench_map()
    out = [r for _, b in ev.bench for r in b.rows if r.suite == suite and r.kernel == kernel]
    return [r for r in out if all(r.shape.get(k) == v for k, v in change.shape.items())]


def projected_gain_parts(parts: list[tuple[float, float]]) -> float:
    """The gain when each part f_i of the time gets s_i times faster (parts of one component
    that run at different shapes, e.g. attention in the decode steps and in prefill):
    1/((1 - sum f_i) + sum f_i/s_i) - 1; `projected_gain(f, s)` for one part."""
    f = sum(p[0] for p in parts)
    _check_f(f)
    if not all(p[1] > 0 for p in parts):
        raise ValueError(f"every s must be > 0, got {[p[1] for p in parts]!r}")
    return 1.0 / ((1.0 - f) + sum(fi / si for fi, si in parts)) - 1.0


def prefill_speedup(ev: Evidence, change: Change) -> SpeedRow | None:
    """s of the change where it runs in prefill: the bench kernel's prefill rows
    (`PREFILL_KERNELS`) at the pinned prompt length `change.shape.L`, or None."""
    suite, kernel, base_impl, cand_impl = change.bench_map()
    pk = PREFILL_KERNELS.get(kernel)
    if pk is None:
        return None
    length = change.shape.get("L")
    rows = [r for _, b in ev.bench for r in b.rows if r.suite == suite and r.kernel == pk]
    rows = [r for r in rows if length is None or r.shape.get("L") == length]
    return _speed(rows, base_impl, cand_impl, 1)


def speedup_at(ev: Evidence, change: Change, batch: int) -> SpeedRow | None:
    """s at `batch` from the bench rows (nearest benchmarked batch; lowest of several shapes)."""
    _, _, base_impl, cand_impl = change.bench_map()
    return _speed(_rows(ev, change), base_impl, cand_impl, batch)


def _speed(rows: list[KernelRow], base_impl: str, cand_impl: str, batch: int) -> SpeedRow | None:
    batches = sorted({r.batch for r in rows if r.batch is not None and r.impl == cand_impl})
    batches = [b for b in batches if any(r.impl == base_impl and r.batch == b for r in rows)]
    if not batches:
        return None
    b = min(batches, key=lambda x: (abs(x - batch), x))
    found: list[SpeedRow] = []
    for cand in (r for r in rows if r.batch == b and r.impl == cand_impl and r.median_us > 0):
        key = {k: v for k, v in cand.shape.items()}
        for base in (r for r in rows if r.batch == b and r.impl == base_impl and r.shape == key):
            s = base.median_us / cand.median_us
            lo = base.lo_us / cand.hi_us if cand.hi_us > 0 else s
            hi = base.hi_us / cand.lo_us if cand.lo_us > 0 else s
            found.append(
                SpeedRow(
                    batch=b,
                    s=s,
                    lo=lo,
                    hi=hi,
                    baseline_us=base.median_us,
                    candidate_us=cand.median_us,
                )
            )
    if not found:
        return None
    pick = min(found, key=lambda r: r.s)
    notes = []
    if b != batch:
        notes.append(f"batch {b} (nearest benchmarked to {batch})")
    if len(found) > 1:
        notes.append(f"lowest of {len(found)} shapes at batch {b}; pin one with change.shape")
    pick.note = "; ".join(notes)
    return pick


def _aa_noise(ev: Evidence, c: int) -> tuple[float | None, float | None]:
    """(A/A relative difference of tokens/s, measured gain after/before - 1) at concurrency c."""
    if ev.measure is None:
        return None, None
    lv = next((x for x in ev.measure.levels if x.concurrency == c), None)
    if lv is None:
        return None, None
    noise = None
    if len(lv.aa) >= 2 and lv.aa[0] and lv.aa[1]:
        a, b = statistics.median(lv.aa[0]), statistics.median(lv.aa[1])
        noise = abs(b / a - 1) if a > 0 else None
    before = statistics.median(lv.before)
    gain = statistics.median(lv.after) / before - 1 if before > 0 else None
    return noise, gain


def _service_speedup(ev: Evidence, c: int) -> dict[str, float] | None:
    if ev.measure is None:
        return None
    lv = next((x for x in ev.measure.levels if x.concurrency == c), None)
    return None if lv is None else lv.service_speedup


def amdahl_rows(ev: Evidence, change: Change, threshold: float) -> list[AmdahlRow]:
    """One row per profiled concurrency: f(c), s(c), projected gain with its spread, ceiling."""
    if ev.profile is None:
        return []
    stage = COMPONENT_STAGE[change.component]
    out = []
    for lv in ev.profile.levels:
        row = AmdahlRow(concurrency=lv.concurrency)
        row.aa_noise, row.measured_gain = _aa_noise(ev, lv.concurrency)
        row.service_speedup = _service_speedup(ev, lv.concurrency)
        found = lv.f_of(stage)
        if found is None:
            row.note = f"the profile has no {stage!r} time at this concurrency"
            out.append(row)
            continue
        fv, row.f_basis = found
        row.f = min(fv.value, 0.999999)
        row.f_lo = min(fv.lo, row.f)
        row.f_hi = max(min(fv.hi, 0.999999), row.f)
        row.f_source = fv.source
        notes = []
        if row.f_basis == "step" and fv.source == "measured":
            notes.append(
                f"f is {stage}'s share of the step at batch c: this profile record has "
                "no wall_share (made before ops profile measured the share of the measured "
                "window's wall time), and the step share overstates what the client sees when "
                "the window also holds prefill, other batch sizes and gaps"
            )
        row.ceiling = ceiling(row.f)
        row.speed = speedup_at(ev, change, lv.concurrency)
        if row.speed is None:
            notes.insert(0, "no bench rows for this change")
        row.note = "; ".join(notes)
        if row.speed is None:
            out.append(row)
            continue
        sp = row.speed
        pre = float((fv.model_extra or {}).get("prefill") or 0.0) if row.f_basis == "wall" else 0
        pre = min(pre, row.f)
        pre_sp = prefill_speedup(ev, change) if pre > 0 else None
        if pre > 0 and pre_sp is not None:  # two parts: decode steps at s(c), prefill at s_p
            row.f_prefill, row.prefill_speed = pre, pre_sp

            def gain(f: float, s: float, sp_: float, pre: float = pre) -> float:
                f_pre = min(pre, f)
                return projected_gain_parts([(f - f_pre, s), (f_pre, sp_)])

            corners = [
                gain(f, s, q)
                for f in (row.f_lo, row.f_hi)
                for s in (sp.lo, sp.hi)
                for q in (pre_sp.lo, pre_sp.hi)
            ]
            row.gain = gain(row.f, sp.s, pre_sp.s)
            row.note = "; ".join(
                x for x in (row.note, f"of f, {pre:.3%} is in prefill, projected at its own "
                            f"s = {pre_sp.s:.3g}x (bench rows of the prefill at this prompt "
                            "length)") if x
            )  # fmt: skip
        else:
            if pre > 0:
                row.note = "; ".join(
                    x for x in (row.note, f"of f, {pre:.3%} is in prefill, projected at the "
                                "decode step's s (the bench has no prefill rows for it)") if x
                )  # fmt: skip
            corners = [projected_gain(f, s) for f in (row.f_lo, row.f_hi) for s in (sp.lo, sp.hi)]
            row.gain = projected_gain(row.f, sp.s)
        row.gain_lo, row.gain_hi = _spread(corners + [row.gain])
        row.step_shorter = 1.0 - 1.0 / (1.0 + row.gain)
        row.clears = row.gain_lo - (row.aa_noise or 0.0) > threshold
        out.append(row)
    return out


def _pct(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"


def times(s: float | None) -> str:
    """A speedup as people write it: 3.2x, 474x, 2,107x."""
    return "n/a" if s is None else f"{s:,.0f}x" if s >= 100 else f"{s:.3g}x"


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
                t.fail(f"{role}_failed", f"{role} did not run: {h.error}", record=h.path)
                continue
            bad = [c for c in h.report.checks if c.status == "fail" and c.name != "identity"]
            if bad:
                names = ", ".join(c.name for c in bad)
                t.fail(
                    f"{role}_failed",
                    f"{role} checks failed: {names}",
                    record=h.path,
                    checks={c.name: c.detail for c in bad},
                )
            else:
                t.ok(f"{role}_passed", f"{role}: {len(h.report.checks)} checks, none failed")
        skipped = {h.path: why for h in entries if (why := _identity_skipped(h)) is not None}
        for path, why in skipped.items():
            t.hold("no_identity", f"{role}: {why}", record=path)
        checked = [h for h in entries if h.report is not None and h.path not in skipped]
        compared = [h for h in checked if not h.golden_recorded]
        for h in compared:
            _identity(role, h.path, h.report.modules.get("identity") if h.report else None, t)
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
    aa = f" after {data.get('aa_runs', 0)} A/A runs" if data.get("aa_runs") else " (no A/A run)"
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


def _bench(ev: Evidence, change: Change | None, t: _Tally) -> None:
    for path, msg in ev.bench_errors:
        t.hold("bench_failed", f"the bench did not run: {msg}", record=path)
    if not ev.bench and not ev.bench_errors:
        t.hold("no_bench", "no GPU bench record")
    for path, b in ev.bench:
        _one_bench(path, b, t)
    if change is not None and ev.bench and not any(b.rows for _, b in ev.bench):
        return  # held above: no rows at all
    if change is not None and ev.bench and speedup_at(ev, change, 1) is None:
        suite, kernel, base, cand = change.bench_map()
        t.hold(
            "no_kernel_rows",
            f"the bench has no {suite}/{kernel} rows of both {base} "
            f"and {cand}" + (f" with {change.shape}" if change.shape else ""),
        )


def _gain(ev: Evidence, rows: list[AmdahlRow], c: int | None, th: float, t: _Tally) -> None:
    if ev.profile is None:
        t.hold("no_profile", "no service profile record: f(c) is unknown")
        return
    if ev.profile.failed_requests:
        t.hold(
            "profile_failed_requests",
            f"{ev.profile.failed_requests} requests failed while "
            "the service was profiled: its step times are not trustworthy",
        )
    if not rows:
        why = " (its requests failed)" if ev.profile.failed_requests else ""
        t.hold("no_profile_level", f"the profile measured no level{why}: f(c) is unknown")
        return
    row = next((r for r in rows if r.concurrency == c), None)
    if row is None:
        have = [r.concurrency for r in rows]
        t.hold("no_profile_level", f"concurrency {c} was not profiled (profiled: {have})")
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


def effective_change(ev: Evidence, change: Change | None) -> Change | None:
    """The change with the bench kernel its s(c) comes from: the component's stage kernel
    (STAGE_KERNELS) when the change names none and the bench has that kernel's rows for both
    the baseline and the candidate; otherwise the change as it is (the kernel alone)."""
    if change is None or change.bench_kernel is not None:
        return change
    kernel = STAGE_KERNELS.get(change.component)
    if kernel is None:
        return change
    staged = change.model_copy(update={"bench_kernel": kernel})
    suite, name, base, cand = staged.bench_map()
    impls = {r.impl for _, b in ev.bench for r in b.rows if (r.suite, r.kernel) == (suite, name)}
    return staged if {base, cand} <= impls else change


def decide(ev: Evidence, threshold: float = 0.03, concurrency: int | None = None) -> Decision:
    """GO / NO-GO / HOLD with every reason; pure over the evidence."""
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold!r}")
    t = _Tally()
    change = effective_change(ev, ev.change)
    if change is None:
        t.hold("no_change", "no change named (a rollout's `change` record, or --change)")
    _flights(ev, t)
    _bench(ev, change, t)
    rows = amdahl_rows(ev, change, threshold) if change else []
    if concurrency is None and ev.profile is not None and ev.profile.levels:
        concurrency = max(lv.concurrency for lv in ev.profile.levels)
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
