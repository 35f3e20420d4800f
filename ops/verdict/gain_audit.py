"""Where a measured gain came from: the report's audit of a prediction against the switch.

The rollout's `measure` keeps, per concurrency, the window split into parts that add up to it
(ops.rollout.switch.audit: each decode-step stage, the steps' time outside the stages, prefill's
attention and the rest of prefill, idle time), in milliseconds per output token, before the
switch and after. `audit_rows` sets beside them what the Amdahl row predicted: the window after
= before / (1 + projected gain), the component's own parts after = before / s (its prefill
part at prefill's s where the bench has one). So a miss shows where it is: the component did
not speed up in the service as the bench said (its own row), or the rest of the window moved
(another stage, the scheduler, idle time), which the Amdahl model holds constant.
`audit_lines` says it per concurrency in one sentence: the gain the change's own parts alone
give (the window less their measured saving), beside the projection, and how far the rest of
the window moved against the A/A noise. That is a diagnosis, not the measured gain: the verdict
and the predicted-vs-measured table keep the gain the load measured.
`baseline_lines` sets the projection on the measure's own baseline: the window the measured
gain divides by, with only the change's own parts replaced by the candidate's cost as the
profile saw it (f of the profile's window over its tokens/s, over s). Whatever else moved on the
host between the profile and the measure (the other stages, the baseline component's own cost)
then moves in both numbers alike, so what is left between it and the measured gain is the
candidate's cost and the measure's own spread (docs/performance.md, "Rollouts: predicted
against measured"). Also a diagnosis: the verdict keeps the profile's projection.
`precision_lines` says how precisely the load measured it: the interval's half-width per
concurrency, and about how many runs an arm would bring it to the report's threshold.
"""

from __future__ import annotations

import math

from checks.vocabulary import COMPONENT_STAGE
from ops.verdict.amdahl import GAIN_INTERVAL, AmdahlRow, baseline_runs, pooled_rate
from ops.verdict.decide import Decision
from ops.verdict.evidence import Evidence

LABELS = {
    "draft": "draft",
    "topk": "topk",
    "tree_build": "tree_build",
    "verify": "verify (without its attention)",
    "attention": "attention (decode steps)",
    "accept": "accept",
    "commit": "commit",
    "step_other": "step time outside the stages",
    "prefill_attention": "attention (prefill)",
    "prefill_other": "prefill, the rest",
    "idle": "idle (neither a step nor a prefill)",
    "window": "window (wall time)",
}


def _component_parts(component: str | None) -> dict[str, str]:
    """The audit parts the component's time is in: part -> 'steps' or 'prefill'."""
    if component is None:
        return {}
    stage = COMPONENT_STAGE.get(component)
    if stage == "attention":
        return {"attention": "steps", "prefill_attention": "prefill"}
    return {stage: "steps"} if stage else {}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _signed(x: float) -> str:
    """A difference in ms, signed; one that rounds to zero is +0.0000, not -0.0000."""
    s = f"{x:+.4f}"
    return "+0.0000" if s == "-0.0000" else s


def audit_rows(d: Decision, ev: Evidence) -> list[dict[str, str]]:
    """One row per (concurrency, part) with a measured audit: before, after, the change, and
    the prediction for the window and the component's parts (empty without an audit)."""
    if ev.measure is None:
        return []
    amdahl = {r.concurrency: r for r in d.amdahl}
    comp = _component_parts(d.change.component if d.change else None)
    out = []
    for lv in ev.measure.levels:
        if not lv.audit:
            continue
        row = amdahl.get(lv.concurrency)
        window = lv.audit.get("window")
        if window is not None and not (window.before_ms > 0 and window.after_ms > 0):
            row = None  # a window of no time (a hand-edited record): nothing to predict from
        for part, label in LABELS.items():
            got = lv.audit.get(part)
            if got is None:
                continue
            before, after = got.before_ms, got.after_ms
            if part != "window" and abs(before) < 5e-5 and abs(after) < 5e-5:
                continue  # a stage this service does not run
            predicted = None
            if row is not None and row.gain is not None:
                if part == "window":
                    predicted = before / (1.0 + row.gain)
                elif part in comp and row.speed is not None:
                    s = row.speed.s
                    if comp[part] == "prefill" and row.prefill_speed is not None:
                        s = row.prefill_speed.s
                    predicted = before / s
            out.append(
                {
                    "c": str(lv.concurrency),
                    "part": label + (" [the change]" if part in comp else ""),
                    "before": _ms(before),
                    "after": _ms(after),
                    "change": _signed(after - before),
                    "predicted": _ms(predicted),
                    "miss": "-" if predicted is None else _signed(after - predicted),
                }
            )
    return out


