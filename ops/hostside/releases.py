"""Host side of releases: list, put in place, switch, revert and prune, inside `remote_root` only.

Sent to the host and run as `python -c <this file> ACTION ROOT ...` (stdlib only); prints one
JSON document, exits 0, or 2 with {"error": ...} for a refused request or a failed system call
(a full or read-only disk is one line, never a traceback). Every path it writes or deletes is
checked to resolve inside ROOT, and release ids must look like ids, so no input can reach
outside the root.

The host may have been touched by hand: `current` can be a symlink into `releases/` that ops
made (kind "release"), any other symlink ("foreign": a hand-made hotfix copy, a path outside
the root, a dangling link), a real directory or file, or absent ("none"). What it was before a
switch is recorded as it is (deploy.pending), and a revert returns exactly there; nothing here
ever leaves a host without the `current` it had, and a pending record that cannot be read whole
is never taken for a first install.

    prepare ROOT [WAIT_S] [settle]  wait (up to WAIT_S, 300) for a dead deploy's guard to finish
                                 putting the host back (it holds deploy.guard); put back a switch
                                 that neither a deploy nor its guard settled (deploy.pending);
                                 remove what dead deploys left (.incoming.*, .staging-*; a
                                 symlink of that name is unlinked, never followed)
    finalize ROOT STAGING ID     stdin {"release_json", "service_env"}: write them, then rename
                                 STAGING to releases/ID (a reader never sees half a release)
    switch ROOT ID [PENDING]     current -> releases/ID by one rename(2); previous -> the old one;
                                 with PENDING, write deploy.pending first (what current was, as
                                 it was) so the guard can revert; a real directory at `current`
                                 is moved aside to current.before-<utc> and comes back on revert
    commit ROOT [ID]             the switch is final: remove deploy.pending; with ID, mark that
                                 release proven (it passed its post-flight: proven.json)
    revert ROOT [settle]         if deploy.pending exists: switch back to exactly what current
                                 was, remove it; with settle, keep deploy.pending as "settled"
                                 (the guard still restarts the service if ops goes away before
                                 `commit`). A first install is not unlinked here (the service
                                 may run from it): {"first_install": true}, then `retire`
    retire ROOT ID               after the caller stopped the service: unlink a first install's
                                 `current` (only if it is releases/ID and pending says so)
    list ROOT                    every release with its manifest summary, size, current/previous,
                                 proven, damaged (a release.json that is not whole, or that
                                 names another release's id), and what `current` is
                                 (current_state)
    remove ROOT ID               delete one release (never current or previous)
    reject ROOT ID               stdin {"step", "detail", "at"}: the release failed its deploy after
                                 the switch and was rolled back (releases/ID/rejected.json)
    unreject ROOT ID AT          take back the rejection written at AT (its "at"): its evidence was
                                 the golden set's, not the release's; any other one stays
    prune ROOT KEEP              keep KEEP releases, proven ones first (newest first), then the
                                 newest unproven; always current, previous and the newest proven
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time

from ops.hostside.pending import ID_RE, not_whole, switched_by
from ops.hostside.release_files import added_since, listed_changed

STAGING_RE = re.compile(r"^\.staging-[A-Za-z0-9_.-]+\Z")
MAX_JSON = 1 << 20  # release.json, rejected.json, deploy.pending: none is near a MiB


class Refused(Exception):
    pass


def inside(root: str, path: str) -> str:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real_root == "/" or not real.startswith(real_root + os.sep):
        raise Refused(f"{path} is not inside {root}")
    return path


def rid(value: str) -> str:
    if not ID_RE.match(value):
        raise Refused(f"not a release id: {value!r}")
    return value


def read_json(path: str) -> object:
    """A small JSON file, or None when it is absent, not a regular file, too big or not JSON."""
    return _read_json(path)[0]


def _read_json(path: str) -> tuple[object, str | None]:
    """(the document, None), or (None, why not: missing, not a regular file, too big...)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, "a symlink" if os.path.islink(path) else f"unreadable ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > MAX_JSON:
            return None, f"{st.st_size} bytes (at most {MAX_JSON} are read)"
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_JSON + 1)
        return json.loads(data.decode("utf-8")), None
    except (OSError, ValueError, RecursionError):  # (nested deeper than the parser goes)
        return None, "not JSON"
    finally:
        os.close(fd)


def write_json(path: str, doc: object) -> None:
    """Write `doc` whole or not at all: a temporary file renamed over `path`; a failed write
    (a full disk) leaves no temporary file behind."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def link_state(root: str, name: str) -> dict:
    """What root/name is: a release ops switched to, or what else is there, as it is."""
    path = os.path.join(root, name)
    if not os.path.lexists(path):
        return {"kind": "none"}
    if os.path.islink(path):
        raw = os.readlink(path)
        base = os.path.basename(raw.rstrip("/"))
        releases = os.path.realpath(os.path.join(root, "releases"))
        real = os.path.realpath(path)
        name = os.path.basename(real)
        # a release of ops's by where the link resolves, whatever its shape (releases/ID/.,
        # an absolute path, through `previous`): probe37t T1
        if (
            ID_RE.match(name)
            and os.path.dirname(real) == releases
            and os.path.isdir(real)
            and not os.path.islink(os.path.join(releases, name))
        ):
            return {"kind": "release", "id": name, "link": raw}
        doc = {"kind": "foreign", "link": raw, "resolves": real, "exists": os.path.isdir(real)}
        if ID_RE.match(base) and real == os.path.join(releases, base) and not doc["exists"]:
            doc["release"] = base  # a link ops made, to a release deleted since
        if base.startswith("current.before-") and os.path.dirname(real) == os.path.realpath(root):
            doc["aside"] = True  # a hand-made current that a switch moved aside (ops's link)
        return doc
    if os.path.isdir(path):
        return {"kind": "directory", "path": path}
    return {"kind": "file", "path": path}


def describe(state: dict) -> str:
    """One line for a link_state (what a person reads in a refusal)."""
    kind = state.get("kind")
    if kind == "release":
        return f"releases/{state['id']}"
    if kind == "foreign":  # (.get: a state read back from deploy.pending may lack a key)
        link = state.get("link")
        if state.get("aside"):
            return f"{link} (the hand-made current a switch moved aside)"
        if state.get("exists"):
            return f"{link} (a symlink ops did not make)"
        if state.get("release"):
            return f"{link} (release {state['release']}, whose directory is gone)"
        return f"{link} (a symlink to nothing: {state.get('resolves', link)} does not exist)"
    if kind in ("directory", "file"):
        return f"{state.get('path')} (a real {kind}, not a symlink)"
    return "(none)"


def link_target(root: str, name: str) -> str | None:
    state = link_state(root, name)
    return state["id"] if state["kind"] == "release" else None


def set_link(root: str, name: str, dest: str) -> None:
    """root/name -> dest (a path as written in the link), by one rename(2) of a fresh symlink."""
    tmp = inside(root, os.path.join(root, f".{name}.new-{os.getpid()}"))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(dest, tmp)
    try:
        os.replace(tmp, os.path.join(root, name))
    except BaseException:
        os.unlink(tmp)
        raise


def release_link(release: str) -> str:
    return os.path.join("releases", release)


def mount_points() -> list[str]:
    """Every mount point of this host (/proc/self/mountinfo, its octal escapes undone): a
    bind mount of a directory on the same filesystem shows no other st_dev."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read(1 << 22).decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def mount_inside(path: str) -> str | None:
    """The first mount point at or under the directory `path`, or None: what a removal must
    never descend into (probe37bg H2: a filesystem bind-mounted into a release was emptied by
    a prune). From the host's mount table, and by st_dev where it cannot be read."""
    real = os.path.realpath(path)
    for point in mount_points():
        if point == real or point.startswith(real.rstrip("/") + "/"):
            return point
    try:
        top = os.lstat(path).st_dev
    except OSError:
        return None
    todo, seen = [path], 0
    while todo and seen < 100_000:  # (no recursion: a tree nested deep is no crash)
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.stat(follow_symlinks=False).st_dev != top:
                        return entry.path
                    todo.append(entry.path)
            except OSError:
                continue
    return None


