"""Rendering of a decision: the context the templates read, inline SVG charts, md and html.

Charts are plain SVG strings built here (no network, no JavaScript); every label in them is
escaped, and every number a chart shows is also in a table beside it. Templates live in
ops/templates (report.md.j2, report.html.j2); HTML is rendered with autoescape on, markdown
with every printed value's `&` and `<` as entities (`md_text`), so no record text is raw HTML.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Undefined

from checks.vocabulary import NESTED_STAGES
from ops.measure.healthcheck import aa_runs_text
from ops.sections.bench import KernelRow
from ops.sections.common import STAGES
from ops.verdict.amdahl import GAIN_INTERVAL, AmdahlRow
from ops.verdict.decide import Decision, times
from ops.verdict.evidence import Evidence
from ops.verdict.gain_audit import (
    audit_lines,
    audit_rows,
    baseline_lines,
    drift_lines,
    precision_lines,
)
from ops.verdict.service_cost import cost_line, service_cost

TEMPLATES = Path(__file__).parent / "templates"
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999")
FONT = 'font-family="DejaVu Sans, Arial, sans-serif" font-size="12"'


def pct(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"


def cell(x: Any) -> str:
    """Text safe inside a markdown table cell: no pipe, no line break."""
    return " ".join(str(x).split()).replace("|", "\\|")


def na(x: Any) -> Any:
    """None (not measured: e.g. a probe with no sample in a window) as "n/a"."""
    return "n/a" if x is None else x


def num(x: float | None, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" {FONT}>'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, s: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{escape(s)}</text>'


def _legend(names: list[str], x: float, y: float, colors: list[str] | None = None) -> list[str]:
    out = []
    colors = colors or [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    for i, (name, color) in enumerate(zip(names, colors, strict=True)):
        yy = y + 16 * i
        out.append(f'<rect x="{x}" y="{yy - 9}" width="10" height="10" fill="{color}"/>')
        out.append(_text(x + 14, yy, name))
    return out


# -- speedup by batch, per kernel --------------------------------------------------------


def speedup_series(rows: list[KernelRow]) -> dict[str, dict[str, dict[int, list[float]]]]:
    """{"kernel impl": {baseline impl: {batch: [speedups over shapes]}}} from the medians."""
    out: dict[str, dict[str, dict[int, list[float]]]] = {}
    for cand in rows:
        if not cand.impl.startswith("cuda") or cand.median_us <= 0 or cand.batch is None:
            continue
        for base in rows:
            same = base.kernel == cand.kernel and base.shape == cand.shape
            if same and not base.impl.startswith("cuda") and base.median_us > 0:
                key = f"{cand.kernel} {cand.impl}"
                per = out.setdefault(key, {}).setdefault(base.impl, {})
                per.setdefault(cand.batch, []).append(base.median_us / cand.median_us)
    return out


def speedup_chart(name: str, series: dict[str, dict[int, list[float]]]) -> str:
    """Grouped bars, log10 y: the median speedup over shapes at each batch, per baseline."""
    batches = sorted({b for per in series.values() for b in per})
    bases = sorted(series)
    meds = [statistics.median(v) for per in series.values() for v in per.values()]
    lo = math.floor(math.log10(min(meds + [1.0])))
    hi = max(math.ceil(math.log10(max(meds + [10.0]))), lo + 1)
    w, h, left, top, plot_h = 560, 260, 52, 28, 180
    legend_w = 150
    plot_w = w - left - legend_w
    body = [_text(left, 16, f"speedup of {name} by batch (log scale)", extra='font-weight="bold"')]

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (math.log10(v) - lo) / (hi - lo))

    for d in range(lo, hi + 1):
        y = y_of(10.0**d)
        body.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        body.append(_text(left - 4, y + 4, f"{10.0**d:g}x", "end"))
    group = plot_w / max(len(batches), 1)
    bar = group * 0.8 / max(len(bases), 1)
    for gi, b in enumerate(batches):
        x0 = left + gi * group + group * 0.1
        body.append(_text(left + gi * group + group / 2, top + plot_h + 16, f"B={b}", "middle"))
        for bi, base in enumerate(bases):
            vals = series[base].get(b)
            if not vals:
                continue
            v = statistics.median(vals)
            y = y_of(v)
            color = PALETTE[bi % len(PALETTE)]
            x = x0 + bi * bar
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar * 0.9:.1f}" '
                f'height="{top + plot_h - y:.1f}" fill="{color}"/>'
            )
            body.append(_text(x + bar * 0.45, y - 3, f"{v:.3g}", "middle", 'font-size="10"'))
    body.append(_text(left + plot_w / 2, h - 8, "batch size", "middle"))
    body += _legend([f"vs {b}" for b in bases], left + plot_w + 16, top + 10)
    return _svg(w, h, body, f"speedup of {name} by batch")


# -- step time by stage, per concurrency --------------------------------------------------


def stage_table(ev: Evidence) -> tuple[list[str], list[dict[str, Any]]]:
    """Stages present (pipeline order, nested last) and one row per profiled concurrency."""
    if ev.profile is None:
        return [], []
    seen = {s for lv in ev.profile.levels for s in lv.stage_ms}
    stages = [s for s in STAGES if s in seen] + sorted(seen - set(STAGES))
    rows = []
    for lv in ev.profile.levels:
        rows.append(
            {
                "c": lv.concurrency,
                "batch": (lv.model_extra or {}).get("batch"),
                "step": lv.step_ms,
                "stages": lv.stage_ms,
                "tokens_per_s": lv.tokens_per_s,
                "accept_length": lv.accept_length,
            }
        )
    return stages, rows


def stage_chart(ev: Evidence) -> str:
    """Horizontal stacked bars: each concurrency's step time split into its stages."""
    stages, rows = stage_table(ev)
    flat = [s for s in stages if s not in NESTED_STAGES]
    if not rows:
        return ""
    longest = max(r["step"].value for r in rows) or 1.0
    w, left, bar_h, legend_w = 600, 60, 26, 170
    plot_w = w - left - legend_w - 20
    h = 40 + len(rows) * (bar_h + 14) + 30
    body = [_text(left, 16, "step time by stage (ms)", extra='font-weight="bold"')]
    for i, r in enumerate(rows):
        y = 30 + i * (bar_h + 14)
        body.append(_text(left - 6, y + bar_h / 2 + 4, f"c={r['c']}", "end"))
        x = float(left)
        for si, s in enumerate(flat):
            v = r["stages"].get(s)
            if v is None or v.value <= 0:
                continue
            wd = plot_w * v.value / longest
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{wd:.1f}" height="{bar_h}" '
                f'fill="{PALETTE[si % len(PALETTE)]}"><title>{escape(s)} '
                f"{v.value:.3g} ms</title></rect>"
            )
            for nested, parent in NESTED_STAGES.items():  # e.g. attention: a strip inside verify
                inner = r["stages"].get(nested)
                if parent == s and inner is not None and inner.value > 0:
                    body.append(
                        f'<rect x="{x:.1f}" y="{y + bar_h * 0.6:.1f}" '
                        f'width="{plot_w * inner.value / longest:.1f}" height="{bar_h * 0.4:.1f}" '
                        f'fill="#333" fill-opacity="0.55"><title>{escape(nested)} '
                        f"{inner.value:.3g} ms (inside {escape(parent)})</title></rect>"
                    )
            x += wd
        step = r["step"].value
        other = step - sum(r["stages"][s].value for s in flat if s in r["stages"])
        if other > step * 0.005:
            wd = plot_w * other / longest
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{wd:.1f}" height="{bar_h}" fill="#bbb"/>'
            )
        body.append(_text(left + plot_w * step / longest + 4, y + bar_h / 2 + 4, f"{step:.3g}"))
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(flat))] + ["#bbb"]
    names = flat + ["other"]
    for nested, parent in NESTED_STAGES.items():
        if nested in stages:
            names.append(f"{nested} (in {parent})")
            colors.append("#777")
    body += _legend(names, w - legend_w + 10, 40, colors)
    return _svg(w, h, body, "step time by stage per concurrency")


