"""The Amdahl model of a change: f(c) and s(c) per concurrency, the projected gain and its spread.

`projected_gain(f, s)` is the end-to-end throughput gain when a fraction `f` of the time gets
`s` times faster (`projected_gain_parts` when parts of it run at different speeds: attention in
the decode steps and in prefill); `ceiling(f)` is the gain if it took no time at all.
`amdahl_rows` reads f(c) from the profile (the component's share of the measured window's wall
time, or for an older record the share of the step at batch c) and s(c) from the bench rows of
the change (`effective_change`: the engine's stage rows where the bench has them; on a
service whose accept runs on CUDA, the host builder's stage with its trees' upload), sets the
measured gain and the service's own s beside them (the `measure` step), and notes where the
service saw another s than the bench. The decision over these rows is ops.verdict.decide.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from checks.vocabulary import COMPONENT_STAGE
from ops.sections.bench import KernelRow
from ops.sections.change import CUDA_ACCEPT_IMPLS, PREFILL_KERNELS, STAGE_KERNELS, Change
from ops.sections.measure import MeasureLevel
from ops.sections.profile import ProfileLevel
from ops.verdict.evidence import Evidence

F_BASIS = {
    "wall": "share of the measured window's wall time",
    "step": "share of the step at batch c",
}


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


class SpeedRow(BaseModel):
    """s(c): the candidate's speedup over the baseline at batch c, with its IQR-end spread."""

    batch: int
    s: float
    lo: float
    hi: float
    baseline_us: float
    candidate_us: float
    # the two stage rows' host parts (their plans) and GPU parts, where the bench split them
    baseline_host_us: float | None = None
    candidate_host_us: float | None = None
    baseline_gpu_us: float | None = None
    candidate_gpu_us: float | None = None
    # bench: the kernel bench's rows; shadow: the service's own forwards (engine.shadow)
    source: Literal["bench", "shadow"] = "bench"
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
    # where s came from the shadow, the bench's s beside it (what the projection would be on)
    bench_speed: SpeedRow | None = None
    bench_prefill_speed: SpeedRow | None = None
    gain: float | None = None
    gain_lo: float | None = None
    gain_hi: float | None = None
    step_shorter: float | None = None
    ceiling: float | None = None
    measured_gain: float | None = None  # rate_gain: the arms' pooled rates
    measured_median: float | None = None  # median after / median baseline - 1, beside it
    measured_lo: float | None = None  # its bootstrap interval (gain_interval)
    measured_hi: float | None = None
    # with a recheck, measured_gain is against every baseline run (baseline_runs: A, A' and
    # A''); this is after against A and A' alone, the plain before / after
    measured_plain: float | None = None
    service_speedup: dict[str, float] | None = None  # the stage's s as the service saw it
    aa_noise: float | None = None
    clears: bool | None = None
    note: str = ""


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


def shadow_speed(lv: ProfileLevel, change: Change, kind: str) -> SpeedRow | None:
    """s of the change in the service's own forwards of `kind` ("step" | "prefill") at this
    level, where the profile ran the shadow for exactly this change (ops.measure.shadow), else
    None."""
    sh = lv.shadow
    if (
        sh is None
        or sh.error
        or sh.component != change.component
        or (sh.baseline, sh.candidate) != (change.baseline, change.candidate)
    ):
        return None
    k = sh.step if kind == "step" else sh.prefill
    if k is None:
        return None
    what = "decode steps" if kind == "step" else "prefill blocks"
    if change.component == "tree_build":
        what = "decode steps' tree builds"
    return SpeedRow(
        batch=lv.batch,
        s=k.s,
        lo=min(k.lo, k.s),
        hi=max(k.hi, k.s),
        baseline_us=k.base_us,
        candidate_us=k.cand_us,
        baseline_host_us=k.base_host_us,
        candidate_host_us=k.cand_host_us,
        source="shadow",
        note=f"the service's own {k.forwards} {what} in the load at c={lv.concurrency} (shadow)",
    )


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
        for base in (
            r
            for r in rows
            if r.batch == b and r.impl == base_impl and r.shape == key and r.median_us > 0
        ):
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
                    baseline_host_us=base.host_us,
                    candidate_host_us=cand.host_us,
                    baseline_gpu_us=base.gpu_us,
                    candidate_gpu_us=cand.gpu_us,
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


GAIN_INTERVAL = 0.90  # the measured gain's bootstrap interval (two-sided)
_RESAMPLES = 2000


