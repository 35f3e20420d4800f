"""Where a rollout's projection went wrong, side by side, from its committed records alone: f and
the shadow's s against what the same service paid on the measure's own load.

For each rollout run directory:
- f: the profile's (its load window at each level) against f over the baseline's A/A pair (the
  same service before the switch, on measure's sized runs), and the gain each projects with the
  report's s;
- prefill (attention changes): each backend's attention time per prompt, in the shadow's pairs
  (the serving baseline and the candidate on the same blocks, the first pair of the level left
  out: the candidate's first call in a process is a cold start) against the service's own: the
  baseline's runs (A, A', A'') and the candidate's (after the switch), their prefill attention
  seconds over their completed requests; and the baseline's cost in each of its runs, in order;
- on the measure's own baseline (every change): the window the measured gain divides by (the
  baseline's runs A, A', A'' pooled, ms per output token) with the change's parts in it replaced
  by the candidate's cost as the profile saw it (the profile window's parts per output token over
  the report's s), and the gain that projects beside the report's projection: how much of a miss
  was the baseline's host time moving between the profile and the measure, and how much is left
  for the measure's own spread (its 90% interval).

A diagnosis of committed runs, not a projection: nothing here feeds a verdict. No GPU; reads
only the run directories it is given.

Usage: python3 benchmarks/shadow_vs_service.py RUN_DIR...   (rollout run directories)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ops.verdict.amdahl import projected_gain_parts as gain  # the report's model, over parts (f, s)


def record(run: Path, step: str) -> dict:
    (path,) = run.glob(f"*-{step}/record.json")
    return json.loads(path.read_text())


def per_prompt(runs: list[dict], c: int, after: bool) -> float:
    """Prefill attention us per completed request over the level's runs of one release."""
    rs = [r for r in runs if r["concurrency"] == c and (r["arm"] == "after") == after]
    return sum(r["stages"]["prefill_attention"] for r in rs) / sum(r["completed"] for r in rs) * 1e6


def shadow_per_prompt(pairs: list[list], input_rows: float) -> tuple[float, float]:
    """(baseline, candidate) us per prompt of `input_rows` rows over the prefill pairs, plans
    included, the level's first pair left out."""
    ps = [p for p in pairs if p[0] == "prefill"][1:]
    rows = sum(p[1] for p in ps)
    return (sum(p[2] + p[3] for p in ps) / rows * input_rows,
            sum(p[4] + p[5] for p in ps) / rows * input_rows)  # fmt: skip


# each change's parts: (the run's stage, the report row's s for it)
CHANGE_PARTS = {
    "tree_build": (("tree_build", "speed"),),
    "attention": (("attention", "speed"), ("prefill_attention", "prefill_speed")),
}


def on_measure_baseline(lv: dict, row: dict, runs: list[dict], comp: str) -> str | None:
    """The projection with the measure's own baseline window (module docstring), one line."""
    c = lv["concurrency"]
    base = [r for r in runs if r["concurrency"] == c and r["arm"] != "after"]
    tokens = sum(r["output_tokens"] for r in base)
    window = sum(r["duration_s"] for r in base) / tokens  # s per output token
    prof_tokens = lv["tokens_per_s"]["value"] * lv["window"]["duration_s"]
    ws, candidate, before = lv["wall_share"], 0.0, 0.0
    for stage, speed in CHANGE_PARTS[comp]:
        s = (row.get(speed) or {}).get("s")
        share = ws[comp]["prefill"] if stage == "prefill_attention" else ws[comp]["value"]
        if comp == "attention" and stage == "attention":
            share -= ws[comp]["prefill"]  # the decode steps' part of the attention's share
        if s is None:
            return None
        candidate += share * lv["window"]["duration_s"] / prof_tokens / s
        before += sum(r["stages"][stage] for r in base) / tokens
    g, m = window / (window - before + candidate) - 1, row["measured_gain"]
    lo, hi = row.get("measured_lo"), row.get("measured_hi")  # an older report has none
    interval = "" if lo is None or hi is None else f"; measured interval {lo:+.1%}..{hi:+.1%}"
    return (
        f"        on the measure's baseline ({len(base)} runs, {window * 1e3:.4f} ms per output "
        f"token, the change's parts {before * 1e3:.4f}) with the candidate at the profile's "
        f"{candidate * 1e3:.4f}: {g:+.1%} (measured - this {100 * (m - g):+.1f} pp; the "
        f"report's projection {row['gain']:+.1%}, {100 * (m - row['gain']):+.1f} pp{interval})"
    )


class NotARollout(Exception):
    """The directory is not a rollout run directory with the records this reads."""