# -- predicted vs measured gain ----------------------------------------------------------


def gain_chart(decision: Decision) -> str:
    """Predicted (with its spread) beside measured (with the A/A noise) gain per concurrency."""
    rows = [r for r in decision.amdahl if r.gain is not None and r.measured_gain is not None]
    if not rows:
        return ""
    vals = [0.0, decision.threshold]
    for r in rows:
        vals += [r.gain_lo or 0, r.gain_hi or 0, (r.measured_gain or 0) + (r.aa_noise or 0)]
        vals.append((r.measured_gain or 0) - (r.aa_noise or 0))
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.1 or 0.01
    lo, hi = lo - pad, hi + pad
    w, h, left, top, plot_h = 560, 266, 60, 30, 180
    plot_w = w - left - 100

    def y_of(v: float) -> float:
        return top + plot_h * (hi - v) / (hi - lo)

    body = [_text(left, 16, "predicted vs measured gain", extra='font-weight="bold"')]
    for v in _ticks(lo, hi):
        y = y_of(v)
        body.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        )
        body.append(_text(left - 4, y + 4, f"{v:+.0%}" if abs(v) >= 0.1 else f"{v:+.1%}", "end"))
    for v, dash in ((0.0, ""), (decision.threshold, ' stroke-dasharray="4 3"')):
        y = y_of(v)
        body.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#888"{dash}/>'
        )
        if v:
            label = f"threshold {v:+.1%}"
            body.append(_text(left + plot_w + 4, y + 4, label, extra='font-size="10" fill="#555"'))
    group = plot_w / len(rows)
    for i, r in enumerate(rows):
        x0 = left + i * group + group * 0.15
        bw = group * 0.33
        pairs = ((r.gain, r.gain_lo, r.gain_hi), (r.measured_gain, None, None))
        for j, (v, a, b) in enumerate(pairs):
            if j == 1 and r.aa_noise is not None and v is not None:
                a, b = v - r.aa_noise, v + r.aa_noise
            x = x0 + j * (bw + 4)
            y, y0 = y_of(v or 0), y_of(0)
            body.append(
                f'<rect x="{x:.1f}" y="{min(y, y0):.1f}" width="{bw:.1f}" '
                f'height="{abs(y0 - y):.1f}" fill="{PALETTE[j]}"/>'
            )
            if a is not None and b is not None:
                xm = x + bw / 2
                body.append(
                    f'<line x1="{xm:.1f}" x2="{xm:.1f}" y1="{y_of(a):.1f}" '
                    f'y2="{y_of(b):.1f}" stroke="#000"/>'
                )
            top_y = min(y, y0, y_of(b) if b is not None else y)
            body.append(_text(x + bw / 2, top_y - 3, pct(v, 1), "middle", 'font-size="10"'))
        body.append(
            _text(left + i * group + group / 2, top + plot_h + 16, f"c={r.concurrency}", "middle")
        )
    for j, name in enumerate(("predicted (IQR ends)", "measured (A/A noise)")):
        x = left + j * 190
        body.append(f'<rect x="{x}" y="{h - 17}" width="10" height="10" fill="{PALETTE[j]}"/>')
        body.append(_text(x + 14, h - 8, name))
    return _svg(w, h, body, "predicted vs measured gain")


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About n round values between lo and hi (1, 2 or 5 times a power of ten apart)."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 0.01
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    v = math.ceil(lo / step) * step
    out = []
    while v <= hi + 1e-12:
        out.append(round(v, 12))
        v += step
    return out


