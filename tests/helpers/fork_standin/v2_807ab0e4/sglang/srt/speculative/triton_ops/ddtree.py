"""Stand-in for the SGLang fork's `triton_ops/ddtree.py` as of SyJarvis/sglang 4b08d3cc (tests).

Written for ddtree-ops from the contract (`integration.gpu_accept`'s docstring), not copied: the
fork walks each verified tree with a Triton kernel, one program per row; this stand-in does the
same walk in plain Python on the rows' values (read on the CPU, written back into the outputs
on their own device), so it runs where no GPU or Triton is (the CPU tests) and on a GPU's
tensors alike. What it keeps of the fork's function: the signature (seven tensors, outputs
written in place, returns None), B = 0 returns at once, a non-contiguous 2-D tensor raises
ValueError, a 1-D `candidates` raises on the shape's unpacking, only the first S columns of
each output row are written; and the walk's bounds: links read as int32, at most
next_pow2(S) children scanned per step and at most next_pow2(S) - 1 steps, a path of at most
S nodes, the first sibling in link order taking a token that several siblings carry. A link
>= S ends the chain (the fork reads out of bounds there; outside the contract).
"""

from __future__ import annotations

import torch

STANDIN = "fork 4b08d3cc (GPU accept walk, plain Python)"


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _walk(cand: list[int], tgt: list[int], first: list[int], after: list[int]):
    """One row: (tokens emitted, commit length, path of row-local nodes)."""
    s = len(cand)
    block = 1 << max(s - 1, 0).bit_length()
    path, emitted = [0], []
    cur = 0
    for _ in range(block - 1):
        if len(path) >= s:
            break
        want = tgt[cur]
        child, found = _int32(first[cur]), -1
        for _ in range(block):
            if child < 0 or child >= s:
                break
            if cand[child] == want:
                found = child
                break
            child = _int32(after[child])
        if found < 0:
            break
        emitted.append(want)
        path.append(found)
        cur = found
    emitted.append(tgt[cur])  # the bonus token: the target's after the last accepted node
    return emitted, len(path), path


def _contiguous_2d(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.is_contiguous()


def _compute_ddtree_accept_triton_unchecked(
    candidates: torch.Tensor,
    target_top1: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    next_token_ids_out: torch.Tensor,
    commit_lens_out: torch.Tensor,
    accept_index_out: torch.Tensor,
) -> None:
    """Per row b: the accepted path's target tokens into next_token_ids_out[b] (then 0), its
    length into commit_lens_out[b], b * S + node along it into accept_index_out[b] (then -1)."""
    batch, stride = candidates.shape
    if batch == 0:
        return
    named = {
        "candidates": candidates,
        "target_top1": target_top1,
        "retrieve_next_token": retrieve_next_token,
        "retrieve_next_sibling": retrieve_next_sibling,
        "next_token_ids_out": next_token_ids_out,
        "accept_index_out": accept_index_out,
    }
    for name, x in named.items():
        if not _contiguous_2d(x):
            raise ValueError(f"stand-in DDTree accept: {name} must be a contiguous 2-D tensor")
    if not commit_lens_out.is_contiguous():
        raise ValueError("stand-in DDTree accept: commit_lens_out must be contiguous")
    rows = [
        x.tolist() for x in (candidates, target_top1, retrieve_next_token, retrieve_next_sibling)
    ]
    ids = torch.zeros((batch, stride), dtype=torch.int64)
    acc = torch.full((batch, stride), -1, dtype=torch.int64)
    lens = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        emitted, n, path = _walk(rows[0][b], rows[1][b], rows[2][b], rows[3][b])
        ids[b, :n] = torch.tensor(emitted, dtype=torch.int64)
        acc[b, :n] = torch.tensor(path, dtype=torch.int64) + b * stride
        lens[b] = n
    next_token_ids_out[:, :stride].copy_(ids)
    accept_index_out[:, :stride].copy_(acc)
    commit_lens_out.copy_(lens.view(commit_lens_out.shape))
