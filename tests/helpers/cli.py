"""The one way tests run the real `ops` CLI: `python -m ops ...` in a subprocess.

    res = run_ops("hosts", inventory=inv, env=env)              # CompletedProcess (text)
    code, doc, err = ops_json("deploy", "loop", inventory=inv)  # --json, parsed

`ops_json` appends `--inventory` (when given) and `--json`, and fails the test with the exit
code, stdout and stderr when stdout is not one JSON document: a traceback or a stray print is
a failure with its evidence, never a KeyError later.

For any of the project's commands run in process (`engine.bench`, `kernels.bench`, ...):
`exit_code(main, argv)` is main's exit status, whether it returns it or argparse exits with
it, and `one_line(err)` asserts stderr is one `error: ...` line with no traceback and returns it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def run_ops(
    *args: str,
    inventory: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m ops ARGS [--inventory INV]`, text output captured, killed after `timeout`
    seconds; `env` None inherits the test's environment, `cwd` None its directory."""
    argv = [sys.executable, "-m", "ops", *args]
    if inventory is not None:
        argv += ["--inventory", str(inventory)]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )


def ops_json(
    *args: str,
    inventory: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> tuple[int, dict, str]:
    """`run_ops(ARGS --json)`: (exit code, the JSON document, stderr)."""
    res = run_ops(*args, "--json", inventory=inventory, env=env, timeout=timeout, cwd=cwd)
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"no JSON document (exit {res.returncode}): {res.stdout[-2000:]}\n{res.stderr[-4000:]}"
        ) from None
    return res.returncode, doc, res.stderr


def exit_code(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """main(argv)'s exit status, whether it returns it or argparse's error exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)  # type: ignore[arg-type]


def one_line(err: str) -> str:
    """The one `error: ...` line a user mistake prints on stderr (no traceback, nothing else)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
