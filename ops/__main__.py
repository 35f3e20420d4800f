"""`python -m ops` is the `ops` command (the `ops` script calls `run` too).

The CLI's imports (typer, rich, pydantic) take a few tenths of a second; a Ctrl-C in that
time is one line and exit 130, as anywhere else, not a traceback."""

from __future__ import annotations

import sys


def run() -> None:
    try:
        from ops.cli import main
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
