"""Decoding steps: prefill, AR step and DDTree step over a batch of sequences.

A DDTree step: draft logits [B, H, V] -> top-K log-probs -> best-first trees (budget nodes) -> one
target forward over every request's root + nodes at once (each row sees the prefix and its
ancestors; tree node i is stored at position L + i, rotated at position L + depth) -> per-row
argmax -> greedy accept -> KV compaction of the accepted rows and commit of accepted tokens +
bonus. An AR step is the same verify with a root-only tree, so both modes share one code path. A
step's rows and their visible slots are built for the whole batch at once (the slot table on the
GPU where attention reads it), and the commit compacts the whole batch's KV in one gather and one
scatter. Stage times (engine.stage_clock: each stage's span on the step's critical path, from CUDA
events on a GPU, no sync per stage): draft, topk, tree_build, verify (the forward, argmax
included), attention (the part of verify spent in attention, its plan and its calls, measured
inside it), accept, commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.backends import Backends, attention_backend, tree_build_backend
from engine.config import EngineConfig
from engine.drafter import Drafter, history_text
from engine.forward import AttentionTimer, Forward, Rows, ShadowedCalls
from engine.kvcache import PagedKVCache, SeqBlocks
from engine.model import Model
from engine.shadow import Shadow
from engine.stage_clock import StageClock
from kernels.row_attention import paged_slots, prefill_blocks, visible_rows, visible_rows_device


@dataclass
class Sequence:
    """A sequence being decoded: committed tokens; KV exists for all but the last (the root)."""

    tokens: list[int]
    blocks: SeqBlocks
    kv_len: int = 0
    temperature: float = 0.0  # > 0: sample the AR token (ar mode only); 0: greedy
    generator: torch.Generator | None = None
    text: str = ""  # `tokens` as the drafter searches them (engine.drafter.history_text)

    @property
    def root(self) -> int:
        return self.tokens[-1]


@dataclass
class StepResult:
    new_tokens: list[list[int]]  # per sequence, committed this step (accepted + bonus)
    stages: dict[str, float] = field(default_factory=dict)


class Decoder:
    def __init__(
        self, model: Model, cfg: EngineConfig, mode: str, backends: Backends, graphs: bool = True
    ) -> None:
        if mode not in ("ar", "ddtree"):
            raise ValueError(f"mode must be 'ar' or 'ddtree', got {mode!r}")
        self.model, self.cfg, self.mode, self.backends = model, cfg, mode, backends
        mc = model.cfg
        slots_per_seq = mc.max_seq_len + cfg.largest_budget + 2
        pages = cfg.max_batch_size * -(-slots_per_seq // cfg.page_size) + 1
        self.cache = PagedKVCache(mc.layers, pages, cfg.page_size, mc.kv_dim, model.device)
        self.drafter = Drafter(model, cfg.draft_len) if mode == "ddtree" else None
        self.k = cfg.k(mc.vocab_size)
        max_rows = max(  # the most rows a step's forward can hold, over every batch size
            b * ((cfg.budget_at(b) if mode == "ddtree" else 0) + 1)
            for b in range(1, cfg.max_batch_size + 1)
        )
        self.forward = Forward(
            model,
            self.cache.pool,
            self.cache.trash_slot,
            max(max_rows, cfg.row_chunk),
            cfg.row_chunk,
            graphs,
        )
        self.forward.capture()
        # engine.shadow: off until the front end arms it (POST /shadow)
        self.shadow = Shadow(backends.names, self._shadow_backend, model.device.type)
        self.forward.shadow = self.shadow

    def _shadow_backend(self, component: str, kind: str) -> Any:
        """A fresh backend for the shadow's candidate (engine.shadow)."""
        if component == "attention":
            return attention_backend(kind, self.model.device)
        if self.mode != "ddtree":
            raise ValueError(f"this engine (--mode {self.mode}) builds no trees")
        return tree_build_backend(kind, self.backends.names["accept"], self.model.device, True)

    def _stream(self) -> torch.cuda.Stream | None:
        """The stream the engine queues its work on (None on a CPU)."""
        if self.model.device.type != "cuda":
            return None
        return torch.cuda.current_stream(self.model.device.index)

    def new_sequence(
        self, prompt: list[int], temperature: float = 0.0, seed: int | None = None
    ) -> Sequence:
        if temperature > 0 and self.mode != "ar":
            raise ValueError("sampling (temperature > 0) is offered in ar mode only")
        gen = None
        if temperature > 0:
            gen = torch.Generator()
            gen.manual_seed(seed) if seed is not None else gen.seed()
        return Sequence(
            list(prompt), self.cache.new_sequence(), 0, temperature, gen, history_text(prompt)
        )

    def prefill(self, seq: Sequence) -> float:
        """Write the KV of every prompt token but the last (the first step's root), in blocks
        of at most the forward's row capacity (row p sees positions 0 .. p). Returns the
        seconds spent in attention (timed as in a step's verify)."""
        n = len(seq.tokens) - 1
        seq.blocks.reserve(n + self.cfg.largest_budget + 2)
        slots = seq.blocks.slot_array(max(n, 0))
        tokens = np.asarray(seq.tokens[:n], dtype=np.int64)
        timer = AttentionTimer(self.model.device)
        # on a GPU the blocks' tables are built there, as a decode step's (a CPU reads numpy's)
        dev = self.model.device if self.model.device.type == "cuda" else None
        for a, b, table, lens in prefill_blocks(slots, n, self.forward.max_rows, dev):
            rows = Rows(tokens[a:b], lens - 1, slots[a:b], table, lens)
            self.forward.run(rows, self.backends.attention, timer, kind="prefill")
        seq.kv_len = n
        stream = self._stream()
        if stream is not None:
            stream.synchronize()
        return timer.seconds()

    def _verify_rows(
        self, seqs: list[Sequence], trees, num_nodes: list[int], budget: int
    ) -> tuple[Rows, np.ndarray, np.ndarray]:
        """Every request's root + tree nodes as rows, each with its visible slots in position
        order (the prefix, then its ancestors and itself), for the whole batch at once; each
        row's flat index in the accept's `[B, budget + 1]` target; and the pool slot of each
        request's positions 0 .. W - 1 ([B, W], what the commit's compaction moves between)."""
        B = len(seqs)
        lens_pre = np.array([s.kv_len for s in seqs], dtype=np.int64)  # L_b
        nodes = np.asarray(num_nodes, dtype=np.int64)
        T = int(nodes.max()) + 1 if B else 1  # rows per request (padded)
        for s, n in zip(seqs, num_nodes, strict=True):
            s.blocks.reserve(s.kv_len + n + 1)
        W = int(lens_pre.max()) + T
        pages = np.zeros((B, max(len(s.blocks.pages) for s in seqs)), dtype=np.int64)
        for b, s in enumerate(seqs):
            pages[b, : len(s.blocks.pages)] = s.blocks.pages
        slots = paged_slots(pages, W, self.cache.page_size)  # [B, W]
        if trees is None:
            vis = np.ones((B, 1, 1), dtype=bool)
        else:
            vis = np.asarray(trees.visibility[:, :T, :T], dtype=bool)
        keep = (np.arange(T)[None, :] <= nodes[:, None]).reshape(-1)
        kept = np.flatnonzero(keep)
        if self.model.device.type == "cuda":  # the [R, W] table built where attention reads it
            table, lens = visible_rows_device(slots, lens_pre, vis, kept, self.model.device)
        else:  # a CPU reads it where numpy builds it (the same table: visible_rows_device's doc)
            table, lens = visible_rows(slots, lens_pre, vis)
            table, lens = table.reshape(B * T, W)[kept], lens.reshape(B * T)[kept]
        tokens = np.zeros((B, T), dtype=np.int64)
        tokens[:, 0] = [s.root for s in seqs]
        positions = np.repeat(lens_pre[:, None], T, axis=1)
        if trees is not None and T > 1:
            tokens[:, 1:] = trees.token_ids[:, : T - 1]
            positions[:, 1:] += trees.depths[:, : T - 1]
        write = slots[np.arange(B)[:, None], lens_pre[:, None] + np.arange(T)[None, :]]
        rows = Rows(*(a.reshape(B * T)[keep] for a in (tokens, positions, write)), table, lens)
        b, i = np.divmod(kept, T)
        return rows, b * (budget + 1) + i, slots

    def step(self, seqs: list[Sequence]) -> StepResult:
        stream = self._stream()  # looked up once a step: the laps' and the attention timer's
        clock = StageClock(stream)
        lap = clock.lap
        trees = None
        budget = self.cfg.budget_at(len(seqs))  # the tree budget of a step this size
        if self.mode == "ddtree":
            logits = self.drafter.draft([s.text for s in seqs])
            lap("draft")
            lp, ids = self.backends.topk(logits, self.cfg.k(self.model.cfg.vocab_size, budget))
            lap("topk")
            taken = self.shadow.take("tree_build", "step", len(seqs))
            if taken is None:
                trees = self.backends.tree_build(lp, ids, budget)
            else:  # both stages on the same log-probs, each timed as the stage clock times one
                sampled = ShadowedCalls(self.shadow, taken, self.model.device, stream)
                trees = sampled.call(
                    lambda: self.backends.tree_build(lp, ids, budget),
                    lambda _plan: taken.candidate(lp, ids, budget),
                )
                pair = sampled.finish("step", len(seqs), None)
                if pair is not None:  # the stage's time is the serving one's alone
                    clock.exclude("tree_build", pair.cand_calls_us / 1e6)
            lap("tree_build")
        num_nodes = [0] * len(seqs) if trees is None else [int(n) for n in trees.num_nodes]

        # verify: one target forward over every request's root + nodes
        timer = AttentionTimer(self.model.device, stream)
        rows, place, slots = self._verify_rows(seqs, trees, num_nodes, budget)
        logits = self.forward.run(rows, self.backends.attention, timer)
        argmax = logits.argmax(dim=-1)
        if trees is None:
            argmax = argmax.cpu().numpy()
        elif len(place) == len(seqs) * (budget + 1):  # every tree full: in place
            target = argmax
        else:  # the target ids stay on the model's device: a CUDA accept reads them there
            target = torch.zeros(len(seqs) * (budget + 1), dtype=torch.int64, device=argmax.device)
            target[torch.from_numpy(place).to(argmax.device)] = argmax
        lap("verify")

        if trees is None:
            new_tokens = [[int(t)] for t in argmax]
            for b, s in enumerate(seqs):
                if s.temperature > 0:  # row b is sequence b's only row in an AR step
                    probs = torch.softmax(logits[b].double().cpu() / s.temperature, dim=-1)
                    new_tokens[b] = [int(torch.multinomial(probs, 1, generator=s.generator))]
        else:
            target = target.view(len(seqs), budget + 1)
            acc, alen, bon = self.backends.accept(trees, target, self.cfg.draft_len)
            lap("accept")
            new_tokens = self._compact(seqs, slots, trees, acc, alen, bon)
        for s, new in zip(seqs, new_tokens, strict=True):
            s.kv_len += len(new)  # the accepted rows (root included); the bonus is the new root
            s.tokens.extend(new)
            s.text += history_text(new)
        lap("commit")
        stages = clock.finish()
        stages["attention"] = timer.seconds()  # its events are done: finish synchronised
        return StepResult(new_tokens, stages)

    def _compact(
        self, seqs: list[Sequence], slots: np.ndarray, trees, acc, alen, bon
    ) -> list[list[int]]:
        """Move the KV of every request's accepted tree rows L + acc[k] to L + k (the whole
        batch in one gather and one scatter) and return each request's new tokens: the
        accepted nodes' tokens, then the bonus. acc [B, H + 1]: accepted node indices (0 the
        root, node i the tree's token i - 1), the first alen[b] of them valid."""
        acc, alen = np.asarray(acc, dtype=np.int64), np.asarray(alen, dtype=np.int64)
        k = np.arange(acc.shape[1])
        moved = (k[None, :] < alen[:, None]) & (acc != k[None, :])
        if moved.any():
            b, i = np.nonzero(moved)
            lens = np.array([s.kv_len for s in seqs], dtype=np.int64)[b]
            self.cache.move(slots[b, lens + acc[b, i]], slots[b, lens + i])
        toks = np.asarray(trees.token_ids)[np.arange(len(seqs))[:, None], np.maximum(acc - 1, 0)]
        bonus, lens = np.asarray(bon).tolist(), alen.tolist()
        return [row[1:n] + [x] for row, n, x in zip(toks.tolist(), lens, bonus, strict=True)]
