"""Decoding steps: prefill, AR step and DDTree step over a batch of sequences.

A DDTree step: draft logits [B, H, V] -> top-K log-probs -> best-first trees (budget nodes)
-> one target forward over root + nodes (each row sees the prefix and its ancestors; tree
node i is stored at position L + i, rotated at position L + depth) -> per-row argmax ->
greedy accept -> KV compaction of the accepted rows and commit of accepted tokens + bonus.
An AR step is the same verify with a root-only tree, so both modes share one code path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.backends import Backends
from engine.config import EngineConfig
from engine.drafter import Drafter
from engine.kvcache import PagedKVCache, SeqBlocks
from engine.model import Model, Rows


@dataclass
class Sequence:
    """A sequence being decoded: committed tokens; KV exists for all but the last (the root)."""

    tokens: list[int]
    blocks: SeqBlocks
    kv_len: int = 0
    temperature: float = 0.0  # > 0: sample the AR token (ar mode only); 0: greedy
    generator: torch.Generator | None = None

    @property
    def root(self) -> int:
        return self.tokens[-1]


@dataclass
class StepResult:
    new_tokens: list[list[int]]  # per sequence, committed this step (accepted + bonus)
    stages: dict[str, float] = field(default_factory=dict)


class Decoder:
    def __init__(self, model: Model, cfg: EngineConfig, mode: str, backends: Backends) -> None:
        if mode not in ("ar", "ddtree"):
            raise ValueError(f"mode must be 'ar' or 'ddtree', got {mode!r}")
        self.model, self.cfg, self.mode, self.backends = model, cfg, mode, backends
        mc = model.cfg
        slots_per_seq = mc.max_seq_len + cfg.budget + 2
        pages = cfg.max_batch_size * -(-slots_per_seq // cfg.page_size) + 1
        self.cache = PagedKVCache(mc.layers, pages, cfg.page_size, mc.kv_dim, model.device)
        self.drafter = Drafter(model, cfg.draft_len) if mode == "ddtree" else None
        self.k = cfg.k(mc.vocab_size)

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    def new_sequence(
        self, prompt: list[int], temperature: float = 0.0, seed: int | None = None
    ) -> Sequence:
        if temperature > 0 and self.mode != "ar":
            raise ValueError("sampling (temperature > 0) is offered in ar mode only")
        gen = None
        if temperature > 0:
            gen = torch.Generator()
            gen.manual_seed(seed) if seed is not None else gen.seed()
        return Sequence(list(prompt), self.cache.new_sequence(), 0, temperature, gen)

    def prefill(self, seq: Sequence) -> None:
        """Write the KV of every prompt token but the last (the first step's root)."""
        n = len(seq.tokens) - 1
        seq.blocks.reserve(n + self.cfg.budget + 2)
        if n > 0:
            slots = seq.blocks.slots(range(n))
            rows = Rows(seq.tokens[:n], list(range(n)), slots, [slots[: p + 1] for p in range(n)])
            self.model.forward(rows, self.cache.pool, self.backends.attention)
        seq.kv_len = n

    def step(self, seqs: list[Sequence]) -> StepResult:
        stages: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(stage: str) -> None:
            nonlocal clock
            self._sync()
            now = time.perf_counter()
            stages[stage] = now - clock
            clock = now

        trees = None
        if self.mode == "ddtree":
            logits = self.drafter.draft([s.tokens for s in seqs])
            lap("draft")
            lp, ids = self.backends.topk(logits, self.k)
            lap("topk")
            trees = self.backends.tree_build(lp, ids, self.cfg.budget)
            lap("tree_build")
        num_nodes = [0] * len(seqs) if trees is None else [int(n) for n in trees.num_nodes]

        # verify: one target forward over every request's root + nodes
        tokens: list[int] = []
        positions: list[int] = []
        write: list[torch.Tensor] = []
        visible: list[torch.Tensor] = []
        for b, s in enumerate(seqs):
            n, L = num_nodes[b], s.kv_len
            s.blocks.reserve(L + n + 1)
            prefix = s.blocks.slots(range(L))
            tree_slots = s.blocks.slots(range(L, L + n + 1))
            write.append(tree_slots)
            tokens.append(s.root)
            positions.append(L)
            visible.append(torch.cat([prefix, tree_slots[:1]]))
            for i in range(1, n + 1):
                tokens.append(int(trees.token_ids[b, i - 1]))
                positions.append(L + int(trees.depths[b, i - 1]))
                path = np.flatnonzero(trees.visibility[b, i, : n + 1])  # ancestors + self, in order
                visible.append(torch.cat([prefix, tree_slots[torch.from_numpy(path)]]))
        rows = Rows(tokens, positions, torch.cat(write), visible)
        logits = self.model.forward(rows, self.cache.pool, self.backends.attention)
        argmax = logits.argmax(dim=-1).cpu().numpy()
        lap("verify")

        if trees is None:
            accepted = [[0] for _ in seqs]
            bonus = [int(t) for t in argmax]
            for b, s in enumerate(seqs):
                if s.temperature > 0:  # row b is sequence b's only row in an AR step
                    probs = torch.softmax(logits[b].double().cpu() / s.temperature, dim=-1)
                    bonus[b] = int(torch.multinomial(probs, 1, generator=s.generator))
        else:
            target = np.zeros((len(seqs), self.cfg.budget + 1), dtype=np.int64)
            off = 0
            for b, n in enumerate(num_nodes):
                target[b, : n + 1] = argmax[off : off + n + 1]
                off += n + 1
            acc, alen, bon = self.backends.accept(trees, target, self.cfg.draft_len)
            accepted = [[int(a) for a in acc[b, : int(alen[b])]] for b in range(len(seqs))]
            bonus = [int(x) for x in bon]
            lap("accept")

        new_tokens = []
        for b, s in enumerate(seqs):
            acc_b = accepted[b]
            s.blocks.compact(s.kv_len, acc_b)
            s.kv_len += len(acc_b)
            new = [int(trees.token_ids[b, a - 1]) for a in acc_b[1:]] + [bonus[b]]
            s.tokens.extend(new)
            new_tokens.append(new)
        lap("commit")
        return StepResult(new_tokens, stages)
