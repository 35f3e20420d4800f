"""The drafter before its lookup was inlined and its history kept as text (engine/drafter.py at
d740fa9): the yardstick tests/test_engine_drafter.py pins the current one to, draft for draft."""

from __future__ import annotations

import torch

from engine.model import Model


class Drafter:
    def __init__(self, model: Model, draft_len: int, ngram: int = 4, boost: float = 4.0) -> None:
        self.draft_len = draft_len
        self.ngram = ngram
        self.boost = boost
        self.device = model.device
        self.table = model.bigram_logits()  # [V, V] float32, on the model's device
        host = self.table.cpu()
        self.argmax = host.argmax(dim=1).tolist()  # the bigram's own next token
        self.rowmax = host.max(dim=1).values.to(self.device)  # [V]

    def _lookup(self, hist: str) -> int | None:
        for n in range(min(self.ngram, len(hist) - 1), 1, -1):
            at = hist.rfind(hist[-n:], 0, len(hist) - 1)
            if at >= 0:
                return ord(hist[at + n])
        return None

    def draft(self, histories: list[list[int]]) -> torch.Tensor:
        """Logits [B, H, V] for positions L+1 .. L+H, given each sequence's committed tokens.

        Position d's row is the bigram row of the token before it; a history match adds
        `boost` over the row's max at the guessed token (which then is the row's argmax, the
        token position d + 1 is conditioned on). The chain of conditioning tokens is walked on
        the host with plain ints; the [B, H, V] logits are gathered on the device in one go.
        """
        b_n, h_n = len(histories), self.draft_len
        prev = [[0] * h_n for _ in range(b_n)]
        boost_at: list[tuple[int, int, int]] = []  # (b, d, token)
        for b, tokens in enumerate(histories):
            hist = "".join(map(chr, tokens[-512:]))
            for d in range(h_n):
                last = ord(hist[-1])
                prev[b][d] = last
                guess = self._lookup(hist)
                if guess is not None:
                    boost_at.append((b, d, guess))
                    hist += chr(guess)
                else:
                    hist += chr(self.argmax[last])
        prev_t = torch.tensor(prev, dtype=torch.int64).to(self.device)
        out = self.table.index_select(0, prev_t.view(-1)).view(b_n, h_n, -1)
        if boost_at:
            bi, di, ti = torch.tensor(boost_at, dtype=torch.int64).to(self.device).unbind(1)
            out[bi, di, ti] = self.rowmax[prev_t[bi, di]] + self.boost
        return out
