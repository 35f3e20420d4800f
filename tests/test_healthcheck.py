"""`ops service` and `ops healthcheck` end to end through the real CLI, against real HTTP services
started by ops's own `process` manager: a healthy one passes; a stopped one, one answering
500, one answering garbage, one that hangs and one whose greedy output changed each fail
with the named check and its evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import run_ops
from helpers.local import Ops
from helpers.sshd import free_port


def failed_check(doc: dict, name: str) -> dict:
    (check,) = [c for c in doc["checks"] if c["name"] == name]
    assert check["status"] == "fail", check
    return check


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    o.configure()
    yield o
    o.stop()


def test_service_lifecycle_and_healthcheck_pass(ops: Ops) -> None:
    code, st = ops.json("service", "status", "local")
    assert code == 1 and st["state"] == "inactive"
    code, st = ops.json("service", "start", "local")
    assert code == 0 and st["state"] == "active" and st["pid"]
    code, again = ops.json("service", "start", "local")  # idempotent: same process
    assert code == 0 and again["pid"] == st["pid"]

    code, rec = ops.json("healthcheck", "local", "--record-golden")
    assert code == 0, rec
    golden = ops.tmp / "root" / "golden" / "golden.json"
    doc = json.loads(golden.read_text())
    assert len(doc["prompts"]) >= 32 and doc["model"] == "fake"
    assert all(len(p["token_ids"]) == 32 for p in doc["prompts"])

    code, rep = ops.json("healthcheck", "local", "--aa-runs", "1")
    assert code == 0, rep["failed"]
    statuses = {c["name"]: c["status"] for c in rep["checks"]}
    assert statuses == {
        "service": "pass",
        "health": "pass",
        "health_generate": "pass",
        "models": "pass",
        "smoke": "pass",
        "server_info": "skip",
        "identity": "pass",
        "gpus": "skip",
        "hook": "skip",
    }
    assert rep["modules"]["identity"]["identity_pct"] == 100.0
    smoke = next(c for c in rep["checks"] if c["name"] == "smoke")
    assert "the words are not judged" in smoke["detail"], smoke  # noise is no failure (#39)
    record = json.loads((Path(rep["run_dir"]) / "record.json").read_text())
    assert record["outcome"] == "pass" and record["command"] == "healthcheck"

    res = ops("healthcheck", "local")  # the human view
    assert res.returncode == 0 and "PASS" in res.stdout

    code, st = ops.json("service", "stop", "local")
    assert code == 0 and st["state"] == "inactive"
    code, rep = ops.json("healthcheck", "local")
    assert code == 1
    assert "service" in rep["failed"] and "health" in rep["failed"]
    assert "connection refused" in failed_check(rep, "health")["evidence"][0]


def test_changed_greedy_output_names_first_divergence(ops: Ops) -> None:
    assert ops.json("service", "start", "local")[0] == 0
    assert ops.json("healthcheck", "local", "--record-golden")[0] == 0
    ops.configure(salt="another build")
    assert ops.json("service", "restart", "local")[0] == 0
    code, rep = ops.json("healthcheck", "local")
    assert code == 1 and rep["failed"] == ["identity"]
    check = failed_check(rep, "identity")
    assert check["detail"].startswith("0/34 prompts token-identical")
    assert "first divergence at token 0: golden [" in check["evidence"][0]
    res = ops("healthcheck", "local")
    assert res.returncode == 1 and "identity evidence" in res.stderr


@pytest.mark.parametrize(
    ("mode", "check", "evidence"),
    [
        ("500", "health", "HTTP 500"),
        ("garbage", "smoke", "definitely not json"),
        ("hang", "smoke", "timeout after 1s"),
    ],
)
def test_misbehaving_service_fails_with_evidence(ops: Ops, mode: str, check: str, evidence: str):
    ops.configure(mode=mode)
    code, st = ops.json("service", "start", "local", "--wait", "3")
    if mode == "500":
        assert code == 1 and st["state"] == "failed" and "HTTP 500" in st["detail"]
    else:
        assert code == 0
    code, rep = ops.json("healthcheck", "local", "--timeout", "1")
    assert code == 1 and check in rep["failed"]
    assert evidence in " ".join(failed_check(rep, check)["evidence"])
    if mode == "hang":  # probe37g G3: nothing more is asked of a service that left one unanswered
        checks = {c["name"]: c for c in rep["checks"]}
        said = "not tried: /v1/completions got no answer (timeout after 1s)"
        assert checks["server_info"] == {**checks["server_info"], "status": "skip", "detail": said}
        assert checks["identity"]["status"] == "skip", checks["identity"]
        assert checks["identity"]["detail"].startswith("not tried: smoke got no answer")


def test_bad_golden_file_is_exit_2(ops: Ops) -> None:
    assert ops.json("service", "start", "local")[0] == 0
    bad = ops.tmp / "bad.json"
    bad.write_text("{not json")
    res = ops("healthcheck", "local", "--golden", str(bad))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = ops("healthcheck", "local", "--golden", str(ops.tmp / "missing.json"))
    assert res.returncode == 2 and "cannot read golden file" in res.stderr


def test_dead_service_is_failed_with_its_log(ops: Ops) -> None:
    code, st = ops.json("service", "start", "local")
    assert code == 0
    os.kill(st["pid"], 9)  # dies behind ops's back
    for _ in range(50):
        code, st2 = ops.json("service", "status", "local")
        if st2["state"] == "failed":
            break
    assert code == 1 and st2["state"] == "failed" and "stale pidfile" in st2["detail"]
    assert any("ops start:" in line for line in st2["evidence"])
    code, st3 = ops.json("service", "start", "local")  # a stale pidfile does not block a start
    assert code == 0 and st3["pid"] != st["pid"]


def test_second_service_change_is_refused_while_locked(ops: Ops) -> None:
    from ops.hosts.inventory import load_inventory
    from ops.hosts.remote import open_host

    target = load_inventory(ops.inventory).target("local")
    with open_host(target).lock("deploy in progress"):
        res = ops("service", "start", "local")
    assert res.returncode == 2
    assert "host lock held by" in res.stderr and "deploy in progress" in res.stderr


def test_ops_serve_runs_the_engine_in_the_foreground(tmp_path: Path) -> None:
    import time
    import urllib.request

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops", "serve", "--port", str(port), "--mode", "ar"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        info = None
        for _ in range(240):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/get_server_info", timeout=1
                ) as r:
                    info = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.25)
        assert info is not None and info["mode"] == "ar"
    finally:
        proc.terminate()
        proc.wait(30)
    deadline = time.monotonic() + 0.5  # within half a second of ops serve's exit
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
        except OSError:
            break
        time.sleep(0.05)
    with pytest.raises(OSError):  # the engine itself got the signal: nothing listens any more
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
    res = run_ops("serve", "--mode", "fast", timeout=60)
    assert res.returncode == 2 and "--mode must be 'ar' or 'ddtree'" in res.stderr


@pytest.mark.parametrize(("ids", "compared"), [("native", "ids"), ("none", "text")])
def test_identity_without_ids_in_completions(ops: Ops, ids: str, compared: str) -> None:
    ops.configure(ids=ids)
    assert ops.json("service", "start", "local")[0] == 0
    assert ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "6")[0] == 0
    ops.configure(ids=ids, salt="changed")
    assert ops.json("service", "restart", "local")[0] == 0
    code, rep = ops.json("healthcheck", "local")
    ident = rep["modules"]["identity"]
    # (once, under a full suite's load, this returned 0; the report says why if it does again)
    assert code == 1 and {p["compared"] for p in ident["prompts"]} == {compared}, rep
    warned = any("compared text" in w for w in ident["warnings"])
    assert warned == (compared == "text")


def test_aa_runs_separate_service_noise_from_the_change(ops: Ops) -> None:
    ops.configure(mode="noisy")
    assert ops.json("service", "start", "local")[0] == 0
    assert ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")[0] == 0
    code, rep = ops.json("healthcheck", "local")  # without A/A the noise looks like a change
    assert code == 1 and rep["failed"] == ["identity"]
    noisy = set(rep["modules"]["identity"]["mismatched"])
    code, rep = ops.json("healthcheck", "local", "--aa-runs", "2")
    ident = rep["modules"]["identity"]
    assert code == 0 and ident["mismatched"] == []
    assert set(ident["nondeterministic"]) == noisy and 0 < len(noisy) < ident["total"]
    detail = next(c for c in rep["checks"] if c["name"] == "identity")["detail"]
    assert f"{len(noisy)} nondeterministic in 2 A/A runs" in detail
