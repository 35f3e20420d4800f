"""Targets and groups: the inventory file (`ops.toml`) validated with pydantic, plus `local`.

Where the inventory comes from, first match wins: ``--inventory PATH``, ``$OPS_INVENTORY``,
``./ops.toml``; with none of them, the inventory holds only the target ``local``. An invalid
file raises `InventoryError` naming the file, the target and the field, in one line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import string
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from checks.vocabulary import COMPONENTS
from ops.errors import InventoryError, UnknownTarget
from ops.files import MIB, FileRefused, read_text_bounded
from ops.verdict.numbers import NoBoolNumbers

LOCAL = "local"
DEFAULT_INVENTORY = "ops.toml"
INVENTORY_MAX_BYTES = 4 * MIB  # an inventory of a thousand targets is ~200 KB
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?\Z")
LOCAL_PORT = 30000
COMMAND_FIELDS = ("python", "host", "port")  # placeholders of a `process` service's command
MAX_REMOTE_ROOT = 1024  # bytes: every path ops makes under it (releases/ID/..., the pidfile) fits
MAX_SERVICE_NAME = 128  # its pidfile and log (`run/NAME.pid.tmpPID`) are file names of <= 255 bytes
COMPONENT_KINDS = COMPONENTS  # DDTree components and their backends (checks.vocabulary)


def default_local_root() -> str:
    """Where the `local` target keeps releases, golden sets, service state and its lock."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return os.path.abspath(os.path.join(base, "ddtree-ops", "local"))


class _Model(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Service(_Model):
    """The inference service on a target and how it is managed."""

    name: str = "ddtree-engine"
    manager: Literal["systemd", "process"] = "process"
    url: str = f"http://127.0.0.1:{LOCAL_PORT}"
    model: str = "ddtree-reference"
    # `process` manager only: the command ops starts detached, run from current/, with
    # {python}, {host}, {port} substituted.
    command: str | None = None
    # seconds between TERM and KILL when the `process` manager stops the service
    stop_timeout: float = Field(default=20.0, gt=0, le=600)
    # which backend each DDTree component runs on (the release's service.env carries it):
    # tree_build / accept = reference | cpp | cuda, topk = reference | cuda,
    # attention = torch | cuda
    components: dict[str, str] = Field(default_factory=dict)
    # the SGLang import hook's setting for the release (DDTREE_OPS_SGLANG; docs/real-service.md):
    # `measure` (count and time the fork's functions), `shadow:COMPONENT=KIND[/N]` (the
    # candidate beside the stock on one call in N), `off`; default: from `components`
    hook: str | None = None

    @field_validator("hook")
    @classmethod
    def _hook(cls, v: str | None) -> str | None:
        if v is not None and not HOOK_RE.fullmatch(v):
            raise ValueError(
                f"{v!r}: one of off, measure, shadow:COMPONENT=KIND[/N] "
                "(e.g. shadow:tree_build=cpp/8), or COMPONENT=KIND[,COMPONENT=KIND]"
            )
        return v

    @field_validator("components")
    @classmethod
    def _components(cls, v: dict[str, str]) -> dict[str, str]:
        for comp, kind in v.items():
            if comp not in COMPONENT_KINDS:
                known = ", ".join(COMPONENT_KINDS)
                raise ValueError(f"unknown component {comp!r} (known: {known})")
            if kind not in COMPONENT_KINDS[comp]:
                kinds = " | ".join(COMPONENT_KINDS[comp])
                raise ValueError(f"{comp} = {kind!r}: must be one of {kinds}")
        return v

    @field_validator("name")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        if len(v) > MAX_SERVICE_NAME:
            raise ValueError(f"is {len(v)} characters long (at most {MAX_SERVICE_NAME})")
        if not re.fullmatch(r"[A-Za-z0-9@_.:-]+", v):
            raise ValueError("must be a plain unit name (letters, digits, @ _ . : -)")
        if v.startswith("-"):
            raise ValueError("must not start with '-' (systemctl would take it for an option)")
        return v

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v) or any(c.isspace() or ord(c) < 32 for c in v):
            raise ValueError("must be an http(s):// URL")
        try:
            parts = urllib.parse.urlsplit(v)
        except ValueError as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        if not parts.hostname:
            raise ValueError("must name a host (http://HOST:PORT)")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must hold no user or password (it would be written to records)")
        if parts.query or parts.fragment:
            raise ValueError("must have no query or fragment (paths are appended to it)")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port is not None and not 1 <= port <= 65535:
            raise ValueError("port must be 1-65535")
        return v.rstrip("/")

    @field_validator("model")
    @classmethod
    def _plain_model(cls, v: str) -> str:
        return no_control_characters(v)

    @field_validator("command")
    @classmethod
    def _placeholders(cls, v: str | None) -> str | None:
        """Only plain {python}, {host}, {port}: a format spec or attribute ('{port:>999999999}',
        '{python.__class__}') would allocate, leak or mangle the command when it is filled in.
        No control characters: a NUL cannot be passed to a process at all, and a newline would
        end the `exec` line the process manager runs it as (a tab is plain shell whitespace)."""
        if v is not None:
            no_control_characters(v, allow="\t")
        allowed = "only plain {python}, {host}, {port} (write {{ and }} for a brace)"
        try:
            fields = [f[1:] for f in string.Formatter().parse(v or "") if f[1] is not None]
        except ValueError as exc:
            raise ValueError(f"{exc}: {allowed}") from None
        for name, spec, conv in fields:
            if name not in COMMAND_FIELDS or spec or conv:
                shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
                shown = shown + "}" if len(shown) < 30 else shown[:26] + "...}"
                raise ValueError(f"placeholder {shown}: {allowed}")
        return v

    @model_validator(mode="after")
    def _process_needs_command(self) -> Service:
        if self.manager == "systemd" and self.command is not None:
            raise ValueError("command is only for manager = 'process' (systemd runs its own unit)")
        if self.manager == "process" and self.command is not None and not self.command.strip():
            # refused here, not after a deploy has sent and finalized a release (probe37u U4)
            raise ValueError("command is empty: the process manager needs the service's command")
        return self


