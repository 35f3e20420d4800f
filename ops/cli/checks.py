"""`ops healthcheck` and `ops loadtest`: the checks that decide whether a live service is fine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from checks.docs import Dist, LevelDoc
from ops.cli.common import (
    Done,
    InputLenOpt,
    InventoryOpt,
    JsonOpt,
    MaxTokensOpt,
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
from ops.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, OpsError
from ops.hosts.remote import Host
from ops.hostside.release_files import edited_by_hand
from ops.measure.loadtest import LoadtestInterrupted, LoadtestReport, parse_levels, run_loadtest

if TYPE_CHECKING:  # imported by the healthcheck command (a fast `ops` start)
    from ops.sections.health import HealthReport

STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


@command
def healthcheck(
    ctx: typer.Context,
    target: TargetArg,
    record_golden: Annotated[
        bool,
        typer.Option(
            "--record-golden",
            help="Record the golden set instead of comparing (under the host lock; refused "
            "while a switch is unproven, where current never passed a post-flight and "
            "another release did, where current was rejected, or the service runs another "
            "release than current; nothing is recorded while the service is not running).",
        ),
    ] = False,
    golden: Annotated[
        Path | None,
        typer.Option(
            "--golden",
            metavar="FILE",
            help="Local golden file (default: <remote_root>/golden/golden.json on the host).",
        ),
    ] = None,
    aa_runs: Annotated[
        int,
        typer.Option("--aa-runs", min=0, max=100, help="Runs of the service against itself first."),
    ] = 0,
    timeout: RequestTimeoutOpt = 30.0,
    max_tokens: MaxTokensOpt = 32,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Pre/post-flight: service active, answering, token-identical to the golden set, GPUs sane.

    Once a request gets no answer within --timeout, no further request is sent (each would
    only wait as long): the checks after it, token identity included, say "not tried"."""
    from ops.measure.healthcheck import run_healthcheck

    inputs = {
        "record_golden": record_golden,
        "golden": str(golden or ""),
        "aa_runs": aa_runs,
        "timeout": timeout,
        "max_tokens": max_tokens,
    }

    def check(host: Host) -> Done[HealthReport]:
        if not record_golden:
            return measure(host)
        # the golden set says what "correct" is: never recorded from a host mid-change (a
        # deploy's unproven release; probe37ab H1: recorded beside a deploy's post-flight, it
        # failed every later rollback)
        with host.lock("healthcheck --record-golden"):
            from ops.deploy.deploy import newest_proven
            from ops.deploy.host_actions import host_releases
            from ops.service.managers import manager_for

            listing = host_releases(host, "list")
            if listing.get("pending"):
                raise OpsError(
                    f"{host.name}: a switch is not proven yet (deploy.pending): the golden set "
                    "is recorded only from a release the host has settled on",
                    hint=f"ops rollback {host.name} puts the host back and proves it; then record",
                )
            cur = next((r for r in listing["releases"] if r["current"]), None)
            back = newest_proven(listing)
            st = manager_for(host).status()
            runs = st.runs_release or st.release_gone  # the release it runs, if any
            if cur is not None and cur.get("rejected"):
                raise OpsError(
                    f"{host.name}: current ({cur['id']}) failed a post-flight (rejected): the "
                    "golden set is never recorded from it",
                    hint=(
                        f"ops rollback {host.name} goes back to a release that passed; record there"
                        if back
                        else "deploy a release that passes, then record"
                    ),
                )
            # (probe37be H2: recorded from a rejected release the service ran, current switched
            # back to a proven one by hand)
            if cur is not None and runs is not None and runs != cur["id"]:
                ran = next((r for r in listing["releases"] if r["id"] == runs), None)
                # (probe37bm M1: a restart onto a current that never passed a post-flight, the
                # service on one that did, is refused; the way is the rollback status names)
                way = (
                    f"ops rollback {host.name} --to {runs} makes what the service runs current "
                    f"(no restart), or ops deploy {host.name} proves current first"
                    if not cur.get("proven") and ran is not None and ran.get("proven")
                    else f"ops service restart {host.name} runs current"
                )
                raise OpsError(
                    f"{host.name}: the service runs {runs}, not current ({cur['id']}): the golden "
                    "set is recorded only from current as the service runs it",
                    hint=f"{way}; then record",
                )
            edited = (cur or {}).get("code_edited") or []
            if edited:  # nor from code edited by hand since its checks passed (probe37bi H1:
                # recorded from it, every correct release after failed identity, rejected)
                whose = f"current ({cur['id']})'s"
                raise OpsError(
                    f"{host.name}: {edited_by_hand(whose, edited)}; its code "
                    "is not the one its checks passed with, and the golden set is recorded only "
                    "from such code",
                    hint=f"put the files back, or ops deploy {host.name} installs current's "
                    "commit anew; then record",
                )
            if cur is not None and not cur.get("proven") and back:
                # nor from one that never passed a post-flight while one that did is there
                # (probe37as L3: a NOT CHECKED release became what "correct" is)
                raise OpsError(
                    f"{host.name}: current ({cur['id']}) never passed a post-flight: the golden "
                    "set says what correct is, and is recorded only from a release that did",
                    hint=f"ops rollback {host.name} --to {back} makes the newest proven release "
                    "current; record there, then deploy again",
                )
            return measure(host)

    def measure(host: Host) -> Done[HealthReport]:
        with err.status("healthcheck", spinner="dots") as status:
            rep = run_healthcheck(
                host,
                golden=golden,
                record_golden=record_golden,
                aa_runs=aa_runs,
                timeout=timeout,
                max_tokens=max_tokens,
                progress=lambda step: status.update(f"healthcheck {host.name}: {step}"),
            )
        return Done(EXIT_OK if rep.ok else EXIT_FAIL, "pass" if rep.ok else "fail", rep)

    def doc(done: Done[HealthReport]) -> dict[str, Any]:
        return {"ok": done.result.ok, "failed": done.result.failed, **done.section}

    return on_target(ctx, "healthcheck", target, inputs, check, _print_report, doc=doc)


