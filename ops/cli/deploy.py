"""`ops deploy TARGET|GROUP`, `ops releases TARGET`, `ops rollback TARGET [--to ID]`."""

from __future__ import annotations

import signal
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ops.cli.common import (
    Done,
    InventoryOpt,
    JsonOpt,
    MaxTokensOpt,
    RecordedInterrupt,
    TargetArg,
    command,
    emit_json,
    err,
    escape,
    finish,
    interrupted,
    on_target,
    out,
    recorded,
    say_waits,
    state,
)
from ops.deploy.result import MAX_KEEP
from ops.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, OpsError, took_signal
from ops.hosts.remote import Host, open_host
from ops.hostside.pending import ID_RE
from ops.hostside.release_files import edited_by_hand

if TYPE_CHECKING:  # each command imports ops.deploy.deploy when it runs (a fast `ops` start)
    from ops.deploy.deploy import DeployResult, Step

WaitOpt = Annotated[
    float,
    typer.Option("--wait", min=1, max=86400, help="Seconds to wait for /health after a restart."),
]
_print_lock = threading.Lock()
MARK = {"ok": "[green]ok[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]skip[/]"}
EVIDENCE_SHOWN = 12
SHOWN_DAMAGED = 10  # warnings on the console; --json carries every release's damage


@contextmanager
def term_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI timeout, `kill`) stops a deploy the way Ctrl-C does: the step in progress
    stops, the host's guard puts it back, the record says so."""

    def stop(signum: int, frame: object) -> None:
        took_signal(signal.Signals(signum).name)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _done(results: list[DeployResult], outcome: str | None = None) -> Done[list[DeployResult]]:
    """Exit code and outcome of a deploy (or rollback: `outcome` is its result's own)."""
    if any(r.outcome == "interrupted" for r in results):
        code, word = EXIT_INTERRUPTED, "interrupted"
    elif all(r.ok for r in results):
        code, word = EXIT_OK, "ok"
    elif all(r.ok or r.host_trouble for r in results):
        code, word = EXIT_BAD_INPUT, "fail"  # the host's trouble, not the release's
    else:
        code, word = EXIT_FAIL, "fail"
    return Done(code, outcome or word, results)


def _progress(many: bool) -> Callable[[str, str, Step | None], None]:
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


def _wrapped(line: str, width: int) -> list[str]:
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, break_on_hyphens=False) or [""]


