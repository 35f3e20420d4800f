"""`ops profile`: where the service's time goes, at each concurrency it is driven at.

Per level c: one closed-loop load level (`ops.measure.loadtest`, the `checks.loadtest` generator
with
`--counters`), which snapshots the service's counters (`/get_server_info` and `/metrics`, as
`checks.probe --counters` takes them) right before its first measured request goes out and
right after its last one completed. The level's numbers are the DIFFERENCE of those two
snapshots: the engine's work in exactly the measured window (`duration_s`), without the
warm-up, the levels before, or the process start.

Measured (a service with per-stage timings, like the reference engine: `internal_states[0]
.step_time_breakdown`, per batch size the steps and each stage's total seconds, and
`prefill_time_breakdown`, every prefill's seconds and the attention inside them):

- `wall_share[stage]`: f for a closed-loop throughput gain, the stage's share of the measured
  window's wall time = (Δ Σ over every batch size of total_s[stage], plus Δ prefill total_s
  [stage] where the stage also runs in prefill, i.e. attention) / duration_s. The window also
  holds prefill, steps at other batch sizes (ramp up and down) and idle gaps, and the client's
  tokens/s counts all of them; `window` says how the wall time splits (steps, prefill, idle).
- per step, for the step-time chart: step time and each stage's time are the mean over the
  window's steps at batch c (or, when the service never ran batch c, at the batch size it ran
  most), `share` = stage / step (what f was before `wall_share`: it overstates the component's
  part of what the client sees).
- accept length is Δ`ddtree:accept_length_sum` / Δ`_count` from `/metrics`; tokens/s is the
  load generator's.

Sized windows (`--run-seconds S`, the rollout's `load.run_seconds`): each level first runs an
uncounted pilot of `requests` (the default 4 x c), and its measured window (and its shadow
window) is then sized to last about S seconds at the pilot's output tokens/s, as `measure`
sizes its runs. f is then taken over the same kind of window as the gain the rollout measures
(a window of 4 x c requests is mostly ramp: on the H200 at c=32 it was 5-10% idle where 6-s
windows and measure's runs were 12-16%, and it read the tree build's f 1.2 points higher on the
mean; benchmarks/NOTES-attention.md), and the shadow gets ten times the forwards. A pilot whose
requests failed sizes nothing: the level is `incomplete`, with the pilot in the entry.

Shadow (`--shadow COMPONENT=KIND`, the rollout's profile step for an attention or tree-build
change): after a measured level, a load window of its own at the same c with the service's
shadow armed (engine.shadow: the candidate timed beside the serving backend on the service's
own forwards or steps, its output discarded), summarised by ops.measure.shadow into s per kind
(decode
steps, prefill blocks). f comes from the level's own window, before the shadow runs, so the
shadow's extra work is in no f; a shadow found still armed when the profile starts (an earlier
ops killed inside its window) is disarmed first and recorded (`shadow_found_armed`). `ops
report` projects with this s where it is for exactly the change, the bench's beside it. A
service without /shadow (SGLang, a 404) is recorded as not offering it and not asked again.

Hook (a service started with the release's SGLang import hook, any `DDTREE_OPS_SGLANG` but
`off`: `checks.hook_counters` finds live processes with counters before the first level): each
level's window is run through `checks.hook_counters --loadtest`, so the same two snapshots
also hold the hook's reading of every process (calls and seconds in the fork's tree builder
and accept walk). f of `tree_build` and `accept` is then measured, `source: hook`: per
process, the seconds in the function during the window over the window's wall seconds (less
the time the process's shadow spent, when one is armed), combined as the largest share over
the processes (ops.measure.counters.HOOK_COMBINE: tensor-parallel ranks each run the builder
in lockstep, the step waits for the slowest). The step is derived as below (the service's
accept length and tokens/s); the component's CPU baseline is not run where the hook measured
it. A hook setting with `shadow:COMPONENT=KIND[/N]` gives the level's shadow from the same
window (ops.measure.shadow.hook_shadow: s from the service's own calls, the calls compared and
mismatched), with nothing armed or disarmed by the profile.

Derived (a service without them, like SGLang without the hook): f stays step-based. In steady
state a step advances each of the c requests by the accept length a (accepted drafts + bonus),
so the service emits c * a tokens per step and

    step_ms = 1000 * c * a / tok_s          (tok_s: output tokens/s measured at concurrency c)

which counts prefill and scheduling gaps as step time (an upper bound on the step, so a lower
bound on f) and assumes the batch really is c. As a cross-check, TPOT p50 * a estimates the
same step from the per-request side. The component's time is its CPU baseline (the
Python/heapq reference, or the compiled C++ one with --baseline cpp) timed ON THE HOST at batch
c with the given budget, K and H: what the service's own component costs it today. Every such
number says `source: "derived"` and carries its formula in `note`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, Field, ValidationError

from checks.docs import Counters, LevelDoc
from checks.vocabulary import NESTED_STAGES
from ops.errors import HostError, OpsError
from ops.hosts.dataplane import data_plane_dir, run_check
from ops.hosts.remote import Host
from ops.measure.counters import (
    BREAKDOWN,
    HOOK_COMPONENTS,
    STAGES,
    _delta,
    breakdown,
    hook_level,
    hook_run_dir,
    hook_snapshot,
    hook_window,
    level_steps,
    not_answering,
    snapshot,
    value,
    wall_shares,
    window_counters,
)
from ops.measure.loadtest import run_loadtest
from ops.measure.shadow import hook_shadow, left_armed, shadow_level
from ops.sections.profile import (
    Incomplete,
    ProfileInterruption,
    ProfileLevel,
    ProfileSection,
    ShadowMismatched,
    ShadowNotTimed,
)

# Runs on the host with the target's python from the data-plane dir: one CPU baseline at batch
# B, timed until `seconds` pass (at least `min_reps` calls). One JSON line on stdout.
CPU_BASELINE = r"""
import json, statistics, sys, time
import numpy as np
from kernels import reference as ref
p = json.loads(sys.argv[1])
b, h, k, budget = p["batch"], p["depth"], p["topk"], p["budget"]
rng = np.random.default_rng(p["seed"])
logits = rng.standard_normal((b, h, max(4096, k)), dtype=np.float32) * p["scale"]
lp, ids = ref.topk_logprobs(logits, k)
if p["baseline"] == "cpp":
    from kernels import cpu
    build, walk = cpu.build_trees_cpp, cpu.greedy_accept_cpp
