"""Backend registry: one place that binds each DDTree component to an implementation.

Components and kinds (`--backend COMPONENT=KIND`, or $DDTREE_ENGINE_BACKENDS; engine.components):
  topk        reference (kernels.reference, numpy) | cuda (kernels.cuda)
  tree_build  reference (Python/heapq) | cpp (kernels.cpu, compiled g++) | cuda (kernels.cuda)
  accept      reference | cpp | cuda
  attention   torch (batched, engine.attention) | cuda (kernels.cuda_attention, fp32 SIMT)

Every tree is handed between components as a `kernels.reference.BatchedTrees` (numpy), so any
one component can be swapped alone; a CUDA backend uploads / downloads at its boundary and
that copy is counted in its stage's time. The tree stage hands its trees over where the accept
runs: host trees (reference, cpp) for a CUDA accept are uploaded at the end of the tree-build
stage (`kernels.tree_stage.to_device`), as the CUDA tree build leaves its own on the GPU, so
swapping the tree builder changes the tree-build stage's time and no other's. Kernel modules
are imported lazily, only when a backend that needs them is selected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.attention import Attention, CudaAttention, TorchAttention

# the names and their parsing live in engine.components (no torch: the CLI checks them fast)
from engine.components import (  # noqa: F401  (re-exported)
    COMPONENTS,
    DEFAULTS,
    ENV_VAR,
    parse_backends,
    resolve_backends,
)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@dataclass
class Backends:
    names: dict[str, str]
    topk: Callable[[torch.Tensor, int], tuple[Any, Any]]
    tree_build: Callable[[Any, Any, int], Any]
    accept: Callable[[Any, np.ndarray, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
    attention: Attention


def make_backends(names: dict[str, str], device: torch.device) -> Backends:
    from kernels import reference

    topk: Callable = lambda logits, k: reference.topk_logprobs(_np(logits), k)  # noqa: E731
    accept: Callable = lambda trees, tgt, h: reference.greedy_accept_batch(trees, _np(tgt), h)  # noqa: E731
    attention = attention_backend(names["attention"], device)
    if names["topk"] == "cuda":
        from kernels import cuda
        from kernels.cuda_core import on_device

        topk = lambda logits, k: cuda.topk_logprobs(on_device(logits, device), k)  # noqa: E731
    build = tree_build_backend(names["tree_build"], names["accept"], device)
    if names["accept"] == "cpp":
        from kernels import cpu

        accept = lambda trees, tgt, h: cpu.greedy_accept_cpp(trees, _np(tgt), h)  # noqa: E731
    elif names["accept"] == "cuda":
        accept = lambda trees, tgt, h: _cuda_accept(trees, tgt, h, device)  # noqa: E731
    return Backends(dict(names), topk, build, accept, attention)


def tree_build_backend(
    kind: str, accept: str, device: torch.device, check: bool = False
) -> Callable:
    """A new tree-build stage of `kind` for a service whose accept is `accept` (the serving one,
    or the shadow's candidate): (log-probs, ids, budget) -> trees. `check` (the shadow's
    candidate, armed in a running service): a CUDA stage needs a GPU and loads the kernels'
    library now, so a missing one is refused at arming, not at the first sampled step."""
    from kernels import reference

    build: Callable = reference.build_trees
    if kind == "cpp":
        from kernels import cpu

        build = lambda lp, ids, budget: cpu.build_trees_cpp(_np(lp), _np(ids), budget)  # noqa: E731
    elif kind == "cuda":
        from kernels import cuda_core, tree_stage  # the stage itself (upload, build, copy back)

        if check:
            if device.type != "cuda":
                raise ValueError("the cuda tree build needs a GPU")
            cuda_core.library()  # the kernels' library loads now, or says why it cannot
        build = tree_stage.CudaTreeStage(device)  # the stage, its buffers kept per shape
    elif kind != "reference":
        raise ValueError(f"unknown tree_build backend {kind!r}")
    if accept == "cuda" and kind != "cuda":
        # host trees: their upload for the CUDA accept is the tree stage's handoff, timed there
        # (kernels.tree_stage.to_device), so the accept stage costs the same after any builder
        from kernels import tree_stage

        host_build = build
        build = lambda lp, ids, budget: tree_stage.to_device(host_build(lp, ids, budget), device)  # noqa: E731
    return build


def attention_backend(kind: str, device: torch.device) -> Attention:
    """A new attention backend of `kind` (the serving one, or the shadow's candidate)."""
    if kind == "cuda":
        if device.type != "cuda":
            raise ValueError("the cuda attention needs a GPU")
        from kernels import cuda_core

        cuda_core.library()  # the kernels' library loads now, or says why it cannot
        return CudaAttention()
    if kind == "torch":
        return TorchAttention(rows_per_call=64 if device.type == "cuda" else 16)
    raise ValueError(f"unknown attention backend {kind!r}")


def _cuda_accept(trees: Any, target: np.ndarray, h: int, device: torch.device) -> tuple:
    from kernels import cuda
    from kernels.cuda_core import on_device

    ws = getattr(trees, "workspace", None)  # the CUDA tree stage's, checked once
    if ws is None or ws.max_depth != h:
        ct = getattr(trees, "device_copy", None)
        if ct is None:  # trees from a caller that did not hand them over (the tree stage does)
            from kernels import tree_stage

            ct = tree_stage.to_device(trees, device).device_copy
        ws = cuda.TreeWorkspace(ct, h)  # checks the trees; its outputs are one buffer
    cuda.greedy_accept(ws, on_device(target, device, torch.int64), h)
    b, n = ws.batch, ws.batch * (h + 1)
    host = ws.accept_flat.cpu().numpy()  # one copy back
    return host[:n].reshape(b, h + 1), host[n : n + b], host[n + b :]
