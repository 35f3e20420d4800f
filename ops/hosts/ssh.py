"""SshHost: the two Host primitives over SSH (fabric's Connection, paramiko channels underneath).

Host keys are checked strictly by default against the target's known_hosts file; the policy
`accept-new` records an unknown key there (like OpenSSH's StrictHostKeyChecking=accept-new)
but a changed key is always refused. Paramiko and socket errors are translated here into
ops errors that name the target and the step.

Without a pty, sshd sends no signal to a command when its channel closes or the connection
drops; it only closes the command's pipes. So `_exec` never half-closes stdin: after the data
(if any) it keeps the channel's write side open until the command has exited, and closes the
channel when it gives up (deadline, Ctrl-C, lost connection). The watcher around every command
(`ops.hosts.remote.WATCH`) sees its stdin end and kills the command's session on the host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

import paramiko
from fabric import Config, Connection

from ops.errors import AuthenticationFailed, HostError, HostKeyError, Unreachable
from ops.files import MIB, FileRefused, not_regular, read_bytes_bounded
from ops.hosts.inventory import Target
from ops.hosts.remote import (
    FLOOD_RC,
    LAST_LOOK_S,
    LINE_MAX,
    STDERR_MAX,
    STDOUT_MAX,
    TIMEOUT_RC,
    Capped,
    Host,
    Proc,
    SignalsHeld,
    split_line,
)

CHUNK = 32768
KNOWN_HOSTS_MAX = 16 * MIB  # a known_hosts of a few thousand hosts is well under this
SSH_KEY_MAX = 1 * MIB  # a private key is a few KiB (RSA 16384 bits: about 13 KiB)
# A host that left two commands in a row unanswered (no channel opened within the target's
# connect_timeout: a hung host, a black-holed network) gets one short look per later command,
# and a host process's end (the revert guard's, the lock holder's) is waited for that long: the
# best-effort work after a failed rollback took about 155 s in silence (probe37z M1)
UNANSWERED_AFTER = 2
QUICK_LOOK_S = 2.0
# A command that sent nothing for this long (or twice the connect_timeout) is checked on: a new
# channel that does not open within connect_timeout means the host stopped answering under it
# (it waited out its whole deadline, 76 s for a status, probe37z M1)
QUIET_PROBE_S = 5.0
# paramiko's transport thread logs a failed handshake with its traceback; with no handler
# Python prints it on stderr. The HostError raised for it says the cause in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise _UnknownHostKey(hostname, key)


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Record an unknown host key in known_hosts and go on; changed keys never get here."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.known_hosts.open("a", encoding="ascii") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _SshProc(Proc):
    def __init__(self, chan: paramiko.Channel, host: SshHost) -> None:
        self._chan = chan
        self._host = host
        self._buf = b""
        self._lost = False

    def read_line(self, timeout: float) -> str | None:
        end = time.monotonic() + timeout
        while b"\n" not in self._buf and len(self._buf) < LINE_MAX:
            if time.monotonic() >= end:
                return None
            if self._chan.recv_ready():
                chunk = self._chan.recv(CHUNK)
                if not chunk:
                    break
                self._buf += chunk
            elif self._chan.exit_status_ready() and not self._chan.recv_ready():
                break
            else:
                time.sleep(0.005)
        if not self._buf:
            return None
        line, self._buf = split_line(self._buf)
        return line

    def exited(self) -> bool:
        return self._chan.exit_status_ready() or self._chan.closed

    def lost(self) -> bool:
        """Closed by its link's loss, not by us, with no exit status come (paramiko's
        exit_status_ready is true of any closed channel; its exit_status stays -1)."""
        return self._lost or (self._chan.closed and self._chan.exit_status == -1)

    def finish(self, timeout: float) -> int:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._chan.shutdown_write()
        if self._host.unanswered:  # its end could not come back: it ends (or not) without us
            timeout = min(timeout, QUICK_LOOK_S)
        end = time.monotonic() + timeout
        while not self._chan.exit_status_ready() and time.monotonic() < end:
            time.sleep(0.01)
        self._lost = self.lost()  # (before the close below, ours)
        rc = self._chan.recv_exit_status() if self._chan.exit_status_ready() else TIMEOUT_RC
        self._chan.close()
        return rc


class SshHost(Host):
    """A target reached over SSH; the connection opens on first use and is reused."""

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self._conn: Connection | None = None
        self._unanswered = 0  # commands in a row whose channel did not open in time

    @property
    def unanswered(self) -> bool:
        """The host has stopped answering: commands now get one short look each."""
        return self._unanswered >= UNANSWERED_AFTER

    # -- connection ---------------------------------------------------------------------
    def _connect(self) -> paramiko.Transport:
        if self._conn is not None and self._conn.is_connected:
            transport = self._conn.client.get_transport()
            assert transport is not None
            return transport
        t = self.target
        wait = min(t.connect_timeout, QUICK_LOOK_S) if self.unanswered else t.connect_timeout
        connect_kwargs: dict[str, object] = {
            "banner_timeout": wait,
            "auth_timeout": wait,
            "channel_timeout": wait,
        }
        if t.ssh_key:
            key = os.path.expanduser(t.ssh_key)
            if not os.path.isfile(key):
                why = not_regular(key) if os.path.exists(key) else None
                raise HostError(
                    f"ssh_key {t.ssh_key} {why or 'does not exist'}", target=t.name, step="connect"
                )
            try:  # a key is a few KiB of text: anything else is said, never read whole
                # (probe37bg M2, M3: bytes not UTF-8 were "a bug in ops", exit 4; 4 GiB
                # sparse was read whole, 100 s)
                read_bytes_bounded(key, max_bytes=SSH_KEY_MAX, what="ssh_key")
            except FileRefused as exc:  # (one that is no UTF-8 text too)
                raise HostError(exc.message, target=t.name, step="connect") from None
            except OSError as exc:
                why = f"ssh_key {t.ssh_key}: {exc.strerror or exc}"
                raise HostError(why, target=t.name, step="connect") from None
            connect_kwargs.update(key_filename=key, look_for_keys=False, allow_agent=False)
        config = Config(lazy=True, overrides={"load_ssh_configs": False})
        conn = Connection(
            host=t.address.strip("[]"),
            user=t.user,
            port=t.port,
            connect_timeout=max(1, int(wait)),
            connect_kwargs=connect_kwargs,
            config=config,
        )
        known = Path(os.path.expanduser(t.known_hosts))
        try:  # a regular file of a sane size (probe37ad M1-M3: a FIFO hung every command for
            # good, /dev/zero grew ops to GiBs, a directory was "a bug in ops")
            read_bytes_bounded(known, max_bytes=KNOWN_HOSTS_MAX, what="known_hosts")
            conn.client.load_host_keys(str(known))
        except FileNotFoundError:
            pass
        except FileRefused as exc:
            raise HostError(exc.message, target=t.name, step="connect") from None
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise HostError(f"known_hosts {known}: {why}", target=t.name, step="connect") from None
        policy = _StrictPolicy() if t.host_key_policy == "strict" else _AcceptNewPolicy(known)
        conn.client.set_missing_host_key_policy(policy)
        where = f"{t.address}:{t.port}"
        try:
            conn.open()
        except _UnknownHostKey as exc:
            raise HostKeyError(
                f"host key of {exc.hostname} ({_fingerprint(exc.key)}) is not in {known}",
                target=t.name,
                step="connect",
                hint="verify the key out of band and add it to known_hosts "
                f"(ssh-keyscan -p {t.port} {t.address}), or set host_key_policy = 'accept-new'",
            ) from None
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"HOST KEY MISMATCH for {where}: got {_fingerprint(exc.key)}, "
                f"{known} has {_fingerprint(exc.expected_key)}; refusing to connect",
                target=t.name,
                step="connect",
                hint="if the host was legitimately re-keyed, remove its old line from known_hosts",
            ) from None
        except paramiko.AuthenticationException as exc:
            raise AuthenticationFailed(
                f"{t.user or 'default user'}@{where} refused our key ({exc})",
                target=t.name,
                step="connect",
            ) from None
        except TimeoutError as exc:
            raise Unreachable(
                f"no answer from {where} within {wait:g}s",
                target=t.name,
                step="connect",
            ) from exc
        except paramiko.SSHException as exc:
            raise Unreachable(
                f"SSH handshake with {where} failed: {exc}", target=t.name, step="connect"
            ) from exc
        except (OSError, EOFError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unreachable(
                f"cannot connect to {where}: {reason}", target=t.name, step="connect"
            ) from exc
        self._conn = conn
        transport = conn.client.get_transport()
        assert transport is not None
        transport.set_keepalive(15)
        return transport

    def _channel(self, command: str) -> paramiko.Channel:
        try:
            transport = self._connect()
        except Unreachable:  # a host that left the last command unanswered: a short look next
            if self._unanswered:
                self._unanswered += 1
            raise
        wait = self.target.connect_timeout
        if self.unanswered:
            wait = min(wait, QUICK_LOOK_S)
        t0 = time.monotonic()
        try:
            chan = transport.open_session(timeout=wait)
            chan.exec_command(command)
            self._unanswered = 0
        except (paramiko.SSHException, OSError, EOFError) as exc:
            why = str(exc) or type(exc).__name__  # an EOFError of a dropped link says nothing
            dropped = isinstance(exc, EOFError) or not transport.is_active()
            # no answer for the whole wait on a live link: told by the time it took, not by
            # paramiko's wording ("Timeout opening channel.") alone
            waited_out = time.monotonic() - t0 >= 0.9 * wait
            if not dropped and (waited_out or "Timeout opening channel" in why):
                self._unanswered += 1
                self._let_go_frozen()  # the next command goes over a new connection
                if self.unanswered:
                    why = f"{why.rstrip('.')}: the host has stopped answering"
            if dropped:
                # the link's trouble, never the command's (probe37ah M1: a post-flight cut off
                # by it had its release marked rejected)
                raise Unreachable(
                    f"cannot start a command: {why} (the SSH connection was lost)",
                    target=self.name,
                    step="exec",
                ) from exc
            raise HostError(
                f"cannot start a command: {why}", target=self.name, step="exec"
            ) from exc
        return chan

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _let_go_frozen(self) -> None:
        """The connection opens no channel while its TCP link lives (its sshd session stopped:
        SIGSTOP, a hung host): closed, so the next command opens a new one where the host still
        answers (probe37bn M1: the SSH session frozen, ops asked where current was over it and
        said "unknown" though a new connection answered at once). Its channels close with it:
        the host processes on them (the revert guard, the lock holder) are not waited for; the
        host's own sshd, once let go, closes their pipes, and they end as when ops goes away."""
        with contextlib.suppress(Exception):  # (a link half gone: whatever closing it raises)
            self.close()
        self._conn = None

    # -- primitives -------------------------------------------------------------------
    def _exec(
        self, command: str, *, stdin: bytes | None, deadline_s: float
    ) -> tuple[int, Capped, Capped]:
        held = SignalsHeld()  # a Ctrl-C now is delivered inside the try below
        try:
            chan = self._channel(command)
        except BaseException:
            held.release()
            raise
        data = memoryview(stdin or b"")
        sent = 0
        out, err = Capped(STDOUT_MAX), Capped(STDERR_MAX)
        end = time.monotonic() + deadline_s
        last_look = False
        probe_after = max(QUIET_PROBE_S, 2 * self.target.connect_timeout)
        heard = time.monotonic()
        try:
            held.release()
            while True:
                if time.monotonic() - heard > probe_after:
                    if not self._answers():  # as a lost link: no exit status (-1), and why
                        self._unanswered += 1
                        why = (
                            f"ops: the host stopped answering: nothing came for {probe_after:g} "
                            f"s, and no new channel opened in {self.target.connect_timeout:g} s"
                        )
                        err.add(why.encode() + b"\n")
                        self._let_go_frozen()
                        return -1, out, err
                    heard = time.monotonic()
                busy = False
                if sent < len(data) and chan.send_ready():
                    sent += chan.send(data[sent : sent + CHUNK])  # then stdin stays open
                    busy = True
                if chan.recv_ready():
                    out.add(chan.recv(CHUNK))
                    busy = True
                    if out.flooded:  # ended there: the channel's close ends it on the host
                        err.add(out.flood_said())
                        return FLOOD_RC, out, err
                if chan.recv_stderr_ready():
                    err.add(chan.recv_stderr(CHUNK))
                    busy = True
                drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                if chan.exit_status_ready() and (chan.eof_received or chan.closed) and drained:
                    break
                if chan.closed and drained and not chan.exit_status_ready():
                    raise EOFError("the channel closed before the command's exit status came")
                if time.monotonic() > end and last_look:
                    return TIMEOUT_RC, out, err
                if time.monotonic() > end:
                    last_look, end = True, time.monotonic() + LAST_LOOK_S
                if busy:
                    heard = time.monotonic()
                else:
                    time.sleep(0.002)
            return chan.recv_exit_status(), out, err
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostError(f"connection lost: {exc}", target=self.name, step="exec") from exc
        finally:
            chan.close()  # before the command ended: its watcher kills it on the host

    def _answers(self) -> bool:
        """Whether the host still opens a channel (a probe, closed at once) within the target's
        connect_timeout; a connection already lost is left to the command's own channel."""
        transport = self._conn.client.get_transport() if self._conn is not None else None
        if transport is None or not transport.is_active():
            return True
        try:
            probe = transport.open_session(timeout=self.target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError):
            return not transport.is_active()
        probe.close()
        return True

    def _spawn(self, command: str) -> Proc:
        return _SshProc(self._channel(command), self)
