"""What a new user hit when probing today's features, each fixed and pinned here:

- `ops report` on a record with a nonsense number (a negative or > 1 wall share, its prefill
  part larger than the share or not a number, a negative stage time, a service speedup <= 0)
  was a traceback or a nonsense f / ceiling / "the service saw -1x"; it is exit 2 naming the
  file and the field.
- the profile's wall share never writes a prefill part larger than the (capped) share.
- `load.run_seconds` with no profile step before measure was silently ignored; it is a
  playbook error naming the field. A level the profile measured no tokens/s at (all its
  requests failed) made measure's plan a KeyError; it runs load.requests, and says so.
- `python -m kernels.bench --stage-shape a,b,c` said "invalid literal for int()"; it names the
  flag.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_report import RECORDS, ops_report

from ops.measure.counters import wall_shares
from ops.rollout.playbook import PlaybookError
from ops.rollout.playbook_load import load_playbook
from ops.rollout.steps import sized_requests
from ops.rollout.switch import run_plan

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> dict:
    return json.loads((RECORDS / name / "record.json").read_text())


def _records(tmp: Path, mutate: Callable[[dict[str, dict]], None]) -> list[str]:
    """The attention rollout's records (change, bench, wall-share profile, measure with the
    service's s), mutated, written under tmp; preflight from the fixtures."""
    change = _load("rollout_attn_change")
    prof = _load("profile_attn_wall")
    for lv in prof["profile"]["levels"]:
        lv["wall_share"]["attention"]["prefill"] = 0.1
    meas = _load("rollout_attn/06-measure")
    for lv in meas["measure"]["levels"]:
        lv["service_speedup"] = {"total": 2.5, "steps": 2.8, "prefill": 1.9}
    recs = {"change": change, "bench": _load("bench_attn"), "profile": prof, "measure": meas}
    mutate(recs)
    out = [str(RECORDS / "preflight_ok")]
    for name, rec in recs.items():
        d = tmp / "recs" / name
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(rec))
        out.append(str(d))
    return out


def _share(recs: dict[str, dict]) -> dict[str, Any]:
    return recs["profile"]["profile"]["levels"][0]["wall_share"]["attention"]


def _svc(recs: dict[str, dict], value: dict[str, Any]) -> None:
    recs["measure"]["measure"]["levels"][0]["service_speedup"] = value


CASES: list[tuple[str, Callable[[dict[str, dict]], None], str, str]] = [
    ("share_negative", lambda r: _share(r).update(value=-0.2), "profile",
     "profile.levels.0.wall_share: attention.value: a share of the wall time"),
    ("share_over_one", lambda r: _share(r).update(value=1.5), "profile",
     "attention.value: a share of the wall time is in [0, 1], got 1.5"),
    ("share_p25_negative", lambda r: _share(r).update(p25=-0.5), "profile",
     "attention.p25: a share of the wall time is in [0, 1], got -0.5"),
    ("prefill_over_share", lambda r: _share(r).update(prefill=0.9), "profile",
     "attention.prefill: the part in prefill is in [0, the share 0.25], got 0.9"),
    ("prefill_negative", lambda r: _share(r).update(prefill=-0.1), "profile",
     "attention.prefill: the part in prefill is in [0, the share 0.25], got -0.1"),
    ("prefill_string", lambda r: _share(r).update(prefill="abc"), "profile",
     "attention.prefill: must be a number, got 'abc'"),
    ("prefill_list", lambda r: _share(r).update(prefill=[1]), "profile",
     "attention.prefill: must be a number, got [1]"),
    ("stage_negative",
     lambda r: r["profile"]["profile"]["levels"][1]["stage_ms"]["attention"].update(value=-3),
     "profile", "profile.levels.1.stage_ms: attention.value: a time is a number"),
    ("service_total_negative", lambda r: _svc(r, {"total": -1}), "measure",
     "measure.levels.0.service_speedup: total: a speedup is a number > 0"),
    ("service_steps_zero", lambda r: _svc(r, {"steps": 0}), "measure",
     "steps: a speedup is a number > 0, got 0.0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "record", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_nonsense_number_in_a_record_is_exit_2_naming_file_and_field(
    tmp_path: Path, mutate: Callable[[dict[str, dict]], None], record: str, words: str
) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ops", "report", *_records(tmp_path, mutate), "--json",
         "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")},
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    line = res.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith(f"error: {tmp_path / 'recs' / record / 'record.json'}: "), line
    assert words in line, line


def test_the_unmutated_records_still_make_a_report(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *_records(tmp_path, lambda r: None), args=("-c", "1"))
    assert code in (0, 1, 3), doc
    row = next(r for r in doc["amdahl"] if r["concurrency"] == 1)
    assert row["f"] == pytest.approx(0.25)
    assert row["service_speedup"] == {"total": 2.5, "steps": 2.8, "prefill": 1.9}


def _snap(clock: float, steps: int, attn_steps: float, prefills: int, attn_pre: float) -> dict:
    state = {
        "clock_s": clock,
        "step_time_breakdown": {"1": {"steps": steps, "total_s": {"step": attn_steps * 2,
                                                                  "attention": attn_steps}}},
        "prefill_time_breakdown": {"prefills": prefills, "tokens": 0,
                                   "total_s": {"prefill": attn_pre * 2, "attention": attn_pre}},
    }  # fmt: skip
    return {"server_info": {"internal_states": [state]}}


