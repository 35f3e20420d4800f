"""The fork's DDTree builder and walk the fork's way, in plain Python: a baseline, not a drop-in.

`build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget)` and
`follow_verified_tree(child_maps, posterior)` as the SGLang fork (SyJarvis/sglang 6d9866b3)
computes them, written for ddtree-ops from the contract: float32 log-probs in numpy (a float64
input is rounded first), float64 scores on a heapq, numpy buffers filled element by element,
the list of dicts. Same answers and the same kind of per-call cost as the fork's own code.

Used where no fork is installed: as the per-call baseline of `integration.percall` and as the
`python` backend of `integration.sglang_dropins` (the bench's reference). The import hook never
installs it: in a live service the fallback for inputs the drop-ins do not take is the fork's
own function.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import torch


def root_only() -> tuple:
    """The tree of a budget <= 0 or an empty horizon: the root alone."""
    vis = torch.zeros((1, 1), dtype=torch.bool)
    vis[0, 0] = True
    minus = torch.full((1,), -1, dtype=torch.long)
    return (
        torch.empty(0, dtype=torch.long),
        torch.empty(0, dtype=torch.long),
        [-1],
        [{}],
        vis,
        minus,
        minus.clone(),
    )


def build_ddtree_tree_from_topk(top_log_probs: Any, top_token_ids: Any, budget: Any) -> tuple:
    """The fork's 7-tuple (token ids, depths, parents, child_maps, visibility, first child,
    next sibling) of one request's best-first tree over its top-K rows [H, K]."""
    if budget <= 0 or top_log_probs.shape[0] == 0:
        return root_only()
    cap = int(budget)
    k = min(cap, int(top_log_probs.shape[-1]))
    h = int(top_log_probs.shape[0])
    lp = top_log_probs[:, :k].to(device="cpu", dtype=torch.float32).numpy()
    ids = top_token_ids[:, :k].to(device="cpu", dtype=torch.long).numpy()
    w0 = float(lp[0, 0])  # IndexError at K == 0, as the fork
    heap = [(-w0, (0,), 0, 1, 0, w0)]
    tokens = np.empty(cap, dtype=np.int64)
    depths = np.empty(cap, dtype=np.int64)
    parents = np.empty(cap + 1, dtype=np.int32)
    parents[0] = -1
    maps: list[dict[int, int]] = [{}]
    n = 0
    while heap and n < cap:
        _, path, par, d, r, w = heapq.heappop(heap)
        tok = int(ids[d - 1, r])
        tokens[n], depths[n], parents[n + 1] = tok, d, par
        n += 1
        maps.append({})
        maps[par][tok] = n
        if r + 1 < k:
            ws = w - float(lp[d - 1, r]) + float(lp[d - 1, r + 1])
            heapq.heappush(heap, (-ws, path[:-1] + (r + 1,), par, d, r + 1, ws))
        if d < h:
            wc = w + float(lp[d, 0])
            heapq.heappush(heap, (-wc, path + (0,), n, d + 1, 0, wc))
    s = n + 1
    vis = np.zeros((s, s), dtype=np.bool_)
    vis[0, 0] = True
    first = np.full(s, -1, dtype=np.int64)
    nxt = np.full(s, -1, dtype=np.int64)
    last = np.full(s, -1, dtype=np.int64)
    for i in range(1, s):
        p = int(parents[i])
        vis[i, :i] = vis[p, :i]
        vis[i, i] = True
    for i in range(1, s):
        p = int(parents[i])
        if first[p] == -1:
            first[p] = i
        else:
            nxt[last[p]] = i
        last[p] = i
    t = torch.from_numpy
    return (t(tokens[:n]), t(depths[:n]), parents[:s].tolist(), maps, t(vis), t(first), t(nxt))


def follow_verified_tree(child_maps: list, posterior: Any) -> tuple[list[int], int]:
    """(accepted node indices from 0, next token): the fork's dict walk."""
    tokens = posterior.tolist()
    path, node = [0], 0
    tok = int(tokens[0])
    while tok in child_maps[node]:
        node = child_maps[node][tok]
        path.append(node)
        tok = int(tokens[node])
    return path, tok
