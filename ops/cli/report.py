"""`ops report RUN_DIR...`: GO / NO-GO / HOLD and its reasons, rendered from records alone.

Reads every record.json under the given run directories (healthcheck, bench, profile,
measure, rollout and its step sub-records), decides (ops.verdict.decide), writes report.md /
report.html / report.json atomically into `--out` or a new `runs/<utc>-report-<target>/`,
and exits 0 GO, 1 NO-GO, 3 HOLD, 2 for a bad record (one line naming the file and field).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from ops.cli.common import (
    InventoryOpt,
    JsonOpt,
    command,
    emit_json,
    err,
    escape,
    out,
    record_error,
    say_record,
    state,
)
from ops.errors import OpsError
from ops.hosts.records import RunDir
from ops.verdict.reports import (
    build,
    report_doc,
    summary,
    write_reports,
)

if TYPE_CHECKING:  # imported where used: `ops` starts without the report's models
    from ops.sections.change import Change
    from ops.verdict.decide import Decision

FORMATS = ("md", "html")
STYLE = {"GO": "bold green", "NO-GO": "bold red", "HOLD": "bold yellow"}


def parse_change(text: str | None, shape: str | None) -> Change | None:
    """`tree_build:reference->cuda` (or `tree_build:reference:cuda`) and `budget=16,K=8`."""
    from ops.sections.change import Change

    if text is None:
        if shape:
            raise OpsError("--shape needs --change")
        return None
    comp, _, rest = text.partition(":")
    base, sep, cand = rest.partition("->")
    if not sep:
        base, _, cand = rest.partition(":")
    pins: dict[str, Any] = {}
    for item in (shape or "").split(","):
        if item.strip():
            k, eq, v = item.partition("=")
            if not eq or not k.strip():
                raise OpsError(f"--shape takes KEY=VALUE,...; got {item!r}")
            pins[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
    doc = {"component": comp, "baseline": base, "candidate": cand, "shape": pins}
    try:
        return Change.model_validate(doc)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise OpsError(
            f"--change {text!r}: {e['loc'][0]}: {e['msg']}",
            hint="COMPONENT:FROM->TO, quoted for the shell (its > redirects): "
            "--change 'tree_build:reference->cuda', or tree_build:reference:cuda",
        ) from None


def parse_formats(text: str) -> list[str]:
    fmts = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise OpsError(f"--format takes md,html; got {text!r}")
    return list(dict.fromkeys(fmts))


def _ensure_dir(path: Path) -> None:
    """--out: an existing directory, or one it can make; anything else is exit 2, one line."""
    if path.exists() and not path.is_dir():
        raise OpsError(f"--out {path}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".ops-report-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise OpsError(f"--out {path}: cannot write there ({exc.strerror or exc})") from None


@command
def report(
    ctx: typer.Context,
    run_dirs: Annotated[
        list[Path],
        typer.Argument(metavar="RUN_DIR", help="Run directories (or record.json files)."),
    ],
    out: Annotated[
        str | None,
        typer.Option("--out", metavar="DIR", help="Where to write (default: a new run dir)."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="md, html or md,html.")] = "md,html",
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Projected end-to-end gain needed for GO (0.03 = 3%). Default: the one the "
            "records were decided at, else 0.03."
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency", "-c", help="Target concurrency (default: the highest profiled).", min=1
        ),
    ] = None,
    change: Annotated[
        str | None,
        typer.Option(
            help="The change, e.g. 'tree_build:reference->cuda' (quoted: a shell reads > "
            "as a redirect) or tree_build:reference:cuda (default: from records)."
        ),
    ] = None,
    shape: Annotated[
        str | None, typer.Option(help="Pin bench shape keys for s(c), e.g. budget=16,K=8.")
    ] = None,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """GO / NO-GO / HOLD from records: Amdahl per concurrency, kernels, health, interference."""
    from ops.verdict.evidence import record_files, unfinished_line

    if out is not None and not out.strip():
        raise OpsError("--out: an empty path; name a directory (--out . for this one)")
    out_dir = Path(out) if out is not None else None
    fmts = parse_formats(fmt)
    ch = parse_change(change, shape)
    record_files(run_dirs)  # a missing dir or file is exit 2 before anything is written
    ev, d, sources = build(run_dirs, threshold=threshold, concurrency=concurrency, change=ch)
    inputs = {
        "run_dirs": [str(p) for p in run_dirs],
        "threshold": d.threshold,
        "concurrency": concurrency,
        "change": change,
        "shape": shape,
        "format": fmts,
    }
    if out_dir is None:
        run = RunDir.create("report", ev.target or "unknown", inputs=inputs)
        dest = run.path
    else:
        run, dest = None, out_dir
        _ensure_dir(out_dir)
    try:
        files = write_reports(dest, fmts, ev, d, sources)
    except OpsError as exc:  # the report is this command's product: its own error (exit 2)
        if run is not None:
            run.write_record(
                inputs=inputs, outcome="error", exit_code=exc.exit_code, error=exc.to_dict()
            )
        raise
    if run is not None:
        run.write_record(
            inputs=inputs,
            outcome=d.verdict,
            exit_code=d.exit_code,
            decision=summary(d, sources),
            files=files,
        )
    if state(ctx).as_json:
        doc = {**report_doc(d, ev, sources), "out_dir": str(dest), "files": files}
        emit_json({**doc, **(record_error(run) if run is not None else {})})
    else:
        _print(d)
        for f in files:  # one whole path a line: copyable at any width
            err.print(f"[dim]report: {escape(str(f))}[/]", soft_wrap=True)
    for rec in ev.unfinished:
        err.print(f"[yellow]note:[/] {escape(unfinished_line(rec))}", soft_wrap=True)
    if run is not None and run.unwritten:
        say_record(run, where=False)
    return d.exit_code


def _p(x: float | None) -> str:
    from ops.verdict.render import pct

    return pct(x, 3 if x is not None and abs(x) < 0.1 else 1)


def _print(d: Decision) -> None:
    from rich import box
    from rich.table import Table

    from ops.verdict.decide import times

    label = d.change.label if d.change else "no change named"
    out.print(f"[{STYLE[d.verdict]}]{d.verdict}[/]: {escape(label)}")
    for title, reasons in (("NO-GO", d.failed), ("HOLD", d.holds)):
        for r in reasons:
            out.print(f"  [{STYLE[title]}]{title}[/] {r.code}: {escape(r.message)}", soft_wrap=True)
    if not d.amdahl:
        return
    table = Table(title=f"Amdahl (threshold {d.threshold:.1%})", box=box.SIMPLE)
    for col in ("c", "f", "s", "gain", "range", "ceiling", "measured", "clears"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in d.amdahl:
        derived = " (d)" if r.f_source == "derived" else ""
        table.add_row(
            f"{r.concurrency}{'*' if r.concurrency == d.target_concurrency else ''}",
            "-" if r.f is None else f"{r.f:.2%}{derived}",
            "-" if r.speed is None else times(r.speed.s),
            _p(r.gain),
            "-" if r.gain_lo is None else f"{_p(r.gain_lo)}..{_p(r.gain_hi)}",
            _p(r.ceiling),
            _p(r.measured_gain) if r.measured_gain is not None else "-",
            {True: "yes", False: "no", None: "-"}[r.clears],
        )
    out.print(table)
    out.print("[dim]* target concurrency; (d) derived f[/]")