def mounted_in(path: str) -> str | None:
    """Why the directory `path` is not removed, said after its name: a mount point at or
    under it (another filesystem: nothing of it is ours to remove); None where there is none."""
    mounted = mount_inside(path)
    if mounted is None:
        return None
    return f"holds a mount point ({mounted}): not removed; unmount it first (umount {mounted})"


def rmtree(root: str, path: str) -> None:
    inside(root, path)
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        why = mounted_in(path)
        if why:
            raise Refused(f"{os.path.basename(path)} {why}")
        shutil.rmtree(path)


def utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def shown(state: dict) -> str | None:
    """A state as the results name it: a release's id, else what is there (None: nothing)."""
    if state["kind"] == "release":
        return state["id"]
    return None if state["kind"] == "none" else describe(state)


CONTROL_FILES = ("deploy.guard", "deploy.switch")  # flocked by deploys and their guards


def mend_control_file(root: str, name: str) -> str | None:
    """root/name must be a regular file to be flocked: anything else there (a directory, a FIFO,
    a symlink, a device: put there by hand) would block every deploy and rollback, so it is
    moved aside to NAME.unusable-<utc> (a fresh file is made when it is next taken). What was
    done, or None when nothing needed doing."""
    path = os.path.join(root, name)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(info.st_mode):
        return None
    what = "a symlink" if stat.S_ISLNK(info.st_mode) else "a directory"
    if stat.S_ISFIFO(info.st_mode):
        what = "a FIFO"
    elif not (stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        what = "not a regular file"
    kept = f"{path}.unusable-{utc_stamp()}"
    os.rename(path, kept)
    return f"{name} was {what}: moved aside as {os.path.basename(kept)}"


def open_control_file(root: str, name: str) -> int:
    """An fd of root/name to flock, never through a link and never blocking on a FIFO."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(os.path.join(root, name), flags, 0o644)
    except OSError as exc:
        raise Refused(
            f"{os.path.join(root, name)} cannot be opened to lock ({exc.strerror}); "
            "`ops rollback` or a deploy moves it aside when it is not a regular file"
        ) from None


def fd_holders(fd: int) -> dict[int, str]:
    """The processes of this user with the file open at `fd` open too (a guard's shell and the
    commands it runs hold deploy.guard through their fd 8; /proc/locks names only the flock(1)
    that took it, long gone), each with its state letter (S, R, T: stopped...); {} where the
    host does not say (not Linux)."""
    st = os.fstat(fd)
    me, held = os.getuid(), {}
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        if pid == os.getpid():
            continue
        base = f"/proc/{pid}/fd"
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
            for name in os.listdir(base):
                other = os.stat(f"{base}/{name}")
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                    held[pid] = proc_state(pid)
                    break
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return held


def proc_state(pid: int) -> str:
    """The state letter of process `pid` ("?" where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read(4096).rsplit(b")", 1)[1].split()[0].decode("ascii", "replace")
    except (OSError, IndexError):
        return "?"


GUARD_LINK_WAIT_S = 10.0  # a guard still waiting for its ops's link to close after this long
# is not about to put the host back: the link is frozen, or that ops runs on (its lock lost)


def waiting_guards(holders: dict[int, str]) -> list[int]:
    """Among the holders of deploy.guard, the `cat`s through which guards wait for their ops
    to go (each reads its guard's link to ops, its shell's stdin, until that closes): [] where
    every guard there is past that wait, putting the host back (or none is there)."""
    found = []
    for pid in holders:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a for a in f.read(4096).split(b"\0") if a]
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read(4096).rsplit(b")", 1)[1].split()[1])
            if argv != [b"cat"] or parent not in holders:
                continue
            if os.readlink(f"/proc/{pid}/fd/0") == os.readlink(f"/proc/{parent}/fd/0"):
                found.append(pid)
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return sorted(found)


def wait_for_guard(root: str, wait_s: float) -> float:
    """Wait until no guard holds deploy.guard (a guard holds it for its whole life, so one
    whose deploy died is done putting the host back once it is free); the seconds waited. A
    guard that is stopped (SIGSTOP, a debugger) would never finish: refused at once, naming it
    and the fix. So is, after GUARD_LINK_WAIT_S, one that has not begun: it still waits for its
    link to its ops to close (probe37ay M1: a frozen SSH session's guard was said to be
    "putting the host back", and every deploy waited `wait_s` for it)."""
    os.makedirs(root, exist_ok=True)
    fd = open_control_file(root, "deploy.guard")
    t0 = next_look = time.time()
    holders: dict[int, str] = {}
    waiting: list[int] = []
    waiting_since: float | None = None
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() >= next_look:  # who holds it: a stopped guard never lets go
                    holders, next_look = fd_holders(fd), time.time() + 2
                    waiting = waiting_guards(holders)
                    waiting_since = (waiting_since or time.time()) if waiting else None
                pids = " ".join(str(p) for p in sorted(holders))
                stopped = sorted(p for p, state in holders.items() if state in ("T", "t"))
                if stopped:
                    raise Refused(
                        f"the guard of an earlier deploy (pid {pids}) holds deploy.guard but is "
                        f"stopped, so it cannot put the host back: kill -CONT "
                        f"{' '.join(map(str, stopped))} lets it finish; then try again"
                    ) from None
                if waiting_since is not None and time.time() - waiting_since >= GUARD_LINK_WAIT_S:
                    cats = " ".join(map(str, waiting))
                    raise Refused(
                        f"the guard of an earlier deploy (pid {pids}) has not begun to put the "
                        "host back: it still waits for its link to that deploy's ops to close (a "
                        "frozen SSH session, or that ops still runs, its lock lost); once the "
                        "link closes, it puts back a switch that was never proven. Where that "
                        f"ops is gone, kill {cats} ends the wait (the guard then puts the host "
                        "back at once); then try again"
                    ) from None
                if time.time() - t0 >= wait_s:
                    who = f" (pid {pids})" if pids else ""
                    raise Refused(
                        f"the guard of an earlier deploy{who} is still putting the host back "
                        f"(deploy.guard held for {wait_s:g} s); try again when it is done"
                    ) from None
                time.sleep(0.1)
    finally:
        os.close(fd)
    return round(time.time() - t0, 3)


