"""Shared pieces of the `ops` command line: the state on the typer context, common options,
and the one way a command runs: `command` (errors become one line and an exit code) around
`on_target` (open the target, run the action inside a run record, render its typed result).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar

import typer
from pydantic import BaseModel

from checks.vocabulary import MAX_TOKENS
from ops.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, OpsError, interrupt_said
from ops.hosts.inventory import Inventory, Target, load_inventory
from ops.hosts.records import RunDir
from ops.hosts.remote import Host, open_host, still_runs
from ops.measure.loadtest import MAX_REQUEST_TIMEOUT_S, MAX_REQUESTS

if TYPE_CHECKING:
    from rich.console import Console

HELP_SETTINGS = {"help_option_names": ["-h", "--help"]}
R = TypeVar("R")


class Unbreakable:
    """A console stream (sys.stdout, sys.stderr) whose reader may be gone: the first write or
    flush that fails (EPIPE: `ops deploy 2>&1 | head` after head exits; EIO: the terminal of a
    dropped session) points the stream's fd at /dev/null and every later write is dropped
    silently. ops's own output must never abort the work it reports on (probe37c C4): a deploy
    goes on, its guard and record do their part, and the exit code stays the command's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return int(self._stream.write(text))
            except OSError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except OSError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        # what the stream still buffers is flushed at exit: to /dev/null, not a second error
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def unbreakable_console() -> None:
    """sys.stdout and sys.stderr as `Unbreakable` streams (once; `ops.cli.main` calls it)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, Unbreakable):
            setattr(sys, name, Unbreakable(stream))


class LazyConsole:
    """A rich Console made on first use. rich costs ~60 ms of every `ops` start-up (its
    console, markup, tables and progress bars), and a `--json` call that prints nothing for
    people never needs it; `out.print(...)` and the rest reach the real one."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        """The real rich Console (for what needs one, e.g. `Progress(console=...)`)."""
        if self._console is None:
            from rich.console import Console

            class _Console(Console):
                def on_broken_pipe(self) -> None:  # rich's own: SystemExit(1) mid-deploy
                    self.quiet = True

            self._console = _Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


out = LazyConsole(highlight=False, emoji=False)  # (probe37bf L1: `:smile:` typed, echoed 😄)
err = LazyConsole(stderr=True, highlight=False, emoji=False)


def escape(markup: str) -> str:
    """rich's `escape` (a text's `[` not read as markup), importing rich only when called."""
    from rich.markup import escape as rich_escape

    return rich_escape(markup)


@dataclass
class CliState:
    """The options every command shares, kept on the typer context (`ctx.obj`)."""

    as_json: bool = False
    inventory_path: str | None = None
    inventory_from_cli: bool = False  # -i was given (it wins over $OPS_INVENTORY)
    answered: bool = False  # a command ran to its end and said how (`command` sets it)

    def inventory(self) -> Inventory:
        return load_inventory(self.inventory_path)

    def target(self, name: str) -> Target:
        return self.inventory().target(name)


def state(ctx: typer.Context) -> CliState:
    return ctx.ensure_object(CliState)


def _set_json(ctx: typer.Context, value: bool) -> None:
    if value:
        state(ctx).as_json = True


def _set_inventory(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> None:
    """`-i` given anywhere on the command line wins over $OPS_INVENTORY: the subcommand's copy
    of the option, filled from the environment, never replaces one given before the command."""
    if value is None:
        return
    st = state(ctx)
    source = ctx.get_parameter_source(param.name or "")
    from_env = getattr(source, "name", None) == "ENVIRONMENT"
    if from_env and st.inventory_from_cli:
        return
    st.inventory_path = value
    st.inventory_from_cli = not from_env


# Given before or after the command name; they land on ctx.obj (expose_value=False), so a
# command's parameter of these types is only its declaration: read them from `state(ctx)`.
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON document on stdout.", callback=_set_json, expose_value=False
    ),
]
InventoryOpt = Annotated[
    str | None,
    typer.Option(
        "--inventory",
        "-i",
        envvar="OPS_INVENTORY",
        metavar="PATH",
        help="Inventory file (default: ./ops.toml; without one only `local` exists).",
        callback=_set_inventory,
        expose_value=False,
    ),
]
TargetArg = Annotated[str, typer.Argument(help="Target name from the inventory, or `local`.")]
# the options of the commands that check the service or load it (healthcheck, deploy,
# rollback; loadtest, profile)
MaxTokensOpt = Annotated[
    int, typer.Option(min=1, max=MAX_TOKENS, help="Greedy tokens per golden prompt.")
]
RequestsOpt = Annotated[
    int,
    typer.Option(min=0, max=MAX_REQUESTS, help="Measured requests per level (default 4 x level)."),
]
InputLenOpt = Annotated[int, typer.Option(min=1, help="Prompt tokens.")]
OutputLenOpt = Annotated[int, typer.Option(min=1, help="Generated tokens (ignore_eos).")]
RequestTimeoutOpt = Annotated[
    float, typer.Option(min=0.1, max=MAX_REQUEST_TIMEOUT_S, help="Per-request timeout (s).")
]


def package_version() -> str:
    import importlib.metadata  # ~20 ms; only `--version` asks

    try:
        return importlib.metadata.version("ddtree-ops")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def _finite(ctx: typer.Context, kwargs: dict[str, Any]) -> None:
    """Every number option is finite: click parses `inf` and `nan` as floats, which would pass a
    `min=` and then land in a record as JSON's non-standard Infinity / NaN (exit 2, one line)."""
    for p in ctx.command.params:
        v = kwargs.get(p.name or "")
        if isinstance(v, float) and not math.isfinite(v):
            opt = max(p.opts, key=len) if p.opts else p.name
            raise OpsError(f"{opt}: takes a finite number, got {v}")


