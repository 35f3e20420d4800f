"""A service's counters over a window: what the engine spent where, from two snapshots.

A snapshot is `checks.probe --counters`'s document (`/get_server_info` and `/metrics`); the
reference engine's `internal_states[0]` carries `step_time_breakdown` (per batch size the steps
and each stage's total seconds) and `prefill_time_breakdown` (every prefill's seconds and the
attention inside them), both cumulative, and `clock_s`. The difference of two snapshots is the
window's own work: `level_steps` per batch size, `wall_shares` each stage's share of the
window's wall time (ops.measure.profile's f), `stage_seconds` one stage's seconds in steps and
prefill
(the rollout's `measure`: the service's own s), `window_stages` every stage's (the measure's
audit of where a gain came from). `snapshot` takes one; `not_answering` says why a snapshot got
no HTTP answer at all (the service is down or hung).

The SGLang import hook's clock (a real SGLang has no stage timings of its own): `hook_snapshot`
reads `checks.hook_counters` on the host, `hook_window` the hook's readings inside a level's
window snapshots, `hook_level` makes the window's per-process calls and seconds into f per
function (`source: hook`, combined over the processes by HOOK_COMBINE).
"""

from __future__ import annotations

from typing import Any, cast

from checks.docs import Counters, CountersDoc, LevelDoc
from checks.vocabulary import STAGES as ALL_STAGES
from ops.hosts.dataplane import run_check
from ops.hosts.remote import Host

BREAKDOWN = "step_time_breakdown"
PREFILL = "prefill_time_breakdown"
STAGES = ALL_STAGES  # as the engine's stage clock counts them (checks.vocabulary)


def snapshot(host: Host) -> CountersDoc:
    """The service's counters now (`checks.probe --counters`, run on the host)."""
    args = ["--url", host.target.service.url, "--counters"]
    return cast(CountersDoc, run_check(host, "checks.probe", args).data)


def not_answering(snap: Counters) -> str | None:
    """Why the service gave no HTTP answer at all (connection refused, a timeout), from a
    counters snapshot: None where either endpoint answered with any status."""
    statuses = [snap.get("server_info_status"), snap.get("metrics_status")]
    if any(isinstance(x, int) for x in statuses) or snap.get("server_info") is not None:
        return None
    why = str(statuses[0] or statuses[1] or "no answer")
    return " ".join(why.split())[:160]  # its own words may hold the service's bytes: one line


def value(v: float, source: str, note: str, **kw: Any) -> dict[str, Any]:
    """An `ops.sections.common.Value`: one number, its spread where known, its provenance."""
    return {"value": v, "source": source, "note": note, **kw}


def _state(snap: Counters, key: str) -> dict[str, Any] | None:
    info = snap.get("server_info") or {}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        b = states[0].get(key)
        return b if isinstance(b, dict) else None
    return None


def breakdown(snap: Counters) -> dict[str, Any] | None:
    return _state(snap, BREAKDOWN)


def metric(snap: Counters, prefix: str) -> float | None:
    """The sum of the /metrics samples named `prefix` (any labels)."""
    samples = snap.get("metrics") or {}
    found = [v for k, v in samples.items() if k == prefix or k.startswith(prefix + "{")]
    return sum(found) if found else None


