"""The control plane's side of a host's releases: run `ops.hostside.releases` actions there, and the
revert guard that puts the host back when ops goes away between a switch and its proof."""

from __future__ import annotations

import posixpath
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ops.errors import HostError, HostSideBug, OpsError, took_signal
from ops.hosts.inventory import Target
from ops.hosts.remote import INTERRUPT_SIGNALS, Host, shell_path
from ops.hostside import source
from ops.hostside.release_files import edited_by_hand
from ops.service.managers import PROCMAN_SOURCE, ProcessManager, logfile, pidfile

DEPLOY_HOST_SOURCE = source("releases")


HOST_SIDE_S = 300  # what one host-side action may take (a prune of big releases included)
# what asking a host where it is may take after Ctrl-C: the user wants out, and a listing takes
# a second (probe37bf M1's hung python held an interrupted deploy 5 more minutes)
ASK_AFTER_INTERRUPT_S = 30


def host_json(
    host: Host,
    src: str,
    args: list[str],
    step: str,
    stdin: bytes | None = None,
    timeout: float = HOST_SIDE_S,
) -> tuple[dict, int]:
    """Run a stdlib-only host-side module (`src`, its source text) with `args`; its result
    (the last line of stdout, one JSON document) and exit status."""
    res = host.run(
        # -S: the host side is stdlib only, so no site-packages scan at each call
        [host.target.python, "-S", "-c", src, *args],
        stdin=stdin,
        warn=True,
        timeout=timeout,
        step=step,
    )
    if res.rc < 0 or res.rc > 128:  # a signal ended it (or the shell around it): its result,
        # even one printed whole, may not be what the host ended on (a switch that printed it
        # was made, then read as refused): lost, and the host is asked again where it matters
        how = {-1: "the link lost"}.get(res.rc, f"killed: exit {res.rc}")
        raise HostError(
            f"its result was lost ({how}): {res.tail() or 'no output'}",
            target=host.name,
            step=step,
        )
    doc = res.last_json()
    if doc is None and res.timed_out:  # (probe37be M3: said as "no result (exit 124)")
        raise HostError(
            f"{host.target.python} did not finish in {timeout:g} s and was stopped (does the "
            "host's python hang? the target's `python` names it)",
            target=host.name,
            step=step,
        )
    if doc is None:
        if "Traceback (most recent call last)" in res.stderr:  # ours raised: one line, exit 4
            last = res.stderr.strip().splitlines()[-1][:300]
            raise HostSideBug(
                f"internal error in ops's host side: {last} (a bug in ops: please report it)",
                target=host.name,
                step=step,
            )
        raise HostError(
            f"no result (exit {res.rc}): {res.tail() or res.tail('stdout') or 'no output'}",
            target=host.name,
            step=step,
        )
    return (doc if isinstance(doc, dict) else {"error": "the result is not an object"}), res.rc


def host_releases(
    host: Host,
    action: str,
    *args: str,
    stdin: bytes | None = None,
    timeout: float = HOST_SIDE_S,
) -> dict:
    """Run one action of `ops.hostside.releases` on the host; a refusal is an OpsError."""
    argv = [action, host.target.remote_root, *args]
    doc, rc = host_json(host, DEPLOY_HOST_SOURCE, argv, f"releases {action}", stdin, timeout)
    if rc != 0:
        why = str(doc.get("error", "refused"))
        raise OpsError(f"{host.name}: {action}: {why}{disk_fix(why, host.target.remote_root)}")
    return doc


DISK_FIXES = {
    "No space left on device": (
        "free space under {root}: ops releases lists the releases it keeps and their sizes; "
        "logs/ holds the service's log, up to 64 MiB and one rotated file"
    ),
    "Disk quota exceeded": "free space under {root} or raise the quota",
    "Read-only file system": "make {root} writable again, or point remote_root elsewhere",
}


def edited_since_installed(listing: dict, rid: str | None) -> str | None:
    """What of release `rid` was changed by hand since it was installed, as the host's
    listing says (its files, its service.env); None: nothing, or no such release."""
    rel = next((r for r in listing.get("releases") or [] if r.get("id") == rid), None)
    if rel is None:
        return None
    said = list(rel.get("code_edited") or []) + (["service.env"] if rel.get("env_edited") else [])
    if not said:
        return None
    return edited_by_hand(f"{rid}'s", said)


def disk_fix(why: str, root: str) -> str:
    """The fix for a host step failed by its disk (full, over quota, read-only), said after its
    reason; "" for any other failure."""
    fix = next((f for err, f in DISK_FIXES.items() if err in why), None)
    return f" ({fix.format(root=root)})" if fix else ""