def command(fn: Callable[..., int]) -> Callable[..., None]:
    """Run a command function (its first parameter `ctx`) and exit with the code it returns;
    an OpsError becomes one line on stderr (and, with --json, a JSON document) and its code; a
    Ctrl-C the command did not answer itself, one line (and document) and 130."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        ctx = kwargs.get("ctx") or args[0]
        st = state(ctx)
        as_json = st.as_json
        try:
            _finite(ctx, kwargs)
            code = fn(*args, **kwargs)
        except OpsError as exc:
            st.answered = True
            if as_json:
                emit_json({"ok": False, **exc.to_dict()})
            err.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
            if exc.hint:
                err.print(f"[dim]hint: {escape(exc.hint)}[/]", soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:  # one the command did not answer itself (no record kept)
            st.answered = True
            if as_json:
                emit_json({"ok": False, "outcome": "interrupted"})
            err.print(f"[yellow]interrupted[/] ({interrupt_said()})")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        st.answered = True
        raise typer.Exit(code)

    return run


@dataclass
class Done(Generic[R]):
    """What a command's action ends with: exit code, the record's outcome word, the typed
    result the command renders, and the section its run record keeps."""

    code: int
    outcome: str
    result: R
    section: Any = None  # default: the result, dumped to JSON types

    def __post_init__(self) -> None:
        if self.section is None:
            self.section = _dump(self.result)


def _dump(r: Any) -> Any:
    if isinstance(r, BaseModel):
        return r.model_dump(mode="json")
    return [_dump(x) for x in r] if isinstance(r, list) else r


def ok_doc(done: Done[Any]) -> dict[str, Any]:
    """The usual JSON document: `ok` (exit 0) and the section's keys."""
    return {"ok": done.code == EXIT_OK, **done.section}


def finish(
    st: CliState,
    run: RunDir,
    done: Done[R],
    show: Callable[[R], None],
    *,
    doc: Callable[[Done[R]], dict[str, Any]] = ok_doc,
    always: Callable[[Done[R]], None] | None = None,
    record_line: bool = True,
) -> int:
    """Render a recorded result: the JSON document (plus `run_dir`, and `record_error` where
    the record could not be written) or `show`; then `always` (lines for both modes) and where
    the record is (in both modes when `always` is given). A record that could not be written
    is one warning line in both modes; the result and its exit code stand."""
    if st.as_json:
        emit_json({**doc(done), "run_dir": str(run.path), **record_error(run)})
    else:
        show(done.result)
    if always is not None:
        always(done)
    say_record(run, record_line and (always is not None or not st.as_json))
    return done.code


def record_error(run: RunDir) -> dict[str, str]:
    """`{"record_error": PATH: WHY}` for a JSON document when the run's record is not on disk."""
    return {"record_error": run.unwritten} if run.unwritten else {}


def say_record(run: RunDir, where: bool = True) -> None:
    """Where the run's record is (when `where`); or, whatever `where` says, the one warning line
    for a record that could not be written (the path and the OS error)."""
    if run.unwritten:
        err.print(
            f"[yellow]warning:[/] the run record was not written: {escape(run.unwritten)}",
            soft_wrap=True,
        )
    elif where:
        err.print(f"[dim]record: {escape(str(run.path))}/record.json[/]", soft_wrap=True)


