"""Weights: deterministic seeded initialisation, and real safetensors save/load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig

Weights = dict[str, torch.Tensor]


def init_weights(cfg: ModelConfig, seed: int = 0) -> Weights:
    """Float32 weights drawn from a seeded CPU generator (identical on every machine)."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    d, h, r = cfg.hidden, cfg.heads, cfg.kv_lora_rank
    rs = cfg.residual_scale
    w: Weights = {"embed": normal(cfg.vocab_size, d, std=1.0)}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = torch.ones(d)
        w[p + "wq"] = normal(h * (cfg.qk_nope_dim + cfg.qk_rope_dim), d, std=d**-0.5)
        w[p + "wkv_a"] = normal(r + cfg.qk_rope_dim, d, std=d**-0.5)
        w[p + "kv_norm"] = torch.ones(r)
        w[p + "w_uk"] = normal(h, cfg.qk_nope_dim, r, std=r**-0.5)
        w[p + "w_uv"] = normal(h, r, cfg.v_head_dim, std=r**-0.5)
        w[p + "wo"] = normal(d, h * cfg.v_head_dim, std=rs * (h * cfg.v_head_dim) ** -0.5)
        w[p + "ffn_norm"] = torch.ones(d)
        w[p + "router"] = normal(cfg.experts, d, std=d**-0.5)
        e, ie, is_ = cfg.experts, cfg.expert_inter, cfg.shared_inter
        w[p + "experts.w1"] = normal(e, ie, d, std=d**-0.5)
        w[p + "experts.w3"] = normal(e, ie, d, std=d**-0.5)
        w[p + "experts.w2"] = normal(e, d, ie, std=rs * ie**-0.5)
        w[p + "shared.w1"] = normal(is_, d, std=d**-0.5)
        w[p + "shared.w3"] = normal(is_, d, std=d**-0.5)
        w[p + "shared.w2"] = normal(d, is_, std=rs * is_**-0.5)
    w["final_norm"] = torch.ones(d)
    w["head"] = normal(cfg.vocab_size, d, std=3.0 * d**-0.5)
    return w


def save_weights(path: str | Path, cfg: ModelConfig, weights: Weights) -> None:
    """Write the weights and the model config (as metadata) to a safetensors file."""
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in weights.items()}
    meta = {"format": "pt", "ddtree_model_config": json.dumps(dataclasses.asdict(cfg))}
    save_file(tensors, str(path), metadata=meta)


def load_weights(path: str | Path) -> tuple[ModelConfig, Weights]:
    """Read a file written by `save_weights`: (its model config, its tensors)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "ddtree_model_config" not in meta:
        raise ValueError(f"{path}: no ddtree_model_config metadata (not an engine weights file)")
    cfg = ModelConfig(**json.loads(meta["ddtree_model_config"]))
    weights = load_file(str(path))
    expected = set(init_weights_names(cfg))
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise ValueError(f"{path}: tensor names differ (missing {missing[:5]}, extra {extra[:5]})")
    return cfg, weights


def init_weights_names(cfg: ModelConfig) -> list[str]:
    names = ["embed", "final_norm", "head"]
    per_layer = [
        "attn_norm",
        "wq",
        "wkv_a",
        "kv_norm",
        "w_uk",
        "w_uv",
        "wo",
        "ffn_norm",
        "router",
        "experts.w1",
        "experts.w3",
        "experts.w2",
        "shared.w1",
        "shared.w3",
        "shared.w2",
    ]
    return names + [f"layers.{i}.{n}" for i in range(cfg.layers) for n in per_layer]
