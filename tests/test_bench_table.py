"""`ops bench`'s results from a real `python -m kernels.bench --json` document recorded on an H200
(benchmarks/results/2026-11-29-fb6cd56-h200-final/h200-final-2026-11-29-bench.json): the kernel
table (ours median/IQR, CUDA-graph time, both CPU baselines, torch, speedups) readable at 80
columns, and the outcome the bench's document and the probe's give together."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

import ops.cli.measure as cli_verdict
from ops.measure.bench import conclude, kernel_rows, kernel_table
from ops.sections.bench import BenchSection

REPO = Path(__file__).resolve().parent.parent
BENCH_JSON = "benchmarks/results/2026-11-29-fb6cd56-h200-final/h200-final-2026-11-29-bench.json"
H200 = json.loads((REPO / BENCH_JSON).read_text())


def probe_doc(bench_doc: dict | None, **over: Any) -> dict:
    """A probe document with calm latencies around a bench that exited 0."""
    calm = {
        "n": 10,
        "answered": 10,
        "failed": 0,
        "ms": [20.0] * 10,
        "p25_ms": 20.0,
        "p50_ms": 20.0,
        "p75_ms": 20.0,
        "errors": [],
    }
    doc = {
        "measured": True,
        "unmeasured_reason": None,
        "threshold": 0.1,
        "limit_ms": 22.0,
        "before": calm,
        "during": {**calm, "at_s": [0.1] * 10},
        "after": calm,
        "tripped": False,
        "stopped_early": False,
        "trip": None,
        "cmd": {
            "argv": ["python", "-m", "kernels.bench"],
            "pid": 1,
            "rc": 0,
            "killed": False,
            "timed_out": False,
            "duration_s": 30.0,
            "document": bench_doc,
            "stdout_tail": "",
            "stderr_tail": "",
        },
    }
    doc.update(over)
    return doc


def section() -> BenchSection:
    return BenchSection(target="h200", gpu=1, environment={"bench_env": {}})


def render(sec: BenchSection) -> str:
    buf = io.StringIO()
    saved = cli_verdict.out
    cli_verdict.out = Console(file=buf, width=80, highlight=False)
    try:
        cli_verdict._print_bench(sec)
    finally:
        cli_verdict.out = saved
    return buf.getvalue()


def test_kernel_table_of_the_h200_record() -> None:
    rows = {(g.kernel, g.size): g for g in kernel_table(kernel_rows(H200["results"])[0])}
    tree = rows[("build_trees", "B64 K8 n64")]
    assert round(tree.ours_us, 1) == 54.0 and round(tree.graph_us, 1) == 21.1
    assert round(tree.cpu_python_us) == 6783 and round(tree.cpu_cpp_us) == 240
    assert tree.speedup == {"cpu_python": 125.73, "cpu_cpp": 4.46}
    attn = rows[("tree_verify_attention", "B8 L32768 T65")]
    assert attn.torch_impl == "torch_sdpa" and attn.speedup["torch_sdpa"] == 5.44


def test_pass_outcome_and_its_table_at_80_columns() -> None:
    out = conclude(section(), probe_doc(H200), {})
    assert (out.code, out.outcome) == (0, "pass")
    sec = BenchSection.model_validate(out.section.model_dump(mode="json"))  # its record too
    assert len(sec.rows) == len(H200["results"]) and not sec.probe.tripped
    assert out.section.environment["bench"]["git_sha"] == H200["env"]["git_sha"]
    text = render(out.section)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80 and "…" not in text
    row = next(ln for ln in lines if ln.strip().startswith("B64 K8 n64"))
    assert row.split() == [
        "B64",
        "K8",
        "n64",
        "54.0",
        "2.91",
        "21.1",
        "6783",
        "240",
        "126x",
        "4.46x",
    ]
    assert "PASS" in lines[-1]


def test_refcheck_failure_and_a_crash_fail() -> None:
    bad = copy.deepcopy(H200)
    bad["refcheck_failed"] = ["build_trees {'B': 64}"]
    out = conclude(section(), probe_doc(bad), {})
    assert (out.code, out.outcome) == (1, "fail") and "differs from the reference" in out.message
    crashed = probe_doc(None)
    oom = "Traceback ...\nRuntimeError: CUDA error: out of memory"
    crashed["cmd"].update(rc=1, stderr_tail=oom)
    out = conclude(section(), crashed, {"DDTREE_BENCH_MAX_MEM_GIB": "4"})
    assert (out.code, out.outcome) == (1, "fail")
    assert out.message == "the bench exited 1: RuntimeError: CUDA error: out of memory"
    assert out.section.memory_cap == {
        "env": {"DDTREE_BENCH_MAX_MEM_GIB": "4"},
        "acknowledged_by_bench": False,
    }


def test_unmeasured_interference_is_hold() -> None:
    empty = {
        "n": 0,
        "answered": 0,
        "failed": 0,
        "ms": [],
        "p25_ms": None,
        "p50_ms": None,
        "p75_ms": None,
        "errors": [],
    }
    doc = probe_doc(
        H200,
        measured=False,
        unmeasured_reason="connection refused",
        limit_ms=None,
        during={**empty, "at_s": []},
        after=empty,
    )
    out = conclude(section(), doc, {})
    assert (out.code, out.outcome) == (3, "hold")
    assert out.section.hold_reasons == ["interference not measured: connection refused"]
    assert BenchSection.model_validate(out.section.model_dump()).probe.p50_during_ms is None


def test_a_row_that_is_no_kernel_row_fails_the_bench_named() -> None:
    """The section is built as the record's model: a row the report could not read (a NaN time,
    a batch of 0) fails the run here, named, instead of being written and refused later."""
    bad = copy.deepcopy(H200)
    bad["results"][3]["median_us"] = float("nan")
    bad["results"][5]["shape"]["B"] = 0
    out = conclude(section(), probe_doc(bad), {})
    assert (out.code, out.outcome) == (1, "fail")
    assert out.message.startswith("the bench printed 2 row(s) that are no kernel row: row 3 (")
    assert "median_us" in out.message
    assert len(out.section.rows) == len(H200["results"]) - 2
    # the record it writes reads back whole
    BenchSection.model_validate(out.section.model_dump(mode="json"))
