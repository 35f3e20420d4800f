"""Service managers: start, stop, restart and report the inference service on a target.

`systemd` (production): `sudo -n systemctl start|stop|restart UNIT` (sudo is used for nothing
else), `systemctl is-active UNIT`, and `journalctl -u UNIT -n 100` as evidence.
`process` (local, containers, CI): ops starts the configured command detached in its own
session with a pidfile and a log under `<remote_root>`, stops it by pid (TERM to its process
group, KILL after a grace period), and calls it active when the pid lives and `/health`
answers. Both wait for `/health` after a start, probing from the host itself.
"""

from __future__ import annotations

import json
import shlex
import urllib.parse
from abc import ABC, abstractmethod
from typing import Literal

from pydantic import BaseModel, Field

from ops.errors import HostError, InventoryError
from ops.inventory import Target
from ops.remote import Host, shell_path

State = Literal["active", "activating", "inactive", "failed", "unknown"]
EVIDENCE_LINES = 100
STOP_GRACE_S = 20

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


# A shell function: is pid $1 a live process (a zombie left unreaped by a container's init
# is not)? Shared by the process manager and `ops facts`, so "alive" means one thing.
ALIVE_FN = (
    'alive() { kill -0 "$1" 2>/dev/null && '
    '[ "$(sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -d" " -f1)" != Z ]; }; '
)


def pidfile(target: Target) -> str:
    """Where the `process` manager keeps the service's pid on the host."""
    return f"{target.remote_root}/run/{target.service.name}.pid"


def logfile(target: Target) -> str:
    """Where the `process` manager appends the service's output on the host."""
    return f"{target.remote_root}/logs/{target.service.name}.log"


class ServiceStatus(BaseModel):
    """What the manager says about the service, with evidence when it is not healthy."""

    name: str
    manager: str
    state: State
    pid: int | None = None
    healthy: bool | None = None
    detail: str = ""
    evidence: list[str] = Field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.state == "active"


