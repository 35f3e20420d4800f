"""Scripts sent to a host as `python -c` (stdlib only; of ops they import only the module
sent with them, `pending`): the
process manager (`procman`) and the releases' host side (`releases`: list, finalize, switch,
revert, prune inside the remote root), with the deploy.pending record's rules they share
(`pending`).

They run on the host. The control plane reads them and sends them packed (`source`, used by
`ops.service.managers` and `ops.deploy.host_actions`); nothing imports them as modules at run
time (tests do, to use their helpers).
"""

import base64
import zlib
from pathlib import Path

SHARED = "pending"  # the module both scripts import (ops.hostside.pending), sent in front


def _packed(name: str) -> str:
    text = (Path(__file__).parent / f"{name}.py").read_bytes()
    packed = base64.b85encode(zlib.compress(text, 9)).decode("ascii")
    return f'compile(zlib.decompress(base64.b85decode("{packed}")),"ops/hostside/{name}.py","exec")'


def source(name: str) -> str:
    """What is sent as `python -c` for the host-side script `name`: one line that unpacks the
    script's text (zlib, base85: no quote or backslash in it) and runs it as `__main__`, with
    tracebacks naming ops/hostside/NAME.py and its lines. In front of it, the shared module
    `ops.hostside.pending`, run into a module of that name in `sys.modules`: the script's
    `from ops.hostside.pending import ...` finds it there, on a host with no ops installed.
    Sent as plain text, the two scripts outgrew what one argument may be (the kernel's 128
    KiB, MAX_ARG_STRLEN): the revert guard carries both in one shell script, and over SSH a
    whole command is one argument of the remote user's shell."""
    shared = f"ops.hostside.{SHARED}"
    return (
        "import base64,sys,types,zlib;"
        f'sys.modules["{shared}"]=types.ModuleType("{shared}");'
        f'exec({_packed(SHARED)},sys.modules["{shared}"].__dict__);'
        f"exec({_packed(name)})"
    )
