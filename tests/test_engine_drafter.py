"""engine.drafter: the draft logits are exactly those of the previous implementation
(tests/helpers/drafter_v1.py: the lookup a function, the history text rebuilt every call), from
token lists and from the text a sequence keeps (`Sequence.text`), on histories with and without
repeats, shorter and longer than the 512-token window; and the decoder keeps `text` in step with
`tokens`."""

from __future__ import annotations

import random

import torch
from helpers.drafter_v1 import Drafter as DrafterV1

from engine.drafter import Drafter, history_text
from engine.runtime import EngineSpec, build_decoder


def histories(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.choice([1, 2, 3, 5, 40, 511, 512, 513, 900])
        base = [rng.randrange(258) for _ in range(rng.randrange(2, 30))]
        h: list[int] = []
        while len(h) < length:  # repeats, as greedy decoding of a random model settles into
            h += (
                base[: rng.randrange(1, len(base) + 1)]
                if rng.random() < 0.7
                else [rng.randrange(258)]
            )
        out.append(h[:length])
    return out


def test_drafts_equal_the_previous_implementation() -> None:
    _, dec = build_decoder(EngineSpec(preset="tiny", device="cpu", mode="ddtree"))
    model = dec.model
    for draft_len in (1, 6, 9):
        new, old = Drafter(model, draft_len), DrafterV1(model, draft_len)
        for seed in range(6):
            hs = histories(seed, 12)
            want = old.draft(hs)
            assert torch.equal(new.draft(hs), want), (draft_len, seed)
            assert torch.equal(new.draft([history_text(h) for h in hs]), want), (draft_len, seed)


def test_the_decoder_keeps_text_in_step_with_tokens() -> None:
    _, dec = build_decoder(EngineSpec(preset="tiny", device="cpu", mode="ddtree"))
    seqs = [dec.new_sequence(h) for h in histories(7, 3) if len(h) > 2]
    for s in seqs:
        dec.prefill(s)
    for _ in range(5):
        dec.step(seqs)
        assert all(s.text == history_text(s.tokens) for s in seqs)
    for s in seqs:
        s.blocks.free()
