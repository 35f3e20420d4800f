"""Kernel micro-benchmarks, run on the GPU host: `python -m kernels.bench --json [--suite ...]`.

The one benchmark tool: every suite is listed in `suites()` (topk, tree, accept in
`kernels.bench_suites`, attn in `kernels.bench_attention`, engine_attn in
`kernels.bench_engine`, integration in `kernels.bench_integration`). A suite takes a
`BenchConfig` and returns rows of one schema (`row`): one per (kernel, shape, implementation)
with its `kernels.timing.Timing` in microseconds and, for CUDA rows, the speedup over each
baseline of its group. `--variants` also times the named kernel algorithms (tree:
`kernels.cuda.TREE_ALGOS`, attn: `kernels.cuda_attention.ALGOS`; impl `cuda_graph:heap`, ...),
`--sweep` the attention KV split counts at the two target sizes. The attn suite's
`row_attention` rows (the reference engine's attention call, torch_rows vs cuda_rows) take a
decode step of each `--batch` requests x `--row-budget` + 1 rows over each `--prefix-len` keys;
its `row_attention_prefill` rows the prefill of one prompt of each `--prefix-len` tokens in the
engine's forwards of at most `--prefill-block` rows (default 576, the `small` preset's). Its
stage rows time the engine's attention stage shaped as its forward
(`kernels.timing.forward_sampler`: a `--stage-piece-us` GPU piece before each layer's call);
`--decode-spread` (a diagnostic) spreads the decode step's requests' prefixes over that many
tokens past L. The tree suite's `tree_build_stage` rows (`kernels.bench_stage`) time the
reference engine's whole tree-build stage per backend, boundary copies included (reference_stage
vs cuda_stage, wall clock, synchronised like the engine's lap) at each `--batch` and the
engine's `--stage-shape` H,K,BUDGET (small: 7,16,16): the stage's speedup, beside the kernel's
(`build_trees`). `--matmul` (default tf32, the engine's) sets how torch runs float32 matmuls for
the torch rows, so they cost what the engine pays. The engine_attn suite
(`kernels.bench_engine`) runs the reference engine's own attention stage in its real forward
(`python -m engine.attn_bench`, a child process per `--prefix-len`), the engine built as
`--engine-preset`, `--engine-mode`, `--engine-max-budget` and `--engine-graphs` say: impls
torch_engine and cuda_engine, mode engine_stage. Prints a table, or one JSON document with
`--json`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernels.bench_engine import SuiteError
from kernels.cli import OneLineParser
from kernels.envinfo import environment

__all__ = ["BenchConfig", "impl_name", "main", "row", "suites"]

Row = dict[str, Any]
SuiteFn = Callable[["BenchConfig"], list[Row]]
DEFAULT_SUITES = ("topk", "tree", "accept")


# GPU time (us) of the piece before each layer's call in the attn stage rows: a stand-in for
# the graph piece the engine's forward runs there (the layer's other work; the `small` preset's
# pieces take about 0.2-0.5 ms: a rollout profile's verify time without its attention, over
# the forward's 5 pieces)
STAGE_PIECE_US = 300.0


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
    variants: list[str] = field(default_factory=lambda: ["auto"])  # kernel algorithms to time
    sweep: bool = False  # attn: also every KV split count of the sweep at the target sizes
    prefix_lens: list[int] = field(default_factory=lambda: [64, 1024])  # attn row_attention: L
    row_budget: int = 16  # attn row_attention: tree nodes per request (T = row_budget + 1 rows)
    # attn row_attention_prefill: rows per forward, as engine.decode.prefill cuts a prompt (its
    # forward's row capacity: the small preset's max(32 x 17, row_chunk 576) = 576)
    prefill_block: int = 576
    # attn row_attention, a diagnostic: the decode step's requests' prefixes spread over
    # L .. L + spread - 1 (0: all at L, as a load of one prompt keeps a served batch)
    decode_spread: int = 0
    # ... a set's requests all at one prefix, the sets over the range (requests in lockstep)
    decode_lockstep: bool = False
    # attn stage rows: GPU time (us) of the piece before each layer's call
    stage_piece_us: float = STAGE_PIECE_US
    # tree tree_build_stage: (H, K, budget) of the engine's stage (engine `small`: 7, 16, 16)
    stage_shape: tuple[int, int, int] = (7, 16, 16)
    # float32 matmuls of the torch rows (torch_rows' bmm, the sdpa baseline): "tf32" as the
    # reference engine runs them on a GPU by default (engine --matmul), or "fp32"
    matmul: str = "tf32"
    # engine_attn: the reference engine as the service runs it (ops bench reads these from its
    # /get_server_info): preset, mode, max tree budget (None: the preset's), CUDA graphs
    engine_preset: str = "small"
    engine_mode: str = "ddtree"
    engine_max_budget: int | None = None
    engine_graphs: str = "on"

    def __post_init__(self) -> None:
        if not self.batches or min(self.batches) < 1:
            raise ValueError(f"--batch takes batch sizes >= 1 like 1,8,64: {self.batches}")
        if not self.budgets or min(self.budgets) < 1:
            raise ValueError(f"--budget takes node budgets >= 1 like 16,64,128: {self.budgets}")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"--k takes top-k sizes >= 1 like 8,64: {self.ks}")
        if self.reps < 1:
            raise ValueError(f"--reps must be >= 1, got {self.reps}")
        if not 0 < self.tree_scale < float("inf"):  # NaN fails too
            raise ValueError(f"--tree-scale must be a finite number > 0, got {self.tree_scale}")
        if not self.prefix_lens or min(self.prefix_lens) < 1:
            raise ValueError(f"--prefix-len takes lengths >= 1 like 64,1024: {self.prefix_lens}")
        if self.row_budget < 0:
            raise ValueError(f"--row-budget must be >= 0, got {self.row_budget}")
        if self.prefill_block < 1:
            raise ValueError(f"--prefill-block must be >= 1, got {self.prefill_block}")
        if not 0 <= self.decode_spread <= 65536:
            raise ValueError(f"--decode-spread takes 0 .. 65536 tokens, got {self.decode_spread}")
        if self.decode_lockstep and not self.decode_spread:
            raise ValueError(
                "--decode-lockstep needs a --decode-spread N > 0 to spread the sets over"
            )
        if self.engine_max_budget is not None and self.engine_max_budget < 0:
            raise ValueError(f"--engine-max-budget must be >= 0, got {self.engine_max_budget}")
        if not 0 <= self.stage_piece_us <= 100_000:  # NaN fails too
            raise ValueError(f"--stage-piece-us takes 0 .. 100000 us, got {self.stage_piece_us}")
        if len(self.stage_shape) != 3 or min(self.stage_shape) < 1:
            raise ValueError(
                f"--stage-shape takes H,K,BUDGET >= 1 like 7,16,16: {self.stage_shape}"
            )


# suites that time CUDA kernels: nothing to time without one
CUDA_SUITES = ("topk", "tree", "accept", "attn", "engine_attn")


def suites() -> dict[str, SuiteFn]:
    """Every benchmark suite by name (imported here, explicitly: an import error is an error)."""
    from kernels import bench_attention, bench_engine, bench_integration, bench_suites

    return {
        "topk": bench_suites.topk_suite,
        "tree": bench_suites.tree_suite,
        "accept": bench_suites.accept_suite,
        "attn": bench_attention.attn_suite,
        "engine_attn": bench_engine.engine_attn_suite,
        "integration": bench_integration.integration_suite,
    }


def impl_name(impl: str, variant: str) -> str:
    """`impl` for the default algorithm (`auto`), `impl:variant` for the others."""
    return impl if variant == "auto" else f"{impl}:{variant}"


def _variant_sets() -> dict[str, set[str]]:
    from kernels.cuda import TREE_ALGOS
    from kernels.cuda_attention import ALGOS

    return {"tree": set(TREE_ALGOS), "attn": set(ALGOS)}


def row(
    suite: str, kernel: str, impl: str, shape: dict[str, Any], timing: Any, **extra: Any
) -> Row:
    """One result row; `timing` is a kernels.timing.Timing."""
    d = {"suite": suite, "kernel": kernel, "impl": impl, "shape": shape}
    d.update(timing.to_dict())
    d.pop("samples_us", None)
    d.update(extra)
    return d


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


def _ints(s: str, flag: str = "") -> list[int]:
    """`1,8,64` as integers; a ValueError naming the flag for anything else."""
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {s!r}") from None


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
        {"suite": k[0], "kernel": k[1], "impl": k[2], "shape": json.loads(k[3]),
         "base_us": b[k], "new_us": n[k], "ratio": round(n[k] / b[k], 4) if b[k] else None}
        for k in b if k in n
    ]  # fmt: skip


def _compare_main(base: str, new: str) -> int:
    def load(paths: str) -> list[dict]:
        return [json.loads(open(p).read()) for p in paths.split(",") if p]

    try:
        rows = compare(load(base), load(new))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in rows:
        shape = " ".join(f"{k}={v}" for k, v in r["shape"].items())
        print(f"{r['suite']:<6} {r['kernel']:<28} {r['impl']:<22} {shape:<48} "
              f"{r['base_us']:10.1f} {r['new_us']:10.1f} {r['ratio']}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
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
        "--decode-lockstep",
        action="store_true",
        help="attn row_attention with --decode-spread: a step's requests all at one prefix, "
        "the input sets over the range (requests started together, advancing together)",
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
    ap.add_argument(
        "--engine-preset",
        default="small",
        help="engine_attn: the reference engine's preset (small, tiny), as the service runs it",
    )
    ap.add_argument("--engine-mode", choices=("ddtree", "ar"), default="ddtree",
                    help="engine_attn: the engine's decoding mode")  # fmt: skip
    ap.add_argument(
        "--engine-max-budget",
        type=int,
        default=None,
        help="engine_attn: the engine's --max-budget (0: every step at the preset's budget; "
        "default: the preset's)",
    )
    ap.add_argument("--engine-graphs", choices=("on", "off"), default="on",
                    help="engine_attn: the engine's CUDA graphs")  # fmt: skip
    ap.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE.json[,...]", "NEW.json[,...]"),
        help="print new/base medians of the rows two sets of --json documents share; no bench",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.compare:
        return _compare_main(*args.compare)
    try:
        cfg = BenchConfig(
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
            decode_lockstep=args.decode_lockstep,
            stage_piece_us=args.stage_piece_us,
            stage_shape=tuple(_ints(args.stage_shape, "--stage-shape")),  # type: ignore[arg-type]
            matmul=args.matmul,
            engine_preset=args.engine_preset,
            engine_mode=args.engine_mode,
            engine_max_budget=args.engine_max_budget,
            engine_graphs=args.engine_graphs,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = suites()
    names = [s for s in args.suite.split(",") if s]
    if "engine_attn" in names:  # the engine's settings checked on any host, before any suite
        from kernels.bench_engine import prompt_lens

        try:
            engine_notes = prompt_lens(cfg)[1]
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        engine_notes = []
    unknown = [s for s in names if s not in table]
    if unknown:
        print(f"error: unknown suite(s) {unknown}; known: {sorted(table)}", file=sys.stderr)
        return 2
    known = _variant_sets()
    stray = [
        v for v in cfg.variants if v != "auto" and not any(v in known.get(n, ()) for n in names)
    ]
    if stray or not cfg.variants:
        choices = {n: sorted(known[n]) for n in names if n in known}
        print(f"error: unknown variant(s) {stray} for suites {names}; known: {choices}",
              file=sys.stderr)  # fmt: skip
        return 2
    memory_cap = apply_memory_cap()
    rows: list[Row] = []
    notes: list[str] = list(engine_notes)  # prefix lengths the engine's context does not hold
    import torch

    torch.backends.cuda.matmul.allow_tf32 = cfg.matmul == "tf32"  # as the engine sets it
    for name in names:
        if name in CUDA_SUITES and not torch.cuda.is_available():
            notes.append(f"{name} suite: no CUDA device, no rows (it times CUDA kernels; the "
                         "CPU baselines alone: python -m kernels.cpu)")  # fmt: skip
            print(f"note: {notes[-1]}", file=sys.stderr)
            continue
        try:
            rows += table[name](cfg)
        except SuiteError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.code
    add_speedups(rows)
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
    if args.json:
        print(json.dumps(doc, indent=1))
    if rows:
        print_table(rows, file=sys.stderr if args.json else sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