else:
    build, walk = ref.build_trees, ref.greedy_accept_batch
if p["component"] == "tree_build":
    fn = lambda: build(lp, ids, budget)
else:  # accept: the target agrees with the drafter's first choice all the way down
    trees = ref.build_trees(lp, ids, budget)
    target = rng.integers(0, 4096, size=(b, budget + 1))
    for i in range(b):
        node = 0
        while trees.first_child[i, node] > 0:
            child = int(trees.first_child[i, node])
            target[i, node] = trees.token_ids[i, child - 1]
            node = child
    fn = lambda: walk(trees, target, h)
fn()
samples, end = [], time.perf_counter() + p["seconds"]
while len(samples) < p["min_reps"] or (time.perf_counter() < end and len(samples) < 2000):
    t0 = time.perf_counter()
    fn()
    samples.append((time.perf_counter() - t0) * 1000)
q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
print(json.dumps({"median_ms": statistics.median(samples), "p25_ms": q[0], "p75_ms": q[2],
                  "n": len(samples), "samples_ms": [round(x, 5) for x in samples]}))
"""


# the derived path's tree shape: the CUDA tree builder's own limits (kernels.cuda MAX_BUDGET,
# MAX_TOPK, MAX_DEPTH; a test holds them equal, this module stays free of torch). The CPU
# baseline holds batch x depth x max(4096, K) float32 on the host: bounded, beside a service.
MAX_BUDGET, MAX_TOPK, MAX_DEPTH = 512, 512, 32


class ProfileOptions(BaseModel):
    levels: list[int]
    requests: int = 0
    input_len: int = 32
    output_len: int = 32
    timeout: float = 120.0
    accept_length: float | None = None  # for a service that reports none
    component: Literal["tree_build", "accept"] = "tree_build"
    baseline: Literal["python", "cpp"] = "python"
    budget: int = Field(default=64, ge=1, le=MAX_BUDGET)
    topk: int = Field(default=8, ge=1, le=MAX_TOPK)
    depth: int = Field(default=15, ge=1, le=MAX_DEPTH)
    scale: float = 2.5
    seconds: float = 1.0
    # engine.shadow: time this backend (COMPONENT=KIND: attention=cuda, tree_build=cuda) beside
    # the serving one in a load window of its own at each measured level (ops.measure.shadow), for
    # s in
    # the service's own forwards
    shadow: str | None = Field(default=None, pattern=r"^(attention|tree_build)=[a-z]+$")
    shadow_forwards: int = 5000
    # > 0: each level's measured window and shadow window sized to last about this long at the
    # output tokens/s of an uncounted pilot of `requests` first (as measure sizes its runs)
    # (at most 30 minutes: a window runs as one checks.loadtest call of at most an hour)
    run_seconds: float = Field(default=0.0, ge=0, le=1800)


def sized(c: int, tok_s: float | None, seconds: float, output_len: int) -> int | None:
    """Requests for a run of about `seconds` at `tok_s` output tokens/s (at least c); None
    when nothing sizes it (`seconds` 0, no tokens/s)."""
    if seconds <= 0 or not tok_s:
        return None
    return max(c, math.ceil(seconds * float(tok_s) / output_len))


def pilot(host: Host, c: int, opts: ProfileOptions) -> dict[str, Any]:
    """An uncounted run of `opts.requests` at c, for its tokens/s: `sized_requests` is the
    measured window's size (`opts.requests` where the pilot measured no tokens/s)."""
    rep = run_loadtest(
        host,
        [c],
        requests=opts.requests,
        input_len=opts.input_len,
        output_len=opts.output_len,
        timeout=opts.timeout,
    )
    lt = rep.level_docs[0]
    tok_s = lt.get("output_tok_per_s")
    n = sized(c, tok_s, opts.run_seconds, opts.output_len)
    return {
        "completed": lt["completed"],
        "failed": lt["failed"],
        "duration_s": lt["duration_s"],
        "output_tok_per_s": tok_s,
        "run_seconds": opts.run_seconds,
        "sized_requests": opts.requests if n is None else n,
    }


