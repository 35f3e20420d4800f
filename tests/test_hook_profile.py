"""How `ops profile` makes the hook's readings into f and s (ops.measure.counters.hook_level,
ops.measure.shadow.hook_shadow), on readings of several processes as `checks.hook_counters`
prints them: the largest share over the processes, a process started inside the window counted
from zero, one gone before its end counted as gone, the shadow's own time taken out of the
wall time, s pooled over the processes' compared calls with its interval from their pairs."""

from __future__ import annotations

import pytest

from ops.measure.counters import hook_level
from ops.measure.shadow import hook_shadow
from ops.sections.profile import ProfileLevel


def fn(calls: int, seconds: float, shadow: dict | None = None) -> dict:
    return {"calls": calls, "seconds": seconds, "errors": 0, "shadow": shadow}


def sh(
    compared: int, stock_s: float, cand_s: float, overhead_s: float, ring: list, mismatched: int = 0
) -> dict:
    return {
        "every": 2,
        "compared": compared,
        "mismatched": mismatched,
        "stock_s": stock_s,
        "cand_s": cand_s,
        "cand_errors": 0,
        "overhead_s": overhead_s,
        "saved": 0,
        "pairs": compared,
        "ring": ring,
    }


def proc(pid: int, tb: dict, ac: dict) -> dict:
    return {
        "pid": pid,
        "start_ticks": 100 + pid,
        "file": f"{pid}.bin",
        "created": 0.0,
        "components": {"tree_build": tb, "accept": ac},
    }


STATUS = {
    "spec": "shadow:tree_build=cpp/2",
    "shadowed": {"build_ddtree_tree_from_topk": "shadow:tree_build=cpp/2"},
}


def ring(n: int) -> list:
    return [[i, 50_000_000, 10_000_000] for i in range(n)]  # each pair: stock 50 ms, cand 10


def readings() -> tuple[dict, dict]:
    start = {
        "processes": [
            proc(1, fn(10, 0.5, sh(5, 0.25, 0.05, 0.1, ring(5))), fn(10, 0.01)),
            proc(2, fn(10, 0.4), fn(10, 0.01)),
            proc(3, fn(0, 0.0), fn(0, 0.0)),  # gone before the window's end
        ],
        "status": STATUS,
        "dead": 0,
    }
    end = {
        "processes": [
            # pid 1: 1.0 s more in the builder, its shadow spent 0.5 s of the window
            proc(1, fn(30, 1.5, sh(15, 0.75, 0.15, 0.6, ring(15))), fn(30, 0.05)),
            proc(2, fn(30, 1.6), fn(30, 0.03)),  # 1.2 s more, no shadow
            proc(4, fn(5, 0.2), fn(0, 0.0)),  # started inside the window
            proc(5, fn(0, 0.0), fn(0, 0.0)),  # never calls them (the HTTP server)
        ],
        "status": STATUS,
        "dead": 1,
    }
    return start, end


def test_f_is_the_largest_share_over_the_processes_less_the_shadows_time() -> None:
    start, end = readings()
    h = hook_level(start, end, duration=10.0)
    assert (h["live"], h["gone_in_window"], h["dead_skipped"]) == (4, 1, 1)
    rows = {r["pid"]: r for r in h["processes"]}
    assert rows[4]["new_in_window"] and rows[4]["components"]["tree_build"]["calls"] == 5
    assert rows[1]["shadow_overhead_s"] == pytest.approx(0.5)
    # pid 1: 1.0 s / (10 - 0.5) = 10.5%; pid 2: 1.2 s / 10 = 12%: the largest is f
    assert rows[1]["components"]["tree_build"]["share"] == pytest.approx(1.0 / 9.5)
    f = h["wall_share"]["tree_build"]
    assert f["value"] == pytest.approx(0.12) and f["source"] == "hook" and f["n"] == 20
    assert f["processes"] == 3 and "pid 2: 1.2000 s in 20 calls" in f["note"]
    assert "the largest share over the service's processes" in f["note"]
    assert h["wall_share"]["accept"]["value"] == pytest.approx(0.04 / 9.5)
    # a level's record with it reads back as evidence: f_of gives the hook's number
    lv = ProfileLevel.model_validate(
        {
            "concurrency": 4,
            "step_ms": {"value": 5.0, "source": "derived"},
            "wall_share": h["wall_share"],
        }
    )
    got, basis = lv.f_of("tree_build")
    assert got.source == "hook" and basis == "wall" and got.value == pytest.approx(0.12)


def test_s_is_pooled_over_the_window_compared_calls() -> None:
    start, end = readings()
    h = hook_level(start, end, duration=10.0)
    s = hook_shadow(h, end, "tree_build", "cpp")
    assert s is not None and s["source"] == "hook" and s["error"] is None
    assert (s["candidate"], s["every"], s["compared"], s["mismatched"]) == ("cpp", 2, 10, 0)
    # the window's compared calls: 0.5 s of stock against 0.1 s of candidate
    assert s["step"]["s"] == pytest.approx(5.0) and s["step"]["forwards"] == 10
    assert s["step"]["lo"] == pytest.approx(5.0) == s["step"]["hi"]  # every pair 5x
    assert s["step"]["pairs_in_interval"] == 10  # the ring's pairs written in the window
    assert s["step"]["base_us"] == pytest.approx(50_000)
    assert s["step"]["cand_us"] == pytest.approx(10_000)
    # asked for another candidate than the one the hook shadows: said, no s for the report
    other = hook_shadow(h, end, "tree_build", "cuda")
    assert other is not None and "not cuda" in other["error"]
    # asked for a function the hook does not shadow: how to arm it
    none = hook_shadow(h, end, "accept", "cpp")
    assert none is not None and none["offered"] is False
    assert "DDTREE_OPS_SGLANG=shadow:accept=cpp" in none["error"]
    assert hook_shadow(h, end, "accept", None) is None