def prepare(root: str, wait_s: float = 300.0, settle: bool = False) -> dict:
    """With `settle`, a switch put back keeps deploy.pending (marked settled) until the caller
    has restarted the service on it and commits: ops killed in between leaves the record, so
    the next prepare restarts it again instead of forgetting it."""
    os.makedirs(root, exist_ok=True)
    rel = os.path.join(root, "releases")
    if os.path.islink(rel):  # before anything is written through it (probe37t T8)
        raise Refused(
            f"{rel} is a symlink (to {os.readlink(rel)}), made by hand: ops keeps this root's "
            "releases in a directory of its own, and would send, switch to and prune whatever "
            f"it names (another root's releases); make it a directory (mv {rel} aside)"
        )
    mended = [note for name in CONTROL_FILES if (note := mend_control_file(root, name))]
    waited = wait_for_guard(root, wait_s)
    os.makedirs(rel, exist_ok=True)
    before = shown(link_state(root, "current"))
    put_back = None
    if os.path.lexists(os.path.join(root, "deploy.pending")):  # its deploy and guard are gone
        doc = revert(root, settle=settle, from_prepare=True)
        if doc.get("reverted"):  # the service may still run what was switched away from
            put_back = {"from": before, "to": doc["current"], "restart": True, "by": doc["by"]}
        elif doc.get("note"):
            put_back = {"from": before, "to": doc.get("current"), "note": doc["note"]}
    removed = []
    for name in sorted(os.listdir(rel)):
        if name.startswith(".incoming.") or STAGING_RE.match(name):
            path = os.path.join(rel, name)
            if os.path.islink(path):  # a stray link (made by hand): unlinked, never followed
                inside(root, os.path.join(rel, "."))
                os.unlink(path)
            else:
                rmtree(root, path)
            removed.append(name)
    for prefix in KEPT_ASIDE:
        removed += trim_kept(root, prefix)
    doc = {"removed": removed, "guard_waited_s": waited, "put_back": put_back}
    return {**doc, "mended": mended} if mended else doc


KEPT_ASIDE = (
    "deploy.pending.unreadable-",
    "deploy.pending.refused-",
    "deploy.guard.unusable-",
    "deploy.switch.unusable-",
)
KEEP_ASIDE = 5  # of each: the newest, for a person to look at; the rest would only pile up


def trim_kept(root: str, prefix: str) -> list[str]:
    """Remove all but the newest KEEP_ASIDE of root/<prefix><utc> that are no directories (a
    directory moved aside may hold a person's files: it stays). The names removed."""
    names = sorted(n for n in os.listdir(root) if n.startswith(prefix))
    gone = []
    for name in names[:-KEEP_ASIDE]:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            continue
        os.unlink(path)
        gone.append(name)
    return gone


def finalize(root: str, staging: str, release: str) -> dict:
    rid(release)
    path = os.path.join(root, "releases", staging)
    if not STAGING_RE.match(staging) or not os.path.isdir(inside(root, path)):
        raise Refused(f"no staging directory {staging}")
    dest = os.path.join(root, "releases", release)
    if os.path.lexists(dest):
        raise Refused(f"release {release} already exists")
    doc = json.loads(sys.stdin.read())
    for name, text in (("release.json", doc["release_json"]), ("service.env", doc["service_env"])):
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:  # (as hashed)
            f.write(text)
    os.rename(path, inside(root, dest))
    return {"release": release}


def guard_alive(root: str) -> bool:
    """A deploy's revert guard holds deploy.guard for its whole life."""
    fd = open_control_file(root, "deploy.guard")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing it drops a lock taken just now
    return False


def switch(root: str, release: str, pending: bool, by: str = "deploy") -> dict:
    rid(release)
    if not os.path.isdir(inside(root, os.path.join(root, "releases", release))):
        raise Refused(f"no release {release}")
    if not pending:
        return _switch(root, release, pending, by)
    # A pending switch (a deploy's or a rollback's) happens only while its guard lives, checked
    # under deploy.switch, which the guard takes before it reverts and keeps until it exits: a
    # guard that has already put the host back (its ops went away: a Ctrl-C, a dropped SSH
    # connection) can never be followed by this switch landing with no one left to revert it.
    fd = open_control_file(root, "deploy.switch")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not guard_alive(root):
            raise Refused(
                "no revert guard holds deploy.guard (the guard, or the deploy that asked for "
                "this switch, has gone): nothing was switched"
            )
        return _switch(root, release, pending, by)
    finally:
        os.close(fd)


def _switch(root: str, release: str, pending: bool, by: str = "deploy") -> dict:
    cur, prev = link_state(root, "current"), link_state(root, "previous")
    path, pending_path = os.path.join(root, "current"), os.path.join(root, "deploy.pending")
    aside = prev_aside = None
    if cur["kind"] in ("directory", "file"):
        if not pending:
            raise Refused(f"current is {describe(cur)}: only a deploy (with its revert) moves it")
        aside = f"{path}.before-{utc_stamp()}"
    if pending and prev["kind"] in ("directory", "file") and cur["kind"] != "none":
        # a stray `previous` (made by hand) would block every plain rollback from now on: it
        # is kept aside (the revert puts it back) and `previous` names what current was
        prev_aside = os.path.join(root, f"previous.before-{utc_stamp()}")
    if pending:
        write_json(
            pending_path,
            {
                "version": 2,
                "previous": cur.get("id"),
                "new": release,
                "old_previous": prev.get("id"),
                "current_before": cur,
                "previous_before": prev,
                "aside": aside,
                "previous_aside": prev_aside,
                "by": by,  # "deploy" or "rollback": who switched (what a revert undoes)
            },
        )
    moved = False
    try:
        if aside:
            os.rename(path, aside)  # a process running from it keeps running
            moved = True
        set_link(root, "current", release_link(release))
    except BaseException:
        if moved and not os.path.lexists(path):
            os.rename(aside, path)
        if pending:
            os.unlink(pending_path)
        raise
    if prev_aside:
        os.rename(os.path.join(root, "previous"), prev_aside)
        prev = {"kind": "none"}
    if prev["kind"] in ("none", "release", "foreign") and not (
        cur["kind"] == "release" and cur["id"] == release
    ):
        if cur["kind"] == "release":
            set_link(root, "previous", release_link(cur["id"]))
        elif cur["kind"] == "foreign" and hand_made_release(root, cur["link"]):
            # a copy a rollback could go back to; never a link to nothing, nor to what is no
            # release (probe37t T6: current -> releases left previous -> releases)
            set_link(root, "previous", cur["link"])
        elif prev.get("id") == release:  # kept, it would name current: no previous instead
            os.unlink(os.path.join(root, "previous"))
        elif aside:
            set_link(root, "previous", aside)
    out: dict = {"previous": cur.get("id"), "current": release}
    if cur["kind"] not in ("release", "none"):
        out["previous_state"] = cur
    return out