def test_the_prefill_part_is_never_more_than_the_capped_share() -> None:
    # the service's counters span more than the client's window (1.5 s of attention in 1 s):
    # the share is capped at 1 and its prefill part with it, so the record stays readable
    start, end = _snap(0.0, 0, 0.0, 0, 0.0), _snap(1.0, 10, 0.5, 2, 1.2)
    lt = {"duration_s": 1.0, "counters": {"start_lead_s": 0.0, "end_lag_s": 0.0}}
    steps = {1: {"steps": 10, "total_s": {"step": 1.0, "attention": 0.5}}}
    shares, _ = wall_shares(steps, start, end, lt)  # type: ignore[arg-type]
    att = shares["attention"]
    assert att["value"] == 1.0
    assert att["prefill"] == 1.0
    # an ordinary window keeps the prefill part as it is
    start, end = _snap(0.0, 0, 0.0, 0, 0.0), _snap(1.0, 10, 0.2, 2, 0.1)
    steps = {1: {"steps": 10, "total_s": {"step": 0.4, "attention": 0.2}}}
    shares, _ = wall_shares(steps, start, end, lt)  # type: ignore[arg-type]
    assert shares["attention"]["value"] == pytest.approx(0.3)
    assert shares["attention"]["prefill"] == pytest.approx(0.1)


def test_run_seconds_without_a_profile_step_is_a_playbook_error(tmp_path: Path) -> None:
    path = tmp_path / "pb.yaml"
    path.write_text(
        "change: {component: tree_build, baseline: reference, candidate: cuda}\n"
        "load: {run_seconds: 30}\n"
        "steps:\n"
        "  - {step: healthcheck, name: preflight}\n"
        "  - {step: decide}\n"
        "  - {step: measure, name: baseline, phase: before}\n"
        "  - {step: report}\n"
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(str(path))
    err = info.value
    assert err.field == "load.run_seconds" and err.step == "baseline"
    assert "no profile step comes before this one" in err.message
    assert "\n" not in err.message
    # the same playbook with a profile step first, or without run_seconds, is fine
    load_playbook(str(path), ["load.run_seconds=0"])
    text = path.read_text().replace("  - {step: decide}", "  - {step: profile}\n  - {step: decide}")
    path.write_text(text)
    assert load_playbook(str(path)).load.run_seconds == 30


def test_the_shipped_playbooks_take_run_seconds() -> None:
    for name in ("rollout", "rollout-attention"):
        assert load_playbook(name, ["load.run_seconds=20"]).load.run_seconds == 20
        # a run (and a sized profile window) is one loadtest call, which may last an hour
        with pytest.raises(PlaybookError) as info:
            load_playbook(name, ["load.run_seconds=1801"])
        assert info.value.field == "load.run_seconds", info.value


def test_a_level_the_profile_could_not_size_runs_load_requests() -> None:
    # c=32's requests all failed in the profile: no tokens/s there, so nothing to size it by
    levels = [
        {"concurrency": 1, "tokens_per_s": {"value": 100.0}},
        {"concurrency": 8, "tokens_per_s": {"value": 640.0}},
        {"concurrency": 32},
    ]
    sized = sized_requests(levels, 10.0, 32)
    assert sized == {1: 32, 8: 200}
    assert run_plan([1, 8, 32], sized) == [([1], 32), ([8], 200), ([32], 0)]
    assert run_plan([1, 8, 32], {}) == [([1, 8, 32], 0)]
    assert sized_requests(levels, 0.0, 32) == {}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a,b,c", "--stage-shape takes comma-separated integers, got 'a,b,c'"),
        ("7,16", "--stage-shape takes H,K,BUDGET >= 1 like 7,16,16: (7, 16)"),
    ],
)
def test_bench_names_a_bad_stage_shape(value: str, words: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--suite", "tree", "--stage-shape", value,
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"error: {words}"


@pytest.mark.parametrize("value", ["0", ",", "1,0,8"])
def test_bench_refuses_a_batch_below_one(value: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "kernels.bench", "--suite", "tree", "--batch", value, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().startswith("error: --batch takes batch sizes >= 1 like 1,8,64")


def test_no_kernel_rows_names_the_impls_the_bench_has(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, "preflight_ok", "bench_topk_only", "profile_tree",
                           "rollout_tree", args=("--threshold", "0.005"))  # fmt: skip
    (hold,) = [h for h in doc["holds"] if h["code"] == "no_kernel_rows"]
    assert "(its impls there:" not in hold["message"]  # it has no tree rows at all
    change = json.loads((RECORDS / "rollout_attn_change" / "record.json").read_text())
    change["change"]["baseline_impl"] = "nonsense_impl"
    d = tmp_path / "recs" / "change"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps(change))
    code, doc = ops_report(tmp_path, "preflight_ok", "bench_attn", "profile_attn_wall", str(d))
    (hold,) = [h for h in doc["holds"] if h["code"] == "no_kernel_rows"]
    assert "rows of both nonsense_impl and cuda" in hold["message"], hold
    assert "(its impls there: cuda, cuda_graph, torch_sdpa)" in hold["message"], hold
