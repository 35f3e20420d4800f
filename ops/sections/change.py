"""The `change` section: which component switches from which backend to which, and the map
from a change to the bench rows that time both ends of it (`Change.bench_map`, BENCH_KERNELS,
the stage and prefill kernels the verdict prefers where the bench has them).

- `Change`: component (tree_build | accept | topk | attention), baseline / candidate backend
  (`reference|cpp|cuda`, `torch|cuda`); `bench_map()` names the bench suite, kernel and the
  two impls whose medians give s(c) (tree_build: suite "tree", build_trees, reference ->
  cpu_python, cpp -> cpu_cpp, cuda -> cuda_events); `shape` optionally pins other shape keys
  (e.g. {"budget": 16, "K": 8}); `baseline_impl` / `candidate_impl` override the map.
  `bench_kernel` optionally picks another kernel of the component (BENCH_KERNELS) with its own
  impl names: for `attention`, `row_attention` is the reference engine's own call (suite attn,
  fp32, torch -> torch_rows, cuda -> cuda_rows; shape B, T = budget + 1 rows, L = prefix keys,
  heads, kv_dim, dtype), so a rollout of the engine's attention pins e.g.
  `bench_kernel: row_attention, shape: {T: 17, L: 1024}` (playbooks/rollout-attention.yaml);
  without it, attention's s(c) is the generic tree_verify_attention (bf16) against torch SDPA.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from checks.vocabulary import COMPONENTS, HOST_BACKENDS
from ops.sections.common import OpenModel


class Change(OpenModel):
    component: str  # one of checks.vocabulary.COMPONENTS
    baseline: str
    candidate: str
    shape: dict[str, Any] = Field(default_factory=dict)
    baseline_impl: str | None = None
    candidate_impl: str | None = None
    bench_kernel: str | None = None  # another kernel of the component's (BENCH_KERNELS)

    @field_validator("component")
    @classmethod
    def _component(cls, v: str) -> str:
        if v not in COMPONENTS:
            raise ValueError(f"unknown component {v!r}; known: {sorted(COMPONENTS)}")
        return v

    @field_validator("baseline", "candidate")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in BACKEND_IMPL:
            raise ValueError(f"unknown backend {v!r}; known: {sorted(BACKEND_IMPL)}")
        return v

    @model_validator(mode="after")
    def _kernel(self) -> Change:
        check_bench_kernel(self.component, self.bench_kernel)
        return self

    def bench_map(self) -> tuple[str, str, str, str]:
        """(suite, kernel, baseline impl, candidate impl) of the bench rows giving s(c)."""
        suite, kernel, impls = BENCH_MAP[self.component]
        if self.bench_kernel is not None:
            _, suite, kernel, impls = BENCH_KERNELS[self.bench_kernel]
        base = self.baseline_impl or impls.get(self.baseline, BACKEND_IMPL[self.baseline])
        cand = self.candidate_impl or impls.get(self.candidate, BACKEND_IMPL[self.candidate])
        return suite, kernel, base, cand

    @property
    def label(self) -> str:
        return f"{self.component}: {self.baseline} -> {self.candidate}"

    @property
    def runs_on_cpu(self) -> bool:
        """The candidate is a host (CPU) backend: no GPU bench times it; the shadow on the
        service's own traffic gives its s (ops.verdict.amdahl, ops.verdict.decide)."""
        return self.candidate in HOST_BACKENDS


BACKEND_IMPL = {
    "reference": "cpu_python",
    "cpp": "cpu_cpp",
    "cuda": "cuda_events",
    "torch": "torch",
}
BENCH_MAP: dict[str, tuple[str, str, dict[str, str]]] = {
    "tree_build": ("tree", "build_trees", {}),
    "accept": ("accept", "greedy_accept", {}),
    "topk": ("topk", "topk_logprobs", {}),
    "attention": ("attn", "tree_verify_attention", {"torch": "torch_sdpa", "cuda": "cuda"}),
}
# kernel -> (component, suite, kernel, impls): what `Change.bench_kernel` may name
BENCH_KERNELS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "build_trees": ("tree_build", *BENCH_MAP["tree_build"]),
    "tree_verify_attention": ("attention", *BENCH_MAP["attention"]),
    "row_attention": ("attention", "attn", "row_attention",
                      {"torch": "torch_rows", "cuda": "cuda_rows"}),
    # the engine's tree-build STAGE as it calls it (kernels.tree_stage: the upload, the kernel
    # and the copy back into numpy trees), not the kernel alone: what the stage's time shrinks by
    "tree_build_stage": ("tree_build", "tree", "tree_build_stage",
                         {"reference": "reference_stage", "cuda": "cuda_stage"}),
}  # fmt: skip


# component -> the bench kernel timing the engine's whole STAGE (boundary copies included):
# s(c) comes from it when a change names no bench_kernel and the bench has its rows for both
# ends of the change (ops.verdict.decide.effective_change)
STAGE_KERNELS = {"tree_build": "tree_build_stage"}

# stage kernel -> {backend: impl} where the service's accept backend is "cuda" (the profile's
# service.backends.accept): a host tree builder's stage then ends by uploading its trees for
# the CUDA accept (engine.backends; kernels.tree_stage.reference_stage_to_device), so that
# stage, upload included, is what the change swaps (ops.verdict.amdahl.effective_change). cpp has no
# stage row: its change keeps the kernel rows.
CUDA_ACCEPT_IMPLS: dict[str, dict[str, str]] = {
    "tree_build_stage": {"reference": "reference_stage_to_device"},
}

# bench kernel -> the kernel timing the same change where it runs in prefill: a wall share's
# prefill part (ops.measure.profile) is projected with that kernel's speedup (ops.verdict.decide)
PREFILL_KERNELS = {"row_attention": "row_attention_prefill"}


def check_bench_kernel(component: str, kernel: str | None) -> None:
    """ValueError unless `kernel` is None or a bench kernel of `component` (BENCH_KERNELS)."""
    if kernel is None:
        return
    known = sorted(k for k, v in BENCH_KERNELS.items() if v[0] == component)
    if BENCH_KERNELS.get(kernel, ("",))[0] != component:
        names = " | ".join(known) or "none"
        raise ValueError(f"bench_kernel: {kernel!r} is not a bench kernel of {component} ({names})")
