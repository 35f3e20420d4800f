"""Service managers: start, stop, restart and report the inference service on a target.

`systemd` (production): `sudo -n systemctl start|stop|restart UNIT` (sudo is used for nothing
else), `systemctl is-active UNIT`, and `journalctl -u UNIT -n 100` as evidence.
`process` (local, containers, CI): ops starts the configured command detached in its own
session with a pidfile and a log under `<remote_root>`, stops it by pid (TERM to its process
group, KILL after a grace period), and calls it active when the pid lives and `/health`
answers. Both wait for `/health` after a start, probing from the host itself.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
import shlex
import urllib.parse
from abc import ABC, abstractmethod
from typing import Literal

from pydantic import BaseModel, Field

from ops.errors import HostError, InventoryError, OpsError, Unreachable
from ops.hosts.inventory import Target
from ops.hosts.remote import Host, shell_path
from ops.hostside import source

State = Literal["active", "activating", "inactive", "failed", "unknown"]
EVIDENCE_LINES = 100
EVIDENCE_BYTES = 65536  # the log tail read for them, at most (a line may be a GiB)
# the line the process manager writes into the service's log at each start (procman open_log)
START_MARK = re.compile(r"=== \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ops start: ")
MAX_WAIT_S = 86400.0  # a day: a huge model loads in minutes; `inf` overflowed the host timeout
PROCMAN_SOURCE = source("procman")
# the host side's advice names `ops VERB TARGET`: it does not know the target's name
HOST_ADVICE = re.compile(r"\b(ops (?:service )?[a-z]+) TARGET\b")


def named(text: str, target: str) -> str:
    """The host side's `text` with the target's name where it says TARGET (probe37aj L1)."""
    return HOST_ADVICE.sub(lambda m: f"{m.group(1)} {target}", text)


PROCMAN_STOPPED_S = 5  # the process manager stopped this long is ended, and said to have been
# The process manager under a watch ("$@" is its command). One stopped (SIGSTOP, a debugger)
# held its command, and the host lock with it, until the command's timeout, minutes, saying
# nothing (probe37af M1: 352 s). Once it stays stopped, the watch ends it (SIGKILL: a process
# manager continued later would go on without the lock) and prints the result ops reads; ops
# then asks the service's state. The watch holds none of the command's pipes while it sleeps.
STOPPED_SAID = (
    f"the process manager (pid %s) on the host stayed stopped (SIGSTOP or a debugger) for "
    f"{PROCMAN_STOPPED_S} s, holding this command and the host lock: it was ended"
)
STOP_WATCH = (
    '"$@" 0<&0 & p=$!; '
    "{ n=0; while sleep 1 >/dev/null 2>&1 </dev/null; do "
    'read -r _ _ s _ < "/proc/$p/stat" 2>/dev/null || exit 0; '
    'case "$s" in T|t) n=$((n+1));; *) n=0;; esac; '
    f'if [ "$n" -ge {PROCMAN_STOPPED_S} ]; then printf '
    + shlex.quote(f'\n{{"error": "{STOPPED_SAID}", "stopped": %s, "ended": true}}\n')
    + ' "$p" "$p"; kill -KILL "$p"; exit 0; fi; done; } & w=$!; '
    'wait "$p"; rc=$?; kill "$w" 2>/dev/null; '
    # its parent, the command's `timeout`, stopped too (probe37ai M1: a pattern's SIGSTOP
    # caught it, ops's outer watcher and the restart's worker at once): it holds the command's
    # output, and nothing else ends it before ops's own deadline
    'i=0; while read -r _ _ s _ < "/proc/$PPID/stat" 2>/dev/null; do '
    'case "$s" in T|t) ;; *) break;; esac; '
    'c=; read -r c < "/proc/$PPID/comm" 2>/dev/null; [ "$c" = timeout ] || break; '
    f'if [ "$i" -ge {PROCMAN_STOPPED_S} ]; then kill -KILL "$PPID"; break; fi; '
    'i=$((i+1)); sleep 1 >/dev/null 2>&1 </dev/null; done; exit "$rc"'
)

# Runs on the host with the target's python (stdlib only): wait until /health answers 2xx,
# the process dies, or the time is up; with a timeout of 0 it probes exactly once.
WAIT_HEALTH = r"""
import json, os, sys, time, urllib.error, urllib.request
url, timeout, pid = sys.argv[1].rstrip("/") + "/health", float(sys.argv[2]), int(sys.argv[3])
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
t0, last = time.time(), "no answer"
while True:
    if pid > 0 and not alive(pid):
        gone = {"ok": False, "reason": f"process {pid} exited", "waited_s": time.time() - t0}
        print(json.dumps(gone))
        sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            print(json.dumps({"ok": True, "status": r.status, "waited_s": time.time() - t0}))
            sys.exit(0)
    except urllib.error.HTTPError as e:
        last = f"HTTP {e.code}"
    except Exception as e:
        last = f"{type(e).__name__}: {e}"
    if time.time() - t0 >= timeout:
        print(json.dumps({"ok": False, "reason": f"/health: {last}", "waited_s": time.time() - t0}))
        sys.exit(1)
    time.sleep(0.25)
