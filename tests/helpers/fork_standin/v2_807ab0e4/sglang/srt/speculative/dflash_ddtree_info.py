"""Stand-in for the SGLang fork's `dflash_ddtree_info` as of SyJarvis/sglang 4b08d3cc (tests).

Written for ddtree-ops from the contract, not copied. What the hook cares about: the module
imports both walks by name at its top, `follow_verified_tree` from `dflash_ddtree_utils` and
`_compute_ddtree_accept_triton_unchecked` from `triton_ops.ddtree`, and its verify step
(`accept`, the tree accept of `DFlashDDTreeVerifyInput.verify`) calls the GPU walk with
keywords on contiguous inputs and the worker's reused output buffers [B, S] int64, [B] int32,
[B, S] int64; if that call raises, the step falls back to `follow_verified_tree` per request
on CPU copies, as the fork does. One difference: the fork takes the GPU walk only when the
candidates, the target's argmax and both link tensors are on a GPU; this stand-in takes it on
any device (its walk is plain Python), so a CPU-only test drives the same call.
"""

from __future__ import annotations

import torch

from sglang.srt.speculative.dflash_ddtree_utils import follow_verified_tree
from sglang.srt.speculative.triton_ops.ddtree import _compute_ddtree_accept_triton_unchecked

STANDIN = "fork 4b08d3cc (dflash_ddtree_info's verify accept)"


class AcceptBuffers:
    """The verify input's output buffers, reused while the batch's shape stays."""

    def __init__(self) -> None:
        self.next_token_ids = self.commit_lens = self.accept_index = None

    def get(self, bs: int, stride: int, device: torch.device):
        ids, lens, acc = self.next_token_ids, self.commit_lens, self.accept_index
        if ids is None or ids.shape != (bs, stride) or ids.device != device:
            ids = torch.empty((bs, stride), dtype=torch.int64, device=device)
            lens = torch.empty((bs,), dtype=torch.int32, device=device)
            acc = torch.empty((bs, stride), dtype=torch.int64, device=device)
            self.next_token_ids, self.commit_lens, self.accept_index = ids, lens, acc
        return ids, lens, acc


def accept(
    draft_token: torch.Tensor,
    target_predict: torch.Tensor,
    retrieve_next_token: torch.Tensor | None,
    retrieve_next_sibling: torch.Tensor | None,
    child_maps_per_req: list,
    bufs: AcceptBuffers | None = None,
):
    """The verify step's accept: (next_token_ids [B, S], commit_lens [B], accept_index [B, S],
    which walk answered: "gpu" or "follow")."""
    bs = int(target_predict.shape[0])
    stride = int(target_predict.shape[1])
    device = target_predict.device
    candidates = draft_token.view(bs, stride)
    ids, lens, acc = (bufs or AcceptBuffers()).get(bs, stride, device)
    if retrieve_next_token is not None and retrieve_next_sibling is not None:
        try:
            _compute_ddtree_accept_triton_unchecked(
                candidates=candidates.contiguous(),
                target_top1=target_predict.contiguous(),
                retrieve_next_token=retrieve_next_token.contiguous(),
                retrieve_next_sibling=retrieve_next_sibling.contiguous(),
                next_token_ids_out=ids,
                commit_lens_out=lens,
                accept_index_out=acc,
            )
            return ids, lens, acc, "gpu"
        except Exception:  # the fork's way: the per-request walk answers instead
            pass
    cand_cpu, tgt_cpu = candidates.cpu(), target_predict.cpu()
    ids.zero_()
    acc.fill_(-1)
    commit = []
    for i in range(bs):
        path, bonus = follow_verified_tree(child_maps_per_req[i], tgt_cpu[i])
        emitted = cand_cpu[i][path[1:]].tolist() + [int(bonus)]
        ids[i, : len(path)] = torch.tensor(emitted, dtype=torch.int64, device=device)
        acc[i, : len(path)] = i * stride + torch.tensor(path, dtype=torch.int64, device=device)
        commit.append(len(path))
    lens.copy_(torch.tensor(commit, dtype=torch.int32, device=device))
    return ids, lens, acc, "follow"
