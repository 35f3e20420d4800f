"""Reading a file a user names, bounded: a regular file no larger than a limit, or one line.

Every file ops reads because a user named it (an inventory, a playbook, a golden set, the
records `ops report` reads) goes through `read_bytes_bounded` / `read_text_bounded`: a FIFO,
`/dev/zero`, a directory or a socket is refused as "not a regular file" before it is opened
(and the open is non-blocking, so a path swapped for a FIFO meanwhile cannot hang ops either),
and a file over the limit is refused before it is read: no input makes ops read without end.
A file that is not UTF-8 text is refused as "not UTF-8 text (byte N)": every file read so
is text (JSON, TOML, YAML, known_hosts).
A file whose brackets nest deeper than MAX_DEPTH (`[[[[...`, 200000 deep) is refused too, as
"nested too deeply": the parsers (json, tomllib, yaml) recurse per level and would otherwise
die of RecursionError; ops's own files nest a few levels.
The refusal is `FileRefused`, an `OpsError` (one `error:` line, exit 2) whose `problem` is
the bare reason for callers that name the file their own way. A file that does not exist or
cannot be opened raises the OSError as before (callers keep their own words for those).
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import stat
from pathlib import Path

from ops.errors import OpsError

MIB = 2**20
MAX_DEPTH = 128  # bracket nesting: records nest ~8 levels; json fails near 1000, tomllib ~300
# what hides a bracket from nesting: a string on one line ("..." with escapes, '...'), or a
# comment (# at a line's start or after a space)
_HIDDEN = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\n]*\'|(?<!\S)#[^\n]*')
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # an open adds 2, a close 0: i + depth
KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(OpsError):
    """A user-named file that ops will not read: not a regular file, over its size limit, or
    nested too deeply."""

    def __init__(self, path: Path | str, what: str, problem: str) -> None:
        super().__init__(f"{what} {path}: {problem}")
        self.path, self.problem = str(path), problem


def _kind(mode: int) -> str:
    return next((name for test, name in KINDS if test(mode)), "not a plain file")


def _size(n: int) -> str:
    return f"{round(n / MIB, 1):g} MiB" if n >= MIB else f"{n} bytes"


def not_regular(path: Path | str) -> str | None:
    """Why `path` (after symlinks) is not a regular file: "not a regular file (a FIFO)"; None
    when it is one. OSError (no such file, no permission) as `os.stat` raises it."""
    mode = os.stat(path).st_mode
    return None if stat.S_ISREG(mode) else f"not a regular file ({_kind(mode)})"


def too_deep(data: bytes) -> bool:
    """The brackets of this JSON / TOML / YAML text nest deeper than MAX_DEPTH, outside its
    strings and comments (counted generously: where unsure, a bracket counts). C-speed scans:
    about 1 s for 25 MB of small objects, nothing where there are few brackets."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False  # too few brackets to nest that deep
    br = _HIDDEN.sub(b"", data).translate(_STEPS, _NOT_BRACKETS)
    depth = map(operator.sub, itertools.accumulate(br, initial=0), range(len(br) + 1))
    return max(depth) > MAX_DEPTH


def read_bytes_bounded(path: Path | str, *, max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file `path`; FileRefused when it is not a regular file (after
    symlinks), is larger than `max_bytes` or nests deeper than MAX_DEPTH. `what` names the
    file in the message ("golden file", "inventory")."""
    why = not_regular(path)  # FileNotFoundError, PermissionError: the caller's to say
    if why:
        raise FileRefused(path, what, why)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # what was opened, should the path have changed meanwhile
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(path, what, f"not a regular file ({_kind(st.st_mode)})")
        limit = f"over the {_size(max_bytes)} limit for this {what}"
        if st.st_size > max_bytes:
            raise FileRefused(path, what, f"{_size(st.st_size)}, {limit}")
        data = f.read(max_bytes + 1)  # a file that grows after the stat is still bounded
    if len(data) > max_bytes:
        raise FileRefused(path, what, f"more than {_size(max_bytes)}, {limit}")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:  # no text at all: its brackets are noise, not nesting
        # (probe37au L2: random bytes were called "nested too deeply")
        raise FileRefused(path, what, f"not UTF-8 text (byte {exc.start})") from None
    if too_deep(data):
        raise FileRefused(path, what, f"nested too deeply (more than {MAX_DEPTH} levels)")
    return data


def read_text_bounded(path: Path | str, *, max_bytes: int, what: str) -> str:
    """`read_bytes_bounded` decoded as UTF-8 (text that is not is refused there)."""
    return read_bytes_bounded(path, max_bytes=max_bytes, what=what).decode("utf-8")
