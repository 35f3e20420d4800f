"""`python -m ops.cli.reference`: the Markdown reference of every `ops` command, from the CLI.

It walks the click command that typer builds from the app (`typer.main.get_command`): every
command and subcommand, its summary and help, its arguments and its options with their
defaults, ranges and environment variables as the CLI itself states them. Nothing depends on
the terminal (no help screen is formatted, nothing is wrapped), so the output is the same
anywhere. docs/commands.md is this output, committed; tests/test_docs.py fails when they differ.

Regenerate: `python -m ops.cli.reference > docs/commands.md`
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import typer

from ops.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_HOLD,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
)

REGENERATE = "python -m ops.cli.reference > docs/commands.md"

EXIT_CODES = (
    (EXIT_OK, "pass / GO"),
    (EXIT_FAIL, "fail / NO-GO"),
    (
        EXIT_BAD_INPUT,
        "bad input, configuration, or a host ops could not act on (unreachable, its lock held, "
        "its disk full or read-only, a host-side command killed or stopped)",
    ),
    (EXIT_HOLD, "HOLD (the evidence is missing or too noisy to decide)"),
    (EXIT_INTERNAL, "internal error: a bug in ops (`OPS_DEBUG=1` adds the traceback)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)"),
)

# what ops reads from its environment, beside each option's own [env var: ...]
ENVIRONMENT = (
    ("OPS_RUNS_DIR", "where run records go (default: ./runs)"),
    (
        "OPS_HEARTBEAT_S",
        "how often a host command that runs long (a build, a self-test, a restart's wait for "
        "/health, a hung host python) says it still runs, in seconds from 1 to 3600 "
        "(default: 60)",
    ),
    ("OPS_DEBUG", "`1` adds the traceback to an internal error"),
)

# the metavar of a value whose option names none, by the parameter's Python type
_TYPE_METAVAR = {int: "INT", float: "FLOAT", str: "TEXT", Path: "PATH"}


def _md(text: str) -> str:
    """Text as Markdown: `<` outside code spans escaped (`<remote_root>` is not an HTML tag)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", parts[i])
    return "`".join(parts)


def _paragraphs(text: str | None) -> list[str]:
    """A help text's paragraphs, each on one line."""
    if not text:
        return []
    blocks = re.split(r"\n\s*\n", text.strip())
    return [" ".join(line.strip() for line in b.splitlines() if line.strip()) for b in blocks]


def _annotation(param: Any) -> Any:
    descriptor = getattr(param, "type_descriptor", None)
    ann = getattr(descriptor, "annotation", None)
    if typing.get_origin(ann) in (typing.Union, types.UnionType):  # X | None
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0] if len(args) == 1 else ann
    if typing.get_origin(ann) in (list, tuple):  # a repeatable option: its item's type
        args = typing.get_args(ann)
        ann = args[0] if args else str
    return ann


def _metavar(param: Any) -> str:
    if param.metavar:
        return str(param.metavar)
    return _TYPE_METAVAR.get(_annotation(param), "VALUE")


def _argument_name(param: Any) -> str:
    return str(param.metavar or param.name).upper()


def _argument_usage(param: Any) -> str:
    name = _argument_name(param)
    if param.nargs == -1:
        name += "..."
    return name if param.required else f"[{name}]"


def _help_text(param: Any, ctx: Any) -> str:
    """The parameter's help as the CLI states it (defaults, ranges, env var), on one line."""
    record = param.get_help_record(ctx)
    text = record[1] if record else (getattr(param, "help", None) or "")
    return re.sub(r"\s+", " ", text).strip()


def _names(opts: list[str]) -> str:
    """Option names as click lists them: the short ones first."""
    return ", ".join(sorted(opts, key=lambda o: o.startswith("--")))


def _option_label(param: Any) -> str:
    names = _names(param.opts)
    if param.secondary_opts:
        return f"{names} / {_names(param.secondary_opts)}"
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return names
    return f"{names} {_metavar(param)}"


def _command_lines(cmd: Any, ctx: Any, path: list[str], help_opts: str) -> list[str]:
    args = [p for p in cmd.params if p.param_type_name == "argument" and not p.hidden]
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    sub = _subcommands(cmd, ctx)
    usage = " ".join(
        ["ops", *path[1:], "[OPTIONS]"]
        + (["COMMAND"] if sub else [])
        + [_argument_usage(p) for p in args]
    )
    lines = [f"{'#' * min(len(path) + 1, 4)} {' '.join(path)}", ""]
    lines += [f"`{usage}`", ""]
    for para in _paragraphs(cmd.help):
        lines += [_md(para), ""]
    if args:
        lines += ["Arguments:", ""]
        lines += [f"- `{_argument_name(p)}`: {_md(_help_text(p, ctx))}" for p in args]
        lines.append("")
    lines += ["Options:", ""]
    lines += [f"- `{_option_label(p)}`: {_md(_help_text(p, ctx))}" for p in opts]
    lines += [f"- `{help_opts}`: show the command's help and exit.", ""]
    if sub:
        lines += ["Commands:", ""]
        lines += [
            f"- [`{' '.join([*path, name])}`](#{_anchor([*path, name])}): {_md(_summary(c))}"
            for name, c in sub
        ]
        lines.append("")
    return lines


def _subcommands(cmd: Any, ctx: Any) -> list[tuple[str, Any]]:
    if not hasattr(cmd, "list_commands"):
        return []
    found = [(name, cmd.get_command(ctx, name)) for name in cmd.list_commands(ctx)]
    return [(name, c) for name, c in found if c is not None and not c.hidden]


def _summary(cmd: Any) -> str:
    paras = _paragraphs(cmd.short_help or cmd.help)
    return paras[0] if paras else ""


def _anchor(path: list[str]) -> str:
    """The heading's anchor as GitHub makes it: lower case, spaces to hyphens."""
    return "-".join(path).lower()


def render() -> str:
    """The whole reference, as Markdown."""
    from ops.cli import app

    root = typer.main.get_command(app)
    context = root.context_class  # click's Context, as typer builds its commands with it
    root_ctx = context(root, info_name="ops", **root.context_settings)
    help_option = root.get_help_option(root_ctx)
    help_opts = _names(help_option.opts) if help_option else "--help"
    lines = [
        "# Command reference",
        "",
        "<!-- Generated by `python -m ops.cli.reference` from the CLI itself: do not edit. -->",
        "",
        f"Generated from the `ops` command line itself. Regenerate with `{REGENERATE}`;",
        "`tests/test_docs.py` fails while this page differs from the CLI.",
        "",
        "Exit codes, for every command:",
        "",
    ]
    lines += [f"- {code}: {what}" for code, what in EXIT_CODES]
    lines += ["", "Environment, for every command:", ""]
    lines += [f"- `{name}`: {what}" for name, what in ENVIRONMENT]
    lines.append("")

    def walk(cmd: Any, ctx: Any, path: list[str]) -> None:
        lines.extend(_command_lines(cmd, ctx, path, help_opts))
        for name, sub in _subcommands(cmd, ctx):
            sub_ctx = context(sub, info_name=name, parent=ctx, **sub.context_settings)
            walk(sub, sub_ctx, [*path, name])

    walk(root, root_ctx, ["ops"])
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