def pooled_rate(runs: list[float]) -> float | None:
    """The rate of runs pooled: their tokens over their time. The runs of a measured level
    carry the same tokens (the same requests at the same output length), so that is the
    harmonic mean of their tokens/s; None when empty or a run has no positive rate."""
    if not runs or min(runs) <= 0:
        return None
    return len(runs) / sum(1.0 / x for x in runs)


def rate_gain(before: list[float], after: list[float]) -> float | None:
    """The measured gain: pooled_rate(after) / pooled_rate(before) - 1, the ratio of the two
    arms' time per token over all their runs; None when either side has no positive run.

    Why pooled and not the median of the runs: the host's speed comes in spells (a 6-s run's
    tokens/s spread 4-30% on the H200 leases), so with 6-8 runs an arm's median jumps between
    a fast and a slow run, where the pooled rate weighs every run's time. Over the 60 measured
    levels committed under benchmarks/results before the switch, with the same bootstrap draws,
    its interval was narrower at 54 and as wide at 6 (two runs a side; mean width 13.7 against
    17.9 pp: docs/performance.md, "Measurement noise"). It is also what the projection predicts:
    Amdahl's model is one of time, and the pooled rate is the arms' total time per token."""
    b, a = pooled_rate(before), pooled_rate(after)
    return None if b is None or a is None else a / b - 1


def median_gain(before: list[float], after: list[float]) -> float | None:
    """median(after) / median(before) - 1 (shown beside the measured gain, rate_gain); None
    when either is empty or before's median is not > 0."""
    if not before or not after:
        return None
    b = statistics.median(before)
    return statistics.median(after) / b - 1 if b > 0 else None


def gain_interval(
    before: list[float],
    after: list[float],
    c: int,
    gain: Callable[[list[float], list[float]], float | None] = rate_gain,
) -> tuple[float, float] | None:
    """The measured gain's GAIN_INTERVAL bootstrap interval: the runs before and after
    resampled with replacement (seeded by c, so a report rebuilt from the same records gives
    the same interval), `gain` each time (rate_gain; the comparison in docs/performance.md,
    "Measurement noise", passed median_gain over the same draws), the interval's ends. None with
    fewer than two runs on either side (nothing to resample) or a run without a positive rate."""
    if len(before) < 2 or len(after) < 2 or min(before) <= 0 or min(after) <= 0:
        return None
    rng = random.Random(c)
    gains = sorted(
        gain(rng.choices(before, k=len(before)), rng.choices(after, k=len(after))) or 0.0
        for _ in range(_RESAMPLES)
    )
    tail = (1 - GAIN_INTERVAL) / 2
    return gains[int(tail * _RESAMPLES)], gains[int((1 - tail) * _RESAMPLES) - 1]


def baseline_runs(lv: MeasureLevel) -> list[float]:
    """The tokens/s runs the measured gain sets `after` against: the A/A pair before the
    switch, and with a recheck also A'' (the baseline's release switched back in after the
    `after` runs, as many runs as they). In time order A A' | after | A'' is balanced: the
    baseline's runs sit as much before the after runs as behind them, so a host whose speed
    drifts steadily through the measure moves both arms alike and the gain is free of it;
    before / after alone counts that drift as the change's (on the H200 leases a c=1 run's
    tokens/s varied by 10-30% within minutes, every stage alike)."""
    return lv.before + lv.recheck


def _measured(row: AmdahlRow, lv: MeasureLevel) -> None:
    """Fill row's A/A noise, measured gain (rate_gain of after over baseline_runs), its
    bootstrap interval, the median of the runs' gain beside it, the plain after / (A, A') gain
    where a recheck made them differ, and the service's own s, from the measure's level at
    row's concurrency."""
    if len(lv.aa) >= 2 and lv.aa[0] and lv.aa[1]:
        aa = rate_gain(lv.aa[0], lv.aa[1])
        row.aa_noise = abs(aa) if aa is not None else None
    row.measured_gain = rate_gain(baseline_runs(lv), lv.after)
    row.measured_median = median_gain(baseline_runs(lv), lv.after)
    row.measured_plain = rate_gain(lv.before, lv.after) if lv.recheck else None
    ci = gain_interval(baseline_runs(lv), lv.after, row.concurrency)
    if ci is not None:
        row.measured_lo, row.measured_hi = ci
    row.service_speedup = lv.service_speedup


