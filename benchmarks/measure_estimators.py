"""Compare the measured gain's two estimators over every committed rollout.

For each measured level of each rollout under benchmarks/results (its measure record and its
report.json's projection), the gain two ways, over the same runs (after against every baseline
run: ops.verdict.amdahl.baseline_runs):

- pooled: each arm's runs pooled, tokens over time (ops.verdict.amdahl.rate_gain, the report's
  measured gain since abf5281), with its 90% bootstrap interval (ops.verdict.amdahl.gain_interval);
- median: median after / median before - 1 (the measured gain before abf5281), with its
  interval bootstrapped over the same draws (ops.verdict.amdahl.gain_interval with median_gain).

Prints a table and a summary (mean interval width; how many levels each is narrower at; how
many are within 3 pp of the projection), or one JSON document with --json.

    python3 benchmarks/measure_estimators.py [--json] [RESULTS_DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from pydantic import ValidationError

from ops.verdict.amdahl import GAIN_INTERVAL, gain_interval, median_gain, rate_gain
from ops.verdict.evidence import MeasureLevel

HERE = Path(__file__).resolve().parent
WITHIN = 0.03  # issue #15: the prediction within 3 pp of the measured gain


class BadInput(Exception):
    """A record or report that cannot be read: main prints it in one line, exit 2."""


def _object(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"{path}: not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: not a JSON object")
    return doc


def levels(results: Path) -> list[dict]:
    """Every measured level with a projection: its rollout, c, the runs and both estimates.
    Raises BadInput on a record or report that is not what a rollout writes."""
    out = []
    for report in sorted(results.glob("*/rollout-*/runs/*rollout-local/report.json")):
        run = report.parent
        measures = sorted(run.glob("0*-measure/record.json"))
        if not measures:
            continue
        doc = _object(report)
        amdahl = doc.get("amdahl")
        if not isinstance(amdahl, list) or not all(
            isinstance(r, dict) and "concurrency" in r for r in amdahl
        ):
            raise BadInput(f"{report}: no 'amdahl' list of levels (each with its concurrency)")
        section = _object(measures[-1]).get("measure") or {}
        try:
            by_c = {lv["concurrency"]: lv for lv in section.get("levels") or []}
        except (AttributeError, TypeError, KeyError):
            raise BadInput(f"{measures[-1]}: its measure levels are malformed") from None
        for row in amdahl:
            c, projected = row["concurrency"], row.get("gain")
            if projected is None or c not in by_c:
                continue
            if not isinstance(projected, (int, float)):
                raise BadInput(f"{report}: the projected gain at c={c} is not a number")
            try:
                lv = MeasureLevel.model_validate(by_c[c])
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise BadInput(
                    f"{measures[-1]}: level c={c} is malformed ({where}: {first['msg']})"
                ) from None
            base, after = lv.before + lv.recheck, lv.after
            pooled, median = rate_gain(base, after), median_gain(base, after)
            if pooled is None or median is None:
                continue
            p_ci, m_ci = gain_interval(base, after, c), gain_interval(base, after, c, median_gain)
            out.append({
                "rollout": f"{run.parents[2].name}/{run.parents[1].name}",
                "concurrency": c, "baseline_runs": len(base), "after_runs": len(after),
                "projected": projected,
                "pooled": pooled, "pooled_interval": p_ci,
                "median": median, "median_interval": m_ci,
            })  # fmt: skip
    return out


def summary(rows: list[dict]) -> dict:
    def width(ci: tuple[float, float] | None) -> float | None:
        return None if ci is None else ci[1] - ci[0]

    both = [
        (w1, w2) for r in rows
        if (w1 := width(r["pooled_interval"])) is not None
        and (w2 := width(r["median_interval"])) is not None
    ]  # fmt: skip
    return {
        "levels": len(rows),
        "with_intervals": len(both),
        "mean_width_pp": {
            "pooled": 100 * statistics.fmean(p for p, _ in both) if both else None,
            "median": 100 * statistics.fmean(m for _, m in both) if both else None,
        },
        "pooled_narrower": sum(p < m - 1e-12 for p, m in both),
        "as_wide": sum(abs(p - m) <= 1e-12 for p, m in both),
        "pooled_wider": sum(p > m + 1e-12 for p, m in both),
        "within_3pp_of_projection": {
            k: sum(abs(r[k] - r["projected"]) <= WITHIN for r in rows) for k in ("pooled", "median")
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", type=Path, default=HERE / "results")
    p.add_argument("--json", action="store_true", help="one JSON document")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        print(f"error: {args.results} is not a directory", file=sys.stderr)
        return 2
    try:
        rows = levels(args.results)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(
            f"error: no measured level with a projection under {args.results} "
            "(*/rollout-*/runs/*rollout-local/ with a measure record and report.json)",
            file=sys.stderr,
        )
        return 2
    doc = {"rows": rows, "summary": summary(rows)}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0

    def ci(x: tuple[float, float] | None) -> str:
        return "-" if x is None else f"{100 * x[0]:+.1f}..{100 * x[1]:+.1f}"

    print(f"{'rollout':58} {'c':>3} {'runs':>5} {'projected':>9} {'pooled':>8} "
          f"{'interval':>13} {'median':>8} {'interval':>13}")  # fmt: skip
    for r in rows:
        print(
            f"{r['rollout']:58} {r['concurrency']:>3} {r['baseline_runs']}+{r['after_runs']:<3} "
            f"{100 * r['projected']:>+8.1f}% {100 * r['pooled']:>+7.1f}% "
            f"{ci(r['pooled_interval']):>13} {100 * r['median']:>+7.1f}% "
            f"{ci(r['median_interval']):>13}"
        )
    s = doc["summary"]
    w = s["mean_width_pp"]
    print(
        f"\n{s['levels']} levels; {int(GAIN_INTERVAL * 100)}% intervals at {s['with_intervals']}: "
        f"mean width pooled {w['pooled']:.1f} pp, median {w['median']:.1f} pp; pooled narrower "
        f"at {s['pooled_narrower']}, as wide at {s['as_wide']}, wider at {s['pooled_wider']}. "
        f"Within 3 pp of the projection: pooled {s['within_3pp_of_projection']['pooled']}, "
        f"median {s['within_3pp_of_projection']['median']}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