def measured_level(c: int, start: Counters, end: Counters, lt: LevelDoc) -> dict[str, Any]:
    """Level c from the counters bracketing its measured window (`lt["counters"]`)."""
    steps = level_steps(breakdown(start) or {}, breakdown(end) or {})
    if not steps:
        errors = lt.get("errors") or {}  # the service's own words, when its requests failed
        why = (
            "; its requests failed: " + "; ".join(f"{n} x {e}" for e, n in list(errors.items())[:3])
            if errors
            else ""
        )
        raise OpsError(f"concurrency {c}: the service ran no decode step during the level{why}")
    batch = c if c in steps else max(steps, key=lambda b: steps[b]["steps"])
    row = steps[batch]
    n = row["steps"]
    where = f"mean over the measured window's {n} steps at batch {batch} (Δ {BREAKDOWN})"
    step = 1000 * row["total_s"]["step"] / n
    stage_ms = {
        s: value(1000 * row["total_s"][s] / n, "measured", where, n=n)
        for s in STAGES
        if row["total_s"].get(s, 0.0) > 0
    }
    shares, window = wall_shares(steps, start, end, lt)
    level: dict[str, Any] = {
        "concurrency": c,
        "batch": batch,
        "steps_by_batch": {b: r["steps"] for b, r in sorted(steps.items())},
        "step_ms": value(step, "measured", where, n=n),
        "stage_ms": stage_ms,
        "share": {s: v["value"] / step for s, v in stage_ms.items()},
        "wall_share": shares,
        "window": window,
        "unaccounted_ms": step
        - sum(v["value"] for s, v in stage_ms.items() if s not in NESTED_STAGES),
    }
    if "spread_sum" in row:  # how far apart the step's sequences stood (longest - shortest)
        level["batch_spread"] = value(
            row["spread_sum"] / n,
            "measured",
            f"mean over the measured window's {n} steps at batch {batch} of the batch's length "
            f"spread, longest sequence - shortest, tokens (Δ {BREAKDOWN}.spread_sum)",
            n=n,
        )
    level.update(throughput(lt))
    d_sum = _delta(start, end, "ddtree:accept_length_sum")
    d_cnt = _delta(start, end, "ddtree:accept_length_count")
    if d_sum is not None and d_cnt:
        level["accept_length"] = value(
            d_sum / d_cnt,
            "measured",
            "tokens committed per request per step in this level "
            "(Δ ddtree:accept_length_sum / Δ _count of /metrics)",
            n=int(d_cnt),
        )
    elif lt["accept_length"]["value"] is not None:
        level["accept_length"] = value(
            lt["accept_length"]["value"],
            "measured",
            f"the service's running average ({lt['accept_length']['source']}), not this "
            "level's alone",
        )
    a = (level.get("accept_length") or {}).get("value")
    tok_s = lt.get("output_tok_per_s")
    if a and tok_s:
        level["derived_check"] = {
            "step_ms": 1000 * batch * a / tok_s,
            "formula": f"1000 * {batch} * {a:.3f} / {tok_s:.2f}",
            "note": "what the derived path would say for this level (prefill and gaps count "
            "as step time there)",
        }
    return level


