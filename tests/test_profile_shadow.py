"""The profile's shadow (ops.measure.shadow over engine.shadow): its pairs summarised into s per
kind of
forward; `ops report` projecting with the service's own s where the profile has it for exactly
the change (the bench's s kept beside), with the bench's otherwise; a malformed shadow is a bad
record; and `ops profile --shadow` for real against the reference engine on this CPU (the A/A
shadow: torch beside torch) and against a service without /shadow."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.local import Ops
from test_report_row_attention import ROW_CHANGE, ROWS_1024, write_runs
from typer.testing import CliRunner

from ops.cli import app
from ops.measure.shadow import summarize
from ops.verdict.amdahl import projected_gain_parts

RECORDS = Path(__file__).parent / "fixtures" / "records"
REPO = Path(__file__).resolve().parents[1]
FIELDS = ["kind", "rows", "base_plan_us", "base_calls_us", "cand_plan_us", "cand_calls_us", "first"]


def _doc(pairs: list[list]) -> dict:
    return {
        "component": "attention",
        "baseline": "torch",
        "candidate": "cuda",
        "armed_forwards": 100,
        "sampled": len(pairs),
        "error": None,
        "pair_fields": FIELDS,
        "pairs": pairs,
    }


def test_summarize_weighs_forwards_by_their_time_and_splits_by_kind_and_order() -> None:
    pairs = [
        # each kind's first forward in the window: the candidate's cold start, left out
        ["prefill", 576, 0.0, 16000.0, 0.0, 90000.0, "base"],
        ["step", 17, 100.0, 900.0, 50.0, 9000.0, "cand"],
        ["step", 17, 100.0, 900.0, 50.0, 450.0, "base"],  # 1000 / 500
        ["step", 17, 100.0, 1900.0, 50.0, 450.0, "cand"],  # 2000 / 500
        ["prefill", 576, 0.0, 16000.0, 0.0, 10000.0, "base"],
        ["prefill", 447, 0.0, 8000.0, 0.0, 5000.0, "cand"],
    ]
    out = summarize(_doc(pairs))
    step, pre = out["step"], out["prefill"]
    assert (out["offered"], out["candidate"], out["baseline"], out["error"]) == (
        True,
        "cuda",
        "torch",
        None,
    )
    assert step["forwards"] == 2 and step["s"] == pytest.approx(3000 / 1000)  # not mean(2, 4)
    assert step["warmup"] == pre["warmup"] == 1 and len(out["pairs"]) == 6  # kept in the record
    assert (step["s_base_first"], step["s_cand_first"]) == (2.0, 4.0)
    assert step["s_in_place"] == 1000 / 500  # base where it went first / cand where it did
    assert (step["base_us"], step["cand_us"], step["base_host_us"]) == (1500, 500, 100)
    assert step["lo"] <= step["s"] <= step["hi"] and 2.0 <= step["lo"] and step["hi"] <= 4.0
    assert pre["s"] == pytest.approx(24000 / 15000) and pre["rows_mean"] == (576 + 447) / 2
    assert summarize(_doc(pairs)) == out  # the interval's resampling is seeded
    assert summarize(_doc(pairs[:2]))["step"] is None  # its one forward was the warm-up
    assert summarize(_doc([p for p in pairs if p[0] == "prefill"]))["step"] is None
    bad = summarize(_doc([["step", 1, "x", 1, 1, 1, "base"]]))
    assert "cannot read" in bad["error"]
    assert summarize(None)["offered"] is False


def _shadowed_runs(tmp: Path, shadow_at: dict[int, dict], change: dict = ROW_CHANGE) -> list[str]:
    """The row-attention report's records with a profile whose levels carry these shadows
    (and, at c=8, a wall share of which a part is in prefill)."""
    runs = write_runs(tmp, change)
    prof = json.loads((RECORDS / "profile_attn" / "record.json").read_text())
    for lv in prof["profile"]["levels"]:
        if lv["concurrency"] == 8:
            lv["wall_share"] = {"attention": {"value": 0.6, "prefill": 0.2, "source": "measured"}}
        if lv["concurrency"] in shadow_at:
            lv["shadow"] = shadow_at[lv["concurrency"]]
    (tmp / "profile").mkdir()
    (tmp / "profile" / "record.json").write_text(json.dumps(prof))
    return [str(tmp / "profile") if "profile_attn" in r else r for r in runs]


def _kind(s: float, n: int = 40) -> dict:
    return {
        "forwards": n,
        "s": s,
        "lo": s * 0.95,
        "hi": s * 1.05,
        "base_us": 1000.0 * s,
        "cand_us": 1000.0,
        "base_host_us": 100.0,
        "cand_host_us": 50.0,
    }


def _shadow(step: float | None, prefill: float | None, **kw) -> dict:
    return {
        "offered": True,
        "component": "attention",
        "baseline": "torch",
        "candidate": "cuda",
        "error": None,
        "step": _kind(step) if step else None,
        "prefill": _kind(prefill) if prefill else None,
        **kw,
    }


def _report(tmp: Path, runs: list[str]) -> tuple[int, dict]:
    res = CliRunner().invoke(
        app,
        ["report", *runs, "--out", str(tmp / "out"), "--json"],
        env={"OPS_RUNS_DIR": str(tmp / "runs")},
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, json.loads(res.stdout)


def test_report_projects_with_the_shadows_s_and_keeps_the_benchs_beside(tmp_path: Path) -> None:
    failed = _shadow(1.2, 1.5, error="RuntimeError: boom")
    runs = _shadowed_runs(tmp_path, {1: _shadow(2.5, None), 8: _shadow(1.6, 1.55), 32: failed})
    code, doc = _report(tmp_path, runs)
    rows = {r["concurrency"]: r for r in doc["amdahl"]}
    # c=1: the decode steps' s from the shadow, the bench's (300 / 100) beside it
    one = rows[1]
    assert one["speed"]["source"] == "shadow" and one["speed"]["s"] == 2.5
    assert one["bench_speed"]["s"] == pytest.approx(3.0) and one["bench_speed"]["source"] == "bench"
    assert "the service's own 40 decode steps in the load at c=1 (shadow)" in one["speed"]["note"]
    assert "s from the service's own forwards" in one["note"] and "the bench read" in one["note"]
    f = one["f"]
    assert one["gain"] == pytest.approx(1 / ((1 - f) + f / 2.5) - 1)
    # c=8: two parts, each at the shadow's s; the bench has no prefill rows here
    eight = rows[8]
    assert (eight["f"], eight["f_prefill"]) == (0.6, 0.2)
    assert eight["prefill_speed"]["source"] == "shadow" and eight["bench_prefill_speed"] is None
    assert eight["gain"] == pytest.approx(projected_gain_parts([(0.4, 1.6), (0.2, 1.55)]))
    assert "prefill: no bench row" in eight["note"]
    assert "(the service's own prefill blocks, shadow)" in eight["note"]
    # c=32: a shadow that failed is not used: the bench's s (3000 / 2400)
    assert rows[32]["speed"]["source"] == "bench" and rows[32]["bench_speed"] is None
    assert rows[32]["speed"]["s"] == pytest.approx(ROWS_1024[32][0] / ROWS_1024[32][1])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "the service's own 40 decode steps in the load at c=1 (shadow)" in md
    assert 'Where s(c) says "(shadow)"' in md


def test_a_shadow_of_another_change_is_not_used(tmp_path: Path) -> None:
    aa = _shadow(1.02, 1.01, candidate="torch")  # an A/A shadow: torch beside torch
    _, doc = _report(tmp_path, _shadowed_runs(tmp_path, {1: aa, 8: aa, 32: aa}))
    assert {r["speed"]["source"] for r in doc["amdahl"]} == {"bench"}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"s": -1.0}, "shadow.step.s"),
        ({"forwards": 0}, "shadow.step.forwards"),
        ({"cand_us": float("nan")}, "shadow.step.cand_us"),
    ],
)
def test_a_malformed_shadow_is_a_bad_record_naming_the_field(tmp_path: Path, patch, field) -> None:
    sh = _shadow(2.0, None)
    sh["step"].update(patch)
    code, doc = _report(tmp_path, _shadowed_runs(tmp_path, {1: sh}))
    assert code == 2, doc
    text = json.dumps(doc)
    assert "profile" in text and field.split(".")[-1] in text and "shadow" in text


def _record(doc: dict) -> dict:
    return json.loads((Path(doc["run_dir"]) / "record.json").read_text())


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    yield o
    o.stop()


def test_profile_times_the_aa_shadow_on_the_reference_engine(ops: Ops) -> None:
    """Real: the reference engine on this CPU, `ops profile --shadow torch`: each level has a
    shadow window with decode steps and prefill blocks paired, s near 1 (the same backend; a
    loose bound, the CPU is shared), the service disarmed after; `--shadow cuda` on a CPU is
    recorded as refused, with the engine's reason, and the profile still passes."""
    ops.configure_service(None)
    assert ops.json("service", "start", "local")[0] == 0
    code, doc = ops.json(
        "profile",
        "local",
        "-c",
        "1,2",
        "--requests",
        "4",
        "--output-len",
        "8",
        "--input-len",
        "16",
        "--shadow",
        "attention=torch",
    )
    assert code == 0, doc
    for lv in _record(doc)["profile"]["levels"]:
        sh = lv["shadow"]
        assert (sh["offered"], sh.get("error"), sh["candidate"], sh["baseline"]) == (
            True,
            None,
            "torch",
            "torch",
        )
        assert sh["load"]["completed"] == 4 and sh["load"]["failed"] == 0
        for kind in ("step", "prefill"):
            k = sh[kind]
            # s is a ratio of totals, so one forward the shared CPU stalls moves it (3.1 once,
            # over 4 prefill blocks, with the suite's other worker beside it): a gross bound on
            # s, and "near 1" on the median pair, which one stall does not move
            assert k["forwards"] >= 1 and 0.1 < k["s"] < 10, (kind, k)  # A/A: near 1, noisy
            assert k["lo"] <= k["s"] <= k["hi"]
            ratios = [(p[2] + p[3]) / (p[4] + p[5]) for p in sh["pairs"] if p[0] == kind][1:]
            assert 0.5 < statistics.median(ratios) < 2, (kind, ratios)
        # every sampled forward is in the record; each kind's first one (the warm-up) is in no s
        paired = sum(sh[k]["forwards"] + sh[k]["warmup"] for k in ("step", "prefill"))
        assert len(sh["pairs"]) == sh["sampled"] == paired
    url = f"http://127.0.0.1:{ops.port}/get_server_info"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert json.loads(r.read())["shadow"]["left"] == 0  # disarmed after the last window
    code, doc = ops.json(
        "profile",
        "local",
        "-c",
        "1",
        "--requests",
        "2",
        "--output-len",
        "4",
        "--input-len",
        "8",
        "--shadow",
        "attention=cuda",
    )
    assert code == 0, doc
    sh = _record(doc)["profile"]["levels"][0]["shadow"]
    assert sh["offered"] is True and "needs the engine on a GPU" in sh.get("error")
    assert doc["shadow_not_timed"] == [{"concurrency": 1, "why": sh.get("error")}]
    # the tree build's shadow: the compiled C++ builder beside the serving Python reference
    code, doc = ops.json(
        "profile",
        "local",
        "-c",
        "2",
        "--requests",
        "4",
        "--output-len",
        "8",
        "--input-len",
        "16",
        "--shadow",
        "tree_build=cpp",
    )
    assert code == 0, doc
    sh = _record(doc)["profile"]["levels"][0]["shadow"]
    assert (sh["component"], sh["baseline"], sh["candidate"], sh.get("error")) == (
        "tree_build",
        "reference",
        "cpp",
        None,
    )
    assert sh["prefill"] is None and sh["step"]["forwards"] + 1 == len(sh["pairs"]) >= 3
    assert sh["step"]["s"] > 0
    # a shadow left armed (an earlier ops killed, or Ctrl-C'd twice, inside its window): the
    # next profile, shadow or not, disarms it before its first window and says so
    url = f"http://127.0.0.1:{ops.port}"
    rc, armed = _checks_shadow(
        url, "--component", "attention", "--backend", "torch", "--forwards", "5000"
    )
    assert rc == 0 and armed["ok"], armed
    code, doc = ops.json(
        "profile", "local", "-c", "1", "--requests", "2", "--output-len", "4", "--input-len", "8"
    )
    assert code == 0, doc
    found = _record(doc)["profile"]["shadow_found_armed"]
    assert found == {
        "component": "attention",
        "candidate": "torch",
        "left": 5000,
        "disarmed": True,
    }, found
    with urllib.request.urlopen(f"{url}/get_server_info", timeout=10) as r:
        left = json.loads(r.read())["shadow"]
    assert left["left"] == 0 and left["sampled"] == 0, left  # no forward of f was shadowed
    res = ops("profile", "local", "-c", "1", "--requests", "2", "--output-len", "4")
    assert res.returncode == 0 and "still armed" not in res.stdout + res.stderr


