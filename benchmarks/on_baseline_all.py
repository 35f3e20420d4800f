"""The report's projection beside its projection on the measure's own baseline, over every
committed H200 rollout: rebuilt with `ops report` from each run directory's records (into a
temporary directory), one line per level with a measured gain, and a tally per group.

Each level: the measured gain and its 90% interval, the report's projection and its miss
(measured - projection, points), and the projection on the measure's own baseline
(ops.verdict.gain_audit.baseline_lines: the baseline runs' window with only the change's parts at
the
candidate's cost as the profile saw it) and its miss. Tallies: levels inside the measured
interval, within 3 points, and the mean absolute miss, for the shadow pairs (s from the
engine's shadow) and for the older rollouts (s from the bench), the attention and the tree
apart.

A diagnosis of committed runs: nothing here feeds a verdict. No GPU. A run whose report cannot
be rebuilt is named on stderr and left out of the tallies, and the exit is 1.

Usage: python3 benchmarks/on_baseline_all.py [RESULTS_DIR]   (default benchmarks/results)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECTION = re.compile(r"^c=(\d+): .* the projection is ([+-][\d.]+)%;")
REPO = Path(__file__).resolve().parents[1]  # the checkout whose `ops` rebuilds the reports


class ReportFailed(Exception):
    """`ops report` gave no report for a run directory (a bad record: exit 2, its one line)."""


def levels(run: Path) -> list[dict]:
    """The run's levels with a projection on the measure's baseline, from its rebuilt report."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ops", "report", str(run), "--out", out, "--format", "md"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        path = Path(out) / "report.json"
        if not path.exists():
            why = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise ReportFailed(f"ops report exit {res.returncode}: {why}")
        rep = json.loads(path.read_text())
    rows = {r["concurrency"]: r for r in rep["amdahl"]}
    got = []
    for line in (rep.get("gain_audit") or {}).get("on_baseline", []):
        m = PROJECTION.match(line)
        if not m:
            continue
        row = rows[int(m.group(1))]
        got.append(
            {
                "c": int(m.group(1)),
                "measured": 100 * row["measured_gain"],
                "lo": 100 * row["measured_lo"],
                "hi": 100 * row["measured_hi"],
                "report": 100 * row["gain"],
                "on_baseline": float(m.group(2)),
                "shadow": (row.get("speed") or {}).get("source") == "shadow",
            }
        )
    return got


def tally(name: str, rows: list[dict]) -> str:
    if not rows:
        return f"{name}: no levels"
    parts = []
    for key in ("report", "on_baseline"):
        inside = sum(r["lo"] <= r[key] <= r["hi"] for r in rows)
        within = sum(abs(r["measured"] - r[key]) <= 3 for r in rows)
        mean = statistics.fmean(abs(r["measured"] - r[key]) for r in rows)
        parts.append(f"{key}: {inside} inside, {within} within 3 pp, mean |miss| {mean:.1f} pp")
    return f"{name} ({len(rows)} levels): " + "; ".join(parts)


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path("benchmarks/results")
    if not root.is_dir():
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    runs = sorted(root.glob("*/rollout-*/runs/*-rollout-*")) + sorted(
        root.glob("*/runs/*-rollout-*")
    )
    every: list[dict] = []
    failed = 0
    for run in runs:
        change = next((p.name for p in run.parents if p.name.startswith("rollout-")), "rollout")
        try:
            got = levels(run)
        except ReportFailed as exc:  # said, and counted: a tally never drops a run silently
            print(f"{run}: left out: {exc}", file=sys.stderr)
            failed += 1
            continue
        for r in got:
            r["change"], r["folder"] = change.removeprefix("rollout-"), run.parts[-4]
            every.append(r)
            print(
                f"{run.relative_to(root).parts[0]} {r['change']:>4} c={r['c']:>2}: measured "
                f"{r['measured']:+.1f}% ({r['lo']:+.1f}..{r['hi']:+.1f}); the report's "
                f"{r['report']:+.1f}% ({pp(r['measured'] - r['report'])}); on the "
                f"baseline {r['on_baseline']:+.1f}% ({pp(r['measured'] - r['on_baseline'])})"
                + (" [shadow s]" if r["shadow"] else "")
            )
    print(tally("s from the shadow", [r for r in every if r["shadow"]]))
    older = [r for r in every if not r["shadow"]]
    for change in ("attn", "tree"):
        print(tally(f"s from the bench, {change}", [r for r in older if r["change"] == change]))
    if not runs:
        print(f"{root}: no rollout run directories under it", file=sys.stderr)
        return 2
    if failed:
        print(f"{failed} of {len(runs)} rollouts left out: their reports failed", file=sys.stderr)
        return 1
    return 0


def pp(x: float) -> str:
    """A difference in points, signed; one that rounds to zero is +0.0."""
    s = f"{x:+.1f}"
    return ("+0.0" if s == "-0.0" else s) + " pp"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