def commit(root: str, release: str | None = None) -> dict:
    try:
        os.unlink(os.path.join(root, "deploy.pending"))
        out: dict = {"pending": True}
    except FileNotFoundError:
        out = {"pending": False}
    if release:
        rid(release)
        try:  # a mark that could not be written costs prune a hint, never the deploy
            marker = os.path.join(
                inside(root, os.path.join(root, "releases", release)), "proven.json"
            )
            write_json(marker, {"at": utc_stamp()})
            out["proven"] = True
        except OSError as exc:
            out["proven"] = False
            out["proven_error"] = str(exc)
    # where current is as the switch is made final: moved by hand meanwhile, the deploy says so
    # (probe37aw L1: "NEW is current and healthy" of a current a hand had moved)
    out["current_state"] = link_state(root, "current")
    return out


def in_root(root: str, path: str) -> bool:
    """`path` names an entry of the root itself (not of a directory below it)."""
    return os.path.realpath(os.path.dirname(path)) == os.path.realpath(root)


def before_states(doc: dict) -> tuple[dict, dict]:
    """What current and previous were before the switch (a version-1 record: ids only)."""

    def of(rel: str | None) -> dict:
        if rel:
            return {"kind": "release", "id": rel, "link": release_link(rel)}
        return {"kind": "none"}

    cur = doc.get("current_before") or of(doc["previous"])
    prev = doc.get("previous_before") or of(doc["old_previous"])
    return cur, prev


def put_current_back(root: str, before: dict, aside: str | None) -> str | None:
    """Make current exactly what it was; why not, where it could not be (then it stays)."""
    path = os.path.join(root, "current")
    if before["kind"] == "release":
        # one no deploy rejected: a switch is never made from one, so a record naming one is
        # not what current was (probe37r R6: a forged record had a rollback stop the service
        # and switch onto a rejected release, leaving it down)
        why = release_problem(root, before["id"])
        if why:
            return why
        set_link(root, "current", release_link(before["id"]))  # the release, whatever the link
        return None
    why = unrevertible(root, before, aside)
    if why:
        return why
    if before["kind"] == "foreign":
        set_link(root, "current", before["link"])
        return None
    if os.path.islink(path):
        os.unlink(path)  # rename(2) cannot put a directory over a symlink
    os.rename(str(aside), path)
    return None


def same_place(root: str, now: dict, before: dict) -> bool:
    """`now` (current as it is) is the release or link `before` (a record's state) names."""
    if now["kind"] != before.get("kind"):
        return False
    if now["kind"] == "release":
        return now["id"] == before.get("id")
    if now["kind"] == "foreign":
        link = before.get("link")
        return isinstance(link, str) and (
            link == now["link"] or os.path.realpath(os.path.join(root, link)) == now["resolves"]
        )
    return False


def where_current_left(root: str, doc: dict, before: dict) -> str | None:
    """Whether deploy.pending describes the switch the host is in (probe37v V2: a forged
    record whose `new` is not where current points drove the revert, which switched a serving,
    proven current to the record's current_before). A switch writes its record, moves a real
    current aside, then links current to `new`: current is `new` (made), or still what it was
    (died before its link; or a revert put it back and died before its record went), or
    missing with the real directory at the record's aside (died between the two). None: the
    switch was made, revert it; "": current is what it was before, nothing to move; a reason:
    current is somewhere no switch of this record left it."""
    now = link_state(root, "current")
    if now["kind"] == "release" and now["id"] == doc["new"]:
        return None
    if before["kind"] in ("directory", "file"):
        if now["kind"] == before["kind"]:
            return ""
        if now["kind"] == "none" and moved_aside(root, doc.get("aside"), before["kind"]):
            return None
    elif same_place(root, now, before):
        return ""
    return f"current is {describe(now)}, where no switch of that record leaves it"


def previous_elsewhere(root: str, doc: dict, before: dict, prev_before: dict) -> str | None:
    """Why a made switch from release `before` is not the one the host is in, as `previous`
    says (None: it may be): the switch links previous to what current was once current is
    `new` (before that, previous is still what it was: `prev_before`, also `old_previous`). A
    record whose current before was edited to an older release (probe37bj M1: the revert
    moved the host three deploys back, to a release it was not on) names another."""
    if before.get("kind") != "release":
        return None
    prev = link_state(root, "previous")
    was = (before.get("id"), prev_before.get("id"), doc.get("old_previous"))
    if prev["kind"] != "release" or prev["id"] in was:
        return None
    return f"previous is {describe(prev)}, where that switch leaves {describe(before)}"


def current_unrevertible(root: str, state: dict) -> str | None:
    """Why a failed deploy's revert could not put `current` (as it is now: `state`) back, so a
    deploy refuses to switch away from it; None where it could. A release of ops's that is
    damaged or marked rejected (the revert refuses both: a record naming one is not what a
    switch left; probe37u U8: a deploy from a current with a rejected.json failed, and its
    rollback could not come back, leaving the service down)."""
    if state["kind"] == "none":
        return None
    if state["kind"] == "release":
        why = release_problem(root, state["id"])
        return None if why == "it is gone" else why
    return unrevertible(root, state)