def test_the_disarm_holds_off_a_ctrl_c_and_raises_it_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGINT while `disarm` runs its check does not stop the check (the service would stay
    armed), and is not lost either: KeyboardInterrupt once the check is done, the handler
    before back in place. Without one, the check's answer is returned; a failed check's error
    goes on, with the handler back too."""
    import os
    import signal

    from ops.hosts.inventory import load_inventory
    from ops.hosts.local import LocalHost
    from ops.measure import shadow

    seen = []

    def check(host, module, args, **kw):  # the check's host side is not what is tested here
        seen.append((module, args))
        if mode == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)  # delivered now, to the handler the disarm set
            time.sleep(0.05)
        if mode == "fail":
            raise RuntimeError("the check failed")
        return type("R", (), {"data": {"ok": True, "left": 0}})()

    monkeypatch.setattr(shadow, "run_check", check)
    before = signal.getsignal(signal.SIGINT)
    host = LocalHost(load_inventory(None).target("local"))
    mode = "interrupt"
    with pytest.raises(KeyboardInterrupt):
        shadow.disarm(host, "attention")
    assert len(seen) == 1  # the check ran to its end first
    assert signal.getsignal(signal.SIGINT) is before
    mode = "plain"
    assert shadow.disarm(host, "attention") == {"ok": True, "left": 0}
    mode = "fail"
    with pytest.raises(RuntimeError):
        shadow.disarm(host, "attention")
    assert [a[-2:] for _, a in seen] == [["--forwards", "0"]] * 3
    assert signal.getsignal(signal.SIGINT) is before


def _checks_shadow(url: str, *args: str) -> tuple[int, dict]:
    """`python -m checks.shadow --json --url URL ARGS...`: its exit code and its document."""
    cmd = [sys.executable, "-m", "checks.shadow", "--json", "--url", url, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    return res.returncode, json.loads(res.stdout)


def test_a_service_without_shadow_is_not_offered(ops: Ops) -> None:
    """checks.shadow against tests/helpers/fake_service.py (no /shadow, as a real SGLang): exit
    1, `offered: false`, and why; the profile goes on with the bench's s then."""
    ops.configure("ok")
    assert ops.json("service", "start", "local")[0] == 0
    url = f"http://127.0.0.1:{ops.port}"
    rc, doc = _checks_shadow(url, "--component", "attention", "--backend", "cuda", "--forwards=1")
    assert rc == 1 and doc["offered"] is False and doc["status"] == 404
    assert "no /shadow endpoint" in doc["message"]
    ops.stop()  # nothing answers now: that says nothing of /shadow (offered null), exit 1
    rc, doc = _checks_shadow(url, "--backend", "cuda", "--forwards", "10", "--timeout", "3")
    assert rc == 1 and doc["offered"] is None and doc["status"] is None
    assert doc["message"] == "connection refused"


