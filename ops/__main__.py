"""`python -m ops` is the `ops` command (the `ops` script calls `run` too).

The CLI's imports (typer, rich, pydantic) take a few tenths of a second; a Ctrl-C in that
time is one line and exit 130 (with `--json`, one document too), as anywhere else, not a
traceback."""

from __future__ import annotations

import sys


def _is_interrupt(exc: BaseException) -> bool:
    """A Ctrl-C, or an error an import wrapped one in (pydantic builds its validators as a
    module is imported and reports a KeyboardInterrupt there as a SchemaError)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt) or "KeyboardInterrupt" in str(e):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def run() -> None:
    import signal

    # SIGINT inherited as ignored (a script's background job) is a Ctrl-C from the first
    # moment, not only once the imports are done (probe37aq L1: one sent then was lost)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        from ops.cli import main
    except BaseException as exc:
        if not _is_interrupt(exc):
            raise
        if "--json" in sys.argv[1:]:  # one document on stdout, as after the imports
            print('{"ok": false, "outcome": "interrupted"}')
        print("interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
