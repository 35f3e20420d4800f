"""`ops rollout` through the real CLI on `local`: the reference engine (tiny, CPU) as the service
under ops's process manager, on a free port, with a temporary inventory, remote root and runs
directory, and small loads.

- The default playbook (its threshold raised to 6%) ends NO-GO on this machine, and says why:
  the tree build is ~2% of the tiny engine's measured wall time (f: its share of the load
  window, ~2-3% of the step), so even an infinitely fast one cannot
  clear the threshold (ceiling_below_threshold); the missing GPU bench is named as a HOLD
  cause beside it. Every step leaves its record in one run directory; the steps behind the
  `go` gate are skipped and `current` is left alone; `ops report` rebuilds the same verdict
  from the records.
- A playbook that deploys (gate `always`) switches the service to the candidate's components
  through ops deploy and measures the same load before (A/A pair) and after the switch.
- A failing step with `on_fail: stop` skips to the report; a playbook without one exits with
  its worst step.
- Against a stopped service (`on_fail: continue`) the later steps run and the report's reasons
  say what happened: identity not checked as the service was down, no profiled level.
- A level the profile measured no tokens/s at (all its requests failed) is measured with
  load.requests (`sized_requests`, `run_plan`).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.cli import ops_json
from helpers.deploy import make_source
from helpers.local import end_services
from helpers.sshd import free_port

from ops.rollout.steps import Arms, Found, sized_requests
from ops.rollout.switch import AUDIT_PARTS, run_plan
from ops.sections.common import Value
from ops.sections.measure import MeasureSection
from ops.sections.profile import ProfileLevel
from ops.verdict.evidence import gather

SMALL = [
    "--set",
    "load.concurrency=1,4",
    "--set",
    "load.requests=4",
    "--set",
    "load.input_len=16",
    "--set",
    "load.output_len=8",
    "--set",
    "preflight.max_tokens=4",
    "--set",
    "preflight.aa_runs=0",
]
STEPS = [
    "01-preflight",
    "02-bench",
    "03-profile",
    "04-decide",
    "05-baseline",
    "06-deploy",
    "07-postflight",
    "08-measure",
    "09-report",
]


class Local:
    """The `ops` CLI against `local` rooted in a temp dir, its service on a free port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.root = tmp, tmp / "root"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.inventory = tmp / "ops.toml"
        self.inventory.write_text(
            f"[targets.local]\nremote_root = '{self.root}'\n"
            f"[targets.local.service]\nurl = '{self.url}'\nstop_timeout = 5\n"
        )
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}

    def __call__(self, *args: str, timeout: float = 240) -> tuple[int, dict, str]:
        return ops_json(*args, inventory=self.inventory, env=self.env, timeout=timeout)

    def backends(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.url}/get_server_info", timeout=10) as r:
            return json.loads(r.read())["backends"]


@pytest.fixture
def local(tmp_path: Path):
    loc = Local(tmp_path)
    code, _, err = loc("service", "start", "local")
    assert code == 0, err
    yield loc
    end_services(loc.root)


@pytest.fixture
def local_stopped(tmp_path: Path):
    """`local` before anything has started its service (a deploy --bootstrap does)."""
    loc = Local(tmp_path)
    yield loc
    end_services(loc.root)


