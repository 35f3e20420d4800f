"""Where a measured gain came from: the report's audit of a prediction against the switch.

The rollout's `measure` keeps, per concurrency, the window split into parts that add up to it
(ops.rollout_switch.audit: each decode-step stage, the steps' time outside the stages, prefill's
attention and the rest of prefill, idle time), in milliseconds per output token, before the
switch and after. `audit_rows` sets beside them what the Amdahl row predicted: the window after
= before / (1 + projected gain), the component's own parts after = before / s (its prefill
part at prefill's s where the bench has one). So a miss shows where it is: the component did
not speed up in the service as the bench said (its own row), or the rest of the window moved
(another stage, the scheduler, idle time), which the Amdahl model holds constant.
"""

from __future__ import annotations

from ops.evidence import COMPONENT_STAGE, Evidence
from ops.report import Decision

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
                    "change": f"{after - before:+.4f}",
                    "predicted": _ms(predicted),
                    "miss": "-" if predicted is None else f"{after - predicted:+.4f}",
                }
            )
    return out
