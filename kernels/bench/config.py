"""What every bench suite shares: the options (`BenchConfig`), the row schema (`row`), the errors.

Imports nothing of the project, so a suite anywhere (`kernels.bench.*`, `engine.bench_suite`,
`integration.bench_suite`) builds on it without importing the runner or another suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STAGE_PIECE_US", "BenchConfig", "Row", "SuiteError", "SuiteFn", "impl_name", "row"]

Row = dict[str, Any]
SuiteFn = Callable[["BenchConfig"], list[Row]]


# GPU time (us) of the piece before each layer's call in the attn stage rows: a stand-in for
# the graph piece the engine's forward runs there (the layer's other work; the `small` preset's
# pieces take about 0.2-0.5 ms: a rollout profile's verify time without its attention, over
# the forward's 5 pieces)
STAGE_PIECE_US = 300.0


class SuiteError(RuntimeError):
    """A suite failed and the bench stops (the engine_attn suite's child bench: its exit status
    and the last line it wrote on stderr); `code` is the bench's exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


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
        if self.engine_max_budget is not None and self.engine_max_budget < 0:
            raise ValueError(f"--engine-max-budget must be >= 0, got {self.engine_max_budget}")
        if not 0 <= self.stage_piece_us <= 100_000:  # NaN fails too
            raise ValueError(f"--stage-piece-us takes 0 .. 100000 us, got {self.stage_piece_us}")
        if len(self.stage_shape) != 3 or min(self.stage_shape) < 1:
            raise ValueError(
                f"--stage-shape takes H,K,BUDGET >= 1 like 7,16,16: {self.stage_shape}"
            )


def impl_name(impl: str, variant: str) -> str:
    """`impl` for the default algorithm (`auto`), `impl:variant` for the others."""
    return impl if variant == "auto" else f"{impl}:{variant}"


def row(
    suite: str, kernel: str, impl: str, shape: dict[str, Any], timing: Any, **extra: Any
) -> Row:
    """One result row; `timing` is a kernels.timing.Timing."""
    d = {"suite": suite, "kernel": kernel, "impl": impl, "shape": shape}
    d.update(timing.to_dict())
    d.pop("samples_us", None)
    d.update(extra)
    return d
