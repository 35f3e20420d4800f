"""benchmarks/shadow_vs_service.py on the committed H200 pair it was written for (e30be2b): it
reads the records alone and prints the numbers benchmarks/NOTES-attention.md quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "benchmarks" / "results" / "2026-12-03-e30be2b-h200-rollouts-shadow"


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "benchmarks" / "shadow_vs_service.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_the_pair_reads_as_the_notes_quote_it() -> None:
    (attn,) = PAIR.glob("rollout-attn/runs/*-rollout-local")
    (tree,) = PAIR.glob("rollout-tree/runs/*-rollout-local")
    res = _run(str(attn), str(tree))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # the attention at c=32: the candidate's prefill cost as in the service, the baseline's not
    assert "c=32 measured +40.8%" in out
    assert "shadow baseline 15223, candidate 9984 (s 1.52x); service baseline 17751 (-14% in the" \
        " shadow), candidate 9956 (+0%) (s 1.78x)" in out  # fmt: skip
    # the tree at c=32: f over the profile's window against f over the A/A pair's runs
    assert "c=32 measured +19.1%: f profile 0.235 -> +26.6%, A/A 0.205 -> +22.5%" in out
    # on the measure's own baseline window, with the candidate's parts at the profile's: the
    # attention's c=32 miss shrinks from +12.4 to +3.2 pp, inside the measured interval
    assert (
        "on the measure's baseline (10 runs, 0.5257 ms per output token, the change's parts "
        "0.4244) with the candidate at the profile's 0.2808: +37.6% (measured - this +3.2 pp; "
        "the report's projection +28.4%, +12.4 pp; measured interval +35.5%..+46.2%)"
    ) in out
    assert out.count("on the measure's baseline (10 runs") == 6  # every level of both changes


def test_no_argument_is_usage_and_exit_2() -> None:
    res = _run()
    assert res.returncode == 2 and "Usage:" in res.stderr
    res = _run("--help")
    assert res.returncode == 2 and "Usage:" in res.stderr and "Traceback" not in res.stderr
    res = _run(str(REPO / "README.md"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "README.md: not a rollout run directory this reads" in res.stderr, res.stderr


def test_an_older_rollout_is_read_where_it_can_be() -> None:
    """A rollout from before the shadow (b3b9d70: the bench's s, a report.json with no measured
    interval): its levels print what the record has, or say they are not read; no traceback."""
    old = REPO / "benchmarks" / "results" / "2026-12-01-b3b9d70-h200-rollouts-audit"
    (tree,) = old.glob("rollout-tree/runs/*-rollout-local")
    res = _run(str(tree))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert res.stdout.count("on the measure's baseline") == 3, res.stdout
    assert "measured interval" not in res.stdout


def test_on_baseline_all_tallies_the_pair_by_where_s_came_from(tmp_path: Path) -> None:
    """benchmarks/on_baseline_all.py over a results folder holding only the e30be2b pair: every
    level with both projections, and the shadow's tally as NOTES-attention.md quotes it."""
    (tmp_path / PAIR.name).symlink_to(PAIR)
    script = REPO / "benchmarks" / "on_baseline_all.py"
    res = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert sum("[shadow s]" in x for x in lines) == 6
    assert (
        "attn c=32: measured +40.8% (+35.5..+46.2); the report's +28.4% (+12.4 pp); on the "
        "baseline +37.6% (+3.2 pp) [shadow s]"
    ) in res.stdout
    assert (
        "s from the shadow (6 levels): report: 3 inside, 3 within 3 pp, mean |miss| 5.3 pp; "
        "on_baseline: 6 inside, 4 within 3 pp, mean |miss| 1.9 pp"
    ) in res.stdout
    assert "s from the bench, attn: no levels" in res.stdout
    assert "(-0.0 pp)" not in res.stdout and "(+0.0 pp)" in res.stdout  # e30be2b tree c=1
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2 and "Usage:" in res.stderr


def test_on_baseline_all_names_a_run_it_cannot_rebuild(tmp_path: Path) -> None:
    """A rollout whose records `ops report` refuses (a profile's tokens/s made NaN by hand) is
    named on stderr and left out, and the exit is 1: a tally never drops a run silently."""
    import shutil

    copy = tmp_path / PAIR.name
    shutil.copytree(PAIR / "rollout-tree", copy / "rollout-tree")
    (prof,) = copy.glob("rollout-tree/runs/*-rollout-local/*-profile/record.json")
    doc = json.loads(prof.read_text())
    doc["profile"]["levels"][0]["tokens_per_s"]["value"] = float("nan")
    prof.write_text(json.dumps(doc))
    script = REPO / "benchmarks" / "on_baseline_all.py"
    res = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert "left out: ops report exit 2" in res.stderr and "tokens_per_s" in res.stderr, res.stderr
    assert "1 of 1 rollouts left out" in res.stderr
    assert "s from the shadow: no levels" in res.stdout
