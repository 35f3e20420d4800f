"""The data-plane documents are what `checks.docs` says they are: each module run for real (the
stand-in service on loopback, nvidia-smi absent or present as the machine has it) prints a
document whose keys are its TypedDict's, required keys present, no key the type does not name;
and the checks package imports nothing outside the standard library."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from helpers import FAKE_SERVICE, REPO
from helpers.sshd import free_port

from checks import docs


def keys_match(doc: dict[str, Any], td: type, where: str, optional: frozenset[str] = frozenset()):
    required = td.__required_keys__ - optional  # type: ignore[attr-defined]
    allowed = required | td.__optional_keys__ | optional  # type: ignore[attr-defined]
    assert required <= doc.keys(), f"{where}: missing {sorted(required - doc.keys())}"
    assert doc.keys() <= allowed, f"{where}: not in {td.__name__}: {sorted(doc.keys() - allowed)}"


def run(module: str, *args: str, stdin: str | None = None) -> tuple[int, dict[str, Any]]:
    res = subprocess.run(
        [sys.executable, "-m", module, "--json", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res.returncode, json.loads(res.stdout)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_SERVICE), "--port", str(port), "--mode", "ok"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the stand-in service did not start"
                time.sleep(0.1)
        yield base
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_health_document(url: str) -> None:
    rc, doc = run("checks.health", "--url", url)
    assert rc == 0
    keys_match(doc, docs.HealthDoc, "checks.health")
    for row in doc["checks"]:
        keys_match(row, docs.HealthCheckRow, f"checks.health {row['name']}")


def test_identity_documents(url: str, tmp_path: Path) -> None:
    golden = tmp_path / "golden.json"
    rc, rec = run("checks.identity", "--url", url, "--record-golden", str(golden))
    assert rc == 0
    keys_match(rec, docs.IdentityDoc, "checks.identity --record-golden")
    assert {"recorded", "path", "golden"} <= rec.keys()
    rc, cmp = run("checks.identity", "--url", url, "--golden", str(golden), "--aa-runs", "1")
    assert rc == 0 and cmp["matched"] == cmp["total"] > 0
    keys_match(cmp, docs.IdentityDoc, "checks.identity --golden")
    for row in cmp["prompts"]:
        keys_match(row, docs.PromptRow, "checks.identity prompt")
    rc, bad = run("checks.identity", "--url", url, "--golden", "-", stdin="{}")
    assert rc == 2
    keys_match(bad, docs.BadInput, "checks.identity bad golden")


def test_loadtest_document(url: str) -> None:
    rc, doc = run("checks.loadtest", "--url", url, "--concurrency", "2", "--requests", "4")
    assert rc == 0
    keys_match(doc, docs.LoadtestDoc, "checks.loadtest")
    # `requests` and `warmup` are what ops.measure.loadtest adds to a level, not the module
    keys_match(doc["level"], docs.LevelDoc, "checks.loadtest level")
    assert "requests" not in doc["level"]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        keys_match(doc["level"][name], docs.Dist, name)
    keys_match(doc["level"]["accept_length"], docs.AcceptLength, "accept_length")
    assert "counters" not in doc["level"]
    args = ("--url", url, "--concurrency", "2", "--requests", "4", "--counters")
    rc, doc = run("checks.loadtest", *args)
    assert rc == 0
    keys_match(doc["level"], docs.LevelDoc, "checks.loadtest --counters level")
    window = doc["level"]["counters"]
    keys_match(window, docs.WindowCounters, "checks.loadtest counters")
    for end in ("start", "end"):
        keys_match(window[end], docs.Counters, f"checks.loadtest counters {end}")
    assert window["start"]["at"] < window["end"]["at"]
    assert window["start_lead_s"] >= 0 and window["end_lag_s"] >= 0


def test_probe_documents(url: str) -> None:
    rc, counters = run("checks.probe", "--url", url, "--counters")
    assert rc == 0
    keys_match(counters, docs.CountersDoc, "checks.probe --counters")
    cmd = [sys.executable, "-c", "print('{\"results\": []}')"]
    args = ("--url", url, "--before", "3", "--after", "2", "--threshold", "100")  # never trips
    rc, doc = run("checks.probe", *args, "--", *cmd)
    assert rc == 0 and doc["measured"] and not doc["tripped"]
    keys_match(doc, docs.ProbeDoc, "checks.probe")
    keys_match(doc["cmd"], docs.CmdRun, "checks.probe cmd")
    assert doc["cmd"]["document"] == {"results": []}
    for phase in ("before", "after"):
        keys_match(doc[phase], docs.Phase, phase)
    keys_match(doc["during"], docs.Phase, "during", optional=frozenset({"at_s"}))


def test_shadow_document(url: str) -> None:
    """checks.shadow against the stand-in service (no /shadow): the document's keys, refused."""
    rc, doc = run("checks.shadow", "--url", url, "--backend", "cuda", "--forwards", "4")
    assert rc == 1 and doc["offered"] is False
    keys_match(doc, docs.ShadowDoc, "checks.shadow")


def test_gpus_document() -> None:
    rc, doc = run("checks.gpus")
    assert rc in (0, 1)
    keys_match(doc, docs.GpusDoc, "checks.gpus")
    for row in doc["gpus"]:  # a machine with GPUs: every row and process is typed too
        keys_match(row, docs.GpuRow, "checks.gpus row")
        for p in row["processes"]:
            keys_match(p, docs.GpuProcess, "checks.gpus process")


def test_types_resolve_and_checks_import_only_the_standard_library() -> None:
    for name in dir(docs):
        obj = getattr(docs, name)
        if isinstance(obj, type) and hasattr(obj, "__required_keys__"):
            get_type_hints(obj)  # every annotation names something that exists
    code = (
        "import sys, pkgutil, importlib\n"
        "before = set(sys.modules)\n"
        "import checks\n"
        "for m in pkgutil.iter_modules(checks.__path__):\n"
        "    importlib.import_module('checks.' + m.name)\n"
        "new = {k.split('.')[0] for k in set(sys.modules) - before}\n"
        "print(sorted(new - {'checks'} - set(sys.stdlib_module_names)))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
