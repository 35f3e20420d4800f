"""The target model: MLA attention (absorbed form) + MoE with a shared expert, float32 (its
matmuls in TF32 on a GPU unless `--matmul fp32`: `Model.precision`, around every forward).

The model's math works on a *chunk*: a fixed number of rows (`EngineConfig.row_chunk`), each a
token at a position. Every matmul, norm, RoPE and MoE of a layer runs once for the whole chunk,
with the same shapes whatever the rows are, so the same kernels with the same reduction order
compute every row: a row's result depends only on that row, never on which rows share its
chunk or how many chunks a forward has (batch invariance; `engine.forward` pads the last chunk).
That is what keeps DDTree output == AR output bit for bit while a step's whole batch, every
request's tree rows included, goes through one forward.

A layer is two segments around its attention (`engine.attention`): `pre` (norm, the query and
the KV row of every row, written into the paged pool) and `post` (output projection, residual,
MoE). MoE runs every expert on the chunk (one GEMM computes the shared expert's and every expert's
W1 and W3 and the router, one batched GEMM every expert's W2) and mixes each row's top-k in its
own rank order: fixed shapes, which also make each segment capturable as a CUDA graph. (A
server groups tokens per expert and skips the experts no token chose; at 8 experts, top-2, on
a chunk of rows, the dense form costs 4x the expert FLOPs of a tiny model and no data-dependent
shape.)

MLA absorbed form: the KV cache row is `[c_kv (kv_lora_rank, RMS-normed) | k_rope (rope dim)]`
shared by all heads; a head's query is `[q_nope @ W_UK | q_rope]`, its value is `c_kv`, and its
output latent is mapped back through W_UV (the 512 + 64 layout of the CUDA attention kernel).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.weights import Weights


class Model:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: Weights,
        device: str | torch.device = "cpu",
        tf32: bool = False,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        # float32 matmuls in TF32 on a GPU, inside `precision()` only (the flag is process-wide
        # in torch; other code in the process keeps its own setting)
        self.tf32 = tf32 and self.device.type == "cuda"
        self.w = {k: v.to(self.device, torch.float32).contiguous() for k, v in weights.items()}
        w = self.w
        for i in range(cfg.layers):  # fewer, larger GEMMs: each input's projections in one
            p = f"layers.{i}."
            w[p + "wqkv"] = torch.cat([w[p + "wq"], w[p + "wkv_a"]])
            # shared W1 | shared W3 | router | every expert's W1 | every expert's W3
            w[p + "ffn_in"] = torch.cat(
                [
                    w[p + "shared.w1"],
                    w[p + "shared.w3"],
                    w[p + "router"],
                    w[p + "experts.w1"].reshape(-1, cfg.hidden),
                    w[p + "experts.w3"].reshape(-1, cfg.hidden),
                ]
            )
            w[p + "experts.w2t"] = w[p + "experts.w2"].transpose(1, 2).contiguous()
        e_in = cfg.experts * cfg.expert_inter
        self.ffn_split = [cfg.shared_inter, cfg.shared_inter, cfg.experts, e_in, e_in]
        self.qkv_split = [cfg.heads * (cfg.qk_nope_dim + cfg.qk_rope_dim), cfg.kv_dim]
        half = cfg.qk_rope_dim // 2
        inv = 1.0 / (
            cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) * 2 / cfg.qk_rope_dim)
        )
        ang = torch.arange(cfg.max_seq_len + 1024, dtype=torch.float64)[:, None] * inv[None, :]
        # rope(x) = x * cos2 + [x2, x1] * sin2, with cos2 = [cos, cos] and sin2 = [-sin, sin]
        cos, sin = ang.cos().float(), ang.sin().float()
        self.cos2 = torch.cat([cos, cos], dim=1).to(self.device)
        self.sin2 = torch.cat([-sin, sin], dim=1).to(self.device)

    # -- pieces, each over a chunk [C, ...] ------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.norm_eps)

    @staticmethod
    def _rope(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos2 + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin2

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
        q, kv = F.linear(h, w[p + "wqkv"]).split(self.qkv_split, dim=1)
        q = q.view(c, cfg.heads, nope + cfg.qk_rope_dim)
        q_lat = torch.bmm(q[:, :, :nope].transpose(0, 1), w[p + "w_uk"]).transpose(0, 1)
        cos, sin = self.cos2.index_select(0, pos), self.sin2.index_select(0, pos)
        q_full = torch.cat([q_lat, self._rope(q[:, :, nope:], cos[:, None], sin[:, None])], dim=-1)
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
        s1, s3, router, a, b = F.linear(h, w[p + "ffn_in"]).split(self.ffn_split, dim=1)
        shared = F.linear(F.silu(s1) * s3, w[p + "shared.w2"])
        probs = torch.softmax(router, dim=-1)
        vals, idx = torch.topk(probs, cfg.experts_per_token)  # [C, k], in rank order
        gates = vals / vals.sum(dim=-1, keepdim=True)
        act = F.silu(a.reshape(c, cfg.experts, -1)) * b.reshape(c, cfg.experts, -1)
        ye = torch.bmm(act.transpose(0, 1), w[p + "experts.w2t"])  # [E, C, D]
        chosen = torch.gather(ye.transpose(0, 1), 1, idx[:, :, None].expand(-1, -1, h.shape[1]))
        return shared + (gates[:, :, None] * chosen).sum(dim=1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.w["final_norm"]), self.w["head"])

    @contextlib.contextmanager
    def precision(self) -> Iterator[None]:
        """The model's matmul precision for the duration (every forward, capture included)."""
        flags = torch.backends.cuda.matmul
        before = flags.allow_tf32
        flags.allow_tf32 = self.tf32
        try:
            yield
        finally:
            flags.allow_tf32 = before

    def bigram_logits(self) -> torch.Tensor:
        """[V, V]: the zero-layer model's next-token logits for each token (the drafter's table)."""
        with self.precision():
            return self.head(self.w["embed"])
