"""Inventory: the example parses, `local` always exists, every invalid input is one line naming
the file, the target and the field, and the CLI turns it into exit 2 without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.errors import InventoryError, UnknownTarget
from ops.hosts.inventory import LOCAL, load_inventory

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "playbooks" / "inventory.example.toml"


def ops(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "ops", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def test_example_inventory_has_ct200_and_a_group() -> None:
    inv = load_inventory(EXAMPLE)
    ct = inv.target("ct200")
    assert (ct.gpus, ct.cuda_arch, ct.bench_gpu) == (8, "sm_120", 7)
    assert (ct.service.name, ct.service.manager) == ("sglang-k26-ddtree", "systemd")
    assert ct.host_key_policy == "strict" and not ct.is_local
    assert [t.name for t in inv.resolve("fleet")] == ["ct200", "ct201"]
    assert inv.target(LOCAL).is_local


def test_without_inventory_only_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPS_INVENTORY", raising=False)
    inv = load_inventory(None)
    assert list(inv.targets) == [LOCAL]
    assert inv.target(LOCAL).service.manager == "process"
    with pytest.raises(UnknownTarget, match="unknown target 'ct200'; known: local"):
        inv.target("ct200")


def test_env_var_and_local_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "inv.toml"
    f.write_text(
        '[targets.local]\nremote_root = "/srv/x"\n[targets.local.service]\nurl = "http://127.0.0.1:31000"\n'
    )
    monkeypatch.setenv("OPS_INVENTORY", str(f))
    local = load_inventory(None).target(LOCAL)
    assert local.remote_root == "/srv/x"
    assert local.service.url == "http://127.0.0.1:31000"
    assert local.service.command and "-m engine" in local.service.command  # default kept


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[targets.ct200]\nport = 'abc'\n",
            "target 'ct200': port: Input should be a valid integer",
        ),
        ("[targets.ct200]\nport = 70000\n", "target 'ct200': port: Input should be less than"),
        ("[targets.ct200]\nprot = 22\n", "target 'ct200': prot: unknown field"),
        ("[targets.ct200]\nhost_key_policy = 'yolo'\n", "target 'ct200': host_key_policy:"),
        (
            "[targets.ct200]\ncuda_arch = 'hopper'\n",
            "target 'ct200': cuda_arch: must look",
        ),
        ("[targets.ct200]\ngpus = 2\nbench_gpu = 7\n", "bench_gpu 7 is not below gpus = 2"),
        ("[targets.ct200]\ngpus = true\n", "target 'ct200': gpus: takes a number"),
        (
            "[targets.ct200.service]\nstop_timeout = true\n",
            "service.stop_timeout: takes a number",
        ),
        ("[targets.ct200.service]\nmanager = 'docker'\n", "target 'ct200': service.manager:"),
        ("[targets.ct200]\naddress = 'a b; rm -rf /'\n", "target 'ct200': address: must be a host"),
        ("[targets.'bad name']\n", "target 'bad name': name must start"),
        # probe37ad L2: the rule said named only the characters; "-rf" is all of them
        ("[targets.'-rf']\n", "target '-rf': name must start with a letter or digit"),
        ("[targets.local]\naddress = '10.0.0.1'\n", "target 'local': address:"),
        # the SSH port is not the service's (#39 item 2): said where it is set, with the fix
        ("[targets.local]\nport = 31400\n", "target 'local': port: an SSH setting"),
        ("[targets.local]\nuser = 'me'\n", "[targets.local.service] url = 'http://127.0.0.1:PORT'"),
        ("[groups]\nfleet = ['ct9']\n", "group 'fleet': unknown target 'ct9'"),
        ("[target.ct200]\n", "unknown top-level table 'target'"),
        ("[targets.ct200\nport = 1\n", "invalid TOML"),
    ],
)
def test_invalid_inventory_names_file_target_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    f = tmp_path / "ops.toml"
    f.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_inventory(f)
    msg = info.value.message
    assert msg.startswith(f"{f}: ") and expected in msg and "\n" not in msg


def test_cli_malformed_inventory_is_one_line_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "ops.toml"
    f.write_text("[targets.ct200]\nport = 'abc'\n")
    res = ops("hosts", "--inventory", str(f))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert f"{f}: target 'ct200': port:" in res.stderr
    res = ops("hosts", "--json", "--inventory", str(f))
    assert res.returncode == 2 and json.loads(res.stdout)["error"] == "InventoryError"


def test_cli_missing_inventory_file(tmp_path: Path) -> None:
    res = ops("hosts", "--inventory", str(tmp_path / "nope.toml"))
    assert res.returncode == 2 and "inventory file not found" in res.stderr


def test_cli_hosts_json_lists_targets(tmp_path: Path) -> None:
    res = ops("hosts", "--json", "--inventory", str(EXAMPLE))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    names = [t["name"] for t in doc["targets"]]
    assert names[0] == "local" and "ct200" in names
    ct = next(t for t in doc["targets"] if t["name"] == "ct200")
    assert ct["address"] == "ct200.example.internal:22" and ct["transport"] == "ssh"
    assert (ct["gpus"], ct["cuda_arch"], ct["manager"]) == (8, "sm_120", "systemd")
    assert doc["groups"] == {"fleet": ["ct200", "ct201"]}


def test_cli_unknown_target_exit_2(tmp_path: Path) -> None:
    res = ops("facts", "ct999", "--inventory", str(EXAMPLE))
    assert res.returncode == 2
    assert "unknown target 'ct999'" in res.stderr and "Traceback" not in res.stderr
    assert "[targets.ct999]" in res.stderr  # the hint survives rich markup


@pytest.mark.parametrize(
    ("root", "why"),
    [
        ("/", "must not be '/'"),
        ("///", "must not be '/'"),
        ("/opt/../etc", "must be normalised"),
        ("/opt/./x", "must be normalised"),
        ("/opt//x", "must be normalised"),
        ("~ops/x", "must be an absolute path"),
        ("~/x", "must be an absolute path"),
        ("relative/x", "must be an absolute path"),
        ("/opt/x\nrm", "control characters"),
        ("/" + "a" * 200_000, "bytes long"),
    ],
    ids=lambda v: v[:20] if isinstance(v, str) else v,
)
def test_hostile_remote_roots_are_one_line_errors(tmp_path: Path, root: str, why: str) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text(f"[targets.h]\naddress = '127.0.0.1'\nremote_root = {json.dumps(root)}\n")
    res = ops("hosts", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "target 'h': remote_root:" in res.stderr and why in res.stderr
    assert len(res.stderr) < 600  # one line, the value is not echoed whole


def test_remote_root_and_service_name_limits(tmp_path: Path) -> None:
    """probe37c C3: a ~2,000-byte root overflowed the pidfile ops reads back; a 300-character
    name was refused only when the pidfile was written, after a deploy's switch. Both are
    refused at load, one line, exit 2, naming the field; the limits themselves load."""
    inv = tmp_path / "ops.toml"
    fits = "/" + "r" * 1023
    inv.write_text(
        f"[targets.h]\nremote_root = '{fits}'\n[targets.h.service]\nname = '{'n' * 128}'\n"
    )
    target = load_inventory(inv).target("h")
    assert target.remote_root == fits and target.service.name == "n" * 128
    for table, line, field, limit in [
        ("targets.h", "remote_root = '/" + "r" * 1024 + "'", "remote_root", "(at most 1024 bytes)"),
        ("targets.h", "remote_root = '/" + "ü" * 512 + "'", "remote_root", "(at most 1024 bytes)"),
        ("targets.h.service", "name = '" + "n" * 300 + "'", "service.name", "(at most 128)"),
    ]:
        inv.write_text(f"[{table}]\n{line}\n")
        res = ops("hosts", "--inventory", str(inv))
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1 and len(res.stderr) < 600, res.stderr
        assert f"target 'h': {field}: is " in res.stderr and limit in res.stderr, res.stderr


def test_remote_root_is_kept_normalised(tmp_path: Path) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text("[targets.h]\nremote_root = '/srv/ddtree/'\n")
    assert load_inventory(inv).target("h").remote_root == "/srv/ddtree"


def test_components_are_validated(tmp_path: Path) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text("[targets.h.service.components]\ntree_build = 'cuda'\naccept = 'cpp'\n")
    assert load_inventory(inv).target("h").service.components == {
        "tree_build": "cuda",
        "accept": "cpp",
    }
    inv.write_text("[targets.h.service.components]\ntree_build = 'gpu'\n")
    with pytest.raises(InventoryError, match="tree_build = 'gpu': must be one of"):
        load_inventory(inv)
    inv.write_text("[targets.h.service.components]\nsampler = 'cuda'\n")
    with pytest.raises(InventoryError, match="unknown component 'sampler'"):
        load_inventory(inv)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("url", "http://127.0.0.1:99999", "port must be 1-65535"),
        ("url", "http://127.0.0.1:0", "port must be 1-65535"),
        ("url", "http://127.0.0.1:abc", "port must be 1-65535"),
        ("url", "http://[::1", "not a valid URL"),
        ("url", "http://ops:secret@127.0.0.1:30000", "no user or password"),
        ("url", "http://127.0.0.1:30000/?x=1", "no query or fragment"),
        ("command", "{python} -m engine --port {port:>99999999999}", "plain {python}"),
        ("command", "{python.__class__} -m engine", "plain {python}"),
        ("command", "{port!r}", "plain {python}"),
        ("command", "{0} -m engine", "plain {python}"),
        ("command", "{python} {nope}", "plain {python}"),
        ("name", "-x", "must not start with '-'"),
    ],
)
def test_hostile_service_values_are_one_line_errors(
    tmp_path: Path, field: str, value: str, why: str
) -> None:
    """A service url, command or unit name that would crash, hang or inject later (a bad port
    in every check, a format spec allocating gigabytes, an option to systemctl) is refused
    when the inventory is read, in one line naming the field."""
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.h]\nremote_root = '/srv/x'\n[targets.h.service]\n{field} = {json.dumps(value)}\n"
    )
    res = ops("hosts", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"target 'h': service.{field}:" in res.stderr and why in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    assert "secret" not in res.stderr, res.stderr  # (probe37bj L1: the password was printed)


def test_service_url_with_a_path_and_the_default_port_is_kept(tmp_path: Path) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text("[targets.h.service]\nurl = 'https://llm.internal/v/'\n")
    assert load_inventory(inv).target("h").service.url == "https://llm.internal/v"


@pytest.mark.parametrize(
    ("table", "field", "value", "command"),
    [
        ("", "python", "/usr/bin/python3\u0000", "status"),
        ("", "python", "/usr/bin/python3\u001b[2J", "status"),
        (".service", "command", "{python} engine/svc.py --port {port} \u0000", "restart"),
        (".service", "command", "{python} engine/svc.py\nrm -rf /", "start"),
        (".service", "model", "m\u0000", "status"),
    ],
    ids=["python-nul", "python-esc", "command-nul", "command-newline", "model-nul"],
)
def test_control_characters_in_what_runs_are_refused_at_load(
    tmp_path: Path, table: str, field: str, value: str, command: str
) -> None:
    """probe37b B3: a NUL in `python` or `service.command` was 'internal error ... embedded
    null byte', exit 4, once a command ran it. Now the inventory is refused as it is read: exit
    2, one line naming the field, nothing run (no remote root made)."""
    root = tmp_path / "root"
    inv = tmp_path / "ops.toml"
    line = f"{field} = {json.dumps(value)}\n"
    inv.write_text(
        f"[targets.local]\nremote_root = '{root}'\n"
        + (f"[targets.local{table}]\n{line}" if table else line)
    )
    res = ops("service", command, "local", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    where = f"target 'local': {'service.' if table else ''}{field}: "
    assert where + "must not contain control characters" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert not root.exists()


def test_a_tab_in_the_command_is_plain_whitespace(tmp_path: Path) -> None:
    inv = tmp_path / "ops.toml"
    inv.write_text("[targets.h.service]\ncommand = '{python}\t-m engine --port {port}'\n")
    assert load_inventory(inv).target("h").service.command == "{python}\t-m engine --port {port}"


@pytest.mark.parametrize("command", ["", "   "])
def test_an_empty_service_command_is_refused_before_any_deploy(
    tmp_path: Path, command: str
) -> None:
    """probe37u U4 (low): `command = ''` passed the inventory; a deploy sent, self-tested and
    finalized a release, then exited 2 ("service.command is required"), one never-switched
    release per try. The inventory refuses it, and nothing is sent."""
    root = tmp_path / "root"
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{root}'\n[targets.local.service]\ncommand = '{command}'\n"
    )
    res = ops("deploy", "local", "--bootstrap", "--dry-run", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "command is empty" in res.stderr and not root.exists(), res.stderr


def test_two_targets_on_one_root_of_one_host_are_refused(tmp_path: Path) -> None:
    """probe37v V4 (medium): two targets on one host and one remote_root (different service
    ports) were accepted; they shared one lock, current and pidfile, and each one's hints took
    the other's service down. Acting on either is refused, naming both; others still work."""
    inv = tmp_path / "ops.toml"
    shared = "address = '10.0.0.5'\nremote_root = '/srv/ddtree'\n"
    inv.write_text(
        f"[targets.a]\n{shared}[targets.b]\n{shared}port = 22\n"
        "[targets.c]\naddress = '10.0.0.5'\nremote_root = '/srv/other'\n"
        "[groups]\nboth = ['a', 'c']\n"
    )
    for name in ("a", "b", "both"):
        res = ops("deploy", name, "--dry-run", "--inventory", str(inv))
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert "share remote_root /srv/ddtree on one host" in res.stderr, res.stderr
    assert load_inventory(inv).target("c").remote_root == "/srv/other"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("local", "address = '127.0.0.1'\nport = 2222\n"),
        ("address = '127.0.0.1'\nport = 2222\n", "address = 'localhost'\nport = 2222\n"),
        ("address = '::1'\n", "address = '127.0.0.2'\n"),
        # ssh's other spellings of this machine (probe37ap M1: each shared local's root)
        ("local", "address = '127.1'\n"),
        ("local", "address = '0'\n"),
        ("local", "address = '0x7f000001'\n"),
        ("address = '127.0.0.1'\nport = 2222\n", "address = '::ffff:127.0.0.1'\nport = 2222\n"),
    ],
)
def test_one_root_of_this_machine_is_seen_under_any_spelling(
    tmp_path: Path, first: str, second: str
) -> None:
    """probe37ab M2 (medium): `local` and an SSH target to 127.0.0.1, or two SSH targets to
    127.0.0.1 and localhost on one port, with one remote_root were accepted: a deploy of one
    switched the other's current under its running service. This machine is one host under
    every loopback spelling (and `local`); two loopback SSH targets on different ports (two
    containers, say) are two."""
    inv = tmp_path / "ops.toml"
    root = f"remote_root = '{tmp_path / 'root'}'\n"
    a = "[targets.local]\n" if first == "local" else f"[targets.a]\n{first}"
    inv.write_text(f"{a}{root}[targets.b]\n{second}{root}")
    res = ops("releases", "b", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"share remote_root {tmp_path / 'root'} on one host" in res.stderr, res.stderr
    if first.endswith("port = 2222\n"):  # another port: another sshd, maybe a container's
        inv.write_text(inv.read_text().replace("port = 2222\n", "port = 2223\n", 1))
        res = ops("releases", "b", "--inventory", str(inv))  # (nothing listens: unreachable)
        assert res.returncode == 2 and "share remote_root" not in res.stderr, res.stderr


def test_one_root_of_this_machine_is_seen_through_a_symlink(tmp_path: Path) -> None:
    """probe37ah L1: `local` on ROOT and an SSH target to this machine on a symlink to ROOT were
    two roots to a string compare; they are one directory, so one lock and one current."""
    (tmp_path / "root").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "root")
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n"
        f"[targets.b]\naddress = '127.0.0.1'\nremote_root = '{tmp_path / 'alias'}'\n"
    )
    res = ops("releases", "b", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"share remote_root {tmp_path / 'alias'} (as {tmp_path / 'root'}," in res.stderr


def test_an_empty_group_is_one_line_not_an_internal_error(tmp_path: Path) -> None:
    """probe37aj M1: `g = []` made `ops deploy g` an internal error (IndexError, exit 4)."""
    inv = tmp_path / "ops.toml"
    inv.write_text(f"[targets.local]\nremote_root = '{tmp_path / 'r'}'\n[groups]\ng = []\n")
    for verb in ("deploy", "rollback", "releases"):
        res = ops(verb, "g", "--inventory", str(inv))
        assert res.returncode == 2 and "Traceback" not in res.stderr, (verb, res.stderr)
        assert "internal error" not in res.stderr and res.stderr.count("\n") <= 2, res.stderr
        assert "'g'" in res.stderr and "no targets" in res.stderr, res.stderr
    assert ops("hosts", "--inventory", str(inv)).returncode == 0


def test_a_group_that_lists_a_target_twice_is_refused(tmp_path: Path) -> None:
    """probe37ai L3: `g = ["local", "local"]` acted on one host twice in one run."""
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.local]\nremote_root = '{tmp_path / 'r'}'\n[groups]\ng = ['local', 'local']\n"
    )
    res = ops("deploy", "g", "--dry-run", "--inventory", str(inv))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "group 'g': lists target 'local' twice" in res.stderr, res.stderr


