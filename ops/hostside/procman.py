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
- `wait` waits until /health answers AND the listening socket on the service's port belongs
  to the service's session (so a server someone else runs on that port never counts).
- `up` is `start`, then (when it started the service) `wait`, then `status`, in one run on the
  host: what `ops service start` needs, without starting Python on the host three times.
- `stop` sends TERM to the service's process group, KILL after the grace period, then KILL to
  any process left in its session; every signal sent is reported.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

FAST_POLL_S = 5.0  # `wait` polls every 0.05 s for this long after the start, then every 0.25 s
ENV_ROOT, ENV_SERVICE = "DDTREE_OPS_ROOT", "DDTREE_OPS_SERVICE"  # whose service a process is


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> dict | None:
    """state, pgrp, session and starttime of a live pid (None if there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return {"state": rest[0], "pgrp": int(rest[2]), "session": int(rest[3]), "start": rest[19]}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"
    return text[:200] or "?"


def alive(pid: int) -> bool:
    """The process still runs: its leader, or any of its threads (a leader thread that exited
    is a zombie while the other threads still serve, holding the port)."""
    st = proc_stat(pid)
    if st is None:
        return False
    if st["state"] != "Z":
        return True
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except (OSError, IndexError):
            continue
    return False


def read_pidfile(path: str) -> tuple[dict | None, str | None]:
    """(identity, None) for a well-formed pidfile; (None, why) for garbage; (None, None) if none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there must not hang us
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable pidfile ({exc.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        text = os.read(fd, 4096).decode("utf-8", "replace")
    except OSError as exc:
        return None, f"unreadable pidfile ({exc.strerror})"
    finally:
        os.close(fd)
    try:
        ident = json.loads(text)
        pid = ident["pid"]
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 and "start" in ident:
            return ident, None
    except (ValueError, TypeError, KeyError):
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
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def same_dir(a: object, b: str) -> bool:
    return isinstance(a, str) and (a == b or os.path.realpath(a) == os.path.realpath(b))


def under(path: str, root: str) -> bool:
    if path.endswith(" (deleted)"):  # a pruned release the process still runs from
        path = path[: -len(" (deleted)")]
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def not_owner(ident: dict, pidfile: str) -> str | None:
    """None when the pidfile's process is the service of the root and name its path says;
    otherwise why not (a pidfile copied from another service's root or name)."""
    root, service = owner_of(pidfile)
    pid = ident["pid"]
    why = f"it is not this service's pidfile (service {service!r} under {root}): "
    if "root" not in ident and "service" not in ident:  # written before they were recorded
        try:
            now = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            now = None
        for where in (ident.get("cwd"), now):  # started under the root, and runs there still
            if not isinstance(where, str) or not under(where, root):
                return why + f"pid {pid} runs in {where}, not under {root}"
        return None
    got_root, got = ident.get("root"), ident.get("service")
    if got != service or not same_dir(got_root, root):
        return why + f"it names service {got!r} under {got_root}, pid {pid}"
    env = proc_environ(pid)
    if not env or (ENV_ROOT not in env and ENV_SERVICE not in env):
        # not ours to read (another user's), or read while the process was in execve (the
        # kernel shows an empty environment then): the recorded identity stands
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
    if st is None or st["state"] == "Z":
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
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in want:
                    owners.append(int(entry))
                    break
            except OSError:
                continue
    return owners


def port_of(url: str) -> int:
    parts = urllib.parse.urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


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


def read_env(path: str) -> dict[str, str]:
    """KEY=VALUE lines (systemd EnvironmentFile style: # comments, optional quotes)."""
    env: dict[str, str] = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO there must not hang a restart
    except FileNotFoundError:
        return env
    except OSError as exc:
        raise NotStartable(f"cannot read {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotStartable(f"{path} is not a regular file")
        raw = os.read(fd, 1 << 20)
    except OSError as exc:
        raise NotStartable(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if b"\0" in raw:
        raise NotStartable(f"{path} holds a NUL byte: no environment can carry it")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise NotStartable(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def do_status(pidfile: str, url: str) -> dict:
    ident, problem = read_pidfile(pidfile)
    if ident is None and problem is None:
        return {"state": "inactive", "detail": "not running (no pidfile)"}
    if ident is None:
        return {"state": "failed", "stale": True, "detail": f"stale pidfile: {problem}"}
    pid = ident["pid"]
    why = verify(ident, pidfile)
    if why:
        return {"state": "failed", "stale": True, "pid": pid, "detail": f"stale pidfile: {why}"}
    try:
        cwd = os.path.realpath(f"/proc/{pid}/cwd")  # which release it runs, whatever current says
    except OSError:
        cwd = None
    bad = health(url) or served_by(pid, url)
    if bad:
        detail = f"pid {pid} lives but {bad}"
        return {"state": "activating", "pid": pid, "detail": detail, "cwd": cwd}
    return {"state": "active", "pid": pid, "detail": f"pid {pid}, /health ok", "cwd": cwd}


CRITICAL = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def unblock_in_child() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CRITICAL)


class NotStartable(Exception):
    """The service cannot be started from here (nothing was started, nothing was stopped)."""


PIDFILE_ROOM = 1024  # bytes reserved for the pidfile before the service starts


def reserve(pidfile: str) -> str:
    """A temporary pidfile with its room already written to disk: once the service runs, its
    identity goes into blocks the disk has already given, so a disk that fills up meanwhile
    cannot leave a running service without a pidfile. Its path; NotStartable if the run
    directory cannot take it (full, read-only)."""
    tmp = f"{pidfile}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(pidfile), exist_ok=True)
        with open(tmp, "w") as f:
            f.write(" " * PIDFILE_ROOM)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        remove(tmp)
        where = os.path.dirname(pidfile)
        raise NotStartable(f"cannot write the pidfile in {where}: {exc.strerror}") from None
    return tmp


def startable(root: str) -> str:
    """The directory the service starts in; NotStartable when `current` cannot be run."""
    current = os.path.join(root, "current")
    if os.path.islink(current) and not os.path.exists(current):
        raise NotStartable(f"current -> {os.readlink(current)} does not exist")
    if os.path.lexists(current) and not os.path.isdir(current):
        raise NotStartable(f"{current} is not a directory")
    return current if os.path.isdir(current) else root


def open_log(log: str, command: str, notes: list) -> int:
    """The log's fd for the service's output; /dev/null (with a note) when it cannot be written:
    a full or read-only log directory must not keep the service down."""
    try:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        notes.append(f"log not written ({log}: {exc.strerror})")
        return os.open(os.devnull, os.O_WRONLY)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        os.write(fd, f"=== {stamp} ops start: {command}\n".encode())
    except OSError as exc:
        notes.append(f"log not written ({log}: {exc.strerror})")
    return fd


def do_start(
    pidfile: str, log: str, root: str, command: str, url: str, reserved: str | None = None
) -> dict:
    notes = []
    ident, problem = read_pidfile(pidfile)
    if ident is not None:
        problem = verify(ident, pidfile)
        if problem is None:
            if reserved:
                remove(reserved)
            return {"started": False, "already": True, "pid": ident["pid"]}
    if problem:
        notes.append(f"removed stale pidfile: {problem}")
        why = remove(pidfile)
        if why:
            notes.append(why)
    holder = port_holder(url)
    if holder is not None:
        if reserved:
            remove(reserved)
        who = f"pid {holder['pid']}" if holder["pid"] else "another user's process"
        return {
            "started": False,
            "notes": notes,
            "reason": f"port {port_of(url)} is already in use by {who} ({holder['cmdline']})",
            "blocked_by": "port",  # the host's, not the release's: nothing was started
        }
    try:
        cwd = startable(root)
        tmp = reserved or reserve(pidfile)
        release_env = read_env(os.path.join(root, "current", "service.env"))
    except NotStartable as exc:
        if reserved:
            remove(reserved)
        return {"started": False, "notes": notes, "reason": str(exc), "blocked_by": "host"}
    env = dict(os.environ)
    if release_env.get("PYTHONPATH") and env.get("PYTHONPATH"):
        # the release's code first, then whatever the service's own environment needs
        release_env["PYTHONPATH"] += os.pathsep + env["PYTHONPATH"]
    env.update(release_env)
    owner_root, service = owner_of(pidfile)
    env[ENV_ROOT], env[ENV_SERVICE] = owner_root, service  # whose it is (not_owner reads them)
    out = open_log(log, command, notes)
    # from the fork to the pidfile, a TERM or Ctrl-C (ops interrupted: its watcher TERMs this
    # process) would leave a service no pidfile names: they wait until it is written
    held = signal.pthread_sigmask(signal.SIG_BLOCK, CRITICAL)
    try:
        proc = subprocess.Popen(
            ["bash", "-c", "exec " + command],
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
    }
    try:
        text = json.dumps(ident)
        with open(tmp, "r+") as f:  # into the room reserved: no new block is needed
            f.write(text.ljust(PIDFILE_ROOM) if len(text) <= PIDFILE_ROOM else text)
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
    return {"started": True, "pid": proc.pid, "cwd": cwd, "notes": notes}


def do_wait(pidfile: str, url: str, timeout: float) -> dict:
    t0 = time.time()
    ident, problem = read_pidfile(pidfile)
    if ident is None:
        return {"ok": False, "reason": problem or "no pidfile", "waited_s": 0.0}
    pid, last = ident["pid"], "no answer"
    while True:
        why = verify(ident, pidfile)
        if why:
            return {"ok": False, "reason": f"process {pid} exited", "waited_s": time.time() - t0}
        last = health(url) or served_by(pid, url)
        if last is None:
            return {"ok": True, "pid": pid, "waited_s": time.time() - t0}
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
            if st is not None and st["session"] == sid and st["state"] != "Z":
                pids.append(int(entry))
    return pids


def do_stop(pidfile: str, grace: float) -> dict:
    ident, problem = read_pidfile(pidfile)
    if ident is None and problem is None:
        return {"action": "not_running", "detail": "was not running (no pidfile)", "signals": []}
    if ident is not None:
        problem = verify(ident, pidfile)
    if problem:
        kept = remove(pidfile)
        detail = f"stale pidfile: {problem}; {kept or 'removed it'}, signalled nothing"
        return {"action": "stale", "detail": detail, "signals": []}
    pid = ident["pid"]
    signals = []
    t0 = time.time()

    def send(sig: signal.Signals, to_group: bool) -> None:
        try:
            os.killpg(pid, sig) if to_group else os.kill(pid, sig)
        except ProcessLookupError:
            return
        who = f"process group {pid}" if to_group else f"pid {pid}"
        signals.append({"signal": sig.name, "to": who, "at_s": round(time.time() - t0, 3)})

    send(signal.SIGTERM, to_group=True)
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
    kept = remove(pidfile)  # the process is gone: a pidfile left behind is stale from now on
    took = time.time() - t0
    return {
        "action": "stopped",
        "pid": pid,
        "seconds": round(took, 3),
        "detail": f"stopped pid {pid} after {took:.1f} s ({how})" + (f"; {kept}" if kept else ""),
        "signals": signals,
    }


def do_up(
    pidfile: str,
    log: str,
    root: str,
    command: str,
    url: str,
    timeout: float,
    reserved: str | None = None,
) -> dict:
    """start; then wait (when this call started it) and the status after either."""
    started = do_start(pidfile, log, root, command, url, reserved)
    doc = {"start": started}
    if started.get("started"):
        doc["wait"] = do_wait(pidfile, url, timeout)
    if started.get("started") or started.get("already"):
        doc["status"] = do_status(pidfile, url)
    return doc


def do_restart(
    pidfile: str, log: str, root: str, command: str, url: str, timeout: float, grace: float
) -> dict:
    """stop, then up; but first make sure the start can happen (current runnable, room for the
    pidfile), so a restart that could not start the service never stops it."""
    try:
        startable(root)
        read_env(os.path.join(root, "current", "service.env"))
        tmp = reserve(pidfile)
    except NotStartable as exc:
        reason = f"{exc}; the service was not stopped"
        return {"start": {"started": False, "reason": reason, "blocked_by": "host"}}
    stopped = do_stop(pidfile, grace)
    doc = do_up(pidfile, log, root, command, url, timeout, reserved=tmp)
    doc["stop"] = stopped
    return doc


def main(argv: list[str]) -> dict:
    action, args = argv[0], argv[1:]
    if action == "status":
        return do_status(args[0], args[1])
    if action == "start":
        return do_start(args[0], args[1], args[2], args[3], args[4])
    if action == "wait":
        return do_wait(args[0], args[1], float(args[2]))
    if action == "up":
        return do_up(args[0], args[1], args[2], args[3], args[4], float(args[5]))
    if action == "stop":
        return do_stop(args[0], float(args[1]))
    if action == "restart":
        return do_restart(*args[:5], float(args[5]), float(args[6]))
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    try:
        result = main(sys.argv[1:])
    except OSError as exc:  # the host's own trouble (a full or read-only disk): one line
        where = f" ({exc.filename})" if exc.filename else ""
        result = {"error": f"{exc.strerror or exc}{where}"}
    print(json.dumps(result))
