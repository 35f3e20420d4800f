"""The profile's shadow window: a candidate (attention, or the tree build) timed beside the
serving one on the service's own forwards (engine.shadow), and its pairs made into s per kind.

`shadow_level` arms the service's shadow (`checks.shadow` on the host), drives the same load
at c once more (`ops.measure.loadtest`), reads the pairs from the counters' `/get_server_info`, and
disarms it whatever happened. `summarize` turns the pairs into, per kind ("step": the decode
steps, "prefill": the prompt blocks), the number of forwards, each backend's mean time per
forward (its plan on the host clock and its calls on the GPU), s = the baseline's total / the
candidate's total (so a forward counts by its time, as the wall share f counts it), s over the
pairs where each backend went first (the order's effect, which alternation cancels), s with
each backend timed only where it went first (`s_in_place`: where it runs in production; on the
H200 the torch baseline cost more there, so this read the prefill nearer the service's than the
paired s: benchmarks/NOTES-attention.md; a diagnosis, not the projection's s), and a 90%
bootstrap interval of s over the forwards (fixed seed: the same pairs give the same interval).
The window's first forward of each kind is left out of all of these (`warmup`, kept in
`pairs`): the candidate's first call in a process is a cold start (on the H200 its first
prefill block took 13.5-16.5 ms against a median of 6.3 ms, and its first tree build 1.1 ms
against 0.11), which with the 10 prefill blocks of a c=1 window read s 1.28x for 1.53x.

A service without /shadow (a real SGLang) is `offered: false`: the profile records it once and
the report projects with the bench's s, as before. A service started with the release's import
hook under `DDTREE_OPS_SGLANG=shadow:COMPONENT=KIND[/N]` shadows in every window on its own
(integration.shadow: the stock serves, the candidate runs beside it on the same inputs, one
call in N, alternating which goes first): `hook_shadow` makes the level's s from the hook's
readings around the level's own window (`source: hook`, the calls compared and mismatched),
with nothing to arm or disarm; asking it for a change it does not shadow says so. A service
that stops answering during the window is `offered: null` with the reason. The disarm runs
with Ctrl-C held off (`disarm`).
"""

from __future__ import annotations

import random
import signal
import threading
from typing import Any

from checks.vocabulary import COMPONENTS, SHADOWED
from ops.hosts.dataplane import run_check
from ops.hosts.remote import Host
from ops.measure.counters import snapshot
from ops.measure.loadtest import run_loadtest
from ops.sections.profile import ProfileSection, Shadow

KINDS = ("step", "prefill")
WARMUP = 1  # forwards of each kind left out at the start of a window (the cold start)
# what the engine can shadow, and each one's backends (engine.components; no engine import here)
SHADOW_KINDS = {c: COMPONENTS[c] for c in SHADOWED}  # component -> the backends it can time
INTERVAL = 0.90
RESAMPLES = 1000


def _ratio(pairs: list[dict[str, float]]) -> float | None:
    cand = sum(p["cand_us"] for p in pairs)
    return sum(p["base_us"] for p in pairs) / cand if cand > 0 else None