def release_problem(root: str, release: str) -> str | None:
    """Why a revert would not put current back on releases/`release` ("it is gone" where it is
    not there), None where it would: a release no switch is made from (a deploy refuses to
    switch away from one, its `current` step), so a record naming one is not what current
    was: a link at releases/ID (out of the root: probe37u U1), a release a deploy rejected
    (probe37r R6), a damaged one: its release.json not whole (U2), its service.env not one a
    start runs (probe37t T2)."""
    rel = os.path.join(root, "releases", release)
    if os.path.islink(rel):
        return f"releases/{release} is a symlink (to {os.readlink(rel)}), not a release ops made"
    if not os.path.isdir(rel):
        return "it is gone"
    if os.path.lexists(os.path.join(rel, "rejected.json")):
        return "a deploy rejected it: no switch is made from one"
    bad = damage(rel, release)[1]
    return f"it is damaged ({bad}): no switch is made from one" if bad else None


def unrevertible(root: str, state: dict, aside: object = None) -> str | None:
    """Why a current that ops did not make (`state`: a foreign link, or a real directory
    moved aside to `aside`) could not be put back by a revert, None where it could: only a
    copy of a release a start runs (hand_made_release) is. A deploy refuses to switch away
    from any other (its revert could not come back to it), so a record naming one is not what
    current was, and it stays where it is: a release of another root (probe37q Q4), a link at
    the aside name (probe37r R1, R2: renamed into current, the service restarted on it and
    left down) or an empty directory there (R2's variant). `aside` None: `state` as current is
    now, for the deploy's check before its switch."""
    kind = state.get("kind")
    if kind == "foreign":
        link = state.get("link")
        return None if hand_made_release(root, link) else f"{link} is no release copy in the root"
    if kind != "directory":
        return f"a {kind} is no release a start could run"
    if aside is None:
        return None if hand_made_release(root, "current") else "it holds no whole release"
    if not isinstance(aside, str) or not in_root(root, aside) or os.path.islink(aside):
        return f"{aside} is not the real directory a switch moves aside"
    return None if hand_made_release(root, aside) else f"{aside} holds no whole release"


def moved_aside(root: str, aside: object, kind: str) -> bool:
    """`aside` is what a switch moved aside there: an entry of the root itself, the real
    directory or file it was (a switch renames, it never makes a link)."""
    if not isinstance(aside, str) or not in_root(root, aside) or os.path.islink(aside):
        return False
    return os.path.isdir(aside) if kind == "directory" else regular(aside)


def hand_made_release(root: str, link: object) -> bool:
    """`link` (a symlink's text, or a path, relative to the root) resolves to a release a person
    made under the root: a directory below it (releases/hotfix, a copy beside the releases),
    not releases/ itself nor a release of ops's there (linked as a release; a link reaching one
    another way, through `previous` say, is no copy: probe37s S2, current -> previous, then
    previous -> previous), holding release.json and service.env (what a start needs)."""
    if not isinstance(link, str):
        return False
    real, top = os.path.realpath(os.path.join(root, link)), os.path.realpath(root)
    releases = os.path.join(top, "releases")
    if not real.startswith(top.rstrip("/") + "/") or real == releases:
        return False
    if os.path.dirname(real) == releases and ID_RE.match(os.path.basename(real)):
        return False
    # nor a copy of a rejected release (probe37t T9: a forged record naming releases/hotfix,
    # a copy of one, had a rollback stop the service and restart it there), nor one whose
    # service.env a start refuses
    # nor one of ops's own transient directories there, which recover removes (probe37u U3:
    # current -> releases/.staging-foo, put back, then removed under it)
    if os.path.dirname(real) == releases and os.path.basename(real).startswith("."):
        return False
    return (
        os.path.isdir(real)
        and damage(real, None)[1] is None
        and not os.path.lexists(os.path.join(real, "rejected.json"))
    )


def put_previous_back(root: str, before: dict) -> None:
    path = os.path.join(root, "previous")
    if before["kind"] == "release":
        set_link(root, "previous", release_link(before["id"]))
    elif before["kind"] == "foreign" and hand_made_release(root, before.get("link")):
        set_link(root, "previous", before["link"])  # (not one a record names elsewhere)
    elif before["kind"] == "none" and os.path.islink(path):
        os.unlink(path)


def keep_refused(path: str, why: str, said: str, now: str | None) -> dict:
    """A deploy.pending no revert follows (`said`, `why`), kept for a person as
    deploy.pending.refused-<utc>; current stays as it is (`now`)."""
    kept = f"{path}.refused-{utc_stamp()}"
    os.replace(path, kept)
    note = f"{said}: current left as it is, the record kept as {os.path.basename(kept)}"
    return {"reverted": False, "refused": why, "current": now, "note": note}


def revert(root: str, settle: bool = False, from_prepare: bool = False) -> dict:
    path = os.path.join(root, "deploy.pending")
    if not os.path.lexists(path):
        return {"reverted": False}
    doc = read_json(path)
    if isinstance(doc, dict) and doc.get("settled"):
        # switched back already; the service still needs its restart, where current is still
        # what the record put back (probe37ae M2: one naming another release restarted the
        # service for a switch that was not this host's)
        now = shown(link_state(root, "current"))
        if doc.get("current") != now:
            named = doc.get("current")
            said = (
                f"deploy.pending (settled) says current was put back on {named[:200]}"
                if isinstance(named, str)
                else "deploy.pending (settled) names no release current was put back on"
            ) + f", but current is {now or '(none)'}: not this host's switch"
            return keep_refused(path, "current is elsewhere", said, now)
        if not settle:
            os.unlink(path)
        by = switched_by(doc)
        return {"reverted": True, "current": shown(link_state(root, "current")), "by": by}
    why = not_whole(doc)
    now = shown(link_state(root, "current"))
    if why:  # never read as a first install: current stays as it is, the record is kept aside
        kept = f"{path}.unreadable-{utc_stamp()}"
        os.replace(path, kept)
        note = (
            f"deploy.pending could not be read whole ({why}): current left as it is, "
            f"the record kept as {os.path.basename(kept)}"
        )
        return {"reverted": False, "unreadable": why, "current": now, "note": note}
    assert isinstance(doc, dict)
    cur_before, prev_before = before_states(doc)
    if cur_before["kind"] == "none":
        # a first install: unlinking current under a running service would leave it down
        if from_prepare:
            os.unlink(path)
            note = (
                f"a first install ({doc['new']}) was never proven: current stays on it "
                "(no release to go back to); check the service, or ops rollback / deploy"
            )
            return {"reverted": False, "first_install": True, "current": now, "note": note}
        return {"reverted": False, "first_install": True, "new": doc["new"], "current": now}
    new_proven = os.path.join(root, "releases", doc["new"], "proven.json")
    if switched_by(doc) == "deploy" and os.path.lexists(new_proven):
        # a deploy removes its record before it marks its release proven: a deploy's record
        # whose release is proven is no switch still to undo (probe37x M2: a stale one moved a
        # host off its proven current onto a release that had never served)
        said = f"deploy.pending names a deploy of {doc['new']}, which was proven since"
        return keep_refused(path, "its release was proven", said, now)
    elsewhere = where_current_left(root, doc, cur_before)
    if elsewhere is None:  # made: previous names what current was
        elsewhere = previous_elsewhere(root, doc, cur_before, prev_before)
    if elsewhere:  # not the switch the host is in
        said = f"deploy.pending describes a switch from {describe(cur_before)} to {doc['new']}"
        return keep_refused(path, elsewhere, f"{said}, but {elsewhere}", now)
    # "": current is what it was before already (a switch not made, or one put back)
    why = None if elsewhere == "" else put_current_back(root, cur_before, doc.get("aside"))
    if why == "it is gone":
        os.unlink(path)
        note = f"what current was before ({describe(cur_before)}) is gone: current stays {now}"
        return {"reverted": False, "gone": describe(cur_before), "current": now, "note": note}
    if why:  # not what a switch could have left
        said = f"deploy.pending names a current before ({describe(cur_before)}) that no switch "
        return keep_refused(path, why, f"{said}could have left ({why})", now)
    if prev_before["kind"] == "release" and prev_before.get("id") == cur_before.get("id"):
        # a record whose previous names current's release (written by hand: probe37bd L5): it
        # would name current, so no previous, as a switch leaves none there
        if os.path.islink(os.path.join(root, "previous")):
            os.unlink(os.path.join(root, "previous"))
    elif prev_before["kind"] not in ("directory", "file"):
        put_previous_back(root, prev_before)
    elif moved_aside(root, doc.get("previous_aside"), prev_before["kind"]):
        if os.path.islink(os.path.join(root, "previous")):
            os.unlink(os.path.join(root, "previous"))
        os.rename(doc["previous_aside"], os.path.join(root, "previous"))
    back = shown(cur_before)
    by = switched_by(doc)
    if not settle:
        os.unlink(path)
        return {"reverted": True, "current": back, "by": by}
    try:
        write_json(path, {"settled": True, "current": back, "by": by})
    except OSError as exc:
        # current is back; the record stays as it was, so a guard that runs later reverts again
        # to the same place (a no-op) and restarts the service
        note = f"current is back; deploy.pending not updated ({exc.strerror})"
        return {"reverted": True, "current": back, "note": note, "by": by}
    return {"reverted": True, "current": back, "by": by}


