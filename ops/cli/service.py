"""`ops serve` (reference engine, foreground) and `ops service start|stop|restart|status TARGET`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Annotated, Any

import typer

from ops.cli.common import (
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
    state,
)
from ops.deploy.host_actions import interrupts_held
from ops.errors import EXIT_FAIL, EXIT_OK, HostError, LockHeld, OpsError
from ops.hosts.remote import Host, _held_by, last_json, shell_path
from ops.service.managers import NOT_WAITED, ServiceManager, ServiceStatus, manager_for

service_app = typer.Typer(
    help="Start, stop, restart or report the service of a target through its manager.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@service_app.callback()
def _service_group(_json: JsonOpt = False, _inventory: InventoryOpt = None) -> None:
    """The shared options are taken here too: `ops service --json status TARGET` (probe37al
    L1: refused as no such option)."""


WaitOpt = Annotated[
    float, typer.Option("--wait", min=0, help="Seconds to wait for /health once it starts.")
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Start even when current is not a release (a directory holding release.json "
        "under the remote root) or a dead deploy left its switch pending (never proven); "
        "without it both are refused and nothing is stopped.",
    ),
]


def _print_status(st: ServiceStatus) -> None:
    colour = "green" if st.active else "red" if st.state == "failed" else "yellow"
    word = f"[{colour}]{st.state}[/]"
    if st.blocked_by:  # a refusal: its detail says the state the service is in
        word = "[red]refused[/]"
    out.print(f"{escape(st.name)} ({st.manager}): {word} {escape(st.detail)}", soft_wrap=True)
    if not st.active and st.evidence:
        err.print("[dim]" + escape("\n".join(st.evidence[-20:])) + "[/]", soft_wrap=True)
    for warning in st.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def _left(mgr: ServiceManager, verb: str) -> str:
    """After a Ctrl-C in a start, stop or restart: the service's state, asked of the host with
    further Ctrl-Cs held (a restart cut between its stop and its start leaves none running)."""
    with interrupts_held():
        return f"during service {verb}: {mgr.state_now(starts=verb != 'stop')}"


def _as_it_is(mgr: ServiceManager, st: ServiceStatus) -> ServiceStatus:
    """A refused start or restart (`blocked_by`), with the service's state as the host says it
    now: a refusal read "failed" while the service it never touched served (probe37ab M3)."""
    try:
        now = mgr.status()
    except OpsError:
        return st
    return st.model_copy(
        update={
            "state": now.state,
            "healthy": now.healthy,
            "pid": now.pid,
            "runs_from": now.runs_from,
            "detail": f"{st.detail}; the service is {now.state}: {now.detail}",
            "evidence": now.evidence,
        }
    )


READ_ONLY = "Read-only file system"


def _lock(host: Host, verb: str) -> tuple[contextlib.AbstractContextManager, str | None]:
    """The host lock for a start, stop or restart. A stop on a read-only remote root (the lock
    cannot be written there, so nobody can take it) goes on without it once a read-only probe
    of the lock file finds no holder: stopping writes nothing (probe37c C7); on a full one it
    holds the lock without writing the holder's note (probe37f F4), and so does a start or a
    restart (probe37k K8: a start after a stop needs no new room; a restart stops nothing
    unless the start has its room). The warning then."""
    cm = host.lock(f"ops service {verb}", note_optional=True)
    try:
        holder = cm.__enter__()
        if holder.get("note_unwritten"):  # a full disk: the lock is held, its note not written
            return _Held(cm), f"the host lock's note was not written ({holder['note_unwritten']})"
    except HostError as exc:
        if verb != "stop" or exc.step != "lock" or READ_ONLY not in exc.message:
            raise
        lock = shell_path(f"{host.target.remote_root}/lock")
        probe = host.run_script(
            f"exec 9<{lock} 2>/dev/null || exit 0; flock -n 9 && exit 0; "
            f"echo BUSY; h={shell_path(host.target.remote_root + '/lock.holder')}; "
            '[ -f "$h" ] && head -c 4096 "$h" | head -n 1',
            step="lock",
        )
        if "BUSY" in probe.stdout:
            message, info = _held_by("\n".join(probe.stdout.splitlines()[1:2]))
            raise LockHeld(message, target=host.name, holder=info) from None
        said = exc.message.split(": ", 1)[-1] if ": " in exc.message else exc.message
        return contextlib.nullcontext(), f"stopped without the host lock ({said})"
    return _Held(cm), None


class _Held(contextlib.AbstractContextManager):
    """A lock already entered: its exit on leaving the `with`."""

    def __init__(self, cm: contextlib.AbstractContextManager) -> None:
        self.cm = cm

    def __exit__(self, *exc: object) -> bool | None:
        return self.cm.__exit__(*exc)


def _service(ctx: typer.Context, verb: str, target: str, wait: float, force: bool = False) -> int:
    def act(host: Host) -> Done[ServiceStatus]:
        mgr = manager_for(host)
        if verb == "status":
            st = mgr.status()
        else:
            held, unlocked = _lock(host, verb)
            with held:
                try:
                    if verb == "stop":
                        st = mgr.stop()
                    else:
                        run = mgr.start if verb == "start" else mgr.restart
                        st = run(wait, operator=True, force=force)
                        if st.blocked_by:
                            st = _as_it_is(mgr, st)
                except KeyboardInterrupt:
                    raise KeyboardInterrupt(_left(mgr, verb)) from None
            if unlocked:
                st = st.model_copy(update={"warnings": [*st.warnings, unlocked]})
        started = st.active or (wait == 0 and st.detail.endswith(NOT_WAITED))  # (not waited)
        good = (started and not st.blocked_by) if verb != "stop" else st.state == "inactive"
        return Done(EXIT_OK if good else EXIT_FAIL, "ok" if good else "fail", st)

    name, inputs = f"service-{verb}", {"verb": verb}
    return on_target(
        ctx, name, target, inputs, act, _print_status, key="service", record_line=False
    )


@service_app.command(short_help="Start the service and wait for /health.")
@command
def start(
    ctx: typer.Context,
    target: TargetArg,
    wait: WaitOpt = 120.0,
    force: ForceOpt = False,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Start the service (if it is not running) and wait for /health.

    Refused, with nothing started, when `current` is not a release or a deploy that died
    left its switch pending (`ops rollback TARGET` puts the host back), unless --force.
    With no release deployed at all, the command runs from the remote root."""
    return _service(ctx, "start", target, wait, force)


