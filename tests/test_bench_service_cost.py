"""What a bench costs the service, on recorded data and real processes (#41):

- the service's cost (probe p50 and p99 during the bench against before, each with a 90%
  interval) from a tripped record and from a quiet one, leading the report's bench section;
- `ops bench`'s refusals on the recorded 2x H200 host: a shared bench whose cap or estimate is
  over half of the GPU's free memory, and a host whose service runs on every GPU (the
  production host) asking for --allow-shared in one line that says why;
- an out-of-memory error inside the bench (a real probe around a real failing process): one
  line in the bench's record, NO bench result, the service untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAKE_SERVICE
from helpers.sshd import free_port
from test_guard import decide, gpus_doc

from ops.measure.bench import conclude
from ops.sections.bench import BenchSection
from ops.verdict.service_cost import cost_line, percentile, service_cost

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "tests" / "fixtures" / "records"


def bench_of(name: str) -> dict:
    return json.loads((RECORDS / name / "record.json").read_text())["bench"]


def test_percentile_interpolates() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5
    assert percentile(list(range(101)), 99) == 99


def test_a_tripped_bench_costs_the_service_its_rise() -> None:
    p = bench_of("bench_tripped")["probe"]
    cost = service_cost(p["before_ms"], p["during_ms"])
    assert cost is not None and cost["p50"]["change"] > p["threshold"]
    assert cost["p50"]["lo"] <= cost["p50"]["change"] <= cost["p50"]["hi"]
    assert cost == service_cost(p["before_ms"], p["during_ms"])  # a fixed seed: same interval
    assert "p99 of 5 samples" in cost["p99_note"]
    line = cost_line(cost)
    assert line.startswith("p50 20.10 -> 26.40 ms +31.3% (90% ") and "5 before, 5 during" in line


def test_a_quiet_bench_costs_about_nothing() -> None:
    before = [10.0 + 0.01 * (i % 7) for i in range(60)]
    during = [10.0 + 0.01 * ((i + 3) % 7) for i in range(200)]
    cost = service_cost(before, during)
    assert cost is not None and abs(cost["p50"]["change"]) < 0.01
    assert cost["p50"]["lo"] < 0.01 and cost["p50"]["hi"] > -0.01
    assert service_cost([], during) is None and "not measured" in cost_line(None)


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_the_report_leads_its_bench_section_with_the_cost(tmp_path: Path, fmt: str) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops",
            "report",
            str(RECORDS / "bench_tripped"),
            "--out",
            str(tmp_path),
            "--format",
            fmt,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode in (0, 1, 3), res.stderr
    text = (tmp_path / f"report.{fmt}").read_text()
    section = text.split("Interference", 1)[1]
    cost = section.index("Cost to the service while the bench ran")
    assert cost < section.index("before"), section[:600]
    assert "+31.3%" in section


def test_a_shared_bench_may_take_half_of_what_is_free() -> None:
    doc = gpus_doc("--service-pid", "558")
    free = next(g for g in doc["gpus"] if g["index"] == 1)["memory_free_mib"] / 1024
    g = decide(doc, 1, allow_shared=True, max_mem_gib=round(free * 0.6))
    assert g.verdict == "refused", g.findings
    assert "may take at most 50% of it" in g.message and "--max-mem-gib" in g.hint
    assert decide(doc, 1, allow_shared=True, max_mem_gib=round(free * 0.4)).verdict == "ok"


def test_the_service_on_every_gpu_asks_for_allow_shared_and_says_why() -> None:
    doc = gpus_doc("--service-pid", "558")
    for g in doc["gpus"]:  # tensor parallel: the service's process on each GPU
        g["processes"] = [{"pid": 558, "service": True, "used_memory_mib": 4096}]
    g = decide(doc, 1, service_pid=558)
    assert g.verdict == "refused"
    assert "in use by the service" in g.message
    assert "runs on every GPU of h200 (2; tensor parallel)" in g.message
    assert "pass --allow-shared" in g.message
    assert decide(doc, 1, service_pid=558, allow_shared=True).verdict == "ok"


OOM_BENCH = (
    "import sys, time; time.sleep(1.0); "
    "print('Traceback (most recent call last):', file=sys.stderr); "
    "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 "
    "has a total capacity of 139.81 GiB of which 3.10 GiB is free.', file=sys.stderr); "
    "sys.exit(1)"
)


def test_an_out_of_memory_bench_is_one_line_and_the_service_is_untouched(tmp_path: Path) -> None:
    port = free_port()
    svc = subprocess.Popen(
        [sys.executable, str(FAKE_SERVICE), "--port", str(port), "--mode", "ok"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "checks.probe",
                    "--json",
                    "--url",
                    url,
                    "--before",
                    "5",
                    "--after",
                    "3",
                    "--threshold",
                    "5",
                    "--",
                    sys.executable,
                    "-c",
                    OOM_BENCH,
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=120,
            )
            doc = json.loads(probe.stdout)
            if doc["measured"]:
                break
            time.sleep(0.5)
        assert doc["cmd"]["rc"] == 1 and not doc["tripped"], doc
        cap = {"DDTREE_BENCH_MAX_MEM_GIB": "12"}
        out = conclude(BenchSection(target="local", gpu=0), doc, cap)
        assert (out.code, out.outcome) == (1, "fail")
        assert out.message.startswith("the bench ran out of GPU memory (its cap 12 GiB): ")
        assert "\n" not in out.message and "CUDA out of memory" in out.message
        assert out.section.service_cost is not None  # the probe still says what it cost
        assert svc.poll() is None  # the service runs on: the bench's OOM was its own
    finally:
        svc.kill()
        svc.wait()


def test_the_engine_can_hold_a_serving_stacks_memory_share() -> None:
    """`python -m engine --mem-fraction F` (the GPU-bound service of the device run holds most
    of the GPU as SGLang does): a fraction outside 0.01..0.95 is one line, exit 2."""
    for bad in ("0", "0.99", "x"):
        res = subprocess.run(
            [sys.executable, "-m", "engine", "--mem-fraction", bad, "--check"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert res.returncode == 2 and "--mem-fraction" in res.stdout + res.stderr, res
    res = subprocess.run(
        [sys.executable, "-m", "engine", "--mem-fraction", "0.8", "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr


RUN = REPO / "benchmarks" / "results" / "2026-12-05-40a2804-h100-bench-beside-service"


def recorded(name: str) -> dict:
    for line in (RUN / "benches.jsonl").read_text().splitlines():
        b = json.loads(line)
        if b["name"] == name:
            return b["doc"]
    raise KeyError(name)


def test_the_device_runs_record_reads_back_the_same_cost() -> None:
    """The H100 run's documents (bench-beside-service.sh): the cost each bench recorded is what
    service_cost makes of its probe samples again; a tripped bench (heavy) is NO-GO, a quiet one
    (topk alone) passed, and the over-cap bench was refused with the half-of-free rule."""
    summary = json.loads((RUN / "summary.json").read_text())
    by = {r["bench"]: r for r in summary["benches"]}
    for name in ("default", "heavy", "topk", "tree", "accept"):
        doc = recorded(name)
        p = doc["probe"]
        assert service_cost(p["before_ms"], p["during_ms"]) == doc["service_cost"], name
        assert by[name]["service_cost"] == doc["service_cost"]
    heavy, topk = recorded("heavy"), recorded("topk")
    assert heavy["outcome"] == "no-go" and heavy["probe"]["tripped"]
    assert topk["outcome"] == "pass" and not topk["probe"]["tripped"]
    over = recorded("over-cap")
    assert over["outcome"] == "refused" and "may take at most 50% of it" in over["message"]
    assert all(h["identity_pct"] == 100.0 for h in summary["healthchecks"])