def default_local_service() -> Service:
    return Service(
        command=("{python} -m engine --host {host} --port {port} --preset tiny --mode ddtree"),
    )


HOOK_RE = re.compile(
    r"off|measure|shadow:[a-z_]+=[A-Za-z0-9_.:]+(/[1-9][0-9]{0,5})?"
    r"|[a-z_]+=[A-Za-z0-9_]+(,[a-z_]+=[A-Za-z0-9_]+)*"
)
SSH_FIELDS = ("port", "user", "ssh_key", "host_key_policy", "known_hosts")  # not for local


class Target(_Model):
    """One host ops can act on: how to reach it and what runs there."""

    name: str
    address: str = "127.0.0.1"
    user: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    ssh_key: str | None = None
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout: float = Field(default=10.0, gt=0, le=300)
    python: str = "python3"
    remote_root: str = "/opt/ddtree-ops"
    gpus: int = Field(default=0, ge=0, le=64)
    cuda_arch: str | None = None
    bench_gpu: int | None = Field(default=None, ge=0)
    # seconds a deploy's self-test may run on the host before it is stopped and the step fails
    selftest_timeout: float = Field(default=600.0, gt=0, le=86400)
    service: Service = Field(default_factory=Service)

    @property
    def is_local(self) -> bool:
        """`local` runs commands as subprocesses of ops; every other target goes over SSH."""
        return self.name == LOCAL

    @field_validator("cuda_arch")
    @classmethod
    def _arch(cls, v: str | None) -> str | None:
        if v is not None and not ARCH_RE.match(v):
            raise ValueError("must look like 'sm_90' or 'sm_120'")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+|\[[0-9A-Fa-f:.]+\]", v):
            raise ValueError("must be a host name or an IP address")
        return v

    @field_validator("remote_root")
    @classmethod
    def _absolute_root(cls, v: str) -> str:
        return check_remote_root(v)

    @field_validator("python", "user", "ssh_key", "known_hosts")
    @classmethod
    def _no_control(cls, v: str | None) -> str | None:
        """Each is passed as an argument (ssh's, the host's shell's): a NUL cannot be, and other
        control characters are never meant (probe37b B3: a NUL was an internal error)."""
        return v if v is None else no_control_characters(v)

    @model_validator(mode="after")
    def _bench_gpu_in_range(self) -> Target:
        if self.bench_gpu is not None and self.gpus and self.bench_gpu >= self.gpus:
            raise ValueError(f"bench_gpu {self.bench_gpu} is not below gpus = {self.gpus}")
        return self


