"""engine.trace (DDTREE_ENGINE_TRACE) and benchmarks/attn_trace.py.

The window, for real on a CPU engine: it opens after the skipped forwards, writes one gzipped
Chrome trace after its forwards, and leaves the engine's tokens as they were. The reader, on a
hand-built GPU timeline whose every part is known: forwards found by their marker copies, graph
pieces by their shared correlation id, each attention call's lead, busy, gap, stage and tail."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from engine.trace import marker_bytes, read_marker

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "attn_trace.py"
GEN = """
import json, torch
torch.set_num_threads(1)
from engine.runtime import EngineSpec, build_decoder, generate
_, dec = build_decoder(EngineSpec(mode="ddtree"))
outs, _ = generate(dec, [[1, 2, 3, 4, 5], [7, 8, 9]], 12)
print(json.dumps(outs))
"""


def _generate(env_extra: dict[str, str]) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_ENGINE_TRACE")}
    res = subprocess.run(
        [sys.executable, "-c", GEN], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**env, **env_extra},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_markers_round_trip_and_ordinary_copies_are_not_markers() -> None:
    for rows in (1, 17, 447, 544, 576, 1152):
        for impl in ("torch", "cuda"):
            assert read_marker(marker_bytes(rows, impl)) == (rows, impl)
    for nbytes in (8, 4 * 544, 24 * 576, 8 * 1023 + 8, 1, 3, 65535, 65536, 65538):
        assert read_marker(nbytes) is None


def test_the_window_on_a_cpu_engine_writes_one_trace_and_changes_no_token(tmp_path: Path) -> None:
    plain = _generate({})
    out = tmp_path / "traces"
    traced = _generate({
        "DDTREE_ENGINE_TRACE": str(out), "DDTREE_ENGINE_TRACE_SKIP": "2",
        "DDTREE_ENGINE_TRACE_FORWARDS": "3",
    })  # fmt: skip
    assert traced == plain
    files = sorted(out.iterdir())
    assert [p.name.split("-", 2)[2] for p in files] == ["any.json.gz", "any.timers.json"], files
    with gzip.open(files[0], "rt") as f:
        events = json.load(f)["traceEvents"]
    # the forwards run 4, 2 (the two prefills), then 26 x 7, 13: two skipped, three recorded,
    # each with the engine's own clock of its attention (on a CPU: the host's)
    timers = json.loads(files[1].read_text())
    assert [(t["rows"], t["impl"]) for t in timers] == [(26, "torch")] * 3
    assert all(t["plan_host_us"] > 0 and t["calls_us"] > 0 for t in timers)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::bmm" for e in ops)  # the torch attention ran in the window
    # a window per row count, in the order they come: the forwards run 4, 2 (the prefills),
    # then 26 x 7 (two requests' steps), 13 (one left); 26's window opens at its second and
    # records three of them, 4's never opens (one skipped, no more come)
    rows = tmp_path / "rows"
    _generate({
        "DDTREE_ENGINE_TRACE": str(rows), "DDTREE_ENGINE_TRACE_ROWS": "26,4",
        "DDTREE_ENGINE_TRACE_SKIP": "1", "DDTREE_ENGINE_TRACE_FORWARDS": "3",
    })  # fmt: skip
    assert sorted(p.name.split("-")[-1] for p in rows.iterdir()) == [
        "rows26.json.gz",
        "rows26.timers.json",
    ]
    # nothing is written when the window never opens (more forwards skipped than run)
    none = tmp_path / "none"
    _generate({"DDTREE_ENGINE_TRACE": str(none), "DDTREE_ENGINE_TRACE_SKIP": "100000"})
    assert not none.exists()


def _k(name: str, ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7}}  # fmt: skip


def _mark(ts: float, rows: int, impl: str) -> dict:
    return {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": ts,
            "dur": 2.0, "args": {"bytes": marker_bytes(rows, impl), "correlation": 1}}  # fmt: skip


def _forward(t: float, corr: int, rows: int, impl: str, calls: list[list[tuple]]) -> list[dict]:
    """Marker, a plan kernel, then G0 A0 G1 A1 G2 (two layers): graph pieces of 3 kernels of
    one correlation id and 10 us each; a call's kernels given as (gap before, duration)."""
    ev = [_mark(t, rows, impl), _k("plan_pad", t + 5, 4.0, corr)]
    t += 20
    for layer in range(3):
        corr += 1
        for j in range(3):
            ev.append(_k(f"piece_gemm_{j}", t, 10.0, corr))
            t += 10
        if layer < 2:
            for gap, dur in calls[layer]:
                corr += 1
                t += gap
                ev.append(_k("bmm" if dur > 5 else "softmax", t, dur, corr))
                t += dur
            t += 3  # the tail: the next piece's launch
    return ev