def on_target(
    ctx: typer.Context,
    name: str,
    target: str,
    inputs: dict[str, Any],
    act: Callable[[Host], Done[R]],
    show: Callable[[R], None],
    *,
    key: str | None = None,
    doc: Callable[[Done[R]], dict[str, Any]] = ok_doc,
    always: Callable[[Done[R]], None] | None = None,
    record_line: bool = True,
) -> int:
    """The body of a command on one target: resolve it, open it, run `act` inside a run record
    named `name` (inputs: the target's name and `inputs`; the result under `key`, default
    `name`), render as `finish` does."""
    st = state(ctx)
    t = st.target(target)

    def body(_run: RunDir) -> Done[R]:
        with open_host(t) as host:
            say_waits(host)
            return act(host)

    try:
        run, done = recorded(name, t, {"target": t.name, **inputs}, body, key=key)
    except RecordedInterrupt as stop:
        return interrupted(st, stop.run, stop.where)
    return finish(st, run, done, show, doc=doc, always=always, record_line=record_line)


def say_waits(host: Host) -> None:
    """A host command that runs long says so each minute, with its bound (probe37bf M1: a
    restart onto a service that never answers, a hung host python: silent for minutes)."""

    def still(what: str, ran: float, bound: float) -> None:
        said = still_runs(f"{what} on {host.name}", ran, bound)
        err.print(f"[dim]{escape(said)}[/]", soft_wrap=True)

    host.on_wait = still


def say_service_down(url: str, why: str, target: str) -> None:
    """The one line for a service that gave no HTTP answer at all
    (ops.measure.counters.not_answering):
    no level was run, and where to look."""
    ask = "Is it hung?" if why.startswith("timeout") else "Is it running?"
    err.print(
        f"[bold red]fail:[/] the service at {escape(url)} did not answer ({escape(why)}); no "
        f"level was run. {ask} `ops service status {escape(target)}`",
        soft_wrap=True,
    )


class RecordedInterrupt(KeyboardInterrupt):
    """Ctrl-C that the command did not turn into a result of its own: its record is written
    (outcome interrupted); `run` is where."""

    def __init__(self, run: RunDir, where: str = "") -> None:
        super().__init__("interrupted")
        self.run = run
        self.where = where  # where the interrupt left the host, when the command could ask


def interrupted(st: CliState, run: RunDir, where: str = "") -> int:
    """A command that Ctrl-C stopped before it had a result: the same lines as any result (the
    JSON document with --json, one line, where the record is), exit 130."""
    if st.as_json:
        doc = {"ok": False, "outcome": "interrupted", "run_dir": str(run.path)}
        emit_json({**doc, **record_error(run)})
    err.print(
        f"[yellow]interrupted[/] ({interrupt_said()}) "
        + (escape(where) if where else "before a result"),
        soft_wrap=True,
    )
    say_record(run)
    return EXIT_INTERRUPTED


def recorded(
    command: str,
    target: Target,
    inputs: dict[str, Any],
    body: Callable[[RunDir], Done[R]],
    *,
    key: str | None = None,
) -> tuple[RunDir, Done[R]]:
    """Run `body` inside a new run directory, whose record (outcome `running`) is there from
    the start; the final record replaces it whatever happens, with the result's section under
    `key` (default: the command's name). A record that cannot be written is `run.unwritten`
    (`finish` says so); on an error it is said here, before the error's own line."""
    run = RunDir.create(command, target.name, inputs=inputs)
    try:
        done = body(run)
    except OpsError as exc:
        run.write_record(
            inputs=inputs, outcome="error", exit_code=exc.exit_code, error=exc.to_dict()
        )
        say_record(run, where=False)
        raise
    except BaseException as exc:  # a bug or Ctrl-C: still leave a complete record behind
        outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "crashed"
        run.write_record(
            inputs=inputs,
            outcome=outcome,
            exit_code=EXIT_INTERRUPTED if outcome == "interrupted" else EXIT_INTERNAL,
            error={"error": type(exc).__name__, "message": str(exc)},
        )
        if outcome == "interrupted":
            raise RecordedInterrupt(run, str(exc)) from exc
        say_record(run, where=False)
        raise
    section = {key or command: done.section}
    run.write_record(inputs=inputs, outcome=done.outcome, exit_code=done.code, **section)
    return run, done