def throughput(lt: LevelDoc) -> dict[str, Any]:
    tok_s = lt.get("output_tok_per_s")
    if not tok_s:
        return {}
    note = (
        f"output tokens / wall of the level's {lt['completed']} measured requests "
        "(client side, checks.loadtest)"
    )
    return {"tokens_per_s": value(tok_s, "measured", note, n=lt["completed"])}


def cpu_baseline(host: Host, cwd: str, c: int, opts: ProfileOptions) -> dict[str, Any]:
    params = {
        "batch": c,
        "depth": opts.depth,
        "topk": opts.topk,
        "budget": opts.budget,
        "component": opts.component,
        "baseline": opts.baseline,
        "scale": opts.scale,
        "seed": c,
        "seconds": opts.seconds,
        "min_reps": 5,
    }
    res = host.run(
        [host.target.python, "-c", CPU_BASELINE, json.dumps(params)],
        cwd=cwd,
        timeout=120 + 20 * opts.seconds,
        warn=True,
        step=f"{opts.component} CPU baseline at batch {c}",
    )
    doc = res.last_json()
    if not isinstance(doc, dict):
        tail = res.tail() or res.tail("stdout") or f"exit {res.rc}"
        return {"error": f"the CPU baseline did not run on {host.name}: {tail}", "params": params}
    return {**doc, "params": params}


def derived_level(
    host: Host,
    cwd: str | None,
    c: int,
    lt: LevelDoc,
    opts: ProfileOptions,
    hook: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Level c of a service without stage timings: the step derived from tokens/s and the
    accept length; f measured by the service's import hook where it has one (`hook`:
    ops.measure.counters.hook_level), else the component's CPU baseline over that step."""
    level: dict[str, Any] = {"concurrency": c, "batch": c, "missing": []}
    level["f_basis"] = (
        "step: f = the component's time / the derived step (the service reports no stage "
        "timings, so its share of the measured window's wall time cannot be measured)"
    )
    measured = (hook or {}).get("wall_share") or {}
    if measured:
        level["f_basis"] = (
            "wall: f = seconds in the function over the measured window's wall seconds, "
            "per process, measured by the service's import hook (source hook); the step "
            "is derived"
        )
        level["wall_share"] = measured
        level["hook"] = hook
    level.update(throughput(lt))
    reported = lt["accept_length"]
    if reported["value"] is not None:
        a = float(reported["value"])
        level["accept_length"] = value(
            a, "measured", f"reported by the service ({reported['source']})"
        )
    elif opts.accept_length is not None:
        a = opts.accept_length
        level["accept_length"] = value(
            a, "derived", "given on the command line (--accept-length): the service reports none"
        )
    else:
        a = None
        level["missing"].append("accept length: the service reports none (give --accept-length)")
    tok_s = lt.get("output_tok_per_s")
    if a is not None and tok_s:
        step = 1000 * c * a / tok_s
        level["step_ms"] = value(
            step,
            "derived",
            f"step_ms = 1000 * c * a / tok_s = 1000 * {c} * {a:.3f} / {tok_s:.2f} "
            "(c requests each advance a tokens a step; prefill and gaps count as step time)",
        )
        tpot = (lt.get("tpot_ms") or {}).get("p50")
        if tpot is not None:
            level["step_ms_from_tpot"] = value(
                tpot * a, "derived", f"TPOT p50 * a = {tpot:.3f} * {a:.3f} (cross-check)"
            )
    elif not tok_s:
        level["missing"].append("tokens/s: no request completed at this level")
    if measured:
        _hook_stage_ms(level, measured)
    if opts.component in measured:
        return level
    assert cwd is not None
    base = cpu_baseline(host, cwd, c, opts)
    level["cpu_baseline"] = base
    if "error" in base:
        level["missing"].append(f"{opts.component} time: {base['error']}")
    else:
        impl = "Python/heapq reference" if opts.baseline == "python" else "compiled C++ baseline"
        level["stage_ms"] = {
            opts.component: value(
                base["median_ms"],
                "derived",
                f"the {impl} {opts.component} at batch {c} (budget {opts.budget}, K "
                f"{opts.topk}, H {opts.depth}) timed on the host's CPU, median of {base['n']}: "
                "stands in for the service's own stage time",
                p25=base["p25_ms"],
                p75=base["p75_ms"],
                n=base["n"],
                samples=base["samples_ms"],
            )
        }
        if "step_ms" in level:
            level["share"] = {opts.component: base["median_ms"] / level["step_ms"]["value"]}
    return level