def test_the_reader_takes_each_call_apart_on_a_known_timeline(tmp_path: Path) -> None:
    # torch, 17 rows: layer 0: lead 6, kernels 20 / 4 / 20 with a 2 us gap; layer 1: lead 1
    torch_fwd = _forward(0.0, 10, 17, "torch", [[(6, 20), (2, 4), (0, 20)], [(1, 20), (0, 4)]])
    cuda_fwd = _forward(1000.0, 50, 17, "cuda", [[(3, 30)], [(3, 30)]])
    cut = [_mark(2000.0, 17, "torch"), _k("piece", 2010.0, 5.0, 99)]  # cut short: ignored
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": torch_fwd + cuda_fwd + cut}, f)
    # the engine's own clock of the three forwards, in order (the cut one's is dropped with it)
    (tmp_path / "t.timers.json").write_text(json.dumps([
        {"rows": 17, "impl": "torch", "plan_host_us": 250.0, "calls_us": 80.0},
        {"rows": 17, "impl": "cuda", "plan_host_us": 40.0, "calls_us": 70.0},
        {"rows": 17, "impl": "torch", "plan_host_us": 1.0, "calls_us": 1.0},
    ]))  # fmt: skip
    out = tmp_path / "s.json"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--layers", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    summ = {(s["impl"], s["rows"]): s for s in json.loads(out.read_text())["traces"][str(path)]
            ["summary"]}  # fmt: skip
    assert set(summ) == {("torch", 17), ("cuda", 17)}
    t, c = summ[("torch", 17)], summ[("cuda", 17)]
    med = {p: t[p]["median"] for p in ("lead", "busy", "gap", "stage", "tail", "kernels")}
    assert med == pytest.approx(
        {"lead": 7.0, "busy": 68.0, "gap": 2.0, "stage": 77.0, "tail": 6.0, "kernels": 5}
    )
    assert t["plan_busy"]["median"] == 4.0 and t["pieces_busy"]["median"] == 90.0
    assert t["top_kernels"][0] == {"name": "bmm", "median_us": 60.0}
    assert c["stage"]["median"] == 66.0 and c["busy"]["median"] == 60.0
    assert c["forwards"] == 1 and t["forwards"] == 1
    assert (t["plan_host"]["median"], t["calls"]["median"]) == (250.0, 80.0)
    assert (c["plan_host"]["median"], c["calls"]["median"]) == (40.0, 70.0)
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "missing.json.gz")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1


