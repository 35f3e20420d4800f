"""`python -m checks.ping --json [--data TEXT] [--fail]`: is the data plane runnable here?

Reports the interpreter and platform the module ran under and echoes `--data`, so the control
plane can check that arguments arrive unmangled. `--fail` exits 1 (a failing check, still
with its JSON document), for tests of how failures travel back.
"""

from __future__ import annotations

import os
import platform
import socket
import sys

from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser


def main(argv: list[str] | None = None) -> None:
    p = parser("checks.ping", __doc__ or "")
    p.add_argument("--data", default="pong", help="text to echo back")
    p.add_argument("--fail", action="store_true", help="report a failure (exit 1)")
    args = p.parse_args(argv)
    exit_json(
        {
            "ok": not args.fail,
            "module": "checks.ping",
            "data": args.data,
            "python": platform.python_version(),
            "executable": sys.executable,
            "platform": platform.platform(),
            "hostname": socket.gethostname(),
            "cwd": os.getcwd(),
        },
        EXIT_FAIL if args.fail else EXIT_PASS,
    )


if __name__ == "__main__":
    main()