def no_control_characters(v: str, allow: str = "") -> str:
    """`v` unless it holds a control character (other than those in `allow`): refused, naming
    the first one and where it is."""
    for i, c in enumerate(v):
        if (ord(c) < 32 or c == "\x7f") and c not in allow:
            raise ValueError(f"must not contain control characters ({c!r} at offset {i})")
    return v


def check_remote_root(v: str) -> str:
    """A remote root is a normalised absolute path other than `/` (everything ops writes or
    deletes on a host stays inside it, so `/`, `..`, `~user` and odd characters are refused)."""
    size = len(v.encode("utf-8", "surrogatepass"))
    if size > MAX_REMOTE_ROOT:
        raise ValueError(f"is {size} bytes long (at most {MAX_REMOTE_ROOT} bytes)")
    if not v.startswith("/"):
        raise ValueError("must be an absolute path (starting with '/')")
    no_control_characters(v)
    parts = v.rstrip("/").split("/")[1:]
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError("must be normalised (no '//', '.' or '..' segments)")
    if not parts:
        raise ValueError("must not be '/' (ops writes and deletes under it)")
    return "/" + "/".join(parts)


def builtin_local() -> Target:
    """The target that always exists: this machine, no SSH, the reference engine as its service."""
    return Target(
        name=LOCAL,
        python=sys.executable,
        remote_root=default_local_root(),
        service=default_local_service(),
    )


class Inventory(_Model):
    """All targets (always including `local`) and the groups over them."""

    path: Path | None = None
    targets: dict[str, Target]
    groups: dict[str, list[str]] = Field(default_factory=dict)

    def target(self, name: str) -> Target:
        if name not in self.targets and name in self.groups:
            members = ", ".join(self.groups[name]) or "no targets"
            raise UnknownTarget(
                f"'{name}' is a group ({members}); this command takes one target",
                hint=f"name one of its targets, e.g. {self.groups[name][0]}"
                if self.groups[name]
                else None,
            )
        try:
            found = self.targets[name]
        except KeyError:
            raise UnknownTarget(
                f"unknown target {name!r}; known: {', '.join(sorted(self.targets))}",
                hint=f"add [targets.{name}] to {self.path or DEFAULT_INVENTORY}"
                if NAME_RE.match(name)
                else None,
            ) from None
        self.own_root(found)
        return found

    def own_root(self, target: Target) -> None:
        """Refuse a target whose remote root another target of this inventory shares on the same
        host: one lock, one `current`, one pidfile for two services, each command's hints taking
        the other's service down (probe37v V4)."""
        others = (t for t in self.targets.values() if t is not target)
        twin = next((t for t in others if _same(t, target)), None)
        if twin is not None:
            ssh = next((t for t in (target, twin) if not t.is_local), None)
            here = (
                f" ({ssh.name}'s address {ssh.address} is this machine: one that reaches a "
                "container is taken for this machine too)"
                if ssh is not None and this_machine(ssh.address)
                else ""
            )
            link = (
                f" (as {twin.remote_root}, one directory through a link)"
                if os.path.normpath(twin.remote_root) != os.path.normpath(target.remote_root)
                else ""
            )
            raise InventoryError(
                f"targets {target.name!r} and {twin.name!r} share remote_root "
                f"{target.remote_root}{link} on one host: they would share one lock, one current "
                f"and one pidfile; give each target a remote_root of its own{here}"
            )

    def resolve(self, name: str) -> list[Target]:
        """A target name gives that target; a group name gives its members in order."""
        if name in self.groups:
            if not self.groups[name]:  # (probe37aj M1: a deploy of it was an internal error)
                raise UnknownTarget(
                    f"group {name!r} has no targets",
                    hint=f"list its targets under [groups] in {self.path or DEFAULT_INVENTORY}",
                )
            members = [self.targets[m] for m in self.groups[name]]
            for t in members:
                self.own_root(t)
            return members
        if name not in self.targets:
            groups = f"; groups: {', '.join(sorted(self.groups))}" if self.groups else ""
            raise UnknownTarget(
                f"unknown target or group {name!r}; targets: "
                f"{', '.join(sorted(self.targets))}{groups}",
                hint=f"add [targets.{name}] to {self.path or DEFAULT_INVENTORY}"
                if NAME_RE.match(name)
                else None,
            )
        return [self.target(name)]