def _hook_stage_ms(level: dict[str, Any], measured: dict[str, dict[str, Any]]) -> None:
    """Per step, each function the hook measured: its f times the derived step (for the
    step-time chart and the share column; the verdict reads f itself)."""
    step = (level.get("step_ms") or {}).get("value")
    if not step:
        return
    level["stage_ms"] = {
        comp: value(
            f["value"] * step,
            "derived",
            f"the import hook's f ({f['value']:.4f}, share of the window's wall time) x the "
            f"derived step ({step:.3f} ms)",
        )
        for comp, f in measured.items()
    }
    level["share"] = {comp: f["value"] for comp, f in measured.items()}


def service_facts(snap: Counters) -> dict[str, Any]:
    info = snap.get("server_info") or {}
    keep = ("model", "mode", "preset", "device", "backends", "topk")
    out = {k: info.get(k) for k in keep if k in info}
    engine = (info.get("config") or {}).get("engine")
    if engine:
        out["engine"] = engine
    out["stage_timings"] = breakdown(snap) is not None
    return out


INTERRUPTED = "interrupted (Ctrl-C) before this level finished"


class ProfileInterrupted(KeyboardInterrupt):
    """Ctrl-C during a profile; `section` holds the levels that finished before it, the others
    listed in `incomplete` as interrupted (what ran on the host is stopped already)."""

    def __init__(self, section: ProfileSection) -> None:
        left = section.interrupted.levels_left if section.interrupted else []
        super().__init__(f"interrupted with {len(left)} of the levels left: {left}")
        self.section = section

    @property
    def partial_sections(self) -> dict[str, Any]:
        """What an interrupted step's record keeps (ops.rollout.runner)."""
        return {"profile": self.section.record()}


@dataclass
class _Sweep:
    """What one level leaves for the next: the data-plane checkout (derived levels), whether
    the service answers /shadow."""

    cwd: str | None = None
    shadow_offered: bool = True  # until the service says it has no /shadow
    hook: bool = False  # the service has the import hook's counters: its levels read them


def run_profile(
    host: Host, opts: ProfileOptions, on_level: Callable[[int], None] = lambda c: None
) -> ProfileSection:
    """Every level, measured where the service has stage timings, derived where it has not.

    `incomplete` lists the levels (and what they lack) that cannot serve a decision;
    `failed_requests` counts the load's failures. Ctrl-C raises ProfileInterrupted, with the
    levels that finished.
    """
    section = ProfileSection(
        target=host.name, url=host.target.service.url, settings=opts.model_dump(), levels=[]
    )
    sweep = _Sweep()
    try:
        first = snapshot(host)
        section.service = service_facts(first)
        down = not_answering(first)
        if down is not None:  # no level can run: said once, not as each level's missing numbers
            section.service_down = down
            section.incomplete = [
                Incomplete(concurrency=c, missing=[f"the service did not answer ({down})"])
                for c in opts.levels
            ]
            return section
        # a shadow left armed by an earlier ops that was killed would time the candidate inside
        # this profile's windows, f included: disarmed first, and said
        found = left_armed(host, first.get("server_info"))
        if found is not None:
            section.shadow_found_armed = found
        hook = _hook_present(host)
        if hook is not None:
            section.service["hook"] = hook
            sweep.hook = bool(hook.get("live"))
        for c in opts.levels:
            _profile_level(host, opts, c, section, sweep)
            on_level(c)
    except KeyboardInterrupt as exc:
        # a level is done once it is in the section (one whose measured window finished is
        # kept, its shadow window cut short or not)
        done = {x.concurrency for x in [*section.levels, *section.incomplete]}
        left = [c for c in opts.levels if c not in done]
        section.interrupted = ProfileInterruption(levels_left=left)
        section.incomplete += [Incomplete(concurrency=c, missing=[INTERRUPTED]) for c in left]
        raise ProfileInterrupted(section) from exc
    return section