def amdahl_rows(ev: Evidence, change: Change, threshold: float) -> list[AmdahlRow]:
    """One row per profiled concurrency: f(c), s(c), projected gain with its spread, ceiling."""
    if ev.profile is None:
        return []
    stage = COMPONENT_STAGE[change.component]
    measured = ev.measure.levels if ev.measure is not None else []
    out = []
    for lv in ev.profile.levels:
        row = AmdahlRow(concurrency=lv.concurrency)
        mlv = next((x for x in measured if x.concurrency == lv.concurrency), None)
        if mlv is not None:
            _measured(row, mlv)
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
        shadow = shadow_speed(lv, change, "step")
        if row.speed is None and shadow is not None and change.runs_on_cpu:
            # a host candidate has no GPU bench: the shadow on the service's own traffic is its s
            row.speed = shadow
            notes.insert(0, "no bench rows: the candidate runs on the CPU, s is the shadow's")
        elif row.speed is None:
            notes.insert(0, "no bench rows for this change")
        row.note = "; ".join(notes)
        if row.speed is None:
            out.append(row)
            continue
        if shadow is not None and row.speed is not shadow:  # the bench's s stays beside it
            row.bench_speed, row.speed = row.speed, shadow
        sp = row.speed
        pre = float((fv.model_extra or {}).get("prefill") or 0.0) if row.f_basis == "wall" else 0
        pre = min(pre, row.f)
        pre_sp = prefill_speedup(ev, change) if pre > 0 else None
        shadow_pre = shadow_speed(lv, change, "prefill") if pre > 0 else None
        if shadow_pre is not None:
            row.bench_prefill_speed, pre_sp = pre_sp, shadow_pre
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
            where = (
                "the service's own prefill blocks, shadow"
                if pre_sp.source == "shadow"
                else "bench rows of the prefill at this prompt length"
            )
            row.note = "; ".join(
                x
                for x in (
                    row.note,
                    f"of f, {pre:.3%} is in prefill, projected at its own "
                    f"s = {pre_sp.s:.3g}x ({where})",
                )
                if x
            )
        else:
            if pre > 0:
                row.note = "; ".join(
                    x
                    for x in (
                        row.note,
                        f"of f, {pre:.3%} is in prefill, projected at the "
                        "decode step's s (the bench has no prefill rows for it)",
                    )
                    if x
                )
            corners = [projected_gain(f, s) for f in (row.f_lo, row.f_hi) for s in (sp.lo, sp.hi)]
            row.gain = projected_gain(row.f, sp.s)
        row.gain_lo, row.gain_hi = _spread(corners + [row.gain])
        if shadow is not None or shadow_pre is not None:
            row.note = "; ".join(x for x in (_shadow_note(row), row.note) if x)
        row.step_shorter = 1.0 - 1.0 / (1.0 + row.gain)
        row.clears = row.gain_lo - (row.aa_noise or 0.0) > threshold
        for extra in (_bench_vs_service(row), _host_bound(row)):
            if extra:
                row.note = "; ".join(x for x in (row.note, extra) if x)
        out.append(row)
    return out


def _shadow_note(row: AmdahlRow) -> str:
    """Where s came from the shadow: that, and the bench's s it stands in for."""
    used, bench = [], []
    for name, sp, b in (
        ("decode steps", row.speed, row.bench_speed),
        ("prefill", row.prefill_speed, row.bench_prefill_speed),
    ):
        if sp is not None and sp.source == "shadow":
            used.append(f"{name} {times(sp.s)}")
            bench.append(f"{name} {times(b.s)}" if b is not None else f"{name}: no bench row")
    return (
        f"s from the service's own forwards (the shadow: the candidate timed beside the serving "
        f"backend on the same forwards, engine.shadow): {', '.join(used)}; the bench read "
        f"{', '.join(bench)}"
    )


HOST_SHARE = 0.3  # a stage row whose host part is this much of it is named host-bound


def _host_bound(row: AmdahlRow) -> str:
    """A note where the bench stage that s(c) rests on is mostly its plan's host time: that
    part varies with the process and the host's load (on the H200 leases one prefill plan took
    1.5 ms in one process and 10 ms in another, where the GPU parts held within 1.2%:
    benchmarks/NOTES-attention.md at abb2881), so the note gives the s of the calls alone beside
    it (their CUDA events: the GPU's work and any launch gaps inside the calls, which the kernel
    timeline showed are host time too: docs/performance.md, "Why s is timed inside the
    service")."""
    out = []
    for name, sp in (("decode steps", row.speed), ("prefill", row.prefill_speed)):
        if (
            sp is None
            or sp.source == "shadow"
            or None in (sp.baseline_host_us, sp.candidate_host_us)
        ):
            continue
        shares = (
            sp.baseline_host_us / sp.baseline_us if sp.baseline_us else 0.0,
            sp.candidate_host_us / sp.candidate_us if sp.candidate_us else 0.0,
        )
        if max(shares) < HOST_SHARE:
            continue
        gpu = ""
        if sp.baseline_gpu_us and sp.candidate_gpu_us:
            ratio = times(sp.baseline_gpu_us / sp.candidate_gpu_us)
            gpu = f"; the calls alone (their CUDA events, launch gaps included) give {ratio}"
        out.append(
            f"{name}: {times(sp.s)} rests on host time (the plans: {shares[0]:.0%} of the "
            f"baseline's stage, {shares[1]:.0%} of the candidate's), which varies with the "
            f"process and the host's load{gpu}"
        )
    return "; ".join(out)