def inventory_path(explicit: str | os.PathLike[str] | None) -> Path | None:
    """The file to read: explicit path, then $OPS_INVENTORY, then ./ops.toml if it exists."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("OPS_INVENTORY")
    if env:
        return Path(env).expanduser()
    here = Path(DEFAULT_INVENTORY)
    return here if here.is_file() else None


def load_inventory(explicit: str | os.PathLike[str] | None = None) -> Inventory:
    path = inventory_path(explicit)
    if path is None:
        return Inventory(targets={LOCAL: builtin_local()})
    try:
        raw = tomllib.loads(
            read_text_bounded(path, max_bytes=INVENTORY_MAX_BYTES, what="inventory")
        )
    except FileRefused as exc:
        raise InventoryError(f"{path}: cannot read inventory: {exc.problem}") from None
    except FileNotFoundError:
        raise InventoryError(f"{path}: inventory file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read inventory: {exc}") from None
    except ValueError as exc:  # TOMLDecodeError, and an integer of thousands of digits
        raise InventoryError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # nesting ops.files did not see as brackets
        raise InventoryError(f"{path}: cannot read inventory: nested too deeply") from None
    return parse_inventory(raw, path)


def parse_inventory(raw: dict[str, Any], path: Path) -> Inventory:
    unknown = set(raw) - {"targets", "groups"}
    if unknown:
        raise InventoryError(
            f"{path}: unknown top-level table {sorted(unknown)[0]!r} "
            "(expected [targets.NAME] and [groups])"
        )
    targets_raw = raw.get("targets", {})
    if not isinstance(targets_raw, dict):
        raise InventoryError(f"{path}: 'targets' must be a table of [targets.NAME] tables")
    targets: dict[str, Target] = {LOCAL: builtin_local()}
    for name, fields in targets_raw.items():
        if not NAME_RE.match(name):
            raise InventoryError(
                f"{path}: target {name!r}: name must start with a letter or digit, then "
                "letters, digits, '_', '.', '-' (at most 63)"
            )
        if not isinstance(fields, dict):
            raise InventoryError(f"{path}: target {name!r}: must be a table")
        base = builtin_local().model_dump() if name == LOCAL else {}
        if name == LOCAL and "address" in fields:
            raise InventoryError(f"{path}: target 'local': address: 'local' is always this machine")
        ssh = [k for k in SSH_FIELDS if k in fields] if name == LOCAL else []
        if ssh:  # `port` looks like the service's and is the SSH port: said, never ignored
            raise InventoryError(
                f"{path}: target 'local': {ssh[0]}: an SSH setting, and `local` runs its "
                "commands on this machine with no SSH; to move local's service, set its URL: "
                "[targets.local.service] url = 'http://127.0.0.1:PORT'"
            )
        merged = {**base, **fields, "name": name}
        if name == LOCAL and "service" in fields and isinstance(fields["service"], dict):
            merged["service"] = {**base["service"], **fields["service"]}
            if fields["service"].get("manager") == "systemd" and "command" not in fields["service"]:
                merged["service"].pop("command", None)  # the built-in engine command is ours
        try:
            targets[name] = Target.model_validate(merged)
        except ValidationError as exc:
            raise InventoryError(_describe(path, f"target {name!r}", exc)) from None
    groups_raw = raw.get("groups", {})
    if not isinstance(groups_raw, dict):
        raise InventoryError(f"{path}: [groups] must map a group name to a list of targets")
    groups: dict[str, list[str]] = {}
    for gname, members in groups_raw.items():
        if not NAME_RE.match(gname) or gname in targets:
            raise InventoryError(f"{path}: group {gname!r}: invalid name or same as a target")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise InventoryError(f"{path}: group {gname!r}: must be a list of target names")
        missing = [m for m in members if m not in targets]
        if missing:
            raise InventoryError(f"{path}: group {gname!r}: unknown target {missing[0]!r}")
        twice = next((m for i, m in enumerate(members) if m in members[:i]), None)
        if twice is not None:  # it would act on one host twice in one run (probe37ai L3)
            raise InventoryError(f"{path}: group {gname!r}: lists target {twice!r} twice")
        groups[gname] = list(members)
    return Inventory(path=path, targets=targets, groups=groups)


LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def this_machine(address: str) -> bool:
    """An SSH address that reaches this machine as written: a loopback name, this machine's own
    host name, or an address in any spelling ssh takes (read as ssh reads it, with no DNS
    asked: `127.1`, `0`, `2130706433`, `0x7f000001`, `::ffff:127.0.0.1`) that is a loopback,
    the unspecified address, or one of this machine's own (probe37ap M1: `127.1` shared
    local's root unrefused, and a restart through it left local's service down)."""
    name = address.lower().strip("[]")
    if name in LOOPBACK_NAMES or name == socket.gethostname().lower():
        return True
    try:
        found = socket.getaddrinfo(name, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return False  # a host name: no DNS is asked
    return any(_own_address(str(info[4][0])) for info in found)


def _own_address(text: str) -> bool:
    """A numeric address that reaches this machine: loopback, unspecified (`0.0.0.0`, `::`,
    as an IPv4-mapped IPv6 address too), or one a socket here can bind (its own interfaces)."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((str(ip), 0))
    except OSError:
        return False
    return True


