"""`ops bench` and `ops profile`: the measurements a verdict is made from.

`ops bench` exits 0 pass, 1 NO-GO (interference: the bench was stopped) or fail (the bench
failed, a kernel disagreed with its reference), 2 refused by the GPU guard or bad input,
3 HOLD (no GPU on the target; or the service did not answer, so interference was not
measured). `ops profile` exits 0 when every level is complete, 1 when requests failed,
3 HOLD when a level lacks a number a decision needs. Both write a run record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from checks.vocabulary import NESTED_STAGES
from ops.cli.common import (
    Done,
    InputLenOpt,
    InventoryOpt,
    JsonOpt,
    OutputLenOpt,
    RequestsOpt,
    RequestTimeoutOpt,
    TargetArg,
    command,
    err,
    escape,
    on_target,
    out,
    say_service_down,
    state,
)
from ops.errors import (
    EXIT_FAIL,
    EXIT_HOLD,
    EXIT_INTERRUPTED,
    EXIT_OK,
    OpsError,
    interrupt_said,
)
from ops.hosts.remote import Host
from ops.measure.bench import MAX_BENCH_S
from ops.measure.counters import STAGES
from ops.measure.loadtest import parse_levels
from ops.measure.profile import MAX_BUDGET, MAX_DEPTH, MAX_TOPK
from ops.verdict.service_cost import cost_parts

SUITE_HELP = (
    "Suites: topk,tree,accept,attn,engine_attn (engine_attn: the reference engine's own "
    "attention stage, built as the service runs it; a diagnostic)."
)

if TYPE_CHECKING:  # each command imports its own module when it runs (a fast `ops` start)
    from rich.table import Table

    from ops.measure.bench import BenchOutcome
    from ops.sections.bench import BenchSection, ProbeWindow, TableLine
    from ops.sections.profile import ProfileLevel, ProfileSection


@command
def bench(
    ctx: typer.Context,
    target: TargetArg,
    gpu: Annotated[
        int | None, typer.Option("--gpu", min=0, help="GPU index (default: bench_gpu).")
    ] = None,
    suite: Annotated[str, typer.Option(help=SUITE_HELP)] = "topk,tree,accept",
    batch: Annotated[str, typer.Option(help="Batch sizes, e.g. 1,8,64.")] = "1,8,64",
    allow_shared: Annotated[
        bool,
        typer.Option("--allow-shared", help="Bench on a GPU in use, memory capped, probed."),
    ] = False,
    probe_threshold: Annotated[
        float, typer.Option(min=0.0, help="Allowed rise of the service's p50 (0.10 = 10%).")
    ] = 0.10,
    probe_interval: Annotated[
        float,
        typer.Option(min=0.0, max=60.0, help="Seconds between the probe's requests."),
    ] = 0.05,
    max_mem_gib: Annotated[
        float | None, typer.Option(min=0.1, help="Cap on the bench's GPU memory (GiB).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1.0, max=MAX_BENCH_S, help="The bench's time limit (s).")
    ] = 1800.0,
    decode_spread: Annotated[
        int,
        typer.Option(
            min=0,
            max=65536,
            help="attn and engine_attn, a diagnostic: spread the decode step's requests' "
            "prefixes over N tokens (0: all at one prefix, as a load of one prompt keeps them).",
        ),
    ] = 0,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Benchmark the kernels on one GPU of TARGET: guarded, with the interference probe."""
    from ops.measure.bench import BenchOptions, parse_batches, parse_suites, run_bench

    t = state(ctx).target(target)
    n = gpu if gpu is not None else t.bench_gpu  # None: the guard asks (or HOLDs)
    opts = BenchOptions(
        gpu=n,
        suites=parse_suites(suite),
        batches=parse_batches(batch),
        allow_shared=allow_shared,
        threshold=probe_threshold,
        probe_interval=probe_interval,
        max_mem_gib=max_mem_gib,
        timeout=timeout,
        decode_spread=decode_spread,
    )

    def go(host: Host) -> Done[BenchOutcome]:
        with err.status("bench", spinner="dots") as status:
            o = run_bench(host, opts, lambda s: status.update(f"bench {host.name}: {s}"))
        return Done(o.code, o.outcome, o, o.section.record())

    return on_target(
        ctx, "bench", target, opts.model_dump(), go, _show_bench, doc=_bench_doc, always=_say
    )


