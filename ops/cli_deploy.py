"""`ops deploy TARGET|GROUP`, `ops releases TARGET`, `ops rollback TARGET [--to ID]`."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from ops.cli_common import (
    InventoryOpt,
    JsonOpt,
    MaxTokensOpt,
    TargetArg,
    emit_json,
    err,
    guard,
    inventory_of,
    out,
    recorded,
)
from ops.deploy import (
    Deployer,
    DeployInterrupted,
    DeployOptions,
    DeployResult,
    Step,
    host_releases,
)
from ops.errors import EXIT_FAIL, EXIT_OK
from ops.fleet import deploy_group
from ops.remote import open_host

WaitOpt = Annotated[
    float,
    typer.Option("--wait", min=1, max=86400, help="Seconds to wait for /health after a restart."),
]
_print_lock = threading.Lock()
MARK = {"ok": "[green]ok[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]skip[/]"}
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as for `ops loadtest`
EVIDENCE_SHOWN = 12


@contextmanager
def term_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI timeout, `kill`) stops a deploy the way Ctrl-C does: the step in progress
    stops, the host's guard puts it back, the record says so."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _code(results: list[DeployResult]) -> tuple[int, str]:
    if any(r.outcome == "interrupted" for r in results):
        return EXIT_INTERRUPTED, "interrupted"
    ok = all(r.ok for r in results)
    return (EXIT_OK, "ok") if ok else (EXIT_FAIL, "fail")


def _progress(as_json: bool, many: bool):
    def show(target: str, name: str, step: Step | None) -> None:
        who = f"{target}: " if many else ""
        with _print_lock:
            if step is None:
                err.print(f"[dim]{escape(who)}{name} ...[/]", soft_wrap=True)
            else:
                err.print(
                    f"{escape(who)}{name}: {MARK[step.status]} ({step.seconds:.1f} s) "
                    f"{escape(step.detail)}",
                    soft_wrap=True,
                )
                shown = step.evidence if step.status == "fail" or step.data.get("forced") else []
                for line in shown[:EVIDENCE_SHOWN]:
                    err.print(f"    [dim]{escape(line)}[/]", soft_wrap=True)
                if len(shown) > EVIDENCE_SHOWN:
                    more = len(shown) - EVIDENCE_SHOWN
                    err.print(f"    [dim]... {more} more lines in the record[/]")

    return show


def _step_word(s: Step) -> str:
    return f"{s.name}:{'forced' if s.data.get('forced') else s.status}"


def _summary(results: list[DeployResult], title: str = "deploy") -> None:
    """One row per host; release ids are never cut (they are what `--to` takes), so before
    and after share a column, one above the other, and the steps column folds."""
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    table.add_column("host", overflow="fold", max_width=16)
    table.add_column("release: before -> after", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("steps", overflow="fold", ratio=1, min_width=12)
    for r in results:
        steps = " ".join(_step_word(s) for s in r.steps) or "-"
        colour = "green" if r.ok else "yellow" if r.outcome == "interrupted" else "red"
        if r.after == r.before:
            release = f"{r.before or '(none)'}\n(unchanged)"
        else:
            release = f"{r.before or '(none)'}\n-> {r.after or '(none)'}"
        table.add_row(escape(r.target), release, f"[{colour}]{r.outcome}[/]", steps)
    out.print(table)
    for r in results:
        if r.outcome == "dry-run":
            for s in r.steps:
                out.print(f"  {s.name}: {escape(s.detail)}", soft_wrap=True)
        if r.message:
            out.print(f"{escape(r.target)}: {escape(r.message)}", soft_wrap=True)


def deploy(
    target: Annotated[str, typer.Argument(help="Target or group name from the inventory.")],
    source: Annotated[
        Path | None, typer.Option(help="Project checkout to release (default: this one).")
    ] = None,
    ref: Annotated[str | None, typer.Option(help="Git commit to release (default: HEAD).")] = None,
    allow_dirty: Annotated[
        bool, typer.Option("--allow-dirty", help="Release the work tree with its changes.")
    ] = False,
    bootstrap: Annotated[
        bool,
        typer.Option(
            "--bootstrap",
            help="First install: no pre-flight while no release is current; systemd drop-in.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Deploy even if the pre-flight fails.")
    ] = False,
    no_restart: Annotated[
        bool, typer.Option("--no-restart", help="Install and switch; leave the service alone.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")
    ] = False,
    keep: Annotated[int, typer.Option(min=2, help="Releases to keep on the host.")] = 5,
    wave_size: Annotated[int, typer.Option(min=1, help="Hosts per wave after the canary.")] = 1,
    wait: WaitOpt = 180.0,
    max_tokens: MaxTokensOpt = 32,
    as_json: JsonOpt = False,
    inventory: InventoryOpt = None,
) -> None:
    """Build, self-test and switch a release on TARGET (or a group: canary, then waves)."""

    def body() -> int:
        inv = inventory_of(inventory)
        targets = inv.resolve(target)
        opts = DeployOptions(
            source=source,
            ref=ref,
            allow_dirty=allow_dirty,
            bootstrap=bootstrap,
            force=force,
            no_restart=no_restart,
            dry_run=dry_run,
            keep=keep,
            wait_s=wait,
            max_tokens=max_tokens,
        )
        many = len(targets) > 1 or target in inv.groups
        show = _progress(as_json, many)

        def act(_run: object) -> tuple[int, str, dict[str, Any]]:
            if many:
                results = deploy_group(targets, opts, wave_size, show)
            else:
                try:
                    with open_host(targets[0]) as host:
                        results = [Deployer(host, opts, lambda n, s: show(target, n, s)).run()]
                except DeployInterrupted as stop:
                    results = [stop.result]
            code, outcome = _code(results)
            return code, outcome, {"results": [r.model_dump(mode="json") for r in results]}

        inputs = {"target": target, **opts.model_dump(mode="json"), "wave_size": wave_size}
        anchor = targets[0] if not many else targets[0].model_copy(update={"name": target})
        with term_as_interrupt():
            run, code, sections = recorded("deploy", anchor, inputs, act)
        _finish("deploy", as_json, code, sections, run.path)
        return code

    guard(as_json, body)


def _finish(title: str, as_json: bool, code: int, sections: dict[str, Any], path: Path) -> None:
    results = [DeployResult.model_validate(r) for r in sections["results"]]
    if as_json:
        emit_json({"ok": code == EXIT_OK, **sections, "run_dir": str(path)})
        return
    _summary(results, title)
    err.print(f"[dim]record: {escape(str(path))}/record.json[/]", soft_wrap=True)


def releases(target: TargetArg, as_json: JsonOpt = False, inventory: InventoryOpt = None) -> None:
    """The releases on TARGET: id, git sha, created, arch, self-test, size, current/previous."""

    def body() -> int:
        t = inventory_of(inventory).target(target)
        with open_host(t) as host:
            doc = host_releases(host, "list")
        if as_json:
            emit_json(doc)
            return EXIT_OK
        # ids are never cut (they are what `ops rollback --to` takes); the rest fits 80 columns
        table = Table(
            title=f"releases on {escape(t.name)} ({escape(t.remote_root)})",
            box=box.SIMPLE_HEAD,
            padding=0,
            pad_edge=False,
        )
        table.add_column("")
        table.add_column("id", no_wrap=True)
        for col in ("sha", "created", "arch", "test", "MiB"):
            table.add_column(col, overflow="fold", justify="right" if col == "MiB" else "left")
        for r in doc["releases"]:
            mark = (
                "current"
                if r["current"]
                else "previous"
                if r["previous"]
                else "[red]rejected[/]"
                if r.get("rejected")
                else ""
            )
            st = {True: "pass", False: "FAIL", None: "-"}[r["selftest_ok"]]
            created = (r["created"] or "?").replace("T", " ")[:16] + "Z"
            table.add_row(
                mark,
                r["id"],
                (r["git_sha"] or "?")[:8],
                created,
                r["cuda_arch"] or "-",
                st,
                f"{r['size_bytes'] / 2**20:.1f}",
            )
        out.print(table)
        if doc.get("pending"):
            err.print("[yellow]warning:[/] a deploy is pending (deploy.pending): one runs now")
        return EXIT_OK

    guard(as_json, body)


def rollback(
    target: TargetArg,
    to: Annotated[str | None, typer.Option("--to", help="Release id (default: previous).")] = None,
    wait: WaitOpt = 180.0,
    max_tokens: MaxTokensOpt = 32,
    as_json: JsonOpt = False,
    inventory: InventoryOpt = None,
) -> None:
    """Switch TARGET back to its previous release (or --to ID), restart, post-flight."""

    def body() -> int:
        t = inventory_of(inventory).target(target)
        show = _progress(as_json, False)

        def act(_run: object) -> tuple[int, str, dict[str, Any]]:
            try:
                with open_host(t) as host:
                    r = Deployer(
                        host,
                        DeployOptions(wait_s=wait, max_tokens=max_tokens),
                        lambda n, s: show(t.name, n, s),
                    )
                    res = r.rollback(to)
            except DeployInterrupted as stop:
                res = stop.result
            code, _ = _code([res])
            return code, res.outcome, {"results": [res.model_dump(mode="json")]}

        inputs = {"target": t.name, "to": to, "wait_s": wait, "max_tokens": max_tokens}
        with term_as_interrupt():
            run, code, sections = recorded("rollback", t, inputs, act)
        _finish("rollback", as_json, code, sections, run.path)
        return code

    guard(as_json, body)