def current_unstartable(host: Host) -> str | None:
    """Why the release `current` names could not be started again (its service.env missing,
    not a regular file, too big: what the process manager refuses), None when it could: a
    deploy over it could only revert to a service that does not start."""
    doc, _ = host_json(host, PROCMAN_SOURCE, ["startable", host.target.remote_root], "current")
    reason = doc.get("reason", doc.get("error"))
    return str(reason) if reason else None


def stopped_guards(host: Host, wait_s: float = 3.0) -> list[int] | None:
    """The pids of revert guards stopped (SIGSTOP, a debugger) on the host after a settled one
    did not end when let go; [] once none is (the one let go was killed: over SSH its end may
    take a moment), None where the host did not answer."""
    end = time.monotonic() + wait_s
    while True:
        try:
            doc, _ = host_json(
                host, PROCMAN_SOURCE, ["stopped-guard", host.target.remote_root], "guard"
            )
        except HostError:
            return None
        pids = [p for p in doc.get("pids") or [] if isinstance(p, int)]
        if not pids or time.monotonic() >= end:
            return pids
        time.sleep(0.3)


def restart_script(target: Target) -> str:
    """What the guard runs on the host to restart the service after reverting `current`."""
    svc = target.service
    if svc.manager == "systemd":
        return f"sudo -n systemctl restart {shlex.quote(svc.name)}"
    py, src = shlex.quote(target.python), shlex.quote(PROCMAN_SOURCE)
    pf, log = shell_path(pidfile(target)), shell_path(logfile(target))
    cmd = shlex.quote(ProcessManager.render_command(target))
    # restart, not stop then start: it stops nothing when the start could not happen
    return (
        f"{py} -S -c {src} restart {pf} {log} {shell_path(target.remote_root)} {cmd} "
        f"{shlex.quote(svc.url)} 0 {svc.stop_timeout:g} guard"  # (none if it runs current)
    )


def guard_log(target: Target) -> str:
    """Where the guard says what it did once ops was gone (the revert, the restart's result)."""
    return f"{target.remote_root}/logs/guard.log"


def _append_to(log: str) -> str:
    """A shell pipeline's end that appends its input to `log` where it can, and reads the input
    to its end either way: the writer before it (the guard's restart) never meets a closed
    pipe. dd opens the log without blocking and without following a link: a FIFO there with no
    reader hung tee's open for good, and with it the guard and every later deploy (probe37o
    O2); a link would send the lines to whatever file it names, and so would a link at the
    log's directory (probe37v V5: written outside the root), which is never written through. A
    full or read-only logs/, or a dd without these flags: no log, nothing else changes."""
    where = shell_path(posixpath.dirname(log))
    return (
        f"{{ [ -h {where} ] || dd of={shell_path(log)} oflag=append,nofollow,nonblock "
        "conv=notrunc status=none; cat; } >/dev/null 2>&1"
    )


@contextmanager
def interrupts_held() -> Iterator[None]:
    """While the guard puts the host back, a further Ctrl-C (or SIGTERM, SIGHUP, SIGQUIT) is
    ignored: it would cut the wait for the guard, and the result would name a host half put
    back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = _handlers()
    for sig in old:
        signal.signal(sig, lambda *_: None)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


_taking: list[list[int]] = []  # the signals the outermost interrupted_once took, while it lives


@contextmanager
def interrupted_once() -> Iterator[list[int]]:
    """The first Ctrl-C (or SIGTERM) interrupts as usual; every later one is ignored until the
    process ends, so the interrupted deploy still puts the host back, asks where it was left
    and writes its record (an impatient second Ctrl-C used to cost the record its steps).
    Without an interrupt, the handlers before are restored. Yields the list of the signals
    taken (empty: none yet). Nested (a fleet's rollout around a host's rollback), the outer
    one keeps taking the signals and the inner yields its list: one Ctrl-C for the whole."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    if _taking:
        outer = _taking[0]
        try:
            yield outer
        except KeyboardInterrupt:
            outer.append(0)
            _ignore_interrupts()
            raise
        return
    old = _handlers()
    seen: list[int] = []

    def first_only(signum: int, _frame: object) -> None:
        if not seen:
            seen.append(signum)
            _ignore_interrupts()
            if signum != signal.SIGINT:  # said by its name, not as a Ctrl-C
                took_signal(signal.Signals(signum).name)
            raise KeyboardInterrupt

    for sig in old:
        signal.signal(sig, first_only)
    _taking.append(seen)
    try:
        yield seen
    except KeyboardInterrupt:
        seen.append(0)  # an interrupt from anywhere: from now on, none is taken
        _ignore_interrupts()
        raise
    finally:
        _taking.remove(seen)
        if not seen:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def _handlers() -> dict[int, Any]:
    """The handlers of the interrupt signals to replace: a SIGHUP or SIGQUIT ignored (`nohup`)
    stays ignored."""
    old = {sig: signal.getsignal(sig) for sig in INTERRUPT_SIGNALS}
    return {
        sig: h
        for sig, h in old.items()
        if sig in (signal.SIGINT, signal.SIGTERM) or h is not signal.SIG_IGN
    }