@pytest.mark.gpu
def test_gpu_a_traced_bench_is_taken_apart_and_agrees_with_the_engines_own_clock(
    tmp_path: Path,
) -> None:
    """On a GPU: engine.attn_bench (both backends, B=8: 136-row steps) traced; the reader finds
    the steps by their markers with both backends, every call between its graph pieces, and
    the kernels' stage within 5% + 20 us of the engine's own CUDA events of the same calls."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_ENGINE_TRACE")}
    env.update(DDTREE_ENGINE_TRACE=str(tmp_path / "tr"), DDTREE_ENGINE_TRACE_ROWS="136",
               DDTREE_ENGINE_TRACE_SKIP="2", DDTREE_ENGINE_TRACE_FORWARDS="6")  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-m", "engine.attn_bench", "--device", "cuda", "--preset", "small",
         "--batch", "8", "--steps", "4", "--warm", "1", "--prompt-len", "256",
         "--same-prompt", "--prefix-span", "0", "--max-budget", "0"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    (trace,) = (tmp_path / "tr").glob("*.json.gz")
    out = tmp_path / "s.json"
    res = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--json", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert res.returncode == 0, res.stderr
    summ = {(s["impl"], s["rows"]): s for s in json.loads(out.read_text())["traces"][str(trace)]
            ["summary"]}  # fmt: skip
    assert {("torch", 136), ("cuda", 136)} <= set(summ), summ.keys()
    for key in (("torch", 136), ("cuda", 136)):
        s = summ[key]
        assert s["forwards"] >= 3 and s["busy"]["median"] > 0
        assert s["kernels"]["median"] >= 4  # at least one kernel a layer (cuda: one launch)
        stage, calls = s["stage"]["median"], s["calls"]["median"]
        assert abs(stage - calls) <= 0.05 * calls + 20, (key, stage, calls)


@pytest.mark.parametrize(
    ("var", "value", "words"),
    [
        ("DDTREE_ENGINE_TRACE_ROWS", "17,abc", "expected row counts"),
        ("DDTREE_ENGINE_TRACE_ROWS", "1_000", "expected row counts"),
        ("DDTREE_ENGINE_TRACE_SKIP", "-1", "expected an integer from 0"),
        ("DDTREE_ENGINE_TRACE_SKIP", "\u0663", "expected an integer from 0"),
        ("DDTREE_ENGINE_TRACE_FORWARDS", "0", "expected an integer from 1"),
        ("DDTREE_ENGINE_TRACE_FORWARDS", "many", "expected an integer"),
        ("DDTREE_ENGINE_TRACE_FORWARDS", "9" * 30, "to 1000000"),
        ("DDTREE_ENGINE_TRACE_CPU", "maybe", "expected 1 or 0"),
        ("DDTREE_ENGINE_TRACE", " ", "expected a directory"),
        ("DDTREE_ENGINE_TRACE", "<a file>/sub", "cannot be made"),
        ("DDTREE_ENGINE_TRACE", "<a file>", "exists and is not a directory"),
    ],
)
def test_a_bad_trace_setting_is_exit_2_in_one_line_before_anything_runs(
    var: str, value: str, words: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_ENGINE_TRACE")}
    env |= {"DDTREE_ENGINE_TRACE": str(tmp_path / "tr"), var: value}
    if value.startswith("<a file>"):  # DIR naming a file that exists, or a path under one
        (tmp_path / "f").write_text("x")
        env[var] = value.replace("<a file>", str(tmp_path / "f"))
    for argv in (["-m", "engine", "--preset", "tiny", "--port", "30997", "--check"],
                 ["-m", "engine.attn_bench", "--device", "cpu", "--preset", "tiny",
                  "--prompt-len", "64"]):  # fmt: skip
        res = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env=env)  # fmt: skip
        assert res.returncode == 2, (argv, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"${var}=" in lines[0] and words in lines[0], res.stderr
        assert "Traceback" not in res.stderr
        assert not (tmp_path / "tr").exists()


def test_a_trace_that_cannot_be_written_is_one_line_and_the_engine_goes_on(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    plain = _generate({})
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_ENGINE_TRACE")}
    env |= {"DDTREE_ENGINE_TRACE": str(blocked / "tr"), "DDTREE_ENGINE_TRACE_SKIP": "0",
            "DDTREE_ENGINE_TRACE_FORWARDS": "2"}  # fmt: skip
    res = subprocess.run([sys.executable, "-c", GEN], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == plain
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("engine.trace:")]
    assert len(notes) == 1 and "not written" in notes[0], res.stderr


def test_a_window_still_open_at_exit_is_written_by_a_bench_and_by_a_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch crashes a process that exits with its profiler open (exit 139, no file): a window
    the forwards never filled is closed and written at exit instead, with what it got. A bench
    (the forwards in the main thread) and a served engine (in its scheduler's thread, stopped
    by SIGTERM as `ops` stops it) alike."""
    out = tmp_path / "bench"
    _generate({"DDTREE_ENGINE_TRACE": str(out), "DDTREE_ENGINE_TRACE_SKIP": "2",
               "DDTREE_ENGINE_TRACE_FORWARDS": "1000"})  # fmt: skip
    timers = json.loads(next(out.glob("*-any.timers.json")).read_text())
    assert len(timers) == 8  # the 10 forwards less the 2 skipped
    from helpers.engine_server import start_engine

    svc = tmp_path / "svc"
    for k in [k for k in os.environ if k.startswith("DDTREE_ENGINE_TRACE")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("DDTREE_ENGINE_TRACE", str(svc))  # defaults: skip 8, 24 forwards
    eng = start_engine(tmp_path, preset="tiny")
    try:
        for _ in range(3):
            body = json.dumps({"prompt": "hello world", "max_tokens": 8, "temperature": 0})
            req = urllib.request.Request(eng.url + "/v1/completions", body.encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.load(r)["choices"][0]["text"] is not None
        assert not svc.exists()  # still open: fewer than 8 + 24 forwards so far
    finally:
        eng.stop()
    assert eng.proc.returncode == 0, eng.log_tail()
    (trace,) = svc.glob("*-any.json.gz")
    assert json.loads(trace.with_name(trace.name.replace(".json.gz", ".timers.json"))
                      .read_text())  # fmt: skip


def _bad(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_the_reader_refuses_what_is_not_a_trace_in_one_line(tmp_path: Path) -> None:
    def run(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip

    good = tmp_path / "good.json.gz"
    with gzip.open(good, "wt") as f:
        json.dump({"traceEvents": _forward(0.0, 10, 17, "torch", [[(1, 5)], [(1, 5)]])}, f)
    bad = {
        "list.json": "[1, 2]", "str.json": '"s"', "null.json": "null",
        "events.json": '{"traceEvents": 5}',
        "nots.json": '{"traceEvents": [{"cat": "kernel", "name": "k", "dur": 1}]}',
        "bytes.json": '{"traceEvents": [{"cat": "gpu_memcpy", "ts": 1, "dur": 1, '
                      '"args": {"bytes": "x"}}]}',
        "args.json": '{"traceEvents": [{"cat": "gpu_memcpy", "ts": 1, "dur": 1, "args": [1]}]}',
        "garbage.json.gz": b"not gzip at all",
    }  # fmt: skip
    for name, text in bad.items():
        res = run(_bad(tmp_path, name, text), "--layers", "2")
        assert res.returncode == 2, (name, res.stderr)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, (name, res.stderr)
    for side in ("not json", "[1, 2, 3]"):  # a corrupt .timers.json beside the trace
        _bad(tmp_path, "good.timers.json", side)
        res = run(good, "--layers", "2")
        assert res.returncode == 2 and "good.timers.json" in res.stderr, res.stderr
    (tmp_path / "good.timers.json").unlink()
    for args in (("--layers", "0"), ("--layers", "-1"), ("--json", tmp_path)):
        res = run(good, *args)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (args, res.stderr)
    assert run(good, "--layers", "2").returncode == 0
    # an empty trace, or layers that are not the preset's: no forward found, exit 1, said so
    for args in ((_bad(tmp_path, "empty.json", '{"traceEvents": []}'),), (good, "--layers", "4")):
        res = run(*args)
        assert res.returncode == 1 and "no traced forward" in res.stdout, (args, res.stdout)