def retire(root: str, release: str) -> dict:
    """A first install that failed, after its service was stopped: no current at all again."""
    rid(release)
    path = os.path.join(root, "deploy.pending")
    doc = read_json(path)
    if not_whole(doc) or not isinstance(doc, dict) or doc["new"] != release:
        raise Refused(f"no pending first install of {release}")
    if before_states(doc)[0]["kind"] != "none":
        raise Refused(f"{release} was not a first install")
    if link_target(root, "current") == release:
        os.unlink(os.path.join(root, "current"))
    os.unlink(path)
    return {"retired": release, "current": shown(link_state(root, "current"))}


def du(path: str) -> int:
    """The bytes the files under `path` take (a sparse file counts its allocated blocks). An
    explicit stack, not os.walk's recursion: a tree nested thousands deep by hand made every
    listing, deploy and rollback fail with RecursionError (probe37r R4). Links not followed."""
    total, todo = 0, [path]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    total += min(st.st_size, st.st_blocks * 512)  # a sparse file: what it takes
            except OSError:
                pass
    return total


def regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def manifest(path: str) -> tuple[dict, str | None]:
    """The fields of a release.json the commands use, and why it is damaged (None: whole)."""
    man, problem = _read_json(path)
    if not isinstance(man, dict):
        return {}, f"release.json is {problem or 'not a JSON object'}"
    bad: list[str] = []
    out: dict = {}
    for key in ("git_sha", "created", "cuda_arch"):
        value = man.get(key)
        out[key] = value if value is None or isinstance(value, str) else None
        if out[key] is None and key != "cuda_arch":
            bad.append(key)
    comps = man.get("components")
    if isinstance(comps, dict) and all(isinstance(v, str) for v in comps.values()):
        out["components"] = comps
    else:
        out["components"] = {}
        bad.append("components")
    hook = man.get("hook")
    out["hook"] = hook if isinstance(hook, str) else None
    env_sha = man.get("service_env_sha256")  # (from releases made since it was recorded)
    out["service_env_sha256"] = env_sha if isinstance(env_sha, str) else None
    files = man.get("files")  # path -> sha256 of each file installed
    out["files"] = files if isinstance(files, dict) else None
    named = man.get("id")
    out["id"] = named if isinstance(named, str) else None
    selftest = man.get("selftest")
    if not isinstance(selftest, dict) or selftest.get("ok") not in (True, False):
        selftest = {}
        bad.append("selftest")
    out["selftest_ok"] = selftest.get("ok")
    gpu = selftest.get("gpu")
    out["selftest_gpu"] = gpu if gpu is None or isinstance(gpu, str) else str(gpu)[:200]
    return out, (f"release.json: bad or missing {', '.join(bad)}" if bad else None)


def damage(release: str, name: str | None) -> tuple[dict, str | None]:
    """The release.json fields of the release directory, and why it is damaged (None: whole):
    its release.json not whole or another release's (`name`: the id it must name, None for a
    hand-made copy), its service.env not one a start runs, its rejected.json unreadable."""
    fields, damaged = manifest(os.path.join(release, "release.json"))
    if damaged is None and name and fields.get("id") not in (None, name):  # copied over by hand
        damaged = f"release.json is release {str(fields['id'])[:200]}'s, not {name}'s"
    damaged = damaged or env_problem(release)
    rejected, why = _read_json(os.path.join(release, "rejected.json"))
    if damaged is None and why != "missing" and not isinstance(rejected, dict):
        damaged = f"rejected.json is {why or 'not an object'} (a rejection, unreadable)"
    return fields, damaged


def code_edited(release: str, files: dict | None) -> list[str]:
    """The files of the release directory that are not as installed (probe37bd M3: an edited
    release was listed clean, and a rollback went to it without a word): one release.json
    (`files`: path -> sha256) lists, changed since release.json was written (its ctime) to
    other bytes, or removed; or one it does not list, added since. [] where it cannot be
    told."""
    if not isinstance(files, dict):
        return []
    try:
        start = os.lstat(os.path.join(release, "release.json")).st_ctime
    except OSError:
        return []
    added = added_since(release, set(files), start)
    return listed_changed(release, files, start) + [f"{name} (added)" for name in added]


