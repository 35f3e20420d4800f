"""Kernel micro-benchmarks, run on the GPU host: `python -m kernels.bench --json [--suite ...]`.

The one benchmark tool, in parts that import one way only: `config` (`BenchConfig`, the row
schema `row`, `SuiteError`: what every suite shares, importing nothing of the project), one
module per suite, `registry` (every suite by name), `report` (speedups, the table,
`--compare`), `memory` (the `ops bench --allow-shared` cap) and `cli` (the flags and the run in
named steps; `__main__` calls it). A suite takes a `BenchConfig` and returns rows of one schema
(`row`): one per (kernel, shape, implementation) with its `kernels.timing.Timing` in
microseconds and, for CUDA rows, the speedup over each baseline of its group.

The suites: topk (`kernels.bench.topk`), tree (`kernels.bench.tree`), accept
(`kernels.bench.accept`), attn (`kernels.bench.attn`), engine_attn (`engine.bench_suite`) and
integration (`integration.bench_suite`). The last two measure the reference engine and the
SGLang drop-ins, so they live beside what they measure: the registry names every suite as a
`module:function` string and imports it when the bench runs, and nothing in `kernels/` imports
`engine/` or `integration/` when it is imported (the kernels sit below both; they import
`kernels.bench.config`). A name in a table, rather than suites that register themselves when
imported, keeps the list of suites in one place that reads as the list, and an import error
of any suite stays an error of every run, as before.

`--variants` also times the named kernel algorithms (tree: `kernels.cuda.TREE_ALGOS`, attn:
`kernels.cuda_attention.ALGOS`; impl `cuda_graph:heap`, ...), `--sweep` the attention KV split
counts at the two target sizes. The attn suite's `row_attention` rows (the reference engine's
attention call, torch_rows vs cuda_rows) take a decode step of each `--batch` requests x
`--row-budget` + 1 rows over each `--prefix-len` keys; its `row_attention_prefill` rows the
prefill of one prompt of each `--prefix-len` tokens in the engine's forwards of at most
`--prefill-block` rows (default 576, the `small` preset's). Its stage rows time the engine's
attention stage shaped as its forward (`kernels.timing.forward_sampler`: a `--stage-piece-us`
GPU piece before each layer's call); `--decode-spread` (a diagnostic) spreads the decode step's
requests' prefixes over that many tokens past L. The tree suite's `tree_build_stage` rows
(`kernels.bench.stage`) time the reference engine's whole tree-build stage per backend,
boundary copies included (reference_stage vs cuda_stage, wall clock, synchronised like the
engine's lap) at each `--batch` and the engine's `--stage-shape` H,K,BUDGET (small: 7,16,16):
the stage's speedup, beside the kernel's (`build_trees`). `--matmul` (default tf32, the
engine's) sets how torch runs float32 matmuls for the torch rows, so they cost what the engine
pays. The engine_attn suite runs the reference engine's own attention stage in its real forward
(`python -m engine.attn_bench`, a child process per `--prefix-len`), the engine built as
`--engine-preset`, `--engine-mode`, `--engine-max-budget` and `--engine-graphs` say: impls
torch_engine and cuda_engine, mode engine_stage. Prints a table, or one JSON document with
`--json`.

Importing `kernels.bench` imports no torch; it offers the names below.
"""

from __future__ import annotations

from kernels.bench.cli import main
from kernels.bench.config import BenchConfig, Row, SuiteError, impl_name, row
from kernels.bench.memory import apply_memory_cap
from kernels.bench.registry import suites
from kernels.bench.report import add_speedups, compare, print_table

__all__ = [
    "BenchConfig",
    "Row",
    "SuiteError",
    "add_speedups",
    "apply_memory_cap",
    "compare",
    "impl_name",
    "main",
    "print_table",
    "row",
    "suites",
]