def _same(a: Target, b: Target) -> bool:
    """`a` and `b` name one remote root on one host: both `local`; `local` and an SSH target to
    this machine (any port: probe37ab M2); two SSH targets to this machine on one port (any
    spelling: 127.0.0.1, localhost, ::1); or the same SSH address and port. On this machine the
    roots are compared through their symlinks (probe37ah L1); two names of one remote host (DNS
    aliases), or one remote root through a link there, are not told apart."""
    here = all(t.is_local or this_machine(t.address) for t in (a, b))
    if (a.is_local or b.is_local) and not here:
        return False
    root = os.path.realpath if here else os.path.normpath
    if root(a.remote_root) != root(b.remote_root):
        return False
    if a.is_local or b.is_local:
        return True  # both on this machine (`here`)
    if here:
        return a.port == b.port
    return (a.address.lower(), a.port) == (b.address.lower(), b.port)


def no_userinfo(text: str) -> str:
    """`text` with each URL's user:password (between `://` and an `@` before the next `/`) as
    `***`; linear in the text (a regular expression backtracked on a long root: CI timed out)."""
    out, done = [], 0
    i = text.find("://")
    while i >= 0:
        start = i + 3
        slash = text.find("/", start)
        at = text.rfind("@", start, slash if slash >= 0 else len(text))
        if at >= 0:
            out += [text[done:start], "***"]
            done = at
        i = text.find("://", max(start, at))
    return "".join([*out, text[done:]])


def _describe(path: Path, where: str, exc: ValidationError) -> str:
    """One line: file, target, field, what is wrong (the first error; a count of the rest)."""
    errors = exc.errors()
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"]) or "(table)"
    msg = first["msg"].removeprefix("Value error, ")  # our validator's words, as written
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif "input" in first and not isinstance(first["input"], dict):
        got = no_userinfo(repr(first["input"]))  # (probe37bj L1: a refused url's password
        # was printed in the very line that refused it for records)
        msg = f"{msg} (got {got[:60] + '...' if len(got) > 64 else got})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{path}: {where}: {field}: {msg}{more}"
