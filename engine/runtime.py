"""Build an engine (config, weights, model, backends, decoder) and run offline generation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.backends import make_backends, parse_backends
from engine.config import MATMUL, Preset, preset
from engine.decode import Decoder, Sequence
from engine.model import Model
from engine.tokenizer import EOS_ID
from engine.weights import init_weights, load_weights


@dataclass
class EngineSpec:
    preset: str = "tiny"
    mode: str = "ddtree"
    device: str = "cpu"
    backends: tuple[str, ...] = ()
    weights: str | None = None  # a safetensors file from engine.weights.save_weights
    seed: int = 0
    max_batch_size: int | None = None
    budget: int | None = None
    max_budget: int | None = None  # EngineConfig.max_budget (0: every step at `budget`)
    # capture the forward's segments as CUDA graphs (on a GPU; $DDTREE_ENGINE_CUDA_GRAPHS=0 or
    # --no-cuda-graphs turns it off)
    cuda_graphs: bool = True
    row_chunk: int | None = None  # override the preset's EngineConfig.row_chunk
    # float32 matmuls on a GPU: "tf32" (tensor cores, inputs rounded to TF32, what serving
    # stacks run) or "fp32" (full precision, SIMT). Every row's GEMMs still run with one shape,
    # so AR == DDTree holds either way; a CPU computes fp32 whatever this says. Applied inside
    # the model's forwards only (engine.model.Model.precision), not to the whole process.
    matmul: str = "tf32"
    # where each component's backend came from ("default" | "env" | "cli"), for reports
    backend_sources: dict[str, str] = field(default_factory=dict)
    # on a GPU: hold this fraction of its total memory from the start (None: only what the
    # engine allocates), as SGLang reserves its KV cache up front (--mem-fraction-static)
    mem_fraction: float | None = None


def build_decoder(spec: EngineSpec) -> tuple[Preset, Decoder]:
    overrides = {
        k: v
        for k, v in (
            ("max_batch_size", spec.max_batch_size),
            ("budget", spec.budget),
            ("max_budget", spec.max_budget),
            ("row_chunk", spec.row_chunk),
        )
        if v is not None
    }
    p = preset(spec.preset, **overrides)
    if spec.weights:
        cfg, weights = load_weights(Path(spec.weights))
        p = dataclasses.replace(p, model=cfg)
    else:
        weights = init_weights(p.model, spec.seed)
    device = torch.device(spec.device)
    if device.type == "cuda" and device.index is None:
        # an indexed device: torch resolves a bare "cuda" to the current GPU on every stream,
        # sync and copy call (about 10 us each, dozens a step: measured with
        # benchmarks/engine_steps.py at abb2881)
        device = torch.device("cuda", torch.cuda.current_device())
    if spec.matmul not in MATMUL:
        raise ValueError(f"matmul must be one of {MATMUL}, got {spec.matmul!r}")
    names = parse_backends(list(spec.backends), spec.device)
    model = Model(p.model, weights, device, tf32=spec.matmul == "tf32")
    backends = make_backends(names, device)
    decoder = Decoder(model, p.engine, spec.mode, backends, graphs=spec.cuda_graphs)
    if spec.mem_fraction and device.type == "cuda":
        decoder.held = hold_memory(device, spec.mem_fraction)
    return p, decoder


def hold_memory(device: torch.device, fraction: float) -> torch.Tensor | None:
    """Allocate what brings this process's reserved memory on `device` up to `fraction` of the
    GPU's total, and keep it: the GPU then shows as a serving stack's does (SGLang holds most
    of it for its KV cache from the start). None when the process already holds that much."""
    total = torch.cuda.get_device_properties(device).total_memory
    want = int(total * fraction) - torch.cuda.memory_reserved(device)
    if want <= 0:
        return None
    return torch.empty(want, dtype=torch.uint8, device=device)


def generate(
    decoder: Decoder, prompts: list[list[int]], max_tokens: int, *, stop_at_eos: bool = True
) -> tuple[list[list[int]], list[int]]:
    """Greedy outputs of many prompts, at most max_batch_size decoding at once (a finished
    sequence leaves and the next prompt joins between steps); also the accept lengths.

    Outputs are cut at max_tokens and after EOS (EOS itself excluded), exactly as the server.
    """
    outs: list[list[int]] = [[] for _ in prompts]
    seqs: dict[int, Sequence] = {}
    pending = list(range(len(prompts)))[::-1]
    accept_lens: list[int] = []
    try:
        while pending or seqs:
            while pending and len(seqs) < decoder.cfg.max_batch_size:
                i = pending.pop()
                seqs[i] = decoder.new_sequence(prompts[i])
                decoder.prefill(seqs[i])
            live = list(seqs)
            res = decoder.step([seqs[i] for i in live])
            for i, new in zip(live, res.new_tokens, strict=True):
                accept_lens.append(len(new))
                done = False
                for t in new:
                    if stop_at_eos and t == EOS_ID:
                        done = True
                        break
                    outs[i].append(t)
                    if len(outs[i]) >= max_tokens:
                        done = True
                        break
                if done:
                    seqs.pop(i).blocks.free()
    finally:
        for s in seqs.values():
            s.blocks.free()
    return outs, accept_lens