class ServiceManager(ABC):
    """One target's service, managed through the target's Host."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.target = host.target
        self.service = host.target.service

    @abstractmethod
    def status(self) -> ServiceStatus: ...

    @abstractmethod
    def _start(self) -> int | None:
        """Start without waiting; return the pid where the manager knows it."""

    @abstractmethod
    def stop(self) -> ServiceStatus: ...

    @abstractmethod
    def evidence(self) -> list[str]:
        """The last lines of the service's log (journal or log file)."""

    def start(self, wait_s: float = 120.0) -> ServiceStatus:
        pid = self._start()
        return self._wait(pid, wait_s)

    def restart(self, wait_s: float = 120.0) -> ServiceStatus:
        self.stop()
        return self.start(wait_s)

    def probe_health(self, pid: int | None, wait_s: float) -> dict:
        res = self.host.run(
            [self.target.python, "-c", WAIT_HEALTH, self.service.url, str(wait_s), str(pid or 0)],
            timeout=wait_s + 30,
            warn=True,
            step="wait for /health",
        )
        try:
            return json.loads(res.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            return {"ok": False, "reason": res.tail() or f"health probe exited {res.rc}"}

    def _wait(self, pid: int | None, wait_s: float) -> ServiceStatus:
        probe = self.probe_health(pid, wait_s)
        st = self.status()
        if probe.get("ok"):
            return st
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

    def _start(self) -> int | None:
        self._systemctl("start")
        return None

    def restart(self, wait_s: float = 120.0) -> ServiceStatus:
        self._systemctl("restart")
        return self._wait(None, wait_s)

    def stop(self) -> ServiceStatus:
        self._systemctl("stop")
        return self.status()

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
    """The service as a detached process of ops's own: pidfile, log file, TERM then KILL."""

    def _paths(self) -> tuple[str, str, str]:
        return self.target.remote_root, pidfile(self.target), logfile(self.target)

    def command_line(self) -> str:
        """The configured command with {python}, {host}, {port} filled in (quoted)."""
        template = self.service.command
        if not template:
            raise InventoryError(
                f"target {self.target.name!r}: service.command is required for manager = 'process'"
            )
        url = urllib.parse.urlsplit(self.service.url)
        try:
            return template.format(
                python=shlex.quote(self.target.python),
                host=shlex.quote(url.hostname or "127.0.0.1"),
                port=int(url.port or 80),
            )
        except (KeyError, IndexError, ValueError) as exc:
            raise InventoryError(
                f"target {self.target.name!r}: service.command: bad placeholder {exc}"
                " (allowed: {python}, {host}, {port})"
            ) from None

    def status(self) -> ServiceStatus:
        _, pf, _ = self._paths()
        script = (
            ALIVE_FN + f"pf={shell_path(pf)}; "
            'if [ ! -f "$pf" ]; then echo "inactive"; '
            'elif alive "$(cat "$pf")"; then echo "alive $(cat "$pf")"; '
            'else echo "dead $(cat "$pf")"; fi'
        )
        word, _, pid_text = (
            self.host.run_script(script, step="service status").stdout.strip().partition(" ")
        )
        pid = int(pid_text) if pid_text.isdigit() else None
        base = {"name": self.service.name, "manager": "process", "pid": pid}
        if word == "inactive":
            return ServiceStatus(**base, state="inactive", detail="not started (no pidfile)")
        if word == "dead":
            return ServiceStatus(
                **base,
                state="failed",
                detail=f"pid {pid} is gone (stale pidfile)",
                evidence=self.evidence(),
            )
        probe = self.probe_health(pid, 0)
        if probe.get("ok"):
            return ServiceStatus(
                **base, state="active", healthy=True, detail=f"pid {pid}, /health ok"
            )
        return ServiceStatus(
            **base,
            state="activating",
            healthy=False,
            detail=f"pid {pid} lives but {probe.get('reason')}",
        )

    def _start(self) -> int | None:
        root, pf, log = self._paths()
        cmd = self.command_line()
        script = (
            ALIVE_FN
            + f"set -e; root={shell_path(root)}; pf={shell_path(pf)}; log={shell_path(log)}; "
            'mkdir -p "$(dirname "$pf")" "$(dirname "$log")"; '
            'if [ -f "$pf" ] && alive "$(cat "$pf")"; then echo "ALREADY $(cat "$pf")"; '
            "exit 0; fi; "
            'if [ -d "$root/current" ]; then cd "$root/current"; fi; '
            f'echo "=== $(date -u +%FT%TZ) ops start: "{shlex.quote(cmd)} >> "$log"; '
            f'setsid nohup bash -c {shlex.quote("exec " + cmd)} >> "$log" 2>&1 < /dev/null & '
            'echo $! > "$pf.tmp"; mv -f "$pf.tmp" "$pf"; echo "STARTED $!"'
        )
        out = self.host.run_script(script, step="service start", warn=False).stdout.split()
        if len(out) < 2 or not out[-1].isdigit():
            raise HostError(
                f"could not start {self.service.name}: {out}",
                target=self.host.name,
                step="service start",
            )
        return int(out[-1])

    def stop(self) -> ServiceStatus:
        _, pf, _ = self._paths()
        ticks = STOP_GRACE_S * 10
        script = (
            ALIVE_FN + f"pf={shell_path(pf)}; "
            '[ -f "$pf" ] || { echo NOTRUNNING; exit 0; }; pid=$(cat "$pf"); '
            'if ! alive "$pid"; then rm -f "$pf"; echo STALE; exit 0; fi; '
            'kill -TERM -- -"$pid" 2>/dev/null || kill -TERM "$pid"; '
            f'for i in $(seq 1 {ticks}); do alive "$pid" || break; sleep 0.1; done; '
            'if alive "$pid"; then kill -KILL -- -"$pid" 2>/dev/null || kill -KILL "$pid"; '
            'echo KILLED; else echo STOPPED; fi; rm -f "$pf"'
        )
        self.host.run_script(script, timeout=STOP_GRACE_S + 30, warn=False, step="service stop")
        return self.status()

    def evidence(self) -> list[str]:
        _, _, log = self._paths()
        res = self.host.run_script(
            f"tail -n {EVIDENCE_LINES} {shell_path(log)} 2>/dev/null", step="service log"
        )
        return res.stdout.splitlines()


def manager_for(host: Host) -> ServiceManager:
    if host.target.service.manager == "systemd":
        return SystemdManager(host)
    return ProcessManager(host)
