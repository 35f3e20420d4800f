"""Model and engine configuration: the `tiny` (CPU, CI) and `small` (GPU) presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

VOCAB_SIZE = 258  # 256 bytes + BOS + EOS (see engine.tokenizer)
# The largest tree budget (--budget, --max-budget) the engine's commands take: the KV cache
# reserves every sequence's tree, and a budget of 1e20 overflowed its allocation. (The CUDA
# tree builder itself takes at most kernels.cuda.MAX_BUDGET = 512 nodes.)
MAX_BUDGET = 4096
SEED_RANGE = (-(2**63), 2**64 - 1)  # the weight seeds torch.Generator.manual_seed takes
# float32 matmuls on a GPU (`--matmul`, engine.model.Model.precision): TF32 tensor cores (the
# default) or full fp32; a CPU computes fp32 whatever is chosen
MATMUL = ("tf32", "fp32")


@dataclass(frozen=True)
class ModelConfig:
    """A DeepSeek-V3 / Kimi-K2-style decoder: MLA attention + MoE with a shared expert."""

    vocab_size: int = VOCAB_SIZE
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    qk_nope_dim: int = 16  # per-head non-rotary query/key dims (absorbed into the latent)
    qk_rope_dim: int = 8  # per-head rotary dims; the rotary key is shared by all heads
    kv_lora_rank: int = 32  # latent width: the KV cache row is kv_lora_rank + qk_rope_dim
    v_head_dim: int = 16
    experts: int = 4
    experts_per_token: int = 2
    expert_inter: int = 64
    shared_inter: int = 64
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # How strongly the layers perturb the residual stream relative to the token embedding; a
    # small value keeps the target close to its zero-layer (bigram) approximation, which is
    # what the drafter computes (see engine.drafter).
    residual_scale: float = 0.5

    @property
    def kv_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def softmax_scale(self) -> float:
        return float((self.qk_nope_dim + self.qk_rope_dim) ** -0.5)


@dataclass(frozen=True)
class EngineConfig:
    """Decoding settings: DDTree shape, batching and the paged KV cache."""

    draft_len: int = 6  # H: drafted positions per step
    budget: int = 12  # tree nodes per request per step (root excluded)
    # The tree budget by batch size: a step of b requests grows each tree up to the rows one
    # forward chunk holds, `budget_at(b)` = max(budget, min(max_budget, row_chunk // b - 1));
    # 0 (or <= budget) keeps every step at `budget`. The verify's matmuls run on whole padded
    # chunks, so at a small batch the extra tree rows cost the GEMMs nothing and raise the
    # accept length; they do cost attention (per row, per key), so long prompts gain less.
    max_budget: int = 0
    topk: int = 0  # K per drafted position; 0 = min(budget, vocab) as the public reference does
    max_batch_size: int = 8
    page_size: int = 16
    max_new_tokens: int = 4096
    # rows per chunk of the batched forward: every matmul runs on exactly this many rows
    # (padded), which is what keeps a row's result independent of the batch (engine.model)
    row_chunk: int = 16

    def budget_at(self, batch: int) -> int:
        """Tree nodes per request in a step of `batch` requests (see `max_budget`)."""
        if self.max_budget <= self.budget:
            return self.budget
        return max(self.budget, min(self.max_budget, self.row_chunk // max(batch, 1) - 1))

    @property
    def largest_budget(self) -> int:
        """The largest tree any step builds (what KV reservations and buffers are sized for)."""
        return max(self.budget, self.max_budget)

    def k(self, vocab: int, budget: int | None = None) -> int:
        """K per drafted position for a tree of `budget` nodes (default: `budget`)."""
        b = self.budget if budget is None else budget
        return self.topk if self.topk > 0 else max(1, min(b, vocab))


@dataclass(frozen=True)
class Preset:
    name: str
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny"),
    # The `small` preset's KV rows are 512 latent + 64 rope = 576 wide, the layout of the
    # CUDA tree-verify attention kernel.
    "small": Preset(
        "small",
        ModelConfig(
            hidden=512,
            layers=4,
            heads=8,
            qk_nope_dim=64,
            qk_rope_dim=64,
            kv_lora_rank=512,
            v_head_dim=64,
            experts=8,
            experts_per_token=2,
            expert_inter=256,
            shared_inter=256,
            max_seq_len=2048,
        ),
        # one chunk holds a full DDTree step at batch 32 (32 x 18 = 576 rows): on a GPU with
        # TF32 matmuls the padded rows cost little and a forward is layers + 1 graph launches
        # (benchmarks/NOTES-engine.md at abb2881, "One chunk, TF32"); trees of 32 nodes up to
        # batch 17, then what fills the chunk (17 nodes at batch 32; docs/performance.md, "The
        # reference engine": by batch against a fixed budget)
        EngineConfig(
            draft_len=7,
            budget=16,
            max_budget=32,
            max_batch_size=32,
            page_size=64,
            row_chunk=576,
        ),
    ),
}


def preset(name: str, **engine_overrides: int) -> Preset:
    """The named preset, with optional EngineConfig overrides (e.g. budget=8)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    p = PRESETS[name]
    if engine_overrides:
        p = dataclasses.replace(p, engine=dataclasses.replace(p.engine, **engine_overrides))
    return p


def tokens_reached(p: Preset, mode: str, prompt_len: int, steps: int) -> int:
    """The longest a sequence of `prompt_len` tokens can grow in `steps` decode steps (the
    worst case: every DDTree step commits draft_len + 1 tokens, an AR step one). A bench checks
    it against `p.model.max_seq_len` before anything runs (engine.attn_bench, and
    engine.bench_suite for the child it will start)."""
    per = p.engine.draft_len + 1 if mode == "ddtree" else 1
    return prompt_len + steps * per


def to_dict(p: Preset) -> dict:
    return {
        "name": p.name,
        "model": dataclasses.asdict(p.model),
        "engine": dataclasses.asdict(p.engine),
    }
