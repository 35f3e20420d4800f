"""LocalHost: the two Host primitives as subprocesses of ops (the target `local`).

`_exec` keeps the command's stdin open until it exits and closes it when giving up (deadline,
Ctrl-C): the watcher that `Host.run` puts around every command then kills the command's whole
session (`ops.hosts.remote`). Should the watcher itself not end within a few seconds (or a second
Ctrl-C arrive meanwhile), ops kills what is left from here: the watcher's process group and
every session one of its children leads.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import subprocess
import time
from pathlib import Path

from ops.hosts.remote import (
    FLOOD_RC,
    LAST_LOOK_S,
    LINE_MAX,
    STDERR_MAX,
    STDOUT_MAX,
    STOPPED_S,
    STOPPED_SAID,
    TIMEOUT_RC,
    Capped,
    Host,
    Proc,
    SignalsHeld,
    split_line,
)

ABORT_WAIT_S = 5.0  # the watcher's own TERM-then-KILL sweep takes about 2 s
CHUNK = 65536


class _LocalProc(Proc):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._p = popen
        self._buf = b""

    def read_line(self, timeout: float) -> str | None:
        assert self._p.stdout is not None
        fd = self._p.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self._buf and len(self._buf) < LINE_MAX:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self._buf += chunk
        if not self._buf:
            return None
        line, self._buf = split_line(self._buf)
        return line

    def exited(self) -> bool:
        return self._p.poll() is not None

    def finish(self, timeout: float) -> int:
        if self._p.stdin:
            with contextlib.suppress(OSError):
                self._p.stdin.close()
        try:
            return self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            self._p.kill()
            return self._p.wait()
        finally:
            if self._p.stdout:
                self._p.stdout.close()


def _stat(pid: str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def under_stopped_watcher(watcher: int) -> tuple[int | None, list[str]]:
    """What a stopped watcher's command is: (its exit status once it has ended, or None; its
    live processes where every one of them is stopped too, or []); (None, []) while the
    watcher runs. /proc is read once for both.

    A watcher stopped (SIGSTOP, a debugger) can neither reap its command nor exit, and it holds
    the command's stdout: ops waited for it to the command's deadline, minutes, in silence
    (probe37w W2: a restart done in 3 s reported after 326). The command, a zombie the watcher
    cannot reap, still says how it ended: its /proc stat's exit_code (Linux 3.5+), the wait
    status, read as subprocess reads one. A pattern their command lines share can stop the
    command with its watcher, whose own stop watch stops with it (probe37bk M1): `_exec` ends
    them."""
    st = _stat(str(watcher))
    if st is None or st[0] not in ("T", "t"):
        return None, []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None, []
    stats = {p: s for p in pids if (s := _stat(p)) is not None}
    # the watcher's child that leads its own session: the command
    job = next((p for p, s in stats.items() if s[1] == str(watcher) and s[3] == p), None)
    if job is None:
        return None, []
    lead = stats[job]
    if lead[0] == "Z":
        if len(lead) < 50 or not lead[49].lstrip("-").isdigit():
            return None, []
        status = int(lead[49])
        return (-(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF), []
    live = [p for p, s in stats.items() if s[3] == job and s[0] != "Z"]
    return None, (live if live and all(stats[p][0] in ("T", "t") for p in live) else [])


def kill_sessions(root: int) -> None:
    """KILL the process group of `root` and every session led by one of its children."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    stats = {p: st for p in pids if (st := _stat(p)) is not None}  # before any parent dies
    leaders = {p for p, st in stats.items() if st[1] == str(root) and st[3] == p}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)
    for p, st in stats.items():
        if st[3] in leaders and st[0] != "Z":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(p), signal.SIGKILL)


class Flooded(Exception):
    """The command's stdout ran past twice STDOUT_MAX (`Capped.flooded`)."""


class Frozen(Exception):
    """The command and its watcher stayed stopped (`under_stopped_watcher`)."""


def _abort(proc: subprocess.Popen[bytes]) -> None:
    """Close the command's stdin (its watcher kills it); kill from here if that is not enough."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(ABORT_WAIT_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        kill_sessions(proc.pid)
        proc.wait()


class LocalHost(Host):
    """This machine: commands are bash subprocesses of ops."""

    def _exec(
        self, command: str, *, stdin: bytes | None, deadline_s: float
    ) -> tuple[int, Capped, Capped]:
        held = SignalsHeld()  # a Ctrl-C now is delivered inside the try below
        try:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except BaseException:
            held.release()
            raise
        assert proc.stdin and proc.stdout and proc.stderr
        in_fd, out_fd, err_fd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        chunks = {out_fd: Capped(STDOUT_MAX), err_fd: Capped(STDERR_MAX)}
        data, sent = memoryview(stdin or b""), 0
        end = time.monotonic() + deadline_s
        sel = selectors.DefaultSelector()
        try:
            held.release()
            sel.register(out_fd, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            if data:
                os.set_blocking(in_fd, False)
                sel.register(in_fd, selectors.EVENT_WRITE)
            reading, last_look, done, frozen_at = 2, False, None, None
            while reading:
                done, frozen = under_stopped_watcher(proc.pid)
                if done is not None:
                    break
                if frozen:
                    frozen_at = frozen_at or time.monotonic()
                    if time.monotonic() - frozen_at > STOPPED_S:
                        raise Frozen(frozen)
                else:
                    frozen_at = None
                left = end - time.monotonic()
                if left <= 0 and last_look:
                    raise subprocess.TimeoutExpired(command, deadline_s)
                if left <= 0:
                    last_look, end = True, time.monotonic() + LAST_LOOK_S
                    left = LAST_LOOK_S
                for key, _ in sel.select(min(left, 1.0)):
                    if key.fd == in_fd:
                        try:
                            sent += os.write(in_fd, data[sent : sent + CHUNK])
                        except BrokenPipeError:
                            sent = len(data)
                        if sent >= len(data):
                            sel.unregister(in_fd)  # all sent; stdin stays open: our lifeline
                    elif block := os.read(key.fd, CHUNK):
                        chunks[key.fd].add(block)
                        if chunks[out_fd].flooded:
                            raise Flooded
                    else:
                        sel.unregister(key.fd)
                        reading -= 1
            if done is not None:  # what the command wrote is in the pipes: taken, then it ends
                for fd in (out_fd, err_fd):
                    os.set_blocking(fd, False)
                    with contextlib.suppress(BlockingIOError):
                        while block := os.read(fd, CHUNK):
                            chunks[fd].add(block)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the watcher and its sweeper
                proc.wait()
                return done, chunks[out_fd], chunks[err_fd]
            rc = proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _abort(proc)
            rc = TIMEOUT_RC
        except Flooded:
            _abort(proc)
            rc = FLOOD_RC
            chunks[err_fd].add(chunks[out_fd].flood_said())
        except Frozen as exc:
            kill_sessions(proc.pid)  # the watcher, its own watches and the command: all stopped
            proc.wait()
            rc = -signal.SIGKILL
            said = f"\nops: every process of the command (pid {' '.join(exc.args[0])}) and its "
            said += f"watcher {STOPPED_SAID} {STOPPED_S} s, holding it: ended (kill -9)\n"
            chunks[err_fd].add(said.encode())
        except BaseException:  # Ctrl-C or a bug: the command must not outlive us
            _abort(proc)
            raise
        finally:
            sel.close()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    f.close()
        return rc, chunks[out_fd], chunks[err_fd]

    def _spawn(self, command: str) -> Proc:
        popen = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return _LocalProc(popen)
