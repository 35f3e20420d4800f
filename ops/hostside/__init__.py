"""Scripts sent to a host as `python -c` (stdlib only; of ops they import only the modules
sent with them, `pending` and `release_files`): the
process manager (`procman`) and the releases' host side (`releases`: list, finalize, switch,
revert, prune inside the remote root), with the deploy.pending record's rules they share
(`pending`), and how a release's files are told from what was installed (`release_files`).

They run on the host. The control plane reads them and sends them packed (`source`, used by
`ops.service.managers` and `ops.deploy.host_actions`); of them it imports only
`release_files.listed`, to name changed files as the host side does (tests import more, to use
their helpers).
"""

import base64
import zlib
from pathlib import Path

# the modules both scripts import (ops.hostside.pending, .release_files), sent in front
SHARED = ("pending", "release_files")


def _packed(name: str) -> str:
    text = (Path(__file__).parent / f"{name}.py").read_bytes()
    packed = base64.b85encode(zlib.compress(text, 9)).decode("ascii")
    return f'compile(zlib.decompress(base64.b85decode("{packed}")),"ops/hostside/{name}.py","exec")'


def source(name: str) -> str:
    """What is sent as `python -c` for the host-side script `name`: one line that unpacks the
    script's text (zlib, base85: no quote or backslash in it) and runs it as `__main__`, with
    tracebacks naming ops/hostside/NAME.py and its lines. In front of it, the shared modules
    (`SHARED`), each run into a module of its name in `sys.modules`: the script's
    `from ops.hostside.pending import ...` finds it there, on a host with no ops installed.
    Sent as plain text, the two scripts outgrew what one argument may be (the kernel's 128
    KiB, MAX_ARG_STRLEN): the revert guard carries both in one shell script, and over SSH a
    whole command is one argument of the remote user's shell."""
    front = "".join(
        f'sys.modules["ops.hostside.{mod}"]=types.ModuleType("ops.hostside.{mod}");'
        f'exec({_packed(mod)},sys.modules["ops.hostside.{mod}"].__dict__);'
        for mod in SHARED
    )
    return f"import base64,sys,types,zlib;{front}exec({_packed(name)})"
