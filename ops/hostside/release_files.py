"""A release's files as installed, against what they are now: which changed after a time (a
file release.json lists, edited, removed; one it does not list, added). Shared by the host-side
scripts (`procman`: current since the service started; `releases`: each release since it was
installed), and sent in front of each of them (`ops.hostside.source`). Stdlib only."""

from __future__ import annotations

import hashlib
import os
import stat

EDIT_SLACK_S = 2.0  # a process's start time from /proc is good to about a second
MAX_CODE_FILES = 10000  # what one look at a release's files weighs at most
# what a release holds that release.json does not list: ops's own files at its top, and
# what its service writes while it runs (the hook's status, counters, a shadow's cases)
RELEASE_OWN = {"release.json", "service.env", "proven.json", "rejected.json"}
RELEASE_RUNTIME = {"run"}


def changed_since(path: str, start: float | None) -> bool:
    """`path` (not followed) was changed after `start` (with a second's slack for /proc's)."""
    try:
        return start is not None and os.lstat(path).st_ctime > start + EDIT_SLACK_S
    except OSError:
        return False


def digest_since(path: str, start: float | None, moved: bool = False) -> str | None:
    """The sha256 of `path` where it was changed after `start`, or is under a directory that
    was (`moved`) ("" where it is then no regular file, or cannot be read: not the file
    installed), None where neither."""
    if not moved and not changed_since(path, start):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""  # (a link, or unreadable now)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):  # (streamed: a big file is no big read)
            digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return ""
    finally:
        os.close(fd)


def moved_in(release: str, rel: str, start: float, seen: dict[str, bool]) -> bool:
    """A directory between the release's top (not itself: its own files change its time) and
    the file `rel` changed after `start`: one renamed into place keeps its files' own times
    (probe37bg H1: code moved in as a directory was never looked at, and a failed deploy
    went back onto it). `seen` keeps each directory's answer."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        where = "/".join(parts[:i])
        if where not in seen:
            seen[where] = changed_since(os.path.join(release, where), start)
        if seen[where]:
            return True
    return False


def listed_changed(release: str, files: dict, start: float) -> list[str]:
    """The files release.json (`files`: path -> sha256) lists that changed after `start` to
    other bytes (or lie under a directory changed then: `moved_in`), and those removed since
    (their nearest directory left changed then: a whole directory removed too); at most
    MAX_CODE_FILES are looked at."""
    changed: list[str] = []
    seen: dict[str, bool] = {}
    for rel, sha in list(files.items())[:MAX_CODE_FILES]:
        if not isinstance(rel, str) or not isinstance(sha, str) or ".." in rel.split("/"):
            continue
        path = os.path.join(release, rel.lstrip("/"))
        if not os.path.lexists(path):
            left = os.path.dirname(path)
            while left.startswith(release + "/") and not os.path.lexists(left):
                left = os.path.dirname(left)
            if changed_since(left, start):
                changed.append(f"{rel} (removed)")
            continue
        held = digest_since(path, start, moved_in(release, rel.lstrip("/"), start, seen))
        if held is not None and held != sha:
            changed.append(rel)
    return changed


def added_since(release: str, files: set[str], start: float) -> list[str]:
    """The files in the release directory that release.json (`files`) does not list, added
    (or replaced) after `start`: a sitecustomize.py dropped into a release runs at its next
    start as surely as an edit does (probe37az M1). Only a directory changed since then (a
    name added to it changes its ctime) has its files looked at; below the top, every file
    of such a directory counts, whatever its own time (a directory renamed into place keeps
    its files' times: probe37bg H1); at most MAX_CODE_FILES entries. A `__pycache__` counts
    too: nothing ops starts writes bytecode into a release (PYTHONDONTWRITEBYTECODE, -B), and
    Python runs a .pyc found there in place of its unchanged source (probe37bj H1)."""
    found: list[str] = []
    seen, todo = 0, [("", False)]
    while todo and seen < MAX_CODE_FILES:
        rel, moved = todo.pop()
        where = os.path.join(release, rel) if rel else release
        try:
            fresh = changed_since(where, start)
            entries = list(os.scandir(where))
        except OSError:
            continue
        below = moved or (bool(rel) and fresh)
        for entry in entries:
            seen += 1
            name = f"{rel}/{entry.name}" if rel else entry.name
            if not rel and entry.name in RELEASE_RUNTIME:
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                todo.append((name, below))
            elif name not in files and not (not rel and name in RELEASE_OWN):
                if below or (fresh and changed_since(entry.path, start)):
                    found.append(name)
    return sorted(found)


def shown_name(name: str) -> str:
    """A file name as it can be printed: a character that is not printable (an escape
    sequence, a newline: probe37bg L2 drove the operator's terminal) as its Python escape,
    and a byte that is no UTF-8 (read as a lone surrogate, os.fsdecode's way) as that byte,
    `\\xff` (probe37bm L2: `\\udcff` is no byte anyone can find on disk)."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else escaped(c) for c in name)


def escaped(c: str) -> str:
    """One character that is not printable, escaped: the byte it stands for where it is a
    surrogate escape (0xdc80-0xdcff), else as Python writes it."""
    if "\udc80" <= c <= "\udcff":
        return f"\\x{ord(c) - 0xDC00:02x}"
    return repr(c)[1:-1]


def listed(names: list[str]) -> str:
    """Up to five names (each cut to 80 characters, unprintable ones escaped), and how many
    more."""
    shown = ", ".join(shown_name(n)[:80] for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def edited_by_hand(whose: str, names: list[str]) -> str:
    """The one sentence for a release whose `names` (its files, its service.env) changed
    since it was installed, `whose` naming it ("ID's", "current (ID)'s", "its")."""
    return f"{whose} files were changed since it was installed (by hand?): {listed(names)}"