def _kind(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not pairs:
        return None
    n = len(pairs)
    s = _ratio(pairs)
    if s is None:
        return None
    rng = random.Random(0)
    boots = sorted(
        r
        for r in (_ratio([pairs[rng.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES))
        if r is not None
    )
    cut = int((1 - INTERVAL) / 2 * len(boots))
    by_first = {f: _ratio([p for p in pairs if p["first"] == f]) for f in ("base", "cand")}
    base_first = [p["base_us"] for p in pairs if p["first"] == "base"]
    cand_first = [p["cand_us"] for p in pairs if p["first"] == "cand"]
    # each backend where it runs in production (first after the graph piece, or first in the
    # stage), from the forwards where it went first: a diagnosis beside s, not the projection's
    in_place = (
        (sum(base_first) / len(base_first)) / (sum(cand_first) / len(cand_first))
        if base_first and cand_first and sum(cand_first) > 0
        else None
    )
    return {
        "forwards": n,
        "s": s,
        "lo": boots[cut] if boots else s,
        "hi": boots[-1 - cut] if boots else s,
        "base_us": sum(p["base_us"] for p in pairs) / n,
        "cand_us": sum(p["cand_us"] for p in pairs) / n,
        "base_host_us": sum(p.get("base_plan_us", 0.0) for p in pairs) / n,
        "cand_host_us": sum(p.get("cand_plan_us", 0.0) for p in pairs) / n,
        "rows_mean": sum(p.get("rows", 0) for p in pairs) / n,
        "s_base_first": by_first["base"],
        "s_cand_first": by_first["cand"],
        "s_in_place": in_place,
    }


def summarize(doc: dict[str, Any] | None) -> dict[str, Any]:
    """The shadow doc of /get_server_info -> s per kind (see the module's docstring)."""
    if not isinstance(doc, dict):
        return {"offered": False, "error": "the service's /get_server_info has no shadow"}
    fields = doc.get("pair_fields") or []
    pairs = []
    for raw in doc.get("pairs") or []:
        p = dict(zip(fields, raw, strict=False))
        try:
            p["base_us"] = float(p["base_plan_us"]) + float(p["base_calls_us"])
            p["cand_us"] = float(p["cand_plan_us"]) + float(p["cand_calls_us"])
        except (KeyError, TypeError, ValueError):
            return {"offered": True, "error": f"a shadow pair the profile cannot read: {raw!r}"}
        pairs.append(p)
    out: dict[str, Any] = {
        "offered": True,
        "component": doc.get("component"),
        "baseline": doc.get("baseline"),
        "candidate": doc.get("candidate"),
        "armed_forwards": doc.get("armed_forwards"),
        "sampled": doc.get("sampled"),
        "error": doc.get("error"),
    }
    for kind in KINDS:
        of_kind = [p for p in pairs if p.get("kind") == kind]
        out[kind] = _kind(of_kind[WARMUP:])
        if out[kind] is not None:
            out[kind]["warmup"] = min(WARMUP, len(of_kind))
    out["pair_fields"], out["pairs"] = fields, doc.get("pairs") or []
    return out


def shadow_level(host: Host, c: int, spec: str, forwards: int, load: dict[str, Any]) -> dict:
    """Arm (`spec`: COMPONENT=KIND), drive the load at c once more, read the pairs, disarm (see
    the module's doc). `load`: run_loadtest's keyword arguments (requests, input_len,
    output_len, timeout)."""
    component, _, kind = spec.partition("=")
    url = host.target.service.url
    args = ["--url", url, "--component", component, "--backend", kind, "--forwards", str(forwards)]
    try:
        arm = run_check(host, "checks.shadow", args).data
    except BaseException:  # the arm may have reached the service before its answer came back
        _disarm_after_failure(host, component)
        raise
    if not arm.get("ok"):
        return {
            "offered": arm.get("offered"),
            "component": component,
            "candidate": kind,
            "error": arm.get("message") or "the service did not arm its shadow",
        }
    try:
        rep = run_loadtest(host, [c], counters=False, **load)
        snap = snapshot(host)
    finally:
        disarm(host, component)
    lt = rep.level_docs[0]
    info = snap.get("server_info")
    if info is None:  # no answer: not the same as a service without /shadow
        out = {
            "offered": None,
            "component": component,
            "candidate": kind,
            "error": "the service did not answer after the shadow window "
            f"({snap.get('server_info_status')})",
        }
    else:
        out = summarize(info.get("shadow"))
    out["load"] = {k: lt[k] for k in ("completed", "failed", "duration_s")}
    return out


def disarm(host: Host, component: str) -> dict[str, Any]:
    """`checks.shadow --forwards 0`, with Ctrl-C held off while it runs and raised once it is
    done (a Ctrl-C in the middle would otherwise leave the service timing the candidate for up
    to 20,000 more forwards; a dropped one would leave the user's Ctrl-C unanswered); bounded by
    the check's own timeout."""
    off = ["--url", host.target.service.url, "--component", component, "--forwards", "0"]
    held = threading.current_thread() is threading.main_thread()
    came: list[int] = []
    before = signal.signal(signal.SIGINT, lambda sig, frame: came.append(sig)) if held else None
    try:
        return run_check(host, "checks.shadow", off).data
    finally:
        if held:
            signal.signal(signal.SIGINT, before)
            if came:
                raise KeyboardInterrupt  # the Ctrl-C that came while the service was disarmed


def _disarm_after_failure(host: Host, component: str) -> None:
    """A disarm after the arm itself failed or was interrupted: its own failure is not
    news (the arm's is what goes on)."""
    try:
        disarm(host, component)
    except Exception:  # noqa: BLE001 - the arm's error is the one to report
        pass


def left_armed(host: Host, info: dict[str, Any] | None) -> dict[str, Any] | None:
    """A shadow the service still has armed (an earlier `ops` that was killed or interrupted
    twice): disarmed, and what was found, for the record; None when there is none."""
    doc = (info or {}).get("shadow")
    if not isinstance(doc, dict) or not doc.get("left") or not doc.get("component"):
        return None
    res = disarm(host, str(doc["component"]))
    return {
        "component": doc["component"],
        "candidate": doc.get("candidate"),
        "left": doc["left"],
        "disarmed": bool(res.get("ok")),
    }


def _setting_kind(item: str | None) -> tuple[str | None, int]:
    """'shadow:tree_build=cpp/8' -> ('cpp', 8)."""
    if not item:
        return None, 1
    kind = item.partition("=")[2]
    head, sep, n = kind.rpartition("/")
    return (head, int(n)) if sep and n.isdigit() else (kind, 1)


def hook_shadow(
    hook: dict[str, Any], end: dict[str, Any], component: str, asked: str | None
) -> dict[str, Any] | None:
    """The level's shadow from the hook's counters (ops.measure.counters.hook_level's
    processes, the end reading's status): s over the window's compared calls (the stock's
    seconds / the candidate's, pooled over the processes), its 90% bootstrap interval over the
    pairs the ring still holds, the calls compared and mismatched; None when the hook shadows
    no such component and nothing was asked. `asked`: the profile's --shadow KIND, checked
    against the hook's setting."""
    from ops.measure.counters import HOOK_FUNCTIONS

    item = ((end.get("status") or {}).get("shadowed") or {}).get(HOOK_FUNCTIONS[component])
    kind, every = _setting_kind(item)
    rows = [r["components"][component]["shadow"] for r in hook["processes"]]
    rows = [r for r in rows if r]
    if not rows:
        if asked is None:
            return None
        return {
            "offered": False,
            "source": "hook",
            "component": component,
            "candidate": asked,
            "error": f"the service's import hook does not shadow {component} (its setting: "
            f"{(end.get('status') or {}).get('spec')!r}); deploy it with "
            f"DDTREE_OPS_SGLANG=shadow:{component}={asked} to time {asked} beside the "
            "stock on the service's own calls",
        }
    out: dict[str, Any] = {
        "offered": True,
        "source": "hook",
        "component": component,
        "baseline": "reference",
        "candidate": kind,
        "setting": item,
        "every": every,
        "processes": len(rows),
        "compared": sum(r["compared"] for r in rows),
        "mismatched": sum(r["mismatched"] for r in rows),
        "cand_errors": sum(r["cand_errors"] for r in rows),
        "overhead_s": sum(r["overhead_s"] for r in rows),
        "error": None,
        "prefill": None,
    }
    if asked is not None and asked != kind:
        out["error"] = (
            f"the service's import hook shadows {component} with {kind}, not {asked} ({item})"
        )
    pairs = [
        {"base_us": s / 1e3, "cand_us": c / 1e3, "first": "cand" if i & 1 else "base"}
        for r in rows
        for i, s, c in r["ring"]
    ]
    stock_s, cand_s = sum(r["stock_s"] for r in rows), sum(r["cand_s"] for r in rows)
    timed = sum(r["pairs"] for r in rows)  # compared calls the candidate answered
    if timed <= 0 or cand_s <= 0 or stock_s <= 0:
        out["step"] = None
        out["error"] = out["error"] or (
            f"no call of {component} was compared in this window (1 call in {every} is)"
        )
        return out
    k = _kind(pairs) if pairs else None
    s = stock_s / cand_s
    out["step"] = {
        "forwards": timed,
        "s": s,
        "lo": min(k["lo"], s) if k else s,
        "hi": max(k["hi"], s) if k else s,
        "base_us": 1e6 * stock_s / timed,
        "cand_us": 1e6 * cand_s / timed,
        "warmup": 0,
        "s_base_first": k["s_base_first"] if k else None,
        "s_cand_first": k["s_cand_first"] if k else None,
        "pairs_in_interval": len(pairs),
    }
    return out


def shadow_lines(sec: ProfileSection) -> list[str]:
    """One line per level the shadow ran at: s per kind of forward, or why it did not run;
    first, a shadow this profile found still armed and disarmed."""
    out = []
    found = sec.shadow_found_armed
    if found:
        state = "disarmed" if found.get("disarmed") else "NOT disarmed (checks.shadow failed)"
        out.append(
            f"the service's shadow was still armed ({found['component']} "
            f"{found.get('candidate')}, {found['left']} forwards left, from an earlier run): "
            f"{state} before this profile"
        )
    for lv in sec.levels:
        sh = lv.shadow
        if sh is None:
            continue
        c = lv.concurrency
        if sh.source == "hook":
            out.append(_hook_line(c, sh))
            continue
        if sh.error or not sh.offered:
            out.append(f"shadow c={c}: not timed: {sh.error or 'not offered'}")
            continue
        calls = "steps" if sh.component == "tree_build" else "forwards"
        parts = [
            f"{kind} {k.s:.3g}x ({k.lo:.3g}..{k.hi:.3g}, {k.forwards} {calls})"
            for kind, k in (("step", sh.step), ("prefill", sh.prefill))
            if k is not None
        ]
        out.append(
            f"shadow c={c}: {sh.component} {sh.candidate} against {sh.baseline} in the "
            f"service's own {calls}: {', '.join(parts) or 'nothing sampled'}"
        )
    return out


def _hook_line(c: int, sh: Shadow) -> str:
    """One level's line for the hook's shadow (the service's own calls, its setting)."""
    if not sh.offered:
        return f"shadow c={c}: not timed: {sh.error}"
    k = sh.step
    head = (
        f"shadow c={c}: {sh.component} {sh.candidate} against the stock in the service's own "
        f"calls (the import hook's {sh.setting})"
    )
    s = f"{k.s:.3g}x ({k.lo:.3g}..{k.hi:.3g}, {k.forwards} calls)" if k else "no s"
    said = f"{sh.mismatched} MISMATCHED" if sh.mismatched else "0 mismatched"
    tail = f"; {sh.error}" if sh.error else ""
    return f"{head}: {s}; {said} of {sh.compared} compared{tail}"
