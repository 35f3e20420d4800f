"""Shared pieces of the `ops` command line: consoles, common options, error and record handling."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ops.errors import OpsError
from ops.inventory import Inventory, Target, load_inventory
from ops.records import RunDir

HELP_SETTINGS = {"help_option_names": ["-h", "--help"]}
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
# the options of the commands that check the service or load it (healthcheck, deploy,
# rollback; loadtest, profile)
MaxTokensOpt = Annotated[int, typer.Option(min=1, help="Greedy tokens per golden prompt.")]
RequestsOpt = Annotated[
    int, typer.Option(min=0, help="Measured requests per level (default 4 x level).")
]
InputLenOpt = Annotated[int, typer.Option(min=1, help="Prompt tokens.")]
OutputLenOpt = Annotated[int, typer.Option(min=1, help="Generated tokens (ignore_eos).")]
RequestTimeoutOpt = Annotated[float, typer.Option(min=0.1, help="Per-request timeout (s).")]


def package_version() -> str:
    try:
        return importlib.metadata.version("ddtree-ops")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def guard(as_json: bool, fn: Callable[[], int]) -> None:
    """Run a command body; turn OpsError into one line on stderr (and a JSON doc) and exit 2."""
    try:
        code = fn()
    except OpsError as exc:
        if as_json:
            emit_json({"ok": False, **exc.to_dict()})
        err.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint: {escape(exc.hint)}[/]", soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    raise typer.Exit(code)


def inventory_of(path: str | None) -> Inventory:
    return load_inventory(path)


def recorded(
    command: str,
    target: Target,
    inputs: dict[str, Any],
    body: Callable[[RunDir], tuple[int, str, dict[str, Any]]],
) -> tuple[RunDir, int, dict[str, Any]]:
    """Run `body` inside a new run directory; its record is written whatever happens."""
    run = RunDir.create(command, target.name)
    try:
        code, outcome, sections = body(run)
    except OpsError as exc:
        run.write_record(
            inputs=inputs, outcome="error", exit_code=exc.exit_code, error=exc.to_dict()
        )
        raise
    except BaseException as exc:  # a bug or Ctrl-C: still leave a complete record behind
        outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "crashed"
        run.write_record(
            inputs=inputs,
            outcome=outcome,
            exit_code=130 if outcome == "interrupted" else 1,
            error={"error": type(exc).__name__, "message": str(exc)},
        )
        raise
    run.write_record(inputs=inputs, outcome=outcome, exit_code=code, **sections)
    return run, code, sections