def _print_report(rep: HealthReport) -> None:
    from rich.table import Table

    table = Table(
        title=f"healthcheck {escape(rep.target)} ({escape(rep.url)})", title_justify="left"
    )
    for col in ("check", "status", "detail"):
        table.add_column(col, overflow="fold")  # wrap long words, never cut them
    for c in rep.checks:
        table.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", escape(c.detail))
    out.print(table)
    for c in rep.checks:
        if c.status == "fail" and c.evidence:
            err.print(f"[bold red]{c.name}[/] evidence:")
            for line in c.evidence[-20:]:
                err.print("  " + escape(line), soft_wrap=True)
    verdict = "[green]PASS[/]" if rep.ok else f"[bold red]FAIL[/] ({', '.join(rep.failed)})"
    out.print(f"healthcheck {rep.target}: {verdict}")


@command
def loadtest(
    ctx: typer.Context,
    target: TargetArg,
    concurrency: Annotated[
        str, typer.Option("--concurrency", "-c", help="Levels, e.g. 1,10,64.")
    ] = "1,10,64",
    requests: RequestsOpt = 0,
    input_len: InputLenOpt = 32,
    output_len: OutputLenOpt = 32,
    timeout: RequestTimeoutOpt = 120.0,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Closed-loop sweep: req/s, tok/s, TTFT, TPOT, ITL, E2E p50/p90/p99 and accept length."""
    levels = parse_levels(concurrency)
    inputs = {
        "concurrency": levels,
        "requests": requests,
        "input_len": input_len,
        "output_len": output_len,
        "timeout": timeout,
    }
    as_json = state(ctx).as_json

    def sweep(host: Host) -> Done[LoadtestReport]:
        from ops.measure.counters import not_answering, snapshot

        # a service that gives no HTTP answer at all: said once, before any level waits out
        # its requests' timeouts (a hung one would hold each for --timeout seconds)
        down = not_answering(snapshot(host))
        if down is not None:
            rep = LoadtestReport(
                target=host.name,
                url=host.target.service.url,
                settings=inputs,
                levels=[],
                planned=levels,
                service_down=down,
            )
            return Done(EXIT_FAIL, "fail", rep)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("loadtest {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        try:
            with Progress(*columns, console=err.console, disable=as_json) as bar:
                task = bar.add_task(host.name, total=len(levels))
                rep = run_loadtest(
                    host,
                    levels,
                    requests=requests,
                    input_len=input_len,
                    output_len=output_len,
                    timeout=timeout,
                    on_level=lambda c, level: bar.update(
                        task, advance=1, description=f"{host.name} (c={c} done)"
                    ),
                )
        except LoadtestInterrupted as stop:  # what ran on the host is stopped already
            return Done(EXIT_INTERRUPTED, "interrupted", stop.report)
        return Done(EXIT_OK if rep.ok else EXIT_FAIL, "pass" if rep.ok else "fail", rep)

    def doc(done: Done[LoadtestReport]) -> dict[str, Any]:
        return {"ok": done.result.ok, **done.section}

    def json_why(done: Done[LoadtestReport]) -> None:  # the table's own line covers text mode
        if state(ctx).as_json:
            _loadtest_why(done.result)

    return on_target(
        ctx, "loadtest", target, inputs, sweep, _print_loadtest, doc=doc, always=json_why
    )


def fmt(value: float | None, digits: int = 1) -> str:
    """A number for a table cell; small values keep two decimals, None is '-'."""
    if value is None:
        return "-"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.{digits}f}"


def latencies(lv: LevelDoc) -> list[tuple[str, Dist]]:
    return [
        ("TTFT", lv["ttft_ms"]),
        ("TPOT", lv["tpot_ms"]),
        ("ITL", lv["itl_ms"]),
        ("E2E", lv["e2e_ms"]),
    ]


def _print_loadtest(rep: LoadtestReport) -> None:
    """Two narrow tables (throughput, then latency per level) so 80 columns show every number."""
    from rich.table import Table

    if not rep.levels:  # no level ran (the service did not answer, or a Ctrl-C at once)
        _loadtest_why(rep)
        return

    table = Table(title=f"loadtest {escape(rep.target)} ({escape(rep.url)})", title_justify="left")
    heads = ("c", "ok", "failed", "req/s", "out tok/s", "accept len", "time s")
    for col in heads:
        table.add_column(col, justify="right", overflow="fold")
    for lv in rep.level_docs:
        acc = lv["accept_length"]["value"]
        table.add_row(
            str(lv["concurrency"]),
            str(lv["completed"]),
            str(lv["failed"]),
            fmt(lv["request_per_s"]),
            fmt(lv["output_tok_per_s"]),
            fmt(acc),
            fmt(lv["duration_s"]),
        )
    out.print(table)
    lat = Table(title="latency per request (ms)", title_justify="left")
    for col in ("c", "metric", "p50 ms", "p90 ms", "p99 ms", "mean ms"):
        lat.add_column(col, justify="left" if col == "metric" else "right", overflow="fold")
    for lv in rep.level_docs:
        rows = latencies(lv)
        for i, (name, d) in enumerate(rows):
            lat.add_row(
                str(lv["concurrency"]) if i == 0 else "",
                name,
                *(fmt(v) for v in (d["p50"], d["p90"], d["p99"], d["mean"])),
                end_section=i == len(rows) - 1,
            )
    out.print(lat)
    for lv in rep.level_docs:
        for error, n in lv["errors"].items():
            err.print(f"[red]c={lv['concurrency']}: {n} x {escape(error)}[/]", soft_wrap=True)
    _loadtest_why(rep)


def _loadtest_why(rep: LoadtestReport) -> None:
    """The line an interrupted sweep (or one whose service did not answer) ends with, in both
    modes (with --json too, on stderr)."""
    if rep.service_down:
        say_service_down(rep.url, rep.service_down, rep.target)
    if rep.interrupted:
        err.print(
            f"[yellow]interrupted[/]: {len(rep.levels)} of {len(rep.planned)} levels "
            "finished; the level in progress was stopped on the host"
        )
