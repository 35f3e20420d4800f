"""Host side of ops's `process` service manager: start, identify, wait for, and stop the service.

This file is sent to the host and run there as `python -c <this file> ACTION ARGS...` (stdlib
only, Python 3.8+); it prints one JSON document. It is the only code that signals a service
process, and it never does so on a pid's word alone:

- `start` launches the command in a new session (so its pid is its session and process group
  id) with the release's `service.env`, and writes a pidfile holding the pid's identity: its
  start time from /proc/PID/stat, the boot id, and whose service it is (the remote root and the
  service's name, which the pidfile's own path `<root>/run/<name>.pid` also says). The same two
  go into the service's environment (DDTREE_OPS_ROOT, DDTREE_OPS_SERVICE). It refuses when the
  service already runs (identity proven) or when another process holds the service's port.
- A pid is the service only while its start time and boot id match the pidfile, it still leads
  its own session, and it is this pidfile's service: the root and name the pidfile records are
  the ones its path says, and so are those in the process's environment (/proc/PID/environ,
  where readable). A pidfile copied from another ops-managed service (another root, another
  name) names a live process of ops, but not this one's. A pidfile from before the root and
  name were recorded counts only when the process runs (and was started) under the root. A
  pidfile naming any other process, a pid <= 1, or garbage is stale: it is removed and nothing
  is signalled.
- The service's output (stdout and stderr) goes through a pipe to a log keeper (`keep-log`: this
  script again, in a session of its own with no environment of ops, so no stop or stray rule
  takes it for the service), which writes `<root>/logs/<name>.log`, rotates it past LOG_CAP
  into `<name>.log.1`, drops the output while the disk has under LOG_ROOM free (then says how
  much), and ends when the service's last process closes the pipe.
- `wait` waits until /health answers AND the listening socket on the service's port belongs
  to the service's session (so a server someone else runs on that port never counts).
- `up` is `start`, then (when it started the service) `wait`, then `status`, in one run on the
  host: what `ops service start` needs, without starting Python on the host three times.
- `stop` sends TERM to the service's process group, KILL after the grace period, then KILL to
  any process left in its session; then the same to every process outside it whose
  environment names this root AND this service (DDTREE_OPS_ROOT, DDTREE_OPS_SERVICE): a
  service that daemonized, or a worker that left its session, each signalled by pid only while
  its start time is unchanged. A process whose environment cannot be read is never one of
  them. Every signal sent is reported. `start` stops such a process holding the port (the
  service's own, unmanaged) before it starts, and `status` reports it as active, unmanaged.
- `up` and `restart` take a last MODE word: "operator" (an operator's `ops service start` or
  `restart`, not a deploy's) also refuses, before anything is stopped, a `current` that is not
  a release (the root itself, `releases/`, a directory in a release, a path outside the root:
  it must resolve to a directory under the root holding a release.json) and a deploy.pending
  left by a dead deploy whose guard is gone (current was never proven); "operator-force" only
  warns of them. A live guard (it is putting the host back) is never raced. A deploy's and a
  guard's own restarts (no MODE) check only that current is runnable.
- Each run removes `<name>.pid.tmpPID` files (the room `reserve` writes) whose PID is gone, or
  is a process started after the file was last written (a reused pid): what an interrupted or
  failed start left. One a live run of this script is using is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator

from ops.hostside.pending import ID_RE, not_whole, switched_by
from ops.hostside.release_files import (
    added_since,
    digest_since,
    listed,
    listed_changed,
    shown_name,
)

FAST_POLL_S = 5.0  # `wait` polls every 0.05 s for this long after the start, then every 0.25 s
ENV_ROOT, ENV_SERVICE = "DDTREE_OPS_ROOT", "DDTREE_OPS_SERVICE"  # whose service a process is


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> dict | None:
    """state, parent, pgrp, session and starttime of a live pid (None if there is no such
    process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return {
        "state": rest[0],
        "ppid": int(rest[1]),
        "pgrp": int(rest[2]),
        "session": int(rest[3]),
        "start": rest[19],
    }


def cmdline(pid: int) -> str:
    """Another process's command line as ops may print it: one line, its control characters
    escaped (probe37bl L1: a port holder's newlines made lines that read as ops's own)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read(1 << 16).replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"
    return shown_name(text)[:200] or "?"


def proc_dir(pid: int) -> str | None:
    """The /proc directory of pid's live part: /proc/PID, or, when its leader thread exited while
    other threads run on (the leader is then a zombie, with no environment, cwd or open files to
    read), /proc/PID/task/TID of a live thread; None when nothing of it runs."""
    st = proc_stat(pid)
    if st is None:
        return None
    if st["state"] != "Z":
        return f"/proc/{pid}"
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return f"/proc/{pid}/task/{tid}"
        except (OSError, IndexError):
            continue
    return None


def proc_cwd(pid: int, resolve: bool = True) -> str | None:
    """The directory pid runs in (None where it cannot be read)."""
    where = proc_dir(pid)
    if where is None:
        return None
    try:
        link = os.readlink(f"{where}/cwd")
    except OSError:
        return None
    return os.path.realpath(f"{where}/cwd") if resolve else link


def alive(pid: int) -> bool:
    """The process still runs: its leader, or any of its threads (a leader thread that exited
    is a zombie while the other threads still serve, holding the port)."""
    return proc_dir(pid) is not None


MAX_PIDFILE = 64 << 10  # what ops writes is well under this (reserve() makes room for it)


def read_pidfile(path: str) -> tuple[dict | None, str | None]:
    """(identity, None) for a well-formed pidfile; (None, why) for garbage; (None, None) if none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there must not hang us
    except FileNotFoundError:
        return None, None
    except NotADirectoryError:
        return None, not_a_dir(os.path.dirname(path))
    except OSError as exc:
        return None, f"unreadable pidfile ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > MAX_PIDFILE:
            return None, f"not a pidfile of ops ({info.st_size} bytes, at most {MAX_PIDFILE})"
        chunks, size = [], 0
        while size <= MAX_PIDFILE:  # whole: a pidfile read cut off was taken for garbage
            chunk = os.read(fd, MAX_PIDFILE + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        text = b"".join(chunks).decode("utf-8", "replace")
    except OSError as exc:
        return None, f"unreadable pidfile ({exc.strerror})"
    finally:
        os.close(fd)
    try:
        ident = json.loads(text)
        pid = ident["pid"]
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 and "start" in ident:
            return ident, None
    except (ValueError, TypeError, KeyError, RecursionError):  # (RecursionError: nested deep)
        pass
    word = text.strip()[:40]
    if word.isdigit() and int(word) > 1:
        pid = int(word)
        return None, f"pid {pid} has no recorded identity ({'cmdline ' + cmdline(pid)})"
    return None, f"not a pidfile of ops (content {word!r})"


def owner_of(pidfile: str) -> tuple[str, str]:
    """(remote root, service name) whose pidfile this is, from its path `<root>/run/<name>.pid`
    (ops.service.managers.pidfile)."""
    name = os.path.basename(pidfile)
    return os.path.dirname(os.path.dirname(pidfile)), name[:-4] if name.endswith(".pid") else name


def proc_environ(pid: int) -> dict[str, str] | None:
    """The environment the process was started with (None where it cannot be read)."""
    where = proc_dir(pid)
    try:
        with open(f"{where}/environ", "rb") as f:
            raw = f.read()
    except (OSError, TypeError):
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def same_dir(a: object, b: str) -> bool:
    return isinstance(a, str) and (a == b or os.path.realpath(a) == os.path.realpath(b))


def live_path(path: str, root: str) -> tuple[str, str]:
    """(the real path of a process's cwd, the real root): a pruned release the process still
    runs from reads "<path> (deleted)"."""
    if path.endswith(" (deleted)"):
        path = path[: -len(" (deleted)")]
    return os.path.realpath(path), os.path.realpath(root)


def under(path: str, root: str) -> bool:
    real, top = live_path(path, root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def service_dir(path: str, root: str) -> bool:
    """`path` is where ops starts a service: a release of `root` (current's), or the root
    itself (a start with nothing deployed), never its logs/, run/ or golden/."""
    real, top = live_path(path, root)
    releases = os.path.join(top, "releases") + "/"
    return real == top or (real.startswith(releases) and real != releases.rstrip("/"))


def not_owner(ident: dict, pidfile: str) -> str | None:
    """None when the pidfile's process is the service of the root and name its path says;
    otherwise why not (a pidfile copied from another service's root or name)."""
    root, service = owner_of(pidfile)
    pid = ident["pid"]
    why = f"it is not this service's pidfile (service {service!r} under {root}): "
    if "root" not in ident and "service" not in ident:  # written before they were recorded
        now = proc_cwd(pid, resolve=False)
        for where in (ident.get("cwd"), now):  # started under the root, and runs there still
            if not isinstance(where, str) or not under(where, root):
                return why + f"pid {pid} runs in {where}, not under {root}"
        return None
    got_root, got = ident.get("root"), ident.get("service")
    if got != service or not same_dir(got_root, root):
        return why + f"it names service {got!r} under {got_root}, pid {pid}"
    env = proc_environ(pid)
    if not env or (ENV_ROOT not in env and ENV_SERVICE not in env):
        # not ours to read (another user's), read while the process was in execve (the kernel
        # shows an empty environment then), overwritten by its own setproctitle (sshd, nginx;
        # a service may do it too), or one of its own (`env -i PATH=...`, sudo, a pyenv shim
        # in the start path: probe37aa H2, the live service was stopped as "daemonized"):
        # the recorded identity (pid, start time, boot, session) stands only for a process
        # that runs under this root, as every service ops starts does (probe37l L6: a forged
        # pidfile naming such a daemon, whose cwd is /, got it signalled)
        now = proc_cwd(pid, resolve=False)
        if isinstance(now, str) and not service_dir(now, root):
            shows = "no environment" if not env else "an environment that names no service of ops"
            return why + f"pid {pid} shows {shows} and runs in {now}, not in a release of {root}"
        return None
    env_root, env_service = env.get(ENV_ROOT), env.get(ENV_SERVICE)
    if env_service != service or not same_dir(env_root, root):
        return why + f"pid {pid} is service {env_service!r} under {env_root} (its environment)"
    return None


def verify(ident: dict, pidfile: str | None = None) -> str | None:
    """None when the pidfile's process is the service we started (and, given the pidfile's
    path, the service of that root and name); otherwise why it is not."""
    pid = ident["pid"]
    st = proc_stat(pid)
    if st is None or not alive(pid):
        return f"pid {pid} is gone"
    if st["start"] != str(ident.get("start")) or ident.get("boot") != boot_id():
        return f"pid {pid} is another process (cmdline {cmdline(pid)})"
    if st["session"] != pid:
        return f"pid {pid} no longer leads its session (cmdline {cmdline(pid)})"
    return not_owner(ident, pidfile) if pidfile is not None else None


def remove(path: str) -> str | None:
    """Unlink `path`; why it could not be (None when it is gone)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"could not remove {path}: {exc.strerror}"
    return None


def listening_inodes(port: int) -> set[str] | None:
    """Inodes of TCP sockets listening on `port` (None where /proc/net is not readable)."""
    found: set[str] = set()
    seen = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found if seen else None


def socket_owners(inodes: set[str]) -> list[int]:
    """Pids (that we may inspect) holding any of these socket inodes."""
    want = {f"socket:[{i}]" for i in inodes}
    owners = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        where = proc_dir(int(entry))
        if where is not None and want & fd_targets(f"{where}/fd"):
            owners.append(int(entry))
    return owners


def fd_targets(fd_dir: str) -> set[str]:
    found = set()
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return found
    for fd in fds:
        try:
            found.add(os.readlink(f"{fd_dir}/{fd}"))
        except OSError:
            continue
    return found


def port_of(url: str) -> int:
    parts = urllib.parse.urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


PORT_HELD = "a start would be refused"  # (the control plane reads these words)


def port_holder(url: str) -> dict | None:
    """Who listens on the service's port: None if nobody; else pid and cmdline where visible."""
    inodes = listening_inodes(port_of(url))
    if not inodes:
        return None
    owners = socket_owners(inodes)
    if not owners:
        return {"pid": None, "cmdline": "a process of another user"}
    return {"pid": owners[0], "cmdline": cmdline(owners[0])}


def health(url: str) -> str | None:
    """None when /health answers 2xx; otherwise what went wrong."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=3) as r:
            r.read(1024)
            return None
    except urllib.error.HTTPError as e:
        return f"/health: HTTP {e.code}"
    except Exception as e:  # any transport failure is a fact to report, not a crash
        return f"/health: {type(e).__name__}: {e}"


def served_by(pid: int, url: str) -> str | None:
    """None when the port's listener is in the service's session; else who holds it."""
    holder = port_holder(url)
    if holder is None:
        return f"nothing listens on port {port_of(url)}"
    if holder["pid"] is None:
        return f"port {port_of(url)} is held by {holder['cmdline']}"
    st = proc_stat(holder["pid"])
    if st is not None and st["session"] == pid:
        return None
    where = f"port {port_of(url)} is answered by pid {holder['pid']}"
    return f"{where} ({holder['cmdline']}), not pid {pid}"


def ancestors() -> set[int]:
    """This process and those above it (they may carry a service's environment: an `ops` run
    from inside the service's session must not stop itself)."""
    seen, pid = set(), os.getpid()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        st = proc_stat(pid)
        pid = st["ppid"] if st else 0
    return seen


def release_of(env: dict[str, str], cwd: str | None, root: str) -> str:
    """Which release a process of the service runs: DDTREE_RELEASE_ID (service.env), else the
    release directory it runs in, else '?'."""
    if env.get("DDTREE_RELEASE_ID"):
        return env["DDTREE_RELEASE_ID"][:200]
    releases = os.path.join(os.path.realpath(root), "releases") + "/"
    if cwd and cwd.startswith(releases):
        return cwd[len(releases) :].split("/", 1)[0]
    return "?"


def strays(
    pidfile: str,
    managed: int | None = None,
    url: str | None = None,
    since: tuple[str, int] | None = None,
) -> list[dict]:
    """Live processes that are provably this service of this root, outside the session
    `managed` (the pidfile's proven process): their environment (/proc/PID/environ, set by
    `start`) holds DDTREE_OPS_ROOT and DDTREE_OPS_SERVICE naming this root and service; or,
    given the service's `url`, they hold its port and run from one of this root's releases,
    with the members of their session that run from one too (probe37w W1: a daemon that shed
    its environment kept the port after its release was rejected); or, given `since` (a
    release directory and the start time, in clock ticks, of a start from it that exited),
    orphans (their parent is init) that run from that release and began after that start, with
    their session's members that run from a release: that start's daemon before it holds the
    port (probe37x H1: found only once it held it, it took the port from the release a
    rollback started meanwhile; a shell or a check run from the release has a parent that
    lives, and a process from before the start is older). A service that daemonized
    (double fork, setsid) or left a child in a session of its own is found here; a process
    whose environment or cwd cannot be read (another user's) never is. Each: pid, start,
    release, cwd, cmdline."""
    root, service = owner_of(pidfile)
    skip, found = ancestors(), []

    def add(pid: int, st: dict, env: dict[str, str], cwd: str | None) -> None:
        found.append(
            {
                "pid": pid,
                "start": st["start"],
                "release": release_of(env, cwd, root),
                "cwd": cwd,
                "cmdline": cmdline(pid),
            }
        )

    def outside(pid: int) -> dict | None:
        """pid's stat, where it is a live process outside `managed`'s session, not ours."""
        st = proc_stat(pid)
        if pid in skip or st is None or (managed and st["session"] == managed):
            return None
        return st if alive(pid) else None

    # one walk of /proc for the three questions below (the sessions' members too); each
    # environment read at once after its stat: a daemon's middle child of a double fork lives
    # for a moment, and its grandchild may be younger than the walk
    table: dict[int, dict] = {}  # pid: its stat, with its environment ("env")
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (st := outside(int(entry))) is None:
            continue
        pid = int(entry)
        table[pid] = st
        env = st["env"] = proc_environ(pid)
        if env and env.get(ENV_SERVICE) == service and same_dir(env.get(ENV_ROOT), root):
            add(pid, st, env, proc_cwd(pid))
    releases = os.path.join(os.path.realpath(root), "releases") + "/"
    seen = {f["pid"] for f in found}

    def with_session(pid: int, st: dict) -> None:
        """pid and its session's members that run a release's code of this root."""
        members = {p: m for p, m in table.items() if m["session"] == st["session"]}
        for other, member in sorted({**members, pid: st}.items()):
            if other not in seen and runs_code_of(other, releases, member.get("env")):
                seen.add(other)
                add(other, member, {}, proc_cwd(other))

    inodes = listening_inodes(port_of(url)) if url else None
    for holder in socket_owners(inodes) if inodes else []:
        st = table.get(holder) or outside(holder)
        if st is not None and runs_code_of(holder, releases, st.get("env")):
            with_session(holder, st)
    where = os.path.realpath(since[0]) + "/" if since else ""
    if since and where.startswith(releases):
        for pid, st in table.items():
            if (
                st["ppid"] == 1
                and int(st["start"]) >= since[1]
                and runs_code_of(pid, where, st["env"])
            ):
                with_session(pid, st)
    return found


def runs_code_of(pid: int, where: str, env: dict[str, str] | None = None) -> bool:
    """Process `pid` runs code from under the directory `where` (a trailing "/"): its cwd, its
    executable or a file it maps is there, or an absolute path in its arguments or its
    environment (PYTHONPATH) names it: a
    daemon(3)-style daemon changes to "/" and may clear its environment, and still imports
    its release (probe37y H1). `env`: its environment where already read."""
    cwd = proc_cwd(pid)
    if cwd and (cwd + "/").startswith(where):
        return True
    where_dir = proc_dir(pid)
    if where_dir is None:
        return False
    with contextlib.suppress(OSError):
        if (os.path.realpath(f"{where_dir}/exe") + "/").startswith(where):
            return True
    try:
        with open(f"{where_dir}/cmdline", "rb") as f:
            argv = f.read(1 << 16).decode("utf-8", "replace").split("\0")
    except OSError:
        argv = []
    env = (env if env is not None else proc_environ(pid)) or {}
    for value in [*argv, *env.values()]:
        for part in value.split(os.pathsep):
            if part.startswith("/") and (os.path.realpath(part) + "/").startswith(where):
                return True
    try:
        with open(f"{where_dir}/maps", "rb") as f:
            maps = f.read(4 << 20)
    except OSError:
        return False
    return where.encode() in maps


def still(proc: dict) -> bool:
    """The stray `proc` is still that process (same pid and start time, not a zombie)."""
    st = proc_stat(proc["pid"])
    return st is not None and st["start"] == proc["start"] and alive(proc["pid"])


def named(found: list[dict]) -> str:
    shown = ", ".join(f"pid {p['pid']} (release {p['release']})" for p in found[:5])
    return shown + (f" and {len(found) - 5} more" if len(found) > 5 else "")


def stop_strays(
    pidfile: str,
    grace: float,
    signals: list,
    t0: float,
    url: str | None = None,
    since: tuple[str, int] | None = None,
) -> list[dict]:
    """TERM every stray of this service (`strays`), KILL those left after `grace`; each pid is
    signalled only while it is still the process found (same start time). The strays found.
    The process the pidfile names now, proven, is no stray, whoever started it: a restart
    resumed after another command stopped its start and started the service again must not
    sweep the new one away (probe37q Q1: the host was left with no service)."""
    ident, _ = read_pidfile(pidfile)
    managed = ident["pid"] if ident is not None and verify(ident, pidfile) is None else None
    found: list[dict] = []
    for _ in range(3):  # one found during the grace (a child forked meanwhile) is taken too
        known = {f["pid"] for f in found}
        fresh = [p for p in strays(pidfile, managed, url, since) if p["pid"] not in known]
        if not fresh:
            break
        found += fresh

        def send(proc: dict, sig: signal.Signals) -> None:
            if not still(proc):
                return
            try:
                os.kill(proc["pid"], sig)
            except ProcessLookupError:
                return
            at = round(time.time() - t0, 3)
            signals.append({"signal": sig.name, "to": f"pid {proc['pid']}", "at_s": at})

        for proc in fresh:
            send(proc, signal.SIGTERM)
            if proc_state(proc["pid"]) == "T":  # stopped: woken to take its TERM
                send(proc, signal.SIGCONT)
        end = time.time() + grace
        while any(still(p) for p in fresh) and time.time() < end:
            time.sleep(0.05)
        for proc in fresh:
            send(proc, signal.SIGKILL)
        end = time.time() + 10
        while any(still(p) for p in fresh) and time.time() < end:
            time.sleep(0.05)
    return found


def unmanaged_doc(found: list[dict], url: str, why: str) -> dict:
    """The status of a service whose processes run but no pidfile of ops names (`strays`):
    active (unmanaged) when one of them answers on the port and /health is ok."""
    first = found[0]
    holder = port_holder(url)
    pids = {p["pid"] for p in found}
    if holder is None:
        bad = f"nothing listens on port {port_of(url)}"
    elif holder["pid"] not in pids:
        who = f"pid {holder['pid']}" if holder["pid"] else "another user's process"
        bad = f"port {port_of(url)} is answered by {who} ({holder['cmdline']})"
    else:
        bad = health(url)
    serving = holder is not None and holder["pid"] in pids
    detail = (
        f"unmanaged: {named(found)} run as this service, but no pidfile of ops names them "
        f"({why}; did it daemonize?); ops service stop stops them"
    )
    return {
        "state": "failed" if bad else "active",
        "pid": (holder["pid"] if serving else first["pid"]),
        "cwd": first["cwd"],
        "unmanaged": found,
        "detail": detail + (f"; {bad}" if bad else "; /health ok"),
    }


MAX_ENV = 1 << 20  # a service.env is a few lines; more than a MiB is not one


def read_env(path: str) -> dict[str, str]:
    """KEY=VALUE lines (systemd EnvironmentFile style: # comments, optional quotes)."""
    env: dict[str, str] = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO there must not hang a restart
    except FileNotFoundError:
        return env
    except OSError as exc:
        raise NotARelease(f"cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARelease(f"{path} is not a regular file")
        if info.st_size > MAX_ENV:
            raise NotARelease(f"{path} is {info.st_size} bytes (at most {MAX_ENV} are read)")
        raw = os.read(fd, MAX_ENV + 1)
    except OSError as exc:
        raise NotARelease(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if b"\0" in raw:
        raise NotARelease(f"{path} holds a NUL byte: no environment can carry it")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise NotARelease(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if not key.strip():  # (probe37bd M2: no environment holds it, so it read as edited
            # after every start, and every deploy was refused)
            raise NotARelease(f"{path}: line {number} has no name before its '='")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    for key, value in env.items():  # what exec(2) refuses: checked before a restart stops
        size = len(f"{key}={value}".encode()) + 1  # anything (probe37q Q8: left no service)
        if size > MAX_ARG_STRLEN:
            raise NotARelease(
                f"{path}: {key} is {size} bytes, over the {MAX_ARG_STRLEN} bytes the kernel "
                "lets one environment variable be (exec would fail: Argument list too long)"
            )
    return env


MAX_ARG_STRLEN = 32 * 4096  # Linux: the most one argument or KEY=VALUE string may take


def current_env(root: str) -> dict[str, str]:
    """The environment of the release `current` names (its service.env). A release ops installed
    (releases/ID) without its service.env is not started: its code would run without its
    configuration (its kernels, its backends) under its name. A directory made by hand may
    have none."""
    current = os.path.join(root, "current")
    path = os.path.join(current, "service.env")
    releases = os.path.join(os.path.realpath(root), "releases")
    ours = os.path.dirname(os.path.realpath(current)) == releases
    if ours and not os.path.lexists(path):
        raise NotARelease(
            f"{path} is missing: the release would run without its configuration; "
            "ops rollback --to a whole release, or deploy again"
        )
    return read_env(path)


def do_status(pidfile: str, url: str) -> dict:
    sweep_tmp(pidfile)
    doc = status_of(pidfile, url)
    root = owner_of(pidfile)[0]
    pending = pending_state(root)
    # a live guard: a deploy runs now, or its guard puts the host back; unless it is stopped
    # (SIGSTOP): then it never will till let go (probe37ao M1: status said nothing)
    frozen = pending is not None and pending["guard_waiting"] and not pending["locked"]
    if pending is not None and (not pending["guard"] or pending["guard_stopped"] or frozen):
        cwd, now = doc.get("cwd") or "", pending.get("current_id")
        serves = doc["state"] == "active" and bool(now) and in_releases(root, cwd, now)
        doc["warnings"] = [*doc.get("warnings", []), pending_note(pending, serves)]
    if doc["state"] == "active":
        gone = gone_release(root, doc.get("pid"), doc.get("cwd"))
        if gone:  # told to the control plane: a deploy must not count on current (probe37ao H1)
            doc["release_gone"] = gone
        changed = untried(root, doc.get("pid"), doc.get("cwd"))
        if changed:  # so too: a revert to current would start an edit never run (probe37au H1)
            doc["untried"] = changed
        notes = [runs_other(root, doc.get("cwd"), gone), changed]
        try:  # what the next restart would refuse, said while the service still serves
            startable(root)
            current_env(root)
            # (a `current` that is no release: `.`, releases/, outside the root: probe37ai L2;
            # no `current` at all is runs_other's to say)
            bad = current_problem(root) if os.path.lexists(os.path.join(root, "current")) else None
            if bad:
                notes.append(f"a restart would be refused without --force: {bad}")
            notes.append(current_damaged(root))  # (probe37ak L3)
            notes.append(releases_linked(root))  # (probe37ao L5)
            notes.append(None if doc.get("unmanaged") else output_unkept(root, doc.get("pid")))
            notes.append(keeper_trouble(doc.get("pid")))  # (probe37ax L3)
        except NotStartable as exc:
            notes.append(f"a restart would be refused: {exc}")
        if any(notes):
            doc["warnings"] = [*doc.get("warnings", []), *(n for n in notes if n)]
    elif doc["state"] in ("inactive", "failed"):
        doc["last_ran"] = last_ran(pidfile)  # (a deploy names the way back to it: at L2)
        later = unproven_start(root, pidfile)
        if later:  # (probe37as M1: stopped for maintenance, said before the start is refused)
            doc["warnings"] = [*doc.get("warnings", []), f"a start would be refused: {later}"]
    waiting = stopped_restarts(pidfile)
    if waiting:  # every restart is refused till it goes on (probe37bk L1: said only then)
        pids = " ".join(map(str, waiting))
        doc["warnings"] = [
            *doc.get("warnings", []),
            f"an earlier restart of this service (pid {pids}) is stopped (SIGSTOP) and holds its "
            f"lock, so a restart would be refused: kill -CONT {pids} lets it finish",
        ]
    return doc


def output_unkept(root: str, pid: object) -> str | None:
    """Why the service's output is not kept in its log (None: it is, or that cannot be told):
    its start could not write the log (logs/ a symlink, a full or read-only disk) and gave it
    /dev/null; the start warned once, and status says it while that lasts (probe37ar L3)."""
    if not isinstance(pid, int):
        return None
    try:
        if os.readlink(f"/proc/{pid}/fd/1") != os.devnull:
            return None
    except OSError:
        return None
    logs = os.path.join(root, "logs")
    why = (
        f": {logs} is a symlink, not followed (make it a directory)" if os.path.islink(logs) else ""
    )
    return (
        f"the service's output is not kept: its start could not write the log{why}; "
        "a restart once the log can be written keeps it again"
    )


def releases_linked(root: str) -> str | None:
    """Why deploys and rollbacks are refused where releases/ is a symlink (None: it is not)."""
    path = os.path.join(root, "releases")
    if not os.path.islink(path):
        return None
    return (
        f"releases/ is a symlink to {os.readlink(path)[:200]}: these may be another root's "
        "releases; deploys and rollbacks are refused until it is a directory"
    )


def gone_release(root: str, pid: object, cwd: str | None) -> str | None:
    """The release the service's process `pid` runs where its directory is gone from releases/:
    removed under it (its cwd then ends in " (deleted)") or moved by hand (its cwd is then
    elsewhere, and its DDTREE_RELEASE_ID names a release no longer there). None where it runs
    from a directory in releases/, from `current` (a hand-made copy), or that cannot be told."""
    if not cwd or not isinstance(pid, int):
        return None
    releases = os.path.join(os.path.realpath(root), "releases") + "/"
    path = cwd.removesuffix(" (deleted)")
    if path == cwd and (path.startswith(releases) or same_dir(os.path.join(root, "current"), path)):
        return None
    if path.startswith(releases):
        name: str | None = path[len(releases) :].split("/", 1)[0]
    else:
        name = (proc_environ(pid) or {}).get("DDTREE_RELEASE_ID")
    if not name or not ID_RE.match(name) or os.path.isdir(releases + name):
        return None
    return name


def runs_other(root: str, cwd: str | None, gone: str | None = None) -> str | None:
    """Why the release the service runs from (its cwd) is not what `current` names: a release
    whose directory is gone (`gone`: removed or moved under it), or another release (a switch
    without a restart); None when it is."""
    if gone:
        said = f"the service runs release {gone}, whose directory " + (
            "was deleted under it"
            if cwd and cwd.endswith(" (deleted)")
            else f"was moved out of releases/ (it runs from {cwd})"
        )
        new = unproven_current(root)
        if new:
            return (
                f"{said}; current ({new}) {unproven_said(root, new)}, so a restart or a failed "
                f"deploy would have no way back: {gone_way(root, gone, cwd)}"
            )
        if not os.path.exists(os.path.join(root, "current")):  # current names it (or nothing)
            return f"{said}; nothing starts it again: {gone_way(root, gone, cwd)}"
        return f"{said}: a restart runs current"
    if not cwd:
        return None
    releases = os.path.join(os.path.realpath(root), "releases") + "/"
    deleted = cwd.endswith(" (deleted)")
    cwd = cwd.removesuffix(" (deleted)")
    if not cwd.startswith(releases):
        return None  # not run from a release (the remote root, a hand-made current)
    running = cwd[len(releases) :].split("/", 1)[0]
    if deleted:
        return f"the service runs release {running}, whose directory was deleted under it"
    renamed = renamed_from(releases + running)
    if renamed:  # (probe37ap L6: said as release {running}, and a restart named that was refused)
        back = f"mv -T releases/{running} releases/{renamed} puts it back"
        if os.path.lexists(releases + renamed):  # a bare mv would move it inside (ax M1)
            back = (
                f"releases/{renamed} is taken by another directory (swapped by hand?): move "
                f"that aside first (mv -T releases/{renamed} releases/{renamed}.aside), then {back}"
            )
        return (
            f"the service runs releases/{running}, whose release.json is release {renamed}'s "
            f"(its directory renamed by hand?): {back}"
            + (
                "; until then nothing starts it again, and a rollback is refused (it would stop "
                "the service with no way back)"
                if not os.path.exists(os.path.join(root, "current"))
                else ""
            )
        )
    if not os.path.lexists(os.path.join(root, "current")):  # (probe37af H1, H2)
        return (
            f"the service runs release {running}, but there is no current (removed by hand?): "
            f"ops rollback TARGET --to {running} makes it current, with no restart"
        )
    current = os.path.realpath(os.path.join(root, "current"))
    if os.path.dirname(current) + "/" == releases and os.path.basename(current) != running:
        said = f"the service runs release {running}, not current ({os.path.basename(current)})"
        if unproven_over(root, cwd):
            return f"{said}: {unproven_way(running)}"
        return f"{said}: ops service restart runs current"
    if not os.path.isdir(current):  # a file made by hand, a link to one or to nothing
        file = os.path.isfile(current)
        what, aside = ("a file", " (the file moved aside)") if file else ("no directory", "")
        return (  # (probe37ao L5: said only "a restart would be refused", not what runs)
            f"the service runs release {running}, but current is {what} (made by hand?): "
            f"ops rollback TARGET --to {running} makes it current{aside}"
        )
    if not current.startswith(releases) and os.path.isfile(os.path.join(current, "release.json")):
        # a hand-made copy (`cp -a releases/ID copy`, current -> copy): the deploy's `current`
        # step refuses it without --force, and status said nothing (probe37al L2)
        link = os.path.join(root, "current")
        was = os.readlink(link) if os.path.islink(link) else "a real directory"
        inside = current.startswith(os.path.realpath(root) + "/")
        force = (  # (probe37bp L1: it named --force for a copy outside, refused all the same)
            "without --force"
            if inside
            else "with --force too (a copy outside the root: no failed deploy comes back to it)"
        )
        return (
            f"the service runs release {running}, but current is {was[:200]}, a copy made by "
            f"hand, not a release ops installed: a restart runs the copy, and a deploy refuses "
            f"it {force}; ops rollback TARGET --to {running} makes what runs current"
        )
    return None


def in_releases(root: str, cwd: str, release: str) -> bool:
    """A working directory `cwd` is root/releases/`release` (a process running it)."""
    releases = os.path.join(os.path.realpath(root), "releases")
    return cwd == os.path.join(releases, release)


def gone_way(root: str, gone: str, cwd: str | None) -> str:
    """The way on where the service runs `gone`, whose directory is gone from releases/, and
    current never passed a post-flight: nothing starts `gone` again, so whatever stops the
    service (a restart, a rollback) has no way back to it (probe37as H1). Put it back where it
    was moved, and make it current; or stop the service knowingly, then roll back (TARGET: the
    control plane puts the target's name in)."""
    stop = (
        "ops service stop TARGET, then ops rollback TARGET --to ID (a proven release: ops "
        "releases TARGET lists them), knowing that a failed start then leaves no service"
    )
    if not cwd or cwd.endswith(" (deleted)"):
        return stop
    home = os.path.join(root, "releases", gone)
    named = os.path.basename(os.path.realpath(os.path.join(root, "current"))) == gone
    adopt = "" if named else f", then ops rollback TARGET --to {gone} makes it current"
    src, dest = shlex.quote(cwd), shlex.quote(home)
    if os.path.lexists(home):  # a bare mv would move it inside (probe37ax M1)
        return (
            f"{dest} is taken by another directory: move that aside first (mv -T {dest} "
            f"{dest}.aside), then mv -T {src} {dest} puts it back{adopt}; or {stop}"
        )
    return f"mv -T {src} {dest} puts it back{adopt}; or {stop}"


def unproven_way(running: str) -> str:
    """The way on where the service runs `running`, a release that served, and `current`
    never passed a post-flight (TARGET: the control plane puts the target's name in)."""
    return (
        f"ops rollback TARGET --to {running} makes it current, then ops deploy TARGET proves "
        "the new one with a way back (ops service restart --force runs current as it is)"
    )


def unproven_current(root: str) -> str | None:
    """The id of `current` where it is a release of this root that never passed a post-flight
    (None: it did, or it is no release of ours: the start's own checks say what it is)."""
    releases = os.path.join(os.path.realpath(root), "releases") + "/"
    current = os.path.realpath(os.path.join(root, "current"))
    if not current.startswith(releases) or not os.path.isfile(f"{current}/release.json"):
        return None
    return None if os.path.isfile(f"{current}/proven.json") else current[len(releases) :]


def untried(root: str, pid: object, cwd: str | None) -> str | None:
    """Why a start of `current` would not run what the service, running it, runs: current
    changed after the service started (probe37au H1: its service.env edited; a deploy that
    failed went back to current and restarted the service with an edit that never ran, and the
    host was left down), its service.env (`env_untried`) or its code (`code_untried`). None
    where it would, or where that cannot be told (the service runs no `current`, its
    environment is another user's, the file is one a start refuses: said as that)."""
    current = os.path.join(root, "current")
    if not isinstance(pid, int) or not cwd or not same_dir(current, cwd):
        return None
    man = read_small_json(os.path.join(current, "release.json"))
    man = man if isinstance(man, dict) else {}
    start = started_at(pid)
    tail = "a restart, or a revert to current, would start what never ran"
    home = os.path.realpath(current)  # (a file's directory is the release's, not the link)
    why = env_untried(root, pid, man, start) or code_untried(home, man, start)
    return f"{why}: {tail}" if why else None


def env_untried(root: str, pid: int, man: dict, start: float | None) -> str | None:
    """current's service.env edited after the service started: told by the keys whose value
    the file gives and the service's environment does not (one changed or added), or, for an
    edit no key shows (one removed), by the file no longer what release.json (`man`) recorded
    and changed after the start (`start`)."""
    running = proc_environ(pid)
    try:
        wanted = current_env(root) if running is not None else None
    except NotStartable:
        return None
    if running is None or wanted is None:
        return None
    ours = (ENV_ROOT, ENV_SERVICE)  # (set by the start itself, whatever the file says)
    changed = sorted(k for k, v in wanted.items() if k not in ours and not runs_with(k, v, running))
    said = "current's service.env was edited after the service started"
    if changed:
        return f"{said} ({listed(changed)} not as it runs)"
    recorded = man.get("service_env_sha256")
    if not isinstance(recorded, str):
        return None
    held = digest_since(os.path.join(root, "current", "service.env"), start)
    if held is None or held == recorded:
        return None
    return f"{said} (it is not as installed, and no key shows how it runs)"


def code_untried(current: str, man: dict, start: float | None) -> str | None:
    """current's code changed after the service started: a file release.json (`man`) lists,
    changed since `start` (its ctime) and no longer as installed (its sha256), or gone
    (`listed_changed`); or a file it does not list, added since (`added_since`)."""
    files = man.get("files")
    if not isinstance(files, dict) or start is None:
        return None
    changed = listed_changed(current, files, start)
    changed += [f"{name} (added)" for name in added_since(current, set(files), start)]
    if not changed:
        return None
    return f"current's code was changed after the service started ({listed(changed)})"


def runs_with(key: str, value: str, running: dict[str, str]) -> bool:
    """The service's environment has `key` as the file gives it (PYTHONPATH: the release's
    first, the start's own after it, as `do_start` makes it)."""
    now = running.get(key)
    if now == value:
        return True
    return key == "PYTHONPATH" and now is not None and now.startswith(value + os.pathsep)


def release_in(root: str, cwd: str) -> str | None:
    """The release of this root a start's directory (`current`, as it resolves) is."""
    real = os.path.realpath(cwd)
    if os.path.dirname(real) != os.path.join(os.path.realpath(root), "releases"):
        return None
    name = os.path.basename(real)
    return name if ID_RE.match(name) else None


def last_ran(pidfile: str) -> str | None:
    """The release the service last ran, where no process of it runs now: as its pidfile said
    (kept by a stop as <pidfile>.room, or left stale by a process that died). None where that
    is not known."""
    for path in (pidfile + ROOM, pidfile):
        ident, _ = read_pidfile(path)
        named = (ident or {}).get("release")
        if isinstance(named, str) and ID_RE.match(named):
            return named
    return None


def unproven_said(root: str, release: str) -> str:
    """How a release that is not proven is said: one a deploy rejected failed a post-flight
    (probe37bd L4: said "never passed" of one that failed)."""
    if os.path.lexists(os.path.join(root, "releases", release, "rejected.json")):
        return "failed a post-flight (a deploy rejected it)"
    return "never passed a post-flight"


def unproven_start(root: str, pidfile: str) -> str | None:
    """Why an operator's start of the stopped service would move it from the release it last
    ran, one that passed a post-flight, onto a `current` that never did: what a restart
    refuses (`unproven_over`), made in two steps (probe37as M1: stop, then start, left the
    host down on a crashing --no-restart install). None where that is not so."""
    new, last = unproven_current(root), last_ran(pidfile)
    if not new or not last or last == new:
        return None
    if not os.path.isfile(os.path.join(root, "releases", last, "proven.json")):
        return None
    return (
        f"current ({new}) {unproven_said(root, new)}, and the service last ran {last}, which "
        f"did: a start would run {new} with no way back if it fails"
    )


def unproven_over(root: str, cwd: str | None, pid: int | None = None) -> str | None:
    """Why a restart would move the service from the release it runs (`cwd`), one that passed a
    post-flight, onto a `current` that never did (installed with --no-restart, or switched by
    hand): a restart has no way back if it fails (probe37ab M2: the healthy service was
    stopped and left down on a crashing release). So too where the release it runs is gone
    from releases/ (removed or moved by hand: probe37ao H1, the service was left down). None
    where that is not so."""
    gone = gone_release(root, pid, cwd) if pid is not None else None
    new = unproven_current(root) if gone else None
    if gone and new:
        return (
            f"current ({new}) {unproven_said(root, new)}, and the service runs {gone}, whose "
            "directory is gone from releases/ (removed or moved by hand): a restart would stop "
            f"it with no way back if {new} fails; {gone_way(root, gone, cwd)}"
        )
    releases = os.path.join(os.path.realpath(root), "releases") + "/"
    new = unproven_current(root)  # (None: no release there, or proven; the start's own checks
    if not cwd or not cwd.startswith(releases) or not new:  # say what current is)
        return None
    old = cwd[len(releases) :].split("/", 1)[0]
    if old == new or not os.path.isfile(os.path.join(releases, old, "proven.json")):
        return None
    return (
        f"current ({new}) {unproven_said(root, new)}, and the service runs {old}, which did: "
        f"a restart would stop {old} with no way back if {new} fails"
    )


def status_of(pidfile: str, url: str) -> dict:
    doc = managed_status(pidfile, url)
    managed = doc.get("pid") if doc["state"] in ("active", "activating") else None
    found = strays(pidfile, managed, url)
    if not found:
        holder = port_holder(url) if doc["state"] in ("inactive", "failed") else None
        if holder is not None:  # (probe37bh L1: said "not running" alone; a start then failed)
            who = f"pid {holder['pid']}" if holder["pid"] else "another user's process"
            said = f"port {port_of(url)} is in use by {who} ({holder['cmdline'][:200]})"
            detail = f"{doc['detail']}; {said}, not this service: {PORT_HELD}"
            return {**doc, "detail": detail, "port_held": True}
        return doc
    if managed is None and doc["state"] == "inactive":  # no pidfile: it runs all the same
        return unmanaged_doc(found, url, "no pidfile")
    if managed is None:  # a stale pidfile: what runs is the state, the pidfile is said too
        said = unmanaged_doc(found, url, "the pidfile names none of them")
        return {**said, "stale": True, "detail": f"{doc['detail']}; {said['detail']}"}
    note = (
        f"{named(found)} run as this service outside pid {managed}'s session (unmanaged: a "
        "child that left it); ops service stop stops them too"
    )
    return {**doc, "unmanaged": found, "warnings": [note]}


def managed_status(pidfile: str, url: str) -> dict:
    """The status of the pidfile's process (not looking for unmanaged ones)."""
    ident, problem = read_pidfile(pidfile)
    if ident is None and problem is None:
        return {"state": "inactive", "detail": "not running (no pidfile)"}
    if ident is None:
        return {"state": "failed", "stale": True, "detail": f"stale pidfile: {problem}"}
    pid = ident["pid"]
    why = verify(ident, pidfile)
    if why and why.endswith(" is gone") and read_only(os.path.dirname(pidfile)):
        # a read-only root: the stop could not remove the pidfile, so a stop is not told from
        # an exit here (probe37an L1, ak L1: a service stopped on purpose read "failed")
        detail = (
            f"not running: the pidfile left names pid {pid}, which is gone, and the root is "
            "read-only, where no stop can remove it (stopped with ops service stop, or exited: "
            "its log says which)"
        )
        return {"state": "inactive", "stale": True, "pid": pid, "detail": detail}
    if why:
        return {"state": "failed", "stale": True, "pid": pid, "detail": f"stale pidfile: {why}"}
    cwd = proc_cwd(pid)  # which release it runs, whatever current says
    if proc_state(pid) in ("T", "t"):  # not starting: it answers nothing until let go on
        # (probe37q Q3: "activating ... /health: timed out", with no word of why)
        detail = f"pid {pid} is stopped (SIGSTOP or a debugger): kill -CONT {pid} lets it run"
        return {"state": "activating", "pid": pid, "detail": detail, "cwd": cwd, "stopped": True}
    ran = ident.get("command_sha256")  # (told to the control plane, which renders the
    ran = {"command_sha256": ran} if isinstance(ran, str) else {}  # command now: au H1's kin)
    bad = health(url) or served_by(pid, url)
    if bad:
        detail = f"pid {pid} lives but {bad}"
        keeper = keeper_trouble(pid)  # (probe37ay M2: a service blocked on its output, its
        if keeper:  # keeper stopped, was "activating" with no word of why)
            detail += f"; {keeper}"
        # (probe37ba M1: a port edited in the inventory is asked there: its command, said)
        return {"state": "activating", "pid": pid, "detail": detail, "cwd": cwd, **ran}
    return {"state": "active", "pid": pid, "detail": f"pid {pid}, /health ok", "cwd": cwd, **ran}


def read_only(path: str) -> bool:
    """`path` is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


CRITICAL = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def unblock_in_child() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CRITICAL)


class NotStartable(Exception):
    """The service cannot be started from here (nothing was started, nothing was stopped)."""

    blocked_by = "host"


class NotARelease(NotStartable):
    """What `current` names cannot be run as a release: it points at nothing, or its
    service.env cannot be read whole (a rollback to a whole release is the fix)."""

    blocked_by = "release"


PIDFILE_ROOM = 1024  # bytes reserved for the pidfile before the service starts, beyond its paths


def pidfile_room(pidfile: str) -> int:
    """The room reserved for the pidfile: its identity records the root and the directory the
    service started in (each about as long as the pidfile's path, JSON-escaped)."""
    return PIDFILE_ROOM + 3 * len(json.dumps(pidfile))


def reserve(pidfile: str, notes: list | None = None) -> str:
    """A temporary pidfile with its room already written to disk: once the service runs, its
    identity goes into blocks the disk has already given, so a disk that fills up meanwhile
    cannot leave a running service without a pidfile. Its path; NotStartable if the run
    directory cannot take it (full, read-only). A directory at the pidfile's path (made by
    hand) would refuse the rename that records the started process, after a restart had
    stopped the service (probe37q Q5: the service was left down): it is moved aside first, said
    in `notes`, or NotStartable where it cannot be."""
    if os.path.isdir(pidfile) and not os.path.islink(pidfile):
        kept = f"{pidfile}.unusable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        try:
            os.rename(pidfile, kept)
        except OSError as exc:
            raise NotStartable(
                f"{pidfile} is a directory, not a pidfile, and cannot be moved aside "
                f"({exc.strerror}): remove it"
            ) from None
        if notes is not None:
            notes.append(f"{pidfile} was a directory: moved aside as {os.path.basename(kept)}")
    tmp = f"{pidfile}.tmp{os.getpid()}"
    room = pidfile + ROOM
    try:  # the blocks of a pidfile stopped before: a full disk cannot refuse them
        if stat.S_ISREG(os.lstat(room).st_mode) and os.lstat(room).st_size >= pidfile_room(pidfile):
            os.replace(room, tmp)
            # written now, by this run: a rename keeps the room's old time, and `sweep_tmp`
            # (any status meanwhile) took a file older than its run for a dead run's and
            # removed it, so the start could not record its process (probe37n N1)
            os.utime(tmp)
            return tmp
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(pidfile), exist_ok=True)
        with open(tmp, "w") as f:
            f.write(" " * pidfile_room(pidfile))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        remove(tmp)
        where = os.path.dirname(pidfile)
        if os.path.lexists(where) and not os.path.isdir(where):
            raise NotStartable(not_a_dir(where)) from None
        raise NotStartable(f"cannot write the pidfile in {where}: {exc.strerror}") from None
    return tmp


ROOM = ".room"  # a stopped service's pidfile, kept for its blocks (see `retire`)


def retire(pidfile: str) -> str | None:
    """The pidfile of a service that is gone: kept as <pidfile>.room, whose disk blocks the next
    start takes by a rename (`reserve`), so a start after a stop never needs new room on a disk
    that filled up meanwhile (probe37h H1: a failed deploy's rollback could not restart the old
    release for want of one block). Why it could not be removed, as `remove` says; None."""
    try:
        if stat.S_ISREG(os.lstat(pidfile).st_mode):
            os.replace(pidfile, pidfile + ROOM)
            return None
    except OSError:
        pass
    return remove(pidfile)


def not_a_dir(run: str) -> str:
    return f"{run} is not a directory (made by hand?): ops keeps the pidfile there; remove it"


def startable(root: str) -> str:
    """The directory the service starts in; NotStartable when `current` cannot be run."""
    current = os.path.join(root, "current")
    if os.path.islink(current) and not os.path.exists(current):
        raise NotARelease(f"current -> {os.readlink(current)} does not exist")
    if os.path.lexists(current) and not os.path.isdir(current):
        raise NotARelease(f"{current} is not a directory")
    return current if os.path.isdir(current) else root


def pid_alive(pid: int) -> bool:
    """Some process has this pid (another user's too: kill(0) is refused, not unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    st = proc_stat(pid)
    return st is None or st["state"] != "Z"


def started_at(pid: int) -> float | None:
    """When the process started (epoch seconds), from /proc; None where it cannot be read."""
    st = proc_stat(pid)
    try:
        with open("/proc/stat") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
        return btime + int(st["start"]) / os.sysconf("SC_CLK_TCK") if st else None
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def sweep_tmp(pidfile: str) -> list[str]:
    """Remove `<pidfile>.tmpPID` files left by runs that are gone (an interrupted or failed
    start): PID is dead, or is a process that started after the file was last written (the
    pid was reused). One that a live run may still be using is kept. The names removed."""
    run, base = os.path.dirname(pidfile), os.path.basename(pidfile) + ".tmp"
    try:
        names = os.listdir(run)
    except OSError:
        return []
    removed = []
    for name in names:
        digits = name[len(base) :]
        if not name.startswith(base) or not digits.isdigit() or int(digits) == os.getpid():
            continue
        path, pid = os.path.join(run, name), int(digits)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # not what reserve() writes: someone else's, left alone
        if pid_alive(pid):
            began = started_at(pid)
            if began is None or began <= info.st_mtime + 2.0:  # 2 s: btime is whole seconds
                continue  # it may be the run that wrote it
        if remove(path) is None:
            removed.append(name)
    return removed


def no_current_among_releases(root: str) -> str | None:
    """Why a start with no `current` is refused where releases/ holds releases (`current`
    removed by hand): it would run from the remote root, outside every release, whatever code
    the host's python finds there (probe37af H2). None before any release was installed."""
    rel = os.path.join(root, "releases")
    try:
        names = sorted(
            n
            for n in os.listdir(rel)
            if not n.startswith(".") and os.path.isfile(os.path.join(rel, n, "release.json"))
        )
    except OSError:
        return None
    if not names:
        return None
    return (
        f"there is no current, but releases/ holds {len(names)} release(s) (newest: "
        f"{names[-1]}): the service would run from the remote root, outside every release; "
        "ops rollback TARGET --to ID makes one current (ops releases TARGET lists them)"
    )


def current_problem(root: str) -> str | None:
    """Why `current` is not a release an operator's start may run (None: it is one, or there
    is no `current` and no release yet: the command then runs from the root, as before any
    deploy; with releases and no `current`, `no_current_among_releases` says why not). A
    release is a directory under the root holding a release.json: releases/ID as ops makes
    it, a hand-made copy beside it, or a real directory `current` copied from one."""
    path = os.path.join(root, "current")
    if not os.path.lexists(path):
        return no_current_among_releases(root)
    said = f"current -> {os.readlink(path)}" if os.path.islink(path) else f"current ({path})"
    real, top = os.path.realpath(path), os.path.realpath(root)
    if not os.path.isdir(real):
        return None  # dangling or a file: startable() says so
    if real == top:
        why = "the remote root itself"
    elif not real.startswith(top.rstrip("/") + "/"):
        why = f"{real}, outside the remote root {top}"
    elif real == os.path.join(top, "releases"):
        why = "the releases/ directory, not one release"
    elif not os.path.isfile(os.path.join(real, "release.json")):
        why = f"{real}, a directory with no release.json (not a release)"
    else:
        return None
    return f"{said} resolves to {why}"


def current_damaged(root: str) -> str | None:
    """Why the release `current` names (releases/ID) is damaged, as `ops releases` marks it:
    its release.json unreadable, or another release's (copied over by hand); None: it is not,
    or `current` is no release of this root."""
    real = os.path.realpath(os.path.join(root, "current"))
    if os.path.dirname(real) != os.path.join(os.path.realpath(root), "releases"):
        return None
    rid = os.path.basename(real)
    doc = read_small_json(os.path.join(real, "release.json"))
    named = doc.get("id") if isinstance(doc, dict) else None
    if isinstance(doc, dict) and named in (None, rid):
        return None
    why = (
        f"its release.json is release {str(named)[:200]}'s"
        if named
        else "its release.json cannot be read"
    )
    return (
        f"current ({rid}) is a damaged release ({why}): a deploy refuses to go on from it, a "
        "failed one could not put it back; ops rollback TARGET --to ID makes a whole one current "
        "(ops releases TARGET marks the damaged ones)"
    )


def renamed_from(release: str) -> str | None:
    """The release id a release directory's release.json names where that is not the
    directory's own name (renamed by hand, or another's copied over it); None where it is, or
    cannot be read."""
    doc = read_small_json(os.path.join(release, "release.json"))
    named = doc.get("id") if isinstance(doc, dict) else None
    if not isinstance(named, str) or named == os.path.basename(release):
        return None
    return named[:200]


def read_small_json(path: str) -> object:
    """A small regular JSON file, never opened blocking (None: absent, not regular, not JSON)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ENV:
            return None
        return json.loads(os.read(fd, MAX_ENV + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # (RecursionError: nested too deep to parse)
        return None
    finally:
        os.close(fd)


def guard_alive(root: str) -> bool:
    """A deploy's revert guard holds deploy.guard (flock) for its whole life. Read from
    /proc/locks, never by taking the lock: a probe holding it even for a moment could make
    a pending switch see a guard that is not there."""
    return flock_held(root, "deploy.guard")


def flock_held(root: str, name: str) -> bool:
    """Some process holds a flock on root/name (read from /proc/locks, the lock never taken:
    a probe holding it even for a moment could refuse a deploy its lock)."""
    try:
        info = os.stat(os.path.join(root, name))
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return False  # never made here
    want = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        cols = line.split()
        if "->" in cols:  # a waiter, not a holder
            continue
        if len(cols) > 5 and cols[1] == "FLOCK" and cols[5] == want:
            return True
    return False


def pending_state(root: str) -> dict | None:
    """What deploy.pending says, where one is there (None: no deploy left one). `guard`: a
    guard is alive (a deploy runs, or its guard is putting the host back now); `settled`:
    current is already back, only the restart onto it was due; `new`: the never-proven id."""
    path = os.path.join(root, "deploy.pending")
    if not os.path.lexists(path):
        return None
    doc = read_small_json(path)
    # whole as the revert reads it, or not (probe37aq L3: status said a rollback died, of a
    # record the revert then set aside as unreadable)
    unreadable = not_whole(doc)
    readable = unreadable is None
    doc = doc if isinstance(doc, dict) else {}
    new = doc.get("new") if isinstance(doc.get("new"), str) else None
    cur = os.path.join(root, "current")
    proven = os.path.isfile(os.path.join(cur, "proven.json")) if os.path.isdir(cur) else False
    guard = guard_alive(root)
    # a record that is not this host's switch: current is another release than its `new`
    # (probe37ad M4: a restart refused for it named a rollback that moved current)
    now = os.path.basename(os.path.realpath(cur)) if os.path.isdir(cur) else None
    stale = bool(readable and new and not guard and doc.get("settled") is not True and now != new)
    by = switched_by(doc)
    # a deploy's record whose release was proven since: no switch to undo (the next deploy or
    # rollback sets it aside: releases.revert), never "taken for never proven" (probe37ag L2)
    proven_since = bool(readable and new and now == new and proven and by == "deploy")
    stale = stale or (proven_since and not guard and doc.get("settled") is not True)
    back = doc.get("current")  # a settled record: what it put back (a release id, or a path)
    if doc.get("settled") is True and isinstance(back, str) and "/" not in back and back != now:
        stale, new = not guard, back  # (probe37ae M2: it named another release)
    elif (
        doc.get("settled") is True
        and not isinstance(back, str)
        and (back is not None or os.path.lexists(cur))
    ):
        # names no current put back (a put-back to none is null, with no current): the revert
        # refuses it as not this host's switch, and so is it said (probe37ap L2: two words)
        stale, new = not guard, None
    return {
        "guard": guard,
        "stale": stale,
        "current_id": now,
        "guard_stopped": stopped_guard(root) if guard else [],
        # its `cat`s: the guard still waits for its ops to go (a deploy runs, or its link froze)
        "guard_waiting": waiting_guard(root) if guard else [],
        "locked": flock_held(root, "lock"),  # a deploy, rollback or restart holds the host lock
        "settled": doc.get("settled") is True,
        "new": new,
        "readable": readable or doc.get("settled") is True,
        "unreadable": unreadable,  # why it cannot be read whole (None: it can)
        "by": by,
        "current_proven": proven,  # current's release passed a post-flight, some time
        "proven_since": proven_since,
    }


def guard_holders(root: str) -> list[int]:
    """The processes holding deploy.guard open (a guard's shell and the commands it runs, by
    their fd 8); [] where there is no such file to open."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.join(root, "deploy.guard"), flags)
    except OSError:
        return []
    try:
        return holders(fd)
    finally:
        os.close(fd)


def stopped_guard(root: str) -> list[int]:
    """The processes holding deploy.guard open that are stopped (SIGSTOP, a debugger): a guard
    that would never finish putting the host back until let go on (probe37q Q2: a restart said
    it "is putting the host back now; try again when it is done", which never came)."""
    return sorted(p for p in guard_holders(root) if proc_state(p) in ("T", "t"))


def waiting_guard(root: str) -> list[int]:
    """The `cat`s through which revert guards holding deploy.guard still wait for their ops
    to go (each reads its guard shell's stdin, the link to ops, until it closes); [] where
    none waits (the twin of ops.hostside.releases.waiting_guards)."""
    held = set(guard_holders(root))
    found = []
    for pid in held:
        st = proc_stat(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a for a in f.read(4096).split(b"\0") if a]
            if argv != [b"cat"] or st is None or st["ppid"] not in held:
                continue
            if os.readlink(f"/proc/{pid}/fd/0") == os.readlink(f"/proc/{st['ppid']}/fd/0"):
                found.append(pid)
        except OSError:
            continue
    return sorted(found)


def pending_note(pending: dict, serves: bool = False) -> str:
    """One line for a deploy.pending a start or restart found; `serves`: the service runs
    from current now."""
    if pending.get("stale") and pending.get("proven_since"):
        return (
            f"deploy.pending names a deploy of {pending['new']}, which passed a post-flight "
            "since (proven.json): a stale record, no switch to undo; the next deploy or "
            "rollback sets it aside and moves nothing for it"
        )
    if pending.get("stale"):
        now, new = pending.get("current_id") or "(none)", pending["new"]
        what = f"a put-back onto {new}" if pending.get("settled") else f"a switch to {new}"
        what = what if new else "a put-back onto no release"
        return (
            f"deploy.pending names {what}, but current is {now}: a stale "
            "record, not this host's switch; the next deploy or rollback sets it aside and "
            "moves nothing for it"
        )
    stopped = " ".join(map(str, pending.get("guard_stopped") or []))
    if pending["guard"] and stopped:
        return (
            "deploy.pending is there and a deploy's revert guard holds deploy.guard, but it is "
            f"stopped (pid {stopped}), so it cannot put the host back: kill -CONT {stopped} "
            "lets it finish (where its deploy is gone, it then puts the release before back and "
            "restarts the service)"
        )
    cats = " ".join(map(str, pending.get("guard_waiting") or []))
    if pending["guard"] and cats and not pending.get("locked"):  # (probe37ay M1: said nothing)
        return (
            "deploy.pending is there: a switch that was never proven, and no deploy holds the "
            "host lock, but its revert guard has not begun to put the host back: it still waits "
            "for its link to that deploy's ops to close (a frozen SSH session?); once the link "
            f"closes, it puts the host back. Where that ops is gone, kill {cats} ends the wait"
        )
    if pending["guard"] and cats:
        return (
            "deploy.pending is there and a deploy's revert guard waits for that deploy to end: "
            "a deploy or rollback runs now"
        )
    if pending["guard"]:
        return (
            "deploy.pending is there and a deploy's revert guard holds deploy.guard: the guard "
            "of a deploy that went away is putting the host back now"
        )
    if pending["settled"] and serves:  # (probe37ae M2: "died before restarting" it was not)
        return (
            "deploy.pending (settled) is there: a deploy or rollback put current back, and the "
            "service runs it (its restart was done); the next deploy or rollback clears the record"
        )
    if pending["settled"]:  # (probe37ag L1: or its restart there failed: not "died")
        return (
            "deploy.pending (settled) is there: a deploy or rollback put current back, and the "
            "service's restart onto it never came (the command died) or failed"
        )
    was = " (its release passed a post-flight before: proven.json)"
    if not pending.get("readable", True):
        said = "current's release passed a post-flight before (proven.json)"
        return (
            f"deploy.pending is there but cannot be read whole ({pending.get('unreadable')}), "
            "so whether this switch was proven cannot be told from it"
            + (f"; {said}" if pending.get("current_proven") else "")
        )
    what = f"release {pending['new']}" if pending["new"] else "its release"
    if pending.get("by") == "rollback":
        return (
            f"deploy.pending is there: a rollback to {what} died before it passed its "
            "post-flight and its revert guard is gone, so this switch to current was never "
            "proven" + (was if pending.get("current_proven") else "")
        )
    # (or it passed, and the commit could not be written: a read-only or full root; nothing
    # on the host tells the two apart, so neither is said as fact: probe37q Q6, probe37t T7)
    return (
        f"deploy.pending is there: the switch to {what} was never made final (its deploy "
        "died before its post-flight passed, or could not write its commit: a read-only or "
        "full root) and its revert guard is gone, so current is taken for never proven"
    )


def vet(root: str, mode: str) -> tuple[dict | None, list[str], dict | None]:
    """An operator's start or restart (mode "operator", or "operator-force"): (why it is
    refused, with what blocks it; warnings; the deploy.pending state). A deploy's own start
    or restart (mode "") is never refused here."""
    if not mode.startswith("operator"):
        return None, [], None
    force = mode == "operator-force"
    warnings: list[str] = []
    pending = pending_state(root)
    if pending is not None:  # the host lock is this start's own: a guard still waiting waits
        pending["locked"] = False  # for a deploy that holds none (ended, or its link frozen)
    if pending is not None and pending["stale"]:  # said, and nothing refused for it
        warnings.append(pending_note(pending))
    elif pending is not None:
        note = pending_note(pending)
        if pending["guard"]:
            stuck = pending["guard_stopped"] or pending["guard_waiting"]  # (the lock is ours)
            then = "then try again" if stuck else "try again when it is done"
            refusal = {"reason": f"{note}; {then}", "blocked_by": "guard"}
            return refusal, [], pending
        if pending["settled"]:
            warnings.append(note + "; the next deploy or rollback clears it")
        elif force:
            warnings.append(note + "; started it anyway (--force)")
        else:
            kind = "pending" if pending.get("readable", True) else "pending-unreadable"
            if pending.get("readable", True) and pending.get("by") == "rollback":
                kind = "pending-rollback"
            return {"reason": note, "blocked_by": kind}, [], pending
    bad = current_problem(root)
    if bad and force:
        warnings.append(f"{bad}; ran it anyway (--force)")
    elif bad:
        return {"reason": bad, "blocked_by": "current"}, warnings, pending
    try:  # a link to nothing, a file: a systemd unit was stopped, then could not start in it
        startable(root)  # (with --force, the start says it: nothing runs in no directory)
    except NotStartable as exc:
        if not force:
            return {"reason": str(exc), "blocked_by": exc.blocked_by}, warnings, pending
    return None, warnings, pending


def ends_a_line(log: str, size: int) -> bool:
    """The log (a regular file of `size` bytes) is empty or ends with a newline."""
    if size == 0:
        return True
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        return os.pread(fd, 1, size - 1) in (b"\n", b"")
    finally:
        os.close(fd)


LOG_ROOM = 1 << 20  # free bytes below which the service's output is dropped (no keeper: /dev/null)
LOG_CAP = 64 << 20  # the service's log is rotated past this size (to <log>.1, one kept)
LOG_CHECK = 1 << 20  # a keeper looks at its disk's free space at least each MiB it writes
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
KEEPERS: list = []  # the log keepers this run started (a failed start waits for their last write)


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def open_regular(log: str) -> int:
    """The log opened to append (blocking writes), a regular file reached through no link; a
    FIFO there never blocks the open (OSError otherwise)."""
    fd = os.open(log, LOG_FLAGS, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, "not a regular file", log)
    os.set_blocking(fd, True)
    return fd


def rotate(log: str, fd: int) -> tuple[int, str | None]:
    """The log's fd after moving the file `fd` writes to aside as `<log>.1` (the one before
    goes) and opening a new one at `log`, and what went wrong (None: nothing). Where the file
    cannot be moved or a new one opened, it is emptied instead: the log stays bounded."""
    try:
        logs = os.path.dirname(log)
        if os.path.islink(logs):  # made so by hand since the start: never written through
            raise OSError(0, f"{logs} is a symlink", logs)
        mine, there = os.fstat(fd), os.lstat(log)
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            os.replace(log, log + ".1")
        new = open_regular(log)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        return fd, f"could not rotate it ({exc.strerror}): emptied it"
    os.close(fd)
    return new, None


def keep_log(log: str) -> None:
    """The log keeper: what the service writes into its pipe (fd 0) goes to the log (fd 1),
    rotated past LOG_CAP, and dropped (counted, then said in the log) while the disk has under
    LOG_ROOM free: a service flooding its output never fills the root's disk (probe37aa H1).
    It runs in a session of its own with no environment of ops (no stop or stray rule takes it
    for the service) and ends when the last writer closes the pipe: with the service."""
    for sig in CRITICAL:  # it ends with the service's output, not with a signal for others
        signal.signal(sig, signal.SIG_IGN)
    out, dropped, written, low, ended = 1, 0, 0, False, True
    size, room = os.fstat(out).st_size, 0  # bytes it may write before it looks again
    name = os.path.basename(log)
    while True:
        try:
            chunk = os.read(0, 1 << 16)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        if low or written >= room:  # looked at more often as the disk fills
            try:
                disk = os.fstatvfs(out)
                free = disk.f_bavail * disk.f_frsize
            except OSError:
                free = LOG_ROOM + 2 * LOG_CHECK
            low, written, room = free < LOG_ROOM, 0, min(LOG_CHECK, (free - LOG_ROOM) // 2)
        if low:
            dropped += len(chunk)
            continue
        lines, fresh = [], False  # (fresh: a new or emptied file, no partial line to end)
        if size + len(chunk) > LOG_CAP and size:
            fresh = True
            out, why = rotate(log, out)
            lines.append(
                f"=== {stamp()} ops: log past {LOG_CAP >> 20} MiB; "
                + (why or f"the output before this line is in {name}.1")
            )
        if dropped:
            lines.append(
                f"=== {stamp()} ops: {dropped} bytes of the service's output dropped: "
                f"the disk had under {LOG_ROOM >> 20} MiB free"
            )
        lead = "\n" if lines and not (ended or fresh) else ""
        data = (lead + "".join(line + "\n" for line in lines)).encode() + chunk
        try:
            while data:
                data = data[os.write(out, data) :]
        except OSError:  # ENOSPC, EDQUOT, EIO: dropped, and the disk looked at again
            dropped += len(data)
            low, ended = True, False  # (a part may have been written: its line left open)
            continue
        dropped, ended = 0, chunk.endswith(b"\n")
        now = os.fstat(out).st_size
        written += max(now - size, 0)
        size = now


def own_source() -> str:
    """This script's text: what `python -c` was given (its first argument after -c)."""
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    return argv[argv.index(b"-c") + 1].decode()


def start_keeper(log: str, fd: int, warnings: list) -> int:
    """The write end of a pipe whose reader, a log keeper (`keep_log`), writes into the log
    `fd`; `fd` itself where no keeper can start (with a warning: the log is not capped)."""
    read, write = os.pipe()
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-S", "-c", own_source(), "keep-log", log],
            stdin=read,
            stdout=fd,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
        )
    except (OSError, ValueError, IndexError) as exc:
        os.close(write)
        warnings.append(f"log keeper not started ({exc}): the service writes its log uncapped")
        return fd
    finally:
        os.close(read)
    KEEPERS.append(keeper)
    os.close(fd)
    return write


def log_keepers(pid: int) -> list[int] | None:
    """The log keepers reading what the service `pid` writes (the readers of the pipe its fd 1
    is: [] where none is left); None where its output goes elsewhere (/dev/null, the log
    itself) or cannot be read."""
    try:
        pipe = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    if not pipe.startswith("pipe:"):
        return None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == pid:
            continue
        try:
            if os.readlink(f"/proc/{name}/fd/0") != pipe:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"keep-log" in argv:
            found.append(int(name))
    return found


def keeper_trouble(pid: object) -> str | None:
    """What status says of the service `pid`'s log keeper where it is stopped (SIGSTOP, a
    debugger: the service's writes wait in the pipe, then block; probe37ax L3: said by
    nothing) or gone (its output no longer kept); None where it reads on."""
    if not isinstance(pid, int):
        return None
    keepers = log_keepers(pid)
    if keepers == []:  # a pipe no keeper reads (probe37bb L1: killed, and nothing said it)
        return (
            "its log keeper is gone (killed?): the service's output is no longer kept, and a "
            "write to it may fail; ops service restart starts a new one"
        )
    stopped = [k for k in keepers or [] if proc_state(k) in ("T", "t")]
    if not stopped:
        return None
    pids = " ".join(map(str, stopped))
    return (
        f"its log keeper (pid {pids}) is stopped (SIGSTOP or a debugger): the service's output "
        f"waits in its pipe, and the service blocks once that is full; kill -CONT {pids} lets "
        "it go on (a stop or restart does that too)"
    )


def keepers_done(wait_s: float = 1.0) -> None:
    """Wait (a little) for this run's log keepers to write the last output of a service that
    exited: a failed start's evidence is read from the log right after."""
    end = time.time() + wait_s
    for keeper in KEEPERS:
        with contextlib.suppress(subprocess.TimeoutExpired):
            keeper.wait(max(end - time.time(), 0.01))


def open_log(log: str, command: str, warnings: list) -> tuple[int, str | None]:
    """The fd for the service's output, and why this start's output is not kept in the log
    (None: it is). The fd is a pipe to a log keeper (`keep_log`: the log capped, rotated, and
    never filling the disk); /dev/null (with a warning: the service's output is lost, said in
    the text too, probe37s S3) when the log cannot be written: a full or read-only log
    directory must not keep the service down. Nor a nearly full one where no keeper runs: a
    service whose write to its stdout fails (ENOSPC) may die of it (probe37x M3: on a full root
    every start after a stop failed). A log already past LOG_CAP is rotated first."""
    # never blocks (a FIFO there would hang the start with the service already stopped) and
    # never follows a link, the log's or its directory's (the service's output would go to
    # whatever they name: another target's logs, probe37r R7)
    logs = os.path.dirname(log)
    lost = "the service's output is not kept"

    def not_kept(why: str) -> tuple[int, str]:
        warnings.append(f"log not written: {why}; {lost}")
        return os.open(os.devnull, os.O_WRONLY), why

    if os.path.islink(logs):
        why = f"{logs} is a symlink (to {os.readlink(logs)}), not followed"
        return not_kept(f"{why} (make it a directory)")
    try:
        os.makedirs(logs, exist_ok=True)
        fd = open_regular(log)
    except OSError as exc:
        return not_kept(f"{log}: {exc.strerror}")
    try:
        disk = os.fstatvfs(fd)
        free = disk.f_bavail * disk.f_frsize
    except OSError:
        free = LOG_ROOM
    if os.fstat(fd).st_size >= LOG_CAP:
        fd, why = rotate(log, fd)
        if why:
            warnings.append(f"{log} was past {LOG_CAP >> 20} MiB: {why}")
    marked = None
    try:
        # on a line of its own: after a last run's partial line, the marker glued to it was
        # never found, and a failed start quoted the run before as its own output
        lead = "" if ends_a_line(log, os.fstat(fd).st_size) else "\n"
        os.write(fd, f"{lead}=== {stamp()} ops start: {command}\n".encode())
    except OSError as exc:
        # without its marker, the log's last lines are the start before's, not this one's
        marked = f"ops start marker not written ({log}: {exc.strerror})"
        warnings.append(marked)
    out = start_keeper(log, fd, warnings)
    full = f"{log}: " + (  # (probe37bc L2: 634880 bytes free was said "full")
        f"its disk has {free} bytes free (under {LOG_ROOM >> 20} MiB)"
        if free
        else "its disk is full"
    )
    if out == fd and free < LOG_ROOM:  # no keeper: the service would meet the full disk
        os.close(fd)
        return not_kept(full)
    if free < LOG_ROOM:
        warnings.append(f"{full}: the service's output is dropped until there is room again")
    return out, marked


def do_start(
    pidfile: str,
    log: str,
    root: str,
    command: str,
    url: str,
    reserved: str | None = None,
    mode: str = "",
    grace: float = 10.0,
) -> dict:
    notes: list[str] = []
    swept = sweep_tmp(pidfile)
    if swept:
        notes.append(f"removed {len(swept)} pidfile temporary file(s) left by runs that are gone")
    refused, warnings, _ = vet(root, mode)
    ident, problem = read_pidfile(pidfile)
    if ident is not None:
        problem = verify(ident, pidfile)
        if problem is None:
            if reserved:
                remove(reserved)
            doc = {"started": False, "already": True, "pid": ident["pid"], "notes": notes}
            return {**doc, "warnings": warnings + ([refused["reason"]] if refused else [])}
    over = unproven_start(root, pidfile) if mode.startswith("operator") else None
    if over and mode == "operator-force":
        warnings.append(f"{over}; started it anyway (--force)")
    elif over and not refused:  # (probe37as M1: stop, then start, did what restart refuses)
        refused = {"reason": over, "blocked_by": "unproven-start"}
    if refused:
        if reserved:
            remove(reserved)
        return {"started": False, "notes": notes, "warnings": warnings, **refused}
    if problem:
        notes.append(f"removed stale pidfile: {problem}")
        why = remove(pidfile)
        if why:
            notes.append(why)
    holder = port_holder(url)
    ours = strays(pidfile, url=url) if holder is not None and holder["pid"] else []
    if holder is not None and holder["pid"] in {p["pid"] for p in ours}:
        # this service's own process, that no pidfile names (it daemonized, or its pidfile
        # was lost): stopped as a restart stops the service, once the start is sure to happen
        try:
            startable(root)
            current_env(root)
            reserved = reserved or reserve(pidfile, notes)
        except NotStartable as exc:
            if reserved:
                remove(reserved)
            reason = (
                f"{exc}; port {port_of(url)} is held by {named(ours)}, this service's own "
                "process that no pidfile names: not stopped"
            )
            doc = {"started": False, "notes": notes, "warnings": warnings, "reason": reason}
            return {**doc, "blocked_by": exc.blocked_by}
        signals: list = []
        gone = stop_strays(pidfile, grace, signals, time.time(), url)
        notes.append(f"stopped {named(gone)}: this service, unmanaged (no pidfile named it)")
        holder = port_holder(url)
    if holder is not None:
        if reserved:
            remove(reserved)
        who = f"pid {holder['pid']}" if holder["pid"] else "another user's process"
        return {
            "started": False,
            "notes": notes,
            "warnings": warnings,
            "reason": f"port {port_of(url)} is already in use by {who} ({holder['cmdline']})",
            "blocked_by": "port",  # the host's, not the release's: nothing was started
        }
    try:
        cwd = startable(root)
        tmp = reserved or reserve(pidfile, notes)
        release_env = current_env(root)
    except NotStartable as exc:
        if reserved:
            remove(reserved)
        doc = {"started": False, "notes": notes, "warnings": warnings, "reason": str(exc)}
        return {**doc, "blocked_by": exc.blocked_by}
    env = dict(os.environ)
    if release_env.get("PYTHONPATH") and env.get("PYTHONPATH"):
        # the release's code first, then whatever the service's own environment needs
        release_env["PYTHONPATH"] += os.pathsep + env["PYTHONPATH"]
    env.update(release_env)
    owner_root, service = owner_of(pidfile)
    env[ENV_ROOT], env[ENV_SERVICE] = owner_root, service  # whose it is (not_owner reads them)
    out, log_lost = open_log(log, command, warnings)
    # from the fork to the pidfile, a TERM or Ctrl-C (ops interrupted: its watcher TERMs this
    # process) would leave a service no pidfile names: they wait until it is written
    held = signal.pthread_sigmask(signal.SIG_BLOCK, CRITICAL)
    try:
        proc = subprocess.Popen(
            # bash as the process manager finds it: a PATH in service.env is the command's,
            # not ops's (probe37bd M1: "No such file: 'bash'", after a restart had stopped it)
            [shutil.which("bash") or "/bin/bash", "-c", "exec " + command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=unblock_in_child,  # the service itself takes TERM as usual
        )
    except (OSError, ValueError) as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        remove(tmp)
        return {"started": False, "notes": notes, "reason": f"cannot run the command: {exc}"}
    finally:
        os.close(out)
    st = proc_stat(proc.pid) or {}
    ident = {
        "pid": proc.pid,
        "start": st.get("start"),
        "boot": boot_id(),
        "started": time.time(),
        "cwd": cwd,
        "root": owner_root,
        "service": service,
        "release": release_in(root, cwd),  # what it runs: a later start weighs it (last_ran)
        # the command it runs, as a hash: a control side whose inventory renders another one
        # now (edited since) says so, as a revert would start that (probe37au H1's kin)
        "command_sha256": hashlib.sha256(command.encode()).hexdigest(),
    }
    try:
        text = json.dumps(ident)
        with open(tmp, "r+") as f:  # into the room reserved: no new block is needed
            room = pidfile_room(pidfile)
            f.write(text.ljust(room) if len(text) <= room else text)
        os.replace(tmp, pidfile)
    except OSError as exc:
        # a service nobody can see or stop must not run: end it before saying why
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        remove(tmp)
        reason = f"started pid {proc.pid}, then could not record it ({exc.strerror}); killed it"
        return {"started": False, "notes": notes, "reason": reason, "blocked_by": "host"}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a TERM that came is taken now
    doc = {"started": True, "pid": proc.pid, "cwd": cwd, "notes": notes, "warnings": warnings}
    if log_lost:
        doc["log_lost"] = log_lost  # no output of this start to quote
    if not os.path.lexists(os.path.join(root, "current")):
        doc["no_release"] = True  # nothing deployed: the command ran from the root
    return doc


def do_wait(pidfile: str, url: str, timeout: float) -> dict:
    t0 = time.time()
    ident, problem = read_pidfile(pidfile)
    if ident is None:
        return {"ok": False, "reason": problem or "no pidfile", "waited_s": 0.0}
    pid, last = ident["pid"], "no answer"
    while True:
        why = verify(ident, pidfile)
        for _ in range(5 if why and alive(pid) else 0):
            # alive, but not seen as itself: /proc read mid-execve (its environment shows
            # partly) on a loaded host; a live process is looked at again before it is called
            # exited (a CI run read a healthy start so, then stopped it as a stray)
            time.sleep(0.1)
            why = verify(ident, pidfile)
            if not why or not alive(pid):
                break
        if why:
            return {"ok": False, "reason": f"process {pid} exited", "waited_s": time.time() - t0}
        last = health(url) or served_by(pid, url)
        if last is None:
            return {"ok": True, "pid": pid, "waited_s": time.time() - t0}
        if timeout <= 0:  # (the guard's restart: ops asks /health itself, if it is there)
            # said as what it is, not as a failed start (probe37q Q9: every guard.log entry
            # read as an unhealthy restart)
            why = f"not waited for (a wait of 0 s); /health at once: {last}"
            return {"ok": False, "reason": why, "waited_s": time.time() - t0, "not_waited": True}
        if time.time() - t0 >= timeout:
            return {"ok": False, "reason": last, "waited_s": time.time() - t0}
        # a service up within 5 s (the reference engine on CPU: ~2.5 s, its torch import) is
        # seen at once; a slower one (a real model loading) at 4 polls a second
        time.sleep(0.05 if time.time() - t0 < FAST_POLL_S else 0.25)


def session_members(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st["session"] == sid and alive(int(entry)):
                pids.append(int(entry))
    return pids


def do_stop(pidfile: str, grace: float, url: str | None = None) -> dict:
    """Stop the pidfile's proven process (its process group, then its session), then every
    process left whose environment says it is this service of this root (`strays`: one that
    daemonized, or whose pidfile is gone). Nothing is written but the pidfile's removal: on a
    read-only root the service is stopped all the same, and `left_pidfile` says why the
    pidfile stays."""
    sweep_tmp(pidfile)
    t0 = time.time()
    signals: list = []
    ident, problem = read_pidfile(pidfile)
    if ident is not None:
        problem = verify(ident, pidfile)
    if ident is None and problem is None:
        doc = {"action": "not_running", "detail": "was not running (no pidfile)"}
    elif problem:
        kept = remove(pidfile)
        detail = f"stale pidfile: {problem}; {kept or 'removed it'}, signalled nothing"
        doc = {"action": "stale", "detail": detail, **({"left_pidfile": kept} if kept else {})}
    else:
        doc = stop_managed(pidfile, ident["pid"], grace, signals, t0)
    gone = stop_strays(pidfile, grace, signals, t0, url)
    if gone:
        said = f"stopped {named(gone)}: this service, unmanaged (no pidfile named it)"
        if doc["action"] == "stopped":
            doc["detail"] += f"; {said}"
        else:
            doc["detail"] = said + ("" if doc["action"] == "not_running" else f"; {doc['detail']}")
            doc["action"] = "stopped"
        doc["unmanaged"] = gone
    waiting = stopped_restarts(pidfile)
    if waiting:  # (a restart's own stop is not told: its worker is this process)
        pids = " ".join(map(str, waiting))
        doc["warnings"] = doc.get("warnings", []) + [
            f"a restart of this service (pid {pids}) is stopped (SIGSTOP) and holds its lock: "
            f"continued, it starts the service again; kill -9 {pids} ends it"
        ]
    return {**doc, "signals": signals}


def stopped_restarts(pidfile: str) -> list[int]:
    """The stopped processes holding this service's restart lock (a restart's worker frozen by
    SIGSTOP or a debugger, which will go on with its start when continued); [] when none."""
    try:
        fd = os.open(pidfile + ".restart", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return []  # nobody holds it
        except BlockingIOError:
            return [p for p in holders(fd) if proc_state(p) in ("T", "t")]
    finally:
        os.close(fd)


def stop_managed(pidfile: str, pid: int, grace: float, signals: list, t0: float) -> dict:
    """TERM to the proven pid's process group, KILL after `grace`, KILL to its session."""

    def send(sig: signal.Signals, to_group: bool) -> None:
        try:
            os.killpg(pid, sig) if to_group else os.kill(pid, sig)
        except ProcessLookupError:
            return
        who = f"process group {pid}" if to_group else f"pid {pid}"
        signals.append({"signal": sig.name, "to": who, "at_s": round(time.time() - t0, 3)})

    keepers = log_keepers(pid) or []  # (its output's reader: a stopped one is continued below)
    send(signal.SIGTERM, to_group=True)
    if proc_state(pid) == "T":  # stopped (SIGSTOP): the TERM waits till it runs, as systemd
        send(signal.SIGCONT, to_group=True)  # does (probe37ap L4: the whole grace, then KILL)
    how = "TERM"
    while alive(pid) and time.time() - t0 < grace:
        time.sleep(0.05)
    if alive(pid):
        send(signal.SIGKILL, to_group=True)
        how = f"KILL after {grace:g} s"
        while alive(pid) and time.time() - t0 < grace + 10:
            time.sleep(0.05)
    for other in session_members(pid):  # children that left the group but not the session
        try:
            os.kill(other, signal.SIGKILL)
        except ProcessLookupError:
            continue
        at = round(time.time() - t0, 3)
        signals.append({"signal": "SIGKILL", "to": f"pid {other}", "at_s": at})
    woken = []  # a stopped keeper never reads the end of its pipe: one left per restart, on
    for keeper in keepers:  # the old log, stopped for good (probe37ax L3); continued, it ends
        if proc_state(keeper) in ("T", "t"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper, signal.SIGCONT)
                woken.append(keeper)
                at = round(time.time() - t0, 3)
                signals.append({"signal": "SIGCONT", "to": f"pid {keeper}", "at_s": at})
    kept = retire(pidfile)  # the process is gone: a pidfile left behind is stale from now on
    took = time.time() - t0
    detail = f"stopped pid {pid} after {took:.1f} s ({how})" + (f"; {kept}" if kept else "")
    if woken:
        pids = " ".join(map(str, woken))
        detail += f"; continued its stopped log keeper (pid {pids}), which ends with it"
    doc = {"action": "stopped", "pid": pid, "seconds": round(took, 3), "detail": detail}
    return {**doc, "left_pidfile": kept} if kept else doc


def do_up(
    pidfile: str,
    log: str,
    root: str,
    command: str,
    url: str,
    timeout: float,
    reserved: str | None = None,
    mode: str = "",
    grace: float = 10.0,
) -> dict:
    """start; then wait (when this call started it) and the status after either. A start
    whose process exited but left this service's processes running outside its session (it
    daemonized) stops them: a service no pidfile names must not keep serving."""
    started = do_start(pidfile, log, root, command, url, reserved, mode, grace)
    doc = {"start": started}
    if started.get("started"):
        ident = read_pidfile(pidfile)[0] or {}
        doc["wait"] = wait = do_wait(pidfile, url, timeout)
        if not wait.get("ok") and str(wait.get("reason", "")).endswith(" exited"):
            signals: list = []
            begun = str(ident.get("start") or "")
            since = (str(started.get("cwd")), int(begun)) if begun.isdigit() else None
            left = stop_strays(pidfile, grace, signals, time.time(), url, since)
            if not left:  # a double fork in flux: its middle child gone, its grandchild unseen
                time.sleep(0.2)
                left = stop_strays(pidfile, grace, signals, time.time(), url, since)
            keepers_done()  # its last words in the log before anyone reads them there
            if left:
                wait["reason"] += (
                    f", leaving {named(left)} running outside its session (it daemonized: the "
                    "process manager needs the command to stay in the foreground); stopped them"
                )
                wait["signals"] = signals
    if started.get("started") or started.get("already"):
        doc["status"] = do_status(pidfile, url)
    return doc


def do_restart(
    pidfile: str,
    log: str,
    root: str,
    command: str,
    url: str,
    timeout: float,
    grace: float,
    mode: str = "",
) -> dict:
    """stop, then up; but first make sure the start can happen (current runnable, room for the
    pidfile; for an operator's restart, current a release and no dead deploy's switch pending),
    so a restart that could not start the service never stops it."""
    sweep_tmp(pidfile)
    refused, warnings, _ = vet(root, mode)
    ident, _ = read_pidfile(pidfile)
    live = ident is not None and verify(ident, pidfile) is None
    over = unproven_over(root, proc_cwd(ident["pid"]), ident["pid"]) if live and ident else None
    begun = None if live or not mode.startswith("operator") else unproven_start(root, pidfile)
    if begun and mode == "operator-force":
        warnings.append(f"{begun}; started it anyway (--force)")
    elif begun and not refused:  # not running: the start it comes to (probe37as M1)
        refused = {"reason": begun, "blocked_by": "unproven-start"}
    if over and mode == "operator-force":
        warnings.append(f"{over}; restarted it anyway (--force)")
    elif over and mode == "operator" and not refused:
        # (the release it runs gone from releases/: the way on is said in the reason)
        gone = gone_release(root, ident["pid"], proc_cwd(ident["pid"])) if ident else None
        refused = {"reason": over, "blocked_by": "unproven-gone" if gone else "unproven"}
    if refused:
        reason, kind = f"{refused['reason']}; the service was not stopped", refused["blocked_by"]
        runs = runs_other(root, proc_cwd(ident["pid"])) if live and ident else None
        if runs and kind == "release" and not os.path.isdir(os.path.join(root, "current")):
            # a `current` that is no directory, the service on a release: the rollback that
            # makes what runs current, with no restart (probe37bc M1: a stop, then a rollback,
            # was named: an outage nobody needed)
            reason, kind = f"{reason}; {runs}", "release-runs"
        start = {"started": False, "reason": reason, "blocked_by": kind}
        return {"start": {**start, "warnings": warnings}}
    if ident is not None and not live:
        retire(pidfile)  # its process is gone: its blocks go to this start (`reserve`)
    try:
        startable(root)
        current_env(root)
        tmp = reserve(pidfile, warnings)
    except NotStartable as exc:
        was = "was not stopped" if live or strays(pidfile, url=url) else "was not running"
        reason = f"{exc}; the service {was}"
        return {"start": {"started": False, "reason": reason, "blocked_by": exc.blocked_by}}
    stopped = do_stop(pidfile, grace, url)
    # vetted above, before the stop: the start after it is never refused for what was let by
    doc = do_up(pidfile, log, root, command, url, timeout, reserved=tmp, grace=grace)
    doc["start"]["warnings"] = warnings + doc["start"].get("warnings", [])
    doc["stop"] = stopped
    return doc


PIDFILE_ACTIONS = ("status", "start", "wait", "up", "stop", "restart")


def run_dir_moved(pidfile: str) -> str | None:
    """A symlink at the pidfile's directory (run/) was made by hand: through it ops would read,
    replace and remove the pidfiles of whatever directory it names, another target's say
    (probe37q Q7). The link (never its target) is moved aside; what was done, or None."""
    run = os.path.dirname(pidfile)
    if not os.path.islink(run):
        return None
    kept = f"{run}.unusable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    try:
        os.rename(run, kept)
    except OSError as exc:
        raise NotStartable(
            f"{run} is a symlink (to {os.readlink(run)}), not ops's run directory, and cannot "
            f"be moved aside ({exc.strerror}): nothing was done; remove it"
        ) from None
    return f"{run} was a symlink to {os.readlink(kept)}: moved aside as {os.path.basename(kept)}"


def main(argv: list[str]) -> dict:
    action, args = argv[0], argv[1:]
    if action in PIDFILE_ACTIONS and args:
        try:
            moved = run_dir_moved(args[0])
        except NotStartable as exc:
            return {"error": str(exc)}
        if moved:
            doc = main(argv)
            for part in (doc, doc.get("start")):
                if isinstance(part, dict):
                    part["warnings"] = [moved, *part.get("warnings", [])]
            return doc
    if action == "status":
        return do_status(args[0], args[1])
    if action == "start":
        return do_start(args[0], args[1], args[2], args[3], args[4])
    if action == "wait":
        return do_wait(args[0], args[1], float(args[2]))
    if action == "up":
        mode = args[6] if len(args) > 6 else ""
        grace = float(args[7]) if len(args) > 7 else 10.0
        return do_up(*args[:5], float(args[5]), mode=mode, grace=grace)
    if action == "stop":
        doc = do_stop(args[0], float(args[1]), args[2] if len(args) > 2 else None)
        later = (
            unproven_start(owner_of(args[0])[0], args[0]) if doc["action"] == "stopped" else None
        )
        if later:  # an operator's stop: said now, not only when the start is refused
            warned = f"{later}: an operator's start is refused without --force"
            doc["warnings"] = [warned, *doc.get("warnings", [])]
        return doc
    if action == "keep-log":  # LOG, with the service's pipe as stdin and the log as stdout
        keep_log(args[0])
        sys.exit(0)
    if action == "startable":  # ROOT: why `current` could not be started again (None: it can)
        try:
            startable(args[0])
            current_env(args[0])
        except NotStartable as exc:
            return {"reason": str(exc)}
        return {"reason": None}
    if action == "stopped-guard":  # ROOT: the stopped (SIGSTOP) holders of deploy.guard
        return {"pids": stopped_guard(args[0])}
    if action == "vet":  # ROOT MODE: what an operator's start or restart would be refused for
        refused, warnings, _ = vet(args[0], args[1])
        return {**(refused or {}), "warnings": warnings}
    if action == "restart":
        mode = args[7] if len(args) > 7 else ""

        def one_at_a_time() -> dict:
            try:
                with restart_lock(args[0]):
                    kept = runs_current(args[2], args[0], args[4]) if mode == "guard" else None
                    if kept:  # after any restart under way, which held the lock
                        return {"start": kept}
                    return do_restart(*args[:5], float(args[5]), float(args[6]), mode)
            except RestartStopped as exc:  # nothing was stopped: said, with the way on
                reason = f"{exc}; the service was not stopped by this restart"
                return {"start": {"started": False, "reason": reason, "blocked_by": "restart"}}

        doc = unkillable(one_at_a_time)
        if "stopped" in doc:  # said with where the service is now (maybe stopped by it)
            st = do_status(args[0], args[4])
            return {"error": f"{doc['error']}; the service is now {st['state']}: {st['detail']}"}
        if "killed" not in doc:
            return doc
        # the worker died with no word (a kill -9, the OOM killer), maybe between its stop and
        # its start (probe37o O3: the service was left down): the restart is made again
        again = unkillable(one_at_a_time)
        if "killed" in again:
            return {
                "error": f"the restart's worker was killed twice ({again['killed']}) before it "
                "said how it ended: the service may be stopped; ops service status tells, "
                "ops service start starts it"
            }
        note = f"the restart's worker was killed ({doc['killed']}) before it said how it ended"
        start = again.get("start")
        if isinstance(start, dict):
            start["warnings"] = [f"{note}; restarted again", *start.get("warnings", [])]
        return again
    raise SystemExit(f"unknown action {action!r}")


def runs_current(root: str, pidfile: str, url: str) -> dict | None:
    """The guard's restart, not needed: the service is active and runs what `current` is now,
    as it was started (probe37bl M1: ops gone after its switch, before its restart, the guard
    put current back and restarted the service that ran it all along: a model reload nobody
    needed). None where a restart is due."""
    st = do_status(pidfile, url)
    cwd, pid = st.get("cwd"), st.get("pid")
    current = os.path.join(root, "current")
    if st["state"] != "active" or not cwd or not same_dir(current, cwd) or untried(root, pid, cwd):
        return None
    return {"kept": True, "pid": pid, "detail": "the service already runs current: not restarted"}


class RestartStopped(Exception):
    """The restart before this one holds the restart lock and is stopped (SIGSTOP)."""


@contextlib.contextmanager
def restart_lock(pidfile: str) -> Iterator[None]:
    """One restart of a service at a time on the host: a deploy's restart that goes on after
    its link was lost, and the guard's restart of the release it put back, run one after the
    other, never interleaved (probe37n N3: the two left no service at all). Without a run
    directory to lock in (read-only, full), the restart goes on unlocked. A holder that is
    stopped (SIGSTOP, a debugger) would never let go, and the wait would end only at the host
    command's timeout, in silence, each time (probe37p P4): RestartStopped, at once, naming it."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(pidfile + ".restart", flags | os.O_NONBLOCK, 0o644)
    except OSError:
        yield
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            next_look = time.time()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.time() >= next_look:
                        stopped = [p for p in holders(fd) if proc_state(p) in ("T", "t")]
                        if stopped:
                            pids = " ".join(map(str, stopped))
                            raise RestartStopped(
                                f"an earlier restart of this service (pid {pids}) holds "
                                f"{os.path.basename(pidfile)}.restart but is stopped: kill -CONT "
                                f"{pids} lets it finish; then try again"
                            ) from None
                        next_look = time.time() + 1.0
                    time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def holders(fd: int) -> list[int]:
    """The processes of this user, other than this one, with the file at `fd` open (the twin of
    ops.hostside.releases.fd_holders: each script is sent to the host on its own)."""
    st, me, found = os.fstat(fd), os.getuid(), []
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
            for name in os.listdir(f"/proc/{pid}/fd"):
                other = os.stat(f"/proc/{pid}/fd/{name}")
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                    found.append(pid)
                    break
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def proc_state(pid: int) -> str:
    """The state letter of process `pid` ("?" where it cannot be read)."""
    st = proc_stat(pid)
    return st["state"] if st else "?"


WORKER_STOPPED_S = 3.0  # a restart worker stopped this long is said to be (not a moment's stop)


def unkillable(work: Callable[[], dict]) -> dict:
    """`work` run to its end by a child in a session of its own, its result passed back: a
    caller that goes away (a lost SSH link, after which the host's watcher signals this
    command's session; a killed ops) cannot cut a restart between its stop and its start
    (probe37m M8: the service was left stopped). Where nobody reads the result any more, the
    restart is still done; `ops service status` tells what it left. A worker that is itself
    killed before it writes its result: an error with `killed` (the caller restarts again)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(r)
        os.setsid()  # out of the command's session: the watcher's sweep never reaches it
        # nor does it hold the command's own output open: its result goes through the pipe,
        # and a worker that outlives the command (stopped, say) must not keep ops reading
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        # (no signal is ignored here: the service it starts would inherit that, probe37n N2;
        # a session of its own has no terminal to hang up, and SIGPIPE is Python's to ignore)
        try:
            doc = work()
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            doc = {"error": f"{exc.strerror or exc}{where}"}
        except BaseException as exc:  # noqa: BLE001 (a result, never a lost traceback)
            doc = {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(doc).encode()
        try:
            while data:
                data = data[os.write(w, data) :]
        except OSError:
            pass  # the caller is gone: the restart is done all the same
        os._exit(0)
    os.close(w)
    chunks, stopped_since = [], None
    while True:
        if select.select([r], [], [], 0.5)[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            continue
        # a worker stopped (SIGSTOP, a debugger) would make this wait until the host command's
        # timeout, minutes, in silence, maybe with the service stopped by it (probe37t T4):
        # said once it stays stopped, with the way on; it finishes its restart once let go on
        if proc_state(pid) not in ("T", "t"):
            stopped_since = None
        elif stopped_since is None:
            stopped_since = time.time()
        elif time.time() - stopped_since >= WORKER_STOPPED_S:
            os.close(r)  # (continued, it writes its result into a closed pipe: ignored)
            return {
                "error": f"the restart's worker (pid {pid}) is stopped (SIGSTOP or a debugger) "
                f"and may have stopped the service: kill -CONT {pid} lets it finish the restart",
                "stopped": pid,
            }
    os.close(r)
    _, status = os.waitpid(pid, 0)
    try:
        doc = json.loads(b"".join(chunks).decode())
    except ValueError:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no result"
        return {"error": f"the restart's worker gave no result ({how})", "killed": how}
    return doc if isinstance(doc, dict) else {"error": "the restart's worker gave no object"}


if __name__ == "__main__":
    try:
        result = main(sys.argv[1:])
    except OSError as exc:  # the host's own trouble (a full or read-only disk): one line
        where = f" ({exc.filename})" if exc.filename else ""
        result = {"error": f"{exc.strerror or exc}{where}"}
    print(json.dumps(result))
