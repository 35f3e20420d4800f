"""Stand-in for the SGLang fork's `dflash_ddtree_utils` as of SyJarvis/sglang 6d9866b3 (tests).

Written for ddtree-ops from the contract, not copied: the three-parameter builder
`build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget)` and the accept walk
`follow_verified_tree(child_maps, posterior)`, with the fork's observable behaviour:

- budget <= 0 or H == 0: the root-only tree;
- K is cut to min(budget, K); the log-probs go to the CPU as float32 (a float64 input is
  rounded) and the ids as int64, into numpy; scores are float64 sums of those float32 values,
  heapq on (-score, rank path, ...);
- K == 0 (with budget > 0, H > 0) raises IndexError (reading the first log-prob of no column);
- a tensor that requires grad raises in `.numpy()`;
- token ids / depths come back as views of a budget-sized numpy buffer, parents as a list of
  ints (from an int32 buffer), child_maps as a list of dicts filled in pop order;
- the walk reads `posterior.tolist()` and follows the dicts.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

STANDIN = "fork 6d9866b3 (3-parameter builder)"


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


def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget):
    """One request's best-first draft tree from its top-K rows [H, K], at most `budget` nodes."""
    if budget <= 0 or top_log_probs.shape[0] == 0:
        return _root_only()
    width = min(int(budget), int(top_log_probs.shape[-1]))
    depth_limit = int(top_log_probs.shape[0])
    logp = top_log_probs[:, :width].to(device="cpu", dtype=torch.float32).numpy()
    toks = top_token_ids[:, :width].to(device="cpu", dtype=torch.long).numpy()

    start = float(logp[0, 0])  # IndexError when there is no column
    frontier = [(-start, (0,), 0, 1, 0, start)]
    tok_buf = np.empty(int(budget), dtype=np.int64)
    dep_buf = np.empty(int(budget), dtype=np.int64)
    par_buf = np.empty(int(budget) + 1, dtype=np.int32)
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
    vis = np.zeros((size, size), dtype=np.bool_)
    vis[0, 0] = True
    for node in range(1, size):
        up = int(par_buf[node])
        vis[node, :node] = vis[up, :node]
        vis[node, node] = True
    first = np.full(size, -1, dtype=np.int64)
    after = np.full(size, -1, dtype=np.int64)
    youngest = np.full(size, -1, dtype=np.int64)
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