def test_an_integer_of_thousands_of_digits_is_an_inventory_error(tmp_path: Path) -> None:
    """probe37ac L1: `gpus = 999...` (5000 digits) was an internal error, exit 4 (Python's
    limit on integer strings); it is the inventory's one-line error, exit 2."""
    inv = tmp_path / "ops.toml"
    inv.write_text(f"[targets.local]\nremote_root = '{tmp_path / 'r'}'\ngpus = {'9' * 5000}\n")
    res = ops("hosts", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "invalid TOML" in res.stderr and "internal error" not in res.stderr, res.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory"])
def test_a_known_hosts_that_is_no_file_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    """probe37ad M1-M3 (medium): `known_hosts` a FIFO hung every SSH command for good (Ctrl-C
    and SIGTERM too), /dev/zero grew ops to GiBs, a directory was "a bug in ops" (exit 4). It is
    read only as a regular file of a sane size: else one line, exit 2, before any connection."""
    known = {"fifo": tmp_path / "fifo", "zero": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(known)
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.t]\naddress = '127.0.0.1'\nport = 9\nremote_root = '/srv/t'\n"
        f"known_hosts = '{known}'\n"
    )
    res = ops("service", "status", "t", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"known_hosts {known}: not a regular file" in res.stderr, res.stderr


def test_what_the_user_typed_is_echoed_as_typed(tmp_path: Path) -> None:
    """probe37bf L1: rich read `:smile:` in an echoed target, ref or id as an emoji code."""
    for typed in (":smile:", ":smile:[bold]x"):
        res = ops("healthcheck", typed, "--inventory", str(EXAMPLE))
        assert res.returncode == 2 and f"unknown target '{typed}'" in res.stderr, res.stderr


@pytest.mark.parametrize("kind", ["not_utf8", "huge"])
def test_an_ssh_key_that_is_no_key_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    """probe37bg M2, M3 (medium): an `ssh_key` of bytes that are not UTF-8 was an internal
    error (exit 4) on every SSH command; a 4 GiB sparse one was read whole (100 s). Read as a
    regular text file of a key's size only: else one line, exit 2, before any connection."""
    key = tmp_path / "key"
    if kind == "not_utf8":
        key.write_bytes(b"\xff\xfe\x00garbage")
    else:
        with key.open("wb") as f:
            f.truncate(4 * 2**30)
    inv = tmp_path / "ops.toml"
    inv.write_text(
        f"[targets.t]\naddress = '127.0.0.1'\nport = 9\nremote_root = '/srv/t'\nssh_key = '{key}'\n"
    )
    res = ops("service", "status", "t", "--inventory", str(inv))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    said = "not UTF-8 text" if kind == "not_utf8" else "over the 1 MiB limit for this ssh_key"
    assert said in res.stderr, res.stderr