"""


# a start or restart with --wait 0 whose service lives but does not answer yet: started, not
# failed (probe37be L2: said "failed", exit 1, of one that served a moment later)
NOT_WAITED = "/health not waited for (--wait 0): ops service status tells once it answers"


def not_waited(st: ServiceStatus, wait_s: float, reason: object) -> bool:
    """A service left starting by --wait 0: alive (its process did not exit), not answering."""
    return wait_s == 0 and st.state in ("active", "activating") and " exited" not in str(reason)


def check_wait(wait_s: float) -> float:
    """A --wait for /health is a finite number of seconds, 0 to a day (refused before the
    service is touched)."""
    if not math.isfinite(wait_s) or not 0 <= wait_s <= MAX_WAIT_S:
        raise OpsError(f"--wait {wait_s:g}: must be 0 to {MAX_WAIT_S:g} seconds")
    return wait_s


def pidfile(target: Target) -> str:
    """Where the `process` manager keeps the service's pid on the host."""
    return f"{target.remote_root}/run/{target.service.name}.pid"


def logfile(target: Target) -> str:
    """Where the `process` manager appends the service's output on the host."""
    return f"{target.remote_root}/logs/{target.service.name}.log"


class ServiceStatus(BaseModel):
    """What the manager says about the service, with evidence when it is not healthy.

    `signals` names every signal a stop sent and to whom; `actions` what else was done on
    the way (e.g. a stale pidfile removed).
    """

    name: str
    manager: str
    state: State
    pid: int | None = None
    healthy: bool | None = None
    detail: str = ""
    evidence: list[str] = Field(default_factory=list)
    signals: list[dict] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)
    # set when the service could not start for a reason outside the release (another program
    # holds its port): a deploy then rolls back without rejecting the release
    blocked_by: str | None = None
    # the directory the service's process runs from (process manager: /proc/PID/cwd), so a
    # caller can tell which release serves whatever `current` says
    runs_from: str | None = None
    # the release it runs where that release's directory is gone from releases/ (removed or
    # moved by hand: runs_from then names no release): no way back to it
    release_gone: str | None = None
    # the release it last ran, where it runs none now (as its pidfile said; process manager)
    last_ran: str | None = None
    # why a start of current would not run what serves: its service.env or its code changed
    # after the service started (process manager): a revert to current could not come back
    untried: str | None = None
    # what an operator should know that did not stop the command: a deploy.pending left by a
    # dead deploy (the release current names was never proven), a start --force let through
    warnings: list[str] = Field(default_factory=list)
    # processes of this service (their environment names its root and name) that no pidfile
    # names: one that daemonized, or whose pidfile is lost; each: pid, release, cwd, cmdline
    unmanaged: list[dict] = Field(default_factory=list)
    # its process is stopped (SIGSTOP, a debugger): it answers nothing until continued
    stopped: bool = False
    # its process runs another command than the inventory renders now (process manager): a
    # restart, whatever release it starts, runs what never ran
    command_changed: bool = False
    # not running, and another program holds its port (process manager): a start is refused
    port_held: bool = False

    @property
    def active(self) -> bool:
        return self.state == "active"

    @property
    def runs_release(self) -> str | None:
        """The release id its process runs from: its directory's name under a `releases/`;
        None for any other directory, and for one that is gone (`release_gone` names it)."""
        cwd = self.runs_from
        if not cwd or cwd.endswith(" (deleted)"):
            return None
        parent, _, name = cwd.rstrip("/").rpartition("/")
        return name if parent.endswith("/releases") else None

    @property
    def lives(self) -> bool:
        """Its process runs: active, or alive and not answering where the inventory now says
        (its port edited there: probe37bd H1, read as not serving, a rollback stopped it)."""
        return self.active or self.command_changed


