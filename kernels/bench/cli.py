"""`python -m kernels.bench`: the command line, and the run in named steps.

Parse the flags into a `BenchConfig`, check the selected suites' settings (on any host, before
any suite runs), the suite and variant names, cap the GPU memory, run each suite (a CUDA suite
without a device: a note, no rows), add the speedups, print one JSON document and the table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from kernels.bench.config import STAGE_PIECE_US, BenchConfig, Row, SuiteError, SuiteFn
from kernels.bench.memory import apply_memory_cap
from kernels.bench.registry import CUDA_SUITES, DEFAULT_SUITES, prechecks, suites, variant_sets
from kernels.bench.report import add_speedups, compare_main, print_table
from kernels.cli import OneLineParser
from kernels.envinfo import environment

__all__ = ["DESCRIPTION", "build_parser", "main"]

DESCRIPTION = (
    "Kernel micro-benchmarks, run on the GPU host: `python -m kernels.bench --json [--suite ...]`."
)


def _ints(s: str, flag: str = "") -> list[int]:
    """`1,8,64` as integers; a ValueError naming the flag for anything else."""
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {s!r}") from None


def _add_kernel_args(ap: argparse.ArgumentParser) -> None:
    """The suites, the kernels' shapes and timing, the variants."""
    ap.add_argument(
        "--suite",
        default=",".join(DEFAULT_SUITES),
        help="comma-separated: topk, tree, accept, attn, engine_attn, integration",
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
    ap.add_argument(
        "--variants",
        default="auto",
        help="kernel algorithms to time, e.g. auto,heap,heap_lowmem (tree) or "
        "auto,wgmma_tma,mma_sync_64 (attn); each suite times the ones it knows",
    )
    ap.add_argument("--sweep", action="store_true", help="attn: every KV split count too")


def _add_attn_args(ap: argparse.ArgumentParser) -> None:
    """The attn suite's engine-shaped rows, the tree stage's shape, the torch rows' matmuls."""
    ap.add_argument(
        "--prefix-len",
        default="64,1024",
        help="attn row_attention: prefix lengths L (keys before the tree) of the decode step",
    )
    ap.add_argument(
        "--row-budget",
        type=int,
        default=16,
        help="attn row_attention: tree nodes per request (T = budget + 1 rows; engine small: 16)",
    )
    ap.add_argument(
        "--prefill-block",
        type=int,
        default=576,
        help="attn row_attention_prefill: rows per forward, as the engine cuts a prompt (its "
        "forward's row capacity; engine small: 576)",
    )
    ap.add_argument(
        "--decode-spread",
        type=int,
        default=0,
        help="attn row_attention and engine_attn, a diagnostic: the decode step's requests' "
        "prefixes spread evenly over L .. L + N - 1 (a load of one prompt keeps a served "
        "batch's requests together: 0, the default, every request at L; engine_attn then gives "
        "every request the same prompt)",
    )
    ap.add_argument(
        "--stage-piece-us",
        type=float,
        default=STAGE_PIECE_US,
        help="attn stage rows: GPU time of the piece before each layer's call, the stand-in "
        "for the engine forward's graph piece there (0: none)",
    )
    ap.add_argument(
        "--stage-shape",
        default="7,16,16",
        help="tree tree_build_stage rows: H,K,BUDGET of the engine's tree-build stage "
        "(drafted positions, top-K, nodes; engine small preset: 7,16,16), at each --batch",
    )
    ap.add_argument(
        "--matmul",
        choices=("tf32", "fp32"),
        default="tf32",
        help="float32 matmuls of the torch rows: tf32 as the reference engine runs them on a "
        "GPU (its --matmul default), or fp32",
    )


def _add_engine_args(ap: argparse.ArgumentParser) -> None:
    """The engine_attn suite: the reference engine as the service runs it."""
    ap.add_argument(
        "--engine-preset",
        default="small",
        help="engine_attn: the reference engine's preset (small, tiny), as the service runs it",
    )
    ap.add_argument(
        "--engine-mode",
        choices=("ddtree", "ar"),
        default="ddtree",
        help="engine_attn: the engine's decoding mode",
    )
    ap.add_argument(
        "--engine-max-budget",
        type=int,
        default=None,
        help="engine_attn: the engine's --max-budget (0: every step at the preset's budget; "
        "default: the preset's)",
    )
    ap.add_argument(
        "--engine-graphs",
        choices=("on", "off"),
        default="on",
        help="engine_attn: the engine's CUDA graphs",
    )


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m kernels.bench", description=DESCRIPTION)
    _add_kernel_args(ap)
    _add_attn_args(ap)
    _add_engine_args(ap)
    ap.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE.json[,...]", "NEW.json[,...]"),
        help="print new/base medians of the rows two sets of --json documents share; no bench",
    )
    ap.add_argument("--json", action="store_true")
    return ap


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The flags as a `BenchConfig`; ValueError naming the flag for a bad value."""
    return BenchConfig(
        _ints(args.batch, "--batch"),
        _ints(args.budget, "--budget"),
        _ints(args.k, "--k"),
        reps=args.reps,
        refcheck=not args.no_refcheck,
        quick=args.quick,
        tree_scale=args.tree_scale,
        variants=[v for v in args.variants.split(",") if v],
        sweep=args.sweep,
        prefix_lens=_ints(args.prefix_len, "--prefix-len"),
        row_budget=args.row_budget,
        prefill_block=args.prefill_block,
        decode_spread=args.decode_spread,
        stage_piece_us=args.stage_piece_us,
        stage_shape=tuple(_ints(args.stage_shape, "--stage-shape")),  # type: ignore[arg-type]
        matmul=args.matmul,
        engine_preset=args.engine_preset,
        engine_mode=args.engine_mode,
        engine_max_budget=args.engine_max_budget,
        engine_graphs=args.engine_graphs,
    )


def _selection_error(names: list[str], table: dict[str, SuiteFn], cfg: BenchConfig) -> str | None:
    """Why the suites or variants asked for cannot run (an unknown name), or None."""
    unknown = [s for s in names if s not in table]
    if unknown:
        return f"unknown suite(s) {unknown}; known: {sorted(table)}"
    known = variant_sets()
    stray = [
        v for v in cfg.variants if v != "auto" and not any(v in known.get(n, ()) for n in names)
    ]
    if stray or not cfg.variants:
        choices = {n: sorted(known[n]) for n in names if n in known}
        return f"unknown variant(s) {stray} for suites {names}; known: {choices}"
    return None


def run_suites(
    names: list[str], table: dict[str, SuiteFn], cfg: BenchConfig, notes: list[str]
) -> list[Row]:
    """Each named suite's rows in turn; a CUDA suite without a device adds a note to `notes`
    instead. SuiteError from a suite ends the run."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = cfg.matmul == "tf32"  # as the engine sets it
    rows: list[Row] = []
    for name in names:
        if name in CUDA_SUITES and not torch.cuda.is_available():
            notes.append(
                f"{name} suite: no CUDA device, no rows (it times CUDA kernels; the "
                "CPU baselines alone: python -m kernels.cpu)"
            )
            print(f"note: {notes[-1]}", file=sys.stderr)
            continue
        rows += table[name](cfg)
    return rows


