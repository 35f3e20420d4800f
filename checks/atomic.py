"""`write_atomic`: the one way ddtree-ops replaces a file that someone may be reading.

A reader sees the old file or the whole new one, never a part: the data goes to a temporary
file in the same directory (so the rename stays on one filesystem), is flushed and fsync'ed,
and then replaces the target by one rename(2). The new file has mkstemp's mode 0600; a caller
that wants it readable by others chmods it. On any failure the temporary file is removed and
the old file is left as it was.

Standard library only: the checks run it on hosts, the SGLang integration hook imports it
inside the service process (`integration.hook`), and the control plane's run records use it
(`ops.hosts.records`). The host-side scripts sent as `python -c FILE` (`ops/hostside/releases.py`,
`ops/hostside/procman.py`) cannot import anything and keep their own few lines.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (creating its directory if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