class ServiceManager(ABC):
    """One target's service, managed through the target's Host."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.target = host.target
        self.service = host.target.service
        self._warnings: list[str] = []  # what `vet` let through with a warning

    @abstractmethod
    def status(self) -> ServiceStatus: ...

    @abstractmethod
    def start(
        self, wait_s: float = 120.0, *, operator: bool = False, force: bool = False
    ) -> ServiceStatus:
        """Start the service (unless it runs) and wait up to `wait_s` for /health.

        `operator` (an operator's `ops service start`, not a deploy's) also refuses a `current`
        that is not a release and a switch a dead deploy left pending (`vet`), unless `force`."""

    @abstractmethod
    def stop(self) -> ServiceStatus: ...

    def state_now(self, starts: bool = True) -> str:
        """The service's state as the host says it now, in one phrase, after a command that
        ended without its result (a Ctrl-C; a process manager killed: probe37aa L3); `starts`:
        name the start that brings it back where it is not active."""
        try:
            st = self.status()
        except OpsError as exc:
            return f"the service's state is unknown ({exc.message})"
        said = f"the service is now {st.state}" + (f": {st.detail}" if st.detail else "")
        if starts and st.state == "activating":  # (probe37aj L3: it is starting already)
            said += f"; ops service status {self.target.name} tells once it is up"
        elif starts and not st.active and not st.command_changed:  # (its warning says)
            said += f"; ops service start {self.target.name} starts it"
        return said

    @abstractmethod
    def evidence(self) -> list[str]:
        """The last lines of the service's log (journal or log file)."""

    def restart(
        self, wait_s: float = 120.0, *, operator: bool = False, force: bool = False
    ) -> ServiceStatus:
        check_wait(wait_s)
        refused = self.vet(operator, force)
        if refused is not None:
            return refused
        self.stop()
        return self.start(wait_s)

    def vet(self, operator: bool, force: bool) -> ServiceStatus | None:
        """For an operator's start or restart: the refusal, before anything is touched, of a
        `current` that is not a release or of a switch a dead deploy left pending (None: go
        on). The process manager does this in its own host-side run; others ask the host."""
        if not operator:
            return None
        mode = "operator-force" if force else "operator"
        res = self.host.run(
            [self.target.python, "-S", "-c", PROCMAN_SOURCE, "vet", self.target.remote_root, mode],
            warn=True,
            step="service vet",
        )
        doc = res.last_json(lambda line: named(line, self.target.name))
        if doc is None:
            if res.rc == -1:  # SSH's word for a command whose exit status never came back
                raise Unreachable(
                    "the connection to the host was lost while the process manager ran: "
                    "what it did is unknown",
                    target=self.host.name,
                    step="service vet",
                )
            raise HostError(
                f"process manager printed no result (exit {res.rc}): "
                + (res.tail() or res.tail("stdout") or "no output"),
                target=self.host.name,
                step="service vet",
            )
        if not isinstance(doc, dict):
            raise HostError("vet: result is not an object", target=self.host.name, step="vet")
        if doc.get("reason"):
            return self.refused(doc)
        self._warnings = list(doc.get("warnings") or [])
        return None

    def refused(self, doc: dict) -> ServiceStatus:
        """The status of a start or restart refused before it touched anything."""
        return ServiceStatus(
            name=self.service.name,
            manager=self.service.manager,
            state="failed",
            healthy=False,
            detail=f"not started: {doc.get('reason')}{self.hint(doc.get('blocked_by'))}",
            actions=doc.get("notes") or [],
            blocked_by=doc.get("blocked_by"),
            warnings=doc.get("warnings") or [],
        )

    def hint(self, blocked_by: str | None) -> str:
        """What to do about a refusal, said with the target's name."""
        name = self.target.name
        if blocked_by == "current":
            return (
                f"; put a release back: ops rollback {name} (or --to ID; ops releases {name} "
                "lists them), or --force to run it as it is"
            )
        if blocked_by == "release":
            return (  # (a rollback stops a serving service only knowingly: probe37at H2)
                f"; mend it, or put a whole release back: ops service stop {name}, then ops "
                f"rollback {name} --to ID (ops releases {name} lists them)"
            )
        if blocked_by == "pending":
            return (
                f"; ops rollback {name} puts the host back on its release before and proves "
                "it (--force starts the unproven one as it is)"
            )
        if blocked_by == "pending-rollback":
            return (
                f"; ops rollback {name} finishes it: the switch is undone, made again and "
                "proven (--force starts current as it is)"
            )
        if blocked_by == "pending-unreadable":
            return (
                "; --force starts current as it is; the next deploy sets the record aside "
                f"without moving current (ops rollback {name} does too, then switches to "
                "previous)"
            )
        if blocked_by == "unproven":
            return (
                f"; ops rollback {name} --to the release it runs makes that current, then ops "
                f"deploy {name} proves the new one with a way back (--force restarts onto "
                "current as it is)"
            )
        if blocked_by == "unproven-start":
            return (
                f"; ops rollback {name} --to the release it last ran makes that current and "
                f"starts it, then ops deploy {name} proves the new one with a way back (--force "
                "starts current as it is)"
            )
        # "unproven-gone", "release-runs": the way on is in the reason (the release the service
        # runs is gone; or current is no directory, and the rollback that adopts what runs)
        if blocked_by == "port":  # e.g. another user's `local` on this machine
            return (
                f"; to run beside it, give {name}'s service a free port: "
                f"[targets.{name}.service] url = 'http://127.0.0.1:PORT' (docs/inventory.md)"
            )
        return ""

    def probe_health(self, pid: int | None, wait_s: float) -> dict:
        res = self.host.run(
            [self.target.python, "-c", WAIT_HEALTH, self.service.url, str(wait_s), str(pid or 0)],
            timeout=wait_s + 30,
            warn=True,
            step="wait for /health",
        )
        doc = res.last_json()
        if not isinstance(doc, dict):
            return {"ok": False, "reason": res.tail() or f"health probe exited {res.rc}"}
        return doc

    def settled_status(self, wait_s: float) -> ServiceStatus:
        """The status once the service is past its start: one still starting (a restart not
        waited for, the revert guard's) is waited for up to `wait_s` (probe37y M1: said "does
        not serve" of a release that served 1.5 s later); a stopped one (SIGSTOP) is not."""
        st = self.status()
        if st.state != "activating" or st.pid is None or st.stopped:
            return st
        return self._wait(st.pid, wait_s)

    def _wait(self, pid: int | None, wait_s: float) -> ServiceStatus:
        probe = self.probe_health(pid, wait_s)
        st = self.status()
        if probe.get("ok"):
            return st
        if not_waited(st, wait_s, probe.get("reason")):
            return st.model_copy(update={"detail": f"started; {NOT_WAITED}"})
        return st.model_copy(
            update={
                "state": "failed" if st.state in ("active", "activating") else st.state,
                "healthy": False,
                "detail": f"not healthy after start: {probe.get('reason')}",
                "evidence": st.evidence or self.evidence(),
            }
        )