def env_problem(release: str) -> str | None:
    """Why the release directory's service.env is not one a start runs it with (None: it is)."""
    env = os.path.join(release, "service.env")
    if not regular(env):
        what = "missing" if not os.path.lexists(env) else "not a regular file"
        return f"service.env is {what} (the release's configuration: kernels, backends)"
    if os.lstat(env).st_size > MAX_JSON:  # what a start refuses
        return f"service.env is {os.lstat(env).st_size} bytes (a start reads at most {MAX_JSON})"
    try:  # as a start reads it (probe37bm M2: a NUL or a byte not UTF-8 listed it whole, and
        # `rollback --to` switched to it only to have the start refuse)
        with open(env, "rb") as f:
            raw = f.read(MAX_JSON + 1)
    except OSError as exc:
        return f"service.env cannot be read ({exc.strerror})"
    if b"\0" in raw:
        return "service.env holds a NUL byte (no environment can carry it)"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"service.env is not UTF-8 text (at byte {exc.start})"
    return None


def env_edited(release: str, recorded: str | None) -> bool:
    """The release's service.env is not what was installed (edited by hand since: probe37ao
    L4, listed as it was); False where that cannot be told (no hash recorded)."""
    if not recorded:
        return False
    try:
        with open(os.path.join(release, "service.env"), "rb") as f:  # (env_problem: regular,
            held = f.read(MAX_JSON + 1)  # at most MAX_JSON)
    except OSError:
        return False
    return hashlib.sha256(held).hexdigest() != recorded


def listing(root: str) -> dict:
    rel = os.path.join(root, "releases")
    cur_state, prev_state = link_state(root, "current"), link_state(root, "previous")
    current, previous = cur_state.get("id"), prev_state.get("id")
    out, odd = [], []
    names = sorted(n for n in os.listdir(rel) if ID_RE.match(n)) if os.path.isdir(rel) else []
    for name in names:
        path = os.path.join(rel, name)
        if os.path.islink(path) or not os.path.isdir(path):  # not ops's: said, never taken
            odd.append(
                {"id": name, "kind": "a symlink" if os.path.islink(path) else "not a directory"}
            )
            continue
        fields, damaged = damage(os.path.join(rel, name), name)
        rejected, _ = _read_json(os.path.join(rel, name, "rejected.json"))
        out.append(
            {
                "id": name,
                "git_sha": fields.get("git_sha"),
                "created": fields.get("created"),
                "cuda_arch": fields.get("cuda_arch"),
                "components": fields.get("components") or {},
                "hook": fields.get("hook"),
                "selftest_ok": fields.get("selftest_ok"),
                "selftest_gpu": fields.get("selftest_gpu"),
                "size_bytes": du(os.path.join(rel, name)),
                "current": name == current,
                "previous": name == previous,
                "rejected": (
                    {k: str(rejected.get(k, ""))[:2000] for k in ("step", "detail", "at")}
                    if isinstance(rejected, dict)
                    else None
                ),
                "proven": os.path.isfile(os.path.join(rel, name, "proven.json")),
                "damaged": damaged,
                "env_edited": not damaged and env_edited(path, fields.get("service_env_sha256")),
                "code_edited": [] if damaged else code_edited(path, fields.get("files")),
            }
        )
    pending = os.path.lexists(os.path.join(root, "deploy.pending"))
    return {
        "nested": nested_in(root),
        "releases_link": os.readlink(rel) if os.path.islink(rel) else None,
        "releases": out,
        # entries with a release id's name that are no release (a symlink, a file): skipped by
        # every command and by prune, and said by `ops releases` (probe37ar L2)
        "not_releases": odd[:100],
        "current": current,
        "previous": previous,
        "pending": pending,
        "current_state": cur_state,
        # what a deploy's revert could not put back (a deploy then refuses to switch from it)
        "current_unrevertible": current_unrevertible(root, cur_state),
        "previous_state": prev_state,
    }


def nested_in(root: str) -> str | None:
    """The remote root whose releases/ holds `root` (its current a link or a directory), as
    the lock refuses it; None for a root of its own."""
    real = os.path.realpath(root) + "/"
    if "/releases/" not in real:
        return None
    top = real.split("/releases/", 1)[0] or "/"
    cur = os.path.join(top, "current")
    return top if os.path.islink(cur) or os.path.isdir(cur) else None


def reject(root: str, release: str) -> dict:
    rid(release)
    path = os.path.join(root, "releases", release)
    if not os.path.isdir(inside(root, path)):
        raise Refused(f"no release {release}")
    if os.path.isfile(os.path.join(path, "proven.json")):
        # a release that passed a post-flight stays open to `rollback --to`: a rollback whose
        # checks failed for a passing cause (a --wait shorter than the engine's start, a golden
        # set recorded from another release) marked one rejected for good (probe37ab H1)
        return {"rejected": None, "kept": "it passed a post-flight before (proven.json)"}
    doc = json.loads(sys.stdin.read() or "{}")
    why = {k: str(doc.get(k, ""))[:2000] for k in ("step", "detail", "at")}
    write_json(os.path.join(path, "rejected.json"), why)
    return {"rejected": release}


def unreject(root: str, release: str, at: str) -> dict:
    rid(release)
    path = os.path.join(root, "releases", release)
    if not os.path.isdir(inside(root, path)):
        raise Refused(f"no release {release}")
    marked = os.path.join(path, "rejected.json")
    doc, _ = _read_json(marked)
    if not isinstance(doc, dict) or doc.get("at") != at:  # not the rejection taken back
        return {"unrejected": None}
    os.unlink(marked)
    return {"unrejected": release}


def in_use(root: str) -> dict[str, str]:
    """The releases something on the host still points into, by what points (its realpath, not
    only an id-shaped link: probe37t T1, `previous -> releases/ID/.` after a --force deploy,
    was pruned, the release the host had been on): every symlink of the root (current,
    previous, what a switch moved aside), every hand-made copy of a release in the root (by
    the directories its service.env names), every process a pidfile under run/ names, and
    every other live process whose working directory is in a release."""
    top = os.path.realpath(os.path.join(root, "releases"))
    used: dict[str, str] = {}

    def add(path: str, what: str) -> None:
        try:
            real = os.path.realpath(path)
        except OSError:  # /proc/PID/cwd of another user's process, or of one that ended
            return
        if real.startswith(top + "/"):
            name = real[len(top) + 1 :].split("/")[0]
            if ID_RE.match(name):
                used.setdefault(name, what)

    for name in os.listdir(root) if os.path.isdir(root) else []:
        if os.path.islink(os.path.join(root, name)):
            add(os.path.join(root, name), name)
        # a hand-made copy of a release (current -> copy, or one a switch moved aside) that a
        # revert may go back to: its service.env still names its original's directory (its
        # PYTHONPATH, its hook), which a prune deleted under it (probe37an L5)
        for named in copy_names(root, name, top):
            add(os.path.join(top, named), f"{name}'s service.env (a copy of a release)")
    run = os.path.join(root, "run")
    pidfiles = os.listdir(run) if os.path.isdir(run) and not os.path.islink(run) else []
    for name in (n for n in pidfiles if n.endswith(".pid")):
        doc, _ = _read_json(os.path.join(run, name))
        pid = doc.get("pid") if isinstance(doc, dict) else None
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            add(f"/proc/{pid}/cwd", f"the service of run/{name} (pid {pid})")
    # and any live process that runs from a release, whatever its pidfile says: a service
    # whose pidfile was lost or removed by hand, a daemon that left its session (probe37aq H1:
    # a prune deleted the release an unmanaged service ran from)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        add(f"/proc/{pid}/cwd", f"pid {pid}, which runs from it")
    return used