def document(
    argv: list[str] | None,
    cfg: BenchConfig,
    rows: list[Row],
    notes: list[str],
    memory_cap: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON document: the command, the host, the config, the rows, what failed its check."""
    failed = [f"{r['kernel']} {r['shape']}" for r in rows if r.get("refcheck") is False]
    doc = {
        "command": "python -m kernels.bench " + shlex.join(sys.argv[1:] if argv is None else argv),
        "env": environment(),
        "config": vars(cfg),
        "results": rows,
        "refcheck_failed": failed,
    }
    if notes:
        doc["notes"] = notes
    if memory_cap is not None:
        doc["memory_cap"] = memory_cap
    return doc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.compare:
        return compare_main(*args.compare)
    try:
        cfg = config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = suites()
    names = [s for s in args.suite.split(",") if s]
    notes: list[str] = []  # e.g. prefix lengths the engine's context does not hold
    try:  # the suites' settings checked on any host, before any suite
        for check in prechecks(names):
            notes += check(cfg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    why = _selection_error(names, table, cfg)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    memory_cap = apply_memory_cap()
    try:
        rows = run_suites(names, table, cfg, notes)
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    add_speedups(rows)
    doc = document(argv, cfg, rows, notes, memory_cap)
    if args.json:
        print(json.dumps(doc, indent=1))
    if rows:
        print_table(rows, file=sys.stderr if args.json else sys.stdout)
    return 1 if doc["refcheck_failed"] else 0
