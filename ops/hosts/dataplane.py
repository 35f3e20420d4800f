"""Where and how the control plane runs data-plane modules (`python -m checks.NAME --json`).

On `local` they run from the ops checkout itself; on any other target from the installed
release, `<remote_root>/current`. A module's exit 2 (bad input) becomes an OpsError (exit 2).
"""

from __future__ import annotations

from pathlib import Path

import checks
from ops.errors import HostError, OpsError
from ops.hosts.remote import Host, ModuleResult


def data_plane_dir(host: Host) -> str:
    """Where `python -m checks.*` runs: the ops checkout on `local`, `current/` on a host."""
    if host.target.is_local:
        return str(Path(checks.__file__).resolve().parent.parent)
    current = f"{host.target.remote_root}/current"
    found = host.run(["test", "-d", current], warn=True, step="find release")
    if not found.ok:
        detail = f" (test -d exited {found.rc}{': ' + found.tail() if found.tail() else ''})"
        raise HostError(
            f"no release at {current}" + ("" if found.rc == 1 else detail),
            target=host.name,
            step="data plane",
            hint=(
                f"install one first (ops deploy {host.name} --bootstrap); where releases/ holds "
                f"releases, ops rollback {host.name} --to ID makes one current (ops releases "
                f"{host.name} lists them)"
            ),
        )
    return current


def run_check(
    host: Host, module: str, args: list[str], stdin: bytes | None = None, timeout: float = 1800
) -> ModuleResult:
    """Run a check module on the host; its exit 2 (bad input) is our exit 2.

    The checks import only the standard library (test_checks_docs holds them to it), so they
    run as `python -S`: on this two-core CI host that is ~65 ms less per check run."""
    res = host.run_module(
        module, args, cwd=data_plane_dir(host), timeout=timeout, stdin=stdin, stdlib_only=True
    )
    if res.rc == 2:
        raise OpsError(f"{host.name}: {module}: {res.data.get('message', 'bad input')}")
    return res
