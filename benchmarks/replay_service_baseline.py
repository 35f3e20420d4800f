"""Replay a committed rollout's projection with another s: the baseline's time as the service
paid it (the profile's stage time at batch c, and its prefill time per prompt) over the
candidate's bench time, against the report's s (baseline bench time / candidate bench time).
Where the report's s came from the shadow (engine.shadow), the replay reads the bench's rows the
report kept beside it, and says what the shadow projected.

An estimator tried on the records and not adopted (benchmarks/NOTES-attention.md): it moves
some misses toward zero and others away, because the profile's one short window is noisier
than the bench's ratio. No GPU; reads only the run directories it is given.

Usage: python3 benchmarks/replay_service_baseline.py RUN_DIR...   (rollout run directories)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def gain(f: float, f_dec: float, s_dec: float, f_pre: float = 0.0, s_pre: float = 1.0) -> float:
    """Amdahl with two parts of f, each at its own s (ops.verdict.decide.projected_gain's model)."""
    return 1 / ((1 - f) + f_dec / s_dec + (f_pre / s_pre if f_pre else 0.0)) - 1


def replay(run: Path) -> list[dict]:
    rep = json.loads((run / "report.json").read_text())
    prof = json.loads((run / "03-profile" / "record.json").read_text())["profile"]
    comp = rep["change"]["component"]
    rows = []
    for row, lv in zip(rep["amdahl"], prof["levels"], strict=True):
        f, f_pre = row["f"], row.get("f_prefill") or 0.0
        sp, pre = row["speed"], row.get("prefill_speed")
        shadow = "shadow" in (sp.get("source"), (pre or {}).get("source"))
        if shadow:  # the projection the report made, beside the bench's below
            rows_shadow = row["gain"]
        if "shadow" in (sp.get("source"), (pre or {}).get("source")):
            # the shadow's times are per forward in the service, not the bench's per call:
            # the bench's rows, where the report kept them, are what this replay reads
            sp, pre = row.get("bench_speed") or sp, row.get("bench_prefill_speed") or pre
        base_service_us = lv["stage_ms"][comp]["value"] * 1000
        s_dec = base_service_us / sp["candidate_us"]
        s_pre = 1.0
        if pre:
            w = lv["window"]
            s_pre = f_pre * w["duration_s"] / w["prefills"] * 1e6 / pre["candidate_us"]
        report_gain = gain(f, f - f_pre, sp["s"], f_pre, pre["s"] if pre else 1.0)
        rows.append({
            "concurrency": row["concurrency"],
            "measured": row["measured_gain"],
            # the bench's s (the report's own where it projected with the bench's)
            "report": {"s": sp["s"], "s_prefill": pre["s"] if pre else None, "gain": report_gain},
            "shadow": rows_shadow if shadow else None,  # the report's, where s was the shadow's
            "service_baseline": {"s": s_dec, "s_prefill": s_pre if pre else None,
                                 "gain": gain(f, f - f_pre, s_dec, f_pre, s_pre)},
        })  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for d in argv:
        print(d)
        for r in replay(Path(d)):
            m, a, b = r["measured"], r["report"]["gain"], r["service_baseline"]["gain"]
            if r["shadow"] is not None:
                print(
                    f"  c={r['concurrency']:2} the report projected {r['shadow']:+.1%} with the "
                    f"shadow's s (miss {100 * (m - r['shadow']):+.1f} pp); with the bench's:"
                )
            print(
                f"  c={r['concurrency']:2} measured {m:+.1%}  report {a:+.1%} (miss "
                f"{100 * (m - a):+.1f} pp)  service baseline {b:+.1%} "
                f"(miss {100 * (m - b):+.1f} pp)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