def audit_lines(d: Decision, ev: Evidence) -> list[str]:
    """Per concurrency with an audit and a projection: the change's own parts' saving, the
    gain it alone gives, and the rest of the window's move (see the module's doc)."""
    if ev.measure is None or d.change is None:
        return []
    amdahl = {r.concurrency: r for r in d.amdahl}
    comp = _component_parts(d.change.component)
    out = []
    for lv in ev.measure.levels:
        row = amdahl.get(lv.concurrency)
        if not lv.audit or "window" not in lv.audit or row is None or row.gain is None:
            continue
        w0, w1 = lv.audit["window"].before_ms, lv.audit["window"].after_ms
        own = [lv.audit[p] for p in comp if p in lv.audit]
        if not own or w0 <= 0:
            continue
        saved = sum(p.before_ms - p.after_ms for p in own)
        rest = (w1 - w0) + saved  # how the window's other parts moved, ms per token
        alone = w0 / (w0 - saved) - 1 if saved < w0 else None
        noise = f"{row.aa_noise:.1%}" if row.aa_noise is not None else "not measured"
        out.append(
            f"c={lv.concurrency}: the change's own parts saved {saved:.4f} ms per output token "
            f"of the window's {w0:.4f}; alone that is a gain of "
            + ("n/a" if alone is None else f"{alone:+.2%}")
            + f" (projected {row.gain:+.2%}); the rest of the window moved {rest:+.4f} ms per "
            f"token ({rest / w0:+.2%} of it; A/A noise {noise})"
        )
    return out


def _candidate_ms(row: AmdahlRow, tokens_per_s: float) -> float | None:
    """The candidate's cost in ms per output token as the profile saw it: each part of f (a
    share of the profile window's wall time) over the window's tokens/s, over its s."""
    if row.f is None or row.f_basis != "wall" or row.speed is None or tokens_per_s <= 0:
        return None
    parts = [(row.f, row.speed.s)]
    if row.f_prefill and row.prefill_speed is not None:
        parts = [(row.f - row.f_prefill, row.speed.s), (row.f_prefill, row.prefill_speed.s)]
    if not all(s > 0 for _, s in parts):
        return None
    return 1000 * sum(f / s for f, s in parts) / tokens_per_s


def baseline_lines(d: Decision, ev: Evidence) -> list[str]:
    """Per concurrency with an audit, a wall-share f and a measured gain: the projection on
    the measure's own baseline window (see the module's doc), beside the measured gain and the
    report's projection."""
    if ev.measure is None or d.change is None or ev.profile is None:
        return []
    amdahl = {r.concurrency: r for r in d.amdahl}
    tok_s = {lv.concurrency: lv.tokens_per_s for lv in ev.profile.levels}
    comp = _component_parts(d.change.component)
    out = []
    for lv in ev.measure.levels:
        row, rate = amdahl.get(lv.concurrency), tok_s.get(lv.concurrency)
        if not lv.audit or "window" not in lv.audit or row is None or rate is None:
            continue
        if row.gain is None or row.measured_gain is None:
            continue
        cand = _candidate_ms(row, rate.value)
        own = [lv.audit[p].before_ms for p in comp if p in lv.audit]
        w0 = lv.audit["window"].before_ms
        if cand is None or not own or w0 - sum(own) + cand <= 0:
            continue
        g = w0 / (w0 - sum(own) + cand) - 1
        m = row.measured_gain
        out.append(
            f"c={lv.concurrency}: the baseline's window {w0:.4f} ms per output token, the "
            f"change's parts {sum(own):.4f} of it; with them at the candidate's cost as the "
            f"profile saw it ({cand:.4f}: f over the profile's {rate.value:.1f} tokens/s, over "
            f"s) the projection is {g:+.2%}; the measured gain {m:+.2%} is {points_diff(m - g)} "
            f"off it (off the report's projection, {row.gain:+.2%}: {points_diff(m - row.gain)})"
        )
    return out


def points_diff(x: float) -> str:
    """A gain difference (a fraction) as signed points: "+3.2 pp"."""
    s = f"{100 * x:+.1f}"
    return ("+0.0" if s == "-0.0" else s) + " pp"


