"""The `ops` command line. Thin: parse, call one function, print, set the exit code.

The app and its groups are assembled here; the commands live in `ops.cli.*`, each one a
function that parses its options and hands an action to `ops.cli.common.on_target` (open the
target, run it inside a run record, render its typed result), wrapped by `ops.cli.common.command`.
Every command takes `--json` (one JSON document on stdout) and `--inventory PATH` (or
`$OPS_INVENTORY`), before or after the command's name (both land on `ctx.obj`). A user
mistake or an unreachable host is one line on stderr and exit 2, never a traceback.
Exit codes: 0 pass/GO, 1 fail/NO-GO, 2 bad input or configuration, 3 HOLD, 4 an internal
error (an exception nothing expected: a bug in ops, one line; OPS_DEBUG=1 adds the traceback),
130 interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Annotated

import typer

from ops.cli.checks import healthcheck, loadtest
from ops.cli.common import (
    HELP_SETTINGS,
    CliState,
    Done,
    InventoryOpt,
    JsonOpt,
    TargetArg,
    command,
    emit_json,
    err,
    escape,
    on_target,
    out,
    package_version,
    state,
    unbreakable_console,
)
from ops.cli.deploy import deploy, releases, rollback
from ops.cli.measure import bench, profile
from ops.cli.report import report
from ops.cli.rollout import rollout
from ops.cli.service import serve, service_app
from ops.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, interrupt_said, took_signal
from ops.hosts.remote import Host, heartbeat_s

if TYPE_CHECKING:  # imported by the facts command (a fast `ops` start)
    from ops.hosts.facts import Facts, Tool

app = typer.Typer(
    name="ops",
    help="Build, prove, benchmark and roll out DDTree kernels onto live inference hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help: no `<bool>` on flags, readable at 80 columns
    context_settings=HELP_SETTINGS,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"ops (ddtree-ops) {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> None:
    """Build, prove, benchmark and roll out DDTree kernels onto live inference hosts."""
    try:
        heartbeat_s()  # read by every long host command: a bad value is said before any
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="OPS_HEARTBEAT_S") from None
    state(ctx)  # the shared options (also accepted after the command) live on ctx.obj


# `ops --help` lists one line per command: whole summaries (click cuts a long docstring's
# first sentence with "..." to fit the terminal); each fits 80 columns beside its name
SUMMARY = {
    "service": "Start, stop, restart or show a target's service.",
    "serve": "Run the reference engine's server in the foreground.",
    "healthcheck": "Pre/post-flight: up, answering, token-identical, GPUs.",
    "loadtest": "Closed-loop load sweep: req/s, tok/s, TTFT, TPOT, E2E.",
    "bench": "Benchmark the kernels on one GPU, guarded and probed.",
    "profile": "Where the step time goes per concurrency: f per stage.",
    "report": "GO / NO-GO / HOLD from run records (md, html, json).",
    "rollout": "Run a playbook: bench, profile, decide, deploy, measure.",
    "deploy": "Build, self-test, switch, restart, check; roll back.",
    "releases": "List a target's releases: id, git sha, proven, current.",
    "rollback": "Switch back to the previous release (or --to ID).",
    "hosts": "List every target: address, service URL, remote root.",
    "facts": "Report what a target has: OS, python, nvcc, GPUs, disk.",
}
app.add_typer(service_app, name="service", short_help=SUMMARY["service"])
for _fn in (serve, healthcheck, loadtest, bench, profile, report, rollout, deploy, releases):
    app.command(short_help=SUMMARY[_fn.__name__])(_fn)
app.command(short_help=SUMMARY["rollback"])(rollback)


@app.command(short_help=SUMMARY["hosts"])
@command
def hosts(ctx: typer.Context, _json: JsonOpt = False, _inventory: InventoryOpt = None) -> int:
    """List every target: address, GPUs, its service's URL and its remote root."""
    st = state(ctx)
    inv = st.inventory()
    rows = [
        {
            "name": t.name,
            "transport": "local" if t.is_local else "ssh",
            "address": "localhost" if t.is_local else f"{t.address}:{t.port}",
            "user": t.user,
            "gpus": t.gpus,
            "cuda_arch": t.cuda_arch,
            "bench_gpu": t.bench_gpu,
            "service": t.service.name,
            "manager": t.service.manager,
            "url": t.service.url,
            "remote_root": t.remote_root,
        }
        for t in inv.targets.values()
    ]
    if st.as_json:
        emit_json(
            {
                "inventory": str(inv.path) if inv.path else None,
                "targets": rows,
                "groups": inv.groups,
            }
        )
        return EXIT_OK
    # a block per target, never a table: a URL or a path cut to fit the terminal is useless
    out.print(f"targets ({escape(str(inv.path or 'built-in: local only'))})")
    for t in inv.targets.values():
        where = (
            "localhost" if t.is_local else f"{t.user + '@' if t.user else ''}{t.address}:{t.port}"
        )
        gpus = f"{t.gpus} GPU(s)" + (f", {t.cuda_arch}" if t.cuda_arch else "")
        out.print(f"[bold]{escape(t.name)}[/]  {escape(where)}  {gpus}", soft_wrap=True)
        svc = t.service
        out.print(
            f"  service  {escape(svc.name)} ({svc.manager}) {escape(svc.url)}", soft_wrap=True
        )
        out.print(f"  root     {escape(t.remote_root)}", soft_wrap=True)
    for g, members in inv.groups.items():
        out.print(f"group [bold]{g}[/]: {', '.join(members)}")
    return EXIT_OK


