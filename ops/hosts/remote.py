"""Host: run commands and data-plane modules on a target, send directory trees, hold the host lock.

One interface for every target. `LocalHost` (`ops.hosts.local`, the target `local`) and `SshHost`
(`ops.hosts.ssh`, every other target) differ only in two primitives: `_exec` (run a shell command
line with optional stdin bytes and a deadline) and `_spawn` (start a long-lived command whose
stdin we hold open).
Everything else (quoting, timeouts, module JSON, tree transfer, locking) is written once here.

Commands are argv lists joined with `shlex.join`, so no user input reaches a shell unquoted.
Each command is wrapped in coreutils `timeout` on the host, so a timed-out command is killed
there too, not only abandoned by us.

Nothing outlives us on the host (Ctrl-C, a killed ops, a lost connection). `run` starts every
command under a small bash watcher (`WATCH`): the command runs in a session of its own
(`setsid`) and gets, as its stdin, exactly the first N bytes of the watcher's stdin (N = the
length of the data we send, usually 0), then EOF. After that the watcher keeps reading its
stdin, which we hold open until the command has exited. If that stdin reaches EOF first (we
closed it on Ctrl-C or a deadline, ops died, or the SSH channel or connection went away:
without a pty sshd sends no signal, but it does close the session's pipes), the watcher sends
TERM to every process of the command's session, and KILL to what is left 2 s later. Processes
that left the session on purpose (a service started detached with `setsid`) are not touched.
A command whose every process stays stopped (SIGSTOP, a debugger) for STOPPED_S is ended the
same way (KILL), and the watcher says so on the command's stderr.
Both primitives honour this: `_exec` sends the data, keeps stdin open, and closes it only
when the command is done or when it gives up (deadline, KeyboardInterrupt, lost connection).
The sweep reads `/proc`, so it works on Linux hosts (every target this project serves).
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import re
import shlex
import signal
import socket
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ops.errors import (
    CommandFailed,
    CommandTimedOut,
    HostError,
    LockHeld,
    ModuleLinkLost,
    ModuleOutputError,
    OpsError,
)
from ops.hosts.inventory import Target

TIMEOUT_RC = 124  # what coreutils `timeout` returns when it had to stop the command
# A command whose stdout runs past twice STDOUT_MAX is a flood (a host `python` that is `yes`,
# a runaway print): ended there, not read until its deadline, minutes later (probe37bj L2),
# with this exit code and FLOODED_SAID on its stderr
FLOOD_RC = 141
FLOODED_SAID = "ops: the command printed more than {mib} MiB and was ended there (a flood)"
# Once a command's deadline has passed, one more second to take what it already sent: ops
# itself may have been stopped (SIGSTOP, Ctrl-Z, a suspended laptop) past the deadline while
# the command ended on time (probe37o O4: a post-flight's status, answered, read as timed out)
LAST_LOOK_S = 1.0
KILL_GRACE_S = 5  # SIGTERM first, SIGKILL this much later
# A command still running says so this often (and twice before its bound), where the caller
# listens (`Host.on_wait`): no wait on the host is silent past a minute (probe37bf M1);
# OPS_HEARTBEAT_S sets another period (a CI log that wants a line more often)
HEARTBEAT_S = 60.0
TREE_EXCLUDE = {"__pycache__", ".git", ".pytest_cache", ".ruff_cache", "runs", ".whl", ".gl"}
# The signals ops takes as Ctrl-C: SIGTERM (a CI timeout, `kill`), SIGHUP (the operator's
# terminal or SSH session dropped) and SIGQUIT too (probe37c C5), so a deploy's record is
# finished and its guard's work waited for whichever of them stops it.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# The oldest host Python the data plane (checks.*, ops.hostside) runs on (docs/inventory.md);
# ops itself, on the operator's machine, needs pyproject's requires-python.
HOST_PYTHON_MIN = (3, 10)
# Parsed and run alike by Python 2.6+ and 3.x: a host python too old for the data plane still
# says what it is (probe37c C6).
PY_VERSION = "import sys; sys.stdout.write('%d.%d.%d' % tuple(sys.version_info[:3]))"
LOCK_NOTE_WAIT_S = 2.0  # how long a second holder waits for the holder's note to appear
# What ops keeps of one host command's output (probe37c C1: a service log line of a GiB read
# whole made ops grow to 23 GB). The largest real stdout is a data-plane JSON document of a few
# MB; past the bound the head and the tail are kept around a line that says how much was cut.
STDOUT_MAX = 64 << 20
STDERR_MAX = 1 << 20
LINE_MAX = 1 << 20  # one line read from a long-lived command (the lock's, the guard's)

# A command whose every live process stays stopped this long (a SIGSTOP of its process group or
# by pattern, a debugger holding each) is ended by its watcher, which says so on its stderr:
# nothing of it runs, and it held ops, and often the host lock, until its deadline, minutes,
# saying only that it still ran (probe37bi M1: 375 s for a restart; the process manager's own
# watch had ended the one process it watches, the stopped `timeout` and shell held the rest)
STOPPED_S = 5
STOPPED_SAID = "stayed stopped (SIGSTOP or a debugger) for"
# The watcher (see the module docstring). $1: bytes of our stdin that are the command's stdin;
# $2: the command line; $3: STOPPED_S. The sweep signals every live process whose session is
# the command's. The coprocess waits for one byte ("g") before it runs the command: bash unsets
# OPSJOB_PID and OPSJOB once the coprocess has ended, so one that could end first would lose
# them (probe37h M1). The stop watch (`frozen`) reads the states of the same session's
# processes once a second.
WATCH = r"""n=$1 stop_s=$3
exec 3<&0 5>&1 6>&2 7>&2
coproc OPSJOB { IFS= read -r -N 1 _; exec setsid bash -c "$2" 1>&5 2>&6 3<&- 5>&- 6>&- 7>&-; }
job=$OPSJOB_PID w=${OPSJOB[1]} r=${OPSJOB[0]}
exec {r}<&- 5>&- 6>&- 2>/dev/null
printf g >&"$w"
[ "$n" -gt 0 ] && head -c "$n" <&3 >&"$w"
exec {w}>&-
sweep() {
  local p l m=0
  for p in /proc/[0-9]*; do
    { read -r l <"$p/stat"; } 2>/dev/null || continue
    l=${l##*) }; set -- $l
    [ "$4" = "$job" ] && [ "$1" != Z ] || continue
    kill -s "$sig" "${p#/proc/}" 2>/dev/null && m=$((m + 1))
  done
  [ "$m" -gt 0 ]
}
{
  while read -r -u 3 -N 65536 _; do :; done
  trap '' TERM  # the sweep runs to its end even if the command dies (and we are told) first
  sig=TERM; sweep || exit 0
  sig=0; for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    sleep 0.1; sweep || exit 0
  done
  sig=KILL; sweep
} >/dev/null 2>&1 7>&- &
reader=$!
exec 3<&-
{
  k=0
  while sleep 1 7>&-; do
    { read -r l <"/proc/$job/stat"; } 2>/dev/null || exit 0
    l=${l##*) }; set -- $l
    case "$1" in T|t) ;; *) k=0; continue;; esac  # its leader runs: no scan (a big host's
    all= live=  # /proc, read in bash, costs a tenth of a second)
    for p in /proc/[0-9]*; do
      { read -r l <"$p/stat"; } 2>/dev/null || continue
      l=${l##*) }; set -- $l
      [ "$4" = "$job" ] && [ "$1" != Z ] || continue
      live="$live ${p#/proc/}"; case "$1" in T|t) ;; *) all=no;; esac
    done
    [ -n "$live" ] || exit 0
    [ -z "$all" ] && k=$((k + 1)) || k=0
    if [ "$k" -gt "$stop_s" ]; then  # (k samples in a row span k - 1 seconds at least)
      printf '\n%s\n' "ops-watch: every process of the command on the host (pid$live) \
STOPPED_SAID $stop_s s, holding it: ended (kill -9)" >&7
      trap '' TERM  # its first kill ends the wait below, which ends this loop: sweep to the end
      sig=KILL; sweep; exit 0
    fi
  done
} >/dev/null 2>&1 &
frozen=$!
exec 7>&-
wait "$job"; rc=$?
kill "$reader" "$frozen"
exit "$rc"
""".replace("STOPPED_SAID", STOPPED_SAID)


class Capped:
    """A stream's bytes up to `limit`: past it, the first and the last `limit // 2` bytes are
    kept and the rest counted (`cut`), never held."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, block: bytes) -> None:
        self.total += len(block)
        half = self.limit // 2
        if len(self.head) < half:
            room = half - len(self.head)
            self.head += block[:room]
            block = block[room:]
        if block:
            self.tail += block
            if len(self.tail) > 2 * half:  # trim now and then, not at every block
                del self.tail[: len(self.tail) - half]

    @property
    def flooded(self) -> bool:
        """Past twice its limit: no output ops reads is that long (see FLOOD_RC)."""
        return self.total > 2 * self.limit

    def flood_said(self) -> bytes:
        return ("\n" + FLOODED_SAID.format(mib=2 * self.limit >> 20) + "\n").encode()

    @property
    def cut(self) -> int:
        """Bytes dropped (0: all of it is kept)."""
        return 0 if self.total <= self.limit else self.total - len(self.head) - self._kept_tail

    @property
    def _kept_tail(self) -> int:
        return min(len(self.tail), self.limit // 2)

    def value(self) -> bytes:
        if self.total <= self.limit:
            return bytes(self.head + self.tail)
        note = f"\n[... ops cut {self.cut} bytes of {self.total} here ...]\n".encode()
        return bytes(self.head) + note + bytes(self.tail[-self._kept_tail :])


def python_version(text: str) -> tuple[int, ...] | None:
    """(3, 8, 18) from `3.8.18` or `Python 3.8.18`; None when it is no version."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def too_old(version: tuple[int, ...] | None) -> bool:
    return version is not None and version[:2] < HOST_PYTHON_MIN


def split_line(buf: bytes) -> tuple[str, bytes]:
    """The first line of `buf` (at most LINE_MAX bytes: a longer one is cut there) and the rest."""
    end = buf.find(b"\n", 0, LINE_MAX)
    line, rest = (buf[:LINE_MAX], buf[LINE_MAX:]) if end < 0 else (buf[:end], buf[end + 1 :])
    return line.decode("utf-8", "replace"), rest


def watched(command: str, stdin_len: int = 0) -> str:
    """`command` under the watcher: it dies on the host when its caller goes away."""
    return (
        f"bash -c {shlex.quote(WATCH)} ops-watch {int(stdin_len)} {shlex.quote(command)} "
        f"{STOPPED_S}"
    )


@dataclass(frozen=True)
class Result:
    """What one command did: exit code, output, timing, and the host it ran on."""

    host: str
    command: str
    rc: int
    stdout: str
    stderr: str
    start: str
    duration_s: float
    timed_out: bool = False
    stdout_cut: int = 0  # bytes of the output ops dropped (past STDOUT_MAX / STDERR_MAX)
    stderr_cut: int = 0

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    @property
    def failed(self) -> bool:
        return not self.ok

    def __bool__(self) -> bool:
        return self.ok

    def tail(self, stream: str = "stderr", n: int = 10) -> str:
        text = self.stderr if stream == "stderr" else self.stdout
        return "\n".join(text.rstrip("\n").splitlines()[-n:])

    def last_json(self, said: Callable[[str], str] = lambda line: line) -> Any:
        """The JSON document on stdout's last line: `last_json`."""
        return last_json(self.stdout, said)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModuleResult:
    """A data-plane module's JSON document and exit code (0 pass, 1 fail, 2 bad input)."""

    module: str
    rc: int
    data: dict[str, Any]
    result: Result = field(repr=False)


def last_json(text: str, said: Callable[[str], str] = lambda line: line) -> Any:
    """The JSON document on the last line of `text` (`said` applied to the line first), as the
    host-side scripts and data-plane commands print their result; None where there is none or
    it does not parse (an integer too long to convert is a ValueError too: probe37az M2)."""
    lines = text.strip().splitlines()
    try:
        return json.loads(said(lines[-1])) if lines else None
    except ValueError:
        return None


def shell_path(path: str) -> str:
    """A path as a shell word; a leading `~/` expands on the host, the rest stays quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class SignalsHeld:
    """Ctrl-C and SIGTERM (SIGHUP, SIGQUIT: INTERRUPT_SIGNALS) held while a host command
    starts, delivered by `release()`.

    Between the moment a command exists (the fork, the SSH channel's exec) and the moment its
    caller is inside the `try` that closes its stdin on an interrupt, a Ctrl-C would leave the
    command running unwatched: a `switch` could then finish after the revert guard had put the
    host back. So the caller starts the command under `SignalsHeld()`, enters its `try`, and
    calls `release()` there first: a signal that came meanwhile is delivered at that line, with
    the handler that was in place. Only the main thread can hold signals; elsewhere (and for a
    signal already ignored) this does nothing.
    """

    SIGNALS = INTERRUPT_SIGNALS

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}
        self._pending: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.SIGNALS:
            handler = signal.getsignal(sig)
            if handler in (signal.SIG_IGN, None):
                continue
            self._old[sig] = handler
            signal.signal(sig, self._hold)

    def _hold(self, signum: int, _frame: object) -> None:
        self._pending.append(signum)

    def release(self) -> None:
        """Restore the handlers, then deliver what was held (once each, in arrival order)."""
        old, self._old = self._old, {}
        for sig, handler in old.items():
            signal.signal(sig, handler)
        pending, self._pending = list(dict.fromkeys(self._pending)), []
        for sig in pending:
            handler = old[sig]
            if callable(handler):
                handler(sig, None)
            else:
                signal.raise_signal(sig)


class Proc(ABC):
    """A long-lived command on a host whose stdin we hold open (the lock holder)."""

    on_host = ""  # its shell's pid on the host, where it said it (the lock holder, the guard)

    @abstractmethod
    def read_line(self, timeout: float) -> str | None:
        """The next stdout line without its newline; None at EOF or after `timeout` seconds."""

    @abstractmethod
    def finish(self, timeout: float) -> int:
        """Close stdin, wait for exit, return the exit code (killing it past `timeout`)."""

    @abstractmethod
    def exited(self) -> bool:
        """Whether the command has ended (for one that should live as long as we hold it)."""

    def lost(self) -> bool:
        """Whether its link was lost before its end was told (it may live on the host)."""
        return False


class Host(ABC):
    """A target ops can act on. Use as a context manager so connections are closed."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.name = target.name
        self._pythons: dict[str, str | None] = {}  # python -> why it cannot run the data plane
        self._lock_procs: list[Proc] = []  # the holders of host locks held now (`lock`)
        # told (what, seconds so far, its bound) while a command runs long (`HEARTBEAT_S`)
        self.on_wait: Callable[[str, float, float], None] | None = None

    # -- primitives: the only parts that differ between local and SSH --------------------
    @abstractmethod
    def _exec(
        self, command: str, *, stdin: bytes | None, deadline_s: float
    ) -> tuple[int, Capped, Capped]:
        """Run `command` with bash on the host: (rc, stdout, stderr), TIMEOUT_RC past deadline,
        FLOOD_RC once its stdout is `flooded` (the command ended there, said on its stderr);
        the output is kept as `Capped` (STDOUT_MAX, STDERR_MAX): never more than that in ops.

        Send `stdin`, then keep the command's stdin open until it has exited; close it (which
        makes a `watched` command die on the host) when giving up: past the deadline, on
        KeyboardInterrupt or any other exception, or when the connection is lost.
        """

    @abstractmethod
    def _spawn(self, command: str) -> Proc:
        """Start `command` with bash on the host, stdin a pipe we hold, stdout readable."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; a no-op for hosts that hold none."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- everything else is written once ------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        warn: bool = False,
        step: str = "run",
    ) -> Result:
        """Run argv on the host; raise CommandFailed/CommandTimedOut unless `warn`."""
        if not argv:
            raise ValueError("empty command")
        inner = shlex.join(argv)
        parts = []
        if cwd:
            parts.append(f"cd {shell_path(cwd)} &&")
        if env:
            parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
        parts.append(f"timeout -k {KILL_GRACE_S} {max(1, int(timeout + 0.999))} {inner}")
        command = " ".join(parts)
        start, t0 = _now(), time.monotonic()
        with self._beating(step, timeout):
            rc, out, err = self._exec(
                watched(command, len(stdin or b"")),
                stdin=stdin,
                deadline_s=timeout + KILL_GRACE_S + 10,
            )
        duration = time.monotonic() - t0
        timed_out = rc == TIMEOUT_RC and duration >= timeout * 0.98
        result = Result(
            host=self.name,
            command=inner,
            rc=rc,
            stdout=out.value().decode("utf-8", "replace"),
            stderr=err.value().decode("utf-8", "replace"),
            start=start,
            duration_s=round(duration, 4),
            timed_out=timed_out,
            stdout_cut=out.cut,
            stderr_cut=err.cut,
        )
        if rc not in (0, -1) and not timed_out and self._is_python(argv[0]):  # -1: link lost
            self.check_python(argv[0], step)
        if timed_out and not warn:
            raise CommandTimedOut(
                f"{argv[0]} timed out after {timeout:g}s",
                target=self.name,
                step=step,
                result=result,
            )
        if rc != 0 and not warn:
            detail = result.tail() or result.tail("stdout")
            raise CommandFailed(
                f"{argv[0]} exited {rc}" + (f": {detail}" if detail else ""),
                target=self.name,
                step=step,
                result=result,
            )
        return result

    @contextlib.contextmanager
    def _beating(self, what: str, bound: float) -> Iterator[None]:
        """Tell `on_wait` every HEARTBEAT_S (twice before a shorter bound) that `what` still
        runs: a hung host python held a deploy 5 minutes in silence (probe37bf M1)."""
        told = self.on_wait
        if told is None:
            yield
            return
        done, t0, period = threading.Event(), time.monotonic(), heartbeat_s()

        def beat() -> None:
            while not done.wait(min(period, bound / 2)):
                with contextlib.suppress(Exception):  # a closed console: the command runs on
                    told(what, time.monotonic() - t0, bound)

        threading.Thread(target=beat, name=f"{what}-heartbeat", daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def _is_python(self, program: str) -> bool:
        return program == self.target.python or os.path.basename(program).startswith("python")

    def check_python(self, python: str, step: str = "python") -> None:
        """Raise one line (HostError, exit 2) when `python` on the host is older than the data
        plane needs: a command of ours it ran failed, and its traceback or SyntaxError would
        say nothing of why. Asked once per python and host, with a line any Python parses."""
        if python not in self._pythons:
            self._pythons[python] = None  # asked now: the question itself is not checked again
            res = self.run([python, "-c", PY_VERSION], warn=True, timeout=30, step=step)
            version = python_version(res.stdout) if res.rc == 0 else None
            if too_old(version):
                need = ".".join(map(str, HOST_PYTHON_MIN))
                self._pythons[python] = (
                    f"the host's python {python} is Python {res.stdout.strip()}; ops's data "
                    f"plane needs Python {need} or newer"
                )
        why = self._pythons[python]
        if why:
            need = ".".join(map(str, HOST_PYTHON_MIN))
            raise HostError(
                why,
                target=self.name,
                step=step,
                hint=f"set `python` under [targets.{self.name}] in the inventory to a "
                f"Python {need}+ on the host",
            )

    def let_go(
        self, proc: Proc, path: str, *, wait_s: float = 0.0, step: str = "run"
    ) -> bool | None:
        """Over a new link, end the wait for ops's end of `proc`, a host process of ours that
        holds `path` (the revert guard on deploy.guard, the lock holder on lock), where its
        own link was lost while its session on the host lives on (an sshd session stopped:
        the pipes it waits on never close, probe37bn M1): the `cat` of ops's stdin that its
        shell (`proc.on_host`) runs is ended, as ops's going away ends it. With `wait_s`, its
        shell is waited for up to that long to let go of `path` (its work done). Whether it
        did; None where the host did not answer or `proc` said no pid."""
        if not proc.on_host.isdigit():
            return None
        script = (
            f"f={shell_path(path)}; p0={proc.on_host}; "
            'held() { for d in /proc/"$p0"/fd/*; do [ "$d" -ef "$f" ] && return 0; done; '
            "return 1; }; "
            "held || exit 0; "
            'for d in /proc/[0-9]*/fd/*; do [ "$d" -ef "$f" ] || continue; '
            'p=${d#/proc/}; p=${p%%/*}; s=; read -r s < "/proc/$p/stat" 2>/dev/null || continue; '
            r'set -- ${s##*\) }; [ "$2" = "$p0" ] || continue; '
            'c=; read -r c < "/proc/$p/comm" 2>/dev/null; [ "$c" = cat ] && kill "$p" 2>/dev/null; '
            "done; "
            f"for _ in $(seq {max(0, int(wait_s))}); do held || exit 0; sleep 1; done; ! held"
        )
        try:
            res = self.run_script(script, timeout=wait_s + 30, step=step)
        except OpsError:
            return None
        return res.ok if res.rc in (0, 1) else None

    def run_script(
        self, script: str, *, timeout: float = 60.0, warn: bool = True, step: str = "run"
    ) -> Result:
        """Run a fixed bash script of ours (never user input) on the host."""
        return self.run(["bash", "-c", script], timeout=timeout, warn=warn, step=step)

    def run_module(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        cwd: str,
        python: str | None = None,
        timeout: float = 300.0,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        stdlib_only: bool = False,
    ) -> ModuleResult:
        """Run `python -m module --json args...` in `cwd` on the host and parse its JSON.

        `stdlib_only`: the module imports only the standard library and its own package, so it
        runs as `python -S` (no site-packages scan and no .pth files at each start)."""
        py = python or self.target.python
        step = f"module {module}"
        result = self.run(
            # -B: no bytecode written into the release it runs from (probe37t T3: a full disk
            # cut a .pyc short, and every later import of that module failed, EOFError)
            [py, "-B", *(["-S"] if stdlib_only else []), "-m", module, "--json", *args],
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            warn=True,
            step=step,
        )
        if result.timed_out:
            raise CommandTimedOut(
                f"timed out after {timeout:g}s", target=self.name, step=step, result=result
            )
        if result.stdout_cut:
            raise ModuleOutputError(
                f"printed {result.stdout_cut + STDOUT_MAX} bytes or more "
                + ("(ended there), " if result.rc == FLOOD_RC else f"(exit {result.rc}), ")
                + f"over the {STDOUT_MAX >> 20} MiB ops reads of a module's output; refused",
                target=self.name,
                step=step,
            )
        text = result.stdout.strip()
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # (JSONDecodeError; an integer too long)
            evidence = result.tail() or result.tail("stdout") or "(no output)"
            if result.rc == -1:  # SSH's word for a channel closed with no exit status
                raise ModuleLinkLost(  # the link's trouble, not the module's
                    f"printed no JSON document (exit -1): {evidence}; no exit status came "
                    "back: the connection to the host was lost",
                    target=self.name,
                    step=step,
                ) from None
            raise ModuleOutputError(
                f"printed no JSON document (exit {result.rc}): {evidence}",
                target=self.name,
                step=step,
            ) from None
        if not isinstance(data, dict):
            raise ModuleOutputError(
                f"printed JSON that is not an object (exit {result.rc})",
                target=self.name,
                step=step,
            )
        return ModuleResult(module=module, rc=result.rc, data=data, result=result)

    def put_tree(
        self, local_dir: str | os.PathLike[str], remote_dir: str, *, timeout: float = 300.0
    ) -> Result:
        """Send a directory tree to `remote_dir`: all of it or nothing; never overwrites."""
        src = Path(local_dir)
        if not src.is_dir():
            raise ValueError(f"not a directory: {src}")
        payload = _tar_gz(src)
        dest = shell_path(remote_dir)
        script = (
            f'set -e; dest={dest}; parent=$(dirname "$dest"); mkdir -p "$parent"; '
            'if [ -e "$dest" ]; then echo "refusing to overwrite $dest" >&2; exit 17; fi; '
            'tmp=$(mktemp -d "$parent/.incoming.XXXXXX"); trap \'rm -rf "$tmp"\' EXIT; '
            # tar says each file it could not write (a full disk: one line per file of the
            # release, probe37bc L1): the first said, the rest counted
            'if ! err=$(tar -xzf - -C "$tmp" 2>&1); then '
            'n=$(printf "%s\\n" "$err" | grep -c "Cannot " || true); '
            'printf "%s\\n" "$err" | grep -m1 "Cannot " >&2 || printf "%s\\n" "$err" >&2; '
            'if [ "$n" -gt 1 ]; then echo "tar: and $((n - 1)) more files not written" >&2; fi; '
            "exit 2; fi; "
            'chmod 755 "$tmp"; mv -T "$tmp" "$dest"; trap - EXIT'
        )
        return self.run(["bash", "-c", script], stdin=payload, timeout=timeout, step="put tree")

    @contextlib.contextmanager
    def lock(
        self, purpose: str, *, timeout: float = 20.0, note_optional: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Hold the host-wide lock (flock on `<remote_root>/lock`) for the `with` body.

        A second holder, from this machine or any other, gets LockHeld with the holder's
        user, operator host, pid, purpose and start time. The lock dies with its holder:
        if ops or the connection goes away, the host process holding the flock exits.
        Where the holder's note cannot be written (a full disk) the lock is refused as
        UNWRITABLE; with `note_optional` (a stop, which writes nothing) it is held all the
        same, and the holder dict's `note_unwritten` says why there is no note.
        """
        holder = {
            "user": getpass.getuser(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "purpose": purpose,
            "since": _now(),
        }
        root = shell_path(self.target.remote_root)
        tries = max(1, int(LOCK_NOTE_WAIT_S / 0.1))
        # Busy with no note yet: the holder took the flock but has not written its note (or
        # just removed it on its way out). Retry both for a moment before answering BUSY.
        # The lock file and the note must be writable: a read-only root (EROFS, EACCES) is
        # UNWRITABLE and the file and the error, not a lock that seems held by someone starting.
        script = (
            "command -v flock >/dev/null 2>&1 || { echo NOFLOCK; exit 4; }; "
            f"root={root}; "
            # a root inside another root's releases/ (say .../current) would write into a release
            'real=$(readlink -m "$root"); case "$real/" in */releases/*) '
            'r="$real/"; top=${r%%/releases/*}; '
            'if [ -L "$top/current" ] || [ -d "$top/current" ]; then '
            "echo NESTED; printf '%s\\n' \"$top\"; exit 7; fi;; esac; "
            'why=$(mkdir -p "$root" 2>&1) || '
            "{ echo NOROOT; printf '%s\\n' \"${why##*: }\"; exit 3; }; "
            # a FIFO there would hang the open below, a directory fail it, a symlink redirect it
            'if [ -L "$root/lock" ] || { [ -e "$root/lock" ] && [ ! -f "$root/lock" ]; }; then '
            'echo NOTFILE; ls -ld "$root/lock" 2>&1 | head -c 300; echo; exit 6; fi; '
            'if ! { exec 9>>"$root/lock"; } 2>/dev/null; then '
            'why=$( { : >>"$root/lock"; } 2>&1 ); '
            "echo UNWRITABLE; printf '%s\\n' \"$root/lock: ${why##*: }\"; exit 5; fi; "
            "got=; note=; "
            f"for _ in $(seq {tries}); do "
            "if flock -n 9; then got=1; break; fi; "
            # the note read only from a regular file, and only its first 4 KiB
            'note=$([ -f "$root/lock.holder" ] && head -c 4096 "$root/lock.holder" 2>/dev/null '
            '| head -n 1); [ -n "$note" ] && break; sleep 0.1; '
            "done; "
            'if [ -n "$got" ]; then '
            # the lock file removed (by hand) while another holds it: that one holds a flock on
            # the removed file, and the flock just taken on a new one shuts nobody out
            # (probe37bg M1: a second deploy ran beside the first and swept its staging)
            'gone=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$real/lock (deleted)" 2>/dev/null '
            '| cut -d/ -f3 | sort -u | grep -vx "$$" | tr "\\n" " "); '
            'if [ -n "$gone" ]; then echo LOCKGONE; echo "$gone"; exit 8; fi; '
            'rm -f "$root/lock.holder.tmp" 2>/dev/null; '  # a FIFO there would hang the write
            f"if ! why=$( {{ printf '%s\\n' {shlex.quote(json.dumps(holder))} "
            '> "$root/lock.holder.tmp"; } 2>&1 ) || '
            '! why=$(mv -fT "$root/lock.holder.tmp" "$root/lock.holder" 2>&1); then '
            'rm -f "$root/lock.holder.tmp" 2>/dev/null; '
            + (  # the flock is held: a stop goes on without the note
                'echo "NONOTE $$"; printf \'%s\\n\' "$root/lock.holder: ${why##*: }"; '
                "cat >/dev/null; exit 0; fi; "
                if note_optional
                else "echo UNWRITABLE; printf '%s\\n' \"$root/lock.holder: ${why##*: }\"; "
                "exit 5; fi; "
            )
            + 'echo "ACQUIRED $$"; cat >/dev/null; rm -f "$root/lock.holder"; exit 0; '
            'fi; h="$root/lock.holder"; '
            'if [ -z "$note" ] && { [ -L "$h" ] || { [ -e "$h" ] && [ ! -f "$h" ]; }; }; then '
            "note='!not-regular'; fi; "
            "echo BUSY; printf '%s\\n' \"$note\" | head -n 1; "
            # who holds it and is stopped (SIGSTOP): it never lets go while it is (probe37r
            # R5: its ops killed meanwhile, the note names only that dead pid); builtins only
            # and every holder, with its name: one that wrote no note may be no ops (probe37r R8)
            'stopped=; all=; for f in /proc/[0-9]*/fd/*; do [ "$f" -ef "$root/lock" ] || continue; '
            'p=${f#/proc/}; p=${p%%/*}; [ "$p" = "$$" ] && continue; '
            'read -r _ _ s _ < "/proc/$p/stat" 2>/dev/null; '
            'c=; read -r c < "/proc/$p/comm" 2>/dev/null; all="$all $p:${c// /_}"; '
            'case "$s" in T|t) stopped="$stopped $p";; esac; done; '
            'echo "STOPPED$stopped"; echo "HOLDERS$all"; exit 75'
        )
        proc = self._spawn(script)
        said = proc.read_line(timeout + LOCK_NOTE_WAIT_S)
        first, _, proc.on_host = said.partition(" ") if said is not None else (None, "", "")
        if first == "NONOTE":  # held, without its note (only with note_optional)
            holder["note_unwritten"] = proc.read_line(5.0) or "?"
            first = "ACQUIRED"
        if first != "ACQUIRED":
            known = ("BUSY", "NOROOT", "UNWRITABLE", "NOTFILE", "NESTED", "LOCKGONE")
            other = proc.read_line(5.0) if first in known else None
            held = proc.read_line(10.0) if first == "BUSY" else None  # STOPPED [PID...]
            holding = proc.read_line(5.0) if first == "BUSY" else None  # HOLDERS [PID:NAME...]
            proc.finish(5.0)
            if first == "BUSY":
                message, info = _held_by(other or "")
                named = (holding or "").removeprefix("HOLDERS").split()
                if info.get("starting") and named:
                    # no note after LOCK_NOTE_WAIT_S: an ops writes its note at once, so this is
                    # most likely no ops at all (a hand's flock, another tool)
                    info["holders"] = named
                    who = ", ".join("pid {} ({})".format(*n.partition(":")[::2]) for n in named)
                    message = (
                        f"host lock held by {who}, which wrote no holder note: not an ops (a "
                        "flock by hand, another tool?), or one just starting"
                    )
                stopped = (held or "").removeprefix("STOPPED").split()
                if stopped:
                    pids = " ".join(stopped)
                    info["stopped"] = pids
                    message += (
                        f"; the process holding it on the host (pid {pids}) is stopped "
                        f"(SIGSTOP), so it never lets go: kill -CONT {pids} lets it end"
                    )
                else:
                    message += _stopped_here(info) or _gone_here(info, named)
                raise LockHeld(message, target=self.name, holder=info)
            if first == "LOCKGONE":
                pids = " ".join((other or "").split()) or "?"
                raise LockHeld(
                    f"host lock held by pid {pids} on the host through a lock file removed "
                    f"since ({self.target.remote_root}/lock, by hand?): a deploy or rollback "
                    "may still run there, and nothing runs beside it; once it has ended, try "
                    "again",
                    target=self.name,
                    holder={"holders": (other or "").split()},
                )
            where, why = self.target.remote_root, other or "?"
            reasons = {
                "NOFLOCK": "flock(1) is not installed",
                "NOROOT": f"cannot create remote_root {where}: {why}",
                "UNWRITABLE": f"cannot write in remote root {where} (full, read-only or not ours): "
                f"{why}",
                "NOTFILE": f"{where}/lock is not a regular file, so it cannot be locked: {why}",
                "NESTED": nested_root(where, why),
            }
            full = "No space left on device" in why or "Disk quota exceeded" in why
            if full:  # (probe37w W3: a full disk was hinted as a root not writable)
                reasons["UNWRITABLE"] = f"the remote root's disk is full: {why}"
            raise HostError(
                reasons.get(first or "", f"could not take the lock ({first or 'no answer'})"),
                target=self.name,
                step="lock",
                hint=f"free space on the disk of {where} (df -h {shlex.quote(where)}), then try "
                "again: ops writes its lock note, its records and links there"
                if first == "UNWRITABLE" and full
                else "ops writes its lock, releases and pidfile under the remote root: make it "
                "writable for the target's user, or point remote_root elsewhere"
                if first in ("NOROOT", "UNWRITABLE")
                else f"remove it (rm -r {shlex.quote(where + '/lock')}): it holds no state"
                if first == "NOTFILE"
                else None,
            )
        self._lock_procs.append(proc)
        try:
            yield holder
        finally:
            self._lock_procs.remove(proc)
            proc.finish(timeout)
            if proc.lost():  # on a link lost with its session alive: let go from a new one
                self.let_go(proc, f"{self.target.remote_root}/lock", step="lock")

    def lock_lost(self) -> bool:
        """Whether a host lock this Host holds has lost its holder on the host (killed: the OOM
        killer, a hand's kill -9; the link gone): the flock went with it, and another deploy
        may hold the lock now (probe37q Q11)."""
        return any(proc.exited() for proc in self._lock_procs)


def nested_root(root: str, top: str) -> str:
    """Why a remote_root inside another root's releases (`top`'s) is refused."""
    return (
        f"remote_root {root} is inside the releases of the remote root {top}: ops would write "
        "into a release there; give this target a directory of its own"
    )


def _held_by(note: str) -> tuple[str, dict[str, Any]]:
    """The LockHeld message and holder dict for the holder's note (one JSON line, or none)."""
    if note.strip() == "!not-regular":  # a FIFO, a directory, a link: made by hand
        info: dict[str, Any] = {"unknown": "lock.holder is not a regular file"}
        return (
            "host lock held; its holder's note (lock.holder) is not a regular file, so who "
            "holds it cannot be told (lslocks or fuser on the lock file names the process)"
        ), info
    if not note.strip():
        info = {"starting": True}
        return "host lock held by a holder that is still starting (no note from it yet)", info
    try:
        info = json.loads(note)
    except (ValueError, RecursionError):  # (nested too deep, an integer too long)
        info = {}
    keys = ("user", "host", "pid", "purpose", "since")
    if not isinstance(info, dict) or not all(info.get(k) not in (None, "") for k in keys):
        return f"host lock held; the holder's note is unreadable: {note[:200]!r}", {"unknown": note}
    who = f"{info['user']}@{info['host']} pid {info['pid']}"
    return f"host lock held by {who} ({info['purpose']}) since {info['since']}", info


def _stat(pid: int | str) -> list[str]:
    """A process's /proc stat fields after its name: [state, ppid, pgrp, ...]; [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _stopped_here(info: dict[str, Any]) -> str:
    """Where the lock's holder is an ops on this machine that is stopped (SIGSTOP, Ctrl-Z), the
    phrase that says so and names the way on (probe37o O1: a stopped deploy holds the lock
    until someone resumes or ends it); else "". Ctrl-Z stops the whole process group: an ops
    caught starting a child waits on it (state D), and the child is the stopped one (probe37bf
    L2), so the group is what is continued."""
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return ""
    fields = _stat(pid)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    if len(fields) < 3 or not any(b"ops" in a for a in argv):
        return ""
    state, group = fields[0], fields[2]
    stopped_kin = [  # others of its process group stopped with it (a Ctrl-Z's group stop)
        p
        for p in filter(str.isdigit, os.listdir("/proc"))
        if p != str(pid) and (f := _stat(p))[2:3] == [group] and f[0] in ("T", "t")
    ]
    if state not in ("T", "t") and not (state == "D" and stopped_kin):
        return ""
    how = f"kill -CONT -- -{group} (its process group)" if stopped_kin else f"kill -CONT {pid}"
    return (
        f"; pid {pid} is stopped (SIGSTOP or Ctrl-Z), so it holds the lock until it goes on: "
        f"{how} lets it finish (its guard puts the host back if it is killed instead)"
    )


def _gone_here(info: dict[str, Any], named: list[str]) -> str:
    """Where the lock's note names an ops on this machine that has ended while the lock is
    still held on the host (its host-side holder, kept by an SSH session that froze: probe37av
    L2, the refusal named only the dead pid), the phrase that says so, names the holders and
    the way on; else ""."""
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return ""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        argv = []
    if any(b"ops" in a for a in argv):
        return ""  # (it lives: the note says who holds it)
    pids = " ".join(n.partition(":")[0] for n in named)
    held = f"pid {pids} there" if pids else "its holder there"
    return (
        f"; that ops (pid {pid}, on this machine) has ended, but the lock is still held on the "
        f"host by {held}: ops's holder, kept by a link that has not closed (a frozen SSH "
        "session); it lets go once that session ends, and a deploy's guard then puts the host "
        f"back (ops service status tells where it is); or end it on the host: kill {pids or 'PID'}"
    )


def _tar_gz(src: Path) -> bytes:
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if any(p in TREE_EXCLUDE or p.endswith(".egg-info") for p in parts):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for child in sorted(src.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buf.getvalue()


def still_runs(what: str, ran: float, bound: float) -> str:
    """The heartbeat's words: what runs, for how long, and its bound (one already passed, its
    stop under way, is said so: probe37bg M3 read "77 s; stopped at 60 s")."""
    if ran <= bound:
        return f"{what} still runs ({ran:.0f} s; stopped at {bound:g} s)"
    return f"{what} still runs ({ran:.0f} s; past its {bound:g} s: being stopped)"


def heartbeat_s() -> float:
    """How often a long host command says it still runs: OPS_HEARTBEAT_S (seconds, 1 to 3600)
    where set, else HEARTBEAT_S; ValueError for any other value (the CLI refuses it first)."""
    raw = os.environ.get("OPS_HEARTBEAT_S", "").strip()
    if not raw:
        return HEARTBEAT_S
    try:
        period = float(raw)
    except ValueError:
        period = float("nan")
    if not 1 <= period <= 3600:  # (nan fails both)
        raise ValueError(f"{raw!r} is not a number of seconds from 1 to 3600")
    return period


def open_host(target: Target) -> Host:
    """The Host for a target: `local` runs here, every other target over SSH."""
    if target.is_local:
        from ops.hosts.local import LocalHost  # ops.hosts.local imports this module

        return LocalHost(target)
    from ops.hosts.ssh import SshHost  # paramiko is only imported when a target needs it

    return SshHost(target)