# -- the documents ------------------------------------------------------------------------


def _v(v: Any, unit: str = "", fmt: str = ".3g") -> str:
    """A profile Value as text; a derived number is marked with '*'."""
    if v is None:
        return "-"
    star = "*" if v.source == "derived" else ""
    spread = f" ({v.lo:{fmt}}..{v.hi:{fmt}})" if v.lo != v.value or v.hi != v.value else ""
    return f"{v.value:{fmt}}{star}{spread}{unit}"


def _range(
    v: float | None,
    lo: float | None,
    hi: float | None,
    fmt: Callable[[float], str],
    head: Callable[[float], str] | None = None,
) -> str:
    """'v (lo..hi)', or just 'v' when there is no spread."""
    if v is None:
        return "-"
    text = (head or fmt)(v)
    if lo is None or hi is None or fmt(lo) == fmt(hi):
        return text
    return f"{text} ({fmt(lo)}..{fmt(hi)})"


def amdahl_notes(d: Decision) -> list[str]:
    """The Amdahl rows' notes, one line per distinct note with the concurrencies it holds for."""
    by_note: dict[str, list[str]] = {}
    for r in d.amdahl:
        if r.note:
            by_note.setdefault(r.note, []).append(str(r.concurrency))
    return [f"c={', '.join(cs)}: {note}" for note, cs in by_note.items()]