def _profile_level(
    host: Host, opts: ProfileOptions, c: int, section: ProfileSection, sweep: _Sweep
) -> None:
    """One level, into `section`: its entry in `levels` and/or `incomplete`, its failures."""
    first_run = pilot(host, c, opts) if opts.run_seconds > 0 else None
    if first_run is not None and first_run["failed"]:
        # no window sized from a pilot whose requests failed (the service is not serving)
        section.failed_requests += first_run["failed"]
        total = first_run["failed"] + first_run["completed"]
        why = f"the pilot's {first_run['failed']} of {total} requests failed"
        section.incomplete.append(Incomplete(concurrency=c, missing=[why], pilot=first_run))
        return
    requests = opts.requests if first_run is None else first_run["sized_requests"]
    if sweep.hook:  # the same window, with the hook's readings in its snapshots
        lt = _hook_loadtest(host, c, requests, opts)
    else:
        rep = run_loadtest(
            host,
            [c],
            requests=requests,
            input_len=opts.input_len,
            output_len=opts.output_len,
            timeout=opts.timeout,
            counters=True,
        )
        lt = rep.level_docs[0]
    window = window_counters(lt)
    hook_w = hook_window(lt)
    hook = hook_level(*hook_w, lt["duration_s"]) if hook_w is not None else None
    if window is not None:
        level = measured_level(c, *window, lt)
        level["method"] = "measured"
        if hook is not None:  # beside the engine's own clock (its f stays the engine's)
            level["hook"] = hook
    else:
        if opts.component not in ((hook or {}).get("wall_share") or {}):
            sweep.cwd = sweep.cwd or data_plane_dir(host)
        level = derived_level(host, sweep.cwd, c, lt, opts, hook)
        level["method"] = "hook" if "hook" in level else "derived"
    if hook is not None and hook_w is not None:
        _hook_shadows(section, level, hook, hook_w[1], opts)
    level["load"] = {k: lt[k] for k in ("completed", "failed", "errors", "duration_s")}
    level["load"]["tpot_p50_ms"] = (lt.get("tpot_ms") or {}).get("p50")
    level["load"]["requests"] = requests
    if first_run is not None:
        level["load"]["pilot"] = first_run
    if opts.shadow and level["method"] == "measured" and sweep.shadow_offered and not hook:
        load = {
            "requests": requests,
            "input_len": opts.input_len,
            "output_len": opts.output_len,
            "timeout": opts.timeout,
        }
        try:
            level["shadow"] = shadow_level(host, c, opts.shadow, opts.shadow_forwards, load)
        except KeyboardInterrupt:  # f was measured: the level stays, without its s
            why = "interrupted (Ctrl-C) in its shadow window"
            section.shadow_not_timed.append(ShadowNotTimed(concurrency=c, why=why))
            _keep(section, c, level, lt)
            raise
        # only the service's own "no such endpoint" ends the asking (a timeout does not)
        sweep.shadow_offered = level["shadow"]["offered"] is not False
        if level["shadow"].get("error"):
            why = level["shadow"]["error"]
            section.shadow_not_timed.append(ShadowNotTimed(concurrency=c, why=why))
        section.failed_requests += (level["shadow"].get("load") or {}).get("failed", 0)
    _keep(section, c, level, lt)


