"""The data-plane module contract: parse arguments, do the work, print ONE JSON document, exit.

Exit codes: 0 pass, 1 fail (the document says why), 2 bad input. Every module under
`checks/` (and `kernels.build`, `kernels.bench`) follows it, so the control plane can run it
on any host with `python -m <module> --json` and parse the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any, NoReturn

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


class ModuleArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad input as a JSON document and exit 2, like every other outcome."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """Parse, then check a `--url` the way every module needs it: http(s), a host, a port."""
        ns = super().parse_args(args, namespace)
        url = getattr(ns, "url", None)
        if isinstance(url, str):
            why = url_problem(url)
            if why:
                self.error(f"--url {url!r}: {why}")
        return ns

    def error(self, message: str) -> NoReturn:
        exit_json(
            {"ok": False, "module": self.prog, "error": "bad_input", "message": message},
            EXIT_BAD_INPUT,
        )


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a service base URL (None when it can)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "must be http:// or https://"
    if not parts.hostname:
        return "has no host"
    try:
        parts.port  # noqa: B018 - raises for a port out of range or not a number
    except ValueError as exc:
        return str(exc)
    return None


def parser(module: str, description: str) -> ModuleArgumentParser:
    p = ModuleArgumentParser(prog=module, description=description)
    p.add_argument("--json", action="store_true", help="print one JSON document (always on)")
    return p


def exit_json(doc: dict[str, Any], rc: int = EXIT_PASS) -> NoReturn:
    sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
    raise SystemExit(rc)