def amdahl_table(d: Decision) -> list[dict[str, str]]:
    out = []
    for r in d.amdahl:
        sp = r.speed
        clears = {True: "yes", False: "no", None: "-"}[r.clears]
        measured = "-"
        if r.measured_gain is not None:
            measured = pct(r.measured_gain, 2) + (
                f" (A/A {pct(r.aa_noise, 2)})" if r.aa_noise is not None else ""
            )
        interval = inside = "-"
        if r.measured_lo is not None and r.measured_hi is not None:
            interval = f"{pct(r.measured_lo, 2)}..{pct(r.measured_hi, 2)}"
            if r.gain is not None:
                inside = "yes" if r.measured_lo <= r.gain <= r.measured_hi else "no"
        out.append(
            {
                "c": str(r.concurrency)
                + (" (target)" if r.concurrency == d.target_concurrency else ""),
                "f": _range(r.f, r.f_lo, r.f_hi, lambda x: f"{x:.3%}"),
                "f_source": r.f_source or "-",
                "s": "-" if sp is None else _range(sp.s, sp.lo, sp.hi, lambda x: f"{x:.4g}", times),
                "s_at": "-"
                if sp is None
                else (
                    sp.note
                    if sp.source == "shadow"
                    else f"B={sp.batch}" + (f"; {sp.note}" if sp.note else "")
                ),
                "step": "-" if r.step_shorter is None else f"{r.step_shorter:.3%}",
                "gain": "-"
                if r.gain is None
                else f"{pct(r.gain)} ({pct(r.gain_lo)}..{pct(r.gain_hi)})",
                "ceiling": pct(r.ceiling),
                "measured": measured,
                "median": "-" if r.measured_median is None else pct(r.measured_median, 2),
                "diff": "-"
                if r.measured_gain is None or r.gain is None
                else f"{(r.measured_gain - r.gain) * 100:+.1f} pp",
                "clears": clears,
                "s_bench": _bench_s(r),
                "s_service": _service_s(r.service_speedup),
                "interval": interval,
                "inside": inside,
                "note": r.note,
            }
        )
    return out


def _bench_s(r: AmdahlRow) -> str:
    """The s the projection used, and where it came from the shadow, the bench's beside it."""
    sp, pre = r.speed, r.prefill_speed
    if sp is None:
        return "-"
    used = times(sp.s) + ("" if pre is None else f" (prefill {times(pre.s)})")
    if sp.source != "shadow" and (pre is None or pre.source != "shadow"):
        return used
    b, bp = r.bench_speed or (sp if sp.source == "bench" else None), r.bench_prefill_speed
    bench = "-" if b is None else times(b.s)
    if pre is not None:
        bench += f" (prefill {'-' if bp is None else times(bp.s)})"
    return f"{used} in the service's own forwards (shadow); bench {bench}"


def _service_s(sp: dict[str, float] | None) -> str:
    """The stage's speedup the service saw (seconds per output token, before / after)."""
    if not sp or "total" not in sp:
        return "-"
    parts = [f"{k} {times(sp[k])}" for k in ("steps", "prefill") if k in sp]
    return times(sp["total"]) + (f" ({', '.join(parts)})" if len(parts) > 1 else "")


def speedup_tables(series: dict[str, dict[str, dict[int, list[float]]]]) -> dict[str, list]:
    out = {}
    for name, per in series.items():
        rows = []
        for base, by_b in sorted(per.items()):
            for b, vals in sorted(by_b.items()):
                spread = f" ({min(vals):.3g}..{max(vals):.3g}, {len(vals)} shapes)"
                rows.append(
                    {
                        "batch": b,
                        "baseline": base,
                        "speedup": f"{statistics.median(vals):.3g}x"
                        + (spread if len(vals) > 1 else ""),
                    }
                )
        out[name] = rows
    return out


def kernel_table(rows: list[KernelRow]) -> list[dict[str, str]]:
    return [
        {
            "suite": r.suite,
            "kernel": r.kernel,
            "impl": r.impl,
            "shape": " ".join(f"{k}={v}" for k, v in r.shape.items()),
            "median": f"{r.median_us:.4g}",
            "iqr": f"{r.lo_us:.4g}..{r.hi_us:.4g}",
            "reps": "-" if r.reps is None else str(r.reps),
            "speedup": " ".join(f"{k}:{v:.3g}x" for k, v in r.speedup.items()) or "-",
            "refcheck": {True: "exact", False: "DIFFERS", None: "-"}[r.refcheck],
        }
        for r in rows
    ]


def profile_table(ev: Evidence) -> tuple[list[str], list[dict[str, Any]]]:
    stages, rows = stage_table(ev)
    out = []
    for r in rows:
        out.append(
            {
                "c": r["c"],
                "batch": "-" if r["batch"] is None else str(r["batch"]),
                "step": _v(r["step"]),
                "stages": [_v(r["stages"].get(s)) for s in stages],
                "tokens_per_s": _v(r["tokens_per_s"], fmt=".4g"),
                "accept_length": _v(r["accept_length"]),
            }
        )
    return stages, out