@service_app.command(short_help="Stop the service: TERM, then KILL after its grace.")
@command
def stop(
    ctx: typer.Context, target: TargetArg, _json: JsonOpt = False, _inventory: InventoryOpt = None
) -> int:
    """Stop the service (process manager: TERM, then KILL after a grace period)."""
    return _service(ctx, "stop", target, 0)


@service_app.command(short_help="Restart the service and wait for /health.")
@command
def restart(
    ctx: typer.Context,
    target: TargetArg,
    wait: WaitOpt = 120.0,
    force: ForceOpt = False,
    _json: JsonOpt = False,
    _inventory: InventoryOpt = None,
) -> int:
    """Restart the service and wait for /health.

    Refused before anything is stopped when the start could not happen or should not: a
    `current` that is not a release, a deploy that died with its switch pending (`ops
    rollback TARGET` puts the host back), a damaged or missing service.env, no room for
    the pidfile.
    --force lets the first two through."""
    return _service(ctx, "restart", target, wait, force)


@service_app.command(short_help="Show the service's state: a live process and /health.")
@command
def status(
    ctx: typer.Context, target: TargetArg, _json: JsonOpt = False, _inventory: InventoryOpt = None
) -> int:
    """Report the service's state: active needs a live process and a healthy /health."""
    return _service(ctx, "status", target, 0)


def _engine_check(argv: list[str], port: int) -> dict[str, Any]:
    """Run the engine's own argument, device and port checks (`python -m engine --check`) as
    a subprocess (ops never imports the engine); its one-line refusal becomes an OpsError."""
    try:
        res = subprocess.run(
            [*argv, "--check"],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise OpsError("python -m engine --check did not answer within 300 s") from None
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if res.returncode == 2 and lines:
        message = lines[-1].removeprefix("error: ")
        hint = None
        if "in use" in message:
            hint = f"see what holds it: ss -ltnp 'sport = :{port}'"
        raise OpsError(message, hint=hint)
    doc = last_json(res.stdout)
    if res.returncode != 0 or not isinstance(doc, dict):
        tail = lines[-1] if lines else f"exit {res.returncode}, no output"
        raise OpsError(
            f"python -m engine --check failed: {tail}",
            hint=f"the engine runs with {argv[0]}; it needs the data-plane packages (torch, ...)",
        )
    return doc


@command
def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 30000,
    preset: Annotated[str, typer.Option(help="Model preset: tiny (CPU) or small (GPU).")] = "tiny",
    mode: Annotated[str, typer.Option(help="Decoding: ar or ddtree.")] = "ddtree",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    backend: Annotated[
        list[str] | None,
        typer.Option(help="COMPONENT=KIND, e.g. tree_build=cpp (repeatable)."),
    ] = None,
    cuda_graphs: Annotated[
        bool,
        typer.Option(
            "--cuda-graphs/--no-cuda-graphs",
            help="On a GPU, replay the forward's pieces as CUDA graphs (captured at start).",
        ),
    ] = True,
    _json: JsonOpt = False,
) -> int:
    """Run the reference engine's OpenAI-compatible server in the foreground (Ctrl-C stops it).

    The preset, mode, device, backends (flags and $DDTREE_ENGINE_BACKENDS) and the port are
    checked first (`python -m engine --check`); then the engine process replaces `ops`
    (exec), so signals reach it directly.
    """
    if mode not in ("ar", "ddtree"):
        raise OpsError(f"--mode must be 'ar' or 'ddtree', got {mode!r}")
    for b in backend or []:
        if "=" not in b:
            raise OpsError(f"--backend takes COMPONENT=KIND, got {b!r}")
    argv = [
        sys.executable,
        "-m",
        "engine",
        "--host",
        host,
        "--port",
        str(port),
        "--preset",
        preset,
        "--mode",
        mode,
        "--device",
        device,
    ]
    for b in backend or []:
        argv += ["--backend", b]
    if not cuda_graphs:
        argv.append("--no-cuda-graphs")
    check = _engine_check(argv, port)  # every bad value is refused before "serving on"
    if state(ctx).as_json:
        emit_json({"argv": argv, "url": f"http://{host}:{port}", "check": check})
    else:
        err.print(f"[dim]serving on http://{host}:{port} ({preset}, {mode}, {device})[/]")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)  # the engine replaces ops: signals and exit code are its own
    return EXIT_OK  # not reached
