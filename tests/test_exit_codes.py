"""Exit 1 means NO-GO or a failed check, and nothing else: the real `ops` CLI, as a process.

- A bench row whose time makes the speed-up overflow (`median_us = 5e-324`: a baseline over
  it is inf) is a bad record, exit 2 naming the file and the field, as any bad record value;
  it used to be a 68-line traceback and exit 1 (a NO-GO to any script reading the code).
- An exception no part of ops expected (a bug) is exit 4, one line on stderr
  (`internal error: <Type>: <message> (a bug in ops; ...)`) and, with `--json`, one JSON
  document with `"internal": true`; the traceback only with OPS_DEBUG=1. The command's record
  says `crashed` with the same code. The bug is injected into the real CLI process (the
  `python -c` below replaces one function of ops before `ops.cli.main` runs), since ops has
  no known one left; the exit path under test is ops's own.
- A Ctrl-C keeps 130 and a user error keeps 2 through the same entry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import ops_json, run_ops

RECORDS = Path(__file__).parent / "fixtures" / "records"
SEED = ("preflight_ok", "profile_tree", "rollout_tree")
INJECT = (
    "import sys, {module} as m\n"
    "def bug(*a, **k):\n"
    "    raise {exc}\n"
    "m.{name} = bug\n"
    "from ops.cli import main\n"
    "sys.argv[0] = 'ops'\n"
    "main()\n"
)


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs"), **extra}
    for key in ("OPS_INVENTORY", "OPS_DEBUG"):
        if key not in extra:
            env.pop(key, None)
    return env


def with_bug(
    tmp: Path, module: str, name: str, exc: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`ops ARGS` in a real process whose `module.name` raises `exc` (a bug ops did not expect)."""
    code = INJECT.format(module=module, name=name, exc=exc)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(tmp, **env),
        cwd=REPO,
    )


def tiny_time_bench(tmp: Path) -> Path:
    """bench_tree with every cuda_events row's times at 5e-324 us (the smallest float > 0)."""
    doc = json.loads((RECORDS / "bench_tree" / "record.json").read_text())
    for row in doc["bench"]["rows"]:
        if row["impl"] == "cuda_events":
            row["median_us"] = row["p25_us"] = row["p75_us"] = 5e-324
    d = tmp / "bench_tiny"
    d.mkdir()
    (d / "record.json").write_text(json.dumps(doc))
    return d


def test_an_overflowing_speedup_is_a_bad_record_not_a_no_go(tmp_path: Path) -> None:
    bench = tiny_time_bench(tmp_path)
    args = ("report", *(str(RECORDS / n) for n in SEED), str(bench))
    code, doc, err = ops_json(*args, "--out", str(tmp_path / "out"), env=env_for(tmp_path))
    assert code == 2, (code, doc, err)
    assert doc["ok"] is False and doc["error"] == "BadRecord", doc
    assert doc["file"] == str(bench / "record.json")
    assert doc["field"].startswith("bench.rows.") and doc["field"].endswith(".median_us"), doc
    assert "speed-up" in doc["message"] and "5e-324" in doc["message"], doc["message"]
    assert "Traceback" not in err
    res = run_ops(*args, env=env_for(tmp_path), cwd=REPO)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {bench / 'record.json'}: bench.rows."), lines
    assert not (tmp_path / "runs").exists()  # refused before a report was written


def test_a_speedup_recorded_as_infinity_is_a_bad_record(tmp_path: Path) -> None:
    doc = json.loads((RECORDS / "bench_tree" / "record.json").read_text())
    doc["bench"]["rows"][1]["speedup"] = {"cpu_python": float("inf")}
    d = tmp_path / "bench_inf"
    d.mkdir()
    (d / "record.json").write_text(json.dumps(doc))  # JSON's non-standard Infinity
    args = ("report", *(str(RECORDS / n) for n in SEED), str(d), "--out", str(tmp_path / "o"))
    code, doc, _ = ops_json(*args, env=env_for(tmp_path))
    assert code == 2 and doc["field"] == "bench.rows.1.speedup.cpu_python", doc


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_unexpected_exception_is_exit_4_and_one_line(tmp_path: Path, as_json: bool) -> None:
    flags = ("--json",) if as_json else ()
    res = with_bug(
        tmp_path,
        "ops.cli.common",
        "load_inventory",
        "ZeroDivisionError('injected')",
        "hosts",
        *flags,
    )
    assert res.returncode == 4, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "╭" not in res.stderr  # no (pretty) traceback
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("internal error: ZeroDivisionError: injected (a bug in ops;")
    assert "OPS_DEBUG=1" in lines[0]
    if as_json:
        doc = json.loads(res.stdout)
        assert doc["internal"] is True and doc["ok"] is False, doc
        assert doc["error"] == "ZeroDivisionError" and doc["message"] == "injected", doc
    else:
        assert res.stdout == ""


def test_the_traceback_comes_with_ops_debug(tmp_path: Path) -> None:
    res = with_bug(
        tmp_path, "ops.cli.common", "load_inventory", "KeyError('x')", "hosts", OPS_DEBUG="1"
    )
    assert res.returncode == 4
    assert "Traceback (most recent call last)" in res.stderr and "in bug" in res.stderr
    assert "internal error: KeyError: 'x' (a bug in ops;" in res.stderr
    assert "locals" not in res.stderr.lower()  # a plain traceback: no local variables shown


def test_a_command_that_crashes_records_it_with_exit_4(tmp_path: Path) -> None:
    res = with_bug(
        tmp_path,
        "ops.hosts.facts",
        "gather_facts",
        "RuntimeError('boom')",
        "facts",
        "local",
        "--json",
    )
    assert res.returncode == 4, res.stderr
    assert json.loads(res.stdout)["internal"] is True
    (run,) = (tmp_path / "runs").iterdir()
    rec = json.loads((run / "record.json").read_text())
    assert rec["outcome"] == "crashed" and rec["exit_code"] == 4, rec
    assert rec["error"] == {"error": "RuntimeError", "message": "boom"}


def test_ctrl_c_and_user_errors_keep_their_codes(tmp_path: Path) -> None:
    res = with_bug(tmp_path, "ops.cli.common", "load_inventory", "KeyboardInterrupt", "hosts")
    assert res.returncode == 130 and "interrupted" in res.stderr, res.stderr
    assert "internal error" not in res.stderr
    missing = tmp_path / "nope.toml"
    code, doc, err = ops_json("hosts", inventory=missing, env=env_for(tmp_path), cwd=REPO)
    assert code == 2 and doc["error"] == "InventoryError" and "internal" not in doc, doc
    assert "internal error" not in err