@pytest.mark.parametrize(
    "args",
    [
        ["--forwards", "5"],
        ["--backend", "cuda", "--forwards", "-1"],
        ["--backend", "cuda", "--forwards", "20001"],
        ["--forwards", "0", "--timeout", "0"],
        ["--component", "accept", "--backend", "cuda", "--forwards", "1"],
    ],
)
def test_checks_shadow_bad_input_is_exit_2(args) -> None:
    rc, doc = _checks_shadow("http://127.0.0.1:9", *args)
    assert rc == 2 and doc["error"] == "bad_input"


def test_bad_shadow_option_is_exit_2(ops: Ops) -> None:
    ops.configure_service(None)
    for bad in ("triton", "attention=triton", "accept=cuda", "tree_build=torch"):
        code, doc = ops.json("profile", "local", "--shadow", bad)
        assert code == 2 and "--shadow takes COMPONENT=KIND" in json.dumps(doc), bad


def test_the_control_planes_list_of_shadowed_backends_is_the_engines() -> None:
    from engine.components import COMPONENTS
    from ops.measure.shadow import SHADOW_KINDS

    assert {c: COMPONENTS[c] for c in SHADOW_KINDS} == SHADOW_KINDS


def test_a_tree_build_shadow_stands_in_for_the_benchs_s_of_that_change() -> None:
    """ops.verdict.amdahl.shadow_speed for the seed's change (tree_build reference -> cuda): the
    shadow of that change at a level gives the decode steps' s, any other is ignored."""
    from ops.sections.change import Change
    from ops.sections.profile import ProfileLevel
    from ops.verdict.amdahl import shadow_speed

    change = Change(component="tree_build", baseline="reference", candidate="cuda")
    step = {"value": 10.0, "source": "measured"}

    def level(**sh) -> ProfileLevel:
        doc = {
            "offered": True,
            "component": "tree_build",
            "baseline": "reference",
            "candidate": "cuda",
            "step": _kind(3.0, n=55),
            **sh,
        }
        return ProfileLevel.model_validate({"concurrency": 8, "step_ms": step, "shadow": doc})

    sp = shadow_speed(level(), change, "step")
    assert (sp.s, sp.source, sp.batch) == (3.0, "shadow", 8)
    assert sp.note == "the service's own 55 decode steps' tree builds in the load at c=8 (shadow)"
    assert shadow_speed(level(), change, "prefill") is None
    assert shadow_speed(level(component="attention"), change, "step") is None
    assert shadow_speed(level(candidate="cpp"), change, "step") is None
    assert shadow_speed(level(error="boom"), change, "step") is None