def _summary(results: list[DeployResult], title: str = "deploy") -> None:
    """One row per host; release ids are never cut (they are what `--to` takes), so before
    and after share a column, one above the other, and the steps column folds."""
    from rich import box
    from rich.table import Table

    rows = []
    for r in results:
        steps = " ".join(_step_word(s) for s in r.steps) or "-"
        colour = "green" if r.ok else "yellow" if r.outcome == "interrupted" else "red"
        if r.outcome == "not-reached":  # never asked: its release is not known here
            release = ["(not asked)", "(untouched)"]
        elif r.after == r.before:
            release = [r.before or "(none)", "(unchanged)"]
        else:
            release = [r.before or "(none)", f"-> {r.after or '(none)'}"]
        rows.append((r.target, release, f"[{colour}]{r.outcome}[/]", steps))
    # an id is never cut; what is no id (a `current` made by hand, described) is wrapped to a
    # third of the width, so the steps keep their room (probe37bm L1: a path, one long word
    # to rich, squeezed the steps to "package:o")
    cells = [line for row in rows for line in row[1]]
    ids = [len(line) for line in cells if ID_RE.match(line.removeprefix("-> "))]
    wide = max(ids, default=0)
    others = max((len(line) for line in cells), default=0)
    width = max(wide, min(others, max(27, out.width // 3)))
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    table.add_column("host", overflow="fold", max_width=16)
    table.add_column("release: before -> after", no_wrap=True, width=width)
    table.add_column("outcome", no_wrap=True)
    table.add_column("steps", overflow="fold", ratio=1, min_width=12)
    for target, release, outcome, steps in rows:
        lines = [part for line in release for part in _wrapped(line, width)]
        table.add_row(escape(target), escape("\n".join(lines)), outcome, steps)
    out.print(table)
    for r in results:
        if r.outcome == "dry-run":
            for s in r.steps:
                out.print(f"  {s.name}: {escape(s.detail)}", soft_wrap=True)
        if r.message:
            out.print(f"{escape(r.target)}: {escape(r.message)}", soft_wrap=True)


@command
def deploy(
    ctx: typer.Context,
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
    keep: Annotated[
        int, typer.Option(min=2, max=MAX_KEEP, help="Releases to keep on the host.")
    ] = 5,
    wave_size: Annotated[int, typer.Option(min=1, help="Hosts per wave after the canary.")] = 1,
    wait: WaitOpt = 180.0,
    max_tokens: MaxTokensOpt = 32,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Build, self-test and switch a release on TARGET (or a group: canary, then waves)."""
    from ops.deploy.deploy import Deployer, DeployInterrupted, DeployOptions
    from ops.deploy.fleet import deploy_group

    st = state(ctx)
    inv = st.inventory()
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
    show = _progress(many)

    def act(_run: object) -> Done[list[DeployResult]]:
        if many:
            return _done(deploy_group(targets, opts, wave_size, show))
        try:
            with open_host(targets[0]) as host:
                return _done([Deployer(host, opts, lambda n, s: show(target, n, s)).run()])
        except DeployInterrupted as stop:
            return _done([stop.result])

    inputs = {"target": target, **opts.model_dump(mode="json"), "wave_size": wave_size}
    anchor = targets[0] if not many else targets[0].model_copy(update={"name": target})
    try:
        with term_as_interrupt():
            run, done = recorded("deploy", anchor, inputs, act, key="results")
    except RecordedInterrupt as stop:  # before the deploy had a result of its own
        return interrupted(st, stop.run)
    return finish(st, run, done, lambda rs: _summary(rs, "deploy"), doc=_doc)


def _doc(done: Done[list[DeployResult]]) -> dict[str, Any]:
    return {"ok": done.code == EXIT_OK, "results": done.section}


@command
def releases(
    ctx: typer.Context, target: TargetArg, _json: JsonOpt = False, _inventory: InventoryOpt = None
) -> int:
    """The releases on TARGET: id, git sha, created, arch, self-test, size, current/previous."""
    from ops.deploy.deploy import host_releases

    st = state(ctx)
    t = st.target(target)
    with open_host(t) as host:
        say_waits(host)
        doc = host_releases(host, "list")
    if st.as_json:
        emit_json(doc)
        return EXIT_OK
    from rich import box
    from rich.table import Table

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
        flaw = (  # said of current and previous too (probe37x L3: a rejected current)
            "[red]damaged[/]"
            if r.get("damaged")
            else "[red]rejected[/]"
            if r.get("rejected")
            else "unproven"
            if not r.get("proven")
            else ""
        )
        role = "current" if r["current"] else "previous" if r["previous"] else ""
        mark = f"{role} {flaw}".strip()  # (probe37ay L1: an unproven current or previous was
        # marked by its role alone, and a plain rollback's skipping it came as a surprise)
        test = {True: "pass", False: "FAIL", None: "-"}.get(r["selftest_ok"], "-")
        created = r["created"].replace("T", " ")[:16] + "Z" if r["created"] else "?"
        table.add_row(
            mark,
            r["id"],
            (r["git_sha"] or "?")[:8],
            created,
            r["cuda_arch"] or "-",
            test,
            f"{r['size_bytes'] / 2**20:.1f}",
        )
    if doc["releases"]:
        out.print(table)
    else:
        name = escape(t.name)
        said = f"no releases on {name} ({escape(t.remote_root)}): `ops deploy {name}` makes one"
        out.print(said, soft_wrap=True)
    cur = doc.get("current_state") or {}
    if cur.get("kind") not in (None, "release", "none"):
        from ops.deploy.deploy import newest_proven, shown_state

        nothing = cur.get("kind") == "foreign" and not cur.get("exists")
        back = newest_proven(doc)
        # a release gone under a service that may still run it: the rollback would stop that
        # service with no way back (probe37as H1), which status tells and names the way for
        still = " (unless the service still runs it: `ops service status` says the way then)"
        err.print(
            f"[yellow]warning:[/] current is {escape(shown_state(cur) or '?')}, not a release "
            "ops installed; "
            + (
                f"no deploy goes over it: `ops rollback {escape(t.name)} --to {back}` puts back "
                "the newest proven release" + (still if cur.get("release") else "")
                if nothing and back
                else "no deploy goes over it"
                if nothing
                else "a deploy over it needs --force"
            )
        )
    damaged = [r for r in doc["releases"] if r.get("damaged")]
    for r in damaged[:SHOWN_DAMAGED]:
        err.print(f"[yellow]warning:[/] {r['id']} is damaged: {escape(r['damaged'])}")
    if len(damaged) > SHOWN_DAMAGED:
        more = len(damaged) - SHOWN_DAMAGED
        err.print(f"[yellow]warning:[/] and {more} more damaged releases (--json lists them all)")
    if any(not r.get("proven") for r in doc["releases"]):
        err.print("unproven: never passed a post-flight (prune removes these first)")
    if doc.get("pending"):
        err.print(
            "[yellow]warning:[/] deploy.pending is there: a deploy runs now, or one died before "
            "it was settled (the next deploy or rollback puts the host back)"
        )
    for r in [r for r in doc["releases"] if r.get("env_edited")][:SHOWN_DAMAGED]:
        err.print(
            f"[yellow]warning:[/] {r['id']}'s service.env was changed since it was installed "
            "(edited by hand?): its configuration is not the one its checks passed with"
        )
    for r in [r for r in doc["releases"] if r.get("code_edited")][:SHOWN_DAMAGED]:
        said = edited_by_hand(f"{r['id']}'s", r["code_edited"])
        err.print(  # (probe37bd M3)
            f"[yellow]warning:[/] {escape(said)}; its code is not the one its checks passed with"
        )
    odd = doc.get("not_releases") or []
    for r in odd[:SHOWN_DAMAGED]:
        err.print(
            f"[yellow]warning:[/] releases/{escape(r['id'])} is {escape(r['kind'])} (not a "
            "release): not listed, never a rollback's target, and prune leaves it alone"
        )
    if len(odd) > SHOWN_DAMAGED:
        more = len(odd) - SHOWN_DAMAGED
        err.print(f"[yellow]warning:[/] and {more} more such entries (--json lists them)")
    if doc.get("releases_link"):
        err.print(
            f"[yellow]warning:[/] releases/ is a symlink to {escape(doc['releases_link'])}: "
            "these may be another root's releases; deploys and rollbacks are refused until it "
            "is a directory"
        )
    return EXIT_OK


@command
def rollback(
    ctx: typer.Context,
    target: TargetArg,
    to: Annotated[str | None, typer.Option("--to", help="Release id (default: previous).")] = None,
    wait: WaitOpt = 180.0,
    max_tokens: MaxTokensOpt = 32,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Switch TARGET back to its previous release (or --to ID), restart, post-flight.

    Where `previous` names no release (its release was deleted, or there is no link), the
    newest other release that passed a post-flight is taken, and the result says so."""
    from ops.deploy.deploy import Deployer, DeployInterrupted, DeployOptions

    show = _progress(False)

    if to is not None and not to.strip():
        raise OpsError("--to needs a release id (leave it out to roll back to previous)")

    def act(host: Host) -> Done[list[DeployResult]]:
        opts = DeployOptions(wait_s=wait, max_tokens=max_tokens)
        try:
            res = Deployer(host, opts, lambda n, s: show(host.name, n, s)).rollback(to)
        except DeployInterrupted as stop:
            res = stop.result
        return _done([res], res.outcome)

    inputs = {"to": to, "wait_s": wait, "max_tokens": max_tokens}
    show_summary = lambda rs: _summary(rs, "rollback")  # noqa: E731
    with term_as_interrupt():
        return on_target(
            ctx, "rollback", target, inputs, act, show_summary, key="results", doc=_doc
        )
