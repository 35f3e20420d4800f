"""Session 6's new features probed as a new user on a CPU host, with bad input.

engine.bench's interleaved runs and repeats, the
stage clock's CPU laps (a step's stages add up to its wall time) and `ops report`'s gain audit
on hand-edited copies of the committed H200 rollout records. Each case here either crashed with
a traceback before its fix or pins down behaviour a user relies on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.scripts import one_line

from engine import bench as engine_bench
from engine.runtime import EngineSpec, build_decoder
from engine.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = ROOT / "benchmarks/results/2026-12-01-b3b9d70-h200-rollouts-audit"


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_a_cpu_steps_stages_add_up_to_its_wall_time(mode) -> None:
    """engine.stage_clock on a CPU: host-clock laps, one per stage; `attention` is the part of
    verify spent in attention (inside verify, not beside it), so the other stages add up to the
    step's wall time less the step's own bookkeeping outside the clock."""
    spec = EngineSpec("tiny", mode, "cpu", (), max_batch_size=2)
    _, dec = build_decoder(spec)
    tok = ByteTokenizer()
    seqs = [dec.new_sequence(tok.encode(p)) for p in ("Hello there", "The tree of")]
    for s in seqs:
        dec.prefill(s)
    dec.step(seqs)  # warm
    walls, sums = [], []
    for _ in range(8):
        t0 = time.perf_counter()
        st = dec.step(seqs).stages
        walls.append(time.perf_counter() - t0)
        assert all(v >= 0 for v in st.values()), st
        assert st["attention"] <= st["verify"], st
        sums.append(sum(v for k, v in st.items() if k != "attention"))
        want = {"verify", "attention", "commit"}
        if mode == "ddtree":
            want |= {"draft", "topk", "tree_build", "accept"}
        assert set(st) == want, st
    for s in seqs:
        s.blocks.free()
    w, s = sorted(walls)[4], sorted(sums)[4]
    assert s <= w and s >= 0.8 * w - 2e-4, (sums, walls)


def test_engine_bench_interleaved_repeats_and_time_budget(tmp_path, capsys) -> None:
    base = ["--device", "cpu", "--preset", "tiny", "--max-tokens", "6", "--identity-tokens",
            "3", "--concurrency", "1", "2"]  # fmt: skip
    out = tmp_path / "b.json"
    assert engine_bench.main([*base, "--repeats", "3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["repeats"] == 3
    load = doc["sets"]["cpu-kernels"]["load"]
    assert [(r["mode"], r["concurrency"]) for r in load] == [
        ("ar", 1), ("ddtree", 1), ("ar", 2), ("ddtree", 2)
    ]  # fmt: skip
    for r in load:
        runs = r["tokens_per_s_runs"]
        assert len(runs) == 3 and r["tokens_per_s"] == sorted(runs)[1], r
        # every run's own account: CPU seconds, collections per generation, stage means
        detail = r["runs"]
        assert [d["tokens_per_s"] for d in detail] == runs, detail
        for d in detail:
            assert 0 < d["cpu_s"] and len(d["gc_collections"]) == 3, d
            assert d["stage_mean_ms"]["step"] > 0 and d["stage_mean_ms"]["verify"] > 0, d
        assert r["same_outputs_every_run"] and r["completed"]
    # a spent time budget skips every level for both modes, recorded
    assert engine_bench.main([*base, "--repeats", "2", "--time-budget", "0", "--json",
                              str(out)]) == 0  # fmt: skip
    load = json.loads(out.read_text())["sets"]["cpu-kernels"]["load"]
    assert load == [
        {"mode": m, "concurrency": c, "skipped": "time"} for c in (1, 2) for m in ("ar", "ddtree")
    ]
    table = capsys.readouterr().out  # the skipped levels are in the printed table too
    assert table.count("skipped (--time-budget)") == 4, table
    # an even --repeats reports the lower middle run, never the faster of two
    assert engine_bench.main([*base[:-2], "1", "--repeats", "2", "--json", str(out)]) == 0
    for r in json.loads(out.read_text())["sets"]["cpu-kernels"]["load"]:
        assert r["tokens_per_s"] == min(r["tokens_per_s_runs"]), r
    # a budget that is not a number of seconds is one line and exit 2, before anything runs
    for bad in ("nan", "-5", "inf"):
        assert engine_bench.main([*base, "--time-budget", bad, "--json", str(out)]) == 2
        assert "--time-budget must be a number of seconds >= 0" in capsys.readouterr().err


def _edited(tmp_path: Path, which: str, edit) -> Path:
    src = next((ROLLOUTS / f"rollout-{which}" / "runs").glob("*rollout-local"))
    dst = tmp_path / which / src.name
    shutil.copytree(src, dst)
    f = dst / "08-measure" / "record.json"
    rec = json.loads(f.read_text())
    edit(rec["measure"]["levels"])
    f.write_text(json.dumps(rec))
    return dst


def _report(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ops", "report", str(run), "--out", str(run) + "-out", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _set(part: str, key: str, value):
    def edit(levels):
        levels[0]["audit"][part][key] = value

    return edit


@pytest.mark.parametrize(
    ("name", "edit", "field"),
    [
        ("missing", lambda L: L[0]["audit"]["window"].pop("after_ms"), "window.after_ms"),
        ("string", _set("tree_build", "before_ms", "abc"), "tree_build.before_ms"),
        ("nan", _set("window", "before_ms", float("nan")), "window.before_ms"),
        ("a list", lambda L: L[0].__setitem__("audit", [1]), "levels.0.audit"),
        ("part null", lambda L: L[0]["audit"].__setitem__("draft", None), "audit.draft"),
    ],
)
def test_a_malformed_audit_is_exit_2_naming_the_file_and_field(tmp_path, name, edit, field):
    run = _edited(tmp_path, "tree", edit)
    p = _report(run)
    assert p.returncode == 2, (name, p.stderr)
    line = one_line(p.stderr)
    assert str(run / "08-measure" / "record.json") in line and field in line, line


def _table(md: str) -> list[str]:
    return [x for x in md.splitlines() if x.startswith("| ") and "window (wall time)" in x]


def test_the_committed_audit_renders_and_agrees_with_its_record(tmp_path) -> None:
    run = _edited(tmp_path, "attn", lambda L: None)
    p = _report(run)
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr  # HOLD, as recorded
    md = (Path(str(run) + "-out") / "report.md").read_text()
    rec = json.loads((run / "08-measure" / "record.json").read_text())
    for lv, line in zip(rec["measure"]["levels"], _table(md), strict=True):
        w = lv["audit"]["window"]
        assert line.startswith(
            f"| {lv['concurrency']} | window (wall time) | {w['before_ms']:.4f} | "
            f"{w['after_ms']:.4f} |"
        ), line
        parts = [v["before_ms"] for k, v in lv["audit"].items() if k != "window"]
        assert sum(parts) == pytest.approx(w["before_ms"], rel=1e-9)
    assert "| -0.0000 |" not in md and "attention (prefill) [the change]" in md


@pytest.mark.parametrize(
    ("name", "edit", "windows"),
    [
        ("empty dict", lambda L: L[0].__setitem__("audit", {}), 2),
        ("one level only", lambda L: [lv.pop("audit") for lv in L[1:]], 1),
    ],
)
def test_an_odd_audit_renders_without_a_traceback(tmp_path, name, edit, windows) -> None:
    run = _edited(tmp_path, "tree", edit)
    p = _report(run)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (name, p.stderr)
    md = (Path(str(run) + "-out") / "report.md").read_text()
    rows = _table(md)
    assert len(rows) == windows, rows


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("negative window", _set("window", "before_ms", -1.0)),
        ("zero window",
         lambda L: L[0]["audit"].__setitem__("window", {"before_ms": 0.0, "after_ms": 0.0})),
    ],
)  # fmt: skip
def test_a_window_of_no_time_is_bad_input(tmp_path, name, edit) -> None:
    """A window of no (or negative) time predicted a window of -0.9562 ms; the record is now
    refused as malformed (ops.verdict.evidence: a measured window takes time), one line, exit 2."""
    run = _edited(tmp_path, "tree", edit)
    p = _report(run)
    assert p.returncode == 2 and "Traceback" not in p.stderr, (name, p.stderr)
    assert "audit" in p.stderr and "window" in p.stderr, p.stderr
