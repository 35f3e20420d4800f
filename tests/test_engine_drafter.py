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


def _assert_equal(hs: list[list[int]], draft_lens: range = range(1, 10)) -> None:
    _, dec = build_decoder(EngineSpec(preset="tiny", device="cpu", mode="ddtree"))
    for draft_len in draft_lens:
        new, old = Drafter(dec.model, draft_len), DrafterV1(dec.model, draft_len)
        want = old.draft(hs)
        assert torch.equal(new.draft(hs), want), draft_len
        assert torch.equal(new.draft([history_text(h) for h in hs]), want), draft_len


def test_drafts_equal_at_the_window_edges_and_every_draft_len() -> None:
    """Histories of exactly 512, 513 and 1024 tokens, draft_len 1 .. 9; and a needle whose
    only earlier occurrence starts just outside the 512-token window, at, or just inside it."""
    rng = random.Random(11)
    hs = [h[: rng.choice([512, 513, 1024])] for h in histories(3, 12) if len(h) >= 900]
    hs += [[rng.randrange(258) for _ in range(n)] for n in (512, 513, 1024)]
    for size in (512, 513, 600, 1024):  # the needle (10, 11, 12, 13) then 99 at `start`
        for start in range(size - 516, size - 508):
            h = [20 + (7 * i) % 230 for i in range(size - 4)] + [10, 11, 12, 13]
            h[start : start + 5] = [10, 11, 12, 13, 99]
            hs.append(h)
    _assert_equal(hs)


def test_drafts_equal_when_needles_overlap_the_drafted_tokens() -> None:
    """Short histories, runs and short cycles: the chain finds its needles in (and running
    into) the positions it drafted itself; BOS/EOS (256, 257) among the tokens."""
    hs = [
        [7],
        [7, 7],
        [7, 7, 7],
        [256, 256, 256],
        [1, 2],
        [1, 2, 1],
        [5, 6, 5, 6, 5],
        [3, 3, 3, 4, 3, 3],
        [9, 8, 7, 9, 8],
    ]
    hs += [[256], [256, 257], [256, 1, 2, 257, 256, 1], [257, 257, 256, 257, 257]]
    hs += [[256] + [40, 41, 42] * 200 + [257], [1, 2, 3, 4] * 130 + [256, 257, 256]]
    filler = [20 + (7 * i) % 230 for i in range(600)]  # no bigram of equal tokens
    for end in ([5, 6, 6, 6], [6, 6], [5, 6, 6, 6, 6], [5, 6, 5, 6, 5], [256, 257, 257, 257]):
        hs += [filler + end, filler[:10] + end]
    _assert_equal(hs)


def test_drafts_equal_with_other_ngram_lengths() -> None:
    _, dec = build_decoder(EngineSpec(preset="tiny", device="cpu", mode="ddtree"))
    hs = histories(5, 12) + [[1, 2, 1, 2, 1], [256, 257, 256]]
    for ngram in (2, 3, 5):
        new, old = Drafter(dec.model, 7, ngram), DrafterV1(dec.model, 7, ngram)
        assert torch.equal(new.draft(hs), old.draft(hs)), ngram


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