def copy_names(root: str, name: str, top: str) -> set[str]:
    """The releases whose directories the service.env of `name`, an entry of the root that is
    a hand-made copy of a release (a directory outside releases/, itself or through a link),
    names (bounded: its first MAX_JSON bytes are read; one that is no regular file names none)."""
    real = os.path.realpath(os.path.join(root, name))
    if real == top or real.startswith(top + "/") or not os.path.isdir(real):
        return set()
    path = os.path.join(real, "service.env")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return set()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return set()
        with os.fdopen(fd, "rb", closefd=False) as f:
            text = f.read(MAX_JSON).decode("utf-8", "replace")
    except OSError:
        return set()
    finally:
        os.close(fd)
    found = set()
    for releases in {top, os.path.join(os.path.abspath(root), "releases")}:
        for m in re.finditer(re.escape(releases) + r"/([^/:\s]+)", text):
            if ID_RE.match(m.group(1)):
                found.add(m.group(1))
    return found


def remove(root: str, release: str) -> dict:
    rid(release)
    if release in (link_target(root, "current"), link_target(root, "previous")):
        raise Refused(f"release {release} is current or previous")
    what = in_use(root).get(release)
    if what:
        raise Refused(f"release {release} is in use: {what} points into it")
    rmtree(root, os.path.join(root, "releases", release))
    return {"removed": [release]}


def prune(root: str, keep: int, spare: str | None = None) -> dict:
    """Keep `keep` releases: proven ones first, newest first, then the newest unproven ones;
    current, previous, any release still in use, the newest proven one and `spare` (the
    release a failed deploy just rejected: its evidence) are never removed."""
    doc = listing(root)
    rels = doc["releases"]  # oldest first (ids sort by time)
    proven = [r["id"] for r in reversed(rels) if r["proven"] and not r["rejected"]]
    others = [r["id"] for r in reversed(rels) if r["id"] not in proven]
    kept = set((proven + others)[: max(0, keep)]) | {doc["current"], doc["previous"], spare}
    kept |= set(proven[:1]) | set(in_use(root))
    removed: list[str] = []
    held = _leftovers(root)  # earlier prunes' remains, tried again
    for r in rels:
        if r["id"] not in kept:
            why = _prune_one(root, r["id"])
            if why:  # kept (a mount point) or part left aside: said, and the rest pruned
                held.append(why)
                continue
            removed.append(r["id"])
    return {"removed": removed, "held": held} if held else {"removed": removed}


PRUNING = ".pruning-"  # a release taken out of releases/ on its way out


def _prune_one(root: str, release: str) -> str | None:
    """Remove one release whole, or say why not. It is first renamed to .pruning-ID (one
    rename: listed whole until then, never again after), so a removal cut short (a file that
    cannot be removed: chattr +i) leaves no half release listed as damaged (probe37bh M1: every
    later prune failed on it, and the release was left with its service.env only)."""
    path = os.path.join(root, "releases", release)
    inside(root, path)
    why = mounted_in(path)
    if why:
        return f"{release} {why}"
    aside = os.path.join(root, "releases", PRUNING + release)
    try:
        os.rename(path, aside)
    except OSError as exc:
        if exc.errno == errno.EROFS:  # the root's, not this release's: no prune at all
            raise
        return f"{release} could not be removed ({exc.strerror}: {path})"
    why = _remove_aside(aside)
    return f"{release} was taken out, but {why}" if why else None


def _remove_aside(aside: str) -> str | None:
    """Remove a release taken out of releases/ (`aside`); why not all of it could go."""
    try:
        shutil.rmtree(aside)
    except OSError as exc:
        if exc.errno == errno.EROFS:  # the root's, not this release's: no prune at all
            raise
        return (
            f"not all of it could be removed ({exc.strerror}: {exc.filename}); what is left "
            f"is at {aside}"
        )
    return None


def _leftovers(root: str) -> list[str]:
    """Remove what earlier prunes could not (.pruning-*); why each that stays, stays."""
    rel = os.path.join(root, "releases")
    said = []
    for name in sorted(os.listdir(rel)):
        path = os.path.join(rel, name)
        if not name.startswith(PRUNING) or os.path.islink(path) or not os.path.isdir(path):
            continue
        why = mounted_in(path)
        if why:
            said.append(f"{name} {why}")
        elif why := _remove_aside(path):
            said.append(f"{name}: {why}")
    return said


def main(argv: list[str]) -> dict:
    action, root = argv[0], argv[1]
    if not os.path.isabs(root) or os.path.realpath(root) == "/":
        raise Refused(f"remote root {root!r} must be absolute and not /")
    if action == "prepare":
        return prepare(root, float(argv[2]) if len(argv) > 2 else 300.0, "settle" in argv[3:])
    if action == "finalize":
        return finalize(root, argv[2], argv[3])
    if action == "switch":
        by = "rollback" if argv[4:5] == ["rollback"] else "deploy"
        return switch(root, argv[2], len(argv) > 3 and argv[3] == "pending", by)
    if action == "commit":
        return commit(root, argv[2] if len(argv) > 2 else None)
    if action == "revert":
        return revert(root, len(argv) > 2 and argv[2] == "settle")
    if action == "retire":
        return retire(root, argv[2])
    if action == "list":
        return listing(root)
    if action == "remove":
        return remove(root, argv[2])
    if action == "reject":
        return reject(root, argv[2])
    if action == "unreject":
        return unreject(root, argv[2], argv[3])
    if action == "prune":  # ROOT KEEP [SPARE]
        return prune(root, int(argv[2]), rid(argv[3]) if len(argv) > 3 else None)
    raise Refused(f"unknown action {action!r}")


if __name__ == "__main__":
    try:
        print(json.dumps(main(sys.argv[1:])))
    except Refused as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(2)
    except OSError as exc:  # a full or read-only disk, a permission: one line, never a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        what = exc.strerror or str(exc)
        print(json.dumps({"error": f"{what}{where}", "os_error": exc.errno}))
        sys.exit(2)
