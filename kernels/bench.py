"""Kernel micro-benchmarks, run on the GPU host: `python -m kernels.bench --json [--suite ...]`.

Suites register themselves with `@register_suite(name)`; the Kernels I suites (topk, tree,
accept) live in `kernels.bench_suites`, others (e.g. `attn` in `kernels.bench_attention`) are
imported from `PLUGINS` when present. A suite takes a `BenchConfig` and returns rows: one per
(kernel, shape, implementation) with its `Timing` and, for CUDA rows, the speedup over each
baseline named in the row. Prints a table, or one JSON document with `--json`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernels.envinfo import environment

__all__ = ["SUITES", "BenchConfig", "register_suite", "row", "main"]

CORE_SUITES = "kernels.bench_suites"
PLUGINS = ("kernels.bench_attention", "kernels.bench_integration")  # optional: skipped if broken
Row = dict[str, Any]
SuiteFn = Callable[["BenchConfig"], list[Row]]
SUITES: dict[str, SuiteFn] = {}


@dataclass
class BenchConfig:
    batches: list[int] = field(default_factory=lambda: [1, 8, 64])
    budgets: list[int] = field(default_factory=lambda: [16, 64, 128])
    ks: list[int] = field(default_factory=lambda: [8, 64])
    depth: int = 15  # H
    vocab: int = 163840
    reps: int = 50
    refcheck: bool = True
    quick: bool = False  # fewer reps of the slow CPU baselines
    tree_scale: float = 2.5  # drafter logits ~ N(0, scale^2): larger = peaked = deeper trees


def register_suite(name: str) -> Callable[[SuiteFn], SuiteFn]:
    def deco(fn: SuiteFn) -> SuiteFn:
        SUITES[name] = fn
        return fn

    return deco


def row(
    suite: str, kernel: str, impl: str, shape: dict[str, Any], timing: Any, **extra: Any
) -> Row:
    """One result row; `timing` is a kernels.timing.Timing."""
    d = {"suite": suite, "kernel": kernel, "impl": impl, "shape": shape}
    d.update(timing.to_dict())
    d.pop("samples_us", None)
    d.update(extra)
    return d


def add_speedups(rows: list[Row]) -> None:
    """For each CUDA row, speedup = baseline median / CUDA median, per baseline of its group."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], json.dumps(r["shape"], sort_keys=True)), []).append(r)
    for rs in groups.values():
        base = {r["impl"]: r["median_us"] for r in rs if not r["impl"].startswith("cuda")}
        for r in rs:
            if r["impl"].startswith("cuda") and r["median_us"] > 0:
                r["speedup"] = {k: round(v / r["median_us"], 2) for k, v in base.items()}


def load_plugins() -> None:
    importlib.import_module(CORE_SUITES)
    for mod in PLUGINS:
        if importlib.util.find_spec(mod) is None:
            continue
        try:
            importlib.import_module(mod)
        except Exception as exc:  # a plugin's bug must not hide the other suites
            print(f"warning: bench plugin {mod} not loaded: {exc!r}", file=sys.stderr)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


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


def apply_memory_cap() -> dict[str, Any] | None:
    """Honour `DDTREE_BENCH_MAX_MEM_GIB` (set by `ops bench --allow-shared` on a GPU the service
    uses): cap this process's CUDA allocations to that many GiB of the visible GPU."""
    text = os.environ.get("DDTREE_BENCH_MAX_MEM_GIB")
    if not text:
        return None
    import torch

    gib = float(text)
    if not torch.cuda.is_available():
        return {"gib": gib, "fraction": None, "applied": False, "reason": "no CUDA device"}
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return {"gib": gib, "fraction": round(fraction, 6), "applied": True}


def main(argv: list[str] | None = None) -> int:
    load_plugins()
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--suite", default=",".join(s for s in ("topk", "tree", "accept") if s in SUITES)
    )
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--budget", default="16,64,128")
    ap.add_argument("--k", default="8,64")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-refcheck", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer reps of the slow CPU baselines")
    ap.add_argument(
        "--tree-scale",
        type=float,
        default=2.5,
        help="std of the drafter logits behind the tree inputs (6: peaked, deep trees)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        cfg = BenchConfig(
            _ints(args.batch),
            _ints(args.budget),
            _ints(args.k),
            reps=args.reps,
            refcheck=not args.no_refcheck,
            quick=args.quick,
            tree_scale=args.tree_scale,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = [s for s in args.suite.split(",") if s]
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        print(f"error: unknown suite(s) {unknown}; known: {sorted(SUITES)}", file=sys.stderr)
        return 2
    memory_cap = apply_memory_cap()
    rows: list[Row] = []
    failed: list[str] = []
    for name in names:
        rows += SUITES[name](cfg)
    add_speedups(rows)
    failed = [f"{r['kernel']} {r['shape']}" for r in rows if r.get("refcheck") is False]
    doc = {
        "command": "python -m kernels.bench " + shlex.join(sys.argv[1:] if argv is None else argv),
        "env": environment(),
        "config": vars(cfg),
        "results": rows,
        "refcheck_failed": failed,
    }
    if memory_cap is not None:
        doc["memory_cap"] = memory_cap
    if args.json:
        print(json.dumps(doc, indent=1))
    print_table(rows, file=sys.stderr if args.json else sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    # Run main() of the importable module, whose SUITES the suite modules register into
    # (as __main__ this file is a second module object with its own, empty registry).
    from kernels.bench import main as _main

    sys.exit(_main())