def drift_lines(d: Decision, ev: Evidence) -> list[str]:
    """Per concurrency with a recheck (arm A'': the release before the candidate, switched back
    after the measure): how far the unchanged service drifted between the A/A pair and A'', and
    the switch's gain against A and A' alone beside the measured gain (against every baseline
    run, ops.verdict.amdahl.baseline_runs) and the projection. With drift of the size of the gain,
    before / after alone cannot tell the change from time."""
    if ev.measure is None:
        return []
    amdahl = {r.concurrency: r for r in d.amdahl}
    out = []
    for lv in ev.measure.levels:
        if not lv.recheck:
            continue
        b, a, again, every = (
            pooled_rate(x) for x in (lv.before, lv.after, lv.recheck, baseline_runs(lv))
        )
        if b is None or a is None or again is None or every is None:
            continue
        row = amdahl.get(lv.concurrency)
        proj = "" if row is None or row.gain is None else f", projected {row.gain:+.2%}"
        pair = "the A/A pair" if lv.aa else "the runs before the switch"
        odd = (
            ""
            if len(lv.recheck) == len(lv.after)
            else f" (not balanced: {len(lv.recheck)} A'' runs against {len(lv.after)} after)"
        )
        out.append(
            f"c={lv.concurrency}: A'' {again:.1f} tokens/s against {b:.1f} in {pair} "
            f"(drift {again / b - 1:+.2%}); after the switch {a:.1f}: {a / b - 1:+.2%} against "
            f"{pair} alone, {a / every - 1:+.2%} against every baseline run (A, A', A''; "
            f"the measured gain){proj}{odd}"
        )
    return out


def points(x: float) -> str:
    """A half-width (a fraction) as points: "+/-3.0"; one under 0.05 points keeps two
    significant digits ("+/-0.0001"), so a tiny target is not shown as 0."""
    p = x * 100
    return f"+/-{p:.1f}" if p >= 0.05 else f"+/-{p:.2g}"


def cycles_text(n: int) -> str:
    """ "1 cycle", "2 cycles": the measure's alternations of the two releases."""
    return f"{n} cycle{'' if n == 1 else 's'}"


def runs_for(n: int, half: float, target: float) -> int:
    """About how many runs an arm of `n` would take for an interval of half-width `half` to
    narrow to `target`: a bootstrap interval of a mean-like estimate narrows as one over the
    root of the runs, so n * (half / target)^2, rounded up (the ratio capped at 1e6: a tiny
    target would overflow it, and no measure makes n * 1e12 runs anyway)."""
    return max(n, math.ceil(n * min(half / target, 1e6) ** 2))


def precision_lines(d: Decision, ev: Evidence) -> list[str]:
    """Per measured level with an interval: its half-width in points, and where that is wider
    than the report's threshold (and that is above 0), about how many runs an arm (runs_for,
    each arm scaled alike) would make it the threshold's width, so a reader sees whether the
    load could have told a gain of the threshold's size from none, and what a sharper measure
    would cost."""
    amdahl = {r.concurrency: r for r in d.amdahl}
    out: list[str] = []
    asked = ev.measure.precision if ev.measure else None
    if asked is not None:
        want = f"{points(asked.target)} points at every level (the measure's precision)"
        ran = cycles_text(asked.cycles_run) + (
            f" (max_cycles {asked.max_cycles})" if asked.max_cycles else ""
        )
        out.append(
            f"The measure asked for {want} and stopped once it had them: after {ran}"
            if asked.met
            else f"The measure asked for {want} and did not get them in its {ran}"
        )
    for lv in ev.measure.levels if ev.measure else []:
        row = amdahl.get(lv.concurrency)
        if row is None or row.measured_lo is None or row.measured_hi is None:
            continue
        half = (row.measured_hi - row.measured_lo) / 2
        na, nb = len(lv.after), len(baseline_runs(lv))
        line = (
            f"c={lv.concurrency}: the measured gain's {GAIN_INTERVAL:.0%} interval is "
            f"+/-{half * 100:.1f} points ({na} runs after the switch, {nb} of the baseline)"
        )
        if half <= d.threshold:
            line += f", within the threshold's {d.threshold * 100:.1f}"
        elif d.threshold > 0:  # a threshold of 0 has no width to narrow to
            line += (
                f"; +/-{d.threshold * 100:.1f} (the threshold) would take about "
                f"{runs_for(na, half, d.threshold)} runs after and "
                f"{runs_for(nb, half, d.threshold)} of the baseline"
            )
        out.append(line)
    return out


def audit_doc(d: Decision, ev: Evidence) -> dict[str, list]:
    """The audit for report.json and `ops report --json`: the table's rows, the own-parts
    lines, the drift lines and the precision lines, as the md and html show them."""
    return {
        "rows": audit_rows(d, ev),
        "own_parts": audit_lines(d, ev),
        "drift": drift_lines(d, ev),
        "on_baseline": baseline_lines(d, ev),
        "precision": precision_lines(d, ev),
    }