class SystemdManager(ServiceManager):
    def _systemctl(self, verb: str) -> None:
        self.host.run(
            ["sudo", "-n", "systemctl", verb, self.service.name],
            timeout=180,
            step=f"systemctl {verb}",
        )

    def status(self) -> ServiceStatus:
        res = self.host.run(
            ["systemctl", "is-active", self.service.name], warn=True, step="systemctl is-active"
        )
        word = (res.stdout.strip().splitlines() or ["unknown"])[-1]
        state: State = word if word in ("active", "activating", "inactive", "failed") else "unknown"  # type: ignore[assignment]
        st = ServiceStatus(name=self.service.name, manager="systemd", state=state, detail=word)
        if state != "active":
            st.evidence = self.evidence()
        return st

    def start(
        self, wait_s: float = 120.0, *, operator: bool = False, force: bool = False
    ) -> ServiceStatus:
        check_wait(wait_s)
        refused = self.vet(operator, force)
        if refused is not None:
            return refused
        self._systemctl("start")
        return self._warned(self._wait(None, wait_s))

    def restart(
        self, wait_s: float = 120.0, *, operator: bool = False, force: bool = False
    ) -> ServiceStatus:
        check_wait(wait_s)
        refused = self.vet(operator, force)
        if refused is not None:
            return refused
        self._systemctl("restart")
        return self._warned(self._wait(None, wait_s))

    def _warned(self, st: ServiceStatus) -> ServiceStatus:
        return st.model_copy(update={"warnings": self._warnings}) if self._warnings else st

    def stop(self) -> ServiceStatus:
        self._systemctl("stop")
        return self.status()

    def dropin(self) -> tuple[str, str]:
        """The unit drop-in that makes the service read the current release's environment."""
        path = f"/etc/systemd/system/{self.service.name}.d/ddtree-ops.conf"
        body = (
            "# installed by ops deploy --bootstrap: the release's environment\n"
            "[Service]\n"
            f"EnvironmentFile={self.target.remote_root}/current/service.env\n"
        )
        return path, body

    def install_dropin(self) -> tuple[str, str]:
        """Install the drop-in (sudo -n, the service manager's only files) and reload units."""
        path, body = self.dropin()
        parent = path.rsplit("/", 1)[0]
        self.host.run(["sudo", "-n", "mkdir", "-p", parent], step="install drop-in")
        self.host.run(["sudo", "-n", "tee", path], stdin=body.encode(), step="install drop-in")
        self.host.run(["sudo", "-n", "systemctl", "daemon-reload"], step="systemctl daemon-reload")
        return path, body

    def evidence(self) -> list[str]:
        res = self.host.run(
            [
                "sudo",
                "-n",
                "journalctl",
                "-u",
                self.service.name,
                "-n",
                str(EVIDENCE_LINES),
                "--no-pager",
            ],
            warn=True,
            step="journalctl",
        )
        return (res.stdout or res.stderr).splitlines()[-EVIDENCE_LINES:]


