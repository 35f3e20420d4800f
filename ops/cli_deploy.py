"""`ops deploy TARGET|GROUP`, `ops releases TARGET`, `ops rollback TARGET [--to ID]`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ops.cli_common import (
    InventoryOpt,
    JsonOpt,
    TargetArg,
    emit_json,
    err,
    guard,
    inventory_of,
    out,
    recorded,
)
from ops.deploy import Deployer, DeployOptions, DeployResult, Step, host_releases
from ops.errors import EXIT_FAIL, EXIT_OK
from ops.fleet import deploy_group
from ops.remote import open_host

WaitOpt = Annotated[
    float, typer.Option("--wait", min=1, help="Seconds to wait for /health after a restart.")
]
_print_lock = threading.Lock()
MARK = {"ok": "[green]ok[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]skip[/]"}


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
                for line in step.evidence[:12] if step.status == "fail" else []:
                    err.print(f"    [dim]{escape(line)}[/]", soft_wrap=True)

    return show


def _summary(results: list[DeployResult]) -> None:
    table = Table(title="deploy", show_lines=False)
    for col in ("host", "before", "after", "outcome", "steps"):
        table.add_column(col, overflow="fold")
    for r in results:
        steps = " ".join(f"{s.name}:{s.status}" for s in r.steps) or "-"
        colour = "green" if r.ok else "red"
        table.add_row(r.target, r.before or "-", r.after or "-", f"[{colour}]{r.outcome}[/]", steps)
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
        bool, typer.Option("--bootstrap", help="First install: no pre-flight; install drop-in.")
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
    max_tokens: Annotated[
        int, typer.Option(min=1, help="Greedy tokens per golden prompt in the checks.")
    ] = 32,
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
                with open_host(targets[0]) as host:
                    results = [Deployer(host, opts, lambda n, s: show(target, n, s)).run()]
            ok = all(r.ok for r in results)
            sections = {"results": [r.model_dump(mode="json") for r in results]}
            return (EXIT_OK if ok else EXIT_FAIL), ("ok" if ok else "fail"), sections

        inputs = {"target": target, **opts.model_dump(mode="json"), "wave_size": wave_size}
        anchor = targets[0] if not many else targets[0].model_copy(update={"name": target})
        run, code, sections = recorded("deploy", anchor, inputs, act)
        results = [DeployResult.model_validate(r) for r in sections["results"]]
        if as_json:
            emit_json({"ok": code == EXIT_OK, **sections, "run_dir": str(run.path)})
        else:
            _summary(results)
            err.print(f"[dim]record: {run.path}/record.json[/]")
        return code

    guard(as_json, body)


def releases(target: TargetArg, as_json: JsonOpt = False, inventory: InventoryOpt = None) -> None:
    """The releases on TARGET: id, git sha, created, arch, self-test, size, current/previous."""

    def body() -> int:
        t = inventory_of(inventory).target(target)
        with open_host(t) as host:
            doc = host_releases(host, "list")
        if as_json:
            emit_json(doc)
            return EXIT_OK
        table = Table(title=f"releases on {t.name} ({t.remote_root})")
        for col in ("", "id", "sha", "created", "arch", "selftest", "MiB"):
            table.add_column(col, overflow="fold")
        for r in doc["releases"]:
            mark = "current" if r["current"] else "previous" if r["previous"] else ""
            st = {True: "pass", False: "FAIL", None: "-"}[r["selftest_ok"]]
            table.add_row(
                mark,
                r["id"],
                (r["git_sha"] or "?")[:10],
                r["created"] or "?",
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
    max_tokens: Annotated[
        int, typer.Option(min=1, help="Greedy tokens per golden prompt in the checks.")
    ] = 32,
    as_json: JsonOpt = False,
    inventory: InventoryOpt = None,
) -> None:
    """Switch TARGET back to its previous release (or --to ID), restart, post-flight."""

    def body() -> int:
        t = inventory_of(inventory).target(target)
        show = _progress(as_json, False)

        def act(_run: object) -> tuple[int, str, dict[str, Any]]:
            with open_host(t) as host:
                r = Deployer(
                    host,
                    DeployOptions(wait_s=wait, max_tokens=max_tokens),
                    lambda n, s: show(t.name, n, s),
                )
                res = r.rollback(to)
            code = EXIT_OK if res.ok else EXIT_FAIL
            return code, res.outcome, {"results": [res.model_dump(mode="json")]}

        run, code, sections = recorded("rollback", t, {"target": t.name, "to": to}, act)
        if as_json:
            emit_json({"ok": code == EXIT_OK, **sections, "run_dir": str(run.path)})
        else:
            _summary([DeployResult.model_validate(r) for r in sections["results"]])
        return code

    guard(as_json, body)