@app.command(short_help=SUMMARY["facts"])
@command
def facts(
    ctx: typer.Context, target: TargetArg, _json: JsonOpt = False, _inventory: InventoryOpt = None
) -> int:
    """Connect to TARGET and report what is there: OS, python, nvcc, GPUs, disk, service."""
    from ops.hosts.facts import gather_facts

    def gather(host: Host) -> Done[Facts]:
        return Done(EXIT_OK, "ok", gather_facts(host))

    return on_target(ctx, "facts", target, {}, gather, _print_facts, doc=lambda d: d.section)


def _print_facts(f: Facts) -> None:
    def tool(t: Tool) -> str:
        return f"{t.path} ({t.version})" if t.found else f"[yellow]missing[/] ({t.error})"

    from rich.table import Table

    table = Table(title=f"facts: {f.target}", show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    table.add_row("host", f"{f.hostname or '?'}: {f.os or '?'}, {f.kernel or '?'}")
    table.add_row("python", tool(f.python))
    table.add_row("nvcc", tool(f.nvcc))
    table.add_row("nvidia-smi", tool(f.nvidia_smi))
    for g in f.gpus:
        mem = f"{g.memory_used_mib}/{g.memory_total_mib} MiB"
        table.add_row(f"gpu {g.index}", f"{g.name} {g.arch or ''} {g.pci_bus_id} {g.uuid} {mem}")
    if f.disk:
        free = f"{(f.disk.free_bytes or 0) / 2**30:.1f} GiB free" if f.disk.free_bytes else "?"
        table.add_row("disk", f"{f.disk.path}: {free}")
    svc = f.service
    table.add_row("service", f"{svc.name} ({svc.manager}): {svc.state} {svc.detail or ''}")
    out.print(table)
    for w in f.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")


def main() -> None:
    """Run the app; a bad flag or value is one line (and where to look) with exit 2; an
    exception nothing expected (a bug in ops) is one line, exit 4 (`internal_error`)."""
    st = CliState()  # the app's root context holds this one: --json is known after a failure
    unbreakable_console()  # a reader gone (`| head`, a dropped terminal) never stops the work
    # SIGTERM (`kill`, a CI timeout), SIGHUP and SIGQUIT (a dropped session): as Ctrl-C, for
    # every command, not a silent death with 143 (probe37p P5); an ignore (nohup's) stays
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _as_interrupt)
    # SIGINT inherited as ignored (a background job of a script: `ops service restart local &`)
    # is still a Ctrl-C, for every command as for a deploy (probe37an L2: a restart sent
    # SIGINT by its script ran on and exited 0)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = app(standalone_mode=False, obj=st)
    except (KeyboardInterrupt, typer.Abort):
        code = EXIT_INTERRUPTED
    except Exception as exc:
        # click's (or typer's vendored click's) usage errors: duck-typed, as typer may vendor
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            internal_error(exc, st.as_json)
            sys.exit(EXIT_INTERNAL)
        args = sys.argv[1:]
        # the flags were not parsed, but --json was asked for: one document all the same
        # (probe37z L2: a usage error printed nothing on stdout)
        wants_json = "--json" in (args[: args.index("--")] if "--" in args else args)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `ops` or a group alone: its help
            if wants_json:  # the help goes to stderr, the document to stdout (probe37ai L1)
                emit_json({"ok": False, "error": "UsageError", "message": "Missing command."})
            shown = err if wants_json else out
            shown.print(exc.format_message(), soft_wrap=True, markup=False, highlight=False)
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} -h)" if ctx is not None else ""
        if wants_json:
            emit_json({"ok": False, "error": "UsageError", "message": exc.format_message()})
        err.print(f"error: {escape(exc.format_message())}{where}", soft_wrap=True)
        sys.exit(exc.exit_code)
    if code == EXIT_INTERRUPTED and not st.answered:
        # a Ctrl-C outside a command's own run (its options being parsed, the command being
        # looked up): typer makes it a silent `Exit(130)`, so the line is said here
        if st.as_json:
            emit_json({"ok": False, "outcome": "interrupted"})
        err.print(f"[yellow]interrupted[/] ({interrupt_said()})")
    sys.exit(code if isinstance(code, int) else 0)


def _as_interrupt(signum: int, _frame: object) -> None:
    """SIGTERM, SIGHUP, SIGQUIT stop ops the way Ctrl-C does (probe37c C5, probe37p P5): the
    step in progress stops, a guard puts the host back, the record is finished, exit 130."""
    took_signal(signal.Signals(signum).name)
    raise KeyboardInterrupt


def internal_error(exc: BaseException, as_json: bool) -> None:
    """An exception no part of ops expected: never exit 1 (a NO-GO or a failed check), but one
    line, exit 4, and with --json a document saying so; the traceback only with OPS_DEBUG=1
    (plain: typer's pretty one would show locals, which can hold secrets)."""
    kind, message = type(exc).__name__, str(exc)
    debug = os.environ.get("OPS_DEBUG", "") not in ("", "0")
    if as_json:
        emit_json({"ok": False, "error": kind, "message": message, "internal": True})
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    hint = "" if debug else "OPS_DEBUG=1 shows the traceback; "
    err.print(
        f"[bold red]internal error:[/] {escape(kind)}: {escape(message)} (a bug in ops; "
        f"{hint}please report it)",
        soft_wrap=True,
    )


if __name__ == "__main__":
    main()