def _hook_present(host: Host) -> dict[str, Any] | None:
    """The import hook's counters on the host before the first level: how many live processes
    keep them, the hook's setting and summary; None where nothing could be read (a release
    without checks.hook_counters); {"live": 0, ...} where no process of the service has them."""
    try:
        doc = hook_snapshot(host)
    except OpsError as exc:
        return {"live": 0, "error": f"the hook's counters could not be read: {exc}"}
    st = doc.get("status") or {}
    return {
        "live": doc.get("live", 0),
        "dead_skipped": doc.get("dead", 0),
        "run_dir": doc.get("run_dir"),
        "release": doc.get("release"),
        "setting": st.get("spec"),
        "active": st.get("active"),
        "summary": st.get("summary"),
        "shadowed": st.get("shadowed"),
        "mismatch_files": doc.get("mismatch_files", []),
    }


def _hook_loadtest(host: Host, c: int, requests: int, opts: ProfileOptions) -> LevelDoc:
    """One level as `ops.measure.loadtest` runs it with `--counters`, through
    `checks.hook_counters --loadtest`, so each window snapshot also holds the hook's reading."""
    args = [
        "--url",
        host.target.service.url,
        "--concurrency",
        str(c),
        "--requests",
        str(requests),
        "--input-len",
        str(opts.input_len),
        "--output-len",
        str(opts.output_len),
        "--timeout",
        str(opts.timeout),
        "--counters",
    ]
    argv = ["--run", hook_run_dir(host), "--loadtest", "--", *args]
    doc = run_check(host, "checks.hook_counters", argv, timeout=3600).data
    level = doc.get("level")
    if not isinstance(level, dict):
        raise HostError(
            f"c={c}: {doc.get('message') or 'no level in its answer'}",
            target=host.name,
            step="module checks.hook_counters --loadtest",
        )
    return cast(LevelDoc, {**level, "requests": doc["requests"], "warmup": doc["warmup"]})


def _hook_shadows(
    section: ProfileSection,
    level: dict[str, Any],
    hook: dict[str, Any],
    end: dict[str, Any],
    opts: ProfileOptions,
) -> None:
    """The hook's shadows in the level's window: every one in `level["hook"]["shadow"]`, and
    the level's `shadow` (what the report projects with): the one --shadow asked for, else the
    tree build's, else the walk's; on a service the engine's clock measures, the engine's own
    shadow window keeps that place."""
    asked_comp, _, asked_kind = (opts.shadow or "").partition("=")
    hook["shadow"] = {
        comp: sh
        for comp in HOOK_COMPONENTS
        if (sh := hook_shadow(hook, end, comp, asked_kind if comp == asked_comp else None))
    }
    if level["method"] == "measured":
        return
    if opts.shadow and asked_comp not in HOOK_COMPONENTS:
        level["shadow"] = {
            "offered": False,
            "source": "hook",
            "component": asked_comp,
            "candidate": asked_kind,
            "error": "the import hook shadows only "
            f"{' and '.join(HOOK_COMPONENTS)}, not {asked_comp}",
        }
    else:
        order = [asked_comp] if opts.shadow else list(HOOK_COMPONENTS)
        picked = next((hook["shadow"][x] for x in order if x in hook["shadow"]), None)
        if picked is None:
            return
        level["shadow"] = picked
    sh = level["shadow"]
    c = level["concurrency"]
    if sh.get("error"):
        section.shadow_not_timed.append(ShadowNotTimed(concurrency=c, why=sh["error"]))
    if sh.get("mismatched"):
        section.shadow_mismatched.append(
            ShadowMismatched(
                concurrency=c,
                component=sh["component"],
                mismatched=sh["mismatched"],
                compared=sh["compared"],
            )
        )


def _keep(section: ProfileSection, c: int, level: dict[str, Any], lt: LevelDoc) -> None:
    """Level c into the section, as the record's model: `levels` where it has a step time,
    `incomplete` where it lacks anything, and its load's failures counted. Numbers that are no
    measurement (a negative time: the service restarted inside the window) make it incomplete,
    said, instead of reaching the record."""
    missing = list(level.get("missing", []))
    if "step_ms" in level:
        try:
            section.levels.append(ProfileLevel.model_validate(level))
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(x) for x in e["loc"])
            missing.append(f"its numbers are no measurement: {where}: {e['msg']}")
    if missing or "step_ms" not in level:
        section.incomplete.append(Incomplete(concurrency=c, missing=missing))
    section.failed_requests += lt["failed"]