def level_steps(before: dict[str, Any], after: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per batch size: the level's own steps and each stage's total seconds (after - before),
    and the Σ of its steps' length spreads where the engine reports it (`spread_sum`)."""
    out = {}
    for b, row in after.items():
        prev = before.get(b, {"steps": 0, "total_s": {}})
        steps = row["steps"] - prev["steps"]
        if steps > 0:
            totals = {s: t - prev["total_s"].get(s, 0.0) for s, t in row["total_s"].items()}
            out[int(b)] = {"steps": steps, "total_s": totals}
            if "spread_sum" in row:
                out[int(b)]["spread_sum"] = row["spread_sum"] - prev.get("spread_sum", 0)
    return out


def window_counters(lt: LevelDoc) -> tuple[Counters, Counters] | None:
    """The snapshots bracketing the level's measured window, where both hold stage timings."""
    w = lt.get("counters")
    if not w or breakdown(w["start"]) is None or breakdown(w["end"]) is None:
        return None
    return w["start"], w["end"]


def wall_shares(
    steps: dict[int, dict[str, Any]], start: Counters, end: Counters, lt: LevelDoc
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each stage's share of the measured window's wall time, and how that wall time splits."""
    duration = lt["duration_s"]
    prefill = prefill_delta(start, end)
    n = sum(r["steps"] for r in steps.values())
    t0, t1 = _clock(start), _clock(end)
    step_s = sum(r["total_s"].get("step", 0.0) for r in steps.values())
    prefill_s = prefill["total_s"].get("prefill", 0.0) if prefill else None
    window: dict[str, Any] = {
        "duration_s": duration,
        "steps": n,
        "steps_s": step_s,
        "prefills": prefill["prefills"] if prefill else None,
        "prefill_s": prefill_s,
        "idle_s": duration - step_s - (prefill_s or 0.0),
        "server_clock_s": None if t0 is None or t1 is None else t1 - t0,
        "start_lead_s": lt["counters"]["start_lead_s"],  # type: ignore[typeddict-item]
        "end_lag_s": lt["counters"]["end_lag_s"],  # type: ignore[typeddict-item]
    }
    shares: dict[str, dict[str, Any]] = {}
    if duration <= 0:
        return shares, window
    batches = ", ".join(str(b) for b in sorted(steps))
    for s in STAGES:
        in_steps = sum(r["total_s"].get(s, 0.0) for r in steps.values())
        in_prefill = prefill["total_s"].get(s, 0.0) if prefill else 0.0
        if in_steps + in_prefill <= 0:
            continue
        if prefill is None:
            pre = "; the service reports no prefill timings, so prefill's part is not in it"
        elif s in prefill["total_s"]:
            pre = (
                f" + {in_prefill:.4f} s in the window's {prefill['prefills']} prefills "
                f"(Δ {PREFILL}.total_s.{s})"
            )
        else:
            pre = "; it does not run in prefill"
        note = (
            f"share of the measured window's wall time: seconds the engine spent in {s} during "
            f"the window, {in_steps:.4f} s over all its {n} steps at batch sizes {batches} "
            f"(Δ {BREAKDOWN}.total_s.{s}){pre}, / the window's wall time duration_s = "
            f"{duration:.4f} s (first measured request sent to last one completed, client side)"
        )
        share = min((in_steps + in_prefill) / duration, 1.0)
        shares[s] = value(
            share,
            "measured",
            note,
            n=n,
            # the part in prefill (ops.verdict.decide: its own s), never more than the share it is
            # part of (the share is capped at 1; ops.verdict.evidence refuses a larger part)
            prefill=min(max(in_prefill, 0.0) / duration, share),
        )
    return shares, window


def stage_seconds(start: Counters, end: Counters, stage: str) -> dict[str, float] | None:
    """Seconds the service spent in `stage` between two counter snapshots: over every decode
    step (any batch size) and inside prefills; None for a service without stage timings."""
    b0, b1 = breakdown(start), breakdown(end)
    if b0 is None or b1 is None:
        return None
    steps = level_steps(b0, b1)
    prefill = prefill_delta(start, end)
    return {
        "steps_s": sum(r["total_s"].get(stage, 0.0) for r in steps.values()),
        "prefill_s": prefill["total_s"].get(stage, 0.0) if prefill else 0.0,
    }


def window_stages(start: Counters, end: Counters) -> dict[str, float] | None:
    """Seconds the service spent where, between two snapshots: each stage's total over the
    decode steps (`verify` includes `attention`), `steps` the steps' own total, `prefill` the
    prefills' and `prefill_attention` the attention inside them; None for a service without
    stage timings. The rollout's `measure` keeps it per run, so a report can say where a
    measured gain came from (ops.rollout.switch.audit)."""
    b0, b1 = breakdown(start), breakdown(end)
    if b0 is None or b1 is None:
        return None
    steps = level_steps(b0, b1)
    out = {s: sum(r["total_s"].get(s, 0.0) for r in steps.values()) for s in STAGES}
    out["steps"] = sum(r["total_s"].get("step", 0.0) for r in steps.values())
    prefill = prefill_delta(start, end) or {"total_s": {}}
    out["prefill"] = prefill["total_s"].get("prefill", 0.0)
    out["prefill_attention"] = prefill["total_s"].get("attention", 0.0)
    return out


def prefill_delta(start: Counters, end: Counters) -> dict[str, Any] | None:
    """The prefills between two snapshots: {"prefills", "total_s": {stage: seconds}}; None
    for a service that reports no prefill timings."""
    p0, p1 = _state(start, PREFILL), _state(end, PREFILL)
    if p0 is None or p1 is None:
        return None
    return {
        "prefills": p1["prefills"] - p0["prefills"],
        "total_s": {k: v - p0["total_s"].get(k, 0.0) for k, v in p1["total_s"].items()},
    }


def _clock(snap: Counters) -> float | None:
    info = snap.get("server_info") or {}
    clock = info["internal_states"][0].get("clock_s")
    return float(clock) if isinstance(clock, int | float) else None


def _delta(before: Counters, after: Counters, name: str) -> float | None:
    b, a = metric(before, name), metric(after, name)
    return None if a is None or b is None else a - b


# ----------------------------------------------------------------------------- the hook's clock
# A service started with the release's SGLang import hook (integration.hook) keeps, per process,
# each call count and the seconds spent in the fork's tree builder and accept walk
# (`checks.hook_counters`: its document, and with `--loadtest` the same reading inside each of
# checks.loadtest's window snapshots, key "hook").
HOOK_COMPONENTS = ("tree_build", "accept")
HOOK_FUNCTIONS = {"tree_build": "build_ddtree_tree_from_topk", "accept": "follow_verified_tree"}
HOOK_COMBINE = (
    "the largest share over the service's processes: every tensor-parallel rank runs the "
    "builder and the walk on the same steps in lockstep, so the step waits for the slowest, and "
    "a process that never calls them (the HTTP server) has a share of 0"
)


def hook_run_dir(host: Host) -> str:
    """The running release's run/ on the host (its counters, status and saved cases)."""
    return f"{host.target.remote_root}/current/run"


def hook_snapshot(host: Host) -> dict[str, Any]:
    """`checks.hook_counters` on the host now (the hook's reading of every live process)."""
    return dict(run_check(host, "checks.hook_counters", ["--run", hook_run_dir(host)]).data)


def hook_window(lt: LevelDoc) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The hook's readings bracketing the level's measured window, where it has them."""
    w = lt.get("counters")
    if not w:
        return None
    a, b = w["start"].get("hook"), w["end"].get("hook")  # type: ignore[typeddict-item]
    if not isinstance(a, dict) or not isinstance(b, dict) or not b.get("processes"):
        return None
    return a, b


def _zero_function() -> dict[str, Any]:
    return {"calls": 0, "seconds": 0.0, "errors": 0, "shadow": None}


def hook_deltas(start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
    """Per process alive at the end: its calls, seconds and shadow numbers in the window (a
    process started inside the window counts from zero; one gone before its end is not there:
    `hook_level` says how many)."""
    before = {(p["pid"], p["start_ticks"]): p for p in start.get("processes") or []}
    out = []
    for p in end["processes"]:
        q = before.get((p["pid"], p["start_ticks"]))
        row: dict[str, Any] = {"pid": p["pid"], "new_in_window": q is None, "components": {}}
        for comp in HOOK_COMPONENTS:
            b = (q or {}).get("components", {}).get(comp) or _zero_function()
            a = p["components"].get(comp) or _zero_function()
            d = {
                "calls": a["calls"] - b["calls"],
                "seconds": max(a["seconds"] - b["seconds"], 0.0),
                "errors": a["errors"] - b["errors"],
                "shadow": None,
            }
            sa, sb = a.get("shadow"), b.get("shadow") or {}
            if sa:
                d["shadow"] = {
                    k: sa[k] - sb.get(k, 0)
                    for k in (
                        "compared",
                        "mismatched",
                        "stock_s",
                        "cand_s",
                        "cand_errors",
                        "overhead_s",
                        "saved",
                        "pairs",
                    )
                }
                d["shadow"]["every"] = sa["every"]
                first = sb.get("pairs", 0)
                d["shadow"]["ring"] = [r for r in sa.get("ring") or [] if r[0] >= first]
            row["components"][comp] = d
        out.append(row)
    return out


def hook_level(start: dict[str, Any], end: dict[str, Any], duration: float) -> dict[str, Any]:
    """The hook's numbers of a level: per process, each function's calls, seconds, mean per
    call and share of the window's wall time; `wall_share` per function (f, `source: hook`),
    combined over the processes by HOOK_COMBINE. A process's share is over the window's wall
    time less the time its shadow spent (the candidate, its copies, the comparison: work the
    service does only because the shadow is armed, on the same thread, before the step goes
    on), so f is the function's share in the service as it runs without the shadow."""
    rows = hook_deltas(start, end)
    gone = len(
        {(p["pid"], p["start_ticks"]) for p in start.get("processes") or []}
        - {(p["pid"], p["start_ticks"]) for p in end["processes"]}
    )
    for row in rows:
        shadow_s = sum(
            (c["shadow"] or {}).get("overhead_s", 0.0) for c in row["components"].values()
        )
        row["shadow_overhead_s"] = shadow_s
        wall = max(duration - shadow_s, 1e-9)
        for c in row["components"].values():
            c["share"] = min(c["seconds"] / wall, 1.0) if duration > 0 else None
            c["per_call_us"] = 1e6 * c["seconds"] / c["calls"] if c["calls"] > 0 else None
    shares: dict[str, dict[str, Any]] = {}
    for comp in HOOK_COMPONENTS:
        calling = [r for r in rows if r["components"][comp]["calls"] > 0]
        if not calling or duration <= 0:
            continue
        top = max(calling, key=lambda r: r["components"][comp]["share"])
        c = top["components"][comp]
        each = ", ".join(f"pid {r['pid']} {r['components'][comp]['share']:.2%}" for r in calling)
        less = (
            f" less its shadow's {top['shadow_overhead_s']:.4f} s"
            if top["shadow_overhead_s"] > 0
            else ""
        )
        note = (
            f"measured by the service's import hook: seconds in {HOOK_FUNCTIONS[comp]} over the "
            f"window's wall time, per process (Δ of run/hook-counters/<pid>.bin around the "
            f"window); pid {top['pid']}: {c['seconds']:.4f} s in {c['calls']} calls / the "
            f"window's wall time duration_s = {duration:.4f} s{less}; combined: {HOOK_COMBINE}; "
            f"{len(calling)} of {len(rows)} live processes call it ({each})"
        )
        shares[comp] = value(c["share"], "hook", note, n=c["calls"], processes=len(calling))
    return {
        "processes": rows,
        "live": len(rows),
        "gone_in_window": gone,
        "dead_skipped": end.get("dead", 0),
        "combine": HOOK_COMBINE,
        "wall_share": shares,
        "status": {
            k: (end.get("status") or {}).get(k)
            for k in ("spec", "active", "asked", "replaced", "shadowed", "summary")
        },
    }