SERVICE_S_TOLERANCE = 0.2  # the service's s this far (relative) from the bench's is named


def _bench_vs_service(row: AmdahlRow) -> str:
    """A note when the stage's speedup the service saw after the switch is not the one the
    bench measured: the projection then rests on a bench that did not time what the service
    pays (other shapes, a GPU shared with the service, a busier host)."""
    sp, svc = row.speed, row.service_speedup or {}
    parts = [("decode steps", svc.get("steps"), sp.s if sp else None)]
    if row.prefill_speed is not None:
        parts.append(("prefill", svc.get("prefill"), row.prefill_speed.s))
    src = "the shadow" if sp is not None and sp.source == "shadow" else "the bench"
    off = [
        f"{name}: the service saw {got:.3g}x where {src} measured {want:.3g}x"
        for name, got, want in parts
        if got and want and abs(got / want - 1) > SERVICE_S_TOLERANCE
    ]
    if not off:
        return ""
    if src == "the shadow":
        return (
            "s in the service after the switch differs from the shadow's by more than "
            f"{SERVICE_S_TOLERANCE:.0%} ({'; '.join(off)}): the service process after the "
            "switch did not pay what the profiled one did"
        )
    return (
        "s in the service differs from the bench's by more than "
        f"{SERVICE_S_TOLERANCE:.0%} ({'; '.join(off)}): the projection rests on a bench that "
        "did not time what the service pays"
    )


def _pct(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"


def times(s: float | None) -> str:
    """A speedup as people write it: 3.2x, 474x, 2,107x."""
    return "n/a" if s is None else f"{s:,.0f}x" if s >= 100 else f"{s:.3g}x"


def effective_change(ev: Evidence, change: Change | None) -> Change | None:
    """The change with the bench kernel its s(c) comes from: the component's stage kernel
    (STAGE_KERNELS) when the change names none and the bench has that kernel's rows for both
    the baseline and the candidate; otherwise the change as it is (the kernel alone).

    On a service whose accept runs on CUDA (the profile's `service.backends.accept`), a host
    builder's stage ends by uploading its trees for that accept: an end of the change that is
    one takes that stage's impl (CUDA_ACCEPT_IMPLS: `reference_stage_to_device`) where the
    bench has its rows and the change pins no impl of its own."""
    if change is None or change.bench_kernel is not None:
        return change
    kernel = STAGE_KERNELS.get(change.component)
    if kernel is None:
        return change
    staged = change.model_copy(update={"bench_kernel": kernel})
    suite, name, base, cand = staged.bench_map()
    have = bench_impls(ev, suite, name)
    if not {base, cand} <= have:
        return change
    handoff = CUDA_ACCEPT_IMPLS.get(kernel, {}) if service_backend(ev, "accept") == "cuda" else {}
    pins = {}
    for end, impl_key in (("baseline", "baseline_impl"), ("candidate", "candidate_impl")):
        impl = handoff.get(getattr(change, end))
        if impl in have and getattr(change, impl_key) is None:
            pins[impl_key] = impl
    return staged.model_copy(update=pins) if pins else staged


def service_backend(ev: Evidence, component: str) -> str | None:
    """The backend the profiled service says it runs for `component` (its
    /get_server_info `backends`, kept in the profile's `service`), or None."""
    backends = ev.profile.service.get("backends") if ev.profile is not None else None
    kind = backends.get(component) if isinstance(backends, dict) else None
    return kind if isinstance(kind, str) else None


def bench_impls(ev: Evidence, suite: str, kernel: str) -> set[str]:
    """The impls the evidence's bench rows have for one kernel of one suite."""
    return {r.impl for _, b in ev.bench for r in b.rows if (r.suite, r.kernel) == (suite, kernel)}
