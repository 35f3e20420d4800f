"""Stand-in for the SGLang fork's `dflash_ddtree_utils` as of SyJarvis/sglang 807ab0e4 (tests).

Written for ddtree-ops from the contract, not copied. As the 6d9866b3 stand-in (beside this
directory), plus the newer builder's fourth parameter
`workspace: DFlashDDTreeBuildWorkspace | None = None`: buffers kept between calls. With a
workspace, the inputs are copied into its float32 / int64 CPU tensors (a float64 input is
rounded there), the tree is written into its numpy buffers, and the returned tensors are views
of those buffers (the next call overwrites them: the caller copies out); visibility is the
top-left [n+1, n+1] corner of a [budget+1, budget+1] buffer (not contiguous when the tree is
smaller than the budget). Without one, the builder is the older one.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

STANDIN = "fork 807ab0e4 (builder with workspace=None)"


class DFlashDDTreeBuildWorkspace:
    """Buffers reused between builder calls; `ensure` (re)allocates when a shape changes."""

    def __init__(self) -> None:
        self.top_log_probs_cpu = None
        self.top_token_ids_cpu = None
        self.node_token_ids_np = None
        self.node_depths_np = None
        self.parents_np = None
        self.visibility_np = None
        self.retrieve_next_token_np = None
        self.retrieve_next_sibling_np = None
        self.prev_sibling_of_parent_np = None
        self.allocations = 0  # how many times `ensure` allocated (tests look)

    def ensure(self, *, depth: int, topk: int, budget: int) -> None:
        rows = (int(depth), int(topk))
        if self.top_log_probs_cpu is None or tuple(self.top_log_probs_cpu.shape) != rows:
            self.top_log_probs_cpu = torch.empty(rows, dtype=torch.float32)
            self.top_token_ids_cpu = torch.empty(rows, dtype=torch.long)
        n, s = int(budget), int(budget) + 1
        if self.node_token_ids_np is None or self.node_token_ids_np.shape != (n,):
            self.allocations += 1
            self.node_token_ids_np = np.empty(n, dtype=np.int64)
            self.node_depths_np = np.empty(n, dtype=np.int64)
            self.parents_np = np.empty(s, dtype=np.int32)
            self.visibility_np = np.empty((s, s), dtype=np.bool_)
            self.retrieve_next_token_np = np.empty(s, dtype=np.int64)
            self.retrieve_next_sibling_np = np.empty(s, dtype=np.int64)
            self.prev_sibling_of_parent_np = np.empty(s, dtype=np.int64)


def _root_only():
    vis = torch.zeros((1, 1), dtype=torch.bool)
    vis[0, 0] = True
    return (
        torch.empty(0, dtype=torch.long),
        torch.empty(0, dtype=torch.long),
        [-1],
        [{}],
        vis,
        torch.full((1,), -1, dtype=torch.long),
        torch.full((1,), -1, dtype=torch.long),
    )


def build_ddtree_tree_from_topk(
    top_log_probs: torch.Tensor,
    top_token_ids: torch.Tensor,
    budget: int,
    workspace: DFlashDDTreeBuildWorkspace | None = None,
):
    """One request's best-first draft tree from its top-K rows [H, K], at most `budget` nodes."""
    if budget <= 0 or top_log_probs.shape[0] == 0:
        return _root_only()
    width = min(int(budget), int(top_log_probs.shape[-1]))
    depth_limit = int(top_log_probs.shape[0])
    ws = workspace
    if ws is not None:
        ws.ensure(depth=depth_limit, topk=width, budget=int(budget))
        ws.top_log_probs_cpu.copy_(top_log_probs[:, :width].to(dtype=torch.float32))
        ws.top_token_ids_cpu.copy_(top_token_ids[:, :width].to(dtype=torch.long))
        logp, toks = ws.top_log_probs_cpu.numpy(), ws.top_token_ids_cpu.numpy()
        tok_buf, dep_buf, par_buf = ws.node_token_ids_np, ws.node_depths_np, ws.parents_np
    else:
        logp = top_log_probs[:, :width].to(device="cpu", dtype=torch.float32).numpy()
        toks = top_token_ids[:, :width].to(device="cpu", dtype=torch.long).numpy()
        tok_buf = np.empty(int(budget), dtype=np.int64)
        dep_buf = np.empty(int(budget), dtype=np.int64)
        par_buf = np.empty(int(budget) + 1, dtype=np.int32)

    start = float(logp[0, 0])  # IndexError when there is no column
    frontier = [(-start, (0,), 0, 1, 0, start)]
    par_buf[0] = -1
    child_maps = [{}]
    count = 0
    while frontier and count < int(budget):
        _, ranks, parent, depth, rank, score = heapq.heappop(frontier)
        token = int(toks[depth - 1, rank])
        count += 1
        tok_buf[count - 1] = token
        dep_buf[count - 1] = depth
        par_buf[count] = parent
        child_maps.append({})
        child_maps[parent][token] = count
        if rank + 1 < width:
            sib = score - float(logp[depth - 1, rank]) + float(logp[depth - 1, rank + 1])
            heapq.heappush(frontier, (-sib, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, sib))
        if depth < depth_limit:
            kid = score + float(logp[depth, 0])
            heapq.heappush(frontier, (-kid, ranks + (0,), count, depth + 1, 0, kid))

    size = count + 1
    if ws is not None:
        vis = ws.visibility_np[:size, :size]
        vis.fill(False)
        first, after = ws.retrieve_next_token_np[:size], ws.retrieve_next_sibling_np[:size]
        youngest = ws.prev_sibling_of_parent_np[:size]
        for arr in (first, after, youngest):
            arr.fill(-1)
    else:
        vis = np.zeros((size, size), dtype=np.bool_)
        first = np.full(size, -1, dtype=np.int64)
        after = np.full(size, -1, dtype=np.int64)
        youngest = np.full(size, -1, dtype=np.int64)
    vis[0, 0] = True
    for node in range(1, size):
        up = int(par_buf[node])
        vis[node, :node] = vis[up, :node]
        vis[node, node] = True
    for node in range(1, size):
        up = int(par_buf[node])
        if first[up] == -1:
            first[up] = node
        else:
            after[youngest[up]] = node
        youngest[up] = node
    return (
        torch.from_numpy(tok_buf[:count]),
        torch.from_numpy(dep_buf[:count]),
        par_buf[:size].tolist(),
        child_maps,
        torch.from_numpy(vis),
        torch.from_numpy(first),
        torch.from_numpy(after),
    )


def pad_ddtree_build_outputs(visibility, retrieve_next_token, retrieve_next_sibling, target_q_len):
    """The worker's padding to a fixed verify width (no pad key visible, no pad link)."""
    real = int(retrieve_next_token.shape[0])
    if real > target_q_len:
        raise ValueError(f"pad target {target_q_len} shorter than the tree ({real})")
    vis = torch.zeros((target_q_len, target_q_len), dtype=torch.bool)
    vis[:real, :real].copy_(visibility)
    nxt = torch.full((target_q_len,), -1, dtype=retrieve_next_token.dtype)
    nxt[:real].copy_(retrieve_next_token)
    sib = torch.full((target_q_len,), -1, dtype=retrieve_next_sibling.dtype)
    sib[:real].copy_(retrieve_next_sibling)
    return vis, nxt, sib


def follow_verified_tree(child_maps, posterior):
    """Walk from the root while the target's token at the node is one of its children's."""
    targets = posterior.tolist()
    path = [0]
    node = 0
    token = int(targets[node])
    while token in child_maps[node]:
        node = child_maps[node][token]
        path.append(node)
        token = int(targets[node])
    return path, token
