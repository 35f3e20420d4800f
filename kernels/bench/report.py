"""The bench's results: speedups within a row's group, the table, and `--compare` of two runs."""

from __future__ import annotations

import json
import sys
from typing import Any

from kernels.bench.config import Row

__all__ = ["SEPARATE_MODES", "add_speedups", "compare", "compare_main", "print_table"]

# timing modes compared only with each other (same shape)
SEPARATE_MODES = ("stage", "engine_stage")


def add_speedups(rows: list[Row]) -> None:
    """For each CUDA row, speedup = baseline median / CUDA median, per baseline of its group."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], json.dumps(r["shape"], sort_keys=True)), []).append(r)
    for rs in groups.values():
        for r in rs:  # a GPU-time or stage row is set against its own kind of baseline only
            if r["impl"].startswith("cuda") and r["median_us"] > 0:
                q = r.get("mode") in SEPARATE_MODES
                base = {
                    b["impl"]: b["median_us"]
                    for b in rs
                    if not b["impl"].startswith("cuda") and (b.get("mode") in SEPARATE_MODES) == q
                }
                r["speedup"] = {k: round(v / r["median_us"], 2) for k, v in base.items()}


def print_table(rows: list[Row], file: Any = None) -> None:
    head = ["suite", "kernel", "shape", "impl", "median us", "IQR us", "speedup"]
    lines = []
    for r in rows:
        shape = " ".join(f"{k}={v}" for k, v in r["shape"].items())
        sp = " ".join(f"{k}:{v}x" for k, v in r.get("speedup", {}).items())
        lines.append(
            [
                r["suite"],
                r["kernel"],
                shape,
                r["impl"],
                f"{r['median_us']:.1f}",
                f"{r['iqr_us']:.1f}",
                sp,
            ]
        )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(" | ".join(head), file=file)
        for ln in lines:
            print(" | ".join(ln), file=file)
        return
    t = Table(*head)
    for ln in lines:
        t.add_row(*ln)
    Console(width=200, file=file).print(t)


def compare(base: list[dict], new: list[dict]) -> list[Row]:
    """Rows present in both sets of bench documents: median over runs of each row's median_us,
    and new / base (below 1: faster). Runs interleaved on one GPU make the ratio meaningful."""

    def medians(docs: list[dict]) -> dict[tuple[str, ...], float]:
        runs: dict[tuple[str, ...], list[float]] = {}
        for doc in docs:
            for r in doc.get("results", []):
                if "median_us" in r:
                    key = (
                        r["suite"],
                        r["kernel"],
                        r["impl"],
                        json.dumps(r["shape"], sort_keys=True),
                    )
                    runs.setdefault(key, []).append(r["median_us"])
        return {k: sorted(v)[(len(v) - 1) // 2] for k, v in runs.items()}

    b, n = medians(base), medians(new)
    return [
        {
            "suite": k[0],
            "kernel": k[1],
            "impl": k[2],
            "shape": json.loads(k[3]),
            "base_us": b[k],
            "new_us": n[k],
            "ratio": round(n[k] / b[k], 4) if b[k] else None,
        }
        for k in b
        if k in n
    ]


def compare_main(base: str, new: str) -> int:
    """`--compare BASE NEW`: one line per shared row; exit 2 for a file it cannot read."""

    def load(paths: str) -> list[dict]:
        return [json.loads(open(p).read()) for p in paths.split(",") if p]

    try:
        rows = compare(load(base), load(new))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in rows:
        shape = " ".join(f"{k}={v}" for k, v in r["shape"].items())
        print(
            f"{r['suite']:<6} {r['kernel']:<28} {r['impl']:<22} {shape:<48} "
            f"{r['base_us']:10.1f} {r['new_us']:10.1f} {r['ratio']}"
        )
    return 0
