"""The ops exception tree: every failure a user can cause or meet, with the exit code it maps to.

    OpsError                      exit 2 unless a subclass says otherwise
    ├── InventoryError            the inventory file is missing, unparsable or invalid
    ├── UnknownTarget             a target or group name that the inventory does not have
    ├── HostError                 something went wrong on or on the way to a target (names it)
    │   ├── Unreachable           no TCP/SSH session within the connect timeout, or it was lost
    │   ├── AuthenticationFailed  the server refused our key
    │   ├── HostKeyError          host key unknown (strict policy) or different from known_hosts
    │   ├── CommandFailed         a command exited non-zero (carries its Result)
    │   │   └── CommandTimedOut   a command ran past its timeout (carries its Result)
    │   ├── ModuleOutputError     a data-plane module printed no JSON document
    │   │   └── ModuleLinkLost    ... because the SSH link went while it ran (no exit status)
    │   ├── HostSideBug           ops's own host-side code raised (exit 4: a bug, one line)
    │   └── LockHeld              the host lock is held by someone else (says who and since when)

Exit codes: EXIT_OK 0 pass / GO, EXIT_FAIL 1 fail / NO-GO, EXIT_BAD_INPUT 2 bad input,
configuration or a host ops could not act on (every HostError), EXIT_HOLD 3 HOLD,
EXIT_INTERNAL 4 an unexpected exception (a bug in ops, never a verdict: `ops.cli.main` says so
in one line, the traceback only with OPS_DEBUG=1), EXIT_INTERRUPTED 130 Ctrl-C or SIGTERM.

Foreign errors are translated into these at the boundary where they arise, chained with
``raise ... from exc``: paramiko and socket errors in `ops.hosts.ssh` (the SSH transport); a
command's exit status, a timeout and a module's unparsable output in `ops.hosts.remote` (`Host.run`,
`Host.run_module`, the host lock), for both transports alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ops.hosts.remote import Result

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_HOLD = 3
EXIT_INTERNAL = 4  # an exception ops did not expect: a bug, never a NO-GO
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C

_TAKEN: list[str] = []  # the signal ops took as Ctrl-C, where one was (probe37u U6)


def took_signal(name: str) -> None:
    """Remember that `name` (SIGTERM, SIGHUP, SIGQUIT) interrupts ops the way Ctrl-C does."""
    _TAKEN[:] = [name]


def taken_signal() -> str | None:
    """The signal ops took as Ctrl-C (SIGTERM, SIGHUP, SIGQUIT), None for a Ctrl-C itself."""
    return _TAKEN[0] if _TAKEN else None


def interrupt_said() -> str:
    """What stopped ops, as its `interrupted` line says it: Ctrl-C, or the signal taken as one
    (a dropped terminal's SIGHUP was said as a Ctrl-C nobody pressed)."""
    return f"{_TAKEN[0]}, taken as Ctrl-C" if _TAKEN else "Ctrl-C"


class OpsError(Exception):
    """Base of every error ops reports to a user as one line, without a traceback."""

    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": type(self).__name__, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        return out


class InventoryError(OpsError):
    """The inventory cannot be used; the message names the file, the target and the field."""


class UnknownTarget(OpsError):
    """A name that is neither a target nor a group of the inventory."""


class HostError(OpsError):
    """A failure on a target, or on the way to it; names the target and the step."""

    def __init__(self, message: str, *, target: str, step: str, hint: str | None = None) -> None:
        super().__init__(f"{target}: {step}: {message}", hint=hint)
        self.target = target
        self.step = step

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "target": self.target, "step": self.step}


class Unreachable(HostError):
    """No connection within the connect timeout (refused, no route, no SSH banner), or the
    connection lost while a command ran: the link's trouble, never the command's."""


class AuthenticationFailed(HostError):
    """The SSH server refused every key we offered."""


class HostKeyError(HostError):
    """The host key is unknown under the strict policy, or differs from known_hosts."""


class CommandFailed(HostError):
    """A command exited non-zero; ``result`` holds its exit code and output."""

    def __init__(self, message: str, *, target: str, step: str, result: Result) -> None:
        super().__init__(message, target=target, step=step)
        self.result = result

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "rc": self.result.rc, "stderr_tail": self.result.tail()}


class CommandTimedOut(CommandFailed):
    """A command ran past its timeout and was killed."""


class ModuleOutputError(HostError):
    """A data-plane module did not print exactly one JSON document on stdout."""


class ModuleLinkLost(ModuleOutputError):
    """A data-plane module's output ended with no exit status: the SSH link went while it ran
    (the link's trouble, not the module's: a post-flight cut off by it condemns nothing)."""


class HostSideBug(HostError):
    """ops's own host-side code (the releases or process-manager module) raised: a bug in
    ops, said in one line (the exception's last line), exit 4 like any internal error."""

    exit_code = EXIT_INTERNAL


class LockHeld(HostError):
    """Someone else holds the host lock; ``holder`` says who and since when."""

    def __init__(self, message: str, *, target: str, holder: dict[str, Any]) -> None:
        super().__init__(message, target=target, step="lock")
        self.holder = holder

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "holder": self.holder}