def slow_first_module(loc: Local) -> None:
    """The target's `python` from now on: the test's own, but its first `-m` module starts
    2.5 s late (a rollout's every host command ran under the 1 s heartbeat on an idle CI
    machine, and no line said it still ran)."""
    slow, marker = loc.tmp / "slowpy", loc.tmp / "slowed"
    slow.write_text(
        "#!/bin/bash\n"
        f'case " $* " in *" -m "*) mkdir "{marker}" 2>/dev/null && sleep 2.5;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    slow.chmod(0o755)
    text = loc.inventory.read_text()
    loc.inventory.write_text(
        text.replace("[targets.local]\n", f"[targets.local]\npython = '{slow}'\n")
    )


def record(path: Path) -> dict:
    return json.loads((path / "record.json").read_text())


def test_default_rollout_on_local_is_no_go_by_its_ceiling(local: Local) -> None:
    # a release already in place: a rollout that does not say GO must leave it current
    old = local.root / "releases" / "20260101T000000Z-0123456789"
    old.mkdir(parents=True)
    (local.root / "current").symlink_to("releases/20260101T000000Z-0123456789")
    # the tree build is ~2% of the tiny engine's wall time (its ceiling near the default 3%):
    # a 6% threshold makes "below the ceiling" a property of the engine, not of a noisy run
    local.env["OPS_HEARTBEAT_S"] = "1"  # its long host commands say they still run:
    slow_first_module(local)  # one that runs 2.5 s, whatever the machine's speed
    code, doc, err = local(
        "rollout", "local", *SMALL, "--set", "threshold=0.06", "--set", "bench.decode_spread=8"
    )
    assert code == 1 and doc["verdict"] == "NO-GO", err
    assert re.search(r"module \S+ still runs \(\d+ s; stopped at \d+ s\)", err), err
    assert doc["change"] == "tree_build: reference -> cuda"
    d = doc["decision"]
    assert [r["code"] for r in d["failed"]] == ["ceiling_below_threshold"]
    ceiling = d["failed"][0]["evidence"]
    assert ceiling["concurrency"] == 4 and 0 < ceiling["f"] < 0.05
    assert ceiling["ceiling"] < ceiling["threshold"] == 0.06
    held = {r["code"]: r["message"] for r in d["holds"]}
    assert "no GPU on local" in held["bench_held"]
    status = {s["name"]: s["status"] for s in doc["steps"]}
    assert status == {
        "preflight": "ok",
        "bench": "hold",
        "profile": "ok",
        "decide": "fail",
        "baseline": "skip",
        "deploy": "skip",
        "postflight": "skip",
        "measure": "skip",
        "report": "fail",
    }
    # progress on stderr as each step runs
    assert "[1/9] preflight (healthcheck) ..." in err and "[9/9] report: NO-GO: " in err
    assert "decide: fail" not in err and "report: fail" not in err  # a verdict, not a failure
    assert "      bench: GPUs (nvidia-smi)" in err, err  # a step's progress names its step
    assert "[6/9] deploy: skip (gate go: decide said NO-GO)" in err
    # one run directory: a record per step, the report beside the rollout's own record
    run = Path(doc["run_dir"])
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == STEPS
    assert {"record.json", "report.md", "report.html", "report.json"} <= {
        p.name for p in run.iterdir()
    }
    top = record(run)
    assert top["command"] == "rollout" and top["outcome"] == "NO-GO" and top["exit_code"] == 1
    assert [s["name"] for s in top["steps"]] == [s.split("-", 1)[1] for s in STEPS]
    change = {"component": "tree_build", "baseline": "reference", "candidate": "cuda", "shape": {}}
    kinds = ["healthcheck", "bench", "profile", "decide", *["skipped"] * 4, "report"]
    assert [record(run / name)["command"] for name in STEPS] == kinds
    for name, kind in zip(STEPS, kinds, strict=True):
        if kind != "skipped":
            assert {k: record(run / name)["change"][k] for k in change} == change, name
    pre, golden = record(run / "01-preflight"), record(run / "01-preflight" / "golden")
    assert pre["inputs"]["role"] == golden["inputs"]["role"] == "preflight"
    assert golden["inputs"]["record_golden"] is True and pre["inputs"]["golden_recorded_first"]
    ident = next(c for c in pre["healthcheck"]["checks"] if c["name"] == "identity")
    assert ident["status"] == "pass" and "34/34" in ident["detail"]
    # the bench held (no GPU): the report names no bench rows it does not have
    md = (run / "report.md").read_text()
    assert "No bench rows: s(c) is not known here" in md and "build_trees` rows" not in md
    # the flight that recorded the golden set and the one that compared with it read apart
    passed = [r["message"] for r in d["passed"] if r["code"] == "preflight_passed"]
    assert len(passed) == 2 and len(set(passed)) == 2, passed
    assert any(m.startswith("preflight recording the golden set: ") for m in passed), passed
    line = next(ln for ln in err.splitlines() if ln.startswith("[1/9] preflight: ok"))
    assert "golden" not in line or "golden set recorded" in line, line
    bench = record(run / "02-bench")
    assert bench["bench"]["hold_reasons"]
    assert bench["inputs"]["decode_spread"] == bench["bench"]["decode_spread"] == 8  # --set
    prof = record(run / "03-profile")["profile"]
    assert [lv["concurrency"] for lv in prof["levels"]] == [1, 4]
    assert record(run / "04-decide")["decision"]["verdict"] == "NO-GO"
    assert "decide said NO-GO" in record(run / "06-deploy")["reason"]
    assert (run / "report.md").read_text().startswith("# NO-GO: tree_build: reference -> cuda")
    assert "ceiling_below_threshold" in (run / "report.html").read_text()
    # nothing was deployed
    assert os.readlink(local.root / "current") == "releases/20260101T000000Z-0123456789"
    assert [p.name for p in (local.root / "releases").iterdir()] == [old.name]
    # anyone can rebuild the same verdict from the records alone
    code, again, _ = local(
        "report", str(run), "--out", str(local.tmp / "rebuilt"), "--threshold", "0.06"
    )
    assert code == 1 and again["verdict"] == "NO-GO"
    assert [r["code"] for r in again["failed"]] == ["ceiling_below_threshold"]


def _bootstrap(local: Local) -> tuple[Path, str]:
    """The service on a first release (deploy --bootstrap: one start of the engine, not a start
    and then a restart) with a golden set of 4 prompts, so a rollout's flights stay quick;
    returns the deploy's source and the release."""
    src = make_source(local.tmp)
    boot = ["--source", str(src), "--bootstrap", "--max-tokens", "4", "--wait", "60"]
    code, doc, err = local("deploy", "local", *boot, timeout=240)
    assert code == 0, err
    first = doc["results"][0]["release"] if "results" in doc else doc["release"]
    golden = local.root / "golden" / "golden.json"
    argv = ["--record-golden", str(golden), "--limit", "4", "--max-tokens", "4"]
    subprocess.run(
        [sys.executable, "-m", "checks.identity", "--json", "--url", local.url, *argv],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return src, first


def test_a_deploying_playbook_switches_the_component_and_measures_it(local_stopped: Local) -> None:
    local = local_stopped
    # the service runs a release (the measure's recheck switches back to it after the switch)
    src, first = _bootstrap(local)
    assert local.backends()["tree_build"] == "reference"
    # the golden set re-recorded with 4 prompts keeps the rollout's pre- and post-flights quick
    golden = local.root / "golden" / "golden.json"
    assert len(json.loads(golden.read_text())["prompts"]) == 4
    pb = local.tmp / "switch.yaml"
    pb.write_text(
        "change: {component: tree_build, baseline: reference, candidate: cpp}\n"
        "load: {concurrency: [1], requests: 2, input_len: 8, output_len: 8, run_seconds: 0.4}\n"
        "steps:\n"
        "  - {step: profile}\n"
        "  - {step: measure, name: baseline, phase: before}\n"
        f"  - {{step: deploy, source: '{src}', max_tokens: 4, wait_s: 60}}\n"
        "  - {step: measure, phase: after, when: deployed, recheck: true, cycles: 2}\n"
        "  - {step: report}\n"
    )
    code, doc, err = local("rollout", "local", "--playbook", str(pb), timeout=300)
    status = {s["name"]: s["status"] for s in doc["steps"]}
    # a CPU candidate (#39 item 7): no GPU bench can time cpp, the profile's shadow did, on
    # the service's own traffic; the verdict is GO or NO-GO by its gain, never HOLD no_bench
    (row,) = doc["decision"]["amdahl"]
    verdict = doc["verdict"]
    want_code, report = {"GO": (0, "ok"), "NO-GO": (1, "fail")}[verdict]
    assert status == {
        "profile": "ok",
        "baseline": "ok",
        "deploy": "ok",
        "measure": "ok",
        "report": report,
    }, err
    # the candidate is what the service runs now, from a release of its own
    assert local.backends()["tree_build"] == "cpp"
    current = os.readlink(local.root / "current")
    env = (local.root / current / "service.env").read_text()
    assert "DDTREE_ENGINE_BACKENDS=tree_build=cpp" in env
    if verdict == "GO":  # kept: the inventory should say so
        assert 'tree_build = "cpp" so the next deploy keeps it' in doc["notes"][0]
        assert "the inventory names no tree_build" in doc["notes"][0], doc["notes"]
    else:  # not confirmed: the candidate still serves, and the way back is named
        assert "local still runs the candidate tree_build = cpp" in doc["notes"][0]
        assert "`ops rollback local` returns to" in doc["notes"][0], doc["notes"]
    run = Path(doc["run_dir"])
    # load.run_seconds sizes the profile's window too (an uncounted pilot of load.requests,
    # then a window of about 0.4 s at its tokens/s), so f is taken over measure's kind of run
    prof_detail = next(s["detail"] for s in doc["steps"] if s["name"] == "profile")
    assert "(windows of about 0.4 s, after a pilot)" in prof_detail, prof_detail
    (plv,) = record(run / "01-profile")["profile"]["levels"]
    pil = plv["load"]["pilot"]
    assert pil["completed"] == 2 and pil["run_seconds"] == 0.4, pil
    assert plv["load"]["requests"] == pil["sized_requests"] == plv["load"]["completed"]
    assert pil["sized_requests"] == max(1, math.ceil(0.4 * pil["output_tok_per_s"] / 8)), pil
    dep = record(run / "03-deploy")
    assert dep["results"][0]["outcome"] == "deployed" and dep["exit_code"] == 0
    assert record(run / "03-deploy" / "postflight")["inputs"]["role"] == "postflight"
    before = record(run / "02-baseline")["measure_before"]["levels"][0]
    assert before["concurrency"] == 1 and len(before["aa"]) == 2
    measure = MeasureSection.model_validate(record(run / "04-measure")["measure"])
    (lv,) = measure.levels
    assert lv.aa == before["aa"] and lv.before == lv.aa[0] + lv.aa[1]
    # two cycles: after (cycle 0) | A'' (1) | after (1) | A'' (2), then the candidate back:
    # every arm of the two releases on a freshly started service, the arms alternating
    assert len(lv.after) == 4 and all(x > 0 for x in lv.after)
    # the recheck: the release before the candidate switched back in, the load once more (A''),
    # then the candidate's release current again (asserted above: the service runs cpp)
    detail = next(s["detail"] for s in doc["steps"] if s["name"] == "measure")
    assert "recheck: A'' on " in detail and "in 2 cycles" in detail, detail
    assert "current again" in detail, detail
    assert len(lv.recheck) == 4 and all(x > 0 for x in lv.recheck)  # as many as after
    order = [(r["arm"], r["cycle"]) for r in record(run / "04-measure")["measure"]["runs"]]
    blocks = [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]
    assert blocks == [("after", 0), ("A''", 1), ("after", 1), ("A''", 2)], order
    assert f"A'' on {first}" in detail, detail
    assert Path(current).name == dep["results"][0]["release"]
    # the stage as the service saw it: its seconds per output token, before (A and A') over
    # after, pooled over the runs (the tree build does not run in prefill); which of Python and
    # C++ wins at this tiny shape depends on the machine, so only the arithmetic is pinned
    sp = lv.service_speedup
    assert sp is not None and sp["total"] == sp["steps"] > 0 and "prefill" not in sp, sp
    raw = record(run / "04-measure")["measure"]["runs"]
    assert all("counters" not in r and r["component"]["steps_s"] > 0 for r in raw), raw
    # where the gain came from: each arm's window in parts that add up to it (ms per token)
    assert lv.audit is not None and set(lv.audit) == set(AUDIT_PARTS), lv.audit
    for when in ("before_ms", "after_ms"):
        parts = sum(getattr(v, when) for k, v in lv.audit.items() if k != "window")
        assert parts == pytest.approx(getattr(lv.audit["window"], when)), lv.audit
    assert lv.audit["tree_build"].before_ms > 0 and lv.audit["verify"].after_ms > 0
    before_runs = record(run / "02-baseline")["measure_before"]["runs"]

    def per_token(runs: list[dict]) -> float:  # the runs' seconds over their tokens
        return sum(r["component"]["steps_s"] for r in runs) / sum(r["output_tokens"] for r in runs)

    after_runs = [r for r in raw if r["arm"] == "after"]
    baseline = before_runs + [r for r in raw if r["arm"] == "A''"]  # A, A' and the recheck's A''
    assert sp["steps"] == pytest.approx(per_token(baseline) / per_token(after_runs))
    # load.run_seconds: each measured run has as many requests as 0.4 s take at the profile's
    # tokens/s (sized_requests), the same before and after the switch
    sized = record(run / "04-measure")["measure"]["settings"]["requests_per_level"]
    prof = record(run / "01-profile")["profile"]["levels"][0]
    assert sized == {"1": sized_requests([ProfileLevel(**prof)], 0.4, 8)[1]} and sized["1"] > 2
    assert {r["completed"] for r in raw} | {r["completed"] for r in before_runs} == {sized["1"]}
    assert row["service_speedup"] == sp
    md = (run / "report.md").read_text()
    assert "Drift check" in md and "- c=1: A'' " in md, md
    # s came from the shadow: the report does not also say that nothing is projected
    assert "nothing is projected" not in md and "s(c) is the shadow's" in md
    assert "against every baseline run (A, A', A''; the measured gain)" in md
    # the report reads all of it: the deploy and its post-flight, predicted beside measured
    ev = gather([run])
    assert ev.deployed and sorted(h.role for h in ev.health) == ["postflight", "preflight"]
    assert all(not h.golden_recorded and h.report and h.report.ok for h in ev.health)
    # the flights the deploy ran say so, apart from a rollout's own pre- and post-flight steps
    assert sorted(h.name for h in ev.health) == ["deploy's postflight", "deploy's preflight"]
    assert "deploy's postflight: " in md and "deploy's preflight: " in md, md
    assert code == want_code, doc["decision"]
    assert doc["decision"]["holds"] == [], doc["decision"]["holds"]
    assert "cpu_candidate" in [r["code"] for r in doc["decision"]["passed"]]
    assert row["speed"]["source"] == "shadow", row
    assert row["f"] is not None and row["measured_gain"] is not None and row["gain"] is not None
    # the service runs cpp now: a change from reference is refused before any step runs
    code, doc, err = local("rollout", "local", "--set", "change.candidate=cpp")
    assert code == 2 and "local's service runs tree_build = 'cpp'" in err, err
    assert doc["field"] == "change.baseline"


def _precision_playbook(local: Local, src: Path, change: str, measure: str) -> Path:
    pb = local.tmp / "precision.yaml"
    pb.write_text(
        f"change: {change}\n"
        "load: {concurrency: [1, 4], requests: 4, input_len: 8, output_len: 8}\n"
        "steps:\n"
        "  - {step: profile}\n"
        "  - {step: measure, name: baseline, phase: before}\n"
        f"  - {{step: deploy, source: '{src}', max_tokens: 4, wait_s: 60}}\n"
        f"  - {{step: measure, phase: after, when: deployed, recheck: true, {measure}}}\n"
        "  - {step: report}\n"
    )
    return pb


def test_measure_precision_adds_cycles_until_the_interval_is_narrow_enough(
    local_stopped: Local,
) -> None:
    """measure.precision: after `cycles`, the releases go on alternating until the measured
    gain's 90% interval is that narrow at every level, max_cycles at the most; the record, the
    step's line and the report say whether it was met and after how many cycles."""
    local = local_stopped
    src, _ = _bootstrap(local)

    def arms(run: Path) -> list[tuple[str, int]]:
        order = [(r["arm"], r["cycle"]) for r in record(run / "04-measure")["measure"]["runs"]]
        return [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]

    # +/-99 points: met at the first check, after `cycles` (1): after | A'', nothing more
    pb = _precision_playbook(
        local,
        src,
        "{component: tree_build, baseline: reference, candidate: cpp}",
        "precision: 0.99, max_cycles: 3",
    )
    code, doc, err = local("rollout", "local", "--playbook", str(pb), timeout=300)
    assert code in (1, 3), err  # no GPU bench: NO-GO or HOLD, never GO
    run = Path(doc["run_dir"])
    assert arms(run) == [("after", 0), ("A''", 1)], arms(run)
    got = record(run / "04-measure")["measure"]["precision"]
    assert got["met"] is True and got["cycles_run"] == 1 and got["max_cycles"] == 3, got
    assert set(got["half_width"]) == {"1", "4"}
    assert all(0 <= h <= 0.99 for h in got["half_width"].values()), got
    detail = next(s["detail"] for s in doc["steps"] if s["name"] == "measure")
    assert "precision +/-99.0 points met after 1 cycle (" in detail, detail
    md = (run / "report.md").read_text()
    assert "stopped once it had them: after 1 cycle (max_cycles 3)" in md, md
    # the interval the stop looked at is the one the report prints
    ev = gather([run])
    assert ev.measure is not None and ev.measure.precision is not None
    rows = doc["decision"]["amdahl"]
    assert sorted(r["concurrency"] for r in rows) == [1, 4], rows
    for row in rows:
        half = (row["measured_hi"] - row["measured_lo"]) / 2
        assert half == pytest.approx(got["half_width"][str(row["concurrency"])]), row
    assert local.backends()["tree_build"] == "cpp"

    # +/-0.0001 points: never met, so max_cycles (2) cycles, and the report says so
    pb = _precision_playbook(
        local,
        src,
        "{component: tree_build, baseline: cpp, candidate: reference}",
        "precision: 0.000001, max_cycles: 2",
    )
    code, doc, err = local("rollout", "local", "--playbook", str(pb), timeout=300)
    assert code in (1, 3), err
    run = Path(doc["run_dir"])
    assert arms(run) == [("after", 0), ("A''", 1), ("after", 1), ("A''", 2)], arms(run)
    got = record(run / "04-measure")["measure"]["precision"]
    assert got["met"] is False and got["cycles_run"] == 2, got
    detail = next(s["detail"] for s in doc["steps"] if s["name"] == "measure")
    assert "in 2 cycles" in detail and "NOT met in 2 cycles (max_cycles 2;" in detail, detail
    assert "precision +/-0.0001 points NOT met" in detail, detail  # not "+/-0.0"
    md = (run / "report.md").read_text()
    assert "did not get them in its 2 cycles (max_cycles 2)" in md, md
    assert "did not get them in its 2 cycles" in (run / "report.html").read_text()
    assert local.backends()["tree_build"] == "reference"  # the candidate, current again


def test_on_fail_stop_skips_to_the_report(tmp_path: Path) -> None:
    loc = Local(tmp_path)  # nothing serves on its port
    pb = tmp_path / "stop.yaml"
    pb.write_text(
        "change: {component: accept, baseline: reference, candidate: cuda}\n"
        "steps:\n"
        "  - {step: healthcheck, name: preflight, golden: compare, on_fail: stop, timeout: 2}\n"
        "  - {step: profile}\n"
        "  - {step: report, formats: [md]}\n"
    )
    code, doc, err = loc("rollout", "local", "--playbook", str(pb))
    assert code == 1 and doc["verdict"] == "NO-GO", err
    assert [s["status"] for s in doc["steps"]] == ["fail", "skip", "fail"]
    assert "stopped at step 'preflight'" in doc["steps"][1]["detail"]
    assert "preflight_failed" in [r["code"] for r in doc["decision"]["failed"]]
    assert [Path(f).name for f in doc["files"]] == ["report.md", "report.json"]
    res = subprocess.run(  # the table: the report step shows the verdict, not FAIL
        [
            sys.executable,
            "-m",
            "ops",
            "rollout",
            "local",
            "--playbook",
            str(pb),
            "--inventory",
            str(loc.inventory),
        ],
        capture_output=True,
        text=True,
        env={**loc.env, "COLUMNS": "100"},
        timeout=120,
    )
    row = next(ln for ln in res.stdout.splitlines() if " report " in ln)
    assert "NO-GO" in row and "FAIL" not in row, res.stdout
    assert "HOLD" not in res.stdout.split("NO-GO:", 1)[1], res.stdout  # no HOLD line in a NO-GO
    # without a report step the exit code is the worst step's
    code, doc, _ = loc("rollout", "local", "--playbook", "healthcheck-only")
    assert code == 1 and doc["verdict"] is None and doc["steps"][0]["status"] == "fail"
    assert record(Path(doc["run_dir"]))["outcome"] == "fail"


def test_a_stopped_service_gets_reasons_that_say_so(tmp_path: Path) -> None:
    """The preflight fails and, `on_fail: continue`, the later steps still run: the report says
    the identity could not be checked because the service was down (the golden set exists) and
    that the profile measured no level, never a Python None or a missing golden set."""
    loc = Local(tmp_path)  # nothing serves on its port
    golden = loc.root / "golden" / "golden.json"
    golden.parent.mkdir(parents=True)
    golden.write_text('{"prompts": []}\n')
    small = ["--set", "load.concurrency=1", "--set", "load.requests=1", "--set", "load.timeout=5"]
    code, doc, err = loc("rollout", "local", *small, "--set", "preflight.timeout=2")
    assert code == 1 and doc["verdict"] == "NO-GO", err
    d = doc["decision"]
    assert [r["code"] for r in d["failed"]] == ["preflight_failed"]
    held = {r["code"]: r["message"] for r in d["holds"]}
    assert held["no_identity"] == (
        "preflight: could not check greedy token identity: the service was not healthy "
        "(failed: service, health)"
    )
    assert held["no_profile_level"].startswith("the profile measured no level")
    assert d["target_concurrency"] is None
    md = (Path(doc["run_dir"]) / "report.md").read_text()
    assert "target concurrency none (the profile measured no level)" in md
    head = md.split("## Kernels")[0]  # the verdict, its reasons and the Amdahl section
    for wrong in ("None", "no golden set", "n/a"):
        assert wrong not in head, wrong
    assert "The profile measured no level." in md and "No profile record" not in md


def test_a_failed_golden_recording_is_not_called_recorded(tmp_path: Path) -> None:
    """No golden set and nothing serving: the pre-flight tries to record one and fails; its
    line says it was recording, never that the golden set was recorded."""
    loc = Local(tmp_path)  # nothing serves on its port, and there is no golden set
    code, doc, err = loc(
        "rollout", "local", "--playbook", "healthcheck-only", "--set", "preflight.timeout=2"
    )
    assert code != 0, err
    (step,) = [s for s in doc["steps"] if s["name"] == "preflight"]
    assert step["status"] == "fail", step
    assert step["detail"].startswith("preflight, recording the golden set: failed "), step
    assert "golden recorded" not in err and "golden set recorded" not in err, err
    assert not (loc.root / "golden" / "golden.json").exists()


def test_ctrl_c_in_the_recheck_keeps_its_runs_and_says_which_release_serves(
    local_stopped: Local,
) -> None:
    """SIGINT while the recheck's A'' arm runs on the release before the candidate: the rollout
    exits 130, the measure step's record keeps every run that finished (measure_interrupted)
    and names the release the service was left on, the step's line says it, and that release
    is what is current and serving."""
    local = local_stopped
    src, first = _bootstrap(local)
    pb = local.tmp / "switch.yaml"
    pb.write_text(
        "change: {component: tree_build, baseline: reference, candidate: cpp}\n"
        "load: {concurrency: [1], requests: 30, input_len: 8, output_len: 16}\n"
        "steps:\n"
        "  - {step: measure, name: baseline, phase: before}\n"
        f"  - {{step: deploy, source: '{src}', max_tokens: 4, wait_s: 60}}\n"
        "  - {step: measure, phase: after, when: deployed, recheck: true, cycles: 2}\n"
        "  - {step: report}\n"
    )
    argv = [
        sys.executable,
        "-m",
        "ops",
        "rollout",
        "local",
        "--playbook",
        str(pb),
        "--inventory",
        str(local.inventory),
    ]
    stdout = (local.tmp / "rollout.out").open("w")  # stderr is read below as it comes
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=local.env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        end = time.monotonic() + 240
        while not any("is current again; the load once more" in x for x in lines):
            assert proc.poll() is None and time.monotonic() < end, "".join(lines)
            time.sleep(0.1)
        time.sleep(0.5)  # inside the A'' arm's first run (30 requests of 16 tokens)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stdout.close()
    reader.join(10)
    proc.stderr.close()
    err, out = "".join(lines), (local.tmp / "rollout.out").read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err
    line = next(x for x in lines if x.startswith("[3/4] measure: interrupted (Ctrl-C)"))
    assert f"the service runs {first} (the recheck's last switch)" in line, line
    (step,) = Path(local.env["OPS_RUNS_DIR"]).glob("*-rollout-local/03-measure/record.json")
    rec = json.loads(step.read_text())
    assert rec["outcome"] == "interrupted" and rec["exit_code"] == 130
    part = rec["measure_interrupted"]
    assert part["phase"] == "after" and part["service_runs"] == first
    arms = [r["arm"] for r in part["runs"]]
    assert arms[:2] == ["after", "after"] and set(arms) <= {"after", "A''"}, arms
    assert all(r["completed"] > 0 for r in part["runs"])
    # the release before the candidate is current, and it serves (tree_build: reference)
    assert os.readlink(local.root / "current").endswith(first)
    assert local.backends()["tree_build"] == "reference"


@pytest.mark.parametrize(
    "after, want",
    [
        ("R-cand", "the service runs R-cand (the host, after the interrupted switch)"),
        (
            None,
            "a recheck switch was interrupted and the host could not say which release is "
            "current (`ops releases local`)",
        ),
    ],
)
def test_a_switch_interrupted_in_the_recheck_names_what_the_host_says(
    monkeypatch: pytest.MonkeyPatch, after: str | None, want: str
) -> None:
    """Ctrl-C inside one of the recheck's switches (a DeployInterrupted: ops.deploy.deploy asks the
    host where it was left once its guard is done): the measure's interruption names that
    release, not the last switch the recheck had finished (which a Ctrl-C after the switch's
    post-flight, before it returned, would make wrong), or says it is not known."""
    from types import SimpleNamespace

    from ops.deploy.result import DeployInterrupted, DeployResult
    from ops.rollout import switch as rollout_switch
    from ops.rollout.playbook import MeasureStep, Playbook

    def measure(ctx, st, raw, settings):
        raw.append({"arm": "after", "run": 0})
        ctx.arms.measure_serving = ("R-before", "the recheck's last switch")  # finished before
        raise DeployInterrupted(
            DeployResult(
                target="local",
                outcome="interrupted",
                after=after,
                message="interrupted during postflight",
            )
        )

    monkeypatch.setattr(rollout_switch, "_measure", measure)
    pb = Playbook.model_validate({"steps": [{"step": "report"}]})
    ctx = SimpleNamespace(
        playbook=pb, target=SimpleNamespace(name="local"), arms=Arms(), found=Found(deploy=None)
    )
    st = MeasureStep(step="measure", phase="after", recheck=True)
    with pytest.raises(rollout_switch.MeasureInterrupted) as got:
        rollout_switch.step_measure(ctx, st, None)
    assert got.value.detail == want
    part = got.value.partial_sections["measure_interrupted"]
    assert part["service_runs"] == after and part["switch"] == "interrupted during postflight"
    assert str(got.value).startswith("1 run finished")
    assert isinstance(got.value, KeyboardInterrupt)


def test_a_ctrl_c_in_the_after_arm_names_the_deployed_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C in the after arm before any recheck switch: the candidate the deploy step made
    current is what serves, and the interruption says so; in the before phase nothing is
    claimed; inside a recheck switch whose own answer a second Ctrl-C cut short, the release
    is said to be unknown (never the one before the switch)."""
    from types import SimpleNamespace

    from ops.deploy.result import DeployResult
    from ops.rollout import switch as rollout_switch
    from ops.rollout.playbook import MeasureStep, Playbook

    cut_switch = False

    def measure(ctx, st, raw, settings):
        if cut_switch:  # inside a recheck switch, a 2nd Ctrl-C before the host was asked
            ctx.arms.measure_serving = None
        raise KeyboardInterrupt

    monkeypatch.setattr(rollout_switch, "_measure", measure)
    pb = Playbook.model_validate({"steps": [{"step": "report"}]})
    dep = DeployResult(target="local", outcome="deployed", release="R-cand", before="R-before")
    ctx = SimpleNamespace(
        playbook=pb, target=SimpleNamespace(name="local"), arms=Arms(), found=Found(deploy=dep)
    )
    with pytest.raises(rollout_switch.MeasureInterrupted) as got:
        rollout_switch.step_measure(ctx, MeasureStep(step="measure", phase="after"), None)
    assert got.value.detail == "the service runs R-cand (the deploy's switch)"
    with pytest.raises(rollout_switch.MeasureInterrupted) as got:
        rollout_switch.step_measure(ctx, MeasureStep(step="measure", phase="before"), None)
    assert got.value.detail == "" and str(got.value) == "0 runs finished"
    assert got.value.partial_sections["measure_interrupted"]["service_runs"] is None
    cut_switch = True  # no claim from an earlier switch: the release is said to be unknown
    with pytest.raises(rollout_switch.MeasureInterrupted) as got:
        rollout_switch.step_measure(ctx, MeasureStep(step="measure", phase="after"), None)
    assert got.value.detail.startswith("a recheck switch was interrupted and the host could not")
    assert got.value.partial_sections["measure_interrupted"]["service_runs"] is None


def test_a_level_the_profile_could_not_size_runs_load_requests() -> None:
    # c=32's requests all failed in the profile: no tokens/s there, so nothing to size it by
    step = Value(value=10.0)
    levels = [
        ProfileLevel(concurrency=1, step_ms=step, tokens_per_s=Value(value=100.0)),
        ProfileLevel(concurrency=8, step_ms=step, tokens_per_s=Value(value=640.0)),
        ProfileLevel(concurrency=32, step_ms=step),
    ]
    sized = sized_requests(levels, 10.0, 32)
    assert sized == {1: 32, 8: 200}
    assert run_plan([1, 8, 32], sized) == [([1], 32), ([8], 200), ([32], 0)]
    assert run_plan([1, 8, 32], {}) == [([1, 8, 32], 0)]
    assert sized_requests(levels, 0.0, 32) == {}
