"""Scripts sent to a host as `python -c SOURCE` (stdlib only, they import nothing of ops): the
process manager (`procman`) and the releases' host side (`releases`: list, finalize, switch,
revert, prune inside the remote root).

They run on the host. The control plane reads them as text (`ops.service.managers`,
`ops.deploy.host_actions`); nothing imports them as modules at run time.
"""

from pathlib import Path


def source(name: str) -> str:
    """The text of the host-side script `name` (what is sent as `python -c`)."""
    return (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")
