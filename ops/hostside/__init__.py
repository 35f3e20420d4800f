"""Scripts sent to a host as `python -c` (stdlib only, they import nothing of ops): the
process manager (`procman`) and the releases' host side (`releases`: list, finalize, switch,
revert, prune inside the remote root).

They run on the host. The control plane reads them and sends them packed (`source`, used by
`ops.service.managers` and `ops.deploy.host_actions`); nothing imports them as modules at run
time (tests do, to use their helpers).
"""

import base64
import zlib
from pathlib import Path


def source(name: str) -> str:
    """What is sent as `python -c` for the host-side script `name`: one line that unpacks the
    script's text (zlib, base85: no quote or backslash in it) and runs it as `__main__`, with
    tracebacks naming ops/hostside/NAME.py and its lines. Sent as plain text, the two scripts
    outgrew what one argument may be (the kernel's 128 KiB, MAX_ARG_STRLEN): the revert guard
    carries both in one shell script, and over SSH a whole command is one argument of the
    remote user's shell."""
    text = (Path(__file__).parent / f"{name}.py").read_bytes()
    packed = base64.b85encode(zlib.compress(text, 9)).decode("ascii")
    where = f"ops/hostside/{name}.py"
    unpack = f'zlib.decompress(base64.b85decode("{packed}"))'
    return f'import base64,zlib;exec(compile({unpack},"{where}","exec"))'