def test_a_rollout_arms_the_shadow_only_after_the_bench_passed(ops: Ops) -> None:
    """Real: the attention rollout on this CPU: the bench holds (no GPU), so the profile step
    does not put the candidate into the live service, and says why in its line and record."""
    ops.configure_service(None)
    assert ops.json("service", "start", "local")[0] == 0
    code, doc = ops.json(
        "rollout",
        "local",
        "--playbook",
        str(REPO / "playbooks" / "rollout-attention.yaml"),
        "--set",
        "load.input_len=16",
        "--set",
        "load.output_len=8",
        "--set",
        "load.concurrency=1",
    )
    assert code == 3, doc  # HOLD: no GPU bench
    prof = next(s for s in doc["steps"] if s["name"] == "profile")
    assert "shadow not armed: the bench did not pass (hold)" in prof["detail"]
    run = Path(doc["run_dir"])
    sec = json.loads(next(run.glob("*-profile/record.json")).read_text())["profile"]
    assert sec["shadow_not_armed"] == "shadow not armed: the bench did not pass (hold)"
    assert all(lv["shadow"] is None for lv in sec["levels"])  # none armed, none timed


def test_a_ctrl_c_while_arming_still_disarms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after the arm reached the service but before its answer came back: the shadow
    window disarms anyway (the service would otherwise time the candidate beside every forward
    it serves), and the Ctrl-C goes on."""
    from ops.hosts.inventory import load_inventory
    from ops.hosts.local import LocalHost
    from ops.measure import shadow

    calls = []

    def check(host, module, args, **kw):
        calls.append(args[args.index("--forwards") + 1])
        if args[-1] != "0":  # the arm
            raise KeyboardInterrupt
        return type("R", (), {"data": {"ok": True, "left": 0}})()

    monkeypatch.setattr(shadow, "run_check", check)
    host = LocalHost(load_inventory(None).target("local"))
    with pytest.raises(KeyboardInterrupt):
        shadow.shadow_level(host, 1, "attention=torch", 5000, {"requests": 1})
    assert calls == ["5000", "0"]  # armed, then disarmed
