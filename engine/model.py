"""The target model: MLA attention (absorbed form) + MoE with a shared expert, float32.

Batch invariance is the design rule: every per-token computation runs on that token's row
alone with fixed shapes (`torch.mv` for linear layers, per-row norms, RoPE and MoE), and its
attention sees exactly its visible keys gathered in position order (prefix, then its tree
ancestors, then itself). A row therefore gets bit-identical results whether it is an AR
decode row, a prefill row, or a node on the accepted path of a DDTree verify, alone or in a
batch of any size. AR decode is run as a verify of a root-only tree through the same code.

MLA absorbed form: the KV cache row is `[c_kv (kv_lora_rank, RMS-normed) | k_rope (rope dim)]`
shared by all heads; a head's query is `[q_nope @ W_UK | q_rope]`, its value is `c_kv`, and
its output latent is mapped back through W_UV (the layout of Kernels II when 512 + 64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.weights import Weights


class Attention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        pool: torch.Tensor,
        table: torch.Tensor,
        lens: list[int],
        scale: float,
        latent_dim: int,
    ) -> torch.Tensor:
        """q [R, heads, kv_dim], pool [slots, kv_dim], table [R, W] int64 (row i's visible
        slots in position order in table[i, :lens[i]]) -> out latent [R, heads, latent_dim]."""
        ...


def torch_attention(
    q: torch.Tensor,
    pool: torch.Tensor,
    table: torch.Tensor,
    lens: list[int],
    scale: float,
    latent_dim: int,
) -> torch.Tensor:
    """Per-row attention over exactly the row's visible keys, in the given (position) order."""
    outs = []
    for i, n in enumerate(lens):
        keys = pool.index_select(0, table[i, :n])  # [n, kv_dim], contiguous
        p = torch.softmax(torch.mm(q[i], keys.t()) * scale, dim=-1)  # [heads, n]
        outs.append(torch.mm(p, keys[:, :latent_dim]))
    return torch.stack(outs)


@dataclass
class Rows:
    """Rows of one forward: token, RoPE position, KV slot written, visible slots (incl. own).

    Slot tensors are int64 on the CPU; `Model.forward` moves them to the device in one copy.
    """

    tokens: list[int]
    positions: list[int]
    write_slots: torch.Tensor
    visible: list[torch.Tensor]


class Model:
    def __init__(self, cfg: ModelConfig, weights: Weights, device: str | torch.device = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.w = {k: v.to(self.device, torch.float32).contiguous() for k, v in weights.items()}
        half = cfg.qk_rope_dim // 2
        inv = 1.0 / (
            cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) * 2 / cfg.qk_rope_dim)
        )
        ang = torch.arange(cfg.max_seq_len + 1024, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos = ang.cos().float().to(self.device)
        self.sin = ang.sin().float().to(self.device)

    # -- per-row pieces -------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.norm_eps)

    def _rope(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = self.cos[pos], self.sin[pos]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)

    def _qkv(self, p: str, x: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, w = self.cfg, self.w
        h = self._norm(x, w[p + "attn_norm"])
        q = torch.mv(w[p + "wq"], h).view(cfg.heads, cfg.qk_nope_dim + cfg.qk_rope_dim)
        q_lat = torch.bmm(q[:, None, : cfg.qk_nope_dim], w[p + "w_uk"])[:, 0]
        q_full = torch.cat([q_lat, self._rope(q[:, cfg.qk_nope_dim :], pos)], dim=-1)
        kv = torch.mv(w[p + "wkv_a"], h)
        c = self._norm(kv[: cfg.kv_lora_rank], w[p + "kv_norm"])
        kv_row = torch.cat([c, self._rope(kv[cfg.kv_lora_rank :], pos)])
        return q_full, kv_row

    def _post_attention(self, p: str, x: torch.Tensor, o_lat: torch.Tensor) -> torch.Tensor:
        w = self.w
        o = torch.bmm(o_lat[:, None, :], w[p + "w_uv"])[:, 0].reshape(-1)
        x = x + torch.mv(w[p + "wo"], o)
        return x + self._moe(p, self._norm(x, w[p + "ffn_norm"]))

    def _moe(self, p: str, h: torch.Tensor) -> torch.Tensor:
        w = self.w
        y = torch.mv(
            w[p + "shared.w2"],
            F.silu(torch.mv(w[p + "shared.w1"], h)) * torch.mv(w[p + "shared.w3"], h),
        )
        probs = torch.softmax(torch.mv(w[p + "router"], h), dim=-1)
        vals, idx = torch.topk(probs, self.cfg.experts_per_token)
        gates = vals / vals.sum()
        # gather the chosen experts' weights (no device sync): fixed shapes per row
        hk = h.expand(idx.shape[0], h.shape[0]).unsqueeze(-1)  # [k, D, 1]
        act = F.silu(torch.bmm(w[p + "experts.w1"][idx], hk)) * torch.bmm(
            w[p + "experts.w3"][idx], hk
        )
        ye = torch.bmm(w[p + "experts.w2"][idx], act).squeeze(-1)  # [k, D]
        return y + (gates.unsqueeze(-1) * ye).sum(0)

    # -- forward ----------------------------------------------------------------------------
    def forward(self, rows: Rows, pool: torch.Tensor, attention: Attention) -> torch.Tensor:
        """Logits [R, V] of each row; writes each row's KV into `pool` [layers, slots, kv_dim]."""
        cfg, w = self.cfg, self.w
        if not rows.tokens:
            return torch.empty(0, cfg.vocab_size, device=self.device)
        tok = torch.tensor(rows.tokens, device=self.device)
        lens = [int(v.numel()) for v in rows.visible]
        table = torch.nn.utils.rnn.pad_sequence(rows.visible, batch_first=True).to(self.device)
        write = rows.write_slots.to(self.device)
        xs = list(w["embed"].index_select(0, tok).unbind(0))
        for layer in range(cfg.layers):
            p = f"layers.{layer}."
            pairs = [self._qkv(p, x, pos) for x, pos in zip(xs, rows.positions, strict=True)]
            qs, kvs = zip(*pairs, strict=True)
            pool[layer].index_copy_(0, write, torch.stack(kvs))
            o_lat = attention(
                torch.stack(qs), pool[layer], table, lens, cfg.softmax_scale, cfg.kv_lora_rank
            )
            xs = [self._post_attention(p, x, o) for x, o in zip(xs, o_lat.unbind(0), strict=True)]
        return torch.stack([torch.mv(w["head"], self._norm(x, w["final_norm"])) for x in xs])

    def bigram_logits(self) -> torch.Tensor:
        """[V, V]: the zero-layer model's next-token logits for each token (the drafter's table)."""
        w = self.w
        return torch.stack(
            [torch.mv(w["head"], self._norm(e, w["final_norm"])) for e in w["embed"]]
        )