def _ignore_interrupts() -> None:
    """SIG_IGN, not a Python handler: it outlives the interpreter's finalization."""
    for sig in INTERRUPT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@dataclass
class Guard:
    """The revert guard a switch runs under; `settled` once its switch was made final (there is
    nothing left for it to put back)."""

    settled: bool = False
    lingered: bool = False  # settled, but it did not end when let go (stopped?): said
    ended: bool = False  # not settled, and it did not end in its wait: ended (stopped?)
    said: Callable[[str], None] | None = None  # a progress line, before a wait for it


# A settled guard ends as soon as ops lets it go; one that does not (stopped: SIGSTOP, a
# debugger) is not waited for long: it holds nothing a deploy needs (probe37l L4: a proven
# deploy waited 122 s in silence). The next deploy names a guard still stopped, with kill -CONT.
SETTLED_GUARD_WAIT_S = 10.0


def guard_script(t: Target, restart: bool) -> str:
    """The revert guard's shell script (`revert_guard`). It carries both host-side scripts, so it
    is the longest command ops sends: over SSH a whole command is one argument of the remote
    shell, which the kernel caps at 128 KiB (MAX_ARG_STRLEN)."""
    revert = shlex.join([t.python, "-S", "-c", DEPLOY_HOST_SOURCE, "revert", t.remote_root])
    again = restart_script(t) if restart else "true"
    # the guard holds deploy.guard for its whole life: the next deploy (or rollback) waits
    # for it in `prepare`, so a guard still putting the host back is never raced
    # and, once ops is gone, it takes deploy.switch (kept until it exits) before it reverts:
    # a pending switch still on its way checks for a live guard under that lock, so it either
    # lands first (and is reverted here) or finds no guard and switches nothing
    root = shell_path(t.remote_root)
    return (
        f"exec 8>>{root}/deploy.guard && flock 8 || exit 1; "
        'echo "READY $$"; cat >/dev/null; '
        f"exec 9>>{root}/deploy.switch && flock 9; "
        f"if {revert} | grep -q '\"reverted\": true'; then "
        # what it did, for the operator who finds the host put back: appended to guard.log
        f"{{ date -u '+%Y-%m-%dT%H:%M:%SZ ops went away before its switch was proven: current was "
        f"switched back; the restart said:'; {again}; echo; }} 2>&1 "  # (an entry ends a line)
        f"| {_append_to(guard_log(t))}; echo REVERTED; fi"
    )


@contextmanager
def revert_guard(host: Host, restart: bool) -> Iterator[Guard]:
    """A host process that, when ops goes away with `deploy.pending` still there, switches
    `current` back (and restarts the service): the host never stays on an unproven release."""
    proc = host._spawn(guard_script(host.target, restart))
    said = proc.read_line(30) or ""
    proc.on_host = said.removeprefix("READY ")
    if not said.startswith("READY"):
        proc.finish(5)
        raise HostError("the revert guard did not start", target=host.name, step="guard")
    guard = Guard()
    try:
        yield guard
    finally:
        with interrupts_held():
            wait = host.target.service.stop_timeout + 120
            if not guard.settled and guard.said:  # (probe37be M2: 2 minutes in silence)
                guard.said(f"guard: up to {wait:g} s for the host's guard to put the host back")
            t0 = time.monotonic()
            proc.finish(SETTLED_GUARD_WAIT_S if guard.settled else wait)
            if proc.lost():  # its link lost, its session on the host maybe not (frozen): it
                # is let go from a new link and waited for there (probe37bn M1: 2 minutes of
                # waiting for a guard that could not act, then "current unknown")
                done = host.let_go(
                    proc,
                    f"{host.target.remote_root}/deploy.guard",
                    wait_s=0 if guard.settled else wait - (time.monotonic() - t0),
                    step="guard",
                )
                guard.ended = not guard.settled and done is False
            else:
                took = time.monotonic() - t0
                guard.lingered = guard.settled and took >= SETTLED_GUARD_WAIT_S - 0.5
                guard.ended = not guard.settled and took >= wait - 0.5
