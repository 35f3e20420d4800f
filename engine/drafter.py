"""The drafter: logits for the next H positions in one call, a cheap approximation of the target.

Two deterministic parts, no training:
- the zero-layer (bigram) model: the target's embedding, final norm and head with every layer
  dropped, precomputed once as a `[V, V]` table (it shares embeddings and head with the
  target; the layers only perturb the residual stream, `ModelConfig.residual_scale`);
- a lookup in the sequence's own history (prompt-lookup decoding): if the last n tokens
  (n = 4 .. 2) occurred before, the token that followed them gets the top logit (+`boost`).
Position 0 is conditioned on the root token; position d > 0 on the drafter's own argmax at
d - 1 (a block of H positions from one call). Greedy decoding of a random model settles into
long repeating patterns, which the lookup predicts, so the mean accepted length on the golden
prompts is well above 2 (`python -m engine.golden` measures it).
"""

from __future__ import annotations

import torch

from engine.model import Model

HISTORY = 512  # tokens of a sequence's history the lookup searches (its last HISTORY)


def history_text(tokens: list[int]) -> str:
    """A token list as the drafter searches it: one character per token (ids < 0x110000)."""
    return "".join(map(chr, tokens))


class Drafter:
    def __init__(self, model: Model, draft_len: int, ngram: int = 4, boost: float = 4.0) -> None:
        self.draft_len = draft_len
        self.ngram = ngram
        self.boost = boost
        self.device = model.device
        self.table = model.bigram_logits()  # [V, V] float32, on the model's device
        host = self.table.cpu()
        self.argmax = host.argmax(dim=1).tolist()  # the bigram's own next token
        self.next_char = {chr(t): chr(a) for t, a in enumerate(self.argmax)}  # the same, as text
        # a boosted guess's logit: its row's max + boost, per conditioning token [V] (float32:
        # the very values `rowmax[token] + boost` gives on the device)
        self.boosted = host.max(dim=1).values.to(self.device) + boost

    def draft(self, histories: list[list[int]] | list[str]) -> torch.Tensor:
        """Logits [B, H, V] for positions L+1 .. L+H, given each sequence's committed tokens
        (a token list, or its `history_text`, which a caller can keep growing instead of
        rebuilding it every step).

        Position d's row is the bigram row of the token before it; a history match adds
        `boost` over the row's max at the guessed token (which then is the row's argmax, the
        token position d + 1 is conditioned on). The guess: the token that followed the latest
        earlier occurrence of the last n tokens (n = ngram .. 2) in the last HISTORY tokens
        plus the positions drafted so far. The chain is walked on the host, in text (a drafted
        token is a char appended to the history; the conditioning tokens are converted to ints
        once, for the upload); the [B, H, V] logits are gathered on the device in one go, and the
        boosts written there by one gather and one scatter.
        """
        b_n, h_n, top = len(histories), self.draft_len, self.ngram
        next_char, vocab = self.next_char, self.table.shape[1]
        walked: list[str] = []  # per sequence: the root, then its drafted tokens but the last
        boosts: list[int] = []  # per boosted row: its flat logit index row * V + token
        conds: list[str] = []  # per boosted row: its conditioning token, as a char
        for b, tokens in enumerate(histories):
            hist = tokens[-HISTORY:] if isinstance(tokens, str) else history_text(tokens[-HISTORY:])
            first = len(hist) - 1  # position 0's end; position d's is first + d
            row = b * h_n - first  # position d's row is row + its end
            at0 = row * vocab  # position d's row's logits start at at0 + end * vocab
            if top == 4 and first >= 4:  # the default, unrolled (hot at batch 32)
                for end in range(first, first + h_n):
                    at = hist.rfind(hist[-4:], 0, end)
                    if at >= 0:
                        hist += hist[at + 4]
                        boosts.append(at0 + end * vocab + ord(hist[-1]))
                        conds.append(hist[end])
                        continue
                    at = hist.rfind(hist[-3:], 0, end)
                    if at >= 0:
                        hist += hist[at + 3]
                        boosts.append(at0 + end * vocab + ord(hist[-1]))
                        conds.append(hist[end])
                        continue
                    at = hist.rfind(hist[-2:], 0, end)
                    if at >= 0:
                        hist += hist[at + 2]
                        boosts.append(at0 + end * vocab + ord(hist[-1]))
                        conds.append(hist[end])
                        continue
                    hist += next_char[hist[-1]]
                walked.append(hist[first : first + h_n])
                continue
            for end in range(first, first + h_n):  # plain str ops, no ord/chr but the boosts'
                for n in range(min(top, end), 1, -1):
                    at = hist.rfind(hist[-n:], 0, end)
                    if at >= 0:
                        hist += hist[at + n]
                        boosts.append(at0 + end * vocab + ord(hist[-1]))
                        conds.append(hist[end])
                        break
                else:
                    hist += next_char[hist[-1]]
            walked.append(hist[first : first + h_n])
        # one upload: every position's conditioning token, then the boosted logits' flat
        # indices and their rows' conditioning tokens
        flat = list(map(ord, "".join(walked) + "".join(conds)))
        flat[b_n * h_n : b_n * h_n] = boosts
        dev = torch.tensor(flat, dtype=torch.int64).to(self.device)
        n, m = b_n * h_n, len(boosts)
        out = self.table.index_select(0, dev[:n])
        if boosts:  # one gather, one scatter (each boosted row once: no duplicate index)
            out.view(-1).index_copy_(0, dev[n : n + m], self.boosted.index_select(0, dev[n + m :]))
        return out.view(b_n, h_n, -1)