def _bench_doc(done: Done[BenchOutcome]) -> dict[str, Any]:
    o = done.result
    doc = {"ok": o.section.ok, "outcome": o.outcome, **done.section}
    if o.message:
        doc.update(message=o.message, hint=o.hint)
    return doc


LABEL = {
    "no-go": "[bold red]NO-GO:[/]",
    "fail": "[bold red]fail:[/]",
    "refused": "[bold red]error:[/]",
    "hold": "[yellow]HOLD:[/]",
}


def _say(done: Done[BenchOutcome]) -> None:
    """The one line that says why, on stderr (a refusal reads like every other exit-2 error)."""
    o = done.result
    if o.outcome == "pass":
        return
    err.print(f"{LABEL[o.outcome]} {escape(o.message)}", soft_wrap=True)
    if o.hint:
        err.print(f"[dim]hint: {escape(o.hint)}[/]", soft_wrap=True)


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}"
    if v < 100:
        return f"{v:.1f}"
    return f"{v:.0f}" if v < 100_000 else f"{v / 1000:.0f}k"


def _x(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" if v < 10 else f"{v:.0f}x"


def kernel_tables(table: list[TableLine]) -> list[Table]:
    """One table per kernel that fits 80 columns: times in us, speedup = baseline / ours.

    Columns no row of a kernel has (e.g. CPU baselines of top-k) are left out.
    """
    from rich import box
    from rich.table import Table

    by_kernel: dict[str, list[TableLine]] = {}
    for g in table:
        by_kernel.setdefault(f"{g.kernel} ({g.suite})", []).append(g)
    cols: list[tuple[str, Callable[[TableLine], str]]] = [
        ("size", lambda g: g.size),
        ("ours", lambda g: _us(g.ours_us)),
        ("IQR", lambda g: _us(g.ours_iqr_us)),
        ("graph", lambda g: _us(g.graph_us)),
        ("python", lambda g: _us(g.cpu_python_us)),
        ("c++", lambda g: _us(g.cpu_cpp_us)),
        ("torch", lambda g: _us(g.torch_us)),
        ("x py", lambda g: _x(g.speedup.get("cpu_python"))),
        ("x c++", lambda g: _x(g.speedup.get("cpu_cpp"))),
        ("x torch", lambda g: _x(g.speedup.get(g.torch_impl or "torch"))),
    ]
    tables = []
    for name, rows in by_kernel.items():
        cells = [[fn(g) for _, fn in cols] for g in rows]
        keep = [i for i in range(len(cols)) if i == 0 or any(c[i] != "-" for c in cells)]
        t = Table(
            title=name,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        for i in keep:
            t.add_column(cols[i][0], justify="left" if i == 0 else "right", overflow="fold")
        for c in cells:
            t.add_row(*(c[i] for i in keep))
        tables.append(t)
    return tables


def _show_bench(o: BenchOutcome) -> None:
    _print_bench(o.section)


def _print_bench(sec: BenchSection) -> None:
    env = sec.environment
    gpu = "(no GPU)" if sec.gpu is None else f"GPU {sec.gpu}"
    out.print(f"[bold]bench {escape(sec.target)}[/] {gpu}")
    p = sec.probe
    if p is not None:  # what the bench cost the service comes first
        out.print("  cost to the service while it ran (probe request latency):")
        for part in cost_parts(sec.service_cost):
            out.print(f"    {escape(part)}", soft_wrap=True)
    for line in sec.guard.findings if sec.guard else []:
        out.print(f"  guard: {escape(line)}", soft_wrap=False, overflow="fold")
    if env.get("gpu_uuid"):
        out.print(
            f"  env: {escape(str(env.get('gpu_name')))} {env.get('gpu_uuid')} driver "
            f"{env.get('driver')} SM {env.get('sm_clock_mhz')} MHz, "
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')}, "
            f"release {escape(str(env.get('release', '-')))}",
            overflow="fold",
        )
    if p is not None:

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        def n(w: ProbeWindow | None, samples: list[float]) -> int:
            return w.n if w is not None else len(samples)

        out.print(
            f"  probe: p50 before {ms(p.p50_before_ms)} ms ({n(p.before, p.before_ms)}), during "
            f"{ms(p.p50_during_ms)} ms ({n(p.during, p.during_ms)}), after "
            f"{ms(p.p50_after_ms)} ms ({n(p.after, p.after_ms)}); limit +{p.threshold:.0%}"
            + (" [bold red]TRIPPED[/]" if p.tripped else ""),
            overflow="fold",
        )
        for w in p.warnings:
            out.print(f"  probe: [yellow]warning:[/] {escape(w)}", overflow="fold")
    tables = kernel_tables(sec.table)
    if tables:
        out.print(
            "kernels: median us (ours: CUDA events per call, IQR of ours; graph: per launch in "
            "a CUDA graph); x BASELINE = baseline / ours",
            overflow="fold",
        )
    for t in tables:
        out.print(t)
    verdict = {True: "[green]PASS[/]", False: "[bold red]not passed[/]"}[sec.ok]
    out.print(f"bench {escape(sec.target)}: {verdict}")


@command
def profile(
    ctx: typer.Context,
    target: TargetArg,
    concurrency: Annotated[
        str, typer.Option("--concurrency", "-c", help="Levels, e.g. 1,8,32.")
    ] = "1,8,32",
    requests: RequestsOpt = 0,
    input_len: InputLenOpt = 32,
    output_len: OutputLenOpt = 32,
    timeout: RequestTimeoutOpt = 120.0,
    accept_length: Annotated[
        float | None,
        typer.Option(min=1.0, help="Accept length, for a service that reports none."),
    ] = None,
    component: Annotated[
        str, typer.Option(help="Derived path: the component to time (tree_build, accept).")
    ] = "tree_build",
    baseline: Annotated[
        str, typer.Option(help="Derived path: the service's implementation (python, cpp).")
    ] = "python",
    budget: Annotated[
        int, typer.Option(min=1, max=MAX_BUDGET, help="Derived path: tree budget.")
    ] = 64,
    topk: Annotated[
        int, typer.Option(min=1, max=MAX_TOPK, help="Derived path: K per position.")
    ] = 8,
    depth: Annotated[
        int, typer.Option(min=1, max=MAX_DEPTH, help="Derived path: drafted positions H.")
    ] = 15,
    shadow: Annotated[
        str | None,
        typer.Option(
            help="COMPONENT=KIND (attention=cuda, tree_build=cuda): time that backend "
            "beside the serving one on the service's own forwards, in a load window "
            "of its own per level."
        ),
    ] = None,
    run_seconds: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1800.0,
            help="> 0: an uncounted pilot of --requests first, then each level's window (and "
            "its shadow window) sized to last about this long at the pilot's tokens/s; 0: "
            "every window is --requests.",
        ),
    ] = 0.0,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Where the service's step time goes, per concurrency: stage times, shares, tokens/s."""
    from ops.measure.profile import ProfileInterrupted, ProfileOptions, run_profile

    levels = parse_levels(concurrency)
    state(ctx).target(target)  # an unknown target is refused before the options are
    if component not in ("tree_build", "accept") or baseline not in ("python", "cpp"):
        raise OpsError(
            f"--component takes tree_build or accept and --baseline python or cpp, got "
            f"{component!r} / {baseline!r}"
        )
    if shadow is not None:
        from ops.measure.shadow import SHADOW_KINDS

        comp, _, kind = shadow.partition("=")
        if kind not in SHADOW_KINDS.get(comp, ()):
            raise OpsError(
                f"--shadow takes COMPONENT=KIND, the component attention or tree_build and one "
                f"of its backends (attention=torch|cuda, tree_build=reference|cpp|cuda), got "
                f"{shadow!r}"
            )
    opts = ProfileOptions(
        levels=levels,
        requests=requests,
        input_len=input_len,
        output_len=output_len,
        timeout=timeout,
        accept_length=accept_length,
        component=component,  # type: ignore[arg-type]
        baseline=baseline,
        budget=budget,
        topk=topk,
        depth=depth,  # type: ignore[arg-type]
        shadow=shadow,
        run_seconds=run_seconds,  # type: ignore[arg-type]
    )

    def go(host: Host) -> Done[ProfileSection]:
        try:
            with err.status("profile", spinner="dots") as status:
                sec = run_profile(
                    host, opts, lambda c: status.update(f"profile {host.name}: c={c} done")
                )
        except ProfileInterrupted as stop:  # the finished levels go into the record
            return Done(EXIT_INTERRUPTED, "interrupted", stop.section, stop.section.record())
        if sec.failed_requests or sec.service_down:
            return Done(EXIT_FAIL, "fail", sec, sec.record())
        if sec.incomplete:
            return Done(EXIT_HOLD, "hold", sec, sec.record())
        return Done(EXIT_OK, "pass", sec, sec.record())

    return on_target(
        ctx, "profile", target, opts.model_dump(), go, _print_profile, always=_profile_why
    )


def _profile_why(done: Done[ProfileSection]) -> None:
    """Why a profile is not a pass (HOLD: the numbers a level lacks; fail: failed requests)."""
    from ops.measure.profile import INTERRUPTED

    sec = done.result
    if sec.service_down:
        say_service_down(sec.url or "", sec.service_down, sec.target)
        return
    if sec.interrupted is not None:
        left = sec.interrupted.levels_left
        err.print(
            f"[yellow]interrupted:[/] c={', '.join(map(str, left))} not profiled "
            f"({interrupt_said()}); the "
            "levels that finished are in the record"
            if left
            else f"[yellow]interrupted[/] ({interrupt_said()}) after the last level: every level "
            "is in the record",
            soft_wrap=True,
        )
    for inc in sec.incomplete:
        if inc.missing == [INTERRUPTED]:
            continue
        err.print(
            f"[yellow]HOLD:[/] c={inc.concurrency}: missing "
            + escape("; ".join(inc.missing) or "the step time"),
            soft_wrap=True,
        )
    if sec.failed_requests:
        err.print(f"[bold red]fail:[/] {sec.failed_requests} requests failed")


def batch_cap(sec: ProfileSection) -> int | None:
    """The most requests the service batches in one step, where it says (the engine does)."""
    cap = (sec.service.get("engine") or {}).get("max_batch_size")
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


def _level_line(lv: ProfileLevel, cap: int | None = None) -> str:
    """One level's own numbers, on the line above its stages: `name=value` items, so a narrow
    terminal wraps between items, never inside one. A level above the service's batch cap
    says so: c=32 on a service that batches 8 measures batch 8, not 32."""
    parts = [f"c={lv.concurrency}", f"batch={lv.batch}"]
    if cap is not None and lv.concurrency > cap:
        parts.append(f"(capped: the service batches at most {cap})")
    parts.append(f"step={lv.step_ms.value:.2f}ms")
    if tok := lv.tokens_per_s:
        parts.append(f"tok/s={tok.value:.1f}")
    if acc := lv.accept_length:
        parts.append(f"accept={acc.value:.2f}")
    return "  ".join(parts)


def _print_profile(sec: ProfileSection) -> None:
    """Per level: a line with its own numbers, then its stages in a table of four short
    columns (fits 40 columns); no cell ever wraps: a number split over two lines reads as two
    numbers. A stage inside another (attention inside verify) is indented under it, and a
    line says so. The source column appears only where a stage's number is not measured."""
    from rich import box
    from rich.table import Table

    if not sec.levels:
        return
    out.print(f"profile {escape(sec.target)}: ms per step, share of the step, f")
    for lv in sec.levels:
        out.print(escape(_level_line(lv, batch_cap(sec))))
        stages = [s for s in STAGES if s in lv.stage_ms]
        if not stages:
            continue
        mixed = any(lv.stage_ms[s].source != "measured" for s in stages)
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        for h in ("stage", "ms", "share", "f", *(("source",) if mixed else ())):
            left = h in ("stage", "source")
            t.add_column(h, justify="left" if left else "right", no_wrap=True)
        for s in stages:
            v = lv.stage_ms[s]
            wall = lv.wall_share.get(s)
            inside = NESTED_STAGES.get(s)
            t.add_row(
                f"  {s}" if inside else s,
                f"{v.value:.3g}",
                f"{v.value / lv.step_ms.value:.1%}",
                "-" if wall is None else f"{wall.value:.1%}",
                *((v.source,) if mixed else ()),
            )
        out.print(t)
        for s in stages:
            if inside := NESTED_STAGES.get(s):
                out.print(f"{s} is part of {inside} (its share is inside {inside}'s)")
    derived = [lv for lv in sec.levels if lv.method == "derived"]
    for lv in derived[:1]:
        out.print(f"derived: {escape(lv.step_ms.note)}", overflow="fold")
        out.print(f"derived: f is step-based: {escape(lv.f_basis or '')}", overflow="fold")
    if any(lv.wall_share for lv in sec.levels):
        out.print(
            "f: the stage's share of the measured window's wall time (its seconds over all the "
            "window's steps, any batch size, and prefills / the window's wall seconds); share: "
            "of the step at the batch shown",
            overflow="fold",
        )
    from ops.measure.shadow import shadow_lines

    for line in shadow_lines(sec):
        out.print(escape(line), overflow="fold")