def replay(run: Path) -> list[str]:
    try:
        return _replay(run)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        # ValueError: no such record (the unpacking in `record`), or one that is not JSON
        raise NotARollout(f"{run}: not a rollout run directory this reads "
                          f"({type(exc).__name__}: {exc})") from exc  # fmt: skip


def _replay(run: Path) -> list[str]:
    prof = record(run, "profile")["profile"]
    before = record(run, "baseline")["measure_before"]
    runs = before["runs"] + record(run, "measure")["measure"]["runs"]
    rep = json.loads((run / "report.json").read_text())
    comp = rep["change"]["component"]
    amdahl = {int(r["concurrency"]): r for r in rep["amdahl"]}
    measured = {c: r.get("measured_gain") for c, r in amdahl.items()}
    out = [str(run)]
    for lv in prof["levels"]:
        try:
            out += _level(lv, before, runs, amdahl, measured, comp)
        except (KeyError, TypeError, ZeroDivisionError) as exc:  # an older record's level
            out.append(f"  c={lv.get('concurrency')}: not read ({type(exc).__name__}: {exc}; a "
                       "record made before the shadow and the measure's stages)")  # fmt: skip
    return out


def _level(lv: dict, before: dict, runs: list[dict], amdahl: dict, measured: dict,
           comp: str) -> list[str]:  # fmt: skip
    out: list[str] = []
    c, sh = lv["concurrency"], lv.get("shadow") or {}
    aa = [r for r in before["runs"] if r["concurrency"] == c]
    wall = sum(r["duration_s"] for r in aa)
    m = measured.get(c)
    head = f"  c={c:>2} measured {m:+.1%}" if m is not None else f"  c={c:>2}"
    if comp == "tree_build":
        f_p = lv["wall_share"]["tree_build"]["value"]
        f_aa = sum(r["stages"]["tree_build"] for r in aa) / wall
        s = (sh.get("step") or {}).get("s")
        if s is None:
            out.append(f"{head}: f profile {f_p:.3f}, A/A {f_aa:.3f} (no shadow s)")
        else:
            out.append(
                f"{head}: f profile {f_p:.3f} -> {gain([(f_p, s)]):+.1%}, "
                f"A/A {f_aa:.3f} -> {gain([(f_aa, s)]):+.1%} (shadow s {s:.2f}x)"
            )
    elif comp == "attention":
        ws = lv["wall_share"]["attention"]
        fp_p, fd_p = ws["prefill"], ws["value"] - ws["prefill"]
        fd = sum(r["stages"]["attention"] for r in aa) / wall
        fp = sum(r["stages"]["prefill_attention"] for r in aa) / wall
        sd, sp = sh["step"]["s"], sh["prefill"]["s"]
        out.append(
            f"{head}: f profile {fd_p:.3f}+{fp_p:.3f} -> {gain([(fd_p, sd), (fp_p, sp)]):+.1%}"
            f", A/A {fd:.3f}+{fp:.3f} -> {gain([(fd, sd), (fp, sp)]):+.1%}"
            f" (shadow s steps {sd:.2f}x, prefill {sp:.2f}x)"
        )
        rows = sum(p[1] for p in sh["pairs"] if p[0] == "prefill") / (
            sh["load"]["completed"] + c
        )  # the window's prompts: its measured requests and the c warm-up ones
        b_sh, c_sh = shadow_per_prompt(sh["pairs"], rows)
        b_sv, c_sv = per_prompt(runs, c, False), per_prompt(runs, c, True)
        out.append(
            f"        prefill attention us per prompt ({rows:.0f} rows): shadow baseline "
            f"{b_sh:.0f}, candidate {c_sh:.0f} (s {b_sh / c_sh:.2f}x); service baseline "
            f"{b_sv:.0f} ({b_sh / b_sv - 1:+.0%} in the shadow), candidate {c_sv:.0f} "
            f"({c_sh / c_sv - 1:+.0%}) (s {b_sv / c_sv:.2f}x)"
        )
        seq = [
            f"{r['arm']}{r['cycle']}:{per_prompt([r], c, False):.0f}"
            for r in runs
            if r["concurrency"] == c and r["arm"] != "after"
        ]
        out.append("        the baseline's per prompt, run by run: " + " ".join(seq))
    if m is not None and (line := on_measure_baseline(lv, amdahl[c], runs, comp)):
        out.append(line)
    return out


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for arg in argv:
        try:
            print("\n".join(replay(Path(arg))))
        except NotARollout as exc:
            print(f"error: {exc}", file=sys.stderr)
            print(__doc__.strip().splitlines()[-1], file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