def identity_rows(ev: Evidence) -> list[dict[str, str]]:
    """Per flight that compared with the golden set: the A/A runs first, then the identity."""
    out = []
    for h in ev.health:
        i = (h.report.modules.get("identity") if h.report else None) or {}
        if h.golden_recorded or "identity_pct" not in i:
            continue
        out.append(
            {
                "role": h.role,
                "aa_runs": str(i.get("aa_runs") or 0),
                "aa_text": aa_runs_text(i.get("aa_runs") or 0),
                "nondeterministic": ", ".join(map(str, i.get("nondeterministic") or [])) or "none",
                "identity": f"{i['identity_pct']}% ({i.get('matched')}/{i.get('total')})",
                "concurrency": str(i.get("concurrency", 1)),
                "mismatched": ", ".join(map(str, i.get("mismatched") or [])) or "none",
            }
        )
    return out


def probes(ev: Evidence) -> list[dict[str, Any]]:
    out = []
    for path, b in ev.bench:
        p = b.probe
        row: dict[str, Any] = {
            "record": path,
            "guard": b.guard,
            "probe": p,
            "gpu": b.gpu,
            "cvd": b.cuda_visible_devices,
            "rise": None,  # no p50 before (no sample): unmeasured
        }
        if p is not None and p.p50_before_ms:
            row["rise"] = pct((p.p50_during_ms or 0) / p.p50_before_ms - 1, 1)
        if p is not None:  # the section leads with it: what the bench cost the service
            row["cost"] = cost_line(service_cost(p.before_ms, p.during_ms))
        out.append(row)
    return out


def target_text(d: Decision, ev: Evidence) -> str:
    """The concurrency the verdict is for, or why there is none."""
    if d.target_concurrency is not None:
        c = d.target_concurrency
        cap = (ev.profile.service.get("engine") or {}).get("max_batch_size") if ev.profile else None
        if isinstance(cap, int) and not isinstance(cap, bool) and 0 < cap < c:
            # the service batches at most `cap`: a level of c requests ran at batch cap (#39)
            return f"{c} (the service batches at most {cap}: this level ran at batch {cap})"
        return str(c)
    if ev.profile is None:
        return "none (no profile record)"
    return "none (the profile measured no level)"


def context(decision: Decision, ev: Evidence, sources: list[str]) -> dict[str, Any]:
    rows = [r for _, b in ev.bench for r in b.rows]
    series = speedup_series(rows)
    stages, prof = profile_table(ev)
    verdict_class = {"GO": "go", "NO-GO": "nogo", "HOLD": "hold"}[decision.verdict]
    return {
        "d": decision,
        "ev": ev,
        "bench_rows": bool(rows),
        "vclass": verdict_class,
        "target": target_text(decision, ev),
        "sources": sources,
        "amdahl": amdahl_table(decision),
        "amdahl_notes": amdahl_notes(decision),
        "shadow_used": any(
            sp is not None and sp.source == "shadow"
            for r in decision.amdahl
            for sp in (r.speed, r.prefill_speed)
        ),
        "audit": audit_rows(decision, ev),
        "audit_lines": audit_lines(decision, ev),
        "drift_lines": drift_lines(decision, ev),
        "baseline_lines": baseline_lines(decision, ev),
        "precision_lines": precision_lines(decision, ev),
        "gain_interval": GAIN_INTERVAL,
        "kernels": kernel_table(rows),
        "speedups": speedup_tables(series),
        "speedup_charts": {k: speedup_chart(k, v) for k, v in series.items()},
        "stages": stages,
        "profile": prof,
        "stage_chart": stage_chart(ev),
        "gain_chart": gain_chart(decision),
        "probes": probes(ev),
        "health": ev.health,
        "identity": identity_rows(ev),
    }


def md_text(value: Any) -> Any:
    """A value as report.md prints it: `&` and `<` as entities, so no text from a record (a
    check's detail, a path, a GPU name) becomes raw HTML (`<script>`, `<img onerror=...>`) or an
    entity where the markdown is rendered; a reader sees the same characters. The md
    template's `finalize`: every `{{ ... }}` passes through it."""
    if isinstance(value, Undefined):
        return value  # StrictUndefined still raises where it is printed
    return str(value).replace("&", "&amp;").replace("<", "&lt;")


def _env(autoescape: bool) -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=autoescape,
        finalize=None if autoescape else md_text,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(pct=pct, num=num, cell=cell, na=na)
    return env


def render(fmt: str, ctx: dict[str, Any]) -> str:
    """The report as `md` or `html`."""
    return _env(autoescape=fmt == "html").get_template(f"report.{fmt}.j2").render(**ctx)
