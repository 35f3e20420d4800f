"""The target model: MLA attention (absorbed form) + MoE with a shared expert, float32.

The model's math works on a *chunk*: a fixed number of rows (`EngineConfig.row_chunk`), each a
token at a position. Every matmul, norm, RoPE and MoE of a layer runs once for the whole chunk,
with the same shapes whatever the rows are, so the same kernels with the same reduction order
compute every row: a row's result depends only on that row, never on which rows share its
chunk or how many chunks a forward has (batch invariance; `engine.forward` pads the last chunk).
That is what keeps DDTree output == AR output bit for bit while a step's whole batch, every
request's tree rows included, goes through one forward.

A layer is two segments around its attention (`engine.attention`): `pre` (norm, the query and
the KV row of every row, written into the paged pool) and `post` (output projection, residual,
MoE). MoE runs every expert on the chunk (one GEMM over the concatenated experts' W1 and W3,
one batched GEMM for W2) and mixes each row's top-k in its own rank order: fixed shapes, which
also make each segment capturable as a CUDA graph.

MLA absorbed form: the KV cache row is `[c_kv (kv_lora_rank, RMS-normed) | k_rope (rope dim)]`
shared by all heads; a head's query is `[q_nope @ W_UK | q_rope]`, its value is `c_kv`, and its
output latent is mapped back through W_UV (the 512 + 64 layout of the CUDA attention kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.weights import Weights


class Model:
    def __init__(self, cfg: ModelConfig, weights: Weights, device: str | torch.device = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.w = {k: v.to(self.device, torch.float32).contiguous() for k, v in weights.items()}
        for i in range(cfg.layers):  # the experts' weights as one GEMM (W1, W3) and one bmm (W2)
            p = f"layers.{i}."
            self.w[p + "experts.w1cat"] = self.w[p + "experts.w1"].reshape(-1, cfg.hidden)
            self.w[p + "experts.w3cat"] = self.w[p + "experts.w3"].reshape(-1, cfg.hidden)
            self.w[p + "experts.w2t"] = self.w[p + "experts.w2"].transpose(1, 2).contiguous()
        half = cfg.qk_rope_dim // 2
        inv = 1.0 / (
            cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) * 2 / cfg.qk_rope_dim)
        )
        ang = torch.arange(cfg.max_seq_len + 1024, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos = ang.cos().float().to(self.device)
        self.sin = ang.sin().float().to(self.device)

    # -- pieces, each over a chunk [C, ...] ------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.norm_eps)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.w["embed"].index_select(0, tokens)

    def pre(
        self,
        layer: int,
        x: torch.Tensor,
        pos: torch.Tensor,
        write: torch.Tensor,
        pool: torch.Tensor,
    ) -> torch.Tensor:
        """Queries [C, heads, kv_dim] of the chunk; writes its KV rows into `pool` at `write`."""
        cfg, w, p = self.cfg, self.w, f"layers.{layer}."
        c, nope = x.shape[0], cfg.qk_nope_dim
        h = self._norm(x, w[p + "attn_norm"])
        q = F.linear(h, w[p + "wq"]).view(c, cfg.heads, nope + cfg.qk_rope_dim)
        q_lat = torch.bmm(q[:, :, :nope].transpose(0, 1), w[p + "w_uk"]).transpose(0, 1)
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        q_full = torch.cat([q_lat, self._rope(q[:, :, nope:], cos[:, None], sin[:, None])], dim=-1)
        kv = F.linear(h, w[p + "wkv_a"])
        latent = self._norm(kv[:, : cfg.kv_lora_rank], w[p + "kv_norm"])
        rows = torch.cat([latent, self._rope(kv[:, cfg.kv_lora_rank :], cos, sin)], dim=-1)
        pool.index_copy_(0, write, rows)
        return q_full

    def post(self, layer: int, x: torch.Tensor, o_lat: torch.Tensor) -> torch.Tensor:
        """The residual stream after the layer: output projection, residual, MoE."""
        w, p = self.w, f"layers.{layer}."
        o = torch.bmm(o_lat.transpose(0, 1), w[p + "w_uv"]).transpose(0, 1).reshape(x.shape[0], -1)
        x = x + F.linear(o, w[p + "wo"])
        return x + self._moe(p, self._norm(x, w[p + "ffn_norm"]))

    def _moe(self, p: str, h: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        c = h.shape[0]
        shared = F.linear(
            F.silu(F.linear(h, w[p + "shared.w1"])) * F.linear(h, w[p + "shared.w3"]),
            w[p + "shared.w2"],
        )
        probs = torch.softmax(F.linear(h, w[p + "router"]), dim=-1)
        vals, idx = torch.topk(probs, cfg.experts_per_token)  # [C, k], in rank order
        gates = vals / vals.sum(dim=-1, keepdim=True)
        a = F.linear(h, w[p + "experts.w1cat"]).view(c, cfg.experts, -1)
        b = F.linear(h, w[p + "experts.w3cat"]).view(c, cfg.experts, -1)
        ye = torch.bmm((F.silu(a) * b).transpose(0, 1), w[p + "experts.w2t"])  # [E, C, D]
        chosen = torch.gather(ye.transpose(0, 1), 1, idx[:, :, None].expand(-1, -1, h.shape[1]))
        return shared + (gates[:, :, None] * chosen).sum(dim=1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.w["final_norm"]), self.w["head"])

    def bigram_logits(self) -> torch.Tensor:
        """[V, V]: the zero-layer model's next-token logits for each token (the drafter's table)."""
        return self.head(self.w["embed"])