class ProcessManager(ServiceManager):
    """The service as a detached process of ops's own: pidfile with identity, log, TERM then KILL.

    All process handling happens on the host in `ops.hostside.procman` (sent as `python -c`), which
    signals only a pid proven to be the process it started.
    """

    def _paths(self) -> tuple[str, str, str]:
        return self.target.remote_root, pidfile(self.target), logfile(self.target)

    def _host_side(self, action: str, *args: str, timeout: float = 60.0) -> dict:
        res = self.host.run(
            # -S: the host side is stdlib only, so no site-packages scan at each call; run
            # under a watch that ends the command once the process manager stays stopped
            [
                "bash",
                "-c",
                STOP_WATCH,
                "procman-watch",
                *(self.target.python, "-S", "-c", PROCMAN_SOURCE, action, *args),
            ],
            timeout=timeout,
            warn=True,
            step=f"service {action}",
        )
        if res.rc not in (0, -1) and not res.timed_out:  # a python too old says so, in one line
            self.host.check_python(self.target.python, f"service {action}")  # (run under bash)
        doc = res.last_json(lambda line: named(line, self.target.name))
        if doc is None:
            if res.rc == -1:  # SSH's word for a command whose exit status never came back
                raise Unreachable(
                    "the connection to the host was lost while the process manager ran: "
                    "what it did is unknown",
                    target=self.host.name,
                    step=f"service {action}",
                )
            said = res.tail() or res.tail("stdout") or "no output"
            if res.timed_out:  # (probe37be M3: said as "no result (exit 124)")
                said = (
                    f"{self.target.python} did not finish in {timeout:g} s and was stopped (does "
                    "the host's python hang? the target's `python` names it)"
                )
            if action in ("up", "restart", "stop"):  # (killed, say): it may have stopped it
                said += "; " + self.state_now()
            if action == "restart":  # its worker runs on in a session of its own
                said += " (the restart's worker may still be at work: ops service status tells)"
            raise HostError(
                f"process manager printed no result (exit {res.rc}): {said}",
                target=self.host.name,
                step=f"service {action}",
            )
        if not isinstance(doc, dict):
            raise HostError(
                "process manager result is not an object",
                target=self.host.name,
                step=f"service {action}",
            )
        if "error" in doc:  # the host's own trouble, e.g. a full or read-only disk
            said = str(doc["error"])
            if doc.get("ended") is True and action in ("up", "restart", "stop"):
                said += "; " + self.state_now()  # what it had done by then
            raise HostError(
                f"process manager: {said}", target=self.host.name, step=f"service {action}"
            )
        return doc

    @staticmethod
    def render_command(target: Target) -> str:
        """The configured command with {python}, {host}, {port} filled in (quoted)."""
        template = target.service.command
        if not template:
            raise InventoryError(
                f"target {target.name!r}: service.command is required for manager = 'process'"
            )
        url = urllib.parse.urlsplit(target.service.url)
        try:
            return template.format(
                python=shlex.quote(target.python),
                host=shlex.quote(url.hostname or "127.0.0.1"),
                port=int(url.port or 80),
            )
        except (KeyError, IndexError, ValueError) as exc:
            raise InventoryError(
                f"target {target.name!r}: service.command: bad placeholder {exc}"
                " (allowed: {python}, {host}, {port})"
            ) from None

    def command_line(self) -> str:
        return self.render_command(self.target)

    def _command_changed(self, doc: dict) -> str | None:
        """Why a start would not run the command the active service runs: the inventory's
        service.command (or python, host, port) renders another one now than the one it was
        started with (its pidfile's hash): a revert would start what never ran."""
        ran = doc.get("command_sha256")
        if doc.get("state") not in ("active", "activating") or not isinstance(ran, str):
            return None
        try:
            now = hashlib.sha256(self.command_line().encode()).hexdigest()
        except InventoryError:
            return None  # (said by whatever starts it)
        if now == ran:
            return None
        said = (
            "the service runs another command than the inventory's service.command renders "
            "now (it, python, host or port changed after the service started)"
        )
        if doc.get("state") == "activating":  # (probe37ba M1: a port moved: asked where it
            # does not listen, it read as still starting, and a start as already running)
            said += ", so it may not answer where the inventory says it does"
        return f"{said}: a restart, or a revert to current, would start what never ran"

    def _status(self, doc: dict) -> ServiceStatus:
        st = ServiceStatus(
            name=self.service.name,
            manager="process",
            state=doc.get("state", "unknown"),
            pid=doc.get("pid"),
            healthy=True if doc.get("state") == "active" else None,
            detail=doc.get("detail", ""),
            runs_from=doc.get("cwd"),
            release_gone=doc["release_gone"] if isinstance(doc.get("release_gone"), str) else None,
            last_ran=doc["last_ran"] if isinstance(doc.get("last_ran"), str) else None,
            untried=doc["untried"] if isinstance(doc.get("untried"), str) else None,
            warnings=doc.get("warnings") or [],
            unmanaged=doc.get("unmanaged") or [],
            stopped=doc.get("stopped") is True,
            port_held=doc.get("port_held") is True,
        )
        changed = self._command_changed(doc)
        if changed:  # (said as the host side says a changed service.env)
            st.untried, st.command_changed = st.untried or changed, True
            st.warnings = [*st.warnings, changed]
            if st.state == "activating" and not st.stopped:  # asked where it may not listen:
                # not "still starting" (probe37bi L1), whether it serves is not known here
                st.state = "unknown"
                st.detail = f"{st.detail} (not starting: it runs another command than now)"
        if st.state in ("failed", "activating"):
            st.healthy = False
        if st.state == "failed":
            st.evidence = self.evidence()
        return st

    def status(self) -> ServiceStatus:
        _, pf, _ = self._paths()
        return self._status(self._host_side("status", pf, self.service.url))

    def start(
        self, wait_s: float = 120.0, *, operator: bool = False, force: bool = False
    ) -> ServiceStatus:
        check_wait(wait_s)
        root, pf, log = self._paths()
        # start, wait for /health and the status after it: one run of the host side
        up = self._host_side(
            "up",
            pf,
            log,
            root,
            self.command_line(),
            self.service.url,
            str(wait_s),
            mode(operator, force),
            str(self.service.stop_timeout),  # for this service's unmanaged processes it stops
            timeout=wait_s + 2 * self.service.stop_timeout + 130,
        )
        return self._after_up(up, wait_s)

    def _after_up(self, up: dict, wait_s: float) -> ServiceStatus:
        """The status an `up` (or a `restart`) document describes, after a wait of `wait_s`."""
        doc = up.get("start") or {}
        notes = doc.get("notes") or []
        warned = list(doc.get("warnings") or [])
        warned += [w for w in (up.get("status") or {}).get("warnings") or [] if w not in warned]
        if doc.get("already"):
            st = self._status(up.get("status") or {})
            warned += [w for w in st.warnings if w not in warned]  # (its command changed)
            return st.model_copy(
                update={
                    "detail": f"already running, pid {doc['pid']}",
                    "actions": notes,
                    "warnings": warned,
                }
            )
        if not doc.get("started"):
            return self.refused({**doc, "reason": doc.get("reason", "unknown reason")})
        probe = up.get("wait") or {}
        st = self._status(up.get("status") or {})
        if probe.get("ok"):
            return st.model_copy(
                update={
                    "detail": f"started pid {doc['pid']}; /health ok after "
                    f"{probe['waited_s']:.1f} s",
                    "actions": notes,
                    "warnings": warned,
                }
            )
        if not_waited(st, wait_s, probe.get("reason")):
            return st.model_copy(
                update={
                    "detail": f"started pid {doc['pid']}; {NOT_WAITED}",
                    "actions": notes,
                    "warnings": warned,
                }
            )
        reason = f"not healthy after start: {probe.get('reason')}"
        if doc.get("no_release"):  # nothing deployed: the command ran from the root
            name = self.target.name
            reason += (
                f"; no release is current on {name} (the command ran from "
                f"{self.target.remote_root}): deploy one: ops deploy {name} --bootstrap"
            )
        # a start whose output was not kept has none to quote: the log's last lines are an
        # earlier start's (probe37x M3 quoted one as this start's)
        lost = doc.get("log_lost")
        evidence = [f"(no output of this start: {lost})"] if lost else None
        return st.model_copy(
            update={
                "state": "failed" if st.state in ("active", "activating") else st.state,
                "healthy": False,
                "detail": reason,
                "evidence": evidence or st.evidence or self.evidence(),
                "actions": notes,
                "warnings": warned,
            }
        )

    def restart(
        self, wait_s: float = 120.0, *, operator: bool = False, force: bool = False
    ) -> ServiceStatus:
        """stop then start in one run of the host side, which first makes sure the start can
        happen (current runnable, room for the pidfile; for an operator, `vet`): otherwise
        nothing is stopped."""
        check_wait(wait_s)
        root, pf, log = self._paths()
        grace = self.service.stop_timeout
        up = self._host_side(
            "restart",
            pf,
            log,
            root,
            self.command_line(),
            self.service.url,
            str(wait_s),
            str(grace),
            mode(operator, force),
            timeout=wait_s + 3 * grace + 170,
        )
        return self._after_up(up, wait_s)

    def _stop(self) -> dict:
        _, pf, _ = self._paths()
        grace = self.service.stop_timeout
        # the pidfile's process, then this service's unmanaged ones: each TERM, grace, KILL
        return self._host_side("stop", pf, str(grace), self.service.url, timeout=2 * grace + 70)

    def stop(self) -> ServiceStatus:
        doc = self._stop()
        st = self.status()
        update: dict = {"detail": doc.get("detail", ""), "signals": doc.get("signals") or []}
        left = doc.get("left_pidfile")
        if left and st.state == "failed" and not st.unmanaged:
            # e.g. a read-only root: the process is stopped, only its pidfile could not go
            update["state"], update["healthy"], update["evidence"] = "inactive", None, []
            update["warnings"] = [
                *st.warnings,
                f"{left}: the service is stopped; the pidfile left names no live process "
                "(the next start removes it; while the root is read-only or full, a start is "
                "refused at the host lock)",
            ]
        if doc.get("warnings"):  # e.g. a stopped restart that will start the service again
            update["warnings"] = [*update.get("warnings", st.warnings), *doc["warnings"]]
        return st.model_copy(update=update)

    def evidence(self) -> list[str]:
        _, _, log = self._paths()
        # bounded in bytes on the host: a log "line" of a GiB (a binary blob, a \r progress bar)
        # never crosses the wire (probe37c C1)
        # only a regular file, never through a link (its own or logs/'s: another target's log,
        # probe37r R7): a FIFO there would block the read
        path, logs = shell_path(log), shell_path(posixpath.dirname(log))
        res = self.host.run_script(
            f"if [ -f {path} ] && [ ! -h {path} ] && [ ! -h {logs} ]; then "
            f"tail -c {EVIDENCE_BYTES} {path} 2>/dev/null | tail -n {EVIDENCE_LINES}; fi",
            step="service log",
        )
        # the last start's output: not ops's own markers of the starts before it (probe37q
        # Q12: a status quoted twenty "=== ... ops start:" lines as the service's log)
        _, lines = from_last_start(res.stdout.splitlines())
        # the service's bytes, shown to an operator's terminal: no control characters
        return [
            "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in line) for line in lines
        ]


def from_last_start(lines: list[str]) -> tuple[bool, list[str]]:
    """The log's lines from the last start marker on (START_MARK), and whether there is one."""
    starts = [i for i, line in enumerate(lines) if START_MARK.match(line)]
    return (True, lines[starts[-1] :]) if starts else (False, lines)


def since_last_start(lines: list[str], keep: int = 12) -> list[str]:
    """The service's log from its last start by ops (its own last words), at most `keep` lines
    (the marker line, then the newest ones)."""
    marked, lines = from_last_start(lines)
    if len(lines) <= keep:
        return lines
    if marked:
        return [lines[0], *lines[len(lines) - keep + 1 :]]
    return lines[-keep:]


def mode(operator: bool, force: bool) -> str:
    """The host side's MODE word (ops.hostside.procman `vet`)."""
    return ("operator-force" if force else "operator") if operator else ""


def manager_for(host: Host) -> ServiceManager:
    if host.target.service.manager == "systemd":
        return SystemdManager(host)
    return ProcessManager(host)
