"""The CLI's own surface: `--version`, `-h` everywhere, flags shown without a `<bool>` type."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def ops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )


def test_version() -> None:
    res = ops("--version")
    assert res.returncode == 0 and res.stdout.startswith("ops (ddtree-ops) ")


@pytest.mark.parametrize("args", [(), ("healthcheck",), ("service", "stop"), ("hosts",)])
def test_short_help_and_plain_flags(args: tuple[str, ...]) -> None:
    res = ops(*args, "-h")
    assert res.returncode == 0, res.stderr
    assert "Usage: " in res.stdout and "<bool>" not in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("bench", "local", "--gpu", "-1"), "Invalid value for '--gpu'"),
        (("hosts", "--bogus"), "No such option: --bogus"),
        (("bogus",), "No such command 'bogus'"),
        (("report", "/x", "-c", "0"), "Invalid value for"),
    ],
)
def test_bad_flags_and_values_are_one_line(args: tuple[str, ...], says: str) -> None:
    res = ops(*args)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and says in res.stderr and "-h)" in res.stderr
    assert res.stdout == ""
    # with --json, one document on stdout too (probe37z L2: it printed nothing there)
    res = ops(*args, "--json")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"] == "UsageError" and says in doc["message"], doc


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("bench", "local", "--timeout", "inf"), "'--timeout': Input should be less than or equal"),
        (("bench", "local", "--probe-threshold", "inf"), "--probe-threshold: takes a finite"),
        (("service", "start", "local", "--wait", "inf"), "--wait: takes a finite number"),
        (("report", "/x", "--threshold", "nan"), "--threshold: takes a finite number, got nan"),
    ],
)
def test_numbers_that_are_not_finite_are_refused(tmp_path, args: tuple[str, ...], says) -> None:
    """click reads `inf` / `nan` as floats; they pass a min= and would land in a record as
    JSON's non-standard Infinity / NaN: exit 2, one line, before anything runs."""
    res = subprocess.run(
        [sys.executable, "-m", "ops", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "OPS_RUNS_DIR": str(tmp_path / "runs")},
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and says in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()  # no record was started


def test_no_command_shows_the_help() -> None:
    res = ops()
    assert res.returncode == 2 and "Commands:" in res.stdout and "Traceback" not in res.stderr


@pytest.mark.parametrize("args", [(), ("service",)])
def test_no_command_under_json_is_one_document(args: tuple[str, ...]) -> None:
    """`ops --json service` printed the group's help on stdout, not JSON (probe37ai L1): the
    document goes to stdout, the help or the line to stderr."""
    res = ops("--json", *args)
    assert res.returncode == 2 and ("Commands:" in res.stderr or "-h)" in res.stderr), res
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"] == "UsageError" and "command" in doc["message"]


def test_shared_options_before_or_after_the_command(tmp_path) -> None:
    """--json and --inventory live on the typer context: either place gives the same answer."""
    after, before = ops("hosts", "--json"), ops("--json", "hosts")
    assert after.returncode == before.returncode == 0
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert json.loads(before.stdout)["targets"][0]["name"] == "local"
    missing = str(tmp_path / "missing.toml")
    for args in (("hosts", "-i", missing), ("-i", missing, "hosts")):
        res = ops(*args)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert "missing.toml" in res.stderr and "Traceback" not in res.stderr


def test_shared_options_after_the_service_group(tmp_path) -> None:
    """`ops service --json status TARGET` was refused: no such option (probe37al L1)."""
    inv = tmp_path / "ops.toml"
    inv.write_text(f"[targets.local]\nremote_root = '{tmp_path / 'root'}'\n")
    res = ops("service", "--json", "-i", str(inv), "status", "local")
    assert "No such option" not in res.stderr, res.stderr
    assert json.loads(res.stdout)["state"] == "inactive", res.stdout


def test_inventory_on_the_command_line_wins_over_the_environment(tmp_path) -> None:
    """`-i` before the command beats $OPS_INVENTORY (the subcommand's copy of the option, filled
    from the environment, used to replace it silently: new-user pass, #39)."""
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text("[targets.aa]\naddress = '10.0.0.1'\n")
    b.write_text("[targets.bb]\naddress = '10.0.0.2'\n")
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin", "OPS_INVENTORY": str(a)}
    for args in (("-i", str(b), "hosts", "--json"), ("hosts", "-i", str(b), "--json")):
        res = subprocess.run(
            [sys.executable, "-m", "ops", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        names = [t["name"] for t in json.loads(res.stdout)["targets"]]
        assert "bb" in names and "aa" not in names, (args, names)
    res = subprocess.run(
        [sys.executable, "-m", "ops", "hosts", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "aa" in [t["name"] for t in json.loads(res.stdout)["targets"]]
