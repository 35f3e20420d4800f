"""Every suite of `python -m kernels.bench`, by name: where it lives and what it needs.

The table names each suite's module and function as text and `suites()` imports them when the
bench runs (explicitly: an import error is an error). So the kernels' own suites and the two
that live beside what they measure (`engine.bench_suite`: the reference engine's attention
stage; `integration.bench_suite`: the SGLang drop-ins) are all listed here, while no module of
`kernels/` imports `engine/` or `integration/` when it is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from kernels.bench.config import BenchConfig, SuiteFn

__all__ = [
    "CUDA_SUITES",
    "DEFAULT_SUITES",
    "SUITES",
    "Suite",
    "prechecks",
    "suites",
    "variant_sets",
]


@dataclass(frozen=True)
class Suite:
    """A suite: `module:function` (a `SuiteFn`), whether it times CUDA kernels (nothing to time
    without a device), and an optional `module:function` that checks its settings on any host
    before any suite runs: `(BenchConfig) -> notes`, ValueError for bad settings (exit 2)."""

    target: str
    cuda: bool
    check: str | None = None


SUITES: dict[str, Suite] = {
    "topk": Suite("kernels.bench.topk:topk_suite", cuda=True),
    "tree": Suite("kernels.bench.tree:tree_suite", cuda=True),
    "accept": Suite("kernels.bench.accept:accept_suite", cuda=True),
    "attn": Suite("kernels.bench.attn:attn_suite", cuda=True),
    "engine_attn": Suite(
        "engine.bench_suite:engine_attn_suite", cuda=True, check="engine.bench_suite:check_settings"
    ),
    "integration": Suite("integration.bench_suite:integration_suite", cuda=False),
}
DEFAULT_SUITES = ("topk", "tree", "accept")
# suites that time CUDA kernels: nothing to time without one
CUDA_SUITES = tuple(name for name, s in SUITES.items() if s.cuda)


def _load(target: str) -> Callable:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def suites() -> dict[str, SuiteFn]:
    """Every benchmark suite by name (imported here, explicitly: an import error is an error)."""
    return {name: _load(s.target) for name, s in SUITES.items()}


def prechecks(names: list[str]) -> list[Callable[[BenchConfig], list[str]]]:
    """The settings checks of the named suites (unknown names have none), in their order."""
    return [_load(s.check) for n in dict.fromkeys(names) if (s := SUITES.get(n)) and s.check]


def variant_sets() -> dict[str, set[str]]:
    """The kernel algorithms each suite with variants can time (`--variants`)."""
    from kernels.cuda import TREE_ALGOS
    from kernels.cuda_attention import ALGOS

    return {"tree": set(TREE_ALGOS), "attn": set(ALGOS)}
