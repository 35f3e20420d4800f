"""The `ops` command line. Thin: parse, call one function, print, set the exit code.

Every command takes `--json` (one JSON document on stdout) and `--inventory PATH` (or
`$OPS_INVENTORY`). A user mistake or an unreachable host is one line on stderr and exit 2,
never a traceback. Exit codes: 0 pass/GO, 1 fail/NO-GO, 2 bad input or configuration, 3 HOLD.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ops.errors import EXIT_OK, OpsError
from ops.facts import Facts, gather_facts
from ops.inventory import Inventory, load_inventory
from ops.records import RunDir
from ops.remote import open_host

app = typer.Typer(
    name="ops",
    help="Build, prove, benchmark and roll out DDTree kernels onto live inference hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
InventoryOpt = Annotated[
    str | None,
    typer.Option(
        "--inventory",
        "-i",
        envvar="OPS_INVENTORY",
        metavar="PATH",
        help="Inventory file (default: ./ops.toml; without one only `local` exists).",
    ),
]
TargetArg = Annotated[str, typer.Argument(help="Target name from the inventory, or `local`.")]


def _emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def _guard(as_json: bool, fn: Callable[[], int]) -> None:
    """Run a command body; turn OpsError into one line on stderr (and a JSON doc) and exit 2."""
    try:
        code = fn()
    except OpsError as exc:
        if as_json:
            _emit_json({"ok": False, **exc.to_dict()})
        err.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint: {escape(exc.hint)}[/]", soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    raise typer.Exit(code)


def _inventory(path: str | None) -> Inventory:
    return load_inventory(path)


@app.command()
def hosts(as_json: JsonOpt = False, inventory: InventoryOpt = None) -> None:
    """List every target: address, GPUs, arch, service and its manager."""

    def body() -> int:
        inv = _inventory(inventory)
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
            }
            for t in inv.targets.values()
        ]
        if as_json:
            _emit_json(
                {
                    "inventory": str(inv.path) if inv.path else None,
                    "targets": rows,
                    "groups": inv.groups,
                }
            )
            return EXIT_OK
        table = Table(title=f"targets ({inv.path or 'built-in local only'})")
        for col in ("name", "address", "gpus", "arch", "service", "manager"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["name"],
                r["address"],
                str(r["gpus"]),
                r["cuda_arch"] or "-",
                r["service"],
                r["manager"],
            )
        out.print(table)
        for g, members in inv.groups.items():
            out.print(f"group [bold]{g}[/]: {', '.join(members)}")
        return EXIT_OK

    _guard(as_json, body)


@app.command()
def facts(target: TargetArg, as_json: JsonOpt = False, inventory: InventoryOpt = None) -> None:
    """Connect to TARGET and report what is there: OS, python, nvcc, GPUs, disk, service."""

    def body() -> int:
        t = _inventory(inventory).target(target)
        run = RunDir.create("facts", t.name)
        try:
            with open_host(t) as host:
                found = gather_facts(host)
        except OpsError as exc:
            run.write_record(
                inputs={"target": t.name},
                outcome="error",
                exit_code=exc.exit_code,
                error=exc.to_dict(),
            )
            raise
        run.write_record(
            inputs={"target": t.name},
            outcome="ok",
            exit_code=EXIT_OK,
            facts=found.model_dump(mode="json"),
        )
        if as_json:
            _emit_json({**found.model_dump(mode="json"), "run_dir": str(run.path)})
        else:
            _print_facts(found)
            err.print(f"[dim]record: {run.path}/record.json[/]")
        return EXIT_OK

    _guard(as_json, body)


def _print_facts(f: Facts) -> None:
    def tool(t: Any) -> str:
        return f"{t.path} ({t.version})" if t.found else f"[yellow]missing[/] ({t.error})"

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
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
