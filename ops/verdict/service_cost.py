"""What a bench cost the service while it ran: the probe request's latency during the bench
against before it, at p50 and p99, each change with a bootstrap interval.

The probe (`checks.probe`) times a short greedy request to the service before, during and
after the bench; its samples are in every bench record. From them alone (so a record of any age
gives the same answer): the change of each percentile from before to during, in percent, and a
90% interval from resampling both windows (a fixed seed: the same record, the same interval).
A p99 from fewer than 100 samples is close to the window's maximum, which is said (`p99_note`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

RESAMPLES = 1000
LEVEL = 0.90
SEED = 20261205


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the sorted samples."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    at = (len(s) - 1) * q / 100
    lo = int(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


def _change(before: Sequence[float], during: Sequence[float], q: float) -> dict[str, float]:
    b, d = percentile(before, q), percentile(during, q)
    rng = random.Random(SEED + int(q))
    changes = []
    for _ in range(RESAMPLES):
        rb = percentile(rng.choices(before, k=len(before)), q)
        rd = percentile(rng.choices(during, k=len(during)), q)
        changes.append(rd / rb - 1 if rb > 0 else 0.0)
    tail = (1 - LEVEL) / 2 * 100
    return {
        "before_ms": round(b, 3),
        "during_ms": round(d, 3),
        "change": round(d / b - 1, 4) if b > 0 else 0.0,
        "lo": round(percentile(changes, tail), 4),
        "hi": round(percentile(changes, 100 - tail), 4),
    }


def service_cost(before: Sequence[float], during: Sequence[float]) -> dict[str, Any] | None:
    """The probe's p50 and p99 change while the bench ran (None without samples in both)."""
    before = [float(x) for x in before]
    during = [float(x) for x in during]
    if not before or not during:
        return None
    out: dict[str, Any] = {
        "n_before": len(before),
        "n_during": len(during),
        "level": LEVEL,
        "p50": _change(before, during, 50),
        "p99": _change(before, during, 99),
    }
    if min(len(before), len(during)) < 100:
        out["p99_note"] = (
            f"p99 of {min(len(before), len(during))} samples is near the window's maximum"
        )
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def cost_parts(cost: dict[str, Any] | None) -> list[str]:
    """'p50 20.10 -> 26.40 ms +31.3% (90% +28.7%..+36.1%)', the same for p99, the samples."""
    if not cost:
        return ["not measured (the probe has no sample before or during the bench)"]
    parts = []
    for q in ("p50", "p99"):
        c = cost[q]
        parts.append(
            f"{q} {c['before_ms']:.2f} -> {c['during_ms']:.2f} ms {_pct(c['change'])} "
            f"({cost['level']:.0%} {_pct(c['lo'])}..{_pct(c['hi'])})"
        )
    return [*parts, f"samples {cost['n_before']} before, {cost['n_during']} during"]


def cost_line(cost: dict[str, Any] | None) -> str:
    """The parts in one line, for the report."""
    return "; ".join(cost_parts(cost))
