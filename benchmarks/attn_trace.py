"""Where the engine's attention stage goes, kernel by kernel, from `engine.trace`'s Chrome traces.

    python benchmarks/attn_trace.py TRACE.json.gz... [--layers 4] [--json OUT.json]

Exit 0 with a table per trace, 1 when no trace holds a traced forward (a CPU trace has no GPU
markers; `--layers` must be the preset's), 2 for bad input (one line: the file and what is
wrong with it).

A traced forward starts at its marker copy (engine.trace: its size gives the rows and the
attention backend) and runs: the plan's kernels, then the graph pieces G0 .. G_layers with one
attention call A_l between G_l and G_l+1. A graph piece's kernels all carry the correlation id
of its one `cudaGraphLaunch`; an eager call's kernels each have their own. Per attention call,
on the GPU's clock (microseconds):
- `lead`: from G_l's last kernel's end to A_l's first kernel's start: the GPU idle, waiting for
  the host to launch the call (the engine's stage clock counts it: its start event fires when
  G_l is done);
- `busy`: the sum of A_l's kernels' durations (GPU work);
- `gap`: A_l's span less `busy` (the GPU idle between the call's own launches);
- `stage` = lead + span: what the engine's stage clock charges the call, less the event's own
  few microseconds; `tail`: from A_l's end to G_l+1's start (not charged to attention).
Per forward the calls are summed; per (backend, rows) the forwards' medians and quartiles are
printed, with the kernels that take most of `busy` (their per-forward medians), so the same
stage can be set side by side from a serving process and from a bench. With the trace's
`.timers.json` (engine.trace) each forward also carries the engine's own clock of it: the plan's
host time (`plan host`, which no kernel shows) and its calls' CUDA events (`calls`, which the
kernels' `stage` should match).
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
from collections import defaultdict
from typing import Any

from engine.trace import read_marker
from kernels.cli import OneLineParser

PARTS = ("stage", "lead", "busy", "gap", "tail", "kernels", "plan_busy", "pieces_busy")
CLOCK = ("plan_host", "calls")  # the engine's own clock of the forward (from .timers.json)


class TraceError(ValueError):
    """A file that is not what this reads: one line, exit 2."""


def _load(path: str) -> list[dict]:
    """The trace's events, checked enough that the rest cannot fail on them."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:  # missing, a directory, not gzip, not JSON
        raise TraceError(f"{path}: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise TraceError(f"{path}: not a Chrome trace (no list of events under traceEvents)")
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy"):
            continue
        for key in ("ts", "dur"):
            if not isinstance(e.get(key), int | float) or isinstance(e.get(key), bool):
                raise TraceError(f"{path}: a {e['cat']} event without a numeric {key!r}")
        if not isinstance(e.setdefault("args", {}), dict):
            raise TraceError(f"{path}: a {e['cat']} event whose args is not an object")
        if e["cat"] == "kernel" and not isinstance(e.get("name"), str):
            raise TraceError(f"{path}: a kernel event without a name")
        if e["cat"] == "gpu_memcpy":
            n = e["args"].get("bytes", 0)
            if not isinstance(n, int) or isinstance(n, bool):
                raise TraceError(f"{path}: a gpu_memcpy event whose bytes is not an integer")
    return events


def markers(events: list[dict]) -> list[tuple[float, int, str]]:
    """(GPU start, rows, impl) of every traced forward's marker copy (engine.trace), in order."""
    out = []
    for e in events:
        if e.get("cat") == "gpu_memcpy":
            m = read_marker(e["args"].get("bytes", 0))
            if m is not None:
                out.append((float(e["ts"]), *m))
    return sorted(out)


def _timers(side: str) -> list[dict]:
    """engine.trace's `.timers.json`: one {rows, impl, plan_host_us, calls_us} a forward."""
    try:
        with open(side) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{side}: {exc}") from None
    keys = {"rows": int, "impl": str, "plan_host_us": (int, float), "calls_us": (int, float)}
    if not isinstance(doc, list) or not all(
        isinstance(t, dict) and all(isinstance(t.get(k), ty) for k, ty in keys.items()) for t in doc
    ):
        raise TraceError(f"{side}: not engine.trace's timers (a list of rows / impl / "
                         "plan_host_us / calls_us)")  # fmt: skip
    return doc


def _end(e: dict) -> float:
    return float(e["ts"]) + float(e.get("dur", 0.0))


def _groups(kernels: list[dict]) -> list[list[dict]]:
    """Consecutive kernels split into runs of one correlation id (a graph launch's kernels
    share one; an eager launch has one kernel)."""
    out: list[list[dict]] = []
    for k in kernels:
        c = k.get("args", {}).get("correlation")
        if out and c is not None and out[-1][0].get("args", {}).get("correlation") == c:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def forwards(
    events: list[dict], marks: list[tuple[float, int, str]], layers: int,
    timers: list[dict] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One record per traced forward: rows, impl, the summed parts, and per-kernel busy; with
    the window's timers (engine.trace's `.timers.json`, one per forward in order) also the
    engine's own clock of it: `plan_host` and `calls` (CUDA events)."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out = []
    for i, (t0, rows, impl) in enumerate(marks):
        t1 = marks[i + 1][0] if i + 1 < len(marks) else float("inf")
        ks = [k for k in kernels if t0 <= k["ts"] < t1]
        runs = _groups(ks)
        graph_idx = [j for j, r in enumerate(runs) if len(r) > 1][: layers + 1]
        if len(graph_idx) < layers + 1:
            continue  # a forward the window cut short, or eager pieces: not this tool's case
        rec: dict[str, Any] = {"rows": rows, "impl": impl, "by_kernel": defaultdict(float)}
        for p in PARTS:
            rec[p] = 0.0
        if timers is not None and len(timers) == len(marks):
            t = timers[i]
            if (t["rows"], t["impl"]) == (rows, impl):
                rec["plan_host"], rec["calls"] = t["plan_host_us"], t["calls_us"]
        rec["plan_busy"] = sum(k["dur"] for r in runs[: graph_idx[0]] for k in r)
        rec["pieces_busy"] = sum(k["dur"] for j in graph_idx for k in runs[j])
        for a, b in zip(graph_idx, graph_idx[1:], strict=False):
            call = [k for r in runs[a + 1 : b] for k in r]
            g_end = max(_end(k) for k in runs[a])
            g_next = min(k["ts"] for k in runs[b])
            if not call:
                continue
            first, last = call[0]["ts"], max(_end(k) for k in call)
            busy = sum(k["dur"] for k in call)
            rec["lead"] += first - g_end
            rec["busy"] += busy
            rec["gap"] += (last - first) - busy
            rec["stage"] += last - g_end
            rec["tail"] += g_next - last
            rec["kernels"] += len(call)
            for k in call:
                rec["by_kernel"][k["name"]] += k["dur"]
        out.append(rec)
    return out


def _q(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if len(xs) == 1:
        return {"median": xs[0], "p25": xs[0], "p75": xs[0]}
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return {"median": q[1], "p25": q[0], "p75": q[2]}


def summarize(recs: list[dict[str, Any]], top: int = 8) -> list[dict[str, Any]]:
    """Per (impl, rows): how many forwards, each part's quartiles, the top kernels' medians."""
    by: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in recs:
        by[(r["impl"], r["rows"])].append(r)
    out = []
    for (impl, rows), rs in sorted(by.items()):
        every = set().union(*(r["by_kernel"] for r in rs))
        names = {n: [r["by_kernel"].get(n, 0.0) for r in rs] for n in every}
        kern = sorted(((statistics.median(v), n) for n, v in names.items()), reverse=True)
        out.append({
            "impl": impl, "rows": rows, "forwards": len(rs),
            **{p: _q([r[p] for r in rs]) for p in PARTS},
            **{p: _q([r[p] for r in rs]) for p in CLOCK if all(p in r for r in rs)},
            "top_kernels": [{"name": n, "median_us": m} for m, n in kern[:top]],
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    """0: a table for every trace; 1: no traced forward in any of them; 2: bad input."""
    ap = OneLineParser(prog="python benchmarks/attn_trace.py")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--layers", type=int, default=4, help="the preset's layers (small: 4)")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args(argv)
    if args.layers < 1:
        print(f"error: --layers must be >= 1, got {args.layers}", file=sys.stderr)
        return 2
    if args.json:
        try:  # an unwritable --json fails now, not after the tables
            open(args.json, "a").close()
        except OSError as exc:
            print(f"error: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    doc: dict[str, Any] = {"traces": {}}
    found = 0
    for path in args.traces:
        try:
            events = _load(path)
            side = path[: -len(".json.gz")] + ".timers.json" if path.endswith(".json.gz") else ""
            timers = _timers(side) if side and os.path.exists(side) else None
        except TraceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        cats: dict[str, int] = defaultdict(int)
        for e in events:
            cats[str(e.get("cat"))] += 1
        marks = markers(events)
        recs = forwards(events, marks, args.layers, timers)
        if timers is not None and len(timers) != len(marks):
            print(f"note: {side}: {len(timers)} forwards timed, {len(marks)} marked in the trace; "
                  "not joined", file=sys.stderr)  # fmt: skip
        found += len(recs)
        doc["traces"][path] = {"event_categories": dict(cats), "summary": summarize(recs)}
        print(path)
        if not recs:
            print("  no traced forward: no GPU markers (a CPU trace?), or --layers is not "
                  "the preset's")  # fmt: skip
            continue
        print("  impl   rows  fwd   stage us (p25..p75)      lead     busy      gap   kernels"
              "  plan host  calls (events)")  # fmt: skip
        for s in doc["traces"][path]["summary"]:
            st = s["stage"]
            clock = "".join(
                f" {s[p]['median']:10.1f}" if p in s else "          -" for p in CLOCK
            )  # fmt: skip
            print(f"  {s['impl']:5s} {s['rows']:5d} {s['forwards']:4d} {st['median']:9.1f} "
                  f"({st['p25']:.0f}..{st['p75']:.0f}) {s['lead']['median']:8.1f} "
                  f"{s['busy']['median']:8.1f} {s['gap']['median']:8.1f} "
                  f"{s['kernels']['median']:6.0f} {clock}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
